"""Landing at the git level, in real repositories: where a task stands against
its base branch, bringing it up to date (merge and rebase; clean, conflicted, resolved,
aborted, refused), fast-forward merges, merging exactly the tested commit, pushing.

Every refused or aborted step checks the main checkout (and, for an abort, the worktree)
byte for byte before and after: files, the index file, HEAD, refs, merge state, status.
The worker's part is played by git commands here; tests/engine/test_landing_real.py runs claude.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from landing_support import checkout_state, commit_all, git

from fleet_tui.system import paths
from fleet_tui.vcs import git as fgit

TRAILERS = {"Fleet-Task": "t1"}


def _task(repo: Path, task_id: str = "t1") -> fgit.WorktreeInfo:
    return fgit.create_worktree(repo, task_id, "main")


def _main_moves(repo: Path, name: str, text: str) -> str:
    (repo / name).write_text(text)
    return commit_all(repo, f"main: {name}")


def _record(repo: Path, task_id: str = "t1") -> Path:
    return paths.update_dir(repo, task_id)


def _update(repo: Path, info: fgit.WorktreeInfo, strategy: str = "merge"
            ) -> fgit.UpdateResult:
    return fgit.update_from_base(repo, info.path, info.branch, "main", record=_record(repo),
                                 strategy=strategy, message="the worker's work",
                                 trailers=TRAILERS)


# --- 1. where a task really stands --------------------------------------------------------


def test_diff_after_merging_the_base_by_hand_shows_only_the_tasks_changes(
        git_repo: Path) -> None:
    """The finding: after the user merged main into the task in a shell, the diff still
    compared against the old base and listed main's own new files as the task's."""
    info = _task(git_repo)
    (info.path / "task.txt").write_text("the task's file\n")
    commit_all(info.path, "task")
    _main_moves(git_repo, "main_only.txt", "landed on main meanwhile\n")
    git(info.path, "merge", "-q", "--no-edit", "main")
    base = fgit.fork_point(info.path, info.base_commit, "main")
    assert base == git(git_repo, "rev-parse", "main").strip()
    files = [f.path for f in fgit.diff(info.path, base).files]
    assert files == ["task.txt"]
    assert fgit.diff_stat(info.path, base) == (1, 0)
    # without a base branch (a task started from a commit): its base commit, as before
    assert fgit.fork_point(info.path, info.base_commit, None) == info.base_commit


# --- 2. update from base ------------------------------------------------------------------


def test_clean_update_commits_the_work_first_and_merges_the_base(git_repo: Path) -> None:
    info = _task(git_repo)
    (info.path / "task.txt").write_text("uncommitted work\n")
    tip = _main_moves(git_repo, "main_only.txt", "main\n")
    main_before = checkout_state(git_repo)
    result = _update(git_repo, info)
    assert result.status == "updated", result.message
    assert result.base_tip == tip and result.committed is not None
    assert checkout_state(git_repo) == main_before  # the main checkout is never touched
    assert git(info.path, "status", "--porcelain") == ""
    assert git(info.path, "log", "-1", "--format=%s").strip() == f"Merge main ({tip[:10]}) " \
        "into fleet/t1"
    assert "Fleet-Task: t1" in git(info.path, "log", "-1", "--format=%B",
                                   result.committed)
    assert (info.path / "main_only.txt").read_text() == "main\n"
    assert not _record(git_repo).exists()
    again = _update(git_repo, info)
    assert again.status == "current" and again.committed is None


def test_conflicted_update_then_abort_puts_the_worktree_back_exactly(git_repo: Path) -> None:
    info = _task(git_repo)
    (info.path / "src" / "app.py").write_text("def main():\n    return 'task'\n")
    (info.path / "notes.txt").write_text("untracked note\n")
    git(info.path, "add", "notes.txt")  # staged, the rest unstaged: the index matters
    (info.path / "scratch.txt").write_text("untracked\n")
    _main_moves(git_repo, "src/app.py", "def main():\n    return 'main'\n")
    worktree_before = checkout_state(info.path)
    main_before = checkout_state(git_repo)
    result = _update(git_repo, info)
    assert result.status == "conflicts" and result.conflicts == ["src/app.py"]
    assert result.operation == "merge" and fgit.operation_in_progress(info.path) == "merge"
    assert "<<<<<<<" in (info.path / "src" / "app.py").read_text()
    assert checkout_state(git_repo) == main_before
    # asked again while mid-merge: the same conflicts, nothing new started
    assert _update(git_repo, info).status == "conflicts"
    done = fgit.abort_update(info.path, _record(git_repo))
    assert "put back as it was" in done
    assert checkout_state(info.path) == worktree_before
    assert checkout_state(git_repo) == main_before
    assert not _record(git_repo).exists()
    with pytest.raises(fgit.GitError, match="not in the middle of an update"):
        fgit.abort_update(info.path, _record(git_repo))


def test_conflict_resolved_by_hand_is_concluded(git_repo: Path) -> None:
    """Resolve in a shell (the `o` way): the files edited, neither staged nor committed;
    the next look concludes the merge."""
    info = _task(git_repo)
    (info.path / "src" / "app.py").write_text("def main():\n    return 'task'\n")
    commit_all(info.path, "task")
    _main_moves(git_repo, "src/app.py", "def main():\n    return 'main'\n")
    assert _update(git_repo, info).status == "conflicts"
    still = fgit.conclude_update(info.path, _record(git_repo), base_branch="main",
                                 branch=info.branch, conflicted=["src/app.py"])
    assert still.status == "conflicts" and still.conflicts == ["src/app.py"]
    (info.path / "src" / "app.py").write_text("def main():\n    return 'both'\n")
    done = fgit.conclude_update(info.path, _record(git_repo), base_branch="main",
                                branch=info.branch, conflicted=["src/app.py"])
    assert done.status == "updated", done.message
    assert fgit.operation_in_progress(info.path) is None
    assert git(info.path, "status", "--porcelain") == ""
    parents = git(info.path, "log", "-1", "--format=%P").split()
    assert len(parents) == 2  # a real merge commit
    base = fgit.fork_point(info.path, info.base_commit, "main")
    assert [f.path for f in fgit.diff(info.path, base).files] == ["src/app.py"]


def test_a_merge_committed_with_its_conflict_markers_in_is_not_resolved(
        git_repo: Path) -> None:
    """The worker staged the conflicted file as it was and committed the merge (a
    resolution script that failed, a careless `git add -A`): the markers would land on
    main. The look afterwards keeps the conflicts, and abort still puts it back."""
    info = _task(git_repo)
    (info.path / "src" / "app.py").write_text("def main():\n    return 'task'\n")
    commit_all(info.path, "task")
    _main_moves(git_repo, "src/app.py", "def main():\n    return 'main'\n")
    worktree_before = checkout_state(info.path)
    assert _update(git_repo, info).status == "conflicts"
    git(info.path, "add", "-A")
    git(info.path, "commit", "--no-edit", "-q")
    assert fgit.operation_in_progress(info.path) is None
    still = fgit.conclude_update(info.path, _record(git_repo), base_branch="main",
                                 branch=info.branch, conflicted=["src/app.py"])
    assert still.status == "conflicts" and still.conflicts == ["src/app.py"], still.message
    assert "conflict markers still in 1 file: src/app.py" in still.message
    done = fgit.abort_update(info.path, _record(git_repo))
    assert "put back as it was" in done
    assert checkout_state(info.path) == worktree_before


def test_an_update_abandoned_in_the_worktree_is_not_called_done(git_repo: Path) -> None:
    """The worker (or the user) ran `git merge --abort` instead of resolving: the branch is
    not up to date, and the look afterwards says so instead of "updated"."""
    info = _task(git_repo)
    (info.path / "src" / "app.py").write_text("def main():\n    return 'task'\n")
    commit_all(info.path, "task")
    _main_moves(git_repo, "src/app.py", "def main():\n    return 'main'\n")
    assert _update(git_repo, info).status == "conflicts"
    git(info.path, "merge", "--abort")
    result = fgit.conclude_update(info.path, _record(git_repo), base_branch="main",
                                  branch=info.branch, conflicted=["src/app.py"])
    assert result.status == "refused" and "abandoned" in result.message
    assert not _record(git_repo).exists()
    assert _update(git_repo, info).status == "conflicts"  # a new update starts over


def test_rebase_update_clean_and_conflicted_then_abort(git_repo: Path) -> None:
    info = _task(git_repo)
    (info.path / "task.txt").write_text("task\n")
    commit_all(info.path, "task")
    tip = _main_moves(git_repo, "main_only.txt", "main\n")
    result = _update(git_repo, info, "rebase")
    assert result.status == "updated", result.message
    assert git(info.path, "rev-parse", "HEAD~1").strip() == tip  # replayed on main's tip
    assert len(git(info.path, "log", "-1", "--format=%P").split()) == 1
    # and a conflicting one: mid-rebase, then aborted exactly
    (info.path / "src" / "app.py").write_text("def main():\n    return 'task'\n")
    commit_all(info.path, "task edits app")
    (info.path / "wip.txt").write_text("uncommitted\n")
    _main_moves(git_repo, "src/app.py", "def main():\n    return 'main'\n")
    before = checkout_state(info.path)
    main_before = checkout_state(git_repo)
    conflicted = _update(git_repo, info, "rebase")
    assert conflicted.status == "conflicts" and conflicted.operation == "rebase"
    assert conflicted.conflicts == ["src/app.py"]
    fgit.abort_update(info.path, _record(git_repo))
    assert checkout_state(info.path) == before
    assert checkout_state(git_repo) == main_before


def test_update_refuses_to_overwrite_an_ignored_file_of_the_worktree(git_repo: Path) -> None:
    (git_repo / ".gitignore").write_text("build.cfg\n")
    commit_all(git_repo, "ignore build.cfg")
    info = _task(git_repo)
    (info.path / "build.cfg").write_text("the worker's own local file\n")
    (git_repo / ".gitignore").write_text("")
    (git_repo / "build.cfg").write_text("main tracks it now\n")
    commit_all(git_repo, "track build.cfg")
    before = checkout_state(info.path)
    main_before = checkout_state(git_repo)
    result = _update(git_repo, info)
    assert result.status == "refused" and "build.cfg" in result.message
    assert checkout_state(info.path) == before
    assert checkout_state(git_repo) == main_before


# --- 3. merging exactly what was tested; fast-forward --------------------------------------


def test_merge_of_the_tested_commit_only(git_repo: Path) -> None:
    info = _task(git_repo)
    (info.path / "task.txt").write_text("task\n")
    commit_all(info.path, "task")
    assert _update(git_repo, info).status == "current"
    tested = git(info.path, "rev-parse", "HEAD").strip()
    (info.path / "task.txt").write_text("changed after the test\n")
    before = checkout_state(git_repo)
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="t",
                        expect_side=tested)
    assert not result.merged and result.reason == "changed"
    assert checkout_state(git_repo) == before
    git(info.path, "checkout", "--", "task.txt")
    _main_moves(git_repo, "other.txt", "main moved\n")
    before = checkout_state(git_repo)
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="t",
                        expect_side=tested)
    assert not result.merged and result.reason == "moved"
    assert checkout_state(git_repo) == before
    assert _update(git_repo, info).status == "updated"
    tested = git(info.path, "rev-parse", "HEAD").strip()
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="t",
                        expect_side=tested)
    assert result.merged, result.message
    assert git(git_repo, "rev-parse", "HEAD^{tree}") == git(git_repo, "rev-parse",
                                                             f"{tested}^{{tree}}")


def test_fast_forward_strategy(git_repo: Path) -> None:
    info = _task(git_repo)
    (info.path / "task.txt").write_text("task\n")
    commit_all(info.path, "task")
    _main_moves(git_repo, "other.txt", "main\n")
    before = checkout_state(git_repo)
    preview = fgit.conflict_preview(git_repo, info.branch, "main", worktree=info.path,
                                    strategy="ff")
    assert not preview.clean and preview.reason == "behind"
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="t", strategy="ff")
    assert not result.merged and result.reason == "behind" and "update" in result.message
    assert checkout_state(git_repo) == before
    assert _update(git_repo, info).status == "updated"
    head = git(info.path, "rev-parse", "HEAD").strip()
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="t", strategy="ff")
    assert result.merged, result.message
    assert git(git_repo, "rev-parse", "HEAD").strip() == head  # main is the task's commit


# --- 5. push ------------------------------------------------------------------------------


def _bare_remote(repo: Path, name: str = "origin") -> Path:
    remote = repo.parent / f"{name}.git"
    git(repo.parent, "init", "-q", "--bare", str(remote))
    git(repo, "remote", "add", name, str(remote))
    return remote


def test_push_commits_the_work_and_pushes_under_fleet_id(git_repo: Path) -> None:
    remote = _bare_remote(git_repo)
    info = _task(git_repo)
    (info.path / "task.txt").write_text("uncommitted work\n")
    before = checkout_state(git_repo)
    assert fgit.push_remote(git_repo, "main") == "origin"
    result = fgit.push_branch(git_repo, info.path, info.branch, "fleet/t1", remote="origin",
                              base_branch="main", base_commit=info.base_commit,
                              message="work", trailers=TRAILERS)
    assert result.committed is not None and result.commit == result.committed
    assert git(remote, "rev-parse", "refs/heads/fleet/t1").strip() == result.commit
    assert checkout_state(git_repo) == before
    # pushed again after a rebase: the lease allows replacing our own last push only
    git(info.path, "commit", "-q", "--amend", "-m", "work, reworded")
    again = fgit.push_branch(git_repo, info.path, info.branch, "fleet/t1", remote="origin",
                             base_branch="main", base_commit=info.base_commit, message="w",
                             expect_remote=result.commit)
    assert git(remote, "rev-parse", "refs/heads/fleet/t1").strip() == again.commit


def test_push_refuses_the_key_and_a_missing_remote(git_repo: Path) -> None:
    info = _task(git_repo)
    assert fgit.push_remote(git_repo, "main") is None
    _bare_remote(git_repo, "upstream")
    _bare_remote(git_repo, "mirror")
    assert fgit.push_remote(git_repo, "main") is None  # two, neither is origin
    git(git_repo, "config", "branch.main.remote", "upstream")
    assert fgit.push_remote(git_repo, "main") == "upstream"
    key = "sk-push-test-SECRET-0f3e"
    (info.path / "leak.txt").write_text(f"token={key}\n")
    wt_before = checkout_state(info.path)
    with pytest.raises(fgit.GitError, match="contain the API key"):
        fgit.push_branch(git_repo, info.path, info.branch, "fleet/t1", remote="upstream",
                         base_branch="main", base_commit=info.base_commit, message="w",
                         secrets=[key])
    assert checkout_state(info.path) == wt_before  # nothing committed either
    assert git(git_repo.parent / "upstream.git", "branch", "--list").strip() == ""
