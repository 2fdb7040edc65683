"""A worktree brought up to date with its base on the host (merge or rebase, the worker's
uncommitted work kept; left mid-merge on conflicts for its worker), and that undone: what
the SSH agent's `update`/`abort-update` and the Ray job's update job run. Standard library
only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from fleet_tui.execution.worker.runs import answer, stdin_json
from fleet_tui.execution.worker.worktrees import git, ident
from fleet_tui.system.gitplumbing import (
    GitError,
    in_the_way,
    merge_tree,
    put_index_back,
    shown,
    snapshot_commit,
    tree_changes,
)
from fleet_tui.system.gitplumbing import with_markers as _marked

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

def _operation(path: str) -> str | None:
    """"merge" or "rebase" while one is stopped in the worktree, else None."""
    for name, what in (("rebase-merge", "rebase"), ("rebase-apply", "rebase"),
                       ("MERGE_HEAD", "merge")):
        found = git("-C", path, "rev-parse", "--path-format=absolute", "--git-path", name)
        if os.path.exists(found):
            return what
    return None


def _unmerged(path: str) -> list[str]:
    out = git("-C", path, "diff", "--name-only", "--diff-filter=U")
    return sorted({line for line in out.splitlines() if line})


def _is_ancestor(path: str, ancestor: str, commit: str) -> bool:
    return subprocess.run(["git", "-C", path, "merge-base", "--is-ancestor", ancestor, commit],
                          capture_output=True, check=False).returncode == 0


def _with_markers(path: str, names: list[str]) -> list[str]:
    """The files among `names` that still hold conflict markers."""
    return _marked(Path(path), sorted(set(names)))


def _ignored_in_the_way(path: Path, uncommitted: bool, base: str) -> list[str]:
    """The files an update from `base` would write over that are ignored in the worktree
    (`git merge` overwrites them without a word): worked out before anything changes, on a
    snapshot of the uncommitted work, the same check as a local worktree's update."""
    try:
        side = snapshot_commit(path) if uncommitted else git("-C", str(path), "rev-parse",
                                                               "HEAD")
        tree, _ = merge_tree(path, side, base)
        return in_the_way(path, tree_changes(path, side, tree))
    except GitError as exc:
        raise RuntimeError(str(exc)) from exc


def update(path: str, base: str, strategy: str, message: str,
            conflicted: list[str] | None = None) -> dict[str, Any]:
    """`conflicted`: the files an earlier update of this worktree stopped on (the engine
    keeps them): a file the worker staged, or committed, with its markers still in is not
    resolved."""
    conflicted = conflicted or []
    operation = _operation(path)
    if operation is not None:  # stopped on conflicts before: concluded once resolved
        unmerged = _unmerged(path)
        if unmerged:
            return {"status": "conflicts", "conflicts": unmerged, "operation": operation}
        changed = git("-C", path, "diff", "--name-only", "HEAD").splitlines()
        marked = _with_markers(path, conflicted + changed)
        if marked:
            return {"status": "conflicts", "conflicts": marked, "operation": operation}
        git("-C", path, "add", "-A", "--", ".")
        if operation == "merge":
            git("-C", path, "commit", "--no-verify", "-q", "--no-edit")
        else:
            git("-C", path, "-c", "core.editor=true", "rebase", "--continue")
        _drop_record(path)
        return {"status": "updated", "resolved": True,
                "head": git("-C", path, "rev-parse", "HEAD")}
    if conflicted:  # the worker concluded it itself: with the markers still in?
        marked = _with_markers(path, conflicted)
        if marked:
            return {"status": "conflicts", "conflicts": marked, "operation": None,
                    "concluded": True}
    uncommitted = bool(git("-C", path, "status", "--porcelain", "--untracked-files=all"))
    head = git("-C", path, "rev-parse", "HEAD")
    if not _is_ancestor(path, base, head):
        blocked = _ignored_in_the_way(Path(path), uncommitted, base)
        if blocked:
            many = "file" if len(blocked) == 1 else "files"
            return {"status": "refused", "error": (
                f"bringing {git('-C', path, 'branch', '--show-current') or 'the branch'} "
                f"up to date would overwrite {len(blocked)} ignored {many} of its worktree "
                f"{path}: {shown(blocked)}; move them away, then update again")}
    if not _is_ancestor(path, base, head):
        _save_record(path, head)
    committed = None
    if uncommitted:
        git("-C", path, "add", "-A", "--", ".")
        git("-C", path, "commit", "--no-verify", "-q", "-m", message)
        committed = git("-C", path, "rev-parse", "HEAD")
    head = git("-C", path, "rev-parse", "HEAD")
    if _is_ancestor(path, base, head):
        _drop_record(path)  # an earlier update the worker concluded: nothing to abort now
        return {"status": "current", "head": head, "committed": committed}
    if strategy == "rebase":
        args = ["-c", "core.editor=true", "rebase", base]
    else:
        args = ["merge", "--no-verify", "--no-edit", "-m", message, base]
    done = subprocess.run(["git", "-C", path, *args], capture_output=True, text=True,
                          check=False)
    if done.returncode == 0:
        _drop_record(path)
        return {"status": "updated", "head": git("-C", path, "rev-parse", "HEAD"),
                "committed": committed}
    operation = _operation(path)
    unmerged = _unmerged(path)
    if operation is not None and unmerged:
        return {"status": "conflicts", "conflicts": unmerged, "operation": operation,
                "committed": committed}
    if operation is not None:
        git("-C", path, operation, "--abort")
    _restore_record(path)
    lines = (done.stderr or done.stdout).strip().splitlines()
    return {"status": "refused", "error": lines[-1] if lines else f"git {args[0]} failed"}


# The worktree as it was before an update (its HEAD, and its index copied byte for byte),
# kept in its git dir until the update is done, so that aborting it puts the worker's
# uncommitted work back as it was, as a local worktree's abort does (vcs/update.py).
_RECORD = "fleet-tui-update.json"
_RECORD_INDEX = "fleet-tui-update.index"


def _git_path(path: str, name: str) -> Path:
    return Path(git("-C", path, "rev-parse", "--path-format=absolute", "--git-path", name))


def _save_record(path: str, head: str) -> None:
    index = _git_path(path, "index")
    had_index = index.exists()
    if had_index:
        shutil.copyfile(index, _git_path(path, _RECORD_INDEX))
    record = _git_path(path, _RECORD)
    tmp = record.with_name(record.name + ".tmp")
    tmp.write_text(json.dumps({"head": head, "index": had_index}))
    os.replace(tmp, record)


def _drop_record(path: str) -> None:
    for name in (_RECORD, _RECORD_INDEX):
        _git_path(path, name).unlink(missing_ok=True)


def _restore_record(path: str) -> bool:
    """Back to the HEAD and index of before the update (its merge or rebase aborted
    already); the files of the worktree are the worker's as they were. False without a
    record."""
    try:
        before = json.loads(_git_path(path, _RECORD).read_text())
    except (OSError, ValueError):
        return False
    git("-C", path, "reset", "-q", "--soft", str(before["head"]))
    put_index_back(_git_path(path, "index"), _git_path(path, _RECORD_INDEX),
                    bool(before.get("index")))
    _drop_record(path)
    return True


def cmd_update(path: str, base: str, strategy: str, message: str, name: str,
               email: str) -> int:
    ident(name, email)
    order = stdin_json() or {}
    try:
        answer(update(path, base, strategy, message, order.get("conflicted")))
    except RuntimeError as exc:
        answer({"error": str(exc)})
        return 1
    return 0


def abort_update(path: str, conflicted: list[str]) -> dict[str, Any]:
    """The merge or rebase an update stopped on undone (`git merge --abort`), then the HEAD
    and index of before the update put back from its record: the worktree at the task's
    tip, the worker's uncommitted work as it was. {"error": ...} when the update was
    concluded with conflict markers still in (a commit, nothing to abort) or git failed.
    A Ray node's abort job runs it too."""
    try:
        operation = _operation(path)
        marked = _with_markers(path, conflicted) if operation is None else []
        if marked:  # concluded with the markers in: a commit, not an update to abort
            return {"error": "the update was concluded with conflict markers still in "
                             f"{', '.join(marked)}: there is nothing to abort; resolve them "
                             "there (or let its worker: update --resolve worker)"}
        if operation is not None:
            git("-C", path, operation, "--abort")
        restored = _restore_record(path)
        return {"aborted": operation, "restored": restored,
                "head": git("-C", path, "rev-parse", "HEAD")}
    except RuntimeError as exc:
        return {"error": str(exc)}


def cmd_abort_update(path: str) -> int:
    order = stdin_json() or {}
    said = abort_update(path, order.get("conflicted") or [])
    answer(said)
    return 1 if "error" in said else 0
