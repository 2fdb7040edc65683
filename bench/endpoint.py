"""Benchmark 8: the scripted endpoint (fleet_tui/endpoint.py), which the demo and every
real-CLI test run against — its budgets, kept from tests/test_endpoint.py (the tests now
check the behaviour without a clock).

- Six clients at once, each on its own script, every answer paced by a 0.1 s pause
  between events (4 pauses per answer): all six answered. One after the other that is
  2.4 s; budget 2 s.
- A request held by a `hang` fault, sent with a 0.3 s client timeout: from the send to the
  client giving up. Budget 3 s.
- Stopping the endpoint while a handler hangs: `stop()` returns. Budget 3 s.

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
    from fleet_tui.endpoint import ScriptedEndpoint

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
    from fleet_tui.endpoint import ScriptedEndpoint

    with ScriptedEndpoint(["late"], faults=["hang"]) as ep:
        t0 = time.perf_counter()
        try:
            post(ep.port, "hello", timeout=client_timeout)
        except TimeoutError:
            return time.perf_counter() - t0
    raise RuntimeError("the hung request was answered")


def stop_with_a_hung_handler() -> float:
    """Seconds for `stop()` to return while a handler hangs on an open request."""
    from fleet_tui.endpoint import ScriptedEndpoint

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
    together = [ms(concurrent_clients(clients, delay)) for _ in range(runs)]
    gave_up = [ms(hang_until_client_gives_up()) for _ in range(runs)]
    stopped = [ms(stop_with_a_hung_handler()) for _ in range(runs)]
    figures = [
        Figure("endpoint.concurrent", f"{clients} clients at once, each its own script", "ms",
               together, budget=2000.0,
               note=f"{delay * 1000:.0f} ms between events, 4 pauses per answer: one after "
                    f"the other would take {clients * 4 * delay * 1000:,.0f} ms"),
        Figure("endpoint.hang_client", "held request → the client's 0.3 s timeout", "ms",
               gave_up, budget=3000.0),
        Figure("endpoint.hang_stop", "stop() while a handler hangs", "ms", stopped,
               budget=3000.0),
    ]
    return BenchResult("endpoint", "8. Scripted endpoint", figures)
