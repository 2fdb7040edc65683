"""A resume of a session claude never saved starts afresh with the task's prompt.

claude writes a session's transcript (CLAUDE_CONFIG_DIR/projects/<its cwd>/<id>.jsonl) as
it takes in the prompt, some 100 ms after its init line; a worker killed before that
leaves a session id (from that line) that `claude --resume` does not know ("No
conversation found with session ID", an error result, no turn). `retry --resume`, a
follow-up and the engine's own resume would fail at once: they start the task afresh
instead, and say so.

Real claude (both pinned versions) against the scripted endpoint. The worker is killed as
soon as the engine has its session id: killed then, claude has saved nothing (seen 4 of 4
on a quiet machine); should it have saved its transcript under load, the transcript is
removed, which leaves the same state."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from endpoint_helpers import run_cli
from test_fleet import drive, make_fleet, settled

from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import TaskSpec
from fleet_tui.store.db import TaskState
from fleet_tui.system import paths

PROMPT = "write the release notes"


def _saved(task_id: str) -> list[Path]:
    return list(paths.task_config_dir(task_id).glob("projects/*/*.jsonl"))


@pytest.mark.parametrize("version", ["pinned", "newest"])
def test_a_resume_of_a_session_never_saved_starts_afresh_with_the_prompt(
        git_repo: Path, request: pytest.FixtureRequest, version: str) -> None:
    claude = request.getfixturevalue("claude_bin" if version == "pinned"
                                     else "claude_newest_bin")
    with ScriptedEndpoint({"default": ["notes written"]}) as ep:
        fleet = make_fleet(ep, claude, kill_grace=1.0)
        (task,) = fleet.submit(TaskSpec(prompt=PROMPT, repo=git_repo))
        # claude's init line names the session: the worker is killed at once
        drive(fleet, lambda: fleet.get_task(task.id).session_id is not None, timeout=120)
        lost = fleet.get_task(task.id).session_id
        fleet.kill(task.id)
        drive(fleet, settled(fleet, task.id), timeout=120)
        assert fleet.get_task(task.id).state == TaskState.KILLED
        for transcript in _saved(task.id):  # saved after all (a slow kill): as if not
            transcript.unlink()
        assert _saved(task.id) == []

        fleet.retry(task.id, resume=True)
        drive(fleet, settled(fleet, task.id), timeout=120)
        done = fleet.get_task(task.id)
        assert done.state == TaskState.SUCCEEDED, done.message
        # the second start asked the endpoint with the task's own prompt
        assert ep.message_requests()[-1].prompt == PROMPT
        attempts = fleet.attempts(task.id)
        assert [a.kind for a in attempts] == ["fresh", "fresh"]
        assert attempts[1].session_id not in (None, lost)
        note = attempts[1].message or ""
        assert f"session {lost} could not be resumed" in note, note
        assert "started afresh" in note, note
    shown = run_cli(dict(os.environ), git_repo, "show", task.id)
    assert shown.returncode == 0, shown.stderr
    assert f"afresh:  the session {lost} could not be resumed" in shown.stdout, shown.stdout
    assert "#2 fresh" in shown.stdout, shown.stdout
