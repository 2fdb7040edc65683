"""The parser and the verdicts are total.

Generated and mutated inputs (fixed seeds) built from the real CLI samples in
tests/support/fixtures/stream-json: byte flips, truncations, spliced lines, values replaced by
values
of other types (huge ints, NaN and Infinity, lone surrogates, wrong containers, strings of
Unicode digits such as "²"), deep nesting, invalid UTF-8. Each input goes through the
decoder in random chunkings, RunSummary, find_result, classify and fleet-collect's main path.
No input may raise, and each must keep the decoder's promises: the same events whatever the
chunking, line numbers that match the input's lines, an event for every line that is not a
plain user/assistant message, and outcomes a person and JSON can read.

Against the code before the fix (commit d111664), 8,019 of the 50,400 inputs failed: 6,049
raised inside fleet_tui (3,470 RecursionError from msgspec in StreamDecoder.feed, 78
ValueError from int("²") in outcome._as_int, 2 UnicodeEncodeError in fleet-collect, 2
RecursionError in Outcome.to_json, and 2,497 TypeError from an exit code or a stderr tail of
another type), and 1,970 broke an invariant (lone surrogates in events and outcomes, NaN in
JSON output, counts over 2**63, events that depended on the chunking).
"""

from __future__ import annotations

import io
import json
import math
import random
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from soak_report import knob, record

from fleet_tui.commands import collect
from fleet_tui.core import stream
from fleet_tui.core.outcome import Outcome, Verdict, classify, find_result

SAMPLES = Path(__file__).resolve().parents[1] / "support" / "fixtures" / "stream-json"

# inputs per generator below; 50,400 in all (the soak, FLEET_SOAK=1: 504,000; or set
# FLEET_SOAK_FUZZ_ROUNDS)
ROUNDS = knob("FLEET_SOAK_FUZZ_ROUNDS", 7_200, 72_000)
# the costlier checks run on one input in N (every input is decoded, summed up, classified)
CHUNKED_EVERY = 3  # decoded again in random pieces, and compared
COLLECT_EVERY = 9  # through fleet-collect's main()
JSON_EVERY = 10  # the Outcome written as strict JSON
MAX_SAFE = 2**63 - 1  # what SQLite can store


def _sample_lines() -> list[bytes]:
    lines: list[bytes] = []
    for path in sorted(SAMPLES.glob("*/stdout.json*")):
        data = path.read_bytes()
        if path.suffix == ".json":
            lines.append(data.strip())
        else:
            lines.extend(line for line in data.split(b"\n") if line.strip())
    return lines


LINES = _sample_lines()
OBJECTS = [obj for obj in (json.loads(line) for line in LINES) if isinstance(obj, dict)]


class _Deep:
    """A value nested too deep for json.dumps: spliced into the JSON text as bytes."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw


def _deep_bytes(depth: int, rng: random.Random) -> bytes:
    leaf = rng.choice((b"1", b'"x"', b"null", b"[]", b"{}"))
    shape = rng.randrange(3)
    if shape == 0:
        return b"[" * depth + leaf + b"]" * depth
    if shape == 1:
        return b'{"a":' * depth + leaf + b"}" * depth
    return b'[{"a":' * (depth // 2) + leaf + b"}]" * (depth // 2)


POISONS: tuple[Any, ...] = (
    None, True, False, 0, -1, 2**31, 2**64, -(2**70), 10**300, 1.5, -0.0, 1e308,
    float("nan"), float("inf"), float("-inf"), "", "²", "١٢٣", "429²", " 401 ", "x" * 300,
    "\ud800", "a\udfffb", "\x00\x1b[31m\n", [], {}, [1, "a", None], {"a": {"b": []}},
    {"type": "text", "text": 5}, [{"type": "tool_use", "input": "\ud83d"}],
    {"input_tokens": "7", "output_tokens": -3}, {"input_tokens": 2**80},
)


def _poison(rng: random.Random) -> Any:
    """A value of some other type than the field expects."""
    if rng.randrange(24) == 0:
        return _Deep(_deep_bytes(rng.choice((10, 200, 990, 1000, 1100, 3000, 20_000)), rng))
    return rng.choice(POISONS)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths to the values of obj (the first 6 items of a list)."""
    yield prefix
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj[:6]):
            yield from _paths(value, (*prefix, i))


PATHS = [list(_paths(obj)) for obj in OBJECTS]


def _replaced(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(obj, dict):
        copy = dict(obj)
        copy[head] = _replaced(obj[head], rest, value)
        return copy
    copy_list = list(obj)
    copy_list[head] = _replaced(obj[head], rest, value)
    return copy_list


def _dumps(obj: Any, rng: random.Random) -> bytes:
    """JSON bytes of obj: NaN and Infinity as Python writes them, lone surrogates escaped
    or as raw (invalid UTF-8) bytes, `_Deep` values spliced in."""
    deep: list[bytes] = []

    def placeholder(value: Any) -> str:
        deep.append(value.raw)
        return f"\x00deep{len(deep) - 1}\x00"

    text = json.dumps(obj, ensure_ascii=rng.random() < 0.5, default=placeholder)
    data = text.encode("utf-8", "surrogatepass")
    for i, raw in enumerate(deep):
        data = data.replace(f'"\\u0000deep{i}\\u0000"'.encode(), raw)
    return data


# --------------------------------------------------------------------------- generators


def gen_retyped(rng: random.Random) -> bytes:
    """A real line with one to three values replaced by values of other types."""
    which = rng.randrange(len(OBJECTS))
    obj: Any = OBJECTS[which]
    paths = rng.sample(PATHS[which], min(len(PATHS[which]), rng.randint(1, 3)))
    for path in sorted(paths, key=len, reverse=True):  # a deeper path first: both apply
        obj = _replaced(obj, path, _poison(rng))
    return _dumps(obj, rng)


def gen_flipped(rng: random.Random) -> bytes:
    """A real line with a few bytes changed, inserted or removed."""
    line = bytearray(rng.choice(LINES))
    for _ in range(rng.randint(1, 4)):
        pos = rng.randrange(len(line))
        what = rng.randrange(4)
        byte = rng.choice((rng.randrange(256), ord('"'), ord("{"), ord("]"), ord("\\"), 0x80,
                           0xff, ord("9"), ord("\n")))
        if what == 0:
            line[pos] = byte
        elif what == 1:
            line.insert(pos, byte)
        elif what == 2:
            del line[pos]
        else:
            line[pos:pos] = rng.choice((b"\xed\xa0\x80", b"\\ud800", b"\xc3", b"NaN",
                                        b"Infinity", b"1e999", b"[" * 1200))
    return bytes(line)


def gen_truncated(rng: random.Random) -> bytes:
    line = rng.choice(LINES)
    return line[:rng.randrange(len(line) + 1)]


def gen_spliced(rng: random.Random) -> bytes:
    a, b = rng.choice(LINES), rng.choice(LINES)
    return a[:rng.randrange(len(a) + 1)] + b[rng.randrange(len(b) + 1):]


def gen_deep(rng: random.Random) -> bytes:
    """Deep nesting where the decoder keeps a value (tool input, partial event, result)."""
    depth = rng.choice((100, 500, 900, 999, 1000, 1001, 1500, 5000))
    if rng.random() < 0.01:
        depth = 50_000
    value = _deep_bytes(depth, rng)
    templates = (
        b'{"type":"assistant","message":{"id":"m","content":[{"type":"tool_use","id":"t",'
        b'"name":"Bash","input":%s}]}}',
        b'{"type":"assistant","message":%s}',
        b'{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t",'
        b'"content":%s}]}}',
        b'{"type":"result","subtype":"success","is_error":false,"result":"done",'
        b'"num_turns":2,"extra":%s}',
        b'{"type":"result","is_error":true,"api_error_status":%s}',
        b'{"type":"system","subtype":"hook","data":%s}',
        b'{"type":"system","subtype":"init","tools":%s}',
        b'{"type":"stream_event","event":%s}',
        b'{"type":"rate_limit_event","rate_limit_info":%s}',
        b'{"type":"future_kind","payload":%s}',
        b"%s",
    )
    return rng.choice(templates) % value


def gen_values(rng: random.Random) -> bytes:
    """Result and retry lines whose numbers and flags are odd values of every type."""
    field = rng.choice(("api_error_status", "num_turns", "is_error", "result", "subtype",
                        "usage", "permission_denials", "session_id", "terminal_reason"))
    obj: dict[str, Any] = {"type": "result", "subtype": "success", "is_error": True,
                           "api_error_status": 429, "result": "API Error: (429) x",
                           "num_turns": 3, "usage": {"input_tokens": 5, "output_tokens": 7}}
    obj[field] = _poison(rng)
    if rng.random() < 0.3:
        obj = {"type": "system", "subtype": "api_retry",
               rng.choice(("attempt", "max_retries", "retry_delay_ms", "error_status",
                           "error")): _poison(rng)}
    return _dumps(obj, rng)


def gen_noise(rng: random.Random) -> bytes:
    """Random bytes, JSON scalars and odd documents."""
    return rng.choice((
        bytes(rng.randrange(256) for _ in range(rng.randrange(80))),
        rng.choice((b"null", b"NaN", b"-Infinity", b"1" * 5000, b'"\\udc00"', b"[]", b"{}",
                    b'{"type":null}', b'{"type":"result"}', b'{"type":["result"]}',
                    b'{"is_error":"yes"}', b"\t \r", b"\xef\xbb\xbf{}")),
        _dumps([rng.choice(OBJECTS), _poison(rng)], rng),
    ))


GENERATORS: list[Callable[[random.Random], bytes]] = [
    gen_retyped, gen_flipped, gen_truncated, gen_spliced, gen_deep, gen_values, gen_noise,
]


def documents(seed: int, generator: Callable[[random.Random], bytes],
              rounds: int) -> Iterator[bytes]:
    """`rounds` inputs: the generated line alone, or among real lines, with odd separators."""
    rng = random.Random(seed)
    for _ in range(rounds):
        bad = generator(rng)
        if rng.random() < 0.5:
            yield bad + rng.choice((b"\n", b"", b"\r\n"))
            continue
        lines = [rng.choice(LINES) for _ in range(rng.randint(1, 2))]
        lines.insert(rng.randint(0, len(lines)), bad)
        sep = rng.choice((b"\n", b"\r\n", b"\n\n"))
        yield sep.join(lines) + rng.choice((sep, b""))


# --------------------------------------------------------------------------- checks


def _fingerprint(event: stream.Event) -> tuple[Any, ...]:
    """What must not depend on the chunking (data with NaN never equals itself: left out)."""
    return (event.kind, event.line_no, event.parent_tool_use_id,
            *(getattr(event, name, None) for name in (
                "text", "summary", "first_line", "error", "raw", "type", "subtype",
                "api_error_status", "num_turns", "result", "session_id", "tool_name")))


def _utf8(text: str | None) -> None:
    if text is not None:
        text.encode("utf-8")  # no lone surrogates: the store, the screen and stdout take it


def _complete_lines(data: bytes) -> list[bytes]:
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


_PLAIN_MESSAGE = re.compile(rb'\s*\{\s*"type"\s*:\s*"(?:user|assistant)"')


def _may_show_nothing(line: bytes) -> bool:
    """A plain user/assistant message may give no event (a prompt, an empty message)."""
    if not line.strip():
        return True
    try:
        obj = json.loads(line.decode("utf-8", "replace"))
    except ValueError:
        return False
    except RecursionError:
        # nested ~1000 deep: whether it decodes at all depends on the stack depth of the
        # caller (msgspec and json both stop at Python's recursion limit); the decoder may
        # have read it as the message it starts as
        return _PLAIN_MESSAGE.match(line) is not None
    return isinstance(obj, dict) and obj.get("type") in ("user", "assistant")


def _feed(data: bytes, steps: list[int]) -> tuple[list[stream.Event], stream.StreamDecoder]:
    """The events of `data` fed in pieces of the given sizes (cycled)."""
    decoder = stream.StreamDecoder()
    events: list[stream.Event] = []
    pos = i = 0
    while pos < len(data):
        step = steps[i % len(steps)]
        events.extend(decoder.feed(data[pos:pos + step]))
        pos += step
        i += 1
    events.extend(decoder.finish())
    return events, decoder


def check_decoder(data: bytes, rng: random.Random, chunked: bool) -> list[stream.Event]:
    whole, decoder = _feed(data, [len(data) or 1])
    if chunked:
        # pieces of 1 byte and up, at most ~20 of them (a 100 KB deep line in 1-byte
        # pieces would only test the same thing more slowly)
        steps = [max(rng.choice((1, 2, 7, 64, 4096)), len(data) // 20)
                 for _ in range(rng.randint(1, 5))]
        pieces, decoder = _feed(data, steps)
        assert [_fingerprint(e) for e in pieces] == [_fingerprint(e) for e in whole]
    lines = _complete_lines(data)
    assert decoder.line_no == len(lines)
    assert decoder.buffered_bytes == 0
    numbers = [e.line_no for e in whole]
    assert numbers == sorted(numbers) and all(1 <= n <= len(lines) for n in numbers)
    shown = set(numbers)
    for n, line in enumerate(lines, 1):
        assert n in shown or _may_show_nothing(line), (n, line[:200])
    for event in whole:
        assert isinstance(event, stream.Event)
        for name in ("text", "summary", "first_line", "error", "raw", "session_id", "model",
                     "result", "name", "id", "tool_use_id", "type", "subtype", "message_id"):
            value = getattr(event, name, None)
            if isinstance(value, str):
                _utf8(value)
    return whole


def check_summary(events: list[stream.Event]) -> None:
    summary = stream.RunSummary()
    for i, event in enumerate(events):
        summary.update(event, at=float(i))
    for name in ("turns", "input_tokens", "output_tokens", "tool_calls", "tool_errors",
                 "api_retries"):
        value = getattr(summary, name)
        assert isinstance(value, int) and 0 <= value <= MAX_SAFE, (name, value)
    for name in ("last_tool", "last_text", "session_id", "model"):
        _utf8(getattr(summary, name))
    json.dumps(summary.to_json(), allow_nan=False)


def check_outcome(outcome: Outcome, as_json: bool) -> None:
    assert isinstance(outcome, Outcome) and isinstance(outcome.verdict, Verdict)
    assert isinstance(outcome.message, str) and outcome.message.strip()
    assert "\n" not in outcome.message
    for text in (outcome.message, outcome.result_text, outcome.session_id, outcome.subtype):
        _utf8(text)
    for number in (outcome.api_error_status, outcome.num_turns):
        assert number is None or (isinstance(number, int) and abs(number) <= MAX_SAFE)
    if as_json:
        json.dumps(outcome.to_json(), allow_nan=False)


EXIT_CODES: list[Any] = [None, 0, 1, 143, -9, -15, 2**70, "0", "²", 1.5, float("nan"), [1]]
SIGNALS: list[Any] = [None, 15, 9, 0, 99999, -3, "TERM", 2**80, {}]
TAILS: list[Any] = ["", "Bun v1.4.0 (Linux x64 baseline)\n", "error: unknown option '--x'\n",
                    "\ud800\n" * 3, "TypeError: x\n    at y (/b.js:1:2)\n", b"\xff bytes", None]


def check_verdicts(data: bytes, events: list[stream.Event], rng: random.Random,
                   as_json: bool) -> None:
    found = find_result(data)
    assert found is None or isinstance(found, dict)
    kwargs = {"exit_code": rng.choice(EXIT_CODES), "signal": rng.choice(SIGNALS),
              "stderr_tail": rng.choice(TAILS), "killed": rng.random() < 0.1,
              "timed_out": rng.random() < 0.1}
    check_outcome(classify(result=found, **kwargs), as_json)
    results = [e for e in events if isinstance(e, stream.Result)]
    if results:
        check_outcome(classify(result=results[-1], **kwargs), as_json)


class _Stdin:
    def __init__(self, data: bytes) -> None:
        self.buffer = io.BytesIO(data)


def check_collect(data: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")  # strict, like a real pipe
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace")
    monkeypatch.setattr(sys, "stdin", _Stdin(data))
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    args = ["--json", "-"] if data[:1] == b"{" else ["-"]
    code = collect.main(args)
    out.flush()
    err.flush()
    assert code in (collect.EXIT_OK, collect.EXIT_FAILED, collect.EXIT_MALFORMED)
    message = err.buffer.getvalue().decode()  # type: ignore[attr-defined]
    if code != collect.EXIT_OK:
        assert message.startswith(("fleet-collect: ", "FAILED (")), message
    if "--json" in args:
        printed = out.buffer.getvalue().decode()  # type: ignore[attr-defined]
        if printed:
            payload = json.loads(printed)
            assert payload["verdict"] in set(Verdict)
            assert all(not isinstance(v, float) or math.isfinite(v)
                       for v in payload.values())


# --------------------------------------------------------------------------- the run


@pytest.mark.parametrize("generator", GENERATORS, ids=lambda g: g.__name__)
def test_no_input_raises(generator: Callable[[random.Random], bytes],
                         monkeypatch: pytest.MonkeyPatch) -> None:
    seed = 9_000 + GENERATORS.index(generator)
    rng = random.Random(seed + 1)
    failures: list[tuple[int, str, bytes]] = []
    count = 0
    for count, data in enumerate(documents(seed, generator, ROUNDS), 1):
        try:
            events = check_decoder(data, rng, count % CHUNKED_EVERY == 0)
            check_summary(events)
            check_verdicts(data, events, rng, count % JSON_EVERY == 0)
            if count % COLLECT_EVERY == 0:
                with monkeypatch.context() as patch:
                    check_collect(data, patch)
        except Exception as exc:  # counted, and reported below
            failures.append((count, repr(exc)[:300], data[:300]))
    record("fuzz", "inputs", count, "", f"{len(GENERATORS)} generators x {ROUNDS:,}, "
           f"seeds 9000-{9000 + len(GENERATORS) - 1}")
    record("fuzz", "inputs that raised or broke a promise", len(failures))
    assert count == ROUNDS
    assert not failures, (f"{len(failures)} of {ROUNDS} inputs failed; first ones:\n"
                          + "\n".join(f"#{n}: {err}\n   {data!r}" for n, err, data in
                                      failures[:8]))
