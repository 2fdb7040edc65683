"""Running git: every command goes through GitPython (``git.Git(cwd).execute``), and its
failures become ``GitError`` with a message that says what to do, never a traceback.
(Finding the repository, every CLI command's first step, runs `git rev-parse` without it:
repository.py.)

The bottom of ``fleet_tui.vcs``: the small helpers every other module runs git with
(``_run``, ``_out``, ``_rev``, ...), a throwaway index for commands that must not touch a
worktree's own, and counting things in a message."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

# Git plumbing shared with the worker (which runs it on a host without GitPython) lives
# in system/gitplumbing.py; here it runs through GitPython (`_run`).
from fleet_tui.system.gitplumbing import GitError as GitError
from fleet_tui.system.gitplumbing import first_line as _first_line
from fleet_tui.system.gitplumbing import run_git, temp_index

_GITPYTHON: ModuleType | None = None


def _gitpython() -> ModuleType:
    """GitPython, imported on first use: it takes ~50 ms to import, and the panel and the
    task commands import fleet_tui.vcs before they run any git command (or none at all)."""
    global _GITPYTHON
    if _GITPYTHON is None:
        import git as gitpython

        _GITPYTHON = gitpython
    return _GITPYTHON


def _run(cwd: Path, *args: str, env: Mapping[str, str] | None = None,
         check: bool = True, what: str | None = None,
         timeout: float | None = None) -> tuple[int, str, str]:
    """Run ``git args`` in cwd through GitPython; return (status, stdout, stderr).

    With ``check``, a non-zero status raises GitError naming ``what`` and git's own reason.
    ``timeout``: seconds before git is killed (a push to an unreachable remote).
    """
    try:
        gitpython = _gitpython()
    except ModuleNotFoundError:  # the package's copy on a host: the standard library only
        return run_git(cwd, *args, env=env, check=check, what=what, timeout=timeout)
    try:
        status, out, err = gitpython.Git(str(cwd)).execute(
            ["git", *args], with_extended_output=True, with_exceptions=False,
            strip_newline_in_stdout=False, env=dict(env) if env else None,
            kill_after_timeout=timeout)
    except gitpython.GitCommandNotFound:
        raise GitError("git is not installed or not on PATH; install git 2.38 or newer"
                       ) from None
    except OSError as exc:
        raise GitError(f"cannot run git in {cwd}: {exc.strerror or exc}") from None
    out_s = out if isinstance(out, str) else (out or b"").decode("utf-8", "replace")
    if check and status != 0:
        reason = _first_line(err) or _first_line(out_s) or f"exit status {status}"
        raise GitError(f"{what or 'git ' + args[0]} failed: {reason}")
    return int(status), out_s, err


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
