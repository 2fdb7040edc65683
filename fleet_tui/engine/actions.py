"""What the user does to a task: kill, retry, follow up, say, discard, archive; each first
asks policy whether the task's state allows it (`check`), and refuses with the sentence the
panel shows for the same key."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path

from fleet_tui.core import outcome, policy
from fleet_tui.core.errors import (
    FleetError,
    FleetRefused,
    FleetTuiError,
    InvalidSpec,
    WorkerFinished,
)
from fleet_tui.core.model import Task
from fleet_tui.core.states import (
    ACTIVE_STATES,
    CLOSED_STATES,
    FINISHED_STATES,
    PENDING_STATES,
    Action,
    StopReason,
    TaskState,
)
from fleet_tui.engine import supervisor
from fleet_tui.engine.context import Part, hides_key, log
from fleet_tui.engine.submit import check_text
from fleet_tui.system import paths
from fleet_tui.vcs import git

__all__ = ["RESUME_PROMPT", "Actions", "check"]


# a task's columns that name its place in git: a damaged one leaves git alone (discard)
_GIT_COLUMNS = frozenset({"repo", "worktree", "branch"})
RESUME_PROMPT = "Continue the task where you left off, then summarise what you did."


def check(task: Task, action: Action, why: str | None = None) -> None:
    """Refuse `action` as the panel would (policy.why_not), with the same reason."""
    refused = policy.refusal(task, action, why)
    if refused is not None:
        raise FleetRefused(refused)


class Actions(Part):
    """The user's actions on one task (the git side of a task is `branches.Branches`)."""

    def kill(self, task_id: str) -> None:
        """Stop a task now: SIGTERM to the worker's whole tree, SIGKILL after the grace.
        A task not started yet (queued, waiting) is killed in the store."""
        task = self.get_task(task_id)
        now = self.clock()
        if task.state in PENDING_STATES:
            if self.store.update_task(task.id, expect_state=PENDING_STATES,
                                      state=TaskState.KILLED, verdict=outcome.Verdict.KILLED,
                                      message=outcome.KILLED_BEFORE_START, finished_at=now,
                                      not_before=None):
                return
            task = self.get_task(task.id)
        self._check_running(task)
        # claimed, its runner not launched yet: killed in the store, so that its starter
        # spawns nothing (record_launch refuses)
        if self.store.kill_unlaunched(task.id, now, outcome.KILLED_BEFORE_START):
            return
        task = self.get_task(task.id)
        self._check_running(task)
        attempt = self.store.latest_attempt(task.id)
        deadline = time.monotonic() + supervisor.START_GRACE
        while attempt is None or attempt.dir is None or (
                self.supervisor.runner_identity(attempt)[0] is None
                and self.supervisor.runner_state(attempt) == "alive"):
            # being launched this very moment: wait for the runner to be known
            if time.monotonic() > deadline:
                raise FleetError(f"task {task.id} is starting; try again in a moment")
            time.sleep(0.02)
            attempt = self.store.latest_attempt(task.id)
        self.supervisor.stop_now(attempt, StopReason.KILL, outcome.KILLED_BY_USER)
        with self.ctx.lock:
            task = self.get_task(task.id)
            if task.state in ACTIVE_STATES:
                try:
                    self.follower.finish(task, attempt, [])
                except Exception as exc:
                    self.follower.on_task_error(task, attempt, exc, [])

    def _check_running(self, task: Task) -> None:
        why = policy.why_not(task, Action.KILL)
        if why is None and task.state not in ACTIVE_STATES:  # queued again meanwhile
            why = f"it is not running (it is {task.state})"
        check(task, Action.KILL, why)

    @hides_key
    def retry(self, task_id: str, *, resume: bool = False) -> Task:
        """Queue a new attempt: fresh (worktree reset to the base) or resume the session."""
        task = self.get_task(task_id)
        check(task, Action.RETRY, policy.why_not_resume(task) if resume else None)
        if resume:
            self._check_branch_left(task)
        # the user acted on the endpoint's stop (recharged, renewed, a new key): lift it
        self.store.change_endpoint(
            task.endpoint, lambda state: {"held": None, "held_task": None,
                                          "held_settings": None} if state.held else None,
            self.clock())
        if resume:
            self.store.add_attempt(task.id, kind="resume", prompt=RESUME_PROMPT,
                                   started_at=None)
        else:
            if task.worktree is not None:
                info = self.supervisor.host_of(task).make_worktree(task, reattach=False,
                                                                    reset=True)
                # a fresh worktree: an update that stopped on conflicts is gone with it
                shutil.rmtree(paths.update_dir(task.repo, task.id), ignore_errors=True)
                self.store.update_task(task.id, worktree=info.path, branch=info.branch,
                                       conflicts=[])
            self.store.add_attempt(task.id, kind="fresh", prompt=task.prompt,
                                   started_at=None)
        self.store.update_task(task.id, expect_state=FINISHED_STATES, state=TaskState.QUEUED,
                               verdict=None, message=None, finished_at=None, not_before=None,
                               **({} if resume else {"session_id": None}))
        return self.get_task(task.id)

    @hides_key
    def follow_up(self, task_id: str, prompt: str) -> Task:
        """Queue a follow-up in the same session and worktree (`--resume` + new prompt)."""
        task = self.get_task(task_id)
        if not prompt or not prompt.strip():
            raise FleetError("the follow-up prompt is empty; say what the worker should do")
        check(task, Action.FOLLOW_UP)
        self._check_branch_left(task)
        self.store.add_attempt(task.id, kind="followup", prompt=prompt, started_at=None)
        self.store.update_task(task.id, expect_state=FINISHED_STATES, state=TaskState.QUEUED,
                               verdict=None, message=None, finished_at=None, not_before=None)
        return self.get_task(task.id)

    def _check_branch_left(self, task: Task) -> None:
        """A resume or a follow-up continues the work on the task's branch: when its
        worktree folder was deleted by hand the branch is checked out again at the start
        (supervisor.launch); with the branch gone too there is nothing to continue."""
        if task.worktree is None:
            return
        try:
            remote = self.supervisor.host_of(task).remote_worktrees()
        except FleetTuiError:
            remote = None
        if remote is not None:
            # on its host: the start checks it out again there if it is gone, from the
            # branch of the host's mirror (which a worker's commits are on); a session
            # gone with its machine is refused now, nothing queued
            problem = remote.session_problem(task)
            if problem:
                raise FleetRefused(problem)
            return
        if Path(task.worktree).is_dir():
            return
        if not git.branch_exists(Path(task.repo), task.branch or f"fleet/{task.id}"):
            raise FleetRefused(str(git.BranchGone(task.id, Path(task.worktree))))

    def say(self, task_id: str, text: str, *, wait: float = 3.0) -> bool:
        """Send a message to a running worker: it joins the turn claude is in, or starts
        the next one (the stream shows it as the user's turn when claude takes it in).
        True once the worker's runner has taken it (within `wait` seconds; False: it is
        waiting in the attempt folder and will be). FleetError when the task does not run,
        or its worker takes no message any more (it finished its turn and is stopping:
        a follow-up is the way then)."""
        from fleet_tui.execution.worker.attemptlog import InputClosed

        task = self.get_task(task_id)
        if not isinstance(text, str) or not text.strip():
            raise InvalidSpec("the message is empty; say what the worker should do")
        check_text("message", text)
        if task.state in FINISHED_STATES:
            raise WorkerFinished(policy.refusal(task, Action.SAY) or
                                 f"cannot send a message to task {task.id}: it has finished")
        check(task, Action.SAY)
        attempt = self.store.latest_attempt(task.id)
        if attempt is None or attempt.dir is None or attempt.finished_at is not None:
            raise FleetError(f"cannot send a message to task {task.id}: its worker is "
                             "starting; try again in a moment")
        run = self.supervisor.run(attempt)  # the worker's host takes the message
        log = run.log
        try:
            message_id = run.send_input(text, by=self.owner)
        except InputClosed as exc:
            if not log.has_run() or not (log.runner_record() or {}).get("claude_pid"):
                why = f"{exc} yet (it is starting); try again in a moment"
            else:
                raise WorkerFinished(
                    f"cannot send a message to task {task.id}: {exc}: it has finished its "
                    "work and is stopping; send a follow-up once it has finished "
                    f"(`fleet-tui follow-up {task.id} TEXT`)") from None
            raise FleetError(f"cannot send a message to task {task.id}: {why}") from None
        deadline = time.monotonic() + max(0.0, wait)
        while log.input_waiting(message_id):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    @hides_key
    def discard(self, task_id: str) -> str:
        """Throw a task's work away: worktree, branch and config dir. A task that runs or
        waits to run is killed first. Returns what was done, as one sentence."""
        task = self.get_task(task_id)
        check(task, Action.DISCARD)
        if task.state in ACTIVE_STATES or task.state in PENDING_STATES:
            with contextlib.suppress(FleetError):
                self.kill(task.id)
            task = self.get_task(task.id)
        message = f"discarded {task.id}; branch {task.branch} deleted"
        untrusted = sorted(set(task.row_damaged) & _GIT_COLUMNS)
        if untrusted:
            # the row does not say which repository, worktree or branch is the task's (a
            # damaged column reads as its default, e.g. the current folder): git is left
            # alone, the row is closed
            message = (f"discarded {task.id} from the list only: its stored "
                       f"{' and '.join(untrusted)} "
                       "could not be read, so no worktree or branch was removed; remove "
                       f"them by hand (`git worktree list`, branch fleet/{task.id})")
        else:
            git.discard(task.repo, self.worktree_here(task), task.branch)
        self.remove_config_dir(task.id)
        self.store.update_task(task.id, state=TaskState.DISCARDED, worktree=None,
                               message="discarded" if not untrusted else message,
                               finished_at=task.finished_at or self.clock())
        return message

    def worktree_here(self, task: Task) -> Path | None:
        """The task's worktree when it is a folder of this machine; None when it is on
        another host (never opened here: git's work on it here is the branch's)."""
        if task.worktree is None:
            return None
        try:
            remote = self.supervisor.host_of(task).remote_worktrees()
        except FleetTuiError:
            return None  # its host is gone from config.toml: not a folder to touch here
        return Path(task.worktree) if remote is None else None

    def remove_config_dir(self, task_id: str) -> None:
        """A closed task's placements freed on its host (the local host: its config dir;
        a remote host: its worktree too, and the snapshot fetched here of it)."""
        task = self.store.get_task(task_id)
        try:
            host = self.supervisor.host_of(task)
        except FleetTuiError as exc:  # its host gone from config.toml: nothing freed here
            log.warning("task %s: %s", task_id, exc)
            return
        if host.remote_worktrees() is not None:
            subprocess.run(["git", "update-ref", "-d", f"refs/fleet/snapshot/{task_id}"],
                           cwd=task.repo, capture_output=True, check=False, timeout=30)
        host.release(task_id)

    def archive(self, task_ids: list[str]) -> list[str]:
        """Archive merged or discarded tasks: out of the lists (`ls --archived` shows
        them), their rows and attempt logs kept. FleetError naming a task that is not
        closed (its worktree and branch still hold work)."""
        tasks = [self.get_task(t) for t in task_ids]
        for task in tasks:
            if task.state not in CLOSED_STATES:
                raise FleetRefused(f"cannot archive task {task.id}: it is {task.state}; only "
                                 "merged or discarded tasks are archived (merge or discard "
                                 "it first)")
        return self.store.archive_tasks([t.id for t in tasks], self.clock())

    def unarchive(self, task_ids: list[str]) -> list[str]:
        """Put archived tasks back in the lists; the ids done."""
        return self.store.unarchive_tasks([self.get_task(t).id for t in task_ids])

    def archive_closed(self, older_than_days: float, repo: Path | None = None) -> list[str]:
        """Archive every merged or discarded task (of `repo`) last changed more than
        `older_than_days` ago (0: every one); the ids archived."""
        now = self.clock()
        return self.store.archive_tasks(
            [], now, closed_before=now - older_than_days * 86400,
            repo=Path(repo).resolve() if repo is not None else None)
