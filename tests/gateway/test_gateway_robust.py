"""The gateway under blows, with the real claude against the scripted endpoint: SIGKILLed
at points along a slow stream (every task still ends ok, resumed in its session), a flood
of slow connections from a local process (the workers are served throughout), a closed
window met by workers in flight (the gateway shuts the gate on the first answer), a stream
cut downstream (its slot held until the upstream answer ends), and the meter (what was
served, errors counted as errors)."""

from __future__ import annotations

import os
import resource
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from test_fleet import drive, settled
from test_gateway_real import gateway_fleet

from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import TaskSpec
from fleet_tui.gateway import control
from fleet_tui.store.db import TaskState

FLOOD_FD_LIMIT = 4096  # the gateway's open files in the flood test
# a block of _blocks is four events a second apart (its start, two pieces, its stop), the
# first one ending 4 s into the stream: the last task started is cut 2.5 s into its stream,
# before any block has ended; the one before it past 5 s, after the first block; the first
# one past 7.5 s and two claude starts, after two blocks (the hard case twice)
KILL_POINTS = 3
KILL_GAP = 2.5  # seconds between one task's first request and the next task's start


def _blocks(count: int) -> list[dict[str, Any]]:
    # several short text blocks: the CLI falls back to a request of its own after a cut
    # only while no block has ended, so a cut after the first block is the hard case
    return [{"type": "text", "text": f"part {i} of a slow answer. "} for i in range(count)]


@pytest.mark.timeout(900)
def test_a_gateway_sigkilled_at_points_along_a_slow_stream_every_task_ends_ok(
        git_repo: Path, claude_bin: str) -> None:
    """Tasks started one after another (each once the previous one's request has reached
    the endpoint), then the gateway SIGKILLed once: each task's stream is cut at another
    point (from its first events to late in it, after blocks have ended). Every task ends
    ok: a stream cut by the gateway's death is a transient verdict, the session resumed."""
    slow = {"real_turns": True, "delay": 1.0, "turns": [_blocks(40)]}
    with ScriptedEndpoint({"default": slow}) as ep:
        fleet = gateway_fleet(ep, claude_bin, max_workers=KILL_POINTS)
        try:
            tasks = []
            for i in range(KILL_POINTS):
                (task,) = fleet.submit(TaskSpec(prompt=f"answer {i}", repo=git_repo))
                tasks.append(task)
                drive(fleet, lambda n=i + 1: len(ep.message_requests()) >= n, timeout=90)
                arrived = time.monotonic()
                drive(fleet, lambda a=arrived: time.monotonic() - a >= KILL_GAP, timeout=10)
            first = control.read_info(fleet.env)
            assert first is not None
            killed_at = time.time()
            os.kill(first.pid, signal.SIGKILL)
            # the cuts are made: the resumed sessions' answers need not be slow (at a
            # second an event, each took another ~160 s, the test's longest part)
            ep.scripts["default"].delay = 0.0
            drive(fleet, settled(fleet, *[t.id for t in tasks]), timeout=300)
            done = [fleet.get_task(t.id) for t in tasks]
            assert all(t.state == TaskState.SUCCEEDED for t in done), \
                [(t.state, t.message) for t in done]
            # each task's first request was cut at another point of its stream (seconds
            # into it), none of them after it ended
            points = sorted(killed_at - r.time for r in ep.message_requests()
                            if r.time < killed_at)
            assert len(points) == KILL_POINTS, points
            assert points[-1] < 40 * 3 * 1.0, points
            assert points[-1] - points[0] >= (KILL_POINTS - 1) * KILL_GAP, points
        finally:
            control.stop(fleet.env)


def _gateway_logs() -> int:
    """Bytes of the gateway's log files (the log and the one rotated before it)."""
    where = control.folder()
    return sum(p.stat().st_size for p in where.glob("gateway.log*") if p.is_file())


@pytest.mark.timeout(900)
def test_a_flood_of_slow_connections_leaves_the_workers_served(
        git_repo: Path, claude_bin: str) -> None:
    """Slow connections from local processes, a tenth more than the gateway's open-files
    limit would hold (partial heads, a byte a second, no token; each one closed connects
    again), while two real workers run: both end ok, the gateway keeps its descriptors (it
    closes the slow ones and the oldest beyond its cap) and its log stays small."""
    from bench.flood import flood_processes, gather

    steps = {"real_turns": True, "turns": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "sleep 4", "description": "wait"}}],
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "sleep 4", "description": "wait"}}],
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "sleep 4", "description": "wait"}}],
        "done"]}
    with ScriptedEndpoint({"default": steps, "quick": ["done"]}) as ep:
        fleet = gateway_fleet(ep, claude_bin, max_workers=2, max_attempts=1)
        floods: list[Any] = []
        try:
            # a first task starts the gateway; the two workers start during the flood
            (first,) = fleet.submit(TaskSpec(prompt="[script:quick] go", repo=git_repo))
            drive(fleet, settled(fleet, first.id), timeout=120)
            info = control.read_info(fleet.env)
            assert info is not None
            # the gateway held to a common machine's limit of open files (it raised its
            # own to the hard one, 20,000 here): a flood beyond that limit, and the churn
            # of its closed connections coming back, is then a fifth as large
            _soft, hard = resource.prlimit(info.pid, resource.RLIMIT_NOFILE)
            limit = min(FLOOD_FD_LIMIT, hard)
            resource.prlimit(info.pid, resource.RLIMIT_NOFILE, (limit, limit))
            # more than that limit would hold, bounded in time; ended (SIGTERM) once
            # the workers are done
            floods = flood_processes(info.port, limit + limit // 10, seconds=400.0,
                                     per_process=2500)
            flood_ends = time.monotonic() + 400.0

            def at_height() -> bool:
                # the gateway has met as many of the flood's connections as its limit
                # (or holds as many descriptors as it allows, with no guard to count them)
                guard = (control.read_status(fleet.env) or {}).get("connections", {})
                return guard.get("accepted", 0) >= limit \
                    or len(os.listdir(f"/proc/{info.pid}/fd")) >= limit - limit // 40

            deadline = time.monotonic() + 240
            while not at_height():  # before the workers connect
                assert time.monotonic() < deadline, "the flood never reached its height"
                time.sleep(0.2)
            tasks = fleet.submit(TaskSpec(prompt="steps", repo=git_repo), copies=2)
            # served during the flood, not once it is over
            drive(fleet, settled(fleet, *[t.id for t in tasks]),
                  timeout=min(240.0, flood_ends - time.monotonic() - 2.0))
            assert all(p.poll() is None for p in floods), "the flood ended first"
            done = [fleet.get_task(t.id) for t in tasks]
            figures = gather(floods, timeout=60, stop=True)
            status = control.read_status(fleet.env) or {}
            again = control.read_info(fleet.env)
        finally:
            for proc in floods:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            logs = _gateway_logs()
            control.stop(fleet.env)
    assert all(t.state == TaskState.SUCCEEDED for t in done), \
        [(t.state, t.message) for t in done]
    assert len(fleet.attempts(done[0].id)) == len(fleet.attempts(done[1].id)) == 1
    assert again is not None and again.pid == info.pid  # the same gateway throughout
    assert logs < 3_000_000, logs
    assert figures["opened"] >= limit, figures
    guard = status.get("connections", {})
    assert guard.get("closed_slow", 0) + guard.get("closed_over_cap", 0) > 0, guard


@pytest.mark.timeout(600)
@pytest.mark.long
def test_a_closed_window_met_by_three_workers_in_flight_gets_one_request_each(
        git_repo: Path, claude_bin: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three workers in a tool step when the endpoint's 5-hour window closes (z.ai's 1308,
    which says nothing against retrying), the CLI's default retries on: the gateway shuts
    the gate on the first 1308 and answers the rest itself; at most one request per worker
    reaches the closed window (without the gate, each worker's retries would bring several
    more). The tasks resume once it reopens."""
    from fleet_tui.core import policy

    monkeypatch.setattr(policy, "START_BOUND", 0.0)
    steps = {"real_turns": True, "turns": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "sleep 3", "description": "wait"}}],
        "done"]}
    # closed once each worker's first answer (its tool step) is behind it
    window = {"kind": "window", "after_ok": 3, "seconds": 20}
    with ScriptedEndpoint({"default": steps}, faults=[window]) as ep:
        fleet = gateway_fleet(ep, claude_bin, max_workers=3, park_jitter=0.0)
        try:
            tasks = fleet.submit(TaskSpec(prompt="steps", repo=git_repo), copies=3)
            drive(fleet, settled(fleet, *[t.id for t in tasks]), timeout=240)
            done = [fleet.get_task(t.id) for t in tasks]
            status = control.read_status(fleet.env) or {}
        finally:
            control.stop(fleet.env)
    into_window = [r for r in ep.message_requests() if (r.fault or "").startswith("window")]
    assert 1 <= len(into_window) <= 3, [(r.status, r.fault) for r in ep.message_requests()]
    assert all(t.state == TaskState.SUCCEEDED for t in done), \
        [(t.state, t.message) for t in done]
    ep_status = status.get("endpoints", {}).get("default", {})
    assert ep_status.get("rejected_codes", {}).get("1308") == len(into_window), ep_status
    assert ep_status.get("gated", 0) >= 1, ep_status


def _slot_rig(ep: ScriptedEndpoint) -> tuple[Any, Any, str]:
    import sys

    from fleet_tui.gateway.routes import Route
    from fleet_tui.store.db import Store
    from fleet_tui.store.meter import Meter
    from fleet_tui.system import paths

    store = Store(paths.db_path())
    meter = Meter(store)
    info = control.ensure([Route("default", ep.url, 2, "default")], {"default": "sk-slot"},
                          db=store.path, python=sys.executable, env=os.environ)
    return info, meter, meter.mint("t1", 1, "default")


def test_a_stream_cut_downstream_keeps_its_slot_until_its_upstream_answer_ends() -> None:
    """Two slots, an endpoint that refuses a third answer in flight (z.ai's 1302): a stream
    whose client goes away after its first event holds its slot until the endpoint has
    sent it to the end, so the request that wanted the slot waits instead of meeting a
    1302; the cut answer is metered whole; the provider's refusals are counted in the
    status (a 1302 let through on purpose)."""
    import json
    import socket
    import threading

    from endpoint_helpers import request_body
    from test_gateway import raw_post

    slow = {"delay": 0.25, "turns": [[{"type": "text", "text": "y" * 240}]]}
    with ScriptedEndpoint({"default": slow},
                          faults=[{"kind": "concurrency", "limit": 2, "times": None}]) as ep:
        info, meter, token = _slot_rig(ep)
        try:
            body = json.dumps(request_body()).encode()
            path = "/e/default/v1/messages?beta=true"
            answers: list[Any] = []
            whole = threading.Thread(target=lambda: answers.append(
                raw_post(info.url, path, body, {"x-api-key": token})))
            whole.start()  # a stream read to its end meanwhile
            cut = socket.create_connection(("127.0.0.1", info.port), timeout=30)
            cut.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        b"content-type: application/json\r\nx-api-key: " + token.encode()
                        + b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n"
                        + body)
            seen = b""
            while b"message_start" not in seen:
                chunk = cut.recv(4096)
                assert chunk, seen
                seen += chunk
            ep.wait_for(2)
            cut.close()  # the worker gone: its answer still streams upstream
            after = raw_post(info.url, path, body, {"x-api-key": token})
            whole.join(60)
            assert after.status == 200, after.body
            assert answers and answers[0].status == 200
            assert [r.status for r in ep.message_requests()] == [200, 200, 200]
            # the cut answer metered as the endpoint served it: whole
            deadline = time.monotonic() + 10
            while len(meter.rows()) < 3:
                assert time.monotonic() < deadline, meter.rows()
                time.sleep(0.05)
            served = sorted((s["input_tokens"], s["output_tokens"]) for s in ep.served())
            metered = sorted((r.input_tokens, r.output_tokens) for r in meter.rows())
            assert metered == served
            # a refusal of the provider's is counted where the status shows it
            ep.set_faults([{"kind": "zai", "code": "1302", "times": 1}])
            refused = raw_post(info.url, path, body, {"x-api-key": token})
            assert refused.status == 429
            deadline = time.monotonic() + 10
            while True:
                status = (control.read_status() or {}).get("endpoints", {}).get("default", {})
                if status.get("rejected") == 1:
                    break
                assert time.monotonic() < deadline, status
                time.sleep(0.05)
            assert status["rejected_codes"] == {"1302": 1}
            (error_row,) = [r for r in meter.rows() if r.status == 429]
            assert error_row.error == "1302" and error_row.cost is not None
            assert error_row.model  # the request's model, not "(none)"
        finally:
            control.stop()


@pytest.mark.timeout(600)
@pytest.mark.long
def test_the_meter_of_a_run_with_kills_and_window_refusals_is_what_was_served(
        git_repo: Path, claude_bin: str) -> None:
    """Two workers on slow streams, the gateway SIGKILLed in the middle of them, then the
    endpoint's window closed for a while (1308s): the meter's cost equals what the
    endpoint served (the usage its answers stated, as far as they were sent) within 0.5 %;
    the cut answers are in it, and the refusals are errors of their code, not unpriced
    requests of no model."""
    from fleet_tui.settings.config import load_settings
    from fleet_tui.store import budgets
    from fleet_tui.store.meter import Meter, Totals

    slow = {"real_turns": True, "delay": 0.5, "turns": [_blocks(8), "done"]}
    # closed after the two cut answers and the first resumed one: the other resumed
    # worker's request meets it
    window = {"kind": "window", "after_ok": 3, "seconds": 15}
    with ScriptedEndpoint({"default": slow}, faults=[window]) as ep:
        fleet = gateway_fleet(ep, claude_bin, max_workers=2, park_jitter=0.0)
        try:
            tasks = fleet.submit(TaskSpec(prompt="answer", repo=git_repo), copies=2)
            drive(fleet, lambda: len(ep.message_requests()) >= 2, timeout=120)
            arrived = time.monotonic()
            drive(fleet, lambda: time.monotonic() - arrived >= 4.0, timeout=10)
            first = control.read_info(fleet.env)
            assert first is not None
            os.kill(first.pid, signal.SIGKILL)
            ep.scripts["default"].delay = 0.0  # the cuts are made: the rest need not be slow
            drive(fleet, settled(fleet, *[t.id for t in tasks]), timeout=300)
            done = [fleet.get_task(t.id) for t in tasks]
            meter = Meter(fleet.store)
            served = ep.served()
            deadline = time.monotonic() + 10  # the last answers' rows
            while sum(1 for r in meter.rows() if r.error is None) < len(served):
                assert time.monotonic() < deadline, (len(meter.rows()), len(served))
                time.sleep(0.1)
            rows = meter.rows()
        finally:
            control.stop(fleet.env)
    assert all(t.state == TaskState.SUCCEEDED for t in done), \
        [(t.state, t.message) for t in done]
    refusals = [r for r in ep.message_requests() if r.status == 429]
    assert refusals, "the window never closed for a request"
    settings = load_settings()

    def cost(model: str, i: int, o: int) -> float:
        found = budgets.request_cost(settings, "default", model, input_tokens=i,
                                     output_tokens=o)
        assert found is not None, model
        return found

    provider = sum(cost(s["model"], s["input_tokens"], s["output_tokens"]) for s in served)
    metered = sum(r.cost or 0.0 for r in rows)
    assert abs(metered - provider) <= 0.005 * provider, (metered, provider)
    totals = Totals()
    for row in rows:
        totals.add(row)
    assert totals.unpriced == 0
    assert totals.errors == len(refusals)
    assert {r.error for r in rows if r.error is not None} == {"1308"}
    assert all(r.model for r in rows)


def test_the_log_is_rate_limited_and_rotated_whatever_floods_it(tmp_path: Path) -> None:
    """20,000 lines logged as fast as the gateway could: the log keeps a burst of them,
    says how many it dropped, and never weighs more than twice its cap (the file and the
    one rotated before it)."""
    import logging

    from fleet_tui.gateway.guard import CappedLog

    path = tmp_path / "gateway.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        handler = CappedLog(path, rate=1000.0, burst=500, max_bytes=20_000, fd=fd)
        logger = logging.getLogger("fleet_tui.gateway.test-flood")
        logger.propagate = False
        logger.addHandler(handler)
        try:
            for i in range(20_000):
                logger.warning("endpoint default: something went wrong %d", i)
            time.sleep(0.05)
            logger.warning("after the flood")
        finally:
            logger.removeHandler(handler)
    finally:
        os.close(fd)
    old = path.with_name("gateway.log.1")
    assert old.exists()  # rotated
    assert path.stat().st_size + old.stat().st_size <= 2 * 20_000
    text = path.read_text()
    assert "after the flood" in text and "log lines dropped" in text
