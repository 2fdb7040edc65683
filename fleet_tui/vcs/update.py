"""Bringing a task's branch up to date with its base in its worktree (merge or rebase),
and the way out of an update that stopped on conflicts: abort it (the worktree put back
exactly, from the record kept before it) or conclude it once the conflicts are resolved.
The main checkout is never touched."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from fleet_tui.system import paths
from fleet_tui.system.gitplumbing import first_line as _first_line
from fleet_tui.system.gitplumbing import in_the_way as _in_the_way
from fleet_tui.system.gitplumbing import put_index_back as _put_index_back
from fleet_tui.system.gitplumbing import shown as _shown
from fleet_tui.system.gitplumbing import with_markers as _with_markers
from fleet_tui.vcs.commits import (
    _commit_uncommitted,
    _has_uncommitted,
    _snapshot_commit,
    check_identity,
)
from fleet_tui.vcs.gitfiles import _main_git_dir
from fleet_tui.vcs.merging import (
    _MERGE_STATE_FILES,
    _merge_failure,
    _merge_tree,
    _put_back,
    _tree_changes,
)
from fleet_tui.vcs.repository import _repo_lock
from fleet_tui.vcs.run import (
    GitError,
    _git_path,
    _is_ancestor,
    _out,
    _plural,
    _rev,
    _run,
    _status_all,
)
from fleet_tui.vcs.worktrees import operation_in_progress, verify_worktree

UpdateStatus = Literal["current", "updated", "conflicts", "refused"]
UPDATE_RECORD = "before.json"
UPDATE_INDEX = "index"


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


def unmerged_paths(worktree: Path) -> list[str]:
    """Paths with unmerged (conflict) entries in the worktree's index."""
    out = _out(Path(worktree), "ls-files", "--unmerged", "-z", what="git ls-files")
    found = {entry.split("\t", 1)[1] for entry in out.split("\0") if "\t" in entry}
    return sorted(found)


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
        _note_work(record, committed or head)
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


def _note_work(record: Path, work: str) -> None:
    """Add to the record the commit that holds the worker's work as it was before the
    update (its uncommitted work committed): what abort goes back to when the worker
    concluded the merge or rebase itself."""
    data = _read_update_record(record)
    if data is None:
        return
    data["work"] = work
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
    work = before.get("work")
    if op is None and isinstance(work, str) and _rev(wt, "HEAD") != work:
        # the worker concluded the update itself: back to its work as it was (refused,
        # keeping everything, when files changed since would be overwritten)
        code, out, err = _run(wt, "reset", "-q", "--keep", work, check=False)
        if code != 0:
            raise GitError(f"the update in {wt} was concluded there and cannot be taken "
                           f"back without losing changes made since: "
                           f"{_first_line(err) or _first_line(out)}; commit or stash them "
                           "in the worktree, then abort again")
    _run(wt, "reset", "-q", "--soft", head, what="taking back the commit of the worker's work")
    _put_index_back(_git_path(wt, "index"), record / UPDATE_INDEX, bool(before.get("index")))
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
            head = _out(wt, "rev-parse", "HEAD").strip()
            marked = _with_markers(wt, conflicted)
            if marked and base_tip is not None and _is_ancestor(wt, base_tip, head):
                # concluded, but with the markers in: not resolved (the record is kept, so
                # that the update can still be aborted back to before it)
                return UpdateResult("conflicts", (
                    f"the {_update_noun(before)} of {branch} was concluded with conflict "
                    f"markers still in {_plural(len(marked), 'file')}: {_shown(marked)}; "
                    "resolve them and commit (or let the worker), or abort the update"),
                    marked, base_tip=base_tip, head=head)
            _drop_update_record(record)
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


def _update_noun(before: Mapping[str, object] | None) -> str:
    return "rebase" if before and before.get("strategy") == "rebase" else "merge"


def update_record_exists(record: Path) -> bool:
    return (record / UPDATE_RECORD).exists()

