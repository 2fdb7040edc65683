"""Git work for fleet-tui: worktrees, diffs, conflict preview, merge, discard (GitPython).

Implementation in progress; the data classes and signatures are final.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

FileStatus = Literal["added", "modified", "deleted", "untracked", "renamed"]


class GitError(Exception):
    """A git problem, with a message that says what to do about it."""


@dataclass(frozen=True)
class WorktreeInfo:
    path: Path
    branch: str
    base_commit: str
    base_branch: str | None


@dataclass
class FileDiff:
    path: str
    status: FileStatus
    added: int
    deleted: int
    patch: str
    old_path: str | None = None
    binary: bool = False


@dataclass
class Diff:
    files: list[FileDiff]
    patch: str


@dataclass
class ConflictPreview:
    clean: bool
    conflicts: list[str]
    message: str
    uncommitted: bool = False


@dataclass
class MergeResult:
    merged: bool
    commit: str | None
    message: str
    test_output: str | None = None
    conflicts: list[str] = field(default_factory=list)


def find_repo(path: Path) -> Path:
    raise NotImplementedError


def create_worktree(repo: Path, task_id: str, base_ref: str | None = None, *,
                    reset: bool = False) -> WorktreeInfo:
    raise NotImplementedError


def verify_worktree(path: Path, branch: str | None = None) -> None:
    raise NotImplementedError


def diff(worktree: Path, base_commit: str) -> Diff:
    raise NotImplementedError


def diff_stat(worktree: Path, base_commit: str) -> tuple[int, int]:
    raise NotImplementedError


def conflict_preview(repo: Path, branch: str, base_branch: str, *,
                     worktree: Path | None = None) -> ConflictPreview:
    raise NotImplementedError


def merge(repo: Path, worktree: Path | None, branch: str, base_branch: str, *, message: str,
          trailers: dict[str, str] | None = None, test_command: str | None = None,
          strategy: str = "merge", test_timeout: float = 600.0) -> MergeResult:
    raise NotImplementedError


def discard(repo: Path, worktree: Path | None, branch: str) -> None:
    raise NotImplementedError
