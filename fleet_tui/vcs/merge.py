"""Landing a task: the conflict preview and the merge into its base branch, and finding
a task's commit in the base afterwards (``landed``, ``landed_task``).

Both make the same checks, cheapest first, and change nothing when they refuse
(``_checked_plan``); the merge runs the test command last, outside the repository lock,
then checks again and merges under it. A failed `git merge` is rolled back only against
the HEAD it started from; a merge killed midway is put right by ``recovery``."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from fleet_tui.system import paths
from fleet_tui.system.gitplumbing import in_the_way as _in_the_way
from fleet_tui.system.gitplumbing import shown as _shown
from fleet_tui.vcs import repolock
from fleet_tui.vcs.commits import (
    _commit_args,
    _has_uncommitted,
    _snapshot_commit,
    _with_trailers,
    check_identity,
)
from fleet_tui.vcs.gitfiles import _main_git_dir
from fleet_tui.vcs.keyscan import _needles, _redact, _secret_hits
from fleet_tui.vcs.merging import (
    _MERGE_STATE_FILES,
    _merge_failure,
    _merge_tree,
    _put_back,
    _tree_changes,
)
from fleet_tui.vcs.recovery import (
    MergeLeftHalfDone,
    _drop_intent,
    _run_merging,
    _saved_index,
    _write_intent,
    merge_intent_file,
    recover_merge,
)
from fleet_tui.vcs.repository import _lock_file, _repo_lock, ensure_excluded
from fleet_tui.vcs.run import (
    GitError,
    _is_ancestor,
    _out,
    _plural,
    _rev,
    _run,
    _status_all,
    current_branch,
)
from fleet_tui.vcs.testcommand import _run_test
from fleet_tui.vcs.worktrees import _delete_branch, _remove_worktree, _worktree_of, verify_worktree

Strategy = Literal["merge", "squash"]
log = logging.getLogger("fleet_tui.vcs.git")  # the area's one logger, under its old name


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
    refusal = _main_refusal(repo, base_branch)
    if refusal is not None:
        return refusal
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
    plan = _Plan(base_tip=base_tip, side=side, tree=tree, worktree=wt,
                 uncommitted=uncommitted)
    return _result_refusal(repo, plan, branch, base_branch, secrets=secrets,
                           strategy=strategy) or plan


def _main_refusal(repo: Path, base_branch: str) -> _Refused | None:
    """Why the main checkout cannot take a merge now, if it cannot: git has no identity to
    commit with, main is not on the base branch, another merge is under way, a merge (or
    rebase, ...) of the user's is in progress, or main has uncommitted changes."""
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
    return None


def _result_refusal(repo: Path, plan: _Plan, branch: str, base_branch: str, *,
                    secrets: Sequence[str], strategy: str) -> _Refused | None:
    """Why what a clean merge would write must not land, if it must not: it would overwrite
    untracked or ignored files of the main checkout, or it (or, for a real merge, the
    branch's history that comes with it) holds the key."""
    changes = _tree_changes(repo, plan.base_tip, plan.tree)
    blocked = _in_the_way(repo, changes)
    if blocked:
        them = "it" if len(blocked) == 1 else "them"
        files = _plural(len(blocked), "untracked or ignored file")
        return _Refused("overwrite", (
            f"merging {branch} would overwrite {files} of the main checkout {repo}: "
            f"{_shown(blocked)}; move {them} away (or commit {them}), then merge again"),
            blocked, plan.uncommitted)
    needles = _needles(secrets)
    if not needles:
        return None
    in_result, in_history = _secret_hits(repo, plan.base_tip, plan.side, changes, needles,
                                         history=strategy == "merge")
    if in_result:
        return _Refused("secret", (
            f"the changes of {branch} contain the API key in: {_shown(in_result)}; "
            "remove it before merging"), in_result, plan.uncommitted)
    if in_history:
        return _Refused("secret", (
            f"an earlier commit of {branch} contains the API key in: "
            f"{_shown(in_history)}; a merge would copy it into the history of "
            f"{base_branch}: remove it from the branch's commits, or discard the task"),
            in_history, plan.uncommitted)
    return None


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


def _refused_result(refusal: _Refused, test_output: str | None = None) -> MergeResult:
    return MergeResult(False, None, refusal.message, test_output,
                       refusal.paths if refusal.kind == "conflicts" else [],
                       reason=refusal.kind)


@dataclass
class _MainState:
    """The main checkout just before `git merge`: what a rollback must give back."""

    git_dir: Path
    head: str
    status: str
    files: dict[str, bytes | None]


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
    import secrets as secrets_mod  # here: hmac, hashlib and random, for a merge alone

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

