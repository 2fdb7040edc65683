"""The gateway under blows, with the real claude against the scripted endpoint: SIGKILLed
at points along a slow stream (every task still ends ok, resumed in its session), a flood
of slow connections from a local process (the workers are served throughout), a closed
window met by workers in flight (the gateway shuts the gate on the first answer), a stream
cut downstream (its slot held until the upstream answer ends), and the meter (what was
served, errors counted as errors)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from test_fleet import drive, settled
from test_gateway_real import gateway_fleet

from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import TaskSpec
from fleet_tui.gateway import control
from fleet_tui.store.db import TaskState

KILL_POINTS = 10


def _blocks(count: int) -> list[dict[str, Any]]:
    # several short text blocks: the CLI falls back to a request of its own after a cut
    # only while no block has ended, so a cut after the first block is the hard case
    return [{"type": "text", "text": f"part {i} of a slow answer. "} for i in range(count)]


def test_a_gateway_sigkilled_at_points_along_a_slow_stream_every_task_ends_ok(
        git_repo: Path, claude_bin: str) -> None:
    """Tasks started one after another (each once the previous one's request has reached
    the endpoint), then the gateway SIGKILLed once: each task's stream is cut at another
    point (from its first events to late in it, after blocks have ended). Every task ends
    ok: a stream cut by the gateway's death is a transient verdict, the session resumed."""
    slow = {"real_turns": True, "delay": 1.0, "turns": [_blocks(20)]}
    with ScriptedEndpoint({"default": slow}) as ep:
        fleet = gateway_fleet(ep, claude_bin, max_workers=KILL_POINTS)
        try:
            tasks = []
            for i in range(KILL_POINTS):
                (task,) = fleet.submit(TaskSpec(prompt=f"answer {i}", repo=git_repo))
                tasks.append(task)
                drive(fleet, lambda n=i + 1: len(ep.message_requests()) >= n, timeout=90)
                arrived = time.monotonic()
                drive(fleet, lambda a=arrived: time.monotonic() - a >= 1.0, timeout=10)
            first = control.read_info(fleet.env)
            assert first is not None
            killed_at = time.time()
            os.kill(first.pid, signal.SIGKILL)
            drive(fleet, settled(fleet, *[t.id for t in tasks]), timeout=300)
            done = [fleet.get_task(t.id) for t in tasks]
            assert all(t.state == TaskState.SUCCEEDED for t in done), \
                [(t.state, t.message) for t in done]
            # each task's first request was cut at another point of its stream (seconds
            # into it), none of them after it ended
            points = sorted(killed_at - r.time for r in ep.message_requests()
                            if r.time < killed_at)
            assert len(points) == KILL_POINTS, points
            assert points[-1] < 20 * 3 * 1.0, points
            assert points[-1] - points[0] >= KILL_POINTS - 1, points
        finally:
            control.stop(fleet.env)
