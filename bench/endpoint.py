"""Benchmark 8: the scripted endpoint (fleet_tui/demo/endpoint.py), which the demo and every
real-CLI test run against — its budgets, kept from tests/demo/test_endpoint.py (the tests now
check the behaviour without a clock).

- Six clients at once, each on its own script, every answer paced by a 0.1 s pause
  between events (4 pauses per answer): all six answered. The baseline, alternating with
  it: one client alone on the same kind of script. Budget: at most CONCURRENT_BUDGET times
  the lone client (one after the other would be six times).
- A request held by a `hang` fault, sent with a 0.3 s client timeout: from the send to the
  client giving up. The baseline, alternating: the same request to a bare listening socket
  that never answers. Budget: at most HANG_BUDGET times that.
- Stopping the endpoint while a handler hangs: `stop()` returns. Context, no budget: it
  ends on the server's 0.1 s poll (a fixed time, not a speed), so nothing bare does the
  same work; the behaviour (the held request is released) is checked here and in
  tests/demo/test_endpoint.py.

The clients speak plain HTTP/1.1 on 127.0.0.1 with http.client, as claude does.
"""

from __future__ import annotations

import http.client
import json
import threading
import time

from bench.common import BenchResult, Figure, ms

CLIENTS = 6
EVENT_DELAY = 0.1
CONCURRENT_BUDGET = 2.0  # from quiet runs: 1.0
HANG_BUDGET = 1.5  # from quiet runs: 1.0


def _body(prompt: str) -> bytes:
    return json.dumps({"model": "bench-model", "max_tokens": 100, "stream": True,
                       "messages": [{"role": "user",
                                     "content": [{"type": "text", "text": prompt}]}]}).encode()


def post(port: int, prompt: str, timeout: float = 30.0) -> tuple[int, bytes]:
    """POST one request and read the whole answer: (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/messages?beta=true", body=_body(prompt),
                     headers={"content-type": "application/json",
                              "anthropic-version": "2023-06-01"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def concurrent_clients(clients: int = CLIENTS, delay: float = EVENT_DELAY) -> float:
    """Seconds for `clients` clients started at once to each get their own whole answer."""
    from fleet_tui.demo.endpoint import ScriptedEndpoint

    scripts = {f"w{i}": [f"worker {i} done"] for i in range(clients)}
    answers: dict[int, tuple[int, bytes]] = {}
    with ScriptedEndpoint(scripts, event_delay=delay) as ep:
        def one(i: int) -> None:
            answers[i] = post(ep.port, f"task [script:w{i}] please")

        threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        took = time.perf_counter() - t0
    for i in range(clients):
        status, body = answers.get(i, (0, b""))
        if status != 200 or f"worker {i} done".encode() not in body:
            raise RuntimeError(f"client {i} got {status}: {body[:200]!r}")
    return took


def hang_until_client_gives_up(client_timeout: float = 0.3) -> float:
    """Seconds from sending a request the endpoint holds to the client's timeout."""
    from fleet_tui.demo.endpoint import ScriptedEndpoint

    with ScriptedEndpoint(["late"], faults=["hang"]) as ep:
        t0 = time.perf_counter()
        try:
            post(ep.port, "hello", timeout=client_timeout)
        except TimeoutError:
            return time.perf_counter() - t0
    raise RuntimeError("the hung request was answered")


def bare_silent_socket(client_timeout: float = 0.3) -> float:
    """Seconds for the same request to a bare listening socket that never answers (the
    kernel completes the connection; nobody reads) to reach the client's timeout."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        t0 = time.perf_counter()
        try:
            post(port, "hello", timeout=client_timeout)
        except TimeoutError:
            return time.perf_counter() - t0
    raise RuntimeError("the silent socket answered")


def stop_with_a_hung_handler() -> float:
    """Seconds for `stop()` to return while a handler hangs on an open request."""
    from fleet_tui.demo.endpoint import ScriptedEndpoint

    ep = ScriptedEndpoint(["late"], faults=["hang"]).start()
    errors: list[BaseException] = []

    def client() -> None:
        try:
            post(ep.port, "hello", timeout=60)
        except (OSError, http.client.HTTPException) as exc:
            errors.append(exc)

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    ep.wait_for(1, timeout=30)  # the handler holds the request now
    t0 = time.perf_counter()
    ep.stop()
    took = time.perf_counter() - t0
    thread.join(60)
    if thread.is_alive() or not errors:
        raise RuntimeError("stopping the endpoint did not release the held request")
    return took


def run(smoke: bool = False, runs: int | None = None) -> BenchResult:
    runs = runs or (1 if smoke else 5)
    clients, delay = (2, 0.01) if smoke else (CLIENTS, EVENT_DELAY)
    together: list[float] = []
    alone: list[float] = []
    gave_up: list[float] = []
    silent: list[float] = []
    for i in range(runs):  # alternate which arm goes first
        if i % 2:
            alone.append(ms(concurrent_clients(1, delay)))
            silent.append(ms(bare_silent_socket()))
        together.append(ms(concurrent_clients(clients, delay)))
        gave_up.append(ms(hang_until_client_gives_up()))
        if not i % 2:
            alone.append(ms(concurrent_clients(1, delay)))
            silent.append(ms(bare_silent_socket()))
    stopped = [ms(stop_with_a_hung_handler()) for _ in range(runs)]
    figures = [
        Figure("endpoint.concurrent_ratio", f"{clients} clients at once ÷ one client alone",
               "×", [t / a for t, a in zip(together, alone, strict=True)],
               budget=CONCURRENT_BUDGET, per="pair", baseline="endpoint.alone",
               note=f"one after the other would be {clients}×"),
        Figure("endpoint.concurrent", f"{clients} clients at once, each its own script", "ms",
               together,
               note=f"{delay * 1000:.0f} ms between events, 4 pauses per answer: one after "
                    f"the other would take {clients * 4 * delay * 1000:,.0f} ms"),
        Figure("endpoint.alone", "one client alone, same pacing (baseline)", "ms", alone),
        Figure("endpoint.hang_ratio", "held request → client timeout ÷ bare silent socket",
               "×", [g / b for g, b in zip(gave_up, silent, strict=True)],
               budget=HANG_BUDGET, per="pair", baseline="endpoint.silent"),
        Figure("endpoint.hang_client", "held request → the client's 0.3 s timeout", "ms",
               gave_up),
        Figure("endpoint.silent", "same request to a bare silent socket (baseline)", "ms",
               silent),
        Figure("endpoint.hang_stop", "stop() while a handler hangs", "ms", stopped,
               no_baseline="it ends on the server's 0.1 s poll, a fixed time; nothing bare "
                           "does the same work (the release itself is checked)"),
    ]
    return BenchResult("endpoint", "8. Scripted endpoint", figures)
