"""The git side of a task: its diff and the conflict preview, the merge (and a merge found
concluded after it was stopped), the update from its base branch (and its conflicts), the
push, and the copies of one prompt side by side. The key is scanned for in what would
leave the worktree (`secret_cache`); errors that quote git have it hidden (`hides_key`)."""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet_tui.core import titles
from fleet_tui.core.errors import FleetError, FleetRefused
from fleet_tui.core.model import Task
from fleet_tui.core.states import CLOSED_STATES, FINISHED_STATES, Action, TaskState
from fleet_tui.engine.actions import Actions, check
from fleet_tui.engine.context import Context, Part, hides_key, log
from fleet_tui.engine.secret_cache import SecretCache
from fleet_tui.engine.supervisor import TaskChange
from fleet_tui.settings.config import ConfigError
from fleet_tui.system import paths
from fleet_tui.vcs import git

if TYPE_CHECKING:
    from fleet_tui.execution.host import RemoteWorktrees

__all__ = ["Branches", "CopyReport", "work_at_stake"]


@dataclass
class CopyReport:
    """One copy of a task in the compare view (`Fleet.compare`)."""

    task: Task
    added: int = 0
    deleted: int = 0
    files: list[str] = field(default_factory=list)
    clean: bool | None = None  # merges cleanly into its base now (None: not known)
    merges: str = ""  # "yes", or why not (conflicts, not finished, ...)
    diff: git.Diff | None = None  # its changes (None: no worktree to read)

    @property
    def gate(self) -> str:
        """The last test gate's result: passed, failed or "-" (never run)."""
        return self.task.gate or "-"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def work_at_stake(task: Task, diff: git.Diff | None = None) -> str | None:
    """What a fresh retry would throw away (changed or untracked files in the worktree,
    commits on the branch beyond its base), as a short phrase; None when there is nothing.
    A fresh `Fleet.retry` resets both, so the CLI asks first (and the panel should).
    ``diff``: the worktree's changes read already (a worktree on another host:
    `Fleet.work_at_stake` fetches them)."""
    parts: list[str] = []
    if diff is not None or (task.worktree is not None and Path(task.worktree).is_dir()):
        try:
            if diff is None:
                diff = git.diff(Path(task.worktree or ""), task.base_commit)
        except git.GitError:
            parts.append("a worktree whose changes could not be read")
        else:
            if diff.files:
                names = ", ".join(f.path for f in diff.files[:3])
                more = f" and {len(diff.files) - 3} more" if len(diff.files) > 3 else ""
                added = sum(f.added for f in diff.files)
                deleted = sum(f.deleted for f in diff.files)
                parts.append(f"{_plural(len(diff.files), 'changed file')} ({names}{more}; "
                             f"+{added}/-{deleted})")
    if task.branch and task.base_commit:
        count = _git_count(task.repo, "rev-list", "--count",
                           f"{task.base_commit}..refs/heads/{task.branch}")
        if count:
            parts.append(f"{_plural(count, 'commit')} on {task.branch}")
    return " and ".join(parts) or None


@contextlib.contextmanager
def _scratch_branch(repo: Path, name: str, commit: str) -> Iterator[str]:
    """A branch at `commit` for as long as the block runs (a remote task's work as
    fetched, where git's checks want a branch), then gone."""
    ref = f"refs/heads/{name}"
    subprocess.run(["git", "update-ref", ref, commit], cwd=repo, check=True,
                   capture_output=True, timeout=30)
    try:
        yield name
    finally:
        subprocess.run(["git", "update-ref", "-d", ref], cwd=repo, check=False,
                       capture_output=True, timeout=30)


@contextlib.contextmanager
def _scratch_checkout(repo: Path, commit: str) -> Iterator[Path]:
    """A detached checkout of `commit` here for as long as the block runs (the test gate
    of a task whose worktree is on another host), then removed."""
    with tempfile.TemporaryDirectory(prefix="fleet-gate-") as tmp:
        where = Path(tmp) / "checkout"
        subprocess.run(["git", "worktree", "add", "--quiet", "--detach", str(where), commit],
                       cwd=repo, check=True, capture_output=True, timeout=300)
        try:
            yield where
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=repo,
                           check=False, capture_output=True, timeout=120)
            subprocess.run(["git", "worktree", "prune"], cwd=repo, check=False,
                           capture_output=True, timeout=120)


def _git_count(repo: Path, *args: str) -> int:
    """A number git prints (0 when git fails: then there is no such branch to lose)."""
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                             timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    text = out.stdout.strip()
    return int(text) if out.returncode == 0 and text.isdigit() else 0


class Branches(Part):
    """Diff, merge, update, push and compare of a task's branch and worktree."""

    def __init__(self, ctx: Context, secrets: SecretCache, actions: Actions) -> None:
        super().__init__(ctx)
        self.secrets = secrets
        self.actions = actions


    def work_at_stake(self, task: Task) -> str | None:
        """work_at_stake, a remote task's changes fetched from its host first."""
        remote = self.remote_of(task) if task.worktree is not None else None
        if remote is None:
            return work_at_stake(task)
        try:
            tip = self.remote_tip(task, remote)
            diff = git.diff_commits(task.repo, task.base_commit, tip)
        except FleetError:
            return "a worktree on its host whose changes could not be read"
        return work_at_stake(task, diff)

    @staticmethod
    def _missing_worktree(task: Task) -> str:
        branch = task.branch or f"fleet/{task.id}"
        kept = (f"its branch {branch} still holds the commits (a follow-up or "
                "`retry --resume` checks it out again), ") \
            if task.session_id and git.branch_exists(Path(task.repo), branch) else ""
        return (f"the worktree of task {task.id} ({task.worktree}) is missing: it was "
                f"deleted outside fleet-tui; {kept}discard the task, or retry it to start "
                "fresh")

    def remote_of(self, task: Task) -> RemoteWorktrees | None:
        """The task's host when its worktree is not a folder of this machine (an SSH
        host): then nothing here opens `task.worktree`; the host is asked instead."""
        if task.worktree is None and not task.host:
            return None
        return self.supervisor.host_of(task).remote_worktrees()

    def _remote_open(self, task: Task) -> None:
        if task.state in CLOSED_STATES:
            raise FleetRefused(f"task {task.id} was {task.state}; its worktree is gone")
        if task.worktree is None:
            raise FleetRefused(f"task {task.id} has no worktree yet (it is {task.state})")

    def remote_tip(self, task: Task, remote: RemoteWorktrees) -> str:
        """The remote task's work as it is now, fetched here (`snapshot`): the commit
        its diff, its gate and its preview read."""
        self._remote_open(task)
        try:
            return remote.snapshot(task)
        except FleetError as exc:
            raise FleetRefused(f"the work of task {task.id} could not be fetched from its "
                               f"host: {exc}", transient=exc.transient) from None

    def _remote_diff(self, task: Task, remote: RemoteWorktrees) -> git.Diff:
        tip = self.remote_tip(task, remote)
        base = git.fork_point(task.repo, task.base_commit, task.base_branch, head=tip)
        return git.diff_commits(task.repo, base, tip, secrets=self.secrets.get())

    def _worktree_of(self, task: Task) -> Path:
        if task.state in CLOSED_STATES:
            raise FleetRefused(f"task {task.id} was {task.state}; its worktree is gone")
        if task.worktree is None:
            raise FleetRefused(f"task {task.id} has no worktree yet (it is {task.state})")
        if not Path(task.worktree).is_dir():
            raise FleetRefused(self._missing_worktree(task))
        return Path(task.worktree)

    @hides_key
    def diff(self, task_id: str) -> git.Diff:
        """The task's changes; ``secret_paths`` names files that hold the API key (the key
        is replaced in the patch, never shown)."""
        task = self.get_task(task_id)
        remote = self.remote_of(task)
        if remote is not None:  # fetched from its host first (a running task's too)
            return self._remote_diff(task, remote)
        worktree = self._worktree_of(task)
        # measured from where the task stands against its base branch's tip now: what
        # landed on the base meanwhile (merged in by an update) is not the task's change
        base = git.fork_point(worktree, task.base_commit, task.base_branch)
        found = self.secrets.cached()
        if found is not None:
            return git.diff(worktree, base, secrets=found)
        # Not resolved lately: look the key up while git diff runs (the panel's first
        # paint of a diff waits for both).
        from concurrent.futures import ThreadPoolExecutor  # here: a merge's alone

        with ThreadPoolExecutor(1, thread_name_prefix="fleet-key") as pool:
            resolving = pool.submit(self.secrets.get)
            result = git.diff(worktree, base)
            git.mark_secrets(worktree, result, resolving.result())
        return result

    @hides_key
    def diff_stat(self, task: Task) -> tuple[int, int]:
        """(added, deleted) lines of a task against where it stands (see diff)."""
        remote = self.remote_of(task)
        if remote is not None:
            found = self._remote_diff(task, remote)
            return found.added, found.deleted
        worktree = self._worktree_of(task)
        return git.diff_stat(worktree, git.fork_point(worktree, task.base_commit,
                                                      task.base_branch))

    @hides_key
    def conflict_preview(self, task_id: str) -> git.ConflictPreview:
        """What merge() would do now, short of the test command: clean, or why not
        (identity, main checkout, nothing to merge, conflicts, files in the way, the key)."""
        task = self.get_task(task_id)
        remote = self.remote_of(task)
        if remote is not None:
            # its work as it is now, fetched (its uncommitted files included, as the merge
            # commits them first), previewed on a scratch branch: nothing of the task moves
            tip = self.remote_tip(task, remote)
            with _scratch_branch(task.repo, f"fleet-preview/{task.id}", tip) as scratch:
                preview = self._preview(task, scratch, None)
            if preview.message:
                preview = dataclasses.replace(
                    preview, message=preview.message.replace(scratch, task.branch))
            return preview
        if task.worktree is not None and not Path(task.worktree).is_dir():
            self._refuse_if_landed(task)
            raise FleetRefused(self._missing_worktree(task))  # as the merge itself does
        return self._preview(task, task.branch, self._worktree_of(task))

    def _preview(self, task: Task, branch: str, worktree: Path | None
                 ) -> git.ConflictPreview:
        if not task.base_branch:
            raise FleetRefused(f"task {task.id} was started from a commit, not a branch; "
                               "merge its branch by hand")
        try:
            preview = git.conflict_preview(task.repo, branch, task.base_branch,
                                           worktree=worktree, secrets=self.secrets.get(),
                                           strategy=self.settings.merge_strategy)
        except git.GitError:
            self._refuse_if_landed(task)
            raise
        if preview.reason in ("nothing", "gone"):
            self._refuse_if_landed(task)
        return preview

    def _refuse_if_landed(self, task: Task) -> None:
        """A task whose merge is on its base branch (a merge stopped midway and concluded
        after): recorded as merged, and said so."""
        found = self.found_landed(task)
        if found is not None:
            raise FleetRefused(f"task {task.id} is merged already: {found.message}")

    def test_command_for(self, task_id: str) -> str | None:
        """The merge's test gate for a task: its repository's test_command
        (.fleet-tui.toml, or config.toml's [repos."<path>"]), else the test_command
        setting; None when there is none. Read afresh: an edit counts at once."""
        task = self.get_task(task_id)
        try:
            own = self.repo_settings.get(Path(task.repo)).test_command
        except ConfigError:
            own = None  # said by settings_problems(); the global one applies
        return own or self.settings.test_command

    @hides_key
    def merge(self, task_id: str, *, message: str | None = None,
              test_command: str | None = None) -> git.MergeResult:
        """Land a finished task into its base branch (test gate, conflict check), then
        delete its config dir. A refusal comes back as MergeResult(merged=False). The
        default commit message is the task's title without a copy's "(1/3)";
        `test_command` (None: `test_command_for` the task) runs in the worktree first."""
        task = self.get_task(task_id)
        check(task, Action.MERGE)
        return self.merge_task(task, message=message,
                           test_command=test_command or self.test_command_for(task.id))

    @staticmethod
    def _trailers(task: Task) -> dict[str, str]:
        trailers = {"Fleet-Task": task.id}
        if task.session_id:
            trailers["Fleet-Session"] = task.session_id
        return trailers

    def merge_task(self, task: Task, *, message: str | None, test_command: str | None,
               expect_side: str | None = None) -> git.MergeResult:
        """The merge itself (no policy check: the merge queue lands its own tasks)."""
        assert task.base_branch is not None  # policy refuses a task started from a commit
        remote = self.remote_of(task)
        if remote is None and task.worktree is not None and not Path(task.worktree).is_dir():
            found = self.found_landed(task)
            if found is not None:
                return found
            raise FleetRefused(self._missing_worktree(task))
        gate_output: str | None = None
        try:
            # the commits in the main repository (a remote task's fetched from its host,
            # its uncommitted work committed there first)
            branch = self.supervisor.host_of(task).collect(task)
            if remote is not None and test_command:
                # its worktree is not here: the gate runs in a checkout of what landed here
                tip = git.branch_tip(task.repo, branch)
                passed, gate_output = self.gate_here(task.repo, tip, test_command)
                if not passed:
                    self.store.update_task(task.id, gate="failed")
                    return git.MergeResult(False, None, f"the test command failed on "
                                           f"{tip[:10]} of {branch}; not merged (its output "
                                           "is below)", gate_output, reason="test")
                test_command = None
            result = git.merge(task.repo, None if remote is not None else task.worktree,
                               branch, task.base_branch,
                               message=message or titles.commit_title(task.short_title),
                               trailers=self._trailers(task),
                               test_command=test_command,
                               strategy=self.settings.merge_strategy,
                               secrets=self.secrets.get(fresh=True), expect_side=expect_side)
        except git.GitError as exc:
            # nothing was merged: to the user that is a refusal (exit 4), not a failure
            raise FleetRefused(str(exc)) from None
        except FleetError as exc:
            if remote is None:
                raise
            raise FleetRefused(f"task {task.id} was not merged: {exc}",
                               transient=exc.transient) from None
        if gate_output is not None and result.test_output is None:
            result = dataclasses.replace(result, test_output=gate_output)
        if result.reason in ("gone", "nothing"):
            found = self.found_landed(task)
            if found is not None:
                return found
        gate = None
        if result.test_output is not None:
            gate = "failed" if result.reason == "test" else "passed"
        if result.merged:
            self.actions.remove_config_dir(task.id)
            self.store.update_task(task.id, state=TaskState.MERGED, message=result.message,
                                   worktree=None, gate=gate or task.gate)
        elif gate:
            self.store.update_task(task.id, gate=gate)
        return result

    def found_landed(self, task: Task) -> git.MergeResult | None:
        """A task whose merge is on its base branch already (a merge that was stopped
        midway and concluded by the next one, or by the user; its `Fleet-Task` trailer
        says so) is merged: its worktree, branch and config dir go, as after any merge."""
        if not task.base_branch:
            return None
        commit = git.landed_task(Path(task.repo), task.base_branch, task.id)
        if commit is None:
            return None
        with contextlib.suppress(git.GitError):
            git.discard(task.repo, self.actions.worktree_here(task), task.branch)
        self.actions.remove_config_dir(task.id)
        message = (f"merged {task.branch} into {task.base_branch} as {commit[:10]} (found "
                   f"on {task.base_branch}: that merge was concluded after it was stopped)")
        self.store.update_task(task.id, state=TaskState.MERGED, message=message,
                               worktree=None)
        return git.MergeResult(True, commit, message, None)

    def gate_here(self, repo: Path, commit: str, command: str) -> tuple[bool, str]:
        """The test gate on `commit` in a scratch checkout of this machine (a task whose
        worktree is on another host: what is tested is what lands here)."""
        try:
            with _scratch_checkout(repo, commit) as where:
                return git.run_test_command(command, where,
                                            secrets=self.secrets.get(fresh=True))
        except subprocess.CalledProcessError as exc:
            raise FleetRefused(f"no checkout of {commit[:10]} could be made to test it: "
                               f"{(exc.stderr or b'').decode('utf-8', 'replace').strip()}"
                               ) from None

    @contextlib.contextmanager
    def gate_checkout(self, task: Task, *, checkout: bool = True
                      ) -> Iterator[tuple[Path | None, str]]:
        """Where the merge queue tests a task and the commit it tests: its worktree and
        HEAD, or (its worktree on another host) a scratch checkout here of its work as
        collected (`checkout=False`: no checkout, the commit only)."""
        remote = self.remote_of(task)
        if remote is None:
            worktree = Path(task.worktree or "")
            yield worktree, git.head_commit(worktree)
            return
        try:
            branch = self.supervisor.host_of(task).collect(task)
        except FleetError as exc:
            raise FleetRefused(f"the work of task {task.id} could not be fetched from its "
                               f"host: {exc}", transient=exc.transient) from None
        tip = git.branch_tip(task.repo, branch)
        if not checkout:
            yield None, tip
            return
        try:
            scratch = _scratch_checkout(task.repo, tip)
            where = scratch.__enter__()
        except subprocess.CalledProcessError as exc:
            raise FleetRefused(f"no checkout of {tip[:10]} could be made to test it: "
                               f"{(exc.stderr or b'').decode('utf-8', 'replace').strip()}"
                               ) from None
        try:
            yield where, tip
        finally:
            scratch.__exit__(None, None, None)

    def _update_record(self, task: Task) -> Path:
        return paths.update_dir(task.repo, task.id)

    def landing_worktree(self, task: Task) -> Path:
        """The task's worktree here, checked (a remote task's: on its host, asked)."""
        if not task.base_branch:
            raise FleetRefused(f"task {task.id} was started from a commit, not a branch; "
                               "there is no base branch to update from")
        remote = self.remote_of(task)
        if remote is not None:
            self._remote_open(task)
            try:
                there = remote.has_worktree(task)
            except FleetError as exc:
                raise FleetRefused(f"task {task.id}: {exc}", transient=exc.transient) from None
            if not there:
                raise FleetRefused(f"the worktree of task {task.id} ({task.worktree}) is "
                                   "missing on its host: it was deleted outside fleet-tui; "
                                   "discard the task, or retry it to start fresh")
            return Path(task.worktree or "")
        try:
            return self._worktree_of(task)
        except FleetError as exc:
            raise FleetRefused(str(exc)) from None

    @hides_key
    def update(self, task_id: str) -> git.UpdateResult:
        """Bring a finished task's branch up to date with its base branch's current tip,
        in its worktree (merge or rebase per `update_strategy`; the worker's uncommitted
        work committed first). The main checkout is not touched.

        An update that stopped on conflicts is looked at again: concluded when the worker
        (or the user, in a shell) resolved and committed it, or the files are free of
        conflict markers; else still "conflicts" (the files in ``conflicts``, stored on the
        task, which then cannot merge, queue or push until it is resolved or aborted).
        "refused": nothing changed (``message`` says why)."""
        task = self.get_task(task_id)
        check(task, Action.UPDATE)
        return self.update_from_base(task)

    def update_from_base(self, task: Task) -> git.UpdateResult:
        remote = self.remote_of(task)
        if remote is not None:
            return self._update_remote(task, remote)
        worktree = self.landing_worktree(task)
        assert task.base_branch is not None
        if task.conflicts or git.operation_in_progress(worktree) is not None:
            return self._settle(task, worktree)
        try:
            result = git.update_from_base(
                task.repo, worktree, task.branch, task.base_branch,
                record=self._update_record(task), strategy=self.settings.update_strategy,
                message=titles.commit_title(task.short_title), trailers=self._trailers(task))
        except git.GitError as exc:
            raise FleetRefused(str(exc)) from None
        self._record_update(task, worktree, result)
        return result

    def _update_remote(self, task: Task, remote: RemoteWorktrees) -> git.UpdateResult:
        """The update in the host's worktree (its base branch's tip sent there); on
        conflicts it is left mid-merge there, for its worker. Then the work is fetched
        and the counts measured here."""
        self.landing_worktree(task)
        assert task.base_branch is not None
        base_tip = git.branch_tip(task.repo, task.base_branch)
        try:
            result = remote.update_worktree(
                task, base_commit=base_tip, base_branch=task.base_branch,
                strategy=self.settings.update_strategy,
                message=titles.commit_title(task.short_title))
        except FleetError as exc:
            raise FleetRefused(f"task {task.id} was not updated: {exc}",
                               transient=exc.transient) from None
        if result.status == "refused":
            return result
        fields_: dict[str, Any] = {"message": result.message,
                                   "conflicts": list(result.conflicts)}
        if result.status != "conflicts":
            with contextlib.suppress(FleetError, git.GitError):
                tip = remote.snapshot(task)
                fields_["base_commit"] = git.fork_point(task.repo, task.base_commit,
                                                        task.base_branch, head=tip)
                found = git.diff_commits(task.repo, str(fields_["base_commit"]), tip)
                fields_["added_lines"], fields_["deleted_lines"] = found.added, found.deleted
        self.store.update_task(task.id, **fields_)
        return result

    def _settle(self, task: Task, worktree: Path) -> git.UpdateResult:
        assert task.base_branch is not None
        try:
            result = git.conclude_update(worktree, self._update_record(task),
                                         base_branch=task.base_branch, branch=task.branch,
                                         conflicted=task.conflicts)
        except git.GitError as exc:
            raise FleetRefused(str(exc)) from None
        self._record_update(task, worktree, result)
        return result

    def _record_update(self, task: Task, worktree: Path, result: git.UpdateResult) -> None:
        """Keep what an update did on the task: the conflicts (or none), the new base, the
        counts measured from it, and the message."""
        if result.status == "refused":
            if task.conflicts and git.operation_in_progress(worktree) is None:
                # an update abandoned in the worktree: no longer mid-merge, not up to date
                self.store.update_task(task.id, conflicts=[], message=result.message)
            return
        fields_: dict[str, Any] = {"message": result.message,
                                   "conflicts": list(result.conflicts)}
        if result.status != "conflicts":
            fields_["base_commit"] = git.fork_point(worktree, task.base_commit,
                                                    task.base_branch)
            with contextlib.suppress(git.GitError):
                fields_["added_lines"], fields_["deleted_lines"] = git.diff_stat(
                    worktree, str(fields_["base_commit"]))
        self.store.update_task(task.id, **fields_)

    def update_prompt(self, task: Task, conflicts: list[str], operation: str | None) -> str:
        """The follow-up that asks the worker to resolve an update's conflicts."""
        files = ", ".join(conflicts) or "(see `git status`)"
        base = task.base_branch or "the base branch"
        if operation is None and conflicts:
            return (f"Bringing your branch up to date with {base} was concluded, but these "
                    f"files still hold conflict markers: {files}.\n\n"
                    "Resolve what is between the markers in those files, keeping what both "
                    "sides meant to do; make sure the tests still pass; then commit them "
                    "(`git add` and `git commit`).")
        if operation == "rebase":
            how = ("then stage them (`git add`) and continue the rebase with "
                   "`git -c core.editor=true rebase --continue` (repeat if a later commit "
                   "stops on conflicts too)")
        else:
            how = ("then stage them (`git add`) and conclude the merge with "
                   "`git commit --no-edit`")
        return (f"Bringing your branch up to date with {base} stopped on conflicts in: "
                f"{files}.\n\n"
                f"Your worktree is in the middle of that {operation or 'merge'} (`git status` "
                "shows it). Resolve the conflicts in those files, keeping what both sides "
                f"meant to do; make sure the tests still pass; {how}. Do not abort it and "
                "do not start over.")

    @hides_key
    def resolve_update(self, task_id: str, how: str) -> Task:
        """What to do with an update that stopped on conflicts: "worker" sends the worker
        a follow-up (same session) naming the conflicted files and asking it to resolve
        them, keep the tests passing and commit; "abort" puts the worktree back exactly as
        it was before the update. (The third way, a shell, is the caller's: resolve there,
        then `update` again.)"""
        task = self.get_task(task_id)
        if how not in ("worker", "abort"):
            raise FleetError(f"unknown way to resolve {how!r}: use worker or abort")
        remote = self.remote_of(task)
        if remote is not None:
            return self._resolve_remote(task, how, remote)
        worktree = self.landing_worktree(task)
        operation = git.operation_in_progress(worktree)
        if operation is None and not task.conflicts:
            raise FleetRefused(f"task {task.id} has no update stopped on conflicts; "
                               "nothing to resolve")
        if how == "abort":
            check(task, Action.UPDATE)
            try:
                done = git.abort_update(worktree, self._update_record(task))
            except git.GitError as exc:
                raise FleetRefused(str(exc)) from None
            self.store.update_task(task.id, conflicts=[],
                                   message=f"update from {task.base_branch} aborted: {done}")
            return self.get_task(task.id)
        conflicts = task.conflicts or git.unmerged_paths(worktree)
        return self.actions.follow_up(task.id, self.update_prompt(task, conflicts, operation))

    def _resolve_remote(self, task: Task, how: str, remote: RemoteWorktrees) -> Task:
        self.landing_worktree(task)
        if not task.conflicts:
            raise FleetRefused(f"task {task.id} has no update stopped on conflicts; "
                               "nothing to resolve")
        if how == "abort":
            check(task, Action.UPDATE)
            try:
                done = remote.abort_update(task)
            except FleetError as exc:
                raise FleetRefused(str(exc)) from None
            self.store.update_task(task.id, conflicts=[],
                                   message=f"update from {task.base_branch} aborted: {done}")
            return self.get_task(task.id)
        operation = "rebase" if self.settings.update_strategy == "rebase" else "merge"
        return self.actions.follow_up(task.id, self.update_prompt(task, task.conflicts,
                                                                  operation))

    def settle_finished(self, changes: list[TaskChange]) -> None:
        """A worker that was resolving an update's conflicts has finished: conclude the
        update if it resolved them (and did not commit, or did), else keep the list."""
        for change in changes:
            if change.new not in FINISHED_STATES:
                continue
            try:
                task = self.get_task(change.task_id)
                remote = self.remote_of(task) if task.conflicts else None
                if remote is not None and task.base_branch:
                    self._update_remote(task, remote)
                elif task.conflicts and task.worktree is not None \
                        and Path(task.worktree).is_dir() and task.base_branch:
                    self._settle(task, Path(task.worktree))
            except Exception as exc:  # one task's trouble: said, never the whole pass
                log.warning("looking at the update of task %s: %s", change.task_id, exc)

    @hides_key
    def push(self, task_id: str) -> git.PushResult:
        """Push a finished task's branch (its uncommitted work committed first) to the
        repository's remote (the base branch's upstream remote, else origin, else the only
        one) as `fleet/<id>`. Then, if the `pr_command` setting names one, run it (it gets
        FLEET_TASK_ID, FLEET_REMOTE, FLEET_REMOTE_BRANCH, FLEET_BASE_BRANCH, FLEET_TITLE
        and FLEET_COMMIT): the hook for opening a pull request; none runs by default."""
        task = self.get_task(task_id)
        check(task, Action.PUSH)
        worktree = None if task.worktree is None else self.landing_worktree(task)
        if worktree is not None and self.remote_of(task) is not None:
            try:  # its commits here (its uncommitted work committed on its host first)
                self.supervisor.host_of(task).collect(task)
            except FleetError as exc:
                raise FleetRefused(f"task {task.id} was not pushed: {exc}") from None
            worktree = None
        remote = git.push_remote(task.repo, task.base_branch)
        if remote is None:
            raise FleetRefused(f"the repository {task.repo} has no remote to push to (or "
                               "several and none is origin); add one with `git remote add "
                               "origin URL`, or set the base branch's upstream")
        remote_branch = f"fleet/{task.id}"
        expect = None
        if task.pushed:
            parts = task.pushed.split()
            if len(parts) == 3 and parts[0] == remote:
                expect = parts[2]
        try:
            result = git.push_branch(task.repo, worktree, task.branch, remote_branch,
                                     remote=remote, base_branch=task.base_branch,
                                     base_commit=task.base_commit,
                                     message=titles.commit_title(task.short_title),
                                     trailers=self._trailers(task),
                                     secrets=self.secrets.get(fresh=True), expect_remote=expect)
        except git.GitError as exc:
            raise FleetRefused(str(exc)) from None
        fields_: dict[str, Any] = {"pushed": f"{remote} {remote_branch} {result.commit}",
                                   "message": result.message}
        if task.worktree is not None:
            with contextlib.suppress(git.GitError, FleetError):
                fields_["added_lines"], fields_["deleted_lines"] = self.diff_stat(task)
        self.store.update_task(task.id, **fields_)
        command = self.settings.pr_command
        if command:
            passed, output = git.run_test_command(
                command, task.repo, 300.0, self.secrets.get(),
                {"FLEET_TASK_ID": task.id, "FLEET_REMOTE": remote,
                 "FLEET_REMOTE_BRANCH": remote_branch,
                 "FLEET_BASE_BRANCH": task.base_branch or "",
                 "FLEET_TITLE": titles.commit_title(task.short_title),
                 "FLEET_COMMIT": result.commit})
            result.hook_output = output
            result.hook_passed = passed
        return result

    def copies(self, task_id: str) -> list[Task]:
        """The copies submitted together with this task (itself included), in copy
        order; [task] for a task that was not submitted as one of several copies."""
        task = self.get_task(task_id)
        if task.group_id:
            return self.store.group(task.group_id)
        return [task]

    @hides_key
    def compare(self, task_id: str) -> list[CopyReport]:
        """Each copy of the task's group side by side: its state and verdict, turns and
        tokens, +/- and the files it touched (from where it stands against its base), the
        last test gate, and whether it would merge cleanly now (or why not)."""
        reports = []
        for task in self.copies(task_id):
            reports.append(self._report(task))
        return reports

    def _report(self, task: Task) -> CopyReport:
        report = CopyReport(task=task, added=task.added_lines, deleted=task.deleted_lines)
        if task.state in CLOSED_STATES or task.worktree is None:
            report.merges = f"no worktree ({task.state})"
            return report
        try:
            remote = self.remote_of(task)
        except FleetError as exc:  # its host gone from config.toml: this copy says so
            report.merges = f"cannot read its changes: {exc}"
            return report
        if remote is None and not Path(task.worktree).is_dir():
            report.merges = f"no worktree ({task.state})"
            return report
        try:
            diff = self.diff(task.id)
        except (FleetError, git.GitError) as exc:
            report.merges = f"cannot read its changes: {exc}"
            return report
        report.added, report.deleted = diff.added, diff.deleted
        report.files = [f.path for f in diff.files]
        report.diff = diff
        if task.state not in FINISHED_STATES:
            report.merges = f"not finished ({task.state})"
            return report
        if task.conflicts:
            report.merges = "mid-update: " + ", ".join(task.conflicts)
            return report
        try:
            preview = self.conflict_preview(task.id)
        except (FleetError, git.GitError) as exc:
            report.merges = str(exc)
            return report
        report.clean = preview.clean
        report.merges = "yes" if preview.clean else (
            "conflicts: " + ", ".join(preview.conflicts) if preview.conflicts
            else preview.message)
        return report
