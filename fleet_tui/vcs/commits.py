"""The worker's work in its worktree: whether anything is uncommitted, an unreferenced
snapshot commit of it (what a preview checks), committing it with fleet-tui's trailers,
and whether git has an identity to commit with."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fleet_tui.system.gitplumbing import snapshot_commit
from fleet_tui.vcs.run import _out, _run


def _has_uncommitted(worktree: Path) -> bool:
    out = _out(worktree, "--no-optional-locks", "status", "--porcelain",
               "--untracked-files=all", "-z")
    return bool(out.strip("\0"))


def _snapshot_commit(worktree: Path) -> str:
    """An unreferenced commit of the worktree as it is now (tracked + untracked files),
    made without touching its branch, index or files."""
    return snapshot_commit(worktree, run=_run)


def check_identity(repo: Path) -> str | None:
    """None when git can make commits in repo; else one sentence saying how to fix it.

    `git var GIT_COMMITTER_IDENT` (and the author's) fail exactly when `git commit` would:
    no user.name/user.email and none that git can guess, or `user.useConfigOnly` without
    them. The merge commits (the worker's changes, then the merge), so it asks first.
    """
    for var in ("GIT_COMMITTER_IDENT", "GIT_AUTHOR_IDENT"):
        status, _, _ = _run(Path(repo), "var", var, check=False)
        if status != 0:
            return (f"git does not know who you are in {repo}, so it cannot make the merge "
                    "commit; set it with `git config --global user.name \"Your Name\"` and "
                    "`git config --global user.email you@example.com` (or without --global "
                    "for this repository only), then merge again")
    return None


def _with_trailers(message: str, trailers: Mapping[str, str]) -> str:
    """The message with ``Key: value`` trailer lines in a final paragraph of their own."""
    lines = [f"{key}: {value}" for key, value in trailers.items() if value]
    body = message.rstrip() + "\n"
    return body + ("\n" + "\n".join(lines) + "\n" if lines else "")


def _commit_args(message: str, trailers: Mapping[str, str]) -> list[str]:
    return ["commit", "--no-verify", "-q", "--cleanup=strip", "-m",
            _with_trailers(message, trailers)]


def _commit_uncommitted(worktree: Path, message: str, trailers: Mapping[str, str]
                        ) -> str | None:
    """Commit everything the worker left uncommitted (untracked files too, ignored ones
    not); the new commit, or None when there was nothing."""
    if not _has_uncommitted(worktree):
        return None
    _run(worktree, "add", "-A", "--", ".", what="staging the worker's changes")
    _run(worktree, *_commit_args(message, trailers), what="committing the worker's changes")
    return _out(worktree, "rev-parse", "HEAD").strip()

