"""Benchmark 1: the stream-json parser against bare `json.loads` over the same lines.

The input is a realistic mix built only from the real CLI outputs in
tests/support/fixtures/stream-json/: sessions that open with a real `system/init` line, carry the
real assistant text / tool_use and user tool_result lines (the bulk of a long run), now and
then a real `api_retry` line, and close with a real `result` line. The decoder gets the
bytes in 4 MiB chunks, the way the panel reads an events file; the baseline decodes each
line with `json.loads` and does nothing else. Budget: the typed parse at least
PARSER_BUDGET times as fast (quiet: 1.12-1.23; 0.99 on one core of a machine whose other
processes took 84% of the CPU, so the budget leaves that much headroom).
"""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path

from bench.common import SAMPLES_DIR, BenchResult, Figure

BODY_LINES_PER_SESSION = 60  # assistant/user lines between init and result
RETRIES_PER_SESSION = 1
CHUNK = 4 * 1024 * 1024  # the panel's READ_CHUNK
PARSER_BUDGET = 0.9
BLOCK_LINES = 50_000  # one block is built once and fed again until the line count is met


def _sample_lines(samples: Path = SAMPLES_DIR) -> dict[str, list[bytes]]:
    """The real lines, grouped: init, body (assistant/user), retry, result, other."""
    groups: dict[str, list[bytes]] = {"init": [], "body": [], "retry": [], "result": [],
                                      "other": []}
    files = sorted(samples.glob("*/stdout.jsonl"))
    if not files:
        raise FileNotFoundError(f"no stream-json samples under {samples}")
    for path in files:
        for raw in path.read_bytes().splitlines():
            if not raw.strip():
                continue
            data = json.loads(raw)
            kind, sub = data.get("type"), data.get("subtype")
            if kind == "system" and sub == "init":
                groups["init"].append(raw)
            elif kind == "system" and sub == "api_retry":
                groups["retry"].append(raw)
            elif kind == "result":
                groups["result"].append(raw)
            elif kind in ("assistant", "user"):
                groups["body"].append(raw)
            else:
                groups["other"].append(raw)
    return groups


def build_mix(n_lines: int, samples: Path = SAMPLES_DIR) -> list[bytes]:
    """`n_lines` real lines in session order (init, body…, retry, result), cycling the
    samples so every real line appears."""
    groups = _sample_lines(samples)
    counters = dict.fromkeys(groups, 0)

    def take(group: str) -> bytes:
        pool = groups[group] or groups["body"]
        line = pool[counters[group] % len(pool)]
        counters[group] += 1
        return line

    out: list[bytes] = []
    while len(out) < n_lines:
        out.append(take("init"))
        for i in range(BODY_LINES_PER_SESSION):
            out.append(take("body"))
            if i == BODY_LINES_PER_SESSION // 2:
                for _ in range(RETRIES_PER_SESSION):
                    out.append(take("retry"))
        if groups["other"]:
            out.append(take("other"))
        out.append(take("result"))
    return out[:n_lines]


def _chunks(blob: bytes, size: int) -> list[bytes]:
    return [blob[i:i + size] for i in range(0, len(blob), size)]


def time_stream(chunks: list[bytes], repeats: int) -> tuple[float, int]:
    """Seconds to decode `chunks` `repeats` times with one StreamDecoder, and the number
    of events it produced."""
    from fleet_tui.core.stream import StreamDecoder

    decoder = StreamDecoder()
    events = 0
    gc.collect()
    start = time.perf_counter()
    for _ in range(repeats):
        for chunk in chunks:
            events += len(decoder.feed(chunk))
    events += len(decoder.finish())
    return time.perf_counter() - start, events


def time_json(lines: list[bytes], repeats: int) -> float:
    """Seconds for a bare loop of json.loads over the same lines."""
    loads = json.loads
    gc.collect()
    start = time.perf_counter()
    for _ in range(repeats):
        for line in lines:
            loads(line)
    return time.perf_counter() - start


def run(smoke: bool = False, runs: int | None = None) -> BenchResult:
    total = 4_000 if smoke else 1_000_000
    runs = runs or (2 if smoke else 5)
    block_n = min(BLOCK_LINES, total)
    repeats = max(1, total // block_n)
    lines = build_mix(block_n)
    n = block_n * repeats
    blob = b"\n".join(lines) + b"\n"
    chunks = _chunks(blob, CHUNK)
    avg_bytes = len(blob) / block_n

    stream_rate: list[float] = []
    json_rate: list[float] = []
    ratio: list[float] = []
    events = 0
    for i in range(runs):
        # alternate the order so neither side always runs on a warmer cache
        if i % 2 == 0:
            t_stream, events = time_stream(chunks, repeats)
            t_json = time_json(lines, repeats)
        else:
            t_json = time_json(lines, repeats)
            t_stream, events = time_stream(chunks, repeats)
        stream_rate.append(n / t_stream)
        json_rate.append(n / t_json)
        ratio.append(t_json / t_stream)

    figures = [
        Figure("parser.ratio", "stream.py ÷ json.loads (lines/s)", "×", ratio,
               budget=PARSER_BUDGET,
               better="higher", per="pair", baseline="parser.json",
               note="the typed parse may cost little more than the stdlib's decoding alone"),
        Figure("parser.stream", "stream.py StreamDecoder", "lines/s", stream_rate,
               better="higher", note=f"{events / n:.2f} typed events per line"),
        Figure("parser.json", "bare json.loads loop (baseline)", "lines/s", json_rate,
               better="higher"),
    ]
    notes = [f"{n:,} lines per run ({block_n:,}-line block × {repeats}), "
             f"{avg_bytes:.0f} bytes per line on average, fed in {CHUNK // 1024 // 1024} MiB "
             "chunks; built from every real line in tests/support/fixtures/stream-json/"]
    return BenchResult("parser", "1. Parser", figures, notes)
