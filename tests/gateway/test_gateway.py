"""The local gateway, against the scripted endpoint through a real gateway process.

- what a client gets through it is what the endpoint sent: SSE bytes (ids aside: the
  endpoint makes new ones per answer), status, headers and error bodies;
- the meter holds what the endpoint served, attributed to the token's attempt;
- refusals of its own (no token, an unknown or revoked one, another endpoint's, an unknown
  endpoint) are clear, say `x-should-retry: false`, and reach nothing upstream;
- a parked or held endpoint is answered by the gateway in the provider's words: 0 requests
  reach the endpoint;
- request slots: at most max_requests in flight, the rest wait, fair across tasks;
- the key and the tokens are in none of its files, its argv or its environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import http.client
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from endpoint_helpers import request_body

from fleet_tui.core.errors import FleetError
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.gateway import control
from fleet_tui.gateway.routes import Route
from fleet_tui.gateway.slots import Slots
from fleet_tui.store.db import Store
from fleet_tui.store.meter import Meter
from fleet_tui.system import paths

KEY = "sk-gateway-test-REAL-KEY-5e1f"
SCRIPT = [[{"type": "text", "text": "hello through the gateway"}]]
_IDS = re.compile(rb"\b(msg|toolu|req)_[0-9a-f]{24}\b")


@dataclass
class Raw:
    status: int
    headers: dict[str, str]
    body: bytes


def raw_post(url: str, path: str, body: bytes, headers: dict[str, str]) -> Raw:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port.split("/")[0]), timeout=30)
    try:
        conn.request("POST", path, body=body, headers={
            "content-type": "application/json", "anthropic-version": "2023-06-01", **headers})
        resp = conn.getresponse()
        return Raw(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


@dataclass
class Rig:
    ep: ScriptedEndpoint
    store: Store
    meter: Meter
    info: control.GatewayInfo

    def post(self, token: str | None, *, endpoint: str = "default",
             body: bytes | None = None) -> Raw:
        data = body if body is not None else json.dumps(request_body()).encode()
        return raw_post(self.info.url, f"/e/{endpoint}/v1/messages?beta=true", data,
                        {"x-api-key": token} if token else {})


def start_gateway(ep: ScriptedEndpoint, store: Store, max_requests: int = 2
                  ) -> control.GatewayInfo:
    return control.ensure([Route("default", ep.url, max_requests, "default")], {"default": KEY},
                          db=store.path, python=sys.executable, env=os.environ)


@pytest.fixture
def rig() -> Iterator[Rig]:
    with ScriptedEndpoint({"default": SCRIPT}) as ep:
        store = Store(paths.db_path())
        info = start_gateway(ep, store)
        try:
            yield Rig(ep, store, Meter(store), info)
        finally:
            control.stop()


def normal(body: bytes) -> bytes:
    return _IDS.sub(rb"\1_ID", body)


def wait_until(check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_stream_through_the_gateway_is_the_endpoints(rig: Rig) -> None:
    token = rig.meter.mint("t1", 7, "default")
    body = json.dumps(request_body()).encode()
    direct = raw_post(rig.ep.url, "/v1/messages?beta=true", body, {"x-api-key": KEY})
    through = rig.post(token, body=body)
    assert direct.status == through.status == 200
    assert through.headers["content-type"] == direct.headers["content-type"]
    assert through.headers["content-type"].startswith("text/event-stream")
    assert b"event: message_start" in through.body
    assert normal(through.body) == normal(direct.body)
    # upstream it carried the real key, as claude's apiKeyHelper sends it: both headers
    (_, sent) = rig.ep.message_requests()
    assert sent.auth_kind == "bearer+x-api-key"
    assert sent.auth_sha256 == hashlib.sha256(KEY.encode()).hexdigest()
    assert sent.path == "/v1/messages?beta=true"  # the query kept


def test_error_answers_keep_their_status_headers_and_body(rig: Rig) -> None:
    token = rig.meter.mint("t1", 7, "default")
    body = json.dumps(request_body()).encode()
    # (a closed window or account shuts the endpoint in the gateway: test_gateway_robust)
    for fault in ({"status": 529, "times": 1},
                  {"kind": "zai", "code": "1302", "times": 1},
                  {"status": 429, "retry_after": 3, "times": 1}):
        rig.ep.set_faults([fault])
        direct = raw_post(rig.ep.url, "/v1/messages?beta=true", body, {"x-api-key": KEY})
        rig.ep.set_faults([fault])
        through = rig.post(token, body=body)
        assert (through.status, normal(through.body)) == (direct.status, normal(direct.body))
        for name in ("content-type", "retry-after", "x-should-retry", "server"):
            assert through.headers.get(name) == direct.headers.get(name) or (
                name == "server" and through.headers[name] == direct.headers[name].strip())


def test_the_meter_holds_what_the_endpoint_served(rig: Rig) -> None:
    token = rig.meter.mint("t1", 7, "default")
    answers = [rig.post(token) for _ in range(3)]
    served = []
    for answer in answers:
        start = delta = None
        for line in answer.body.split(b"\n"):
            if line.startswith(b"data:"):
                event = json.loads(line[5:])
                if event["type"] == "message_start":
                    start = event["message"]
                elif event["type"] == "message_delta":
                    delta = event["usage"]
        assert start is not None and delta is not None
        served.append((start["model"], start["usage"]["input_tokens"],
                       delta["output_tokens"]))
    wait_until(lambda: len(rig.meter.rows()) == 3)
    rows = rig.meter.rows()
    assert [(r.model, r.input_tokens, r.output_tokens) for r in rows] == served
    assert all(r.input_tokens > 0 and r.output_tokens > 0 for r in rows)
    assert {(r.task_id, r.attempt_id, r.endpoint, r.status) for r in rows} \
        == {("t1", 7, "default", 200)}
    assert rig.meter.by_task()["t1"].requests == 3


def test_requests_are_priced_and_a_task_over_its_budget_sends_no_more(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway prices each request from the settings' table (here an override that makes
    a token cost a dollar) and, once a task's spend meets budget_per_task, answers its next
    request itself: nothing more reaches the endpoint."""
    config = tmp_path / "config.toml"
    config.write_text('budget_per_task = 5.0\n[prices."fake-model-1"]\n'
                      'input = 1000000.0\noutput = 1000000.0\n', encoding="utf-8")
    monkeypatch.setenv("FLEET_TUI_CONFIG", str(config))
    with ScriptedEndpoint({"default": SCRIPT}) as ep:
        store = Store(paths.db_path())
        info = start_gateway(ep, store)
        try:
            rig = Rig(ep, store, Meter(store), info)
            token = rig.meter.mint("t1", 7, "default")
            assert rig.post(token).status == 200
            wait_until(lambda: len(rig.meter.rows()) == 1)
            (row,) = rig.meter.rows()
            assert row.cost == float(row.input_tokens + row.output_tokens) > 5.0
            refused = rig.post(token)
            assert refused.status == 403 and refused.headers["x-should-retry"] == "false"
            assert b"budget" in refused.body and b"t1" in refused.body, refused.body
            assert len(ep.message_requests()) == 1
            other = rig.meter.mint("t2", 8, "default")  # another task still goes through
            assert rig.post(other).status == 200
            assert len(ep.message_requests()) == 2
        finally:
            control.stop()


def test_refusals_are_clear_final_and_reach_nothing_upstream(rig: Rig) -> None:
    token = rig.meter.mint("t1", 7, "default")
    assert rig.post(token).status == 200
    rig.meter.revoke(attempt_ids=[7])
    other = rig.meter.mint("t2", 8, "elsewhere")
    cases = {
        "revoked": (rig.post(token), 401, "revoked: its attempt has ended"),
        "none": (rig.post(None), 401, "no gateway token"),
        "unknown": (rig.post("fleet-gw-not-one-of-ours"), 401, "not minted"),
        "a raw key": (rig.post(KEY), 401, "not minted"),
        "another endpoint's": (rig.post(other), 401, "for endpoint 'elsewhere'"),
        "no such endpoint": (rig.post(token, endpoint="nope"), 404,
                             "no endpoint 'nope' (known: default)"),
    }
    for what, (answer, status, words) in cases.items():
        assert answer.status == status, what
        assert answer.headers["x-should-retry"] == "false", what
        error = json.loads(answer.body)["error"]
        assert words in error["message"], (what, error)
        assert KEY not in error["message"]
    assert len(rig.ep.message_requests()) == 1  # only the first, valid, request


def set_endpoint(rig: Rig, **fields: object) -> None:
    rig.store.change_endpoint("default", lambda _state: dict(fields))


def test_a_parked_or_held_endpoint_is_answered_by_the_gateway(rig: Rig) -> None:
    token = rig.meter.mint("t1", 7, "default")
    words = "Usage limit reached for 5 hour. Your limit will reset at 2026-12-01 00:14:10"
    set_endpoint(rig, parked_until=time.time() + 600,
                              park_reason="5-hour window, code 1308", park_message=words)
    for _ in range(5):
        answer = rig.post(token)
        assert answer.status == 429
        assert answer.headers["x-should-retry"] == "false"
        error = json.loads(answer.body)["error"]
        assert (error["message"], error["code"]) == (words, "1308")
    set_endpoint(rig, parked_until=None, park_reason=None,
                              park_message=None, held="the endpoint rejected the key")
    held = rig.post(token)
    assert held.status == 403 and "the endpoint rejected the key" in held.body.decode()
    assert rig.ep.message_requests() == []  # 0 requests reached the endpoint
    set_endpoint(rig, held=None)
    assert rig.post(token).status == 200  # open again: it goes through
    wait_until(lambda: (control.read_status() or {}).get("endpoints", {})
               .get("default", {}).get("served") == 1)
    status = control.read_status()
    assert status is not None
    assert status["endpoints"]["default"]["gated"] == 6


def test_request_slots_hold_the_line_and_share_it_across_tasks() -> None:
    async def scenario() -> list[str]:
        slots = Slots(2)
        order: list[str] = []
        release = asyncio.Event()
        peak = 0

        async def request(task: str, n: int) -> None:
            nonlocal peak
            async with slots.take(task):
                peak = max(peak, slots.in_flight)
                order.append(f"{task}{n}")
                await release.wait()

        jobs = [asyncio.create_task(request("a", i)) for i in range(4)]
        await asyncio.sleep(0)
        jobs += [asyncio.create_task(request("b", i)) for i in range(2)]
        await asyncio.sleep(0.01)
        assert slots.in_flight == 2 and slots.waiting == 4
        assert slots.waiting_by_task() == {"a": 2, "b": 2}
        release.set()
        await asyncio.gather(*jobs)
        assert peak == 2 and slots.in_flight == 0 and slots.waiting == 0
        return order

    # a's first two hold the slots; then b and a take turns, whoever queued first
    assert asyncio.run(scenario()) == ["a0", "a1", "a2", "b0", "a3", "b1"]


def test_a_cancelled_waiter_leaves_the_line() -> None:
    async def scenario() -> None:
        slots = Slots(1)
        hold = asyncio.Event()

        async def holder() -> None:
            async with slots.take("a"):
                await hold.wait()

        first = asyncio.create_task(holder())
        await asyncio.sleep(0)
        waiter = asyncio.create_task(holder())
        await asyncio.sleep(0)
        assert slots.waiting == 1
        waiter.cancel()
        await asyncio.sleep(0)
        assert slots.waiting == 0
        hold.set()
        await first
        assert slots.in_flight == 0

    asyncio.run(scenario())


def test_the_key_and_tokens_are_in_no_file_argv_or_environment_of_the_gateway(
        rig: Rig) -> None:
    token = rig.meter.mint("t1", 7, "default")
    assert rig.post(token).status == 200
    rig.post("fleet-gw-not-one-of-ours")
    wait_until(lambda: (control.folder() / "status.json").exists())
    pid = rig.info.pid
    secrets = (KEY.encode(), token.encode())
    proc = Path(f"/proc/{pid}")
    if proc.is_dir():
        for what in ("cmdline", "environ"):
            data = (proc / what).read_bytes()
            assert not any(s in data for s in secrets), what
    for path in control.folder().iterdir():
        if not path.is_file():  # control.sock
            continue
        data = path.read_bytes()
        assert not any(s in data for s in secrets), path
    db = b"".join(p.read_bytes() for p in paths.db_path().parent.glob("fleet.db*"))
    assert not any(s in db for s in secrets)


def test_a_second_start_finds_the_running_gateway(rig: Rig) -> None:
    again = start_gateway(rig.ep, rig.store)
    assert again == rig.info
    assert control.read_info() == rig.info


def test_gateway_status_says_what_it_serves(rig: Rig, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    from fleet_tui.cli import main

    token = rig.meter.mint("t1", 7, "default")
    assert rig.post(token).status == 200
    wait_until(lambda: (control.read_status() or {}).get("endpoints", {})
               .get("default", {}).get("served") == 1)
    assert main(["gateway", "status"]) == 0
    out = capsys.readouterr().out
    assert f"pid {rig.info.pid}, {rig.info.url}, up " in out
    assert "default: 0/2 in flight, 0 waiting, 1 served, 0 gated, 0 refused" in out
    assert main(["gateway", "status", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["running"] and data["endpoints"]["default"]["served"] == 1
    assert main(["gateway", "stop"]) == 0
    assert main(["gateway", "status"]) == 1
    assert "the gateway is not running" in capsys.readouterr().out


def test_which_attempts_go_through_the_gateway(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from fleet_tui.engine.gateway_link import GatewayLink
    from fleet_tui.settings.config import load_settings

    store = Store(paths.db_path())
    link = GatewayLink(store, env=os.environ, python=sys.executable,
                       keys=lambda **_: {"default": KEY})
    on = load_settings(env=os.environ, overrides={"gateway": True,
                                                  "base_url": "http://127.0.0.1:9"})
    off = load_settings(env=os.environ, overrides={"gateway": False,
                                                   "base_url": "http://127.0.0.1:9"})
    task: Any = SimpleNamespace(id="t1", endpoint="http://127.0.0.1:9")
    assert link.endpoint_of(on, task, "local") == "default"
    assert link.endpoint_of(off, task, "local") is None  # direct, as before
    assert link.endpoint_of(on, task, "memory") is None  # runs nothing here
    # a remote host that forwards the gateway's port over its connection (the SSH host)
    assert link.endpoint_of(on, task, "box", remote_ok=True) == "default"
    assert link.endpoint_of(off, task, "box", remote_ok=True) is None
    other: Any = SimpleNamespace(id="t2", endpoint="http://elsewhere.invalid")
    assert link.endpoint_of(on, other, "local") is None  # no endpoint of the settings
    keyless = GatewayLink(store, env=os.environ, python=sys.executable, keys=lambda **_: {})
    overrides: dict[str, Any] = {"base_url": "http://127.0.0.1:9", "key_sources": ["env"]}
    env = {"ANTHROPIC_AUTH_TOKEN": KEY}
    attempt: Any = SimpleNamespace(id=3, task_id="t1")
    # no key: direct, so the launcher says where it looked
    assert keyless.through(on, task, attempt, "local", overrides, env) is None
    assert env == {"ANTHROPIC_AUTH_TOKEN": KEY}
    env = {"ANTHROPIC_AUTH_TOKEN": KEY, "ZHIPU_API_KEY": KEY, "PATH": "/bin"}
    try:
        token = link.through(on, task, attempt, "local", overrides, env)
        info = control.read_info()
        assert token is not None and info is not None
        assert env == {"ANTHROPIC_AUTH_TOKEN": token, "PATH": "/bin"}
        assert overrides == {"base_url": f"{info.url}/e/default", "key_sources": ["env"]}
        found = Meter(store).check(token)
        assert found is not None and (found.task_id, found.attempt_id, found.endpoint) \
            == ("t1", 3, "default") and found.valid
        link.revoke(attempt)
        found = Meter(store).check(token)
        assert found is not None and not found.valid
    finally:
        control.stop()


def test_named_endpoints_are_routes(tmp_path: Path) -> None:
    from fleet_tui.gateway.routes import UNLIMITED, name_for, routes_of
    from fleet_tui.settings.config import load_settings

    config = tmp_path / "config.toml"
    config.write_text('base_url = "http://127.0.0.1:9"\n\n[endpoints.zai]\n'
                      'base_url = "http://127.0.0.1:10/api"\nmax_requests = 2\n'
                      'key_env = "ZAI_TEST_KEY"\n\n[endpoints.team]\n'
                      'base_url = "http://127.0.0.1:11"\nkey_keyring = "team"\n')
    settings = load_settings(env=os.environ, config_file=config)
    routes = routes_of(settings)
    assert {n: (r.base_url, r.max_requests) for n, r in routes.items()} == {
        "default": ("http://127.0.0.1:9", UNLIMITED), "zai": ("http://127.0.0.1:10/api", 2),
        "team": ("http://127.0.0.1:11", UNLIMITED)}
    assert name_for(settings, "http://127.0.0.1:10/api") == "zai"  # a task's base_url
    assert name_for(settings, "zai") == "zai" and name_for(settings, "") == "default"
    assert name_for(settings, "http://nowhere.invalid") is None
    from fleet_tui.engine.fleet import Fleet

    fleet = Fleet(settings, Store(paths.db_path()),
                  env={**os.environ, "ZAI_TEST_KEY": "sk-zai ", "ANTHROPIC_AUTH_TOKEN": KEY})
    # what the gateway is given: its own variable's key, the usual one, and none for a
    # keyring entry that holds nothing (the gateway refuses that endpoint, saying so)
    assert fleet.secrets.by_endpoint() == {"default": KEY, "zai": "sk-zai"}
    assert fleet.supervisor.gateway.keys is not None
    assert fleet.supervisor.gateway.keys() == {"default": KEY, "zai": "sk-zai"}


def test_a_request_waiting_for_a_slot_is_seen_by_the_engine() -> None:
    """One slot: the first task's request holds it (the endpoint hangs), the second task's
    waits in line; the engine's status (what the panel's stream caption says) names the
    second task as waiting for a request slot, and nothing once the line is gone."""
    from fleet_tui.engine.fleet import Fleet
    from fleet_tui.settings.config import load_settings

    with ScriptedEndpoint({"default": SCRIPT}) as ep:
        store = Store(paths.db_path())
        info = start_gateway(ep, store, max_requests=1)
        rig = Rig(ep, store, Meter(store), info)
        fleet = Fleet(load_settings(env=os.environ, overrides={"gateway": True}), store)
        try:
            first, second = rig.meter.mint("t1", 1, "default"), rig.meter.mint("t2", 2,
                                                                                "default")
            ep.set_faults([{"kind": "hang", "times": 1}])
            held = threading.Thread(target=lambda: _quietly(rig.post, first), daemon=True)
            held.start()
            ep.wait_for(1)  # the first request holds the only slot
            line = threading.Thread(target=lambda: _quietly(rig.post, second), daemon=True)
            line.start()
            wait_until(lambda: fleet.status([]).slot_waits == {"t2": 1})
        finally:
            ep.stop()  # the hung request ends, the line moves, then empties
        wait_until(lambda: fleet.status([]).slot_waits == {}, timeout=30)
        control.stop()
        held.join(30)
        line.join(30)


def _quietly(post: Any, token: str) -> None:
    # the endpoint is stopped under it: what the test does on purpose
    with contextlib.suppress(OSError, http.client.HTTPException):
        post(token)


def test_an_idle_gateway_exits_and_the_next_attempt_starts_it_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No live token and nothing in flight for FLEET_TUI_GATEWAY_IDLE seconds: the gateway
    exits (nothing is left running once the work is done), and is started afresh."""
    monkeypatch.setenv("FLEET_TUI_GATEWAY_IDLE", "1")
    with ScriptedEndpoint({"default": SCRIPT}) as ep:
        store = Store(paths.db_path())
        meter = Meter(store)
        token = meter.mint("t1", 1, "default")  # a running attempt's
        info = start_gateway(ep, store)
        assert raw_post(info.url, "/e/default/v1/messages", json.dumps(
            request_body()).encode(), {"x-api-key": token}).status == 200
        meter.revoke(token=token)  # the attempt ended
        wait_until(lambda: control.read_info() is None, timeout=30)
        again = start_gateway(ep, store)  # what the engine's next attempt does
        try:
            assert again.pid != info.pid and control.read_info() is not None
        finally:
            control.stop()


def test_new_keys_and_endpoints_are_handed_to_the_running_gateway(rig: Rig) -> None:
    """A key changed (or an endpoint of config.toml) reaches the running gateway through
    its control socket: the next request goes on with the new key, the same process; a
    route of another base URL is another route, which never gets the old key (the gateway
    answers itself, saying whose key it lacks, and nothing goes there), and the socket is
    the user's only."""
    token = rig.meter.mint("t1", 7, "default")
    assert rig.post(token).status == 200
    new_key = "sk-gateway-test-NEW-KEY-77a0"
    route = Route("default", rig.ep.url, 2, "default")
    assert control.hand_over(control.handover([route], {"default": new_key})) is True
    assert control.hand_over(control.handover([route], {"default": new_key})) is False
    assert rig.post(token).status == 200
    assert [r.auth_sha256 for r in rig.ep.message_requests()] == [
        hashlib.sha256(k.encode()).hexdigest() for k in (KEY, new_key)]
    assert control.read_info() == rig.info  # handed over, not started again
    sock = control.folder() / "control.sock"
    assert sock.is_socket() and sock.stat().st_mode & 0o077 == 0
    with ScriptedEndpoint({"default": SCRIPT}) as elsewhere:
        # another base URL without its key: none is sent there, not the last one
        moved = Route("default", elsewhere.url, 1, "default")
        assert control.hand_over(control.handover([moved], {})) is True
        refused = rig.post(token)
        assert refused.status == 403 and b"does not hold the key" in refused.body
        assert refused.headers["x-should-retry"] == "false"
        assert elsewhere.requests == [] and len(rig.ep.message_requests()) == 2
        # an endpoint added with its key, and max_requests followed
        other = Route("other", elsewhere.url, 1, "other")
        control.hand_over(control.handover([moved, other], {"other": new_key}))
        assert rig.post(rig.meter.mint("t2", 8, "other"), endpoint="other").status == 200
        assert [r.auth_sha256 for r in elsewhere.message_requests()] == [
            hashlib.sha256(new_key.encode()).hexdigest()]
        wait_until(lambda: (control.read_status() or {}).get("endpoints", {})
                   .get("default", {}).get("max_requests") == 1)
        # what is not a handover is refused, and changes nothing
        with pytest.raises(FleetError, match="refused the new keys"):
            control.hand_over(b"[1, 2]")
        assert rig.post(rig.meter.mint("t3", 9, "other"), endpoint="other").status == 200
    # nothing of it in the gateway's files (its log names the endpoints only)
    for path in control.folder().iterdir():
        if path.is_file():
            data = path.read_bytes()
            assert new_key.encode() not in data and KEY.encode() not in data, path


def test_the_engine_hands_changed_keys_over_once_and_lives_with_a_gateway_that_cannot_take_them(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    """GatewayLink: the routes of its attempts and their keys are handed to the running
    gateway when they changed since it last handed that gateway any, not on every look; a
    gateway without a control socket (one an older version started) is used as it is, with
    a warning."""
    from fleet_tui.engine.gateway_link import GatewayLink
    from fleet_tui.settings.config import load_settings

    settings = load_settings(env=os.environ, overrides={"gateway": True,
                                                        "base_url": rig.ep.url})
    link = GatewayLink(rig.store, env=os.environ, python=sys.executable,
                       keys=lambda **_: {"default": KEY})
    new_key = "sk-gateway-test-LINK-KEY-0c3b"
    route = link.route_for(settings, "default", new_key)
    token = rig.meter.mint("t1", 7, "default", route=route.to_record())
    link._mine[route.id] = (route, new_key)
    assert link._ensure() == rig.info
    assert rig.post(token).status == 200
    log_text = (control.folder() / "gateway.log").read_text()
    handed = log_text.count("handed over again")
    assert handed == 1, log_text
    assert link._ensure() == rig.info  # nothing new: no call
    assert (control.folder() / "gateway.log").read_text().count("handed over again") \
        == handed == 1
    (control.folder() / "control.sock").unlink()
    link._mine[route.id] = (route, KEY)
    with caplog.at_level("WARNING", logger="fleet_tui.engine.fleet"):
        assert link._ensure() == rig.info
    assert "could not be handed the new keys" in caplog.text and KEY not in caplog.text
    assert rig.post(token).status == 200
    assert [r.auth_sha256 for r in rig.ep.message_requests()] == [
        hashlib.sha256(new_key.encode()).hexdigest()] * 2
