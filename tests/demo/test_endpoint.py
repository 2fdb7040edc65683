"""The scripted endpoint, driven over real HTTP on 127.0.0.1 (http.client, sockets)."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from endpoint_helpers import assemble, post, request_body

from fleet_tui.demo.endpoint import (
    Fault,
    Script,
    ScriptedEndpoint,
    ScriptError,
    find_cwd,
    load_scripts,
    parse_fault,
)

TOOL_SCRIPT: list[Any] = [
    [{"type": "text", "text": "I'll write the file now, then check it."},
     {"type": "tool_use", "name": "Write",
      "input": {"file_path": "{cwd}/hello.txt",
                "content": "hello from a longer file body so the JSON splits\n" * 3}}],
    [{"type": "thinking", "thinking": "list the directory"},
     {"type": "tool_use", "name": "Bash", "input": {"command": "ls", "description": "list"}}],
    "All done: hello.txt written.",
]


@pytest.fixture
def endpoint() -> Any:
    with ScriptedEndpoint(TOOL_SCRIPT) as ep:
        yield ep


def test_stream_plays_a_tool_turn_as_the_real_api_does(endpoint: ScriptedEndpoint) -> None:
    reply = post(endpoint.url, request_body(cwd="/srv/work/repo", model="GLM-9"))

    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    shape = " ".join(reply.names())
    block = r"content_block_start( content_block_delta)+ content_block_stop"
    assert re.fullmatch(rf"message_start( {block}){{2}} message_delta message_stop", shape)
    start = reply.events[0][1]["message"]
    assert start["model"] == "GLM-9" and start["role"] == "assistant" and start["content"] == []
    delta = reply.events[-2][1]
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert delta["usage"]["output_tokens"] > 0

    json_chunks = [d["delta"]["partial_json"] for n, d in reply.events
                   if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"]
    assert len(json_chunks) >= 3, "tool input must arrive as several partial JSON chunks"
    text, tool = assemble(reply.events)
    assert text == {"type": "text", "text": "I'll write the file now, then check it."}
    assert tool["type"] == "tool_use" and tool["name"] == "Write"
    assert tool["id"].startswith("toolu_")
    assert tool["input"]["file_path"] == "/srv/work/repo/hello.txt"
    assert tool["input"]["content"] == TOOL_SCRIPT[0][1]["input"]["content"]


def test_block_indexes_open_and_close_in_order(endpoint: ScriptedEndpoint) -> None:
    reply = post(endpoint.url, request_body(turns_done=1))
    open_index: int | None = None
    seen: list[int] = []
    for name, data in reply.events:
        if name == "content_block_start":
            assert open_index is None
            open_index = data["index"]
            seen.append(open_index)
        elif name == "content_block_delta":
            assert data["index"] == open_index
        elif name == "content_block_stop":
            assert data["index"] == open_index
            open_index = None
    assert seen == [0, 1]
    thinking, tool = assemble(reply.events)
    assert thinking["type"] == "thinking" and thinking["thinking"] == "list the directory"
    assert thinking["signature"]
    assert tool["name"] == "Bash" and tool["input"] == {"command": "ls", "description": "list"}


def test_turn_is_counted_from_assistant_messages_and_mid_system_is_accepted(
        endpoint: ScriptedEndpoint) -> None:
    final = post(endpoint.url, request_body(turns_done=2, system_in_middle=True))
    assert final.status == 200
    assert assemble(final.events) == [{"type": "text", "text": "All done: hello.txt written."}]
    assert final.events[-2][1]["delta"]["stop_reason"] == "end_turn"

    beyond = post(endpoint.url, request_body(turns_done=7))
    assert beyond.status == 200
    assert "only 3 turn(s)" in assemble(beyond.events)[0]["text"]
    assert [r.turn for r in endpoint.requests] == [2, 7]


def test_follow_up_prompt_plays_the_followup_turns() -> None:
    script = {"turns": ["first answer"],
              "followup": [[{"type": "tool_use", "name": "Bash",
                             "input": {"command": "ls {cwd}"}}],
                           "Done: {prompt}"]}
    with ScriptedEndpoint({"default": script}) as ep:
        body = request_body(prompt="first")
        body["messages"] += [
            {"role": "assistant", "content": [{"type": "text", "text": "first answer"}]},
            {"role": "user", "content": [{"type": "text", "text": "also add docs\nmore"}]}]
        tool = assemble(post(ep.url, body).events)
        assert tool[0]["name"] == "Bash"
        assert tool[0]["input"] == {"command": "ls /work/somewhere"}
        body["messages"] += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_x",
                                               "name": "Bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x",
                                          "content": "a.txt"}]}]
        final = assemble(post(ep.url, body).events)
        # {prompt} is the follow-up's first line, not the tool result nor the first prompt.
        assert final == [{"type": "text", "text": "Done: also add docs"}]
        body["messages"] += [{"role": "assistant", "content": [{"type": "text", "text": "x"}]},
                             {"role": "user", "content": "again"}]
        assert "only 1 turn(s)" in assemble(post(ep.url, body).events)[0]["text"]
    with pytest.raises(ScriptError, match="followup"):
        Script.from_data("bad", {"turns": ["x"], "followup": "nope"})


def test_tool_use_ids_are_unique_per_request() -> None:
    two_tools = ScriptedEndpoint([[
        {"type": "tool_use", "name": "Bash", "input": {"command": "true"}},
        {"type": "tool_use", "name": "Bash", "input": {"command": "true"}}]])
    with two_tools:
        ids = [b["id"] for _ in range(3)
               for b in assemble(post(two_tools.url, request_body()).events)]
    assert len(ids) == 6 and len(set(ids)) == 6
    assert two_tools.requests[0].tool_use_ids == tuple(ids[:2])


def test_non_streaming_answer_is_a_message_object(endpoint: ScriptedEndpoint) -> None:
    reply = post(endpoint.url, request_body(stream=False, model="m-x"), path="/v1/messages")
    assert reply.status == 200
    msg = reply.json
    assert msg["type"] == "message" and msg["model"] == "m-x"
    assert msg["stop_reason"] == "tool_use"
    assert [b["type"] for b in msg["content"]] == ["text", "tool_use"]
    assert msg["content"][1]["input"]["file_path"] == "/work/somewhere/hello.txt"
    assert msg["usage"]["input_tokens"] > 0
    assert endpoint.requests[0].stream is False


def test_keep_alive_serves_several_requests_on_one_connection(
        endpoint: ScriptedEndpoint) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=5)
    try:
        replies = [post(endpoint.url, request_body(turns_done=i), conn=conn) for i in range(3)]
        local_port = conn.sock.getsockname()[1] if conn.sock else None
        post(endpoint.url, request_body(stream=False), conn=conn)
        assert conn.sock is not None and conn.sock.getsockname()[1] == local_port
    finally:
        conn.close()
    assert [r.status for r in replies] == [200, 200, 200]
    assert [r.names()[-1] for r in replies] == ["message_stop"] * 3


def test_concurrent_clients_each_get_their_own_script() -> None:
    scripts = {"default": ["plain"], **{f"w{i}": [f"worker {i} done"] for i in range(6)}}
    results: dict[int, str] = {}

    with ScriptedEndpoint(scripts, event_delay=0.1) as ep:
        def run(i: int) -> None:
            reply = post(ep.url, request_body(prompt=f"task [script:w{i}] please"))
            results[i] = assemble(reply.events)[0]["text"]

        threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        unmarked = assemble(post(ep.url, request_body()).events)[0]["text"]

    assert results == {i: f"worker {i} done" for i in range(6)}
    assert unmarked == "plain"
    assert sorted(r.script or "" for r in ep.requests) == sorted(
        [f"w{i}" for i in range(6)] + ["default"])


def test_a_held_request_does_not_keep_another_client_waiting() -> None:
    """Clients are served at once, not in turn: while the first client's request is held
    open (its script hangs), a second client gets its whole answer. Served in turn, the
    second would wait behind the first until the endpoint stops. (The time six paced
    clients take together is bench/endpoint.py's endpoint.concurrent.)"""
    scripts = {"held": {"turns": ["never sent"], "faults": ["hang"]}, "quick": ["quick one"]}
    first: list[BaseException] = []

    with ScriptedEndpoint(scripts) as ep:
        def held() -> None:
            try:
                post(ep.url, request_body(prompt="[script:held] go"), timeout=60)
            except (OSError, http.client.HTTPException) as exc:
                first.append(exc)

        holder = threading.Thread(target=held)
        holder.start()
        ep.wait_for(1)  # the first request is in, and held
        second = post(ep.url, request_body(prompt="[script:quick] go"), timeout=60)
        still_open = holder.is_alive() and not first
    holder.join()  # stopping the endpoint released the held request
    assert second.status == 200
    assert assemble(second.events)[0]["text"] == "quick one"
    assert still_open, "the first request ended before the second was answered"
    assert [r.script for r in ep.requests] == ["held", "quick"]
    assert [r.fault for r in ep.requests] == ["hang", None]
    assert first and not isinstance(first[0], TimeoutError)


def test_unknown_script_marker_is_a_clear_400() -> None:
    with ScriptedEndpoint({"alpha": ["a"], "beta": ["b"]}) as ep:
        reply = post(ep.url, request_body(prompt="[script:gamma]"))
        first = post(ep.url, request_body())
    assert reply.status == 400
    assert reply.json["type"] == "error"
    assert reply.json["error"]["type"] == "invalid_request_error"
    assert "gamma" in reply.json["error"]["message"]
    assert "alpha, beta" in reply.json["error"]["message"]
    assert assemble(first.events)[0]["text"] == "a"  # no marker, no "default": the first


def test_error_faults_for_the_first_requests_then_normal() -> None:
    with ScriptedEndpoint(["fine"], faults=["529x2"]) as ep:
        replies = [post(ep.url, request_body()) for _ in range(3)]
    assert [r.status for r in replies] == [529, 529, 200]
    assert replies[0].json == {"type": "error", "error": {
        "type": "overloaded_error", "message": "Overloaded"},
        "request_id": replies[0].json["request_id"]}
    assert replies[0].headers["x-should-retry"] == "true"
    assert [r.fault for r in ep.requests] == ["error:529", "error:529", None]


@pytest.mark.parametrize(("status", "kind", "retry"), [
    (401, "authentication_error", "false"),
    (429, "rate_limit_error", "true"),
    (500, "api_error", "true"),
])
def test_error_fault_bodies_and_retry_headers(status: int, kind: str, retry: str) -> None:
    with ScriptedEndpoint(["fine"], faults=[{"status": status, "retry_after": 0}]) as ep:
        reply = post(ep.url, request_body())
    assert reply.status == status
    assert reply.json["error"]["type"] == kind
    assert reply.headers["x-should-retry"] == retry
    assert reply.headers["retry-after"] == "0"


def test_429_carries_retry_after_by_default() -> None:
    with ScriptedEndpoint(["fine"], faults=[429]) as ep:
        assert post(ep.url, request_body()).headers["retry-after"] == "1"


def test_script_faults_apply_to_that_script_only_and_after_global_ones(tmp_path: Path) -> None:
    (tmp_path / "calm.json").write_text(json.dumps(["calm"]))
    (tmp_path / "busy.json").write_text(json.dumps(
        {"turns": ["busy"], "faults": [{"status": 500, "times": 1}]}))
    with ScriptedEndpoint(tmp_path, faults=["429"]) as ep:
        statuses = [post(ep.url, request_body(prompt=p)).status
                    for p in ("[script:calm]", "[script:calm]", "[script:busy]",
                              "[script:busy]")]
    assert statuses == [429, 200, 500, 200]


def test_faults_can_be_set_at_runtime_and_limited_to_a_turn(
        endpoint: ScriptedEndpoint) -> None:
    assert post(endpoint.url, request_body()).status == 200
    endpoint.set_faults([Fault(kind="error", status=503, times=None, turn=1)])
    assert post(endpoint.url, request_body(turns_done=0)).status == 200
    assert [post(endpoint.url, request_body(turns_done=1)).status for _ in range(2)] == [503,
                                                                                          503]
    endpoint.set_faults(["401"], script="default")
    endpoint.clear_faults()
    assert post(endpoint.url, request_body(turns_done=1)).status == 200


def test_drop_cuts_the_stream_mid_way(endpoint: ScriptedEndpoint) -> None:
    endpoint.set_faults([{"kind": "drop", "after_events": 3}])
    conn = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=5)
    try:
        conn.request("POST", "/v1/messages", body=json.dumps(request_body()))
        resp = conn.getresponse()
        assert resp.status == 200
        with pytest.raises(http.client.IncompleteRead) as info:
            resp.read()
    finally:
        conn.close()
    assert info.value.partial.count(b"event: ") == 3
    assert b"message_stop" not in info.value.partial
    # the next request is served normally
    assert post(endpoint.url, request_body()).names()[-1] == "message_stop"
    assert [r.fault for r in endpoint.requests] == ["drop", None]


def test_hang_holds_the_request_until_the_client_gives_up() -> None:
    """(How long giving up and stopping take is bench/endpoint.py's endpoint.hang_client
    and endpoint.hang_stop.)"""
    ep = ScriptedEndpoint(["late"], faults=["hang"])
    with ep:
        with pytest.raises(TimeoutError):
            post(ep.url, request_body(), timeout=0.3)
        assert post(ep.url, request_body()).status == 200
    assert [r.fault for r in ep.requests] == ["hang", None]


def test_stopping_releases_a_hung_handler() -> None:
    """Stopping ends the handler that hangs, and its client learns that the endpoint
    stopped (the connection is closed) instead of waiting for its own timeout."""
    outcome: list[BaseException] = []
    ep = ScriptedEndpoint(["late"], faults=["hang"]).start()
    before = set(threading.enumerate())

    def client() -> None:
        try:
            post(ep.url, request_body(), timeout=60)
        except (OSError, http.client.HTTPException) as exc:
            outcome.append(exc)

    thread = threading.Thread(target=client)
    thread.start()
    ep.wait_for(1)  # the handler holds the request
    handlers = [t for t in set(threading.enumerate()) - before - {thread}
                if "process_request" in t.name]
    assert len(handlers) == 1 and handlers[0].is_alive()
    ep.stop()
    thread.join()
    handlers[0].join(30)  # a bound for a broken stop, not a speed budget
    assert not handlers[0].is_alive(), "the hung handler still runs after stop()"
    assert len(outcome) == 1
    assert not isinstance(outcome[0], TimeoutError), outcome[0]
    assert [r.fault for r in ep.requests] == ["hang"]


def test_event_delay_slows_the_stream() -> None:
    with ScriptedEndpoint(["one two three four"], event_delay=0.05) as ep:
        started = time.monotonic()
        reply = post(ep.url, request_body())
        elapsed = time.monotonic() - started
    assert elapsed >= 0.05 * (len(reply.events) - 1) * 0.9


def test_pace_zero_sends_the_same_events_without_the_waits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """FLEET_ENDPOINT_PACE scales a script's pacing (tests of the demo's scripts set 0):
    the same events, chunked as at human speed, without the waits between them."""
    text = "This sentence is long enough to be streamed in several small pieces."
    script = {"demo": {"turns": [text], "delay": 0.5}}
    monkeypatch.setenv("FLEET_ENDPOINT_PACE", "0")
    with ScriptedEndpoint(script) as ep:
        started = time.monotonic()
        fast = post(ep.url, request_body())
        elapsed = time.monotonic() - started
    assert elapsed < 0.5 * (len(fast.events) - 1) / 2  # the waits would be 0.5 s each
    monkeypatch.setenv("FLEET_ENDPOINT_PACE", "0.02")
    with ScriptedEndpoint(script) as ep:
        started = time.monotonic()
        paced = post(ep.url, request_body())
        elapsed = time.monotonic() - started
    assert elapsed >= 0.01 * (len(paced.events) - 1) * 0.9
    assert [n for n, _ in paced.events] == [n for n, _ in fast.events]
    assert len([n for n, _ in fast.events if n == "content_block_delta"]) >= 3
    for bad in ("fast", "-1", "nan"):  # unreadable: the scripts' own pace
        monkeypatch.setenv("FLEET_ENDPOINT_PACE", bad)
        assert ScriptedEndpoint(script).pace == 1.0


@pytest.mark.serial  # a time bound: alone, not beside the parallel pass
def test_stop_does_not_wait_for_a_poll() -> None:
    """stop() wakes the serving loop at once: the suite starts and stops hundreds of
    endpoints, and a 100 ms poll made each stop wait 50 ms on average (40 of them 2 s)."""
    started = time.monotonic()
    for _ in range(40):
        with ScriptedEndpoint(["hi"]) as ep:
            url = ep.url
    elapsed = time.monotonic() - started
    assert elapsed < 1.0, f"40 starts and stops took {elapsed:.2f} s"
    with pytest.raises(OSError):  # and it is really closed
        post(url, request_body(), timeout=2)


def test_script_delay_chunks_text_for_a_human_speed_demo() -> None:
    text = "This sentence is long enough to be streamed in several small pieces."
    with ScriptedEndpoint({"demo": {"turns": [text], "delay": 0.001}}) as ep:
        reply = post(ep.url, request_body())
    deltas = [d["delta"]["text"] for n, d in reply.events if n == "content_block_delta"]
    assert len(deltas) >= 3 and "".join(deltas) == text


def test_requests_record_auth_kind_and_digest_never_the_value(
        endpoint: ScriptedEndpoint) -> None:
    secret = "sk-test-" + os.urandom(8).hex()
    post(endpoint.url, request_body(), headers={"authorization": f"Bearer {secret}"})
    post(endpoint.url, request_body(), headers={"x-api-key": secret})
    post(endpoint.url, request_body())
    bearer, api_key, anonymous = endpoint.requests
    digest = hashlib.sha256(secret.encode()).hexdigest()
    assert (bearer.has_auth, bearer.auth_kind, bearer.auth_sha256) == (True, "bearer", digest)
    assert (api_key.auth_kind, api_key.auth_sha256) == ("x-api-key", digest)
    assert (anonymous.has_auth, anonymous.auth_kind, anonymous.auth_sha256) == (False, None,
                                                                                None)
    assert secret not in repr(endpoint.requests)


def test_requests_record_tool_results_model_cwd_and_prompt(endpoint: ScriptedEndpoint) -> None:
    results = [
        {"type": "tool_result", "tool_use_id": "toolu_a", "is_error": True,
         "content": [{"type": "text", "text": "Permission denied"}]},
        {"type": "tool_result", "tool_use_id": "toolu_b", "content": "README.md"},
    ]
    post(endpoint.url, request_body(turns_done=1, tool_results=results, model="GLM-X",
                                    cwd="/a b/c", prompt="fix it [script:default]"))
    (rec,) = endpoint.requests
    assert (rec.model, rec.turn, rec.script, rec.cwd) == ("GLM-X", 1, "default", "/a b/c")
    assert rec.prompt == "fix it [script:default]"
    assert [(t.tool_use_id, t.is_error, t.text) for t in rec.tool_results] == [
        ("toolu_a", True, "Permission denied"), ("toolu_b", False, "README.md")]
    assert rec.path == "/v1/messages?beta=true" and rec.status == 200 and rec.stream


def test_wait_for_returns_once_enough_requests_arrived(endpoint: ScriptedEndpoint) -> None:
    threading.Timer(0.1, lambda: post(endpoint.url, request_body())).start()
    assert len(endpoint.wait_for(1, timeout=5)) == 1
    with pytest.raises(TimeoutError):
        endpoint.wait_for(2, timeout=0.1)


def test_cwd_unknown_leaves_a_dot(endpoint: ScriptedEndpoint) -> None:
    reply = post(endpoint.url, request_body(cwd=None))
    assert assemble(reply.events)[1]["input"]["file_path"] == "./hello.txt"
    assert endpoint.requests[0].cwd is None


def test_find_cwd_falls_back_to_messages_and_older_wording() -> None:
    body = {"system": "nothing here", "messages": [
        {"role": "user", "content": "<env>\nWorking directory: /old/style\n</env>"}]}
    assert find_cwd(body) == "/old/style"
    assert find_cwd({"messages": []}) is None


def test_connect_is_refused_and_recorded(endpoint: ScriptedEndpoint) -> None:
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=5) as sock:
        sock.sendall(b"CONNECT api.anthropic.com:443 HTTP/1.1\r\n"
                     b"Host: api.anthropic.com:443\r\n\r\n")
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 403")
    assert endpoint.connects == ["api.anthropic.com:443"]
    assert endpoint.requests == []


def test_absolute_form_proxy_request_is_refused_and_recorded(
        endpoint: ScriptedEndpoint) -> None:
    reply = post(endpoint.url, {"x": 1}, path="http://example.invalid/v1/messages")
    assert reply.status == 403
    (rec,) = endpoint.requests
    assert rec.proxied and rec.path == "http://example.invalid/v1/messages"


def test_other_paths_are_a_recorded_404(endpoint: ScriptedEndpoint) -> None:
    reply = post(endpoint.url, {"x": 1}, path="/v1/complete")
    conn = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=5)
    conn.request("GET", "/v1/models")
    got = conn.getresponse()
    body = json.loads(got.read())
    conn.close()
    assert reply.status == 404 and reply.json["error"]["type"] == "not_found_error"
    assert got.status == 404 and body["type"] == "error"
    assert [(r.method, r.path, r.status) for r in endpoint.requests] == [
        ("POST", "/v1/complete", 404), ("GET", "/v1/models", 404)]
    assert endpoint.message_requests() == []


def test_head_probe_is_answered_and_kept_apart(endpoint: ScriptedEndpoint) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=5)
    conn.request("HEAD", "/")
    assert conn.getresponse().status == 200
    conn.close()
    assert endpoint.probes == [("HEAD", "/")] and endpoint.requests == []


def test_bad_json_body_is_a_400(endpoint: ScriptedEndpoint) -> None:
    reply = post(endpoint.url, b"{not json")
    assert reply.status == 400 and reply.json["error"]["type"] == "invalid_request_error"


async def test_async_context_manager() -> None:
    import asyncio

    async with ScriptedEndpoint(["async ok"]) as ep:
        reply = await asyncio.to_thread(post, ep.url, request_body())
    assert assemble(reply.events)[0]["text"] == "async ok"
    with pytest.raises(RuntimeError, match="not started"):
        _ = ep.url


def test_load_scripts_from_file_and_directory(tmp_path: Path) -> None:
    single = tmp_path / "one.json"
    single.write_text(json.dumps({"turns": [[{"type": "tool_use", "name": "Read",
                                             "input": {"file_path": "{cwd}/x"}}], "done"],
                                  "faults": ["529x2", {"kind": "drop"}], "delay": 0.5}))
    scripts = load_scripts(single)
    assert list(scripts) == ["default"]
    s = scripts["default"]
    assert len(s.turns) == 2 and s.delay == 0.5
    assert s.faults == [Fault(kind="error", status=529, times=2), Fault(kind="drop")]

    d = tmp_path / "many"
    d.mkdir()
    (d / "a.json").write_text('["a"]')
    (d / "b.json").write_text('{"turns": ["b"]}')
    assert sorted(load_scripts(d)) == ["a", "b"]


@pytest.mark.parametrize(("content", "expected"), [
    ("[1, 2", "invalid JSON"),
    ("[]", "non-empty list of turns"),
    ('[[{"type": "tool_use", "input": {}}]]', "needs a \"name\""),
    ('[[{"type": "image"}]]', "unknown block type"),
    ('{"turns": ["x"], "faults": ["boom"]}', "cannot read fault"),
    ('{"turns": ["x"], "fault": []}', "unknown key"),
])
def test_bad_scripts_give_actionable_errors(tmp_path: Path, content: str,
                                            expected: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ScriptError, match=expected):
        load_scripts(path)


def test_parse_fault_forms() -> None:
    assert parse_fault("529x3") == Fault(kind="error", status=529, times=3)
    assert parse_fault("hang") == Fault(kind="hang")
    assert parse_fault("dropx2") == Fault(kind="drop", times=2)
    assert parse_fault("500xinf") == Fault(kind="error", status=500, times=None)
    assert parse_fault(401) == Fault(kind="error", status=401)
    with pytest.raises(ScriptError, match="400-599"):
        parse_fault({"status": 200})


def _start_cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "fleet_tui.demo.endpoint", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])


def test_cli_prints_url_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text(json.dumps(["served from the command line"]))
    proc = _start_cli("--script", str(script))
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        reply = post(url, request_body())
        assert assemble(reply.events)[0]["text"] == "served from the command line"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_fault_flag_and_sigint(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text('["ok"]')
    proc = _start_cli("--script", str(script), "--fault", "529")
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert [post(url, request_body()).status for _ in range(2)] == [529, 200]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("args", [("--script", "/nonexistent/s.json"), ("--port", "-1")])
def test_cli_bad_input_is_a_message_not_a_traceback(tmp_path: Path,
                                                    args: tuple[str, ...]) -> None:
    if "--script" not in args:
        (tmp_path / "s.json").write_text('["x"]')
        args = ("--script", str(tmp_path / "s.json"), *args)
    proc = _start_cli(*args)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 2
    assert out == ""
    assert err.startswith("endpoint: ") and "Traceback" not in err


# --- provider modes: answering as z.ai does ----------------------------------------------------


def test_provider_faults_parse_with_their_defaults() -> None:
    window = parse_fault({"kind": "window", "seconds": 5, "after_ok": 2})
    assert (window.kind, window.code, window.status, window.times, window.zone) == (
        "window", "1308", 429, None, 8.0)
    busy = parse_fault({"kind": "concurrency", "limit": 2})
    assert (busy.code, busy.limit) == ("1302", 2)
    assert parse_fault({"kind": "zai", "code": 1113, "status": 402}).code == "1113"
    assert parse_fault({"status": 529, "after_ok": 3}).after_ok == 3
    assert parse_fault('{"kind": "window", "seconds": 5, "after_ok": 2}') == window  # --fault
    for bad, said in [({"kind": "zai"}, "4-digit"), ({"kind": "zai", "code": "9999"},
                                                      "no message known"),
                      ({"kind": "window", "code": "1308"}, "seconds"),
                      ({"kind": "concurrency"}, "limit"),
                      ({"kind": "zai", "code": "1113", "status": 200}, "400-599"),
                      ({"status": 429, "after_ok": -1}, "after_ok")]:
        with pytest.raises(ScriptError, match=said):
            parse_fault(bad)


def test_a_zai_fault_answers_with_zais_body() -> None:
    with ScriptedEndpoint(["fine"], faults=[{"kind": "zai", "code": "1113", "times": 1}]) as ep:
        refused = post(ep.url, request_body())
        served = post(ep.url, request_body())
    assert refused.status == 429
    assert refused.json == {"error": {"code": "1113", "message": "Your account is in "
                                      "arrears, please recharge and try again"}}
    assert "x-should-retry" not in refused.headers  # z.ai sends none
    assert served.status == 200
    assert [r.fault for r in ep.requests] == ["zai:1113", None]


def test_a_window_closes_after_n_answers_and_names_its_reset_in_beijing_time() -> None:
    with ScriptedEndpoint(["fine"], faults=[{"kind": "window", "after_ok": 1,
                                             "seconds": 1.5}]) as ep:
        assert ep.window_reset() is None
        assert post(ep.url, request_body()).status == 200  # the one answer before it
        closed = post(ep.url, request_body())
        reset = ep.window_reset()
        again = post(ep.url, request_body())
        assert reset is not None and reset == int(reset)  # written to the second
        time.sleep(max(0.0, reset - time.time()) + 0.05)
        reopened = post(ep.url, request_body())
    assert closed.status == again.status == 429 and reopened.status == 200
    message = closed.json["error"]["message"]
    beijing = datetime.fromtimestamp(reset, timezone(timedelta(hours=8)))
    assert message == ("Usage limit reached for 5 hour. Your limit will reset at "
                       f"{beijing:%Y-%m-%d %H:%M:%S}")
    assert closed.json["error"]["code"] == "1308"


def test_too_many_answers_in_flight_get_1302() -> None:
    slow = {"default": {"delay": 0.01, "turns": ["a slow answer " * 10]}}
    # hold: the first answer waits until the second has been refused (never by timing)
    with ScriptedEndpoint(slow, faults=[{"kind": "concurrency", "limit": 1,
                                         "hold": 60}]) as ep:
        first: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: first.update(reply=post(ep.url,
                                                                         request_body())))
        worker.start()
        ep.wait_for(1)  # the first is being answered
        second = post(ep.url, request_body())
        worker.join(timeout=30)
        assert ep.wait_answered()  # the first's handler has let go of its place
        third = post(ep.url, request_body())  # alone again
    assert first["reply"].status == 200 and third.status == 200
    assert second.status == 429 and second.json["error"]["code"] == "1302"


def test_real_turns_leave_the_clis_filler_answer_out() -> None:
    """CLI 2.1.197 resumes an interrupted session with a filler answer of its own."""
    scripts = {"plain": ["zero", "one", "two"],
               "real": {"real_turns": True, "turns": ["zero", "one", "two"]}}
    with ScriptedEndpoint(scripts) as ep:
        for name in scripts:
            body = request_body(turns_done=1, prompt=f"[script:{name}] go")
            body["messages"] += [{"role": "assistant", "content": [
                {"type": "text", "text": "No response requested."}]},
                {"role": "user", "content": "Continue where you left off."}]
            post(ep.url, body)
    assert [(r.script, r.turn) for r in ep.requests] == [("plain", 2), ("real", 1)]


def test_a_concurrency_hold_is_seconds_and_never_waits_past_them() -> None:
    with pytest.raises(ScriptError, match="hold"):
        parse_fault({"kind": "concurrency", "limit": 1, "hold": "long"})
    # nothing to refuse: the lone answer waits out its hold (0.3 s), then comes
    with ScriptedEndpoint({"default": ["alone"]},
                          faults=[{"kind": "concurrency", "limit": 1, "hold": 0.3}]) as ep:
        started = time.monotonic()
        reply = post(ep.url, request_body())
        waited = time.monotonic() - started
    assert reply.status == 200 and waited >= 0.3
