"""`update_strategy = "rebase"` with the real claude against the scripted endpoint:
a rebase that stops on a conflict goes back to the worker, who resolves it and
continues the rebase (`git add`, `git rebase --continue`) in its own session; nothing reads
failed or crashed, and the task then lands. The same through the merge queue.

A task with commits c1 and c2 (c2 changes the return line of src/app.py); main changes the
same line; the rebase stops at c2.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from landing_support import checkout_state, commit_all, drive, git, make_fleet, settled

from fleet_tui.core.states import LandState, TaskState
from fleet_tui.demo.endpoint import ScriptedEndpoint, resolve_rebase_turns
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.vcs import git as fgit

RESOLVED = "def main():\n    return 'main and task, both'\n"
C1_C2 = ("echo c1 > c1.txt && git add c1.txt && git commit -qm c1 && "
         "sed -i \"s/return 1/return 'task'/\" src/app.py && git commit -qam c2")

SCRIPTS: dict[str, Any] = {
    "c1c2": {"turns": [[{"type": "tool_use", "name": "Bash",
                         "input": {"command": C1_C2, "description": "two commits"}}],
                       "Two commits: c1.txt, then main returns 'task'."],
             "followup": resolve_rebase_turns("src/app.py", RESOLVED)},
}


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(SCRIPTS) as ep:
        yield ep


def _task(fleet: Fleet, repo: Path) -> str:
    (task,) = fleet.submit(TaskSpec(prompt="[script:c1c2] two commits", title="c1c2",
                                    repo=repo))
    drive(fleet, settled(fleet, task.id), what="the worker")
    assert fleet.get_task(task.id).state == TaskState.SUCCEEDED
    (repo / "src" / "app.py").write_text("def main():\n    return 'main'\n")
    commit_all(repo, "main changes the same line")
    return task.id


def _resolved_on_top_of_main(fleet: Fleet, repo: Path, task_id: str, session: str) -> None:
    task = fleet.get_task(task_id)
    assert task.state == TaskState.SUCCEEDED, (task.state, task.message)
    assert task.session_id == session
    assert {a.session_id for a in fleet.attempts(task_id)} == {session}
    worktree = Path(task.worktree or "")
    assert fgit.operation_in_progress(worktree) is None
    assert fgit.current_branch(worktree) == f"fleet/{task_id}"
    assert (worktree / "src" / "app.py").read_text() == RESOLVED
    subjects = git(worktree, "log", "--format=%s", "main..HEAD").split("\n")
    assert [s for s in subjects if s] == ["c2", "c1"]  # both commits kept, rebased
    assert git(worktree, "merge-base", "HEAD", "main").strip() == \
        git(repo, "rev-parse", "main").strip()


def test_rebase_update_conflict_goes_to_the_worker_and_lands(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    fleet = make_fleet(endpoint, claude_bin, update_strategy="rebase")
    task_id = _task(fleet, git_repo)
    session = fleet.get_task(task_id).session_id
    assert session
    before = checkout_state(git_repo)
    result = fleet.update(task_id)
    assert result.status == "conflicts" and result.operation == "rebase"
    assert result.conflicts == ["src/app.py"]
    worktree = Path(fleet.get_task(task_id).worktree or "")
    assert fgit.operation_in_progress(worktree) == "rebase"

    fleet.resolve_update(task_id, "worker")
    prompt = fleet.attempts(task_id)[-1].prompt
    assert "git add" in prompt and "rebase --continue" in prompt
    drive(fleet, settled(fleet, task_id), what="the worker's resolution")
    for attempt in fleet.attempts(task_id):
        assert attempt.verdict not in ("crashed", "failed"), (attempt.kind, attempt.message)
    _resolved_on_top_of_main(fleet, git_repo, task_id, session)
    assert fleet.get_task(task_id).conflicts == []
    assert checkout_state(git_repo) == before  # main untouched by all of it

    landed = fleet.merge(task_id)
    assert landed.merged, landed.message
    assert (git_repo / "src" / "app.py").read_text() == RESOLVED
    assert (git_repo / "c1.txt").exists()


def test_rebase_resume_of_a_task_mid_rebase_runs_in_its_worktree(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    """`retry --resume` of a task whose worktree stopped mid-rebase starts (it is on its
    branch, mid-rebase) instead of failing 'not on branch'."""
    fleet = make_fleet(endpoint, claude_bin, update_strategy="rebase")
    task_id = _task(fleet, git_repo)
    assert fleet.update(task_id).status == "conflicts"
    fleet.retry(task_id, resume=True)
    drive(fleet, settled(fleet, task_id), what="the resumed worker")
    task = fleet.get_task(task_id)
    assert task.state == TaskState.SUCCEEDED, (task.state, task.message)
    assert "not on branch" not in (fleet.attempts(task_id)[-1].message or "")


def test_the_merge_queue_under_rebase_sends_the_conflict_back_and_lands_it(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    fleet = make_fleet(endpoint, claude_bin, update_strategy="rebase")
    fleet.queue.QUEUE_CHECK = 0.2
    task_id = _task(fleet, git_repo)
    session = fleet.get_task(task_id).session_id
    assert session
    fleet.enqueue([task_id])
    drive(fleet, lambda: fleet.get_task(task_id).land_state in (LandState.MERGED,
                                                                 LandState.STOPPED),
          timeout=180, what="the queue")
    task = fleet.get_task(task_id)
    assert task.land_state == LandState.MERGED, (task.land_state, task.land_note)
    assert task.state == TaskState.MERGED
    assert task.land_fixes == 1  # sent back once, with the conflict
    for attempt in fleet.attempts(task_id):
        assert attempt.verdict not in ("crashed", "failed"), (attempt.kind, attempt.message)
    assert (git_repo / "src" / "app.py").read_text() == RESOLVED
    assert (git_repo / "c1.txt").exists()
