"""The SSH host's agent concluding an update: `update` and `abort-update`
run as the controller runs them on a host (`python3 -m fleet_tui.execution.worker.agent`,
stdlib only), here on a real git worktree of this machine: a conflicted file staged, or
committed, with its conflict markers still in is not resolved, as in a local worktree.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

AGENT = "fleet_tui.execution.worker.agent"


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def _agent(*args: str, conflicted: list[str]) -> tuple[int, dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", AGENT, *args], capture_output=True,
                          input=json.dumps({"conflicted": conflicted}).encode(), check=False)
    return done.returncode, json.loads(done.stdout.decode().strip().splitlines()[-1])


def _conflicted(git_repo: Path) -> tuple[Path, str]:
    """A worktree on fleet/t1 whose update from main stopped on a conflict in notes.txt."""
    wt = _worker_wrote_notes(git_repo)
    base, answer = _update_from_mains_notes(git_repo, wt)
    assert answer["conflicts"] == ["notes.txt"]
    return wt, base


def _worker_wrote_notes(git_repo: Path) -> Path:
    """A worktree on fleet/t1 whose worker committed its own notes.txt."""
    wt = git_repo.parent / "wt"
    _git(git_repo, "worktree", "add", "-q", "-b", "fleet/t1", str(wt))
    (wt / "notes.txt").write_text("the worker's\n")
    _git(wt, "add", "notes.txt")
    _git(wt, "commit", "-q", "-m", "worker")
    return wt


def _update_from_mains_notes(git_repo: Path, wt: Path) -> tuple[str, dict[str, Any]]:
    """main commits a notes.txt of its own; the update of wt from it stops on conflicts."""
    (git_repo / "notes.txt").write_text("main's\n")
    _git(git_repo, "add", "notes.txt")
    _git(git_repo, "commit", "-q", "-m", "main")
    base = _git(git_repo, "rev-parse", "HEAD")
    code, answer = _agent("update", str(wt), base, "merge", "update", "T", "t@x.invalid",
                          conflicted=[])
    assert code == 0 and answer["status"] == "conflicts", answer
    return base, answer


def test_a_file_staged_with_its_markers_is_not_resolved(git_repo: Path) -> None:
    wt, base = _conflicted(git_repo)
    _git(wt, "add", "notes.txt")  # the markers still in
    code, answer = _agent("update", str(wt), base, "merge", "update", "T", "t@x.invalid",
                          conflicted=["notes.txt"])
    assert (code, answer["status"], answer["conflicts"]) == (0, "conflicts", ["notes.txt"])
    assert _git(wt, "rev-parse", "-q", "--verify", "MERGE_HEAD")  # still mid-merge
    # resolved for real: concluded
    (wt / "notes.txt").write_text("both\n")
    _git(wt, "add", "notes.txt")
    code, answer = _agent("update", str(wt), base, "merge", "update", "T", "t@x.invalid",
                          conflicted=["notes.txt"])
    assert (code, answer["status"]) == (0, "updated"), answer
    assert _git(wt, "merge-base", "--is-ancestor", base, "HEAD") == ""


def test_a_merge_committed_with_its_markers_is_still_conflicts_and_not_aborted(
        git_repo: Path) -> None:
    wt, base = _conflicted(git_repo)
    _git(wt, "commit", "-q", "-a", "--no-edit")  # the worker concluded it, markers and all
    code, answer = _agent("update", str(wt), base, "merge", "update", "T", "t@x.invalid",
                          conflicted=["notes.txt"])
    assert (code, answer["status"], answer["conflicts"]) == (0, "conflicts", ["notes.txt"])
    assert answer["concluded"] is True
    head = _git(wt, "rev-parse", "HEAD")
    code, answer = _agent("abort-update", str(wt), conflicted=["notes.txt"])
    assert code == 1 and "nothing to abort" in answer["error"]
    assert "notes.txt" in answer["error"]
    assert _git(wt, "rev-parse", "HEAD") == head  # nothing undone behind its back


def test_an_update_that_would_overwrite_an_ignored_file_is_refused_and_the_file_kept(
        git_repo: Path) -> None:
    """As in a local worktree: `git merge` overwrites an ignored file without a word, so the
    host's update checks first and refuses, naming the file; nothing changes there, not
    even the worker's uncommitted work."""
    wt = git_repo.parent / "wt"
    _git(git_repo, "worktree", "add", "-q", "-b", "fleet/t1", str(wt))
    common = Path(_git(wt, "rev-parse", "--path-format=absolute", "--git-common-dir"))
    (common / "info").mkdir(exist_ok=True)
    (common / "info" / "exclude").write_text("local.env\n")
    (wt / "local.env").write_text("the worker's own settings\n")  # ignored there
    (wt / "work.txt").write_text("uncommitted\n")
    (git_repo / "local.env").write_text("main's\n")
    _git(git_repo, "add", "-f", "local.env")
    _git(git_repo, "commit", "-q", "-m", "main adds local.env")
    base = _git(git_repo, "rev-parse", "HEAD")
    head = _git(wt, "rev-parse", "HEAD")
    code, answer = _agent("update", str(wt), base, "merge", "update", "T", "t@x.invalid",
                          conflicted=[])
    assert (code, answer["status"]) == (0, "refused"), answer
    assert "would overwrite 1 ignored file" in answer["error"]
    assert "local.env" in answer["error"] and "move them away" in answer["error"]
    assert (wt / "local.env").read_text() == "the worker's own settings\n"
    assert _git(wt, "rev-parse", "HEAD") == head  # nothing committed, nothing merged
    assert _git(wt, "status", "--porcelain") == "?? work.txt"


def test_aborting_an_update_puts_back_the_workers_uncommitted_work_as_it_was(
        git_repo: Path) -> None:
    """An update commits the worker's uncommitted work before it merges; aborting it on the
    host puts the worktree back as a local abort does: the same HEAD, the staged file
    staged, the modified file modified, the new file untracked."""
    wt = _worker_wrote_notes(git_repo)
    head = _git(wt, "rev-parse", "HEAD")
    (wt / "notes.txt").write_text("the worker's, edited\n")  # modified, unstaged
    (wt / "staged.txt").write_text("staged\n")
    _git(wt, "add", "staged.txt")
    (wt / "new.txt").write_text("untracked\n")
    before = subprocess.run(["git", "status", "--porcelain"], cwd=wt, check=True,
                            capture_output=True, text=True).stdout
    _, answer = _update_from_mains_notes(git_repo, wt)
    assert answer["committed"]  # the worker's work was committed before the merge
    code, answer = _agent("abort-update", str(wt), conflicted=["notes.txt"])
    assert code == 0 and answer["aborted"] == "merge" and answer["restored"] is True, answer
    assert _git(wt, "rev-parse", "HEAD") == head
    after = subprocess.run(["git", "status", "--porcelain"], cwd=wt, check=True,
                           capture_output=True, text=True).stdout
    assert after == before
    assert (wt / "notes.txt").read_text() == "the worker's, edited\n"
