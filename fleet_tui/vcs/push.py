"""Pushing a task's branch to a remote: which remote, the key scan of the changes and
the branch's commits first, and a lease so a push replaces only what our last one left."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fleet_tui.system.gitplumbing import first_line as _first_line
from fleet_tui.system.gitplumbing import shown as _shown
from fleet_tui.vcs.commits import (
    _commit_uncommitted,
    _has_uncommitted,
    _snapshot_commit,
    check_identity,
)
from fleet_tui.vcs.keyscan import _needles, _secret_hits
from fleet_tui.vcs.merging import _tree_changes
from fleet_tui.vcs.run import GitError, _out, _rev, _run
from fleet_tui.vcs.worktrees import _worktree_of, operation_in_progress, verify_worktree


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

