"""Benchmark 10: the local gateway between a client and the scripted endpoint.

- Time to first byte: a streamed request sent straight to the scripted endpoint, and the
  same request through the gateway (a token checked in the store, the gate read, a slot
  taken, the real key put in), in alternation, each on a new connection as the pairs are
  compared. The budget is the ratio of the medians' pairs (through ÷ direct); the added
  milliseconds (through − direct) are context, against the issue's ≤ 2 ms median and
  ≤ 10 ms p99.
- 200 streams at once through the gateway (max_requests 200, the endpoint pacing each
  answer): all answered whole; the gateway's resident size at the peak ÷ its size idle
  (budget), the sizes themselves and its CPU time per stream (context; the issue's budget
  for the size: ≤ 100 MB).

The gateway is the real detached process (`control.ensure`), its store a private one.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import BenchResult, Figure, bench_env, ms, quantile

TTFB_BUDGET = 3.0  # through ÷ direct per pair: the 2 ms added on a ~1 ms direct answer
RSS_BUDGET = 2.0  # peak with 200 streams ÷ idle
KEY = "sk-bench-gateway-key"


def _body() -> bytes:
    return json.dumps({"model": "bench-model", "max_tokens": 100, "stream": True,
                       "messages": [{"role": "user",
                                     "content": [{"type": "text", "text": "go"}]}]}).encode()


def _first_byte(port: int, path: str, headers: dict[str, str]) -> tuple[float, bytes]:
    """Seconds from the send to the answer's first body byte, and the whole answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        t0 = time.perf_counter()
        conn.request("POST", path, body=_body(), headers={
            "content-type": "application/json", "anthropic-version": "2023-06-01",
            **headers})
        resp = conn.getresponse()
        first = resp.read(1)
        took = time.perf_counter() - t0
        rest = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"answer {resp.status}: {(first + rest)[:200]!r}")
        return took, first + rest
    finally:
        conn.close()


def _proc(pid: int) -> tuple[float, float]:
    """Resident MiB and CPU seconds (user + system) of a process."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return rss, (int(fields[11]) + int(fields[12])) / ticks


def _burst(pid: int, port: int, headers: dict[str, str], streams: int, ep: Any
           ) -> tuple[float, float, float]:
    """`streams` paced streams at once through the gateway, all answered whole: its idle
    and peak resident MiB, and its CPU ms per stream."""
    idle_rss, cpu0 = _proc(pid)
    ep.event_delay = 0.05  # each answer streams over a few hundred ms
    answers: list[bytes] = []
    peak = [idle_rss]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak.append(_proc(pid)[0])

    def one() -> None:
        answers.append(_first_byte(port, "/e/default/v1/messages?beta=true", headers)[1])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    clients = [threading.Thread(target=one) for _ in range(streams)]
    for t in clients:
        t.start()
    for t in clients:
        t.join(120)
    done.set()
    sampler.join(5)
    busy_rss, cpu1 = _proc(pid)
    peak.append(busy_rss)
    whole = sum(1 for a in answers if b"event: message_stop" in a)
    if whole != streams:
        raise RuntimeError(f"{whole} of {streams} streams came back whole")
    return idle_rss, max(peak), ms(cpu1 - cpu0) / streams


def run(smoke: bool = False, runs: int | None = None) -> BenchResult:
    from fleet_tui.demo.endpoint import ScriptedEndpoint
    from fleet_tui.gateway import control
    from fleet_tui.gateway.routes import Route
    from fleet_tui.store.db import Store
    from fleet_tui.store.meter import Meter

    rounds = runs or (1 if smoke else 3)
    pairs = 3 if smoke else 100  # time-to-first-byte pairs per round
    streams = 10 if smoke else 200
    direct: list[float] = []
    through: list[float] = []
    ratios: list[float] = []
    peaks: list[float] = []
    idles: list[float] = []
    cpu: list[float] = []
    with bench_env("fleet-bench-gateway-") as benv, \
            ScriptedEndpoint([["a short answer"]]) as ep:
        store = Store(benv.fleet_home / "fleet.db")
        info = control.ensure([Route("default", ep.url, streams, ep.url)], {"default": KEY},
                              db=store.path, python=sys.executable, env=benv.env)
        try:
            token = Meter(store).mint("bench", 1, "default")
            gw = {"x-api-key": token}
            for _ in range(5):  # warm both paths (connections, the store's pages)
                _first_byte(ep.port, "/v1/messages?beta=true", {"x-api-key": KEY})
                _first_byte(info.port, "/e/default/v1/messages?beta=true", gw)
            for _round in range(rounds):
                ep.event_delay = 0.0
                for i in range(pairs):
                    order = [False, True] if i % 2 else [True, False]
                    for via in order:
                        if via:
                            through.append(_first_byte(
                                info.port, "/e/default/v1/messages?beta=true", gw)[0])
                        else:
                            direct.append(_first_byte(
                                ep.port, "/v1/messages?beta=true", {"x-api-key": KEY})[0])
                idle, busy, per_stream = _burst(info.pid, info.port, gw, streams, ep)
                idles.append(idle)
                peaks.append(busy)
                ratios.append(busy / idle)
                cpu.append(per_stream)
        finally:
            control.stop(benv.env)
    added = [ms(t - d) for t, d in zip(through, direct, strict=True)]
    figures = [
        Figure("gateway.ttfb_ratio", "time to first byte through the gateway ÷ direct", "×",
               [t / d for t, d in zip(through, direct, strict=True)], budget=TTFB_BUDGET,
               per="pair", baseline="gateway.ttfb_direct"),
        Figure("gateway.ttfb_through", "time to first byte through the gateway", "ms",
               [ms(t) for t in through], per="request"),
        Figure("gateway.ttfb_direct", "time to first byte, direct (baseline)", "ms",
               [ms(d) for d in direct], per="request"),
        Figure("gateway.ttfb_added", "time to first byte the gateway adds (through − direct)",
               "ms", added, per="pair",
               note=f"the issue's budget: ≤ 2 ms median, ≤ 10 ms p99; here median "
                    f"{quantile(added, 0.5):.2f}, p99 {quantile(added, 0.99):.2f}"),
        Figure("gateway.rss_ratio", f"gateway's resident size, {streams} streams at once ÷ "
               "idle", "×", ratios, budget=RSS_BUDGET, baseline="gateway.rss_idle"),
        Figure("gateway.rss_busy", f"gateway's peak resident size, {streams} streams at once",
               "MB", peaks, note="the issue's budget: ≤ 100 MB"),
        Figure("gateway.rss_idle", "gateway's resident size, idle (baseline)", "MB", idles),
        Figure("gateway.cpu_per_stream", "gateway's CPU time per stream", "ms", cpu,
               note=f"{streams} streams at once, each answer paced 50 ms an event"),
    ]
    return BenchResult("gateway", "10. Gateway", figures)
