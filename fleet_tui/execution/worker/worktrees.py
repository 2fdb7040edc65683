"""The git helpers the host-side code shares (the SSH agent, the Ray job): git run there,
the host's mirror and its lock, a task's worktree made from it and checked, the worker's
work committed, the committer's identity. Standard library only."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from pathlib import Path

from fleet_tui.execution.worker.runs import answer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

def git(*args: str, cwd: str | None = None) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines()
        verb = next((a for a in args[2:] if not a.startswith("-")), args[0]) \
            if args[0] == "-C" else args[0]
        raise RuntimeError(f"git {verb} failed on the host: {lines[-1] if lines else ''}")
    return out.stdout.strip()


MIRROR_LOCK = "fleet-worktrees.lock"  # in the mirror (the host's data dir): see mirror_lock


@contextlib.contextmanager
def mirror_lock(mirror: str) -> Iterator[None]:
    """The mirror's worktrees made, removed and pruned one at a time, by every task's
    agent and every Ray job on this host: a prune removes a half-made `worktrees/<id>/`
    of another task's `worktree add` (it has no `gitdir` yet), which then fails."""
    try:
        fd = os.open(Path(mirror) / MIRROR_LOCK, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC,
                     0o600)
    except OSError:  # no mirror (git says so) or a read-only one: nothing to guard
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def cmd_worktree(mirror: str, path: str, branch: str, base: str, mode: str) -> int:
    """`mode`: new (made at `base`, replacing what a failed start left), reset, reattach."""
    try:
        with mirror_lock(mirror):
            head = make_worktree(mirror, path, branch, base, mode)
    except RuntimeError as exc:
        answer({"error": str(exc)})
        return 1
    answer({"path": path, "branch": branch, "head": head})
    return 0


def make_worktree(mirror: str, path: str, branch: str, base: str, mode: str) -> str:
    if mode == "reattach":
        if not Path(path).is_dir():
            git("-C", mirror, "worktree", "prune")
            git("-C", mirror, "worktree", "add", path, branch)
    else:
        if Path(path).exists():
            git("-C", mirror, "worktree", "remove", "--force", path)
        git("-C", mirror, "worktree", "prune")
        git("-C", mirror, "worktree", "add", "-B", branch, path, base)
    return git("-C", path, "rev-parse", "HEAD")


def cmd_check_worktree(path: str, branch: str) -> int:
    try:
        on = git("-C", path, "symbolic-ref", "--short", "HEAD")
    except RuntimeError as exc:
        answer({"error": str(exc)})
        return 1
    answer({"branch": on, "ok": on == branch})
    return 0


def cmd_commit_work(path: str, message: str, name: str, email: str) -> int:
    """Commit what the worker left uncommitted in its worktree (untracked files too,
    ignored ones not) as the controller's user, so that fetching the branch brings all
    of its work."""
    for role in ("AUTHOR", "COMMITTER"):
        os.environ[f"GIT_{role}_NAME"] = name
        os.environ[f"GIT_{role}_EMAIL"] = email
    try:
        if not git("-C", path, "status", "--porcelain", "--untracked-files=all"):
            answer({"committed": None})
            return 0
        git("-C", path, "add", "-A", "--", ".")
        git("-C", path, "commit", "--no-verify", "-q", "-m", message)
        answer({"committed": git("-C", path, "rev-parse", "HEAD")})
    except RuntimeError as exc:
        answer({"error": str(exc)})
        return 1
    return 0


def ident(name: str, email: str) -> None:
    for role in ("AUTHOR", "COMMITTER"):
        os.environ[f"GIT_{role}_NAME"] = name
        os.environ[f"GIT_{role}_EMAIL"] = email
