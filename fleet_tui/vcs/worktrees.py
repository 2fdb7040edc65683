"""A task's worktree ``.fleet-work/<id>`` on its branch ``fleet/<id>``: the base it starts
from, creating it, checking its branch out again, the guard that a worker never runs in the
main checkout (``verify_worktree``), removing it, and discarding a task."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from fleet_tui.system import paths
from fleet_tui.system.gitplumbing import first_line as _first_line
from fleet_tui.vcs.gitfiles import (
    _SHA_RE,
    _branch_exists_fast,
    _common_dir,
    _git_dir_of,
    _head_from_files,
    _ref_from_files,
)
from fleet_tui.vcs.repository import _ensure_excluded_once, _repo_lock
from fleet_tui.vcs.run import (
    GitError,
    _branch_exists,
    _git_path,
    _out,
    _rev,
    _run,
    current_branch,
)

_TASK_ID_RE = re.compile(r"^[0-9a-z][0-9a-z_-]{0,63}$")


@dataclass(frozen=True)
class WorktreeInfo:
    """A task's worktree: where, on which branch, and what it started from."""

    path: Path
    branch: str
    base_commit: str
    base_branch: str | None  # None when the base was a detached HEAD or a non-branch ref


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


def branch_tip(repo: Path, branch: str) -> str:
    """The commit a branch of the repository is at (GitError: there is no such branch).
    Git's files first (no process: ranking copies asks it per copy), git if unsure."""
    git_dir = _git_dir_of(Path(repo))
    if git_dir is not None:
        known, sha = _ref_from_files(_common_dir(git_dir), f"refs/heads/{branch}")
        if known and sha is not None:
            return sha
    tip = _rev(Path(repo), f"refs/heads/{branch}")
    if tip is None:
        raise GitError(f"the branch {branch!r} does not exist in {repo}")
    return tip


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


def _worktree_of(repo: Path, worktree: Path | None, branch: str) -> Path | None:
    """The task's worktree: the folder given when it is there, else wherever git has the
    branch checked out (None: nowhere)."""
    if worktree is not None and Path(worktree).is_dir():
        return Path(worktree)
    return _registered_worktree(repo, branch=branch)


def discard(repo: Path, worktree: Path | None, branch: str) -> None:
    """Remove a task's worktree, then its branch, without merging. Idempotent."""
    repo = Path(repo).resolve()
    with _repo_lock(repo, f"discarding {branch}"):
        _remove_worktree(repo, Path(worktree) if worktree is not None else None, branch)
        _delete_branch(repo, branch)


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


def head_commit(worktree: Path) -> str:
    """The commit checked out in a worktree (from git's files when they tell)."""
    head = _head_from_files(Path(worktree))
    if head is not None:
        return head[0]
    return _out(Path(worktree), "rev-parse", "HEAD").strip()

