"""An endpoint that cannot be reached at all: what a remote worker meets
when this machine, whose gateway it goes through, is away. claude says "Unable to connect to
API"; the attempt's verdict is `unreachable`, counted as an attempt, and the task waits the
backoff, then resumes its session when it made progress.

The real claude against the scripted endpoint on 127.0.0.1, stopped while the worker's Bash
step runs and started again on the same port.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ports import hold_port
from test_fleet import SCRIPTS, drive, make_fleet, settled

from fleet_tui.core.states import Verdict
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.store.db import TaskState

PAUSE: dict[str, Any] = dict(SCRIPTS)
PAUSE["pause"] = [
    [{"type": "tool_use", "name": "Bash",
      "input": {"command": "sleep 3; echo resumed > after.txt", "description": "wait"}}],
    "finished after the pause",
]


def _events(fleet: Fleet, task_id: str) -> bytes:
    attempts = fleet.attempts(task_id)
    if not attempts or not attempts[-1].dir:
        return b""
    path = Path(attempts[-1].dir) / "events.jsonl"
    return path.read_bytes() if path.exists() else b""


def assert_unreachable_words(message: str, attempt: Any) -> None:
    """Uncaged, claude's connection is refused ("Unable to connect to API"). Caged, claude
    reaches the endpoint over the socket bridged into the cage, whose relay inside accepts
    and then drops the connection it cannot carry on: claude says the connection was reset,
    judged unreachable all the same (never the overload a proxy's 502 would make it)."""
    caged = attempt.dir is not None and (Path(attempt.dir) / "cage.json").is_file()
    if caged:
        assert ("the connection to the endpoint (or the gateway) closed" in message
                and "ECONNRESET" in message) or "the endpoint could not be reached" in message, \
            message
    else:
        assert "the endpoint could not be reached" in message, message


def test_an_endpoint_gone_mid_run_is_waited_for_and_the_session_resumed(
        git_repo: Path, claude_bin: str) -> None:
    endpoint = ScriptedEndpoint(PAUSE).start()
    try:
        # backoff of 2-3 s: time to see the task wait before the endpoint is back
        fleet = make_fleet(endpoint, claude_bin, max_attempts=3, backoff_base=2.0,
                           backoff_cap=3.0)
        (task,) = fleet.submit(TaskSpec(prompt="[script:pause] wait a moment", repo=git_repo))
        drive(fleet, lambda: b'"tool_use"' in _events(fleet, task.id), 90)
        endpoint.stop()  # the Bash step runs; the next request finds nobody
        with hold_port(endpoint.port):  # nobody, not another test's server on the port
            drive(fleet, lambda: fleet.get_task(task.id).state == TaskState.WAITING, 90)
            waiting = fleet.get_task(task.id)
            first = fleet.attempts(task.id)[0]
            assert first.verdict == Verdict.UNREACHABLE
            assert_unreachable_words(waiting.message, first)
            assert "retry 2/3 in" in waiting.message
            assert "(resumes its session)" in waiting.message
        endpoint.start()  # back, on the same port
        drive(fleet, settled(fleet, task.id), 120)
        done = fleet.get_task(task.id)
        assert done.state == TaskState.SUCCEEDED, done.message
        second = fleet.attempts(task.id)[-1]
        assert second.kind == "resume" and second.session_id == first.session_id
        assert (Path(str(done.worktree)) / "after.txt").read_text() == "resumed\n"
    finally:
        endpoint.stop()


@pytest.mark.parametrize("version", ["pinned", "newest"])
def test_an_endpoint_never_there_gives_up_after_the_attempts(
        git_repo: Path, version: str, request: pytest.FixtureRequest) -> None:
    """Nothing listens: each attempt is unreachable and counted; after max_attempts the task
    fails saying so (no session to resume: each one starts fresh). The pinned CLI says
    "Unable to connect to API (ConnectionRefused)", the newest "Connection refused — a
    firewall or proxy may be blocking it (ECONNREFUSED)"."""
    claude = request.getfixturevalue("claude_bin" if version == "pinned"
                                     else "claude_newest_bin")
    endpoint = ScriptedEndpoint(PAUSE).start()
    fleet = make_fleet(endpoint, claude, max_attempts=2)
    endpoint.stop()
    with hold_port(endpoint.port):  # its port, with nothing on it for the whole run
        (task,) = fleet.submit(TaskSpec(prompt="hello", repo=git_repo))
        drive(fleet, settled(fleet, task.id), 120)
    done = fleet.get_task(task.id)
    assert done.state == TaskState.FAILED
    assert_unreachable_words(done.message, fleet.attempts(task.id)[-1])
    assert "gave up after 2 attempts" in done.message
    assert [a.verdict for a in fleet.attempts(task.id)] == [Verdict.UNREACHABLE] * 2
    assert [a.kind for a in fleet.attempts(task.id)] == ["fresh", "fresh"]
