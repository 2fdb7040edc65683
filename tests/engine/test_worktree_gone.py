"""A task's worktree folder deleted by hand (review finding): a resumed attempt or a
follow-up re-attaches the task's branch as it is (a new worktree on `fleet/<id>` at its
tip), never resets it; with the branch gone too, it is refused, naming the cause and the
way out (a fresh retry, which still starts from the base). A merge of such a task is a
refusal (exit 4), saying why.

Real git repositories, real runner processes and the real claude binary against the
scripted endpoint; the merge, in which no worker takes part, is of a task as a finished
worker leaves it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from landing_support import finished_task
from test_fleet import drive, make_fleet, run_one, settled

from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, FleetRefused
from fleet_tui.store.db import Store, TaskState
from fleet_tui.system import paths

SCRIPTS = {"chat": ["first answer", "second answer", "third answer"]}


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(SCRIPTS) as ep:
        yield ep


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def _worker_commit(worktree: Path, text: str = "the worker's work\n") -> str:
    """The worker's commit on its branch (made here, as a worker's Bash step would), then
    the worktree folder deleted by hand. Returns the commit."""
    (worktree / "work.txt").write_text(text)
    git(worktree, "add", "work.txt")
    git(worktree, "commit", "-q", "-m", "worker's commit")
    tip = git(worktree, "rev-parse", "HEAD")
    shutil.rmtree(worktree)
    return tip


def _worktree(fleet: Fleet, task_id: str) -> Path:
    worktree = fleet.get_task(task_id).worktree
    assert worktree is not None
    return Path(worktree)


@pytest.mark.real_claude
def test_resume_and_follow_up_reattach_the_branch_of_a_deleted_worktree(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    """A follow-up, then a resume, each after the worktree was deleted with a new commit
    on the branch: both start from the branch as it is (one task for both: the second
    deletion leaves it as the first did, a branch whose worktree folder is gone)."""
    fleet = make_fleet(endpoint, claude_bin)
    task = run_one(fleet, git_repo, "[script:chat] talk to me")
    assert task.state == TaskState.SUCCEEDED and task.session_id
    worktree = _worktree(fleet, task.id)
    for n, how in enumerate(("follow_up", "resume"), 1):
        work = f"the worker's work, {n}\n"
        tip = _worker_commit(worktree, work)
        assert not worktree.exists()
        if how == "follow_up":
            fleet.follow_up(task.id, "and then?")
        else:
            fleet.retry(task.id, resume=True)
        drive(fleet, settled(fleet, task.id))
        done = fleet.get_task(task.id)
        assert done.state == TaskState.SUCCEEDED, (how, done.message)
        # the worker's commit is still the branch's tip, and the new worktree stands on it
        assert git(git_repo, "rev-parse", f"fleet/{task.id}") == tip, how
        assert done.worktree is not None and Path(done.worktree) == worktree
        assert (worktree / "work.txt").read_text() == work
        assert git(worktree, "rev-parse", "HEAD") == tip, how
        assert git(worktree, "rev-parse", "--abbrev-ref", "HEAD") == f"fleet/{task.id}"
        assert fleet.attempts(task.id)[-1].session_id == task.session_id
    assert [a.kind for a in fleet.attempts(task.id)][1:] == ["followup", "resume"]


@pytest.mark.real_claude
def test_with_the_branch_gone_too_resume_is_refused_and_a_fresh_retry_resets(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    fleet = make_fleet(endpoint, claude_bin)
    task = run_one(fleet, git_repo, "[script:chat] talk to me")
    worktree = _worktree(fleet, task.id)
    _worker_commit(worktree)
    git(git_repo, "worktree", "prune")
    git(git_repo, "branch", "-D", f"fleet/{task.id}")
    for action in (lambda: fleet.follow_up(task.id, "and then?"),
                   lambda: fleet.retry(task.id, resume=True)):
        with pytest.raises(FleetRefused) as refused:
            action()
        message = str(refused.value)
        assert f"fleet/{task.id}" in message and "deleted" in message
        assert f"fleet-tui retry {task.id}" in message  # the way out: a fresh retry
        assert fleet.get_task(task.id).state == TaskState.SUCCEEDED  # nothing queued
        assert not worktree.exists()
    fleet.retry(task.id)  # fresh: from the base, as before
    drive(fleet, settled(fleet, task.id))
    done = fleet.get_task(task.id)
    assert done.state == TaskState.SUCCEEDED, done.message
    assert git(git_repo, "rev-parse", f"fleet/{task.id}") == git(git_repo, "rev-parse", "main")
    assert not (worktree / "work.txt").exists()


def test_merge_of_a_deleted_worktree_is_a_refusal(git_repo: Path) -> None:
    """No worker takes part in a merge: the task is one as a finished worker leaves it
    (landing_support.finished_task); the real claude's worker loses its worktree in the
    tests above."""
    with Store(paths.db_path()) as store:
        task = finished_task(store, git_repo, "gone01")
    assert task.worktree is not None
    worktree = Path(task.worktree)
    tip = _worker_commit(worktree)
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-m", "fleet_tui.cli", "merge", task.id, "--yes"],
                         cwd=git_repo, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 4, out.stderr
    assert "Traceback" not in out.stderr
    assert str(worktree) in out.stderr and "deleted outside fleet-tui" in out.stderr
    assert git(git_repo, "rev-parse", f"fleet/{task.id}") == tip  # nothing lost
