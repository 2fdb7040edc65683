"""Steering a running worker, with the real claude against the scripted
endpoint, pinned (2.1.197) and newest (2.1.332): a message sent while the worker runs joins
its turn (the endpoint's next request carries it, the stream shows it as the user's turn),
the task finishes ok, the input channel is gone afterwards, another engine (a restarted
panel) can steer too, and a message that arrives at the very moment of a result still gets
its turn."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_fleet import drive, make_fleet, settled

from fleet_tui.core import stream
from fleet_tui.demo.endpoint import RecordedRequest, ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, FleetError, TaskSpec
from fleet_tui.execution.worker.attemptlog import INPUT_LOCK, AttemptLog, InputClosed
from fleet_tui.store.db import TaskState

ROOT = Path(__file__).resolve().parents[2]

SCRIPTS: dict[str, Any] = {
    # a Bash step long enough to send a message while it runs, then an answer
    "steer": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "sleep 6; echo step one done", "description": "step one"}}],
        "first answer",
    ],
    # the last answer comes slowly (see the endpoint's delay): a result at a known moment
    "slow_end": {"turns": ["the answer, slowly"], "delay": 0.3,
                 "followup": ["the next turn, slowly: {prompt}", "and then: {prompt}"]},
}


@pytest.fixture(params=["pinned", "newest"])
def any_claude(request: pytest.FixtureRequest, claude_bin: str) -> str:
    """The pinned claude, or the newest (steering must work with both)."""
    if request.param == "newest":
        newest: str = request.getfixturevalue("claude_newest_bin")
        return newest
    return claude_bin


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(SCRIPTS) as ep:
        yield ep


def _carried(request: RecordedRequest, text: str) -> bool:
    """The request's conversation holds the message (as a user message, or in the system
    note the CLI relays a message sent during a turn in)."""
    return any(text in t for t in request.conversation_texts)


def _running_bash(fleet: Fleet, task_id: str) -> bool:
    """The worker is inside its Bash step (its tool call is in the events)."""
    attempts = fleet.attempts(task_id)
    if not attempts or attempts[-1].dir is None:
        return False
    events, _ = fleet.read_events(attempts[-1])
    return any(isinstance(e, stream.ToolUse) for e in events)


def test_a_message_mid_run_joins_the_turn_and_the_task_finishes_ok(
        git_repo: Path, any_claude: str, endpoint: ScriptedEndpoint) -> None:
    fleet = make_fleet(endpoint, any_claude)
    (task,) = fleet.submit(TaskSpec(prompt="[script:steer] do step one", repo=git_repo))
    drive(fleet, lambda: _running_bash(fleet, task.id), timeout=60)
    attempt = fleet.attempts(task.id)[-1]
    log = AttemptLog(attempt.dir or "")
    assert log.input_open()
    assert fleet.say(task.id, "also check the README, please") is True
    drive(fleet, settled(fleet, task.id))
    done = fleet.get_task(task.id)
    assert done.state == TaskState.SUCCEEDED and done.verdict == "ok", done.message
    # the endpoint's next request carried the message
    later = [r for r in endpoint.message_requests("steer") if r.turn == 1]
    assert later and _carried(later[-1], "also check the README, please")
    # the stream shows it as the user's turn, after the prompt and before the answer
    events, _ = fleet.read_events(fleet.attempts(task.id)[-1])
    said = [e.text for e in events if isinstance(e, stream.UserMessage)]
    assert said == ["[script:steer] do step one", "also check the README, please"]
    kinds = [type(e).__name__ for e in events
             if isinstance(e, stream.UserMessage | stream.ToolResult | stream.Result)]
    assert kinds.index("UserMessage", 1) < kinds.index("Result")
    assert [e for e in events if isinstance(e, stream.Result)][-1].is_error is False
    # the channel is gone: no pipe, nothing waiting, and a sender is told so
    assert not log.input_open() and not log.input_fifo.exists()
    assert not log.input_dir.exists()
    assert [m["text"] for m in log.input_messages()] == ["also check the README, please"]
    with pytest.raises(InputClosed):
        log.send_input("too late")
    with pytest.raises(FleetError, match="follow-up"):
        fleet.say(task.id, "too late")


def test_another_engine_steers_a_worker_it_did_not_start(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    """The channel is in the attempt folder: a panel restarted mid-run (another engine,
    another store connection) steers the worker the first one started."""
    first = make_fleet(endpoint, claude_bin)
    (task,) = first.submit(TaskSpec(prompt="[script:steer] do step one", repo=git_repo))
    drive(first, lambda: _running_bash(first, task.id), timeout=60)
    first.store.close()  # that panel is gone; this one never started the worker
    second = make_fleet(endpoint, claude_bin)
    assert second.say(task.id, "from the restarted panel") is True
    drive(second, settled(second, task.id))
    assert second.get_task(task.id).state == TaskState.SUCCEEDED
    later = [r for r in endpoint.message_requests("steer") if r.turn == 1]
    assert _carried(later[-1], "from the restarted panel")


def test_fleet_tui_say_from_the_command_line(git_repo: Path, claude_bin: str,
                                            endpoint: ScriptedEndpoint) -> None:
    fleet = make_fleet(endpoint, claude_bin)
    (task,) = fleet.submit(TaskSpec(prompt="[script:steer] do step one", repo=git_repo))
    drive(fleet, lambda: _running_bash(fleet, task.id), timeout=60)
    env = dict(os.environ, PYTHONPATH=str(ROOT), FLEET_WORKER_BASE_URL=endpoint.url,
               FLEET_WORKER_CLAUDE=claude_bin, FLEET_WORKER_KEY_SOURCES="env",
               ANTHROPIC_AUTH_TOKEN="sk-cli-test")
    cli = [sys.executable, "-m", "fleet_tui.cli"]
    out = subprocess.run([*cli, "say", task.id, "said on the command line"], env=env,
                         cwd=git_repo, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "taken by the worker" in out.stdout
    drive(fleet, settled(fleet, task.id))
    assert fleet.get_task(task.id).state == TaskState.SUCCEEDED
    later = [r for r in endpoint.message_requests("steer") if r.turn == 1]
    assert _carried(later[-1], "said on the command line")
    # a finished task: one clear line pointing to follow-up, no traceback
    again = subprocess.run([*cli, "say", task.id, "more"], env=env, cwd=git_repo,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 4  # refused (README: exit codes)
    assert again.stderr.startswith("fleet-tui say: cannot send a message to task")
    assert "follow-up" in again.stderr and "Traceback" not in again.stderr
    empty = subprocess.run([*cli, "say", task.id, "  "], env=env, cwd=git_repo,
                           capture_output=True, text=True, timeout=60)
    assert empty.returncode == 2 and "empty" in empty.stderr


def test_a_message_arriving_as_the_turn_ends_gets_its_own_turn(
        git_repo: Path, any_claude: str, endpoint: ScriptedEndpoint) -> None:
    """The race the close rule settles: the result line comes while a sender holds the
    channel (its message not in the inbox yet). The runner waits its turn, finds the
    message, gives it to claude and keeps the channel open: the message starts the next
    turn in the same session, whose result then ends the run."""
    fleet = make_fleet(endpoint, any_claude)
    (task,) = fleet.submit(TaskSpec(prompt="[script:slow_end] answer", repo=git_repo))
    # the answer streams slowly (0.3 s an event): take the channel's lock while it does
    def channel_open() -> bool:
        attempts = fleet.attempts(task.id)
        return bool(attempts) and attempts[-1].dir is not None \
            and AttemptLog(attempts[-1].dir).input_open()

    drive(fleet, channel_open, timeout=60)
    log = AttemptLog(fleet.attempts(task.id)[-1].dir or "")
    fd = os.open(log.dir / INPUT_LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        # hold it until the result line is written: the runner is waiting on the lock
        deadline = time.monotonic() + 30
        while b'"type":"result"' not in log.events.read_bytes():
            assert time.monotonic() < deadline, "no result line"
            time.sleep(0.02)
        time.sleep(0.3)
        # what send_input does under the lock: the message's file, then the wake-up byte
        from fleet_tui.execution.worker.attemptlog import write_json_atomic
        write_json_atomic(log.input_dir / "00000000000000000001-late.json",
                          {"text": "one more thing", "at": time.time(), "by": "test"})
    finally:
        os.close(fd)
    # the channel stayed open for the turn the message started: the worker still takes
    # messages while it answers (a rule that closed the channel once the message was
    # given to claude would refuse this one)
    deadline = time.monotonic() + 30
    while not any(m["text"] == "one more thing" for m in log.input_messages()):
        assert time.monotonic() < deadline, "the late message was not taken"
        time.sleep(0.02)
    assert fleet.say(task.id, "and a last one") is True
    drive(fleet, settled(fleet, task.id))
    done = fleet.get_task(task.id)
    assert done.state == TaskState.SUCCEEDED, done.message
    events, _ = fleet.read_events(fleet.attempts(task.id)[-1])
    results = [e for e in events if isinstance(e, stream.Result)]
    assert len(results) >= 2 and results[1].result == \
        "the next turn, slowly: one more thing"
    assert {e.session_id for e in results} == {done.session_id}
    said = [e.text for e in events if isinstance(e, stream.UserMessage)]
    assert said[1:] == ["one more thing", "and a last one"]
    assert any(_carried(r, "and a last one") for r in endpoint.message_requests("slow_end"))
    assert not log.input_open()
