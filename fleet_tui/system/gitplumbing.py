"""Git plumbing on the standard library: running git (`run_git`), the merge worked out
without a checkout (`merge_tree`, the paths it changes, those in the way), the files that
still hold conflict markers, an unreferenced snapshot commit of a worktree, and a saved
index put back.

Shared by vcs/ (git in the main repository, here) and the worker (a worktree on a host,
under `python3 -I -S`, where GitPython is not installed): each function that runs git takes
the runner: the worker passes `run_git`, vcs its own `_run` (run_git, keeping a file name's
bytes when they are not UTF-8).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from fleet_tui.core.errors import FleetTuiError


class GitError(FleetTuiError):
    """A git problem, with a message that says what to do about it."""

    title = "Git"


class Runner(Protocol):
    """How git is run: `git args` in cwd, returning (status, stdout, stderr); with
    `check`, GitError on a non-zero status."""

    def __call__(self, cwd: Path, *args: str, env: Mapping[str, str] | None = None,
                 check: bool = True, what: str | None = None,
                 timeout: float | None = None) -> tuple[int, str, str]: ...


def first_line(text: str) -> str:
    """The part of git's stderr worth showing (with a hint for the usual set-up mistakes)."""
    if "tell me who you are" in text or "unable to auto-detect email" in text:
        return ("git does not know who you are; run `git config --global user.name "
                "\"Your Name\"` and `git config --global user.email you@example.com`")
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line.removeprefix("fatal: ").removeprefix("error: ")
    return ""


def run_git(cwd: Path, *args: str, env: Mapping[str, str] | None = None,
            check: bool = True, what: str | None = None,
            timeout: float | None = None, errors: str = "replace") -> tuple[int, str, str]:
    """Run `git args` in cwd: the environment with env on top and git's messages in
    English (they are read); (status, stdout, stderr); GitError naming `what` and git's
    own reason when it fails (with `check`), cannot start or does not answer in `timeout`.
    `errors`: how bytes that are not UTF-8 are decoded ("surrogateescape" keeps a file
    name's own bytes: given back to git, it names the same file)."""
    full = {**os.environ, "LANGUAGE": "C", "LC_ALL": "C", **(env or {})}
    try:
        # stdin: nothing (a prompt must not read the panel's terminal or an agent's frames)
        done = subprocess.run(["git", *args], cwd=cwd, env=full, capture_output=True,
                              stdin=subprocess.DEVNULL, timeout=timeout, check=False)
    except FileNotFoundError:
        raise GitError("git is not installed or not on PATH; install git 2.38 or newer"
                       ) from None
    except subprocess.TimeoutExpired:
        raise GitError(f"{what or 'git ' + args[0]} failed: no answer in {timeout:g} s"
                       ) from None
    except OSError as exc:
        raise GitError(f"cannot run git in {cwd}: {exc.strerror or exc}") from None
    out = done.stdout.decode("utf-8", errors)
    err = done.stderr.decode("utf-8", "replace")
    if check and done.returncode != 0:
        reason = first_line(err) or first_line(out) or f"exit status {done.returncode}"
        raise GitError(f"{what or 'git ' + args[0]} failed: {reason}")
    return done.returncode, out, err


def git_path(cwd: Path, name: str, *, run: Runner = run_git) -> Path:
    """A path inside the git dir of cwd (per-worktree, e.g. its index)."""
    return Path(run(cwd, "rev-parse", "--path-format=absolute", "--git-path", name)[1].strip())


@contextlib.contextmanager
def temp_index(worktree: Path, *, run: Runner = run_git) -> Iterator[dict[str, str]]:
    """Env pointing git at a throwaway copy of the worktree's index (the real one is kept)."""
    real = git_path(worktree, "index", run=run)
    fd, name = tempfile.mkstemp(prefix="fleet-index-")
    os.close(fd)
    try:
        if real.exists():
            # copy2: the copy keeps the index's mtime, which git's racy-entry check needs
            # (a file changed in the second the index was written, its size the same, reads
            # as unchanged against a copy that looks newer than it: the diff missed it)
            shutil.copy2(real, name)
        else:
            os.unlink(name)
        yield {"GIT_INDEX_FILE": name}
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name)
        with contextlib.suppress(OSError):
            os.unlink(name + ".lock")


def put_index_back(index: Path, saved: Path, had_index: bool) -> None:
    """The worktree's index as a copy kept before an update: replaced whole (or removed,
    when there was none); a lost copy leaves the index as it is."""
    if had_index and saved.exists():
        tmp = index.with_name("index.fleet-tmp")
        shutil.copyfile(saved, tmp)
        os.replace(tmp, index)
    elif not had_index:
        index.unlink(missing_ok=True)


def shown(paths: Sequence[str], limit: int = 5) -> str:
    """The first few of `paths` for a message, and how many more there are."""
    return ", ".join(paths[:limit]) + (f" and {len(paths) - limit} more"
                                       if len(paths) > limit else "")


def snapshot_commit(worktree: Path, *, run: Runner = run_git) -> str:
    """An unreferenced commit of the worktree as it is now (tracked + untracked files).

    Built with a temporary index, `write-tree` and `commit-tree`: no branch, index or
    file of the worktree changes. Git's gc removes the object later.
    """
    with temp_index(worktree, run=run) as env:
        run(worktree, "add", "-A", "--", ".", env=env, what="reading the worktree")
        tree = run(worktree, "write-tree", env=env, what="git write-tree")[1].strip()
    head = run(worktree, "rev-parse", "HEAD")[1].strip()
    ident = {"GIT_AUTHOR_NAME": "fleet-tui", "GIT_AUTHOR_EMAIL": "fleet-tui@localhost",
             "GIT_COMMITTER_NAME": "fleet-tui", "GIT_COMMITTER_EMAIL": "fleet-tui@localhost"}
    return run(worktree, "commit-tree", tree, "-p", head, "-m", "fleet-tui preview",
               env=ident, what="git commit-tree")[1].strip()


def merge_tree(repo: Path, base_tip: str, side: str, *,
               run: Runner = run_git) -> tuple[str, list[str]]:
    """(tree, conflicting paths) of merging `side` into `base_tip`. No checkout."""
    status, out, err = run(repo, "merge-tree", "--write-tree", "--name-only", "--no-messages",
                           base_tip, side, check=False)
    lines = out.splitlines()
    if status in (0, 1) and lines:
        conflicts = sorted({line for line in lines[1:] if line.strip()}) if status else []
        return lines[0].strip(), conflicts
    raise GitError(f"git merge-tree failed: {first_line(err) or 'exit ' + str(status)} "
                   "(fleet-tui needs git 2.38 or newer)")


def tree_changes(repo: Path, base_tip: str, tree: str, *,
                 run: Runner = run_git) -> list[tuple[str, str, str]]:
    """(status letter, path, new object id) of every path the merge changes in the base."""
    out = run(repo, "diff-tree", "-r", "-z", "--no-renames", "--no-abbrev", "--raw",
              base_tip, tree, what="git diff-tree")[1]
    tokens = out.split("\0")
    changes: list[tuple[str, str, str]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith(":") and i + 1 < len(tokens):
            fields = token[1:].split()
            if len(fields) >= 5:
                changes.append((fields[4][0], tokens[i + 1], fields[3]))
            i += 2
        else:
            i += 1
    return changes


def in_the_way(repo: Path, changes: list[tuple[str, str, str]]) -> list[str]:
    """Paths the merge would write that exist in the checkout but are not tracked there
    (untracked or ignored): `git merge` overwrites an ignored file without a word.

    Only added paths can be such: a modified one is tracked in the base, and the checkout
    is on the base with no changes. A new file whose folder exists as an untracked file
    (or link) is in the way too.
    """
    removed = {path for letter, path, _ in changes if letter == "D"}
    found: set[str] = set()
    for letter, path, _ in changes:
        if letter != "A":
            continue
        if os.path.lexists(repo / path):
            found.add(path)
            continue
        parts = path.split("/")
        for n in range(1, len(parts)):
            prefix = "/".join(parts[:n])
            if prefix in removed:
                break  # a tracked file the merge replaces by a folder: git handles it
            where = repo / prefix
            if not os.path.lexists(where):
                break
            if os.path.islink(where) or not os.path.isdir(where):
                found.add(prefix)
                break
    return sorted(found)


_MARKER_RE = re.compile(rb"^(?:<{7}|>{7})(?: |$)", re.MULTILINE)


def with_markers(worktree: Path, candidates: Sequence[str]) -> list[str]:
    """The files among `candidates` that still hold conflict markers (an update's
    conflicted files, here or in a host's worktree: its worker asks the same)."""
    found = []
    for rel in candidates:
        try:
            data = (Path(worktree) / rel).read_bytes()
        except OSError:
            continue
        if _MARKER_RE.search(data):
            found.append(rel)
    return found


__all__ = ["GitError", "Runner", "first_line", "git_path", "in_the_way", "merge_tree",
           "put_index_back", "run_git", "shown", "snapshot_commit", "temp_index",
           "tree_changes", "with_markers"]
