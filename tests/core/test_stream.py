"""stream.py: typed events from real CLI output, whatever the chunking, never raising."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from fleet_tui.core import stream
from fleet_tui.core.stream import (
    MAX_LINE_BYTES,
    RAW_KEEP_BYTES,
    SUMMARY_MAX,
    ApiRetry,
    Init,
    Malformed,
    Partial,
    RateLimit,
    Result,
    RunSummary,
    Status,
    StreamDecoder,
    Text,
    ToolResult,
    ToolUse,
    Unknown,
    decode_all,
    summarize_tool,
)

SAMPLES = Path(__file__).resolve().parents[1] / "support" / "fixtures" / "stream-json"
CASES = sorted(p.name for p in SAMPLES.iterdir() if p.is_dir())
CWD = "/home/dev/work/repo"  # the samples' rewritten cwd


def sample_bytes(case: str) -> bytes:
    (path,) = [p for p in (SAMPLES / case).iterdir() if p.name.startswith("stdout.json")]
    return path.read_bytes()


def sample_lines(case: str) -> list[bytes]:
    return [ln for ln in sample_bytes(case).split(b"\n") if ln.strip()]


ALL_LINES = [ln for case in CASES for ln in sample_lines(case)]


def feed_chunks(data: bytes, cuts: list[int]) -> list[stream.Event]:
    """Feed `data` cut at the given offsets, then finish."""
    dec = StreamDecoder()
    events: list[stream.Event] = []
    prev = 0
    for cut in sorted(set(cuts)):
        if 0 < cut < len(data):
            events += dec.feed(data[prev:cut])
            prev = cut
    events += dec.feed(data[prev:])
    events += dec.finish()
    return events


def same(a: list[stream.Event], b: list[stream.Event]) -> bool:
    # repr, not ==: a NaN inside Unknown data is never equal to itself
    return [repr(e) for e in a] == [repr(e) for e in b]


# --------------------------------------------------------------------------- real samples

# what each real run did: (tool summaries, api retries, tool errors, result is_error)
EXPECTED: dict[str, tuple[list[str], int, int, bool]] = {
    "nonroot_custom_script": (["Bash echo scripted > a.txt && git status --short",
                               "Read a.txt"], 0, 0, False),
    "nonroot_stream": (["Write hello.txt", "Bash ls"], 0, 0, False),
    "root_401": ([], 0, 0, True),
    "root_429": ([], 2, 0, True),
    "root_500": ([], 2, 0, True),
    "root_529_default": ([], 10, 0, True),
    "root_529_retries0_json": ([], 0, 0, True),
    "root_529_retries2": ([], 2, 0, True),
    "root_529_then_ok": (["Write hello.txt", "Bash ls"], 2, 0, False),
    "root_apikey_401": ([], 0, 0, True),
    "root_apikey_ok": (["Write hello.txt", "Bash ls"], 0, 0, False),
    # a failing Bash step (exit 3, stderr) and a 41-line one: the whole output kept
    "root_bash_output": (["Bash printf 'collecting...\\n'; printf 'tests/test_app.py::test_main "
                          "FAILED\\n'; printf 'E assert 2 == 1\\n' >&2; exit 3",
                          "Bash printf '%s' \"$(cat <<'X' tests/test_parser.py::test_case_00 "
                          "PASSED tests/test_parser.py::test_case_01 PASSED tests…"], 0, 1, False),
    "root_json": ([], 0, 0, False),
    "root_noflags": (["Write hello.txt", "Bash ls"], 0, 0, False),
    "root_only_nonessential": (["Write hello.txt", "Bash ls"], 0, 0, False),
    "root_permdefault": (["Write hello.txt", "Bash ls"], 0, 1, False),
    "root_sandbox_stream": (["Write hello.txt", "Bash ls"], 0, 0, False),
    "root_timeout": ([], 1, 0, True),
    "root_unreachable": ([], 0, 0, True),
    "zai_1308_window": ([], 1, 0, True),
}


def test_every_sample_has_an_expectation() -> None:
    assert sorted(EXPECTED) == CASES


@pytest.mark.parametrize("case", CASES)
def test_real_sample_events(case: str) -> None:
    data = sample_bytes(case)
    events = decode_all(data)
    summaries, retries, tool_errors, is_error = EXPECTED[case]

    assert not [e for e in events if isinstance(e, (Malformed, Unknown))]
    assert [e.summary for e in events if isinstance(e, ToolUse)] == summaries
    assert len([e for e in events if isinstance(e, ApiRetry)]) == retries
    results = [e for e in events if isinstance(e, ToolResult)]
    assert len(results) == len(summaries)
    assert len([r for r in results if r.is_error]) == tool_errors
    # every result is paired with the call it answers
    calls = {e.id: e.name for e in events if isinstance(e, ToolUse)}
    assert {r.tool_use_id: r.tool_name for r in results} == calls

    final = events[-1]
    assert isinstance(final, Result)
    raw = json.loads(data.strip().split(b"\n")[-1])
    assert final.is_error is is_error
    assert final.data == raw
    assert (final.subtype, final.api_error_status, final.num_turns, final.session_id) == (
        raw["subtype"], raw["api_error_status"], raw["num_turns"], raw["session_id"])
    assert final.line_no == len(data.strip().split(b"\n"))
    if len(events) > 1:
        assert isinstance(events[0], Init)
        assert events[0].cwd == CWD and events[0].session_id == raw["session_id"]
        assert "Bash" in events[0].tools


@pytest.mark.parametrize("case", CASES)
def test_real_sample_same_events_byte_by_byte(case: str) -> None:
    data = sample_bytes(case)
    whole = decode_all(data)
    dec = StreamDecoder()
    events: list[stream.Event] = []
    for i in range(len(data)):
        events += dec.feed(data[i:i + 1])
    events += dec.finish()
    assert same(events, whole)


@pytest.mark.parametrize("case", CASES)
def test_real_sample_run_summary(case: str) -> None:
    summary = RunSummary()
    for event in decode_all(sample_bytes(case)):
        summary.update(event, at=123.0)
    raw = json.loads(sample_bytes(case).strip().split(b"\n")[-1])
    summaries = EXPECTED[case][0]
    assert summary.finished
    assert summary.session_id == raw["session_id"]
    assert summary.turns == raw["num_turns"]
    assert summary.input_tokens == raw["usage"]["input_tokens"]
    assert summary.output_tokens == raw["usage"]["output_tokens"]
    assert summary.tool_calls == len(summaries)
    assert summary.last_tool == (summaries[-1] if summaries else None)
    assert summary.api_retries == EXPECTED[case][1]
    assert summary.last_activity == 123.0
    json.dumps(summary.to_json())


def test_run_summary_counts_turns_by_message_id_while_streaming() -> None:
    """Before the result: two lines of one API message are one turn; usage counted once."""
    summary = RunSummary()
    for event in decode_all(b"\n".join(sample_lines("nonroot_stream")[:-1])):
        summary.update(event)
    assert not summary.finished
    assert summary.turns == 3
    assert (summary.input_tokens, summary.output_tokens) == (300, 3)


def test_synthetic_error_message_is_marked_and_not_a_turn() -> None:
    lines = sample_lines("root_401")
    events = decode_all(lines[1])
    (text,) = events
    assert isinstance(text, Text)
    assert text.synthetic and text.error == "authentication_failed"
    assert text.text == "Not logged in · Please run /login"
    summary = RunSummary()
    summary.update(text)
    assert summary.turns == 0


def test_api_retry_fields_from_real_lines() -> None:
    events = decode_all(sample_bytes("root_timeout"))
    (retry,) = [e for e in events if isinstance(e, ApiRetry)]
    assert (retry.attempt, retry.max_retries, retry.error_status, retry.error) == (
        1, 1, None, "unknown")
    events = decode_all(sample_bytes("root_429"))
    first = next(e for e in events if isinstance(e, ApiRetry))
    assert (first.error_status, first.retry_delay_ms, first.error) == (429, 1000, "rate_limit")


# --------------------------------------------------------------------------- shapes


def _reshape(obj: Any) -> Any:
    """Reverse every object's key order and add an unknown key: a newer CLI's output."""
    if isinstance(obj, dict):
        out = {k: _reshape(obj[k]) for k in reversed(list(obj))}
        out["zz_new_key"] = {"nested": [1, 2, 3]}
        return out
    if isinstance(obj, list):
        return [_reshape(v) for v in obj]
    return obj


@pytest.mark.parametrize("case", CASES)
def test_key_order_and_new_keys_do_not_matter(case: str) -> None:
    lines = sample_lines(case)
    reshaped = b"\n".join(json.dumps(_reshape(json.loads(ln))).encode() for ln in lines)
    before = decode_all(b"\n".join(lines))
    after = decode_all(reshaped)
    assert [e.kind for e in after] == [e.kind for e in before]
    strip = ("data", "input", "usage", "permission_denials")  # raw objects keep new keys
    for a, b in zip(after, before, strict=True):
        da, db = a.to_dict(), b.to_dict()
        for key in strip:
            da.pop(key, None)
            db.pop(key, None)
        assert da == db


def _with(line: bytes, **changes: Any) -> bytes:
    obj = json.loads(line)
    obj.update(changes)
    return json.dumps(obj).encode()


def test_sub_agent_events_carry_their_parent() -> None:
    """Lines from inside a Task sub-agent (real lines, with parent_tool_use_id set)."""
    lines = sample_lines("nonroot_stream")
    task = json.loads(lines[2])
    task["message"]["content"] = [{"type": "tool_use", "id": "toolu_task1", "name": "Task",
                                   "input": {"description": "Find the config loader",
                                             "prompt": "look around",
                                             "subagent_type": "Explore"}}]
    inner = [_with(ln, parent_tool_use_id="toolu_task1") for ln in lines[1:6]]
    events = decode_all(b"\n".join([lines[0], json.dumps(task).encode(), *inner]))
    assert isinstance(events[1], ToolUse) and events[1].summary == "Task Find the config loader"
    assert events[1].parent_tool_use_id is None
    assert all(e.parent_tool_use_id == "toolu_task1" for e in events[2:])
    assert [e.kind for e in events[2:]] == ["text", "tool_use", "tool_result", "tool_use",
                                            "tool_result"]
    summary = RunSummary()
    for event in events:
        summary.update(event)
    assert summary.turns == 1  # sub-agent messages are not the main agent's turns


def test_rate_limit_status_partial_and_unknown_lines() -> None:
    session = "5b8e1206-7d7a-4f44-81ec-0c7093e650ab"
    lines = [
        {"type": "rate_limit_event", "rate_limit_info": {
            "status": "allowed_warning", "resetsAt": 1767225600, "rateLimitType": "five_hour",
            "utilization": 0.9}, "uuid": "u1", "session_id": session},
        {"type": "system", "subtype": "status", "status": "compacting", "session_id": session},
        {"type": "stream_event", "event": {"type": "content_block_delta", "index": 0,
                                           "delta": {"type": "text_delta", "text": "Hel"}},
         "parent_tool_use_id": None, "session_id": session},
        {"type": "system", "subtype": "compact_boundary", "compact_metadata": {"pre": 1}},
        {"type": "brand_new_type", "x": 1},
        {"no_type": True},
        [1, 2, 3],
        {"type": "assistant", "message": {"id": "m", "content": 42}},
        {"type": "assistant", "message": {"id": "m2", "content": [
            {"type": "server_tool_use", "id": "srv1", "name": "web_search",
             "input": {"query": "textual log widget"}},
            {"type": "web_search_tool_result", "tool_use_id": "srv1", "content": []}]}},
    ]
    data = b"\n".join(json.dumps(obj).encode() for obj in lines) + b"\n"
    ev = decode_all(data)
    assert isinstance(ev[0], RateLimit)
    assert (ev[0].status, ev[0].rate_limit_type, ev[0].resets_at) == (
        "allowed_warning", "five_hour", 1767225600)
    assert isinstance(ev[1], Status) and ev[1].status == "compacting"
    assert isinstance(ev[2], Partial) and ev[2].event_type == "content_block_delta"
    assert ev[2].text == "Hel"
    assert isinstance(ev[3], Unknown) and ev[3].type == "system"
    assert ev[3].data["compact_metadata"] == {"pre": 1}
    assert isinstance(ev[4], Unknown) and ev[4].type == "brand_new_type" and ev[4].data["x"] == 1
    assert isinstance(ev[5], Unknown) and ev[5].type == ""
    assert isinstance(ev[6], Unknown) and ev[6].data == [1, 2, 3]
    # valid JSON of an unexpected shape is Unknown, not Malformed
    assert isinstance(ev[7], Unknown) and ev[7].type == "assistant"
    assert isinstance(ev[8], ToolUse) and ev[8].summary == "web_search textual log widget"
    assert isinstance(ev[9], Unknown) and ev[9].type == "assistant/web_search_tool_result"
    assert [e.line_no for e in ev] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 9]


def test_malformed_lines_keep_line_number_and_bounded_raw() -> None:
    good = sample_lines("nonroot_stream")
    junk = b"{not json " + b"x" * (RAW_KEEP_BYTES * 3)
    data = b"\n".join([good[0], b"", junk, b"   ", b"plain text", good[1]]) + b"\n"
    ev = decode_all(data)
    assert [e.kind for e in ev] == ["init", "malformed", "malformed", "text"]
    assert [e.line_no for e in ev] == [1, 3, 5, 6]
    bad = ev[1]
    assert isinstance(bad, Malformed)
    assert bad.raw.startswith("{not json") and len(bad.raw) == RAW_KEEP_BYTES
    assert "not JSON" in bad.error


def test_crlf_lines_decode() -> None:
    data = b"\r\n".join(sample_lines("nonroot_stream")) + b"\r\n"
    assert same(decode_all(data), decode_all(b"\n".join(sample_lines("nonroot_stream"))))


# --------------------------------------------------------------------------- hard input


def test_invalid_utf8() -> None:
    line = sample_lines("nonroot_stream")[1].replace(b"I'll create", b"I\xff\xfell create")
    (text,) = decode_all(line + b"\n")
    assert isinstance(text, Text) and text.text == "I\ufffd\ufffdll create hello.txt."
    (bad,) = decode_all(b"\xff\xfe\xfd\n")
    assert isinstance(bad, Malformed) and bad.raw == "\ufffd\ufffd\ufffd"


def test_a_line_nested_1000_deep_is_one_event_and_the_stream_goes_on() -> None:
    """A line nested ~1000 deep made feed() raise RecursionError (from
    msgspec), and every later read of the task's events raised again."""
    good = sample_lines("nonroot_stream")
    deep = b"[" * 1000 + b"]" * 1000
    lines = [
        good[0],
        b'{"type":"stream_event","event":%s}' % deep,
        b'{"type":"assistant","message":{"id":"m1","content":[{"type":"tool_use","id":"t1",'
        b'"name":"Bash","input":{"command":%s}}]}}' % deep,
        b'{"type":"system","subtype":"hook","data":%s}' % (b'{"a":' * 1000 + b"1"
                                                            + b"}" * 1000),
        b'{"type":"rate_limit_event","rate_limit_info":%s}' % deep,
        good[1],
    ]
    data = b"\n".join(lines) + b"\n"
    for cuts in ([], list(range(0, len(data), 7)), [len(lines[0]) + 5000]):
        events = feed_chunks(data, cuts)
        assert events[0].kind == "init" and events[-1].kind == "text"
        assert sorted({e.line_no for e in events}) == [1, 2, 3, 4, 5, 6]
        bad = [e for e in events if isinstance(e, Malformed)]
        assert bad and all("deeper than" in e.error or "not JSON" in e.error for e in bad)


def test_a_result_line_nested_too_deep_is_malformed_and_the_next_one_counts() -> None:
    deep = b"[" * 5000 + b"]" * 5000
    ok = (b'{"type":"result","subtype":"success","is_error":false,"num_turns":2,'
          b'"result":"done","extra":%s}')
    first, second = decode_all(ok % deep + b"\n" + ok % b"[[1]]" + b"\n")
    assert isinstance(first, Malformed) and "deeper than" in first.error
    assert isinstance(second, Result) and second.result == "done" and second.line_no == 2


def test_odd_values_are_dropped_not_raised_or_stored() -> None:
    """Values a store or a screen cannot take: lone surrogates, absurd counts and numbers."""
    lines = [
        b'{"type":"assistant","message":{"id":"m","content":[{"type":"text",'
        b'"text":"a\\ud800b"}],"usage":{"input_tokens":100000000000000000000000,'
        b'"output_tokens":-5}}}',
        b'{"type":"system","subtype":"api_retry","attempt":1e400,"max_retries":NaN,'
        b'"retry_delay_ms":Infinity,"error_status":"529","error":"overloaded"}',
        b'{"type":"result","subtype":"success","is_error":false,"result":"ok \\udfff",'
        b'"num_turns":1e300,"api_error_status":"\xc2\xb2",'
        b'"usage":{"input_tokens":99999999999999999999999,"output_tokens":3}}',
    ]
    events = decode_all(b"\n".join(lines) + b"\n")
    text, retry, result = events
    assert isinstance(text, Text) and text.text == "a\ufffdb"
    assert (text.input_tokens, text.output_tokens) == (0, 0)
    assert isinstance(retry, ApiRetry)
    assert (retry.attempt, retry.max_retries, retry.retry_delay_ms, retry.error_status) == \
        (None, None, None, None)
    assert isinstance(result, Result) and result.result == "ok \ufffd"
    assert (result.num_turns, result.api_error_status) == (None, None)
    summary = RunSummary()
    for event in events:
        summary.update(event)
    assert (summary.input_tokens, summary.output_tokens, summary.turns) == (0, 3, 1)
    json.dumps(summary.to_json(), allow_nan=False)


def test_partial_last_line_held_until_newline_or_finish() -> None:
    lines = sample_lines("nonroot_stream")
    dec = StreamDecoder()
    assert [e.kind for e in dec.feed(lines[0] + b"\n" + lines[1][:50])] == ["init"]
    assert dec.feed(lines[1][50:]) == []
    (text,) = dec.finish()
    assert isinstance(text, Text) and text.line_no == 2
    assert dec.finish() == []
    # a dead run's cut-off last line is Malformed, with its number
    dec = StreamDecoder()
    dec.feed(lines[0] + b"\n" + lines[1][:50])
    (cut,) = dec.finish()
    assert isinstance(cut, Malformed) and cut.line_no == 2


def _big_write_line(content_len: int) -> bytes:
    """A real Write tool_use line whose content makes it `content_len`-ish long."""
    base = json.loads(sample_lines("nonroot_stream")[2])
    base["message"]["content"][0]["input"]["content"] = ""
    shell = len(json.dumps(base).encode())
    base["message"]["content"][0]["input"]["content"] = "a" * (content_len - shell)
    line = json.dumps(base).encode()
    assert len(line) == content_len
    return line


def test_a_16_mb_line_decodes() -> None:
    line = _big_write_line(MAX_LINE_BYTES)
    dec = StreamDecoder(cwd=CWD)
    events: list[stream.Event] = []
    for i in range(0, len(line), 1 << 20):
        events += dec.feed(line[i:i + (1 << 20)])
    events += dec.feed(b"\n")
    (tool,) = events
    assert isinstance(tool, ToolUse) and tool.summary == "Write hello.txt"
    assert len(tool.input["content"]) > MAX_LINE_BYTES - 1000
    # in one piece too
    (same_tool,) = decode_all(line + b"\n")
    assert isinstance(same_tool, ToolUse)


def test_an_over_cap_line_is_one_malformed_event_without_unbounded_buffering() -> None:
    over = _big_write_line(MAX_LINE_BYTES + 1)
    after = sample_lines("nonroot_stream")[1]
    dec = StreamDecoder()
    events: list[stream.Event] = []
    chunk = 1 << 20
    peak = 0
    for i in range(0, len(over), chunk):
        events += dec.feed(over[i:i + chunk])
        peak = max(peak, dec.buffered_bytes)
    # keep going: 3 x the cap more of the same line, never buffered
    for _ in range(3 * MAX_LINE_BYTES // chunk):
        events += dec.feed(b"a" * chunk)
        peak = max(peak, dec.buffered_bytes)
    events += dec.feed(b"\n" + after + b"\n")
    assert peak <= MAX_LINE_BYTES
    assert dec.buffered_bytes == 0
    bad, text = events
    assert isinstance(bad, Malformed) and bad.line_no == 1
    assert len(bad.raw) == RAW_KEEP_BYTES and bad.raw.startswith('{"type": "assistant"')
    assert f"{len(over) + 3 * MAX_LINE_BYTES} bytes" in bad.error
    assert isinstance(text, Text) and text.line_no == 2
    # the same line arriving in one chunk gives the same event
    whole = decode_all(over + b"a" * (3 * MAX_LINE_BYTES) + b"\n" + after + b"\n")
    assert same(whole, events)


# --------------------------------------------------------------------------- properties

# Hypothesis is imported where these run, not when the module is collected: ~0.45 s of
# each xdist worker's collection otherwise (every worker collects every module).


def test_same_events_whatever_the_chunking() -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    line_pieces = st.one_of(
        st.sampled_from(ALL_LINES),
        st.binary(max_size=60),
        st.sampled_from([b"", b"{", b"}", b"[1,2]", b'{"type":"result"}', b"\xff\xfe",
                         b'{"type":"assistant","message":{"content":[{"type":"text"}]}}',
                         b'{"type":"user","message":{"content":"hi"}}', b"null", b"NaN"]),
    )

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(pieces=st.lists(line_pieces, max_size=12),
           seps=st.lists(st.sampled_from([b"\n", b"\r\n", b"", b"\n\n"]), min_size=12,
                         max_size=12),
           cuts=st.lists(st.integers(min_value=0, max_value=40_000), max_size=20))
    def check(pieces: list[bytes], seps: list[bytes], cuts: list[int]) -> None:
        data = b"".join(p + s for p, s in zip(pieces, seps, strict=False))
        whole = decode_all(data)
        assert same(feed_chunks(data, cuts), whole)
        assert all(isinstance(e, stream.Event) and e.line_no >= 1 for e in whole)

    check()


def test_random_bytes_never_raise() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=200, deadline=None)
    @given(data=st.binary(max_size=2000), cuts=st.lists(st.integers(0, 2000), max_size=10))
    def check(data: bytes, cuts: list[int]) -> None:
        whole = decode_all(data)
        assert same(feed_chunks(data, cuts), whole)
        lines = data.split(b"\n")
        assert all(1 <= e.line_no <= len(lines) for e in whole)

    check()


def test_random_chunks_over_the_whole_sample_corpus() -> None:
    data = b"\n".join(ALL_LINES) + b"\n"
    whole = decode_all(data)
    assert len([e for e in whole if isinstance(e, Result)]) == len(CASES)
    rng = random.Random(7)
    for _ in range(20):
        cuts = [rng.randrange(len(data)) for _ in range(rng.randrange(1, 200))]
        assert same(feed_chunks(data, cuts), whole)


# --------------------------------------------------------------------------- summaries


@pytest.mark.parametrize(("name", "args", "expected"), [
    ("Write", {"file_path": f"{CWD}/src/app.py", "content": "x"}, "Write src/app.py"),
    ("Edit", {"file_path": f"{CWD}/README.md", "old_string": "a", "new_string": "b"},
     "Edit README.md"),
    ("Read", {"file_path": "/etc/hosts"}, "Read /etc/hosts"),
    ("Bash", {"command": "pytest -q", "description": "run the tests"}, "Bash pytest -q"),
    ("Bash", {"command": "cd sub &&\n\tmake\x1b[31m   all"}, "Bash cd sub && make [31m all"),
    ("Bash", {"command": f"cat {CWD}/a.txt"}, "Bash cat a.txt"),
    ("Grep", {"pattern": "def main", "path": f"{CWD}/src"}, "Grep def main in src"),
    ("Glob", {"pattern": "**/*.py"}, "Glob **/*.py"),
    ("Task", {"description": "Review the diff", "prompt": "long..."}, "Task Review the diff"),
    ("WebFetch", {"url": "https://example.org/x", "prompt": "summarise"},
     "WebFetch https://example.org/x"),
    ("WebSearch", {"query": "textual datatable"}, "WebSearch textual datatable"),
    ("TodoWrite", {"todos": [
        {"content": "a", "status": "completed", "activeForm": "Doing a"},
        {"content": "b", "status": "in_progress", "activeForm": "Running tests"},
        {"content": "c", "status": "pending", "activeForm": "c"}]},
     "TodoWrite 1/3 done · Running tests"),
    ("NotebookEdit", {"notebook_path": f"{CWD}/n.ipynb", "new_source": "x"},
     "NotebookEdit n.ipynb"),
    ("mcp__github__create_issue", {"title": "Bug", "body": "..."},
     "mcp__github__create_issue Bug"),
    ("ExitPlanMode", {}, "ExitPlanMode"),
    ("Write", None, "Write"),
    ("Write", {"file_path": 12}, "Write 12"),
    ("Write", {"file_path": ["odd"]}, "Write"),
    ("", {}, "tool"),
])
def test_summarize_tool(name: str, args: Any, expected: str) -> None:
    assert summarize_tool(name, args, CWD) == expected


def test_summaries_are_one_capped_line() -> None:
    text = summarize_tool("Bash", {"command": "echo " + "word\n" * 500})
    assert "\n" not in text and len(text) == SUMMARY_MAX and text.endswith("…")
    assert summarize_tool("Read", {"file_path": CWD}, CWD) == "Read ."
    assert summarize_tool("Read", {"file_path": f"{CWD}-other/x"}, CWD) == \
        f"Read {CWD}-other/x"


def test_decoder_cwd_comes_from_init_unless_given() -> None:
    data = b"\n".join(sample_lines("nonroot_stream"))
    tool = next(e for e in decode_all(data) if isinstance(e, ToolUse))
    assert tool.summary == "Write hello.txt"
    dec = StreamDecoder(cwd="/home/dev")
    tool = next(e for e in dec.feed(data) if isinstance(e, ToolUse))
    assert tool.summary == "Write work/repo/hello.txt"
