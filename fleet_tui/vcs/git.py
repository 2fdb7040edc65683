"""Git work for fleet-tui: worktrees, diffs, conflict preview, merge, discard.

Every git command runs through GitPython (``git.Git(cwd).execute``); its exceptions become
``GitError`` with a message that says what to do, never a traceback. Nothing here writes to
a checkout the user did not ask to change: diffs and the conflict preview work on a temporary
index file and unreferenced objects, and a failed merge is rolled back (and said to be
restored only when HEAD, index and files were checked).

Merges, discards and worktree creation of one repository take turns across processes and
threads (``repolock``, a flock in the repository's common git dir): two merges at once once
left the main checkout mid-merge. A merge checks everything that could refuse it before it
runs the test command, and the test command last; the commands that change the main
checkout run under the lock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets as secrets_mod
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import IO, Literal, NamedTuple

from fleet_tui.core import redaction
from fleet_tui.core.errors import FleetTuiError
from fleet_tui.system import paths, procs
from fleet_tui.vcs import repolock

__all__ = [
    "BranchGone",
    "ConflictPreview",
    "Diff",
    "FileDiff",
    "GitError",
    "MergeLeftHalfDone",
    "MergeResult",
    "WorktreeInfo",
    "branch_exists",
    "check_identity",
    "conflict_preview",
    "create_worktree",
    "current_branch",
    "diff",
    "diff_stat",
    "discard",
    "ensure_excluded",
    "find_repo",
    "landed_task",
    "main_worktree",
    "mark_secrets",
    "merge",
    "merge_intent_file",
    "reattach_worktree",
    "recover_merge",
    "verify_worktree",
]

FileStatus = Literal["added", "modified", "deleted", "untracked", "renamed"]
Strategy = Literal["merge", "squash"]

_TASK_ID_RE = re.compile(r"^[0-9a-z][0-9a-z_-]{0,63}$")
_EXCLUDE_LINE = f"/{paths.WORK_DIR_NAME}/"
# Variables that could carry a credential into a user's test command.
_SECRET_ENV = ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY", "ZHIPU_API_KEY", "GLM_API_KEY")
_TEST_OUTPUT_LIMIT = 64_000
log = logging.getLogger("fleet_tui.vcs.git")
LOCK_FILE = "fleet-tui.lock"  # in the common git dir: see repolock
LOCK_TIMEOUT = 120.0  # seconds a merge, discard or worktree creation waits for another
SECRET_MIN_LENGTH = redaction.MIN_LENGTH  # shorter "keys" would match everywhere
REDACTED = redaction.MARK


class GitError(FleetTuiError):
    """A git problem, with a message that says what to do about it."""

    title = "Git"


_GITPYTHON: ModuleType | None = None


def _gitpython() -> ModuleType:
    """GitPython, imported on first use: it takes ~50 ms to import, and the panel and the
    task commands import this module before they run any git command (or none at all)."""
    global _GITPYTHON
    if _GITPYTHON is None:
        import git as gitpython

        _GITPYTHON = gitpython
    return _GITPYTHON


@dataclass(frozen=True)
class WorktreeInfo:
    """A task's worktree: where, on which branch, and what it started from."""

    path: Path
    branch: str
    base_commit: str
    base_branch: str | None  # None when the base was a detached HEAD or a non-branch ref


@dataclass
class FileDiff:
    """One changed file of a task: status, line counts, and its unified patch."""

    path: str
    status: FileStatus
    added: int
    deleted: int
    patch: str  # empty for binary files
    old_path: str | None = None  # the source of a rename
    binary: bool = False


@dataclass
class Diff:
    """Everything a task changed against its base: per file and as one patch."""

    files: list[FileDiff]
    patch: str
    # Changed files whose new content holds the API key (the key itself is replaced by
    # REDACTED in ``patch`` and in each file's patch, so it is never shown).
    secret_paths: list[str] = field(default_factory=list)

    @property
    def added(self) -> int:
        return sum(f.added for f in self.files)

    @property
    def deleted(self) -> int:
        return sum(f.deleted for f in self.files)


@dataclass
class ConflictPreview:
    """Would the task's branch merge cleanly into its base branch right now?"""

    clean: bool
    conflicts: list[str]
    message: str
    uncommitted: bool = False  # the worktree has changes that merge() will commit first
    # Why not clean: "conflicts", "nothing" (no changes to land), "overwrite" (the branch
    # writes paths that exist untracked or ignored in the main checkout: ``blocked``),
    # "secret" (the changes hold the API key: ``secret_paths``), "identity" (git has no
    # committer identity), "checkout" (main is dirty or on another branch). "" when clean.
    reason: str = ""
    blocked: list[str] = field(default_factory=list)
    secret_paths: list[str] = field(default_factory=list)


@dataclass
class MergeResult:
    """What merge() did; ``message`` is the user-facing reason either way."""

    merged: bool
    commit: str | None
    message: str
    test_output: str | None = None
    conflicts: list[str] = field(default_factory=list)
    # why not merged, as ConflictPreview.reason, plus "test" (the test command failed),
    # "changed" (not the commit that was tested), "moved" (the base moved meanwhile) and
    # "failed" (git merge itself failed); "" when merged
    reason: str = ""


# --- running git ------------------------------------------------------------------------------


def _first_line(text: str) -> str:
    """The part of git's stderr worth showing (with a hint for the usual set-up mistakes)."""
    if "tell me who you are" in text or "unable to auto-detect email" in text:
        return ("git does not know who you are; run `git config --global user.name "
                "\"Your Name\"` and `git config --global user.email you@example.com`")
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line.removeprefix("fatal: ").removeprefix("error: ")
    return ""


def _run(cwd: Path, *args: str, env: Mapping[str, str] | None = None,
         check: bool = True, what: str | None = None,
         timeout: float | None = None) -> tuple[int, str, str]:
    """Run ``git args`` in cwd through GitPython; return (status, stdout, stderr).

    With ``check``, a non-zero status raises GitError naming ``what`` and git's own reason.
    ``timeout``: seconds before git is killed (a push to an unreachable remote).
    """
    gitpython = _gitpython()
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


# --- reading git's files directly -------------------------------------------------------------
# Each git subprocess costs milliseconds; the engine creates a worktree per task and checks it
# before every start. These helpers read the few facts it needs (where the git dir is, what a
# ref or HEAD points at) straight from the files git documents (gitrepository-layout(5)).
# They answer None for anything unusual (reftable, a symbolic ref chain, an unreadable file):
# the caller then asks git itself, so the answer is never a guess.

_SHA_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


def _git_dir_of(checkout: Path) -> Path | None:
    """The git dir of a checkout: its `.git` folder, or where a `.git` file points."""
    dot = checkout / ".git"
    try:
        if dot.is_dir():
            return dot
        text = dot.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if not text.startswith("gitdir: "):
        return None
    target = Path(text[len("gitdir: "):].strip())
    return target if target.is_absolute() else checkout / target


def _common_dir(git_dir: Path) -> Path:
    """The shared git dir (refs, objects, info/) of a possibly linked worktree's git dir."""
    try:
        rel = (git_dir / "commondir").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return git_dir
    common = Path(rel)
    return common if common.is_absolute() else git_dir / common


def _ref_from_files(common: Path, ref: str) -> tuple[bool, str | None]:
    """(known, commit) of a full ref name like refs/heads/x from the loose ref or
    packed-refs. known=False: could not tell from the files (ask git)."""
    if (common / "reftable").exists():
        return False, None
    try:
        text = (common / ref).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        text = None
    except IsADirectoryError:
        return True, None  # refs/heads/fleet is a folder: no branch of that name
    except (OSError, UnicodeDecodeError):
        return False, None
    if text is not None:
        return (True, text) if _SHA_RE.match(text) else (False, None)
    try:
        packed = (common / "packed-refs").read_bytes()
    except FileNotFoundError:
        return True, None
    except OSError:
        return False, None
    needle = b" " + ref.encode() + b"\n"
    at = packed.find(needle)
    if at < 0:
        return True, None
    start = packed.rfind(b"\n", 0, at) + 1
    sha = packed[start:at].decode("ascii", "replace")
    return (True, sha) if _SHA_RE.match(sha) else (False, None)


def _head_from_files(checkout: Path) -> tuple[str, str | None] | None:
    """(commit, branch or None when detached) of a checkout's HEAD, or None: ask git."""
    git_dir = _git_dir_of(checkout)
    if git_dir is None:
        return None
    try:
        head = (git_dir / "HEAD").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if _SHA_RE.match(head):
        return head, None
    if not head.startswith("ref: refs/heads/"):
        return None
    ref = head[len("ref: "):]
    known, sha = _ref_from_files(_common_dir(git_dir), ref)
    if not known or sha is None:
        return None  # unknown, or an unborn branch: let git say so
    return sha, ref[len("refs/heads/"):]


def _branch_exists_fast(repo: Path, branch: str) -> bool:
    """_branch_exists from the files when they tell, else from git."""
    git_dir = _git_dir_of(repo)
    if git_dir is not None:
        known, sha = _ref_from_files(_common_dir(git_dir), f"refs/heads/{branch}")
        if known:
            return sha is not None
    return _branch_exists(repo, branch)


# --- finding the repository -------------------------------------------------------------------


def find_repo(path: Path | str) -> Path:
    """The top folder of the checkout containing ``path`` (any subfolder works).

    A path inside a task's worktree gives that worktree (it is its own checkout);
    ``main_worktree`` maps it back to the user's main checkout.
    """
    start = Path(path).expanduser()
    if not start.exists():
        raise GitError(f"{start} does not exist; give the folder of a git repository")
    if start.is_file():
        start = start.parent
    gitpython = _gitpython()
    try:
        repo = gitpython.Repo(start, search_parent_directories=True)
    except gitpython.InvalidGitRepositoryError:
        raise GitError(f"{start} is not inside a git repository; cd into one, or create one "
                       "with `git init` and a first commit") from None
    except gitpython.NoSuchPathError:
        raise GitError(f"{start} does not exist; give the folder of a git repository"
                       ) from None
    try:
        if repo.bare:
            raise GitError(f"{repo.git_dir} is a bare repository (no working tree); run "
                           "fleet-tui in a normal clone (`git clone <url>`)")
        top = repo.working_tree_dir
        if top is None:  # pragma: no cover - bare is handled above
            raise GitError(f"{start} has no working tree; run fleet-tui in a normal clone")
        if not repo.head.is_valid():
            raise GitError(f"the repository {top} has no commit yet; make one first "
                           "(`git add -A && git commit -m initial`)")
        return Path(top).resolve()
    finally:
        repo.close()


def main_worktree(path: Path | str) -> Path:
    """The main checkout of the repository containing ``path``, even from a linked worktree."""
    top = find_repo(path)
    common = Path(_out(top, "rev-parse", "--path-format=absolute", "--git-common-dir").strip())
    if common.name == ".git" and common.parent.is_dir():
        return common.parent.resolve()
    return top


_EXCLUDED: set[Path] = set()  # repositories whose exclude file this process has checked
_EXCLUDED_LOCK = threading.Lock()


QUEUE_LOCK_FILE = "fleet-tui-queue.lock"  # held by the process running the merge queue


def queue_lock_file(repo: Path) -> Path:
    """The merge queue's lock of a repository (next to the repository lock): the process
    that holds it runs the queue; the kernel drops it when that process dies."""
    return _lock_file(Path(repo)).with_name(QUEUE_LOCK_FILE)


def _lock_file(repo: Path) -> Path:
    """The repository's lock file: in its common git dir, shared by every worktree."""
    git_dir = _git_dir_of(repo)
    if git_dir is not None and (git_dir / "HEAD").is_file():
        return _common_dir(git_dir) / LOCK_FILE
    common = _out(repo, "rev-parse", "--path-format=absolute", "--git-common-dir").strip()
    return Path(common) / LOCK_FILE


@contextlib.contextmanager
def _repo_lock(repo: Path, what: str) -> Iterator[None]:
    """Hold the repository's lock (every fleet-tui process and thread honours it) while
    worktrees are added or removed and while a merge changes the main checkout.

    It also keeps the engine's own worktree adds apart: git 2.39 reads every worktree's
    admin folder while adding one, and fails ("failed to read .git/worktrees/X/commondir")
    on a folder another `worktree add` is still writing."""
    try:
        with repolock.hold(_lock_file(repo), what, LOCK_TIMEOUT):
            yield
    except repolock.LockTimeout as exc:
        raise GitError(str(exc)) from None


def _exclude_file(repo: Path) -> Path:
    git_dir = _git_dir_of(repo)
    if git_dir is not None and (git_dir / "HEAD").is_file():
        return _common_dir(git_dir) / "info" / "exclude"
    return _git_path(repo, "info/exclude")


def _ensure_excluded_once(repo: Path) -> None:
    """ensure_excluded, once per repository per process (each worktree creation needs it)."""
    if repo in _EXCLUDED:
        return
    with _EXCLUDED_LOCK:
        if repo not in _EXCLUDED:
            ensure_excluded(repo)
            _EXCLUDED.add(repo)


def ensure_excluded(repo: Path) -> None:
    """Keep ``.fleet-work/`` out of git through ``info/exclude`` (appends the line once)."""
    exclude = _exclude_file(repo)
    try:
        text = exclude.read_text(encoding="utf-8") if exclude.exists() else ""
        lines = {line.strip() for line in text.splitlines()}
        if _EXCLUDE_LINE in lines or f"{paths.WORK_DIR_NAME}/" in lines:
            return
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with exclude.open("a", encoding="utf-8") as fh:
            if text and not text.endswith("\n"):
                fh.write("\n")
            fh.write(f"# fleet-tui worktrees and logs\n{_EXCLUDE_LINE}\n")
    except OSError as exc:
        raise GitError(f"cannot update {exclude}: {exc.strerror or exc}") from None


# --- worktrees --------------------------------------------------------------------------------


def _worktrees(repo: Path) -> list[dict[str, str]]:
    """``git worktree list --porcelain`` as dicts (keys: worktree, HEAD, branch, ...)."""
    out = _out(repo, "worktree", "list", "--porcelain", "-z")
    entries: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for token in out.split("\0"):
        if not token:
            if current:
                entries.append(current)
                current = {}
            continue
        key, _, value = token.partition(" ")
        current[key] = value
    if current:
        entries.append(current)
    return entries


def _registered_worktree(repo: Path, *, path: Path | None = None,
                         branch: str | None = None) -> Path | None:
    for entry in _worktrees(repo):
        wt = Path(entry.get("worktree", ""))
        if path is not None and wt.resolve() == path.resolve():
            return wt
        if branch is not None and entry.get("branch") == f"refs/heads/{branch}":
            return wt
    return None


def _remove_worktree(repo: Path, worktree: Path | None, branch: str | None) -> None:
    """Remove a task's worktree (by path or by its branch), then prune. Idempotent."""
    with _repo_lock(Path(repo).resolve(), f"removing the worktree of {branch or worktree}"):
        _remove_worktree_locked(repo, worktree, branch)


def _remove_worktree_locked(repo: Path, worktree: Path | None, branch: str | None) -> None:
    targets: list[Path] = []
    if worktree is not None:
        registered = _registered_worktree(repo, path=worktree)
        if registered is not None:
            targets.append(registered)
    if branch is not None:
        registered = _registered_worktree(repo, branch=branch)
        if registered is not None and registered.resolve() != repo.resolve():
            targets.append(registered)
    for target in targets:
        if target.resolve() == repo.resolve():
            continue  # never the main checkout
        _run(repo, "worktree", "remove", "--force", "--force", str(target), check=False)
    # A folder left behind (never registered, or registration already pruned): delete it,
    # but only inside .fleet-work/ so a wrong argument cannot wipe anything else.
    if worktree is not None and (worktree.exists() or worktree.is_symlink()):
        work = paths.work_dir(repo).resolve()
        if work in worktree.absolute().parents or work in worktree.resolve().parents:
            if worktree.is_dir() and not worktree.is_symlink():
                shutil.rmtree(worktree, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    worktree.unlink()
    _run(repo, "worktree", "prune", check=False)
    for target in targets:
        if target.exists():
            raise GitError(f"could not remove the worktree {target}; close programs using it "
                           f"and run `git worktree remove --force {target}`")


def _delete_branch(repo: Path, branch: str) -> None:
    if _branch_exists(repo, branch):
        _out(repo, "branch", "-D", "--end-of-options", branch,
             what=f"deleting branch {branch}")


class Base(NamedTuple):
    """What a task starts from: the commit, and the branch a merge lands in (None when the
    base is a tag or a commit: such a task's branch is merged by hand)."""

    commit: str
    branch: str | None


def resolve_base(repo: Path, base_ref: str | None = None, *,
                 check_commit: bool = True) -> Base:
    """The base named by `base_ref` (None: the current HEAD and its branch): the one base
    resolution of the engine (`Fleet.submit`, `create_worktree`) and the launch form. Git's
    files first, git itself if unsure. GitError (an "unknown ref" sentence) when `base_ref`
    names no commit, or the repository has none yet.

    With `check_commit` false a full commit id is taken as it is (`git worktree add`
    itself refuses one that does not exist, and create_worktree then reports it)."""
    if base_ref is None:
        head = _head_from_files(repo)
        if head is not None:
            return Base(*head)
        base_commit = _rev(repo, "HEAD")
        if base_commit is None:
            raise GitError(f"the repository {repo} has no commit yet; make one first")
        return Base(base_commit, current_branch(repo))
    if not base_ref.strip() or base_ref.startswith("-"):
        raise GitError(f"unknown ref {base_ref!r}: give a branch, tag or commit as the base")
    name = base_ref.removeprefix("refs/heads/")
    if _SHA_RE.match(base_ref) and not check_commit:
        return Base(base_ref, name if _branch_exists_fast(repo, name) else None)
    commit = _rev(repo, base_ref)
    if commit is None:
        raise _unknown_base(repo, base_ref)
    return Base(commit, name if _branch_exists_fast(repo, name) else None)


def _unknown_base(repo: Path, base_ref: str) -> GitError:
    return GitError(f"unknown ref {base_ref!r} in {repo}: give an existing branch, tag or "
                    "commit as the base (see `git branch -a`)")


def _stale_error(path: Path, branch: str) -> GitError:
    return GitError(f"{path} or branch {branch} exists already (left by an earlier run); "
                    "discard the task first, or retry with a reset")


def create_worktree(repo: Path, task_id: str, base_ref: str | None = None, *,
                    reset: bool = False) -> WorktreeInfo:
    """Create ``.fleet-work/<id>`` on a new branch ``fleet/<id>`` from the base.

    An existing worktree or branch of that id is never reused silently: GitError, unless
    ``reset`` (then both are removed and made fresh). The result is verified, so a failure
    never leaves the caller pointing at the main checkout.

    On the usual path this is one git process (`git worktree add`) and a few file reads:
    the base, the branch check, the exclude file and the verification come from git's
    files. `worktree add -b` itself refuses an existing branch or a registered path, so
    anything stale it finds is sorted out after a refusal, not checked for up front.
    """
    if not _TASK_ID_RE.match(task_id):
        raise GitError(f"bad task id {task_id!r}: use lowercase letters and digits")
    repo = Path(repo).resolve()
    base_commit, base_branch = resolve_base(repo, base_ref, check_commit=False)
    _ensure_excluded_once(repo)
    path = paths.worktree_path(repo, task_id)
    branch = f"fleet/{task_id}"
    # One process at a time adds, removes or merges in a repository (repolock): the
    # stale check and the add are one step, so two starts of one task cannot race.
    with _repo_lock(repo, f"creating the worktree of {branch}"):
        # An existing folder must be checked here: git would happily fill an empty one.
        if path.exists() or path.is_symlink() or _branch_exists_fast(repo, branch):
            if not reset:
                raise _stale_error(path, branch)
            _remove_worktree(repo, path, branch)
            _delete_branch(repo, branch)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise GitError(f"cannot create {path.parent}: {exc.strerror or exc}; move away "
                           f"whatever is at {paths.work_dir(repo)}") from None
        for again in (True, False):
            status, _, err = _run(repo, "worktree", "add", "-b", branch, str(path),
                                  base_commit, check=False)
            if status == 0:
                break
            # git refused: the path may still be registered (its folder deleted by hand and
            # not pruned), which is stale like the folder itself; else something went wrong
            stale = _registered_worktree(repo, path=path) is not None
            if stale and reset and again:
                _remove_worktree(repo, path, branch)
                _delete_branch(repo, branch)
                continue
            if stale:
                raise _stale_error(path, branch)
            with contextlib.suppress(GitError):
                _remove_worktree(repo, path, None)
                _delete_branch(repo, branch)  # it did not exist before this call
            if _rev(repo, base_commit) is None:
                raise _unknown_base(repo, base_ref or "HEAD")
            raise GitError(f"could not create the worktree {path}: {_first_line(err)}")
        verify_worktree(path, branch)
    return WorktreeInfo(path=path, branch=branch, base_commit=base_commit,
                        base_branch=base_branch)


def reattach_worktree(repo: Path, task_id: str) -> WorktreeInfo:
    """Check the task's own branch ``fleet/<id>`` out again at ``.fleet-work/<id>``, as it
    is: the way back for a resumed attempt or a follow-up whose worktree folder was
    deleted by hand (the worker's commits live on the branch; nothing is reset).

    ``WorktreeInfo.base_commit`` is the branch's tip (the task keeps its own base). A
    worktree already there on that branch is returned as it is. BranchGone when the
    branch is gone too (only a fresh start is left); GitError when something else stands
    at the path."""
    if not _TASK_ID_RE.match(task_id):
        raise GitError(f"bad task id {task_id!r}: use lowercase letters and digits")
    repo = Path(repo).resolve()
    _ensure_excluded_once(repo)
    path = paths.worktree_path(repo, task_id)
    branch = f"fleet/{task_id}"
    with _repo_lock(repo, f"re-attaching the worktree of {branch}"):
        tip = _rev(repo, f"refs/heads/{branch}")
        if tip is None:
            raise BranchGone(task_id, path)
        if path.exists() or path.is_symlink():
            if path.is_dir() and _verified_by_files(path, branch):
                return WorktreeInfo(path=path, branch=branch, base_commit=tip,
                                    base_branch=None)
            raise GitError(f"{path} is in the way of task {task_id}'s worktree on {branch}; "
                           "move it away, then try again")
        # the deleted folder's registration (not pruned yet) still holds the branch
        _run(repo, "worktree", "prune", check=False)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise GitError(f"cannot create {path.parent}: {exc.strerror or exc}; move away "
                           f"whatever is at {paths.work_dir(repo)}") from None
        status, _, err = _run(repo, "worktree", "add", str(path), branch, check=False)
        if status != 0:
            raise GitError(f"could not check {branch} out again at {path}: "
                           f"{_first_line(err)}")
        verify_worktree(path, branch)
    return WorktreeInfo(path=path, branch=branch, base_commit=tip, base_branch=None)


class BranchGone(GitError):
    """A task's branch ``fleet/<id>`` no longer exists (deleted outside fleet-tui): there
    is nothing to continue; a fresh retry starts again from the base."""

    def __init__(self, task_id: str, path: Path) -> None:
        super().__init__(f"the worktree of task {task_id} ({path}) and its branch "
                         f"fleet/{task_id} were deleted outside fleet-tui, so there is no "
                         f"work to continue; retry it fresh (`fleet-tui retry {task_id}`) "
                         "to start again from its base")
        self.task_id = task_id


def branch_exists(repo: Path, branch: str) -> bool:
    """Does ``refs/heads/<branch>`` exist in ``repo``?"""
    return _branch_exists_fast(Path(repo), branch)


def _verified_by_files(path: Path, branch: str | None) -> bool:
    """True when git's files show ``path`` is a linked worktree of its own, registered
    (its admin dir points back at it) and, if given, on ``branch``. False: not sure."""
    git_dir = _git_dir_of(path)
    if git_dir is None or (path / ".git").is_dir():
        return False
    try:
        back = (git_dir / "gitdir").read_text(encoding="utf-8").strip()
        head = (git_dir / "HEAD").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return False
    if not (git_dir / "commondir").is_file():
        return False
    if os.path.realpath(back) != os.path.realpath(path / ".git"):
        return False
    return branch is None or head == f"ref: refs/heads/{branch}" \
        or _rebasing_branch(git_dir) == branch


def _rebasing_branch(git_dir: Path) -> str | None:
    """The branch a rebase in progress in this git dir works on (HEAD is detached until
    it ends: the branch is named in rebase-merge/head-name), else None."""
    for folder in ("rebase-merge", "rebase-apply"):
        try:
            name = (git_dir / folder / "head-name").read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            continue
        return name.removeprefix("refs/heads/") if name.startswith("refs/heads/") else None
    return None


def on_branch(path: Path, branch: str) -> bool:
    """Is the worktree on ``branch``, or in the middle of a rebase of it (a worker may be
    resolving its conflicts: `git rebase --continue` puts the branch back)?"""
    if current_branch(path) == branch:
        return True
    git_dir = _git_dir_of(Path(path))
    if git_dir is None:
        git_dir = _git_path(Path(path), ".")
    return _rebasing_branch(git_dir) == branch


def verify_worktree(path: Path, branch: str | None = None) -> None:
    """Raise GitError unless ``path`` is its own checkout (not the main one) on ``branch``.

    The guard that a worker never runs in the main checkout (where it would edit the user's
    own files), whatever happened to its worktree. The usual case is answered from git's
    files; anything else asks git, which gives the reason.
    """
    path = Path(path)
    if not path.is_dir():
        raise GitError(f"the worktree {path} does not exist; retry the task to recreate it")
    if _verified_by_files(path, branch):
        return
    status, out, _ = _run(path, "rev-parse", "--show-toplevel", check=False)
    if status != 0 or Path(out.strip()).resolve() != path.resolve():
        raise GitError(f"{path} is not a git worktree of its own (its checkout is "
                       f"{out.strip() or 'none'}); retry the task to recreate it")
    if branch is not None and not on_branch(path, branch):
        raise GitError(f"the worktree {path} is not on branch {branch}; check it out there "
                       f"again (`git -C {path} switch {branch}`), then retry with --resume "
                       "(a fresh retry would start over from the base)")


# --- diffs ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _temp_index(worktree: Path) -> Iterator[dict[str, str]]:
    """Env pointing git at a throwaway copy of the worktree's index (the real one is kept)."""
    real = _git_path(worktree, "index")
    fd, name = tempfile.mkstemp(prefix="fleet-index-")
    os.close(fd)
    try:
        if real.exists():
            shutil.copyfile(real, name)
        else:
            os.unlink(name)
        yield {"GIT_INDEX_FILE": name}
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name)
        with contextlib.suppress(OSError):
            os.unlink(name + ".lock")


def _intent_to_add(worktree: Path, files: list[str], env: dict[str, str]) -> None:
    """Mark untracked files intent-to-add in the temporary index, so diffs include them."""
    if not files:
        return
    fd, listing = tempfile.mkstemp(prefix="fleet-paths-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(b"\0".join(os.fsencode(f) for f in files) + b"\0")
        _run(worktree, "add", "--intent-to-add", f"--pathspec-from-file={listing}",
             "--pathspec-file-nul", env={**env, "GIT_LITERAL_PATHSPECS": "1"},
             what="listing untracked files")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(listing)


def _untracked(worktree: Path, env: Mapping[str, str] | None = None) -> list[str]:
    out = _out(worktree, "ls-files", "--others", "--exclude-standard", "-z", env=env)
    return [p for p in out.split("\0") if p]


_DIFF_OPTS = ("-c", "core.quotePath=false", "diff", "--no-color", "--no-ext-diff",
              "--no-textconv", "-M")


def _parse_raw_numstat(out: str) -> list[tuple[str, str, str | None, int, int, bool]]:
    """Parse ``git diff --raw --numstat -z``: (status letter, path, old path, +, -, binary)."""
    tokens = out.split("\0")
    raw: list[tuple[str, str, str | None]] = []
    counts: list[tuple[int, int, bool]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token:
            i += 1
            continue
        if token.startswith(":"):
            letter = token.split()[-1][0]
            if letter in "RC":
                raw.append((letter, tokens[i + 2], tokens[i + 1]))
                i += 3
            else:
                raw.append((letter, tokens[i + 1], None))
                i += 2
            continue
        added_s, deleted_s, rest = [*token.split("\t", 2), "", ""][:3]
        binary = added_s == "-"
        counts.append((0 if binary else int(added_s), 0 if binary else int(deleted_s), binary))
        i += 1 if rest else 3
    result = []
    for index, (letter, path, old) in enumerate(raw):
        added, deleted, binary = counts[index] if index < len(counts) else (0, 0, False)
        result.append((letter, path, old, added, deleted, binary))
    return result


def _split_patch(patch: str) -> list[str]:
    """Split a multi-file patch at its ``diff --git`` headers (content lines never match)."""
    chunks: list[str] = []
    current: list[str] = []
    for line in patch.splitlines(keepends=True):
        if line.startswith("diff --git ") and current:
            chunks.append("".join(current))
            current = []
        current.append(line)
    if current:
        chunks.append("".join(current))
    return chunks


_STATUS: dict[str, FileStatus] = {"A": "added", "C": "added", "D": "deleted", "M": "modified",
                                  "R": "renamed", "T": "modified", "U": "modified"}


def diff(worktree: Path, base_commit: str, *, secrets: Sequence[str] = ()) -> Diff:
    """The worktree against its base: committed, uncommitted and untracked changes.

    Untracked files are marked intent-to-add in a temporary copy of the index, so two git
    calls cover every file and the worktree's own index is never touched.

    ``secrets`` (the API key): files whose new content holds one are listed in
    ``Diff.secret_paths`` and the key is replaced by REDACTED in the patch. The scan reads
    the patch already in hand (its added lines) and, for binary files only, the file.
    """
    worktree = Path(worktree)
    if not worktree.is_dir():
        raise GitError(f"the worktree {worktree} does not exist (discarded or merged?)")
    if _rev(worktree, base_commit) is None:
        raise GitError(f"unknown base commit {base_commit!r} in {worktree}")
    with _temp_index(worktree) as env:
        untracked = _untracked(worktree, env)
        _intent_to_add(worktree, untracked, env)
        summary = _out(worktree, *_DIFF_OPTS, "--raw", "--numstat", "-z", base_commit, "--",
                       env=env, what="git diff")
        patch = _out(worktree, *_DIFF_OPTS, base_commit, "--", env=env, what="git diff")
    untracked_set = set(untracked)
    entries = _parse_raw_numstat(summary)
    chunks = _split_patch(patch)
    aligned = len(chunks) == len(entries)
    files: list[FileDiff] = []
    for index, (letter, path, old, added, deleted, binary) in enumerate(entries):
        status: FileStatus = _STATUS.get(letter, "modified")
        if status == "added" and path in untracked_set:
            status = "untracked"  # a rename into an untracked file stays "renamed"
        file_patch = chunks[index] if aligned and not binary else ""
        files.append(FileDiff(path=path, status=status, added=added, deleted=deleted,
                              patch=file_patch, old_path=old, binary=binary))
    result = Diff(files=files, patch=patch)
    needles = _needles(secrets)
    if needles:
        _mark_secrets(worktree, result, needles, aligned)
    return result


def mark_secrets(worktree: Path, result: Diff, secrets: Sequence[str]) -> None:
    """What diff(secrets=...) does, for a Diff made without them: fill ``secret_paths``
    and hide the key in the patches (the engine resolves the key while git diff runs)."""
    needles = _needles(secrets)
    if needles:
        aligned = all(f.patch or f.binary for f in result.files)
        _mark_secrets(Path(worktree), result, needles, aligned)


def _needles(secrets: Sequence[str]) -> list[str]:
    """The secrets worth looking for (a very short one would match everywhere)."""
    return redaction.needles(secrets)


def _redact(text: str, needles: Sequence[str]) -> str:
    return redaction.redact(text, needles)


def _file_holds(path: Path, needles: Sequence[bytes]) -> bool:
    """Does the file at path hold one of needles? Read in chunks (a binary may be big)."""
    overlap = max(len(n) for n in needles) - 1
    tail = b""
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                window = tail + chunk
                if any(n in window for n in needles):
                    return True
                tail = window[-overlap:] if overlap else b""
    except OSError:
        return False
    return False


def _mark_secrets(worktree: Path, result: Diff, needles: list[str], aligned: bool) -> None:
    """Fill result.secret_paths and redact the key from the patches (see diff())."""
    in_patch = any(n in result.patch for n in needles)
    raw = [os.fsencode(n) for n in needles]
    hits: list[str] = []
    for f in result.files:
        if f.status == "deleted":
            continue
        if any(n in f.path for n in needles):
            hits.append(f.path)  # its name holds the key: a merge would publish it
        elif f.binary or (in_patch and not aligned):
            # no patch text to read (binary), or the patch could not be split per file
            if _file_holds(worktree / f.path, raw):
                hits.append(f.path)
        elif in_patch and any(line.startswith("+") and any(n in line for n in needles)
                              for line in f.patch.splitlines()):
            hits.append(f.path)
    if in_patch:
        result.patch = _redact(result.patch, needles)
        for f in result.files:
            f.patch = _redact(f.patch, needles)
            # a file named after the key is named with it hidden (the patch names it too)
            f.path = _redact(f.path, needles)
            if f.old_path is not None:
                f.old_path = _redact(f.old_path, needles)
    result.secret_paths = [_redact(p, needles) for p in hits]


def _status_summary(worktree: Path) -> tuple[bool, bool]:
    """(tracked changes, untracked files) of a worktree, from one `git status`."""
    out = _out(worktree, "--no-optional-locks", "status", "--porcelain", "-z",
               "--untracked-files=all", what="git status")
    tokens = out.split("\0")
    dirty = untracked = False
    i = 0
    while i < len(tokens):
        entry = tokens[i]
        i += 1
        if len(entry) < 3:
            continue
        if entry.startswith("?? "):
            untracked = True
        else:
            dirty = True
            if entry[0] in "RC":
                i += 1  # the rename's source path follows as its own token
    return dirty, untracked


def diff_stat(worktree: Path, base_commit: str) -> tuple[int, int]:
    """(added, deleted) lines of the worktree against its base, untracked files included."""
    worktree = Path(worktree)
    if not worktree.is_dir():
        raise GitError(f"the worktree {worktree} does not exist (discarded or merged?)")
    # One `git status` tells the usual cases apart: nothing changed since the base (the
    # answer is 0/0 if HEAD is still the base), only tracked changes (a plain diff against
    # the base), or untracked files (the temporary index with intent-to-add, as diff()).
    # --no-optional-locks: status must not refresh the worktree's own index.
    dirty, untracked_seen = _status_summary(worktree)
    if not dirty and not untracked_seen:
        head = _head_from_files(worktree)
        if head is not None and head[0] == base_commit:
            return 0, 0
    if not untracked_seen:
        out = _out(worktree, *_DIFF_OPTS, "--numstat", "-z", base_commit, "--",
                   what="git diff")
    else:
        with _temp_index(worktree) as env:
            untracked = _untracked(worktree, env)
            _intent_to_add(worktree, untracked, env)
            out = _out(worktree, *_DIFF_OPTS, "--numstat", "-z", base_commit, "--", env=env,
                       what="git diff")
    added = deleted = 0
    for token in out.split("\0"):
        parts = token.split("\t")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            added += int(parts[0])
            deleted += int(parts[1])
    return added, deleted


# --- conflict preview and merge ---------------------------------------------------------------


def _has_uncommitted(worktree: Path) -> bool:
    out = _out(worktree, "--no-optional-locks", "status", "--porcelain",
               "--untracked-files=all", "-z")
    return bool(out.strip("\0"))


def _snapshot_commit(worktree: Path) -> str:
    """An unreferenced commit of the worktree as it is now (tracked + untracked files).

    Built with a temporary index, ``write-tree`` and ``commit-tree``: no branch, index or
    file of the worktree changes. Git's gc removes the object later.
    """
    with _temp_index(worktree) as env:
        _run(worktree, "add", "-A", "--", ".", env=env, what="reading the worktree")
        tree = _out(worktree, "write-tree", env=env, what="git write-tree").strip()
    head = _out(worktree, "rev-parse", "HEAD").strip()
    ident = {"GIT_AUTHOR_NAME": "fleet-tui", "GIT_AUTHOR_EMAIL": "fleet-tui@localhost",
             "GIT_COMMITTER_NAME": "fleet-tui", "GIT_COMMITTER_EMAIL": "fleet-tui@localhost"}
    return _out(worktree, "commit-tree", tree, "-p", head, "-m", "fleet-tui preview",
                env=ident, what="git commit-tree").strip()


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


@dataclass
class _Refused:
    """Why a merge would not (or did not) happen; nothing was changed."""

    kind: str  # as ConflictPreview.reason, plus "gone" (the task branch does not exist)
    message: str
    paths: list[str] = field(default_factory=list)
    uncommitted: bool = False


@dataclass
class _Plan:
    """A merge that was checked: ``side`` (the branch tip, or a snapshot commit of the
    worktree's uncommitted changes) merges into ``base_tip`` as ``tree``."""

    base_tip: str
    side: str
    tree: str
    worktree: Path | None
    uncommitted: bool


def _merge_tree(repo: Path, base_tip: str, side: str) -> tuple[str, list[str]]:
    """(tree, conflicting paths) of merging ``side`` into ``base_tip``. No checkout."""
    status, out, err = _run(repo, "merge-tree", "--write-tree", "--name-only", "--no-messages",
                            base_tip, side, check=False)
    lines = out.splitlines()
    if status in (0, 1) and lines:
        conflicts = sorted({line for line in lines[1:] if line.strip()}) if status else []
        return lines[0].strip(), conflicts
    raise GitError(f"git merge-tree failed: {_first_line(err) or 'exit ' + str(status)} "
                   "(fleet-tui needs git 2.38 or newer)")


def _tree_changes(repo: Path, base_tip: str, tree: str) -> list[tuple[str, str, str]]:
    """(status letter, path, new object id) of every path the merge changes in the base."""
    out = _out(repo, "diff-tree", "-r", "-z", "--no-renames", "--no-abbrev", "--raw",
               base_tip, tree, what="git diff-tree")
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


def _in_the_way(repo: Path, changes: list[tuple[str, str, str]]) -> list[str]:
    """Paths the merge would write that exist in the main checkout but are not tracked
    there (untracked or ignored): `git merge` overwrites an ignored file without a word.

    Only added paths can be such: a modified one is tracked in the base, and the main
    checkout is on the base with no changes. A new file whose folder exists as an
    untracked file (or link) is in the way too.
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


def _objects_holding(repo: Path, oids: list[str], needles: Sequence[bytes]) -> dict[str, str]:
    """{object id: type} of the objects whose content holds one of needles, read through
    one `git cat-file --batch` (GitPython's), in chunks."""
    if not oids or not needles:
        return {}
    overlap = max(len(n) for n in needles) - 1
    gitpython = _gitpython()
    runner = gitpython.Git(str(repo))
    found: dict[str, str] = {}
    try:
        for oid in oids:
            _, kind, _, stream = runner.stream_object_data(oid)
            tail = b""
            hit = False
            while chunk := stream.read(1 << 20):
                if hit:
                    continue  # read it to the end: the batch process stays in step
                window = tail + chunk
                hit = any(n in window for n in needles)
                tail = window[-overlap:] if overlap else b""
            if hit:
                found[oid] = kind.decode() if isinstance(kind, bytes) else str(kind)
    except (gitpython.GitCommandError, ValueError, OSError) as exc:
        raise GitError(f"could not read the branch's objects: {exc}") from None
    finally:
        runner.clear_cache()
    return found


def _secret_hits(repo: Path, base_tip: str, side: str, changes: list[tuple[str, str, str]],
                 needles: Sequence[str], *, history: bool) -> tuple[list[str], list[str]]:
    """(paths whose merged content holds a needle, further places in the branch's history
    that hold one). History counts for a real merge: its commits land in the base."""
    final: dict[str, list[str]] = {}
    for letter, path, oid in changes:
        if letter != "D" and oid.strip("0"):
            final.setdefault(oid, []).append(path)
    earlier: dict[str, str] = {}
    if history:
        out = _out(repo, "rev-list", "--objects", side, "--not", base_tip,
                   what="git rev-list")
        for line in out.splitlines():
            oid, _, name = line.partition(" ")
            if oid and oid not in final:
                earlier[oid] = name
    hits = _objects_holding(repo, [*final, *earlier], [n.encode() for n in needles])
    named = {p for _, p, _ in changes if any(n in p for n in needles)}
    in_result = sorted({p for oid in hits if oid in final for p in final[oid]} | named)
    in_history = sorted({_history_hit(repo, oid, kind, earlier[oid], needles)
                         for oid, kind in hits.items() if oid in earlier})
    return ([_redact(p, needles) for p in in_result],
            [_redact(p, needles) for p in in_history])


def _history_hit(repo: Path, oid: str, kind: str, name: str,
                 needles: Sequence[str]) -> str:
    """What an object of the branch's history that holds the key is, in words: a file's
    content (its path), a commit's message, or the name of a file or folder in a folder
    (a tree object holds its entries' names, not their content)."""
    if kind == "commit":
        return f"the message of commit {oid[:10]}"
    if kind != "tree":
        return name or f"object {oid[:10]}"
    entries = _out(repo, "ls-tree", "-z", "--name-only", oid, what="git ls-tree").split("\0")
    found = [e for e in entries if e and any(n in e for n in needles)]
    where = f"folder {name}" if name else "the top folder"
    if not found:
        return f"the listing of {where}"
    shown = ", ".join(f"{name}/{e}" if name else e for e in found[:3])
    return f"the name {shown} in {where}"


def _shown(paths: Sequence[str], limit: int = 5) -> str:
    return ", ".join(paths[:limit]) + (f" and {len(paths) - limit} more"
                                       if len(paths) > limit else "")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _worktree_of(repo: Path, worktree: Path | None, branch: str) -> Path | None:
    if worktree is not None and Path(worktree).is_dir():
        return Path(worktree)
    return _registered_worktree(repo, branch=branch)


def _merge_plan(repo: Path, worktree: Path | None, branch: str, base_branch: str, *,
                secrets: Sequence[str], strategy: str) -> _Plan | _Refused:
    """_checked_plan, with the key hidden in a refusal's message and paths (a file named
    after the key shows up in conflicts and in-the-way lists as much as in the scan)."""
    plan = _checked_plan(repo, worktree, branch, base_branch, secrets=secrets,
                         strategy=strategy)
    needles = _needles(secrets)
    if isinstance(plan, _Refused) and needles:
        plan.message = _redact(plan.message, needles)
        plan.paths = [_redact(p, needles) for p in plan.paths]
    return plan


def _checked_plan(repo: Path, worktree: Path | None, branch: str, base_branch: str, *,
                  secrets: Sequence[str], strategy: str) -> _Plan | _Refused:
    """Everything that decides whether a merge may happen, cheapest first; changes nothing.

    The conflict preview and merge() both use it, so the preview refuses what the merge
    would (and the merge refuses before its test command runs).
    """
    base_tip = _rev(repo, f"refs/heads/{base_branch}")
    if base_tip is None:
        raise GitError(f"the base branch {base_branch!r} does not exist in {repo}")
    tip = _rev(repo, f"refs/heads/{branch}")
    if tip is None:
        return _Refused("gone", f"the task branch {branch} no longer exists (already merged "
                        "or discarded); nothing to do")
    problem = check_identity(repo)
    if problem:
        return _Refused("identity", problem)
    on = current_branch(repo)
    if on != base_branch:
        return _Refused("checkout", (
            f"the main checkout {repo} is on {on or 'a detached HEAD'}, not on {base_branch}; "
            f"switch to it (`git switch {base_branch}`) and merge again"))
    if merge_intent_file(repo).exists():
        return _Refused("checkout", (
            f"another merge into the main checkout {repo} is under way; merge again once "
            "it has finished"))
    in_progress = _main_operation(repo)
    if in_progress:
        return _Refused("checkout", (
            f"the main checkout {repo} is in the middle of a {in_progress} that fleet-tui "
            f"did not start; finish it (`git commit`, or `git {in_progress} --continue`) or "
            f"abort it (`git {in_progress} --abort`), then merge again"))
    dirty = _dirty_paths(repo)
    if dirty:
        return _Refused("checkout", (
            f"the main checkout {repo} has uncommitted changes ({_shown(dirty)}); commit or "
            "stash them, then merge again"))
    wt = _worktree_of(repo, worktree, branch)
    uncommitted = False
    side = tip
    if wt is not None:
        verify_worktree(wt, branch)
        uncommitted = _has_uncommitted(wt)
        if uncommitted:
            side = _snapshot_commit(wt)
    status, _, _ = _run(repo, "merge-base", "--is-ancestor", side, base_tip, check=False)
    if status == 0:
        return _Refused("nothing", f"{branch} has no changes that {base_branch} lacks; "
                        "nothing to merge (discard the task)", uncommitted=uncommitted)
    if strategy == "ff" and not _is_ancestor(repo, base_tip, side):
        return _Refused("behind", (
            f"{branch} does not contain the tip of {base_branch} ({base_tip[:10]}), so it "
            f"cannot be fast-forwarded (merge_strategy ff); update it from {base_branch} "
            "first (fleet-tui update ID, or u in the panel)"), uncommitted=uncommitted)
    tree, conflicts = _merge_tree(repo, base_tip, side)
    if conflicts:
        return _Refused("conflicts", (
            f"{branch} conflicts with {base_branch} in {_plural(len(conflicts), 'file')}: "
            f"{_shown(conflicts)}; update it from {base_branch} and let its worker resolve "
            "them (fleet-tui update ID --resolve worker, or u in the panel), or discard "
            "the task"),
            conflicts, uncommitted)
    if tree == _out(repo, "rev-parse", f"{base_tip}^{{tree}}").strip():
        return _Refused("nothing", f"the changes of {branch} are already in {base_branch}; "
                        "nothing to merge (discard the task)", uncommitted=uncommitted)
    changes = _tree_changes(repo, base_tip, tree)
    blocked = _in_the_way(repo, changes)
    if blocked:
        them = "it" if len(blocked) == 1 else "them"
        files = _plural(len(blocked), "untracked or ignored file")
        return _Refused("overwrite", (
            f"merging {branch} would overwrite {files} of the main checkout {repo}: "
            f"{_shown(blocked)}; move {them} away (or commit {them}), then merge again"),
            blocked, uncommitted)
    needles = _needles(secrets)
    if needles:
        in_result, in_history = _secret_hits(repo, base_tip, side, changes, needles,
                                             history=strategy == "merge")
        if in_result:
            return _Refused("secret", (
                f"the changes of {branch} contain the API key in: {_shown(in_result)}; "
                "remove it before merging"), in_result, uncommitted)
        if in_history:
            return _Refused("secret", (
                f"an earlier commit of {branch} contains the API key in: "
                f"{_shown(in_history)}; a merge would copy it into the history of "
                f"{base_branch}: remove it from the branch's commits, or discard the task"),
                in_history, uncommitted)
    return _Plan(base_tip=base_tip, side=side, tree=tree, worktree=wt,
                 uncommitted=uncommitted)


def conflict_preview(repo: Path, branch: str, base_branch: str, *,
                     worktree: Path | None = None, secrets: Sequence[str] = (),
                     strategy: str = "merge") -> ConflictPreview:
    """Would ``branch`` (with its worktree's uncommitted changes) merge into
    ``base_branch``'s current tip right now? The same checks as merge() (identity, main
    checkout, emptiness, conflicts via `git merge-tree`, paths in the way, the API key),
    without the test command; touches no working tree and takes no lock.
    """
    repo = Path(repo)
    if merge_intent_file(repo).exists():
        # a merge that was stopped midway is put right first (the merge would do it);
        # one that runs now holds the lock, and the checks below say so
        try:
            with repolock.hold(_lock_file(repo), "putting right a merge stopped midway",
                               timeout=0):
                recover_merge(repo)
        except repolock.LockTimeout:
            pass
        except MergeLeftHalfDone as exc:
            return ConflictPreview(clean=False, conflicts=[], message=str(exc),
                                   reason="checkout")
    plan = _merge_plan(repo, worktree, branch, base_branch, secrets=secrets,
                       strategy=strategy)
    if isinstance(plan, _Refused):
        if plan.kind == "gone":
            raise GitError(f"the task branch {branch!r} does not exist (discarded or merged?)")
        return ConflictPreview(
            clean=False, conflicts=plan.paths if plan.kind == "conflicts" else [],
            message=plan.message, uncommitted=plan.uncommitted, reason=plan.kind,
            blocked=plan.paths if plan.kind == "overwrite" else [],
            secret_paths=plan.paths if plan.kind == "secret" else [])
    note = " (uncommitted changes in the worktree included; merging commits them first)" \
        if plan.uncommitted else ""
    return ConflictPreview(clean=True, conflicts=[], uncommitted=plan.uncommitted,
                           message=f"{branch} merges cleanly into {base_branch}{note}")


def _main_operation(repo: Path) -> str | None:
    """A merge, rebase, cherry-pick or revert in progress in the main checkout."""
    git_dir = _main_git_dir(repo)
    for name, what in (("MERGE_HEAD", "merge"), ("rebase-merge", "rebase"),
                       ("rebase-apply", "rebase"), ("CHERRY_PICK_HEAD", "cherry-pick"),
                       ("REVERT_HEAD", "revert")):
        if (git_dir / name).exists():
            return what
    return None


def _dirty_paths(repo: Path) -> list[str]:
    """Tracked changes in the main checkout (untracked files and .fleet-work/ ignored).
    --no-optional-locks: the preview runs this beside merges of other processes, and must
    not take the index lock a `git merge` needs."""
    out = _out(repo, "--no-optional-locks", "status", "--porcelain", "--untracked-files=no",
               "-z")
    result = []
    for entry in out.split("\0"):
        if len(entry) > 3:
            path = entry[3:]
            if not path.startswith(f"{paths.WORK_DIR_NAME}/"):
                result.append(path)
    return result


_GATE_BOOT = ("import sys; sys.path.insert(0, {root!r}); "
              "from fleet_tui.vcs.testgate import main; raise SystemExit(main(sys.argv[1:]))")


def _read_tail(fh: IO[bytes], limit: int) -> str:
    fh.seek(0, os.SEEK_END)
    size = fh.tell()
    fh.seek(max(0, size - limit))
    text = fh.read().decode("utf-8", "replace")
    return ("[... output cut ...]\n" + text) if size > limit else text


def _stop_gate(proc: subprocess.Popen[bytes]) -> None:
    """Stop the test gate (it stops what the command started), SIGKILL as a last resort."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        procs.signal_tree(proc.pid, signal.SIGKILL, groups=[proc.pid])
        proc.wait()


def _run_test(command: str, cwd: Path, timeout: float,
              secrets: Sequence[str] = (),
              extra_env: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """Run the user's test command in a shell in cwd; (passed, combined output tail).

    Through fleet_tui.vcs.testgate: the command gets a session of its own, its output goes to a
    file (a daemon that inherits it cannot hold the merge up), the merge waits for the
    shell only, and whatever the command leaves running is stopped when it exits or times
    out. The key is kept out of its environment.
    """
    needles = _needles(secrets)
    env = {k: v for k, v in os.environ.items()
           if k not in _SECRET_ENV and not any(n in v for n in needles)}
    env.update(extra_env or {})
    boot = _GATE_BOOT.format(root=str(Path(__file__).resolve().parent.parent))
    with tempfile.TemporaryFile(prefix="fleet-test-") as out:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", boot, str(os.getpid()), command], cwd=cwd,
                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        except OSError as exc:
            return False, f"cannot run the test command: {exc.strerror or exc}"
        timed_out = False
        try:
            code = proc.wait(timeout=timeout if timeout > 0 else None)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop_gate(proc)
            code = proc.returncode
        except BaseException:
            _stop_gate(proc)  # Ctrl-C: nothing of the test may outlive the merge
            raise
        text = _read_tail(out, _TEST_OUTPUT_LIMIT)
    if timed_out:
        return False, text + f"\n[test command timed out after {timeout:g} s]\n"
    if code != 0:
        return False, text + f"\n[test command exited with status {code}]\n"
    return True, text


def _with_trailers(message: str, trailers: Mapping[str, str]) -> str:
    """The message with ``Key: value`` trailer lines in a final paragraph of their own."""
    lines = [f"{key}: {value}" for key, value in trailers.items() if value]
    body = message.rstrip() + "\n"
    return body + ("\n" + "\n".join(lines) + "\n" if lines else "")


def _commit_args(message: str, trailers: Mapping[str, str]) -> list[str]:
    return ["commit", "--no-verify", "-q", "--cleanup=strip", "-m",
            _with_trailers(message, trailers)]


def _refused_result(refusal: _Refused, test_output: str | None = None) -> MergeResult:
    return MergeResult(False, None, refusal.message, test_output,
                       refusal.paths if refusal.kind == "conflicts" else [],
                       reason=refusal.kind)


# Files a merge attempt may write into the main checkout's git dir; a failed one leaves
# them as they were before it.
_MERGE_STATE_FILES = ("ORIG_HEAD", "MERGE_HEAD", "MERGE_MSG", "MERGE_MODE", "SQUASH_MSG",
                      "AUTO_MERGE")


@dataclass
class _MainState:
    """The main checkout just before `git merge`: what a rollback must give back."""

    git_dir: Path
    head: str
    status: str
    files: dict[str, bytes | None]


def _main_git_dir(repo: Path) -> Path:
    git_dir = _git_dir_of(repo)
    if git_dir is not None and (git_dir / "HEAD").is_file():
        return git_dir
    return Path(_out(repo, "rev-parse", "--path-format=absolute", "--git-dir").strip())


def _status_all(repo: Path) -> str:
    return _out(repo, "--no-optional-locks", "status", "--porcelain", "-z",
                "--untracked-files=all", what="git status")


def _main_state(repo: Path) -> _MainState:
    git_dir = _main_git_dir(repo)
    files: dict[str, bytes | None] = {}
    for name in _MERGE_STATE_FILES:
        try:
            files[name] = (git_dir / name).read_bytes()
        except OSError:
            files[name] = None
    return _MainState(git_dir=git_dir, head=_out(repo, "rev-parse", "HEAD").strip(),
                      status=_status_all(repo), files=files)


def _put_back(git_dir: Path, files: Mapping[str, bytes | None]) -> None:
    for name, content in files.items():
        path = git_dir / name
        with contextlib.suppress(OSError):
            if content is None:
                path.unlink(missing_ok=True)
            elif not path.exists() or path.read_bytes() != content:
                path.write_bytes(content)


def _roll_back(repo: Path, before: _MainState) -> tuple[bool, str]:
    """Undo a failed `git merge` in the main checkout; (verified restored, what is not).

    Never resets to a commit other than the HEAD the merge started from: if HEAD moved
    (another program committed meanwhile), nothing is reset and that is said.
    """
    head = _rev(repo, "HEAD")
    if head != before.head:
        return False, (f"HEAD is now {head[:10] if head else 'unreadable'}, not "
                       f"{before.head[:10]} (another program changed it meanwhile), so "
                       "fleet-tui reset nothing; look at `git status` and `git log`")
    if (before.git_dir / "MERGE_HEAD").exists() and before.files["MERGE_HEAD"] is None:
        _run(repo, "merge", "--abort", check=False)
    if _status_all(repo) != before.status and _rev(repo, "HEAD") == before.head:
        _run(repo, "reset", "--merge", check=False)  # to that same HEAD: the merge's index
    if not (before.git_dir / "MERGE_HEAD").exists():  # never hide a merge in progress
        _put_back(before.git_dir, before.files)
    problems = []
    head = _rev(repo, "HEAD")
    if head != before.head:
        problems.append(f"HEAD is {head[:10] if head else 'unreadable'}, not "
                        f"{before.head[:10]}")
    if (before.git_dir / "MERGE_HEAD").exists() and before.files["MERGE_HEAD"] is None:
        problems.append("a merge is still in progress (MERGE_HEAD)")
    now = _status_all(repo)
    if now != before.status:
        changed = sorted(set(now.split("\0")) ^ set(before.status.split("\0")))
        problems.append(f"`git status` shows {_shown([c for c in changed if c], 3)}")
    return not problems, "; ".join(problems)


def _merge_failure(text: str) -> str:
    """git merge's reason, with the files it names ("... would be overwritten by merge:"
    lists them on the following lines)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "would be overwritten by merge" in line or "would be removed by merge" in line:
            names = []
            for follow in lines[i + 1:]:
                if not follow.startswith(("\t", " ")) or not follow.strip():
                    break
                names.append(follow.strip())
            head = line.strip().removeprefix("error: ").rstrip(":").strip()
            return f"{head}: {_shown(names, 10)}" if names else head
    return _first_line(text) or "git merge failed"


# --- a merge killed midway (issue 17, finding 1) ----------------------------------------------
#
# Before `git merge` changes the main checkout, _land writes an intent record beside the
# repository lock: the branch, the commit being merged (the tested one), main's commit and
# `git status` before, the tree the merge makes. It is removed once the merge is done or
# rolled back. A record found by the next merge (under the same lock, so its writer is gone)
# means a merge that was killed midway: recover_merge puts main back as it was before it,
# or, when the merge commit was made, finishes what was left (merge state files, the
# worktree and the branch). git itself runs in a process group of its own that dies with
# the merging process (PR_SET_PDEATHSIG), and the recovery stops what is left of that group
# (a commit hook), so nothing changes the checkout behind the recovery's back.

MERGE_INTENT_FILE = "fleet-tui-merge.json"
_OURS_STATE = ("MERGE_HEAD", "MERGE_MSG", "MERGE_MODE", "SQUASH_MSG", "AUTO_MERGE")


def merge_intent_file(repo: Path) -> Path:
    """Where a merge into `repo`'s main checkout keeps its intent while it runs."""
    return _lock_file(Path(repo)).with_name(MERGE_INTENT_FILE)


def _write_intent(repo: Path, data: dict[str, object]) -> None:
    target = merge_intent_file(repo)
    tmp = target.with_name(target.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)


def _read_intent(repo: Path) -> dict[str, object] | None:
    try:
        data = json.loads(merge_intent_file(repo).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: a record nonetheless (see recover_merge)
    return data if isinstance(data, dict) else {}


def _drop_intent(repo: Path) -> None:
    with contextlib.suppress(OSError):
        merge_intent_file(repo).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        _saved_index(repo).unlink(missing_ok=True)


MERGE_TOKEN_ENV = "FLEET_MERGE_TOKEN"  # carried by the merge's git and its hooks


def _die_with(parent: int) -> Callable[[], None]:
    def die() -> None:  # pragma: no cover - runs in the forked child
        procs.set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the line above
            os.kill(os.getpid(), signal.SIGKILL)
    return die


def _run_merging(repo: Path, intent: Mapping[str, object], *args: str
                 ) -> tuple[int, str, str]:
    """`git args` in the main checkout, killed by the kernel when this process dies, and
    marked with the intent's token (its hooks inherit it) so that a recovery can stop
    whatever of it is left."""
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0")
    env[MERGE_TOKEN_ENV] = str(intent["token"])
    try:
        proc = subprocess.Popen(["git", *args], cwd=repo, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, preexec_fn=_die_with(os.getpid()))
    except OSError as exc:
        raise GitError(f"cannot run git in {repo}: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate()
    except BaseException:
        procs.signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return (proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


def _stop_leftovers(token: object) -> None:
    """What is left of a killed merge's git (a commit hook still waiting, or a git that
    outlived its parent): stopped, and waited for, before anything is looked at."""
    if not isinstance(token, str) or not token:
        return
    for _ in range(3):
        left = procs.with_env(MERGE_TOKEN_ENV, token)
        if not left:
            return
        for pid in left:
            procs.signal_pid(pid, signal.SIGKILL)
        procs.wait_gone(left, 10.0)


def _git_running_in(repo: Path) -> bool:
    """Does a git process (not this one's) work in `repo` now?"""
    for st in procs.all_stats():
        if st.state in ("Z", "X", "x") or st.pid == os.getpid():
            continue
        argv = procs.cmdline(st.pid)
        if not argv or Path(argv[0]).name != "git":
            continue
        if procs.cwd(st.pid) == repo:
            return True
    return False


def _stale_locks(repo: Path, git_dir: Path, intent: Mapping[str, object]) -> list[str]:
    """git's lock files in the main checkout's git dir that the killed merge's git left
    (made since its intent record, with no git running there now) are removed; the
    names of lock files that may be another program's are returned."""
    base_branch = str(intent.get("base_branch") or "")
    candidates = [git_dir / "index.lock", git_dir / "HEAD.lock", git_dir / "ORIG_HEAD.lock",
                  git_dir / "AUTO_MERGE.lock"]
    if base_branch:
        candidates.append(_common_dir(git_dir) / "refs" / "heads" / f"{base_branch}.lock")
    present = [c for c in candidates if c.exists()]
    if not present:
        return []
    since = intent.get("at")
    ours = isinstance(since, (int, float)) and not _git_running_in(repo) and all(
        c.stat().st_mtime >= float(since) - 1.0 for c in present)
    if not ours:
        return [c.name for c in present]
    for lock in present:
        with contextlib.suppress(OSError):
            lock.unlink()
    return []


def _blob(repo: Path, tree: str, path: str) -> str | None:
    status, out, _ = _run(repo, "rev-parse", "-q", "--verify", f"{tree}:{path}", check=False)
    return out.strip() if status == 0 else None


def _work_blob(repo: Path, path: str) -> str | None:
    full = repo / path
    if not full.exists() and not full.is_symlink():
        return None
    if full.is_dir() and not full.is_symlink():
        return "dir"
    return _out(repo, "hash-object", "--no-filters", "--", path).strip()


def _index_blobs(repo: Path, names: Sequence[str]) -> dict[str, str]:
    out = _out(repo, "ls-files", "-s", "-z", "--", *names) if names else ""
    blobs: dict[str, str] = {}
    for entry in out.split("\0"):
        if "\t" in entry:
            meta, name = entry.split("\t", 1)
            parts = meta.split()
            blobs[name] = parts[1] if parts[2] == "0" else "unmerged"
    return blobs


def _not_ours(repo: Path, intent: Mapping[str, object], changed: Sequence[str]) -> list[str]:
    """Paths of the main checkout that differ from main's commit in a way the killed merge
    did not make (the user's own changes since): empty when everything is the merge's."""
    base, tree = str(intent["base_tip"]), str(intent["tree"])
    before = set(str(intent.get("status", "")).split("\0"))
    changed_set = set(changed)
    foreign = []
    for entry in _status_all(repo).split("\0"):
        if len(entry) > 3 and entry not in before and entry[3:] not in changed_set:
            foreign.append(entry[3:])
    index = _index_blobs(repo, list(changed))
    for path in changed:
        was, merged = _blob(repo, base, path), _blob(repo, tree, path)
        work_ok = _work_blob(repo, path) in (was, merged) \
            or _half_written(repo, path, merged)
        if index.get(path) not in (was, merged) or not work_ok:
            foreign.append(path)
    return sorted(set(foreign))


def _half_written(repo: Path, path: str, merged: str | None) -> bool:
    """A file git was writing when it was killed: gone (git removes a file before it
    writes the new one), or a start of what the merge writes there."""
    full = repo / path
    if not full.exists() and not full.is_symlink():
        return True
    if merged is None or full.is_symlink() or not full.is_file():
        return False
    try:
        have = full.read_bytes()
    except OSError:
        return False
    proc = subprocess.run(["git", "cat-file", "blob", merged], cwd=repo,
                          capture_output=True, check=False)
    return proc.returncode == 0 and proc.stdout.startswith(have)


def _saved_index(repo: Path) -> Path:
    return merge_intent_file(repo).with_suffix(".index")


def _undo_merge(repo: Path, git_dir: Path, intent: Mapping[str, object],
                changed: Sequence[str]) -> None:
    """Put each path the killed merge changed back as main's commit has it, and the index
    as it was (byte for byte, from the copy taken before the merge); nothing else."""
    base = str(intent["base_tip"])
    in_base = [p for p in changed if _blob(repo, base, p) is not None]
    added = [p for p in changed if p not in in_base]
    saved = _saved_index(repo)
    if saved.is_file():
        tmp = git_dir / "index.fleet-tui.tmp"
        shutil.copyfile(saved, tmp)
        os.replace(tmp, git_dir / "index")
        if in_base:
            _run(repo, "checkout-index", "-f", "-q", "--", *in_base,
                 what="putting main back")
    else:
        if in_base:
            _run(repo, "checkout", "-q", base, "--", *in_base, what="putting main back")
        if added:
            _run(repo, "rm", "-q", "--cached", "--ignore-unmatch", "--", *added,
                 what="putting main back")
    if added:
        for path in added:
            with contextlib.suppress(OSError):
                (repo / path).unlink()
            parent = (repo / path).parent
            while parent != repo and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent


def recover_merge(repo: Path) -> str | None:
    """Finish with a merge into `repo` that was killed midway (its intent record is there):
    main goes back exactly as it was before it, or, when its commit was made, the merge's
    leftovers go (state files, the task's worktree and branch). Call it under the
    repository lock. None when there was nothing to recover; else what was done. Raises
    MergeLeftHalfDone when main holds changes that are not the merge's (the user's): then
    nothing is touched."""
    repo = Path(repo).resolve()
    intent = _read_intent(repo)
    if intent is None:
        return None
    _stop_leftovers(intent.get("token"))
    try:
        branch, side = str(intent["branch"]), str(intent["side"])
        base_tip, tree = str(intent["base_tip"]), str(intent["tree"])
    except KeyError:
        _drop_intent(repo)  # written by nothing fleet-tui knows: the usual checks decide
        return None
    git_dir = _main_git_dir(repo)
    locks = _stale_locks(repo, git_dir, intent)
    if locks:
        raise MergeLeftHalfDone(
            f"a merge of {branch} by fleet-tui was stopped midway and git's lock files "
            f"are still there ({_shown(locks)}, in {git_dir}); if no git command runs in "
            f"{repo}, remove them and merge again")
    merge_head = (git_dir / "MERGE_HEAD").read_text().strip() \
        if (git_dir / "MERGE_HEAD").exists() else None
    head = _rev(repo, "HEAD")
    files_before = intent.get("files")
    files_before = files_before if isinstance(files_before, dict) else {}

    def clear_state() -> None:
        if merge_head is None or merge_head == side:
            for name in _OURS_STATE:
                if files_before.get(name) is None:
                    with contextlib.suppress(OSError):
                        (git_dir / name).unlink(missing_ok=True)

    if head == base_tip:
        if merge_head not in (None, side):
            _drop_intent(repo)  # another merge than ours was started since: not ours
            return None
        changed = _out(repo, "diff-tree", "-r", "-z", "--name-only", "--no-renames",
                       base_tip, tree).split("\0")
        changed = [c for c in changed if c]
        foreign = _not_ours(repo, intent, changed)
        if foreign:
            raise MergeLeftHalfDone(
                f"a merge of {branch} by fleet-tui was stopped midway, and the main "
                f"checkout {repo} has changes that are not that merge's "
                f"({_shown(foreign)}); fleet-tui left it as it is: abort it (`git merge "
                "--abort`, or `git reset --merge`) or finish it (`git commit`), then "
                "merge again")
        _undo_merge(repo, git_dir, intent, changed)
        clear_state()
        orig = files_before.get("ORIG_HEAD")
        if isinstance(orig, str):
            (git_dir / "ORIG_HEAD").write_text(orig)
        elif "ORIG_HEAD" in files_before:
            with contextlib.suppress(OSError):
                (git_dir / "ORIG_HEAD").unlink(missing_ok=True)
        _drop_intent(repo)
        return (f"a merge of {branch} that was stopped midway was undone; the main "
                f"checkout is as it was before it ({base_tip[:10]})")
    if head is not None and _is_ancestor(repo, base_tip, head) and (
            _is_ancestor(repo, side, head)
            or _rev(repo, f"{head}^{{tree}}") == tree):
        clear_state()
        wt = intent.get("worktree")
        with contextlib.suppress(GitError):
            _remove_worktree(repo, Path(wt) if isinstance(wt, str) else None, branch)
            _delete_branch(repo, branch)
        _drop_intent(repo)
        return f"a merge of {branch} that was stopped midway had landed as {head[:10]}"
    _drop_intent(repo)  # main moved on by other hands: the usual checks decide
    return None


class MergeLeftHalfDone(GitError):
    """A merge of fleet-tui's was killed midway and main holds changes that are not its own."""


def _land(repo: Path, plan: _Plan, branch: str, base_branch: str, *, title: str,
          trailers: Mapping[str, str], strategy: str, secrets: Sequence[str],
          test_output: str | None) -> MergeResult:
    """Commit the worker's changes, merge, clean up; under the repository lock."""
    wt = plan.worktree
    if plan.uncommitted and wt is not None:
        checked = _out(repo, "rev-parse", f"{plan.side}^{{tree}}").strip()
        _run(wt, "add", "-A", "--", ".", what="staging the worker's changes")
        _run(wt, *_commit_args(title, trailers), what="committing the worker's changes")
        tip = _out(repo, "rev-parse", f"refs/heads/{branch}").strip()
        if _out(repo, "rev-parse", f"{tip}^{{tree}}").strip() == checked:
            plan = _Plan(plan.base_tip, tip, plan.tree, wt, uncommitted=False)
        else:  # the worktree changed after it was checked: check what was committed
            again = _merge_plan(repo, wt, branch, base_branch, secrets=secrets,
                                strategy=strategy)
            if isinstance(again, _Refused):
                return _refused_result(again, test_output)
            plan = again
    before = _main_state(repo)
    if before.head != plan.base_tip:
        return MergeResult(False, None, (
            f"{base_branch} moved to {before.head[:10]} while the merge was being checked; "
            "nothing was merged, try again"), test_output, reason="moved")
    intent: dict[str, object] = {
        "branch": branch, "base_branch": base_branch, "side": plan.side,
        "base_tip": plan.base_tip, "tree": plan.tree, "strategy": strategy,
        "status": before.status, "pid": os.getpid(), "token": secrets_mod.token_hex(8),
        "at": time.time(),
        "worktree": str(wt) if wt is not None else None,
        "files": {k: (v.decode("utf-8", "replace") if v is not None else None)
                  for k, v in before.files.items()}}
    index = before.git_dir / "index"
    if index.is_file():  # the index as it was: a recovery puts it back byte for byte
        shutil.copyfile(index, _saved_index(repo))
    _write_intent(repo, intent)
    try:
        return _land_merging(repo, plan, branch, base_branch, before, intent, title=title,
                             trailers=trailers, strategy=strategy, test_output=test_output)
    finally:
        _drop_intent(repo)


def _land_merging(repo: Path, plan: _Plan, branch: str, base_branch: str,
                  before: _MainState, intent: dict[str, object], *, title: str,
                  trailers: Mapping[str, str], strategy: str,
                  test_output: str | None) -> MergeResult:
    wt = plan.worktree
    head_title = title.splitlines()[0]
    if strategy == "ff":
        status, out, err = _run_merging(repo, intent, "merge", "--ff-only", "--no-verify",
                                        "--end-of-options", plan.side)
    elif strategy == "merge":
        merge_msg = _with_trailers(f"Merge {branch}: {head_title}", trailers)
        args = ["merge", "--no-ff", "--no-verify", "--no-edit", "-m", merge_msg]
        status, out, err = _run_merging(repo, intent, *args, "--end-of-options", plan.side)
    else:
        status, out, err = _run_merging(repo, intent, "merge", "--squash",
                                        "--end-of-options", plan.side)
        if status == 0:
            status, out, err = _run_merging(repo, intent, *_commit_args(title, trailers))
    if status != 0:
        reason = _merge_failure(err or out)
        _, conflicted, _ = _run(repo, "diff", "--name-only", "--diff-filter=U", check=False)
        restored, problem = _roll_back(repo, before)
        where = ("the main checkout was restored (HEAD, index and files checked)" if restored
                 else f"the main checkout is NOT as it was: {problem}")
        return MergeResult(False, None, (
            f"merging {branch} into {base_branch} failed: {reason}; {where}"), test_output,
            sorted(set(conflicted.split())), reason="failed")
    commit = _out(repo, "rev-parse", "HEAD").strip()
    _remove_worktree(repo, wt, branch)
    _delete_branch(repo, branch)
    return MergeResult(True, commit, f"merged {branch} into {base_branch} as {commit[:10]}",
                       test_output)


def merge(repo: Path, worktree: Path | None, branch: str, base_branch: str, *, message: str,
          trailers: Mapping[str, str] | None = None, test_command: str | None = None,
          strategy: str = "merge", test_timeout: float = 600.0,
          secrets: Sequence[str] = (), expect_side: str | None = None) -> MergeResult:
    """Land a task: check, test, commit its worktree, merge into ``base_branch``, clean up.

    Refuses (merged=False, the reason in ``message``) when git has no identity, when the
    main checkout is dirty or not on ``base_branch``, when there is nothing to merge, on
    conflicts, when the merge would overwrite an untracked or ignored file of the main
    checkout, when the changes hold one of ``secrets`` (the API key), and when the test
    command fails, in that order (the test last); in each case the main checkout is left
    exactly as it was. Everything but the test runs under the repository lock, and all is
    checked again after the test. After a merge the worktree goes first, then the branch.

    ``expect_side`` (the merge queue): merge only if the branch's tip is that commit, the
    worktree has no uncommitted change and the commit contains the base branch's tip, so
    what lands is exactly what was tested (reasons "changed" and "moved" otherwise).
    """
    repo = Path(repo).resolve()
    trailers = dict(trailers or {})
    if strategy not in ("merge", "squash", "ff"):
        raise GitError(f"unknown merge strategy {strategy!r}: use merge, squash or ff")
    title = message.strip() or f"fleet task {branch}"
    what = f"merging {branch} into {base_branch}"

    def check() -> _Plan | _Refused:
        plan = _merge_plan(repo, worktree, branch, base_branch, secrets=secrets,
                           strategy=strategy)
        if expect_side is None or isinstance(plan, _Refused):
            return plan
        if plan.uncommitted or plan.side != expect_side:
            now = "uncommitted changes" if plan.uncommitted else f"its tip is {plan.side[:10]}"
            return _Refused("changed", (
                f"{branch} changed after it was tested ({now}, tested {expect_side[:10]}); "
                "not merged"))
        if not _is_ancestor(repo, plan.base_tip, plan.side):
            return _Refused("moved", (
                f"{base_branch} moved to {plan.base_tip[:10]} after {branch} was brought up "
                "to date and tested; not merged"))
        return plan

    def land(plan: _Plan, test_output: str | None) -> MergeResult:
        return _land(repo, plan, branch, base_branch, title=title, trailers=trailers,
                     strategy=strategy, secrets=secrets, test_output=test_output)

    with _repo_lock(repo, what):
        ensure_excluded(repo)
        stopped = _recovered(repo)
        if stopped is not None:
            return stopped
        plan = check()
        if isinstance(plan, _Refused):
            return _refused_result(plan)
        if not test_command:
            return land(plan, None)
    # The test runs last and without the lock (it may take minutes; other merges and
    # worker starts need not wait); then everything is checked again.
    cwd = plan.worktree if plan.worktree is not None else repo
    passed, test_output = _run_test(test_command, cwd, test_timeout, secrets)
    if not passed:
        return MergeResult(False, None, f"the test command failed in {cwd}; not merged "
                           "(its output is below)", test_output, reason="test")
    with _repo_lock(repo, what):
        stopped = _recovered(repo, test_output)
        if stopped is not None:
            return stopped
        plan = check()
        if isinstance(plan, _Refused):
            return _refused_result(plan, test_output)
        return land(plan, test_output)


def _recovered(repo: Path, test_output: str | None = None) -> MergeResult | None:
    """A merge killed midway, put right before this one (recover_merge); a refusal when
    main holds changes besides it."""
    try:
        done = recover_merge(repo)
    except MergeLeftHalfDone as exc:
        return MergeResult(False, None, str(exc), test_output, reason="checkout")
    if done:
        log.warning("%s: %s", repo, done)
    return None


def discard(repo: Path, worktree: Path | None, branch: str) -> None:
    """Remove a task's worktree, then its branch, without merging. Idempotent."""
    repo = Path(repo).resolve()
    with _repo_lock(repo, f"discarding {branch}"):
        _remove_worktree(repo, Path(worktree) if worktree is not None else None, branch)
        _delete_branch(repo, branch)


# --- where a task stands, bringing it up to date, pushing it (issue 12) -----------------------


def fork_point(worktree: Path, base_commit: str, base_branch: str | None) -> str:
    """The commit a task's changes are measured from: the merge base of its HEAD and its
    base branch's current tip. A task that merged (or rebased onto) its base branch since
    it started is measured from there, so what landed on the base meanwhile never shows as
    the task's own change. ``base_commit`` when there is no base branch (a task started
    from a tag or commit) or git cannot tell (the branch is gone)."""
    if not base_branch:
        return base_commit
    status, out, _ = _run(Path(worktree), "merge-base", f"refs/heads/{base_branch}", "HEAD",
                          check=False)
    found = out.strip()
    return found if status == 0 and _SHA_RE.match(found) else base_commit


UpdateStatus = Literal["current", "updated", "conflicts", "refused"]
UPDATE_RECORD = "before.json"
UPDATE_INDEX = "index"
_MARKER_RE = re.compile(rb"^(?:<{7}|>{7})(?: |$)", re.MULTILINE)


@dataclass
class UpdateResult:
    """What bringing a branch up to date with its base did, or found.

    status: "current" (the branch contains the base's tip already), "updated" (merged or
    rebased cleanly), "conflicts" (the worktree is left mid-merge or mid-rebase with the
    files in ``conflicts``), "refused" (nothing was changed; ``message`` says why)."""

    status: UpdateStatus
    message: str
    conflicts: list[str] = field(default_factory=list)
    base_tip: str | None = None
    head: str | None = None
    committed: str | None = None  # the commit made of the worker's uncommitted work
    operation: str | None = None  # "merge" or "rebase" while conflicted


def operation_in_progress(worktree: Path) -> str | None:
    """"merge" or "rebase" when the worktree is in the middle of one, else None."""
    git_dir = _git_dir_of(Path(worktree))
    if git_dir is None:
        git_dir = _git_path(Path(worktree), ".")
    if (git_dir / "MERGE_HEAD").exists():
        return "merge"
    if (git_dir / "rebase-merge").is_dir() or (git_dir / "rebase-apply").is_dir():
        return "rebase"
    return None


def unmerged_paths(worktree: Path) -> list[str]:
    """Paths with unmerged (conflict) entries in the worktree's index."""
    out = _out(Path(worktree), "ls-files", "--unmerged", "-z", what="git ls-files")
    found = {entry.split("\t", 1)[1] for entry in out.split("\0") if "\t" in entry}
    return sorted(found)


def _with_markers(worktree: Path, candidates: Sequence[str]) -> list[str]:
    """The files among ``candidates`` that still hold conflict markers."""
    found = []
    for rel in candidates:
        try:
            data = (Path(worktree) / rel).read_bytes()
        except OSError:
            continue
        if _MARKER_RE.search(data):
            found.append(rel)
    return found


def _commit_uncommitted(worktree: Path, message: str, trailers: Mapping[str, str]
                        ) -> str | None:
    """Commit everything the worker left uncommitted (untracked files too, ignored ones
    not); the new commit, or None when there was nothing."""
    if not _has_uncommitted(worktree):
        return None
    _run(worktree, "add", "-A", "--", ".", what="staging the worker's changes")
    _run(worktree, *_commit_args(message, trailers), what="committing the worker's changes")
    return _out(worktree, "rev-parse", "HEAD").strip()


def _update_message(op: str, base_branch: str, branch: str, conflicts: Sequence[str]) -> str:
    what = "merging" if op == "merge" else "rebasing onto"
    return (f"{what} {base_branch} stopped on conflicts in {_plural(len(conflicts), 'file')}: "
            f"{_shown(list(conflicts))}; {branch}'s worktree is left mid-{op}: let the worker "
            "resolve it, resolve it in a shell, or abort the update")


def update_from_base(repo: Path, worktree: Path, branch: str, base_branch: str, *,
                     record: Path, strategy: str = "merge", message: str,
                     trailers: Mapping[str, str] | None = None) -> UpdateResult:
    """Bring a task's branch up to date with ``base_branch``'s current tip, in its worktree.

    The worker's uncommitted work is committed first (``message``), then the base is merged
    in (``strategy`` "merge") or the branch rebased onto it ("rebase"). Clean: "updated".
    On conflicts the worktree is left mid-merge (or mid-rebase) with the conflicted files
    listed, and what it was before is kept in the folder ``record`` so that
    ``abort_update`` puts it back exactly (HEAD, index, files). Refused, changing nothing:
    a worktree that is mid-merge already, git without an identity, a base branch that does
    not exist, and files the update would write over that exist ignored in the worktree.
    The main checkout is never touched (only the repository lock is taken, so that no
    merge moves the base branch meanwhile)."""
    repo = Path(repo).resolve()
    wt = Path(worktree)
    if strategy not in ("merge", "rebase"):
        raise GitError(f"unknown update strategy {strategy!r}: use merge or rebase")
    verify_worktree(wt, branch)
    op = operation_in_progress(wt)
    if op is not None:
        conflicts = unmerged_paths(wt)
        return UpdateResult("conflicts", _update_message(op, base_branch, branch, conflicts),
                            conflicts, operation=op)
    problem = check_identity(wt)
    if problem:
        return UpdateResult("refused", problem)
    with _repo_lock(repo, f"updating {branch} from {base_branch}"):
        base_tip = _rev(repo, f"refs/heads/{base_branch}")
        if base_tip is None:
            return UpdateResult("refused", f"the base branch {base_branch!r} does not exist "
                                f"in {repo}; nothing to update from")
        head = _out(wt, "rev-parse", "HEAD").strip()
        uncommitted = _has_uncommitted(wt)
        if _is_ancestor(wt, base_tip, head):
            committed = _commit_uncommitted(wt, message, dict(trailers or {}))
            note = " (the worker's uncommitted work was committed)" if committed else ""
            return UpdateResult("current", f"{branch} is up to date with {base_branch} "
                                f"({base_tip[:10]}) already{note}", base_tip=base_tip,
                                head=committed or head, committed=committed)
        # What the update would write, checked before anything changes: a file it adds
        # that exists ignored in the worktree would be overwritten without a word.
        side = _snapshot_commit(wt) if uncommitted else head
        tree, _ = _merge_tree(wt, side, base_tip)
        blocked = _in_the_way(wt, _tree_changes(wt, side, tree))
        if blocked:
            return UpdateResult("refused", (
                f"bringing {branch} up to date would overwrite "
                f"{_plural(len(blocked), 'ignored file')} of its worktree {wt}: "
                f"{_shown(blocked)}; move them away, then update again"), base_tip=base_tip)
        _save_update_record(wt, record, head=head, base_tip=base_tip, strategy=strategy)
        committed = _commit_uncommitted(wt, message, dict(trailers or {}))
        if strategy == "merge":
            args = ["merge", "--no-verify", "--no-edit", "-m",
                    f"Merge {base_branch} ({base_tip[:10]}) into {branch}", "--end-of-options",
                    base_tip]
        else:
            args = ["rebase", "--no-verify", "--no-autostash", base_tip]
        status, out, err = _run(wt, *args, env={"GIT_EDITOR": "true"}, check=False)
        if status == 0:
            _drop_update_record(record)
            new_head = _out(wt, "rev-parse", "HEAD").strip()
            done = "merged into" if strategy == "merge" else "rebased onto"
            return UpdateResult("updated", f"{base_branch} ({base_tip[:10]}) {done} {branch}",
                                base_tip=base_tip, head=new_head, committed=committed)
        conflicts = unmerged_paths(wt)
        op = operation_in_progress(wt)
        if conflicts and op is not None:
            return UpdateResult("conflicts", _update_message(op, base_branch, branch,
                                                             conflicts),
                                conflicts, base_tip=base_tip, committed=committed,
                                operation=op)
        reason = _merge_failure(err or out)
        restored = abort_update(wt, record)
        return UpdateResult("refused", f"updating {branch} from {base_branch} failed: "
                            f"{reason}; {restored}", base_tip=base_tip)


def _save_update_record(worktree: Path, record: Path, *, head: str, base_tip: str,
                        strategy: str) -> None:
    """Keep what abort_update needs to put the worktree back: HEAD, the index's bytes and
    what `git status` said (the check that it was put back)."""
    record.mkdir(parents=True, exist_ok=True, mode=paths.PRIVATE_DIR)
    index = _git_path(worktree, "index")
    saved = record / UPDATE_INDEX
    if index.exists():
        shutil.copyfile(index, saved)
        paths.make_private(saved, paths.PRIVATE_FILE)
    else:
        saved.unlink(missing_ok=True)
    git_dir = _main_git_dir(worktree)
    state: dict[str, str | None] = {}
    for name in _MERGE_STATE_FILES:
        try:
            state[name] = (git_dir / name).read_bytes().decode("utf-8", "surrogateescape")
        except OSError:
            state[name] = None
    data = {"head": head, "base_tip": base_tip, "strategy": strategy,
            "status": _status_all(worktree), "index": index.exists(), "state": state}
    tmp = record / (UPDATE_RECORD + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                 paths.PRIVATE_FILE)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(tmp, record / UPDATE_RECORD)


def _read_update_record(record: Path) -> dict[str, object] | None:
    try:
        data = json.loads((record / UPDATE_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("head"), str) else None


def _drop_update_record(record: Path) -> None:
    for name in (UPDATE_RECORD, UPDATE_INDEX, UPDATE_RECORD + ".tmp"):
        with contextlib.suppress(OSError):
            (record / name).unlink()
    with contextlib.suppress(OSError):
        record.rmdir()


def abort_update(worktree: Path, record: Path) -> str:
    """Undo an update that stopped on conflicts: abort the merge (or rebase), take back the
    commit of the worker's uncommitted work, put the index back byte for byte. Returns what
    was done ("the worktree was put back as it was (HEAD, index and files checked)");
    GitError when there is no update to abort or the worktree could not be put back."""
    wt = Path(worktree)
    before = _read_update_record(record)
    op = operation_in_progress(wt)
    if op is None and before is None:
        raise GitError(f"the worktree {wt} is not in the middle of an update; nothing to "
                       "abort")
    if op == "merge":
        _run(wt, "merge", "--abort", what="git merge --abort")
    elif op == "rebase":
        _run(wt, "rebase", "--abort", what="git rebase --abort")
    if before is None:
        return f"the {op} was aborted (no record of the worktree before it: not checked)"
    head = str(before["head"])
    _run(wt, "reset", "-q", "--soft", head, what="taking back the commit of the worker's work")
    index = _git_path(wt, "index")
    saved = record / UPDATE_INDEX
    if before.get("index") and saved.exists():
        tmp = index.with_name("index.fleet-tmp")
        shutil.copyfile(saved, tmp)
        os.replace(tmp, index)
    elif not before.get("index"):
        index.unlink(missing_ok=True)
    saved_state = before.get("state")
    if isinstance(saved_state, dict):  # ORIG_HEAD and the like, as they were
        _put_back(_main_git_dir(wt), {
            str(k): (v.encode("utf-8", "surrogateescape") if isinstance(v, str) else None)
            for k, v in saved_state.items() if k in _MERGE_STATE_FILES})
    problems = []
    now_head = _rev(wt, "HEAD")
    if now_head != head:
        problems.append(f"HEAD is {now_head[:10] if now_head else 'unreadable'}, not "
                        f"{head[:10]}")
    status = _status_all(wt)
    if status != before.get("status"):
        changed = sorted(set(status.split("\0")) ^ set(str(before.get("status")).split("\0")))
        problems.append(f"`git status` shows {_shown([c for c in changed if c], 3)}")
    if problems:
        raise GitError(f"the worktree {wt} was not put back exactly: {'; '.join(problems)}; "
                       f"look at `git status` there (the saved index is in {record})")
    _drop_update_record(record)
    return "the worktree was put back as it was (HEAD, index and files checked)"


def conclude_update(worktree: Path, record: Path, *, base_branch: str, branch: str,
                    conflicted: Sequence[str] = ()) -> UpdateResult:
    """After the worker (or the user in a shell) worked on an update's conflicts: done
    when the merge or rebase was concluded; when every conflicted file (``conflicted``,
    and whatever the index still has unmerged) is free of conflict markers it is concluded
    here (the files staged, the merge committed, the rebase continued: it may stop again on
    a later commit); else still "conflicts"."""
    wt = Path(worktree)
    before = _read_update_record(record)
    base_tip = str(before["base_tip"]) if before and before.get("base_tip") else None
    for _ in range(1000):  # a rebase continues commit by commit
        op = operation_in_progress(wt)
        if op is None:
            _drop_update_record(record)
            head = _out(wt, "rev-parse", "HEAD").strip()
            if base_tip is not None and not _is_ancestor(wt, base_tip, head):
                # the merge was aborted (or undone) in the worktree instead of concluded
                return UpdateResult("refused", (
                    f"the update of {branch} was abandoned in its worktree (the merge was "
                    f"aborted or undone there), so it is not up to date with {base_branch}; "
                    "update it again"), base_tip=base_tip, head=head)
            return UpdateResult("updated", f"{branch} is up to date with {base_branch} "
                                "(the conflicts were resolved)", base_tip=base_tip, head=head)
        unmerged = unmerged_paths(wt)
        marked = _with_markers(wt, sorted(set(unmerged) | set(conflicted)))
        if marked:
            return UpdateResult("conflicts", _update_message(op, base_branch, branch, marked),
                                marked, base_tip=base_tip, operation=op)
        _run(wt, "add", "-A", "--", ".", what="staging the resolved files")
        if op == "merge":
            status, out, err = _run(wt, "commit", "--no-edit", "--no-verify", "-q",
                                    check=False)
        else:
            status, out, err = _run(wt, "rebase", "--continue", env={"GIT_EDITOR": "true"},
                                    check=False)
        if status != 0 and operation_in_progress(wt) == op and not unmerged_paths(wt):
            raise GitError(f"concluding the {op} in {wt} failed: "
                           f"{_first_line(err) or _first_line(out)}")
    raise GitError(f"the rebase in {wt} did not end; look at `git status` there")


def update_record_exists(record: Path) -> bool:
    return (record / UPDATE_RECORD).exists()


# --- pushing a task's branch -------------------------------------------------------------------


@dataclass
class PushResult:
    """A pushed branch: where it went and what it holds."""

    remote: str
    remote_branch: str  # the branch's name on the remote ("fleet/<id>")
    commit: str
    message: str
    committed: str | None = None  # the commit made of the worker's uncommitted work
    hook_output: str | None = None  # what the pull-request hook (pr_command) printed
    hook_passed: bool | None = None


def push_remote(repo: Path, base_branch: str | None) -> str | None:
    """The remote a task's branch goes to: the base branch's upstream remote, else
    `origin`, else the only remote; None when there is none (or several and no rule)."""
    repo = Path(repo)
    if base_branch:
        status, out, _ = _run(repo, "config", "--get", f"branch.{base_branch}.remote",
                              check=False)
        name = out.strip()
        if status == 0 and name and name != ".":
            return name
    remotes = [r for r in _out(repo, "remote").split() if r]
    if "origin" in remotes:
        return "origin"
    return remotes[0] if len(remotes) == 1 else None


def push_branch(repo: Path, worktree: Path | None, branch: str, remote_branch: str, *,
                remote: str, base_branch: str | None, base_commit: str, message: str,
                trailers: Mapping[str, str] | None = None, secrets: Sequence[str] = (),
                expect_remote: str | None = None, timeout: float = 300.0) -> PushResult:
    """Push ``branch`` (its worktree's uncommitted work committed first) to ``remote`` as
    ``remote_branch``. Refused (GitError, nothing committed or pushed) when the changes or
    the branch's commits hold one of ``secrets``. ``expect_remote``: the commit the remote
    branch had at our last push; the push may replace it (a rebased branch) but nothing
    else (--force-with-lease). Git never prompts (GIT_TERMINAL_PROMPT=0)."""
    repo = Path(repo).resolve()
    wt = _worktree_of(repo, worktree, branch)
    tip = _rev(repo, f"refs/heads/{branch}")
    if tip is None:
        raise GitError(f"the task branch {branch} does not exist (discarded or merged?)")
    side = tip
    if wt is not None:
        verify_worktree(wt, branch)
        if operation_in_progress(wt):
            raise GitError(f"the worktree {wt} is in the middle of an update from its base; "
                           "resolve or abort it first")
        if _has_uncommitted(wt):
            side = _snapshot_commit(wt)
    needles = _needles(secrets)
    if needles:
        base = _rev(repo, f"refs/heads/{base_branch}") if base_branch else None
        start = _out(repo, "merge-base", base, side).strip() if base else base_commit
        changes = _tree_changes(repo, start, _out(repo, "rev-parse",
                                                  f"{side}^{{tree}}").strip())
        in_result, in_history = _secret_hits(repo, start, side, changes, needles,
                                             history=True)
        if in_result or in_history:
            where = _shown(in_result or in_history)
            raise GitError(f"the changes of {branch} contain the API key ({where}); not "
                           "pushed: remove it from the files and the branch's commits first")
    committed = None
    if wt is not None:
        problem = check_identity(wt)
        if problem and side != tip:
            raise GitError(problem)
        committed = _commit_uncommitted(wt, message, dict(trailers or {}))
    commit = _out(repo, "rev-parse", f"refs/heads/{branch}").strip()
    args = ["push", "--porcelain", "--no-verify"]
    if expect_remote:
        args.append(f"--force-with-lease=refs/heads/{remote_branch}:{expect_remote}")
    args += ["--end-of-options", remote, f"{commit}:refs/heads/{remote_branch}"]
    status, out, err = _run(repo, *args, check=False, timeout=timeout,
                            env={"GIT_TERMINAL_PROMPT": "0"})
    if status != 0:
        rejected = _push_rejected(out)
        if rejected is not None:
            raise GitError(
                f"not pushed: {remote}'s branch {remote_branch} has commits that are not this "
                f"task's ({rejected}: someone else pushed to it, or the task's branch was "
                f"reset since its last push). Look at them (`git fetch {remote} "
                f"{remote_branch}`, `git log FETCH_HEAD`); then delete that branch "
                f"(`git push {remote} --delete {remote_branch}`) and push again, or bring "
                "its commits into the task by hand")
        reason = _first_line(err) or _first_line(out) or f"exit status {status}"
        raise GitError(f"pushing {branch} to {remote} failed: {reason}")
    return PushResult(remote=remote, remote_branch=remote_branch, commit=commit,
                      message=f"pushed {branch} to {remote} as {remote_branch} "
                              f"({commit[:10]})", committed=committed)


def _push_rejected(porcelain: str) -> str | None:
    """Why `git push --porcelain` refused our ref because the remote's has other commits
    (non-fast-forward, fetch first, a stale lease), or None for any other failure."""
    for line in porcelain.splitlines():
        fields = line.split("\t")
        if len(fields) >= 3 and fields[0] == "!":
            summary = fields[2].strip()
            if any(word in summary for word in ("non-fast-forward", "fetch first",
                                                "stale info")):
                return summary
    return None


def head_commit(worktree: Path) -> str:
    """The commit checked out in a worktree."""
    return _out(Path(worktree), "rev-parse", "HEAD").strip()


def landed(repo: Path, commit: str, base_branch: str) -> str | None:
    """The base branch's tip when ``commit`` has landed in it (it is an ancestor of the
    tip, or the tip has its very tree: a squash), else None."""
    tip = _rev(Path(repo), f"refs/heads/{base_branch}")
    if tip is None:
        return None
    if _is_ancestor(Path(repo), commit, tip):
        return tip
    tree = _rev(Path(repo), f"{commit}^{{tree}}")
    return tip if tree is not None and tree == _rev(Path(repo), f"{tip}^{{tree}}") else None


def landed_task(repo: Path, base_branch: str, task_id: str) -> str | None:
    """The commit of ``base_branch`` whose `Fleet-Task` trailer names ``task_id`` (the
    task's merge, whoever concluded it: fleet-tui, or the user after a merge stopped
    midway), else None."""
    status, out, _ = _run(Path(repo), "log", "--first-parent", "-F",
                          f"--grep=Fleet-Task: {task_id}",
                          "--format=%H %(trailers:key=Fleet-Task,valueonly,separator=%x2C)",
                          f"refs/heads/{base_branch}", "--", check=False)
    if status != 0:
        return None
    for line in out.splitlines():
        commit, _, names = line.partition(" ")
        if task_id in (n.strip() for n in names.split(",")):
            return commit
    return None


def run_test_command(command: str, cwd: Path, timeout: float = 600.0,
                     secrets: Sequence[str] = (),
                     extra_env: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """The merge's test gate on its own (the merge queue, the pull-request hook): run
    ``command`` in a shell in ``cwd``; (passed, the tail of its output)."""
    return _run_test(command, Path(cwd), timeout, secrets, extra_env)
