"""Running git: a one-shot command is a process of its own (``run_git``, the standard
library: the same runner the worker's hosts use), its failures ``GitError`` with a message
that says what to do, never a traceback. GitPython does what it is good at, where it is
needed: one `git cat-file --batch` read as a stream (the key scan, keyscan.py; a remote
tip's blobs, diffs.py) and finding a repository the one `git rev-parse` does not
(repository.py). Its import, ~60 ms of CPU with the two `git version` it runs, would be a
third of a task command's (`fleet-tui ls`, `show`, `merge`), paid by every such process.

The bottom of ``fleet_tui.vcs``: the small helpers every other module runs git with
(``_run``, ``_out``, ``_rev``, ...), a throwaway index for commands that must not touch a
worktree's own, and counting things in a message."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

# Git's plumbing and the runner itself are shared with the worker (which runs on a host
# without GitPython): system/gitplumbing.py.
from fleet_tui.system.gitplumbing import GitError as GitError
from fleet_tui.system.gitplumbing import run_git, temp_index

_GITPYTHON: ModuleType | None = None


def _gitpython() -> ModuleType:
    """GitPython, imported on first use, by what needs it (above): most processes that
    import fleet_tui.vcs never do."""
    global _GITPYTHON
    if _GITPYTHON is None:
        import git as gitpython

        _GITPYTHON = gitpython
    return _GITPYTHON


def _run(cwd: Path, *args: str, env: Mapping[str, str] | None = None,
         check: bool = True, what: str | None = None,
         timeout: float | None = None) -> tuple[int, str, str]:
    """Run ``git args`` in cwd; return (status, stdout, stderr).

    With ``check``, a non-zero status raises GitError naming ``what`` and git's own reason.
    ``timeout``: seconds before git is killed (a push to an unreachable remote), a GitError.
    Output that is not UTF-8 (a file name of other bytes) keeps its bytes as surrogates,
    so the name given back to git names the same file.
    """
    return run_git(cwd, *args, env=env, check=check, what=what, timeout=timeout,
                   errors="surrogateescape")


def _out(cwd: Path, *args: str, what: str | None = None,
         env: Mapping[str, str] | None = None) -> str:
    return _run(cwd, *args, what=what, env=env)[1]


def _rev(cwd: Path, ref: str) -> str | None:
    """The commit a ref names, or None."""
    status, out, _ = _run(cwd, "rev-parse", "--verify", "--quiet", "--end-of-options",
                          f"{ref}^{{commit}}", check=False)
    return out.strip() if status == 0 and out.strip() else None


def _branch_exists(cwd: Path, branch: str) -> bool:
    status, _, _ = _run(cwd, "show-ref", "--verify", "--quiet", f"refs/heads/{branch}",
                        check=False)
    return status == 0


def _is_ancestor(cwd: Path, ancestor: str, descendant: str) -> bool:
    """Is ``ancestor`` reachable from ``descendant`` (the same commit counts)?"""
    status, _, _ = _run(cwd, "merge-base", "--is-ancestor", ancestor, descendant, check=False)
    return status == 0


def current_branch(cwd: Path) -> str | None:
    """The branch checked out in cwd, or None when HEAD is detached."""
    status, out, _ = _run(cwd, "symbolic-ref", "--short", "-q", "HEAD", check=False)
    return out.strip() if status == 0 and out.strip() else None


def _git_path(cwd: Path, name: str) -> Path:
    """A path inside the git dir of cwd (per-worktree, e.g. its index)."""
    out = _out(cwd, "rev-parse", "--path-format=absolute", "--git-path", name).strip()
    return Path(out)


def _status_all(repo: Path) -> str:
    """Every change of a checkout, untracked files included, as one string to compare
    (before and after a merge or an update). --no-optional-locks: the index is not
    refreshed, so this never takes the lock a `git merge` beside it needs."""
    return _out(repo, "--no-optional-locks", "status", "--porcelain", "-z",
                "--untracked-files=all", what="git status")


def _temp_index(worktree: Path) -> contextlib.AbstractContextManager[dict[str, str]]:
    """Env pointing git at a throwaway copy of the worktree's index (the real one is kept)."""
    return temp_index(worktree, run=_run)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"
