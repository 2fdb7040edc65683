"""A task whose store row is damaged (row_error: a hand edit, a broken file) offers only
discard (review finding): retry, resume, follow-up and merge are refused with the reason
before anything touches its worktree or branch, and discard, the way out, works.

A real git repository, a real worktree and a real SQLite store tampered with through
SQLite itself; no worker runs (none may)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from fleet_tui.engine.fleet import Fleet, FleetError
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store, TaskState
from fleet_tui.vcs import git as fgit


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.mark.parametrize("column", ["turns", "extra_args", "state"])
def test_a_damaged_row_is_refused_before_its_worktree_is_touched(git_repo: Path,
                                                                   column: str) -> None:
    db = git_repo.parent / "fleet.db"
    fleet = Fleet(load_settings(env=os.environ, overrides={"key_sources": "env"}), Store(db),
                  env=dict(os.environ))
    info = fgit.create_worktree(git_repo, "d1")
    (info.path / "work.txt").write_text("the worker's work\n")
    git(info.path, "add", "work.txt")
    git(info.path, "commit", "-q", "-m", "worker's commit")
    (info.path / "draft.txt").write_text("not committed yet\n")
    tip = git(info.path, "rev-parse", "HEAD")
    now = time.time()
    fleet.store.create_task(prompt="work", repo=git_repo, task_id="d1", title="work",
                            state=TaskState.SUCCEEDED, worktree=info.path,
                            branch=info.branch, base_commit=info.base_commit,
                            base_branch="main", session_id="s-1", started_at=now,
                            finished_at=now, now=now)
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(f"UPDATE tasks SET {column} = '{{junk' WHERE id = 'd1'")
    conn.close()
    task = fleet.get_task("d1")
    assert task.row_error is not None
    read_as = task.state  # a damaged state reads as failed
    actions = [lambda: fleet.retry("d1"), lambda: fleet.retry("d1", resume=True),
               lambda: fleet.follow_up("d1", "go on"), lambda: fleet.merge("d1"),
               lambda: fleet.update("d1")]
    for action in actions:
        with pytest.raises(FleetError) as refused:
            action()
        assert "its store row is damaged" in str(refused.value)
        assert "fleet-tui discard d1" in str(refused.value)
        # nothing was touched: the branch, the commit, the uncommitted work, the row
        assert git(git_repo, "rev-parse", "fleet/d1") == tip
        assert (info.path / "draft.txt").read_text() == "not committed yet\n"
        assert (info.path / "work.txt").read_text() == "the worker's work\n"
        assert fleet.get_task("d1").state == read_as
        assert fleet.attempts("d1") == []
    fleet.discard("d1")  # the way out it names
    assert fleet.get_task("d1").state == TaskState.DISCARDED
    assert not info.path.exists() and not fgit.branch_exists(git_repo, "fleet/d1")


@pytest.mark.parametrize("value", ["''", "'42'", "'relative/repo'"])
def test_discard_of_a_row_whose_repository_is_unreadable_touches_no_git(
        git_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """A damaged repo column read as the current folder: discarding the task from inside
    another repository deleted that repository's fleet/<id> branch and said "discarded"
    (review finding). Now the row is closed and no repository is touched; the message
    says what to remove by hand."""
    db = git_repo.parent / "fleet.db"
    fleet = Fleet(load_settings(env=os.environ, overrides={"key_sources": "env"}), Store(db),
                  env=dict(os.environ))
    info = fgit.create_worktree(git_repo, "d2")
    now = time.time()
    fleet.store.create_task(prompt="work", repo=git_repo, task_id="d2", title="work",
                            state=TaskState.SUCCEEDED, worktree=info.path,
                            branch=info.branch, base_commit=info.base_commit,
                            base_branch="main", started_at=now, finished_at=now, now=now)
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(f"UPDATE tasks SET repo = {value} WHERE id = 'd2'")
    conn.close()
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q", "-b", "main")
    git(other, "commit", "-q", "--allow-empty", "-m", "other's own")
    git(other, "branch", "fleet/d2")  # a branch of the same name, not the task's
    monkeypatch.chdir(other)
    task = fleet.get_task("d2")
    assert task.row_error is not None and "repo" in task.row_damaged
    said = fleet.discard("d2")
    assert fleet.get_task("d2").state == TaskState.DISCARDED
    assert "no worktree or branch was removed" in said and "fleet/d2" in said
    assert fgit.branch_exists(other, "fleet/d2")  # the other repository is untouched
    assert info.path.exists() and fgit.branch_exists(git_repo, "fleet/d2")
