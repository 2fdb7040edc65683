"""The engine's follower: it reads what running attempts write, and records how they end.

Each pass (`follow`) folds the new complete lines of an attempt's events into its summary
(turns, tokens, last tool, session) and the store, at most READ_CHUNK bytes per attempt so
that a big backlog does not hold the GIL for long; runs the watchdogs (policy decides, the
supervisor signals); and once the runner is gone finishes the attempt: it reads the rest,
judges it (`outcome.judge_attempt`) and moves the task on (`policy.after_attempt`).

One task's bad data stays that task's: an exception while following or finishing it marks
that task failed (`mark_broken`, verdict crashed) with a sentence naming the cause and the
file; the other tasks go on.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_tui.core import outcome, policy, providers, stream
from fleet_tui.core.errors import EXIT_FAILED, FleetTuiError
from fleet_tui.core.model import Attempt, Task
from fleet_tui.core.states import ACTIVE_STATES, PENDING_STATES, StopReason, TaskState, Verdict
from fleet_tui.engine.supervisor import Supervisor, TaskChange, describe
from fleet_tui.execution.hosts import HostUnknown
from fleet_tui.execution.worker.attemptlog import AttemptLog
from fleet_tui.settings.config import Settings
from fleet_tui.store.db import Store
from fleet_tui.vcs import git

log = logging.getLogger("fleet_tui.engine.fleet")

# how far before the engine's noted start a runner's end time may be and still be taken
# (the clocks are read a moment apart)
LAUNCH_SLACK = 1.0
READ_CHUNK = 1 << 20  # bytes of one attempt's events folded in per pass (GIL hold)

# errors of the moment (the machine, not the task's data): tried again on the next pass
PASSING_ERRNOS = frozenset({errno.EINTR, errno.EAGAIN, errno.EMFILE, errno.ENFILE,
                            errno.ENOMEM, errno.EBUSY, errno.ENOSPC, errno.EDQUOT})


@dataclass
class _Follow:
    """In-memory state of one followed attempt (rebuilt from offset 0 after a restart)."""

    decoder: stream.StreamDecoder
    summary: stream.RunSummary = field(default_factory=stream.RunSummary)
    offset: int = 0
    result: stream.Result | None = None
    stored: tuple[Any, ...] = ()
    # what the events said beside the result (outcome.with_hints): the last wait the CLI
    # made before a retry (the endpoint's retry-after, when it sent one) and a rejected
    # rate_limit_event's reset
    retry_after: float | None = None
    rate_limit: tuple[float, str] | None = None
    retrying_429: bool = False  # the CLI is retrying a 429 (no answer since)


class TaskDataError(FleetTuiError):
    """One task's files or rows could not be used; the message names the file. The task is
    marked failed for it (exit 1, as for a failed task)."""

    exit_code = EXIT_FAILED
    title = "Task data"


def describe_error(exc: BaseException) -> str:
    """One line naming the cause (and, for a task's data, the file)."""
    if isinstance(exc, TaskDataError):
        return str(exc)
    return describe(exc)


@contextlib.contextmanager
def _about(what: str) -> Iterator[None]:
    """Name the file behind an exception from reading or classifying one task's data."""
    try:
        yield
    except (TaskDataError, sqlite3.OperationalError):
        raise
    except OSError as exc:
        if exc.errno in PASSING_ERRNOS:
            raise
        raise TaskDataError(f"{what}: {describe(exc)}") from exc
    except Exception as exc:
        raise TaskDataError(
            f"{what}: {stream.one_line(f'{type(exc).__name__}: {exc}', 200)}") from exc


def _as_float(value: Any, default: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return float(value)


def attempt_finished(attempt: Attempt) -> bool:
    """The attempt has ended: closed in the store, or its runner wrote the exit record."""
    return attempt.finished_at is not None or (
        attempt.dir is not None and AttemptLog(attempt.dir).exited)


class Follower:
    """Follows and finishes the running attempts of every engine sharing the store."""

    def __init__(self, settings: Settings, store: Store, supervisor: Supervisor, *,
                 clock: Callable[[], float], rng: policy.Random) -> None:
        self.settings = settings
        self.store = store
        self.supervisor = supervisor
        self.clock = clock
        self.rng = rng
        self._follows: dict[int, _Follow] = {}
        self._unknown_said: dict[str, str] = {}  # tasks whose host is not known here
        # What has been folded in from events files, for the panel and benchmarks.
        self.ingested_events = 0
        self.ingested_bytes = 0

    def forget_all_but(self, live: set[int]) -> None:
        """Drop what is kept of attempts another engine finished (tasks no longer active)."""
        for attempt_id in set(self._follows) - live:
            del self._follows[attempt_id]

    # --- one pass over one active task ----------------------------------------------------

    def follow(self, task: Task, attempt: Attempt | None, now: float,
               changes: list[TaskChange]) -> None:
        if task.row_error is not None:
            self.mark_broken(task, attempt, task.row_error, changes)
            return
        if attempt is not None and attempt.row_error is not None:
            self.mark_broken(task, attempt, attempt.row_error, changes)
            return
        if attempt is not None and attempt.finished_at is not None:
            # the attempt was closed but the task not moved on (a crash in between)
            self.apply_outcome(task, attempt, attempt.verdict or Verdict.CRASHED,
                               attempt.message or "", now, changes,
                               ended=min(attempt.finished_at, now))
            return
        if attempt is None or attempt.dir is None:
            # claimed, not launched: being started, or by an engine that died doing it
            self.supervisor.requeue_if_abandoned(task, now, changes)
            return
        state = self.supervisor.runner_state(attempt)
        if state == "never":
            self.supervisor.requeue_if_abandoned(task, now, changes)
            return
        if state == "alive" and attempt.runner_pid is None:
            self.supervisor.adopt(attempt)
        fresh = self.read_new(attempt, now)
        task = self._store_summary(task, attempt, now, fresh) or task
        if fresh and task.state == TaskState.STALLED and self.store.update_task(
                task.id, expect_state=TaskState.STALLED, state=TaskState.RUNNING, message=None):
            changes.append(TaskChange(task.id, TaskState.STALLED, TaskState.RUNNING,
                                      "events resumed"))
            task.state = TaskState.RUNNING
        if state == "dead" or AttemptLog(attempt.dir).exited:
            self.finish(task, attempt, changes)
            return
        self._watchdogs(task, attempt, now, changes)
        self._endpoint_watch(task, attempt, now)

    def read_new(self, attempt: Attempt, now: float, *, final: bool = False) -> bool:
        """Fold new complete lines of the events into the attempt's summary: one chunk of
        READ_CHUNK bytes (so one attempt does not hold the GIL for long), or, when `final`,
        everything left, a last line without its newline included."""
        fol = self._follows.get(attempt.id)
        if fol is None:
            fol = _Follow(decoder=stream.StreamDecoder())
            self._follows[attempt.id] = fol
        if attempt.dir is None:
            return False
        folder = AttemptLog(attempt.dir)
        events: list[stream.Event] = []
        with _about(f"could not read the events file {folder.events}"):
            while True:
                data, fol.offset = folder.read_bytes(fol.offset, READ_CHUNK, finished=final)
                self.ingested_bytes += len(data)
                events += fol.decoder.feed(data)
                if not final or not data:
                    break
            if final:
                events += fol.decoder.finish()
            self.ingested_events += len(events)
            for ev in events:
                fol.summary.update(ev, at=now)
                if isinstance(ev, stream.Result):
                    fol.result = ev
                elif isinstance(ev, stream.ApiRetry):
                    delay = ev.retry_delay_ms
                    fol.retry_after = delay / 1000 if delay and delay > 0 else None
                    fol.retrying_429 = ev.error_status == 429
                elif isinstance(ev, stream.RateLimit):
                    fol.rate_limit = providers.rate_limit_signal(ev.data) or fol.rate_limit
                elif isinstance(ev, stream.AssistantEvent) and not ev.synthetic:
                    fol.retry_after = None  # an answer came after that retry
                    fol.retrying_429 = False
        return bool(events)

    def _store_summary(self, task: Task, attempt: Attempt, now: float,
                       fresh: bool) -> Task | None:
        fol = self._follows[attempt.id]
        s = fol.summary
        key = (fol.offset, s.turns, s.input_tokens, s.output_tokens, s.last_tool, s.session_id)
        if key == fol.stored:
            return None
        fol.stored = key
        last_event_at = now if fresh else (attempt.last_event_at or None)
        fields_: dict[str, Any] = {"turns": s.turns, "input_tokens": s.input_tokens,
                                   "output_tokens": s.output_tokens, "last_tool": s.last_tool,
                                   "events_offset": fol.offset}
        if s.session_id:
            fields_["session_id"] = s.session_id
        if last_event_at is not None:
            fields_["last_event_at"] = last_event_at
        runner = AttemptLog(attempt.dir).runner_record() if attempt.dir is not None else None
        afresh = runner.get("afresh") if runner else None
        if isinstance(afresh, str) and attempt.kind != "fresh":
            # its runner found no saved session to resume: the attempt is a fresh one
            fields_.update(kind="fresh", message=afresh)
            attempt.kind = "fresh"
            self.store.update_task(task.id, message=afresh)
        claude_pid = runner.get("claude_pid") if runner else None
        if isinstance(claude_pid, int) and attempt.pid is None:
            fields_["pid"] = claude_pid
            start = runner.get("claude_start") if runner else None
            fields_["pid_start"] = start if isinstance(start, str) else None
        self.store.update_attempt(attempt.id, **fields_)
        # the task shows totals over its attempts; the session is the latest one
        others = [a for a in self.store.list_attempts(task.id) if a.id != attempt.id]
        totals: dict[str, Any] = {
            "turns": s.turns + sum(a.turns for a in others),
            "input_tokens": s.input_tokens + sum(a.input_tokens for a in others),
            "output_tokens": s.output_tokens + sum(a.output_tokens for a in others),
            "last_tool": s.last_tool or task.last_tool,
        }
        if s.session_id:
            totals["session_id"] = s.session_id
        if last_event_at is not None:
            totals["last_event_at"] = last_event_at
        self.store.update_task(task.id, **totals)
        for name, value in totals.items():
            setattr(task, name, value)
        return task

    def _watchdogs(self, task: Task, attempt: Attempt, now: float,
                   changes: list[TaskChange]) -> None:
        """The wall-clock timeout, stall detection and the SIGKILL after the kill grace, as
        policy.watchdog decides them (the runner enforces the timeout and the grace itself:
        this is the engine's backstop, for a runner of an older version or one that hangs)."""
        assert attempt.dir is not None
        asked = AttemptLog(attempt.dir).stop_request()
        fol = self._follows.get(attempt.id)
        watch = policy.watchdog(
            task, attempt, self.settings, now,
            stop_asked_at=_as_float(asked.get("at"), now) if asked else None,
            last_activity=fol.summary.last_activity if fol is not None else None)
        if watch.hard_kill:
            self.supervisor.kill(attempt)
        if watch.stalled is not None and self.store.update_task(
                task.id, expect_state=TaskState.RUNNING, state=TaskState.STALLED,
                message=watch.stalled):
            changes.append(TaskChange(task.id, TaskState.RUNNING, TaskState.STALLED,
                                      watch.stalled))
        if watch.stop is not None:
            self.supervisor.request_stop(attempt, *watch.stop)

    def _endpoint_watch(self, task: Task, attempt: Attempt, now: float) -> None:
        """Stop an attempt that retries a 429 while its endpoint is parked for a window or
        held for its account (another task met it): each of the CLI's own retries would be
        one more request into a closed window. Its verdict is that refusal (stop reason
        endpoint), so it is parked or failed like the task that met it."""
        fol = self._follows.get(attempt.id)
        if fol is None or not fol.retrying_429 or attempt.dir is None:
            return
        words = policy.stop_for_endpoint(self.store.get_endpoint(task.endpoint), now)
        if words is not None and not AttemptLog(attempt.dir).stop_request():
            log.info("task %s: stopped, its endpoint refuses what it retries", task.id)
            self.supervisor.request_stop(attempt, StopReason.ENDPOINT, words)

    # --- finishing ------------------------------------------------------------------------

    def finish(self, task: Task, attempt: Attempt, changes: list[TaskChange]) -> None:
        """Judge a finished (or dead) attempt and move the task on."""
        assert attempt.dir is not None
        now = self.clock()
        self.read_new(attempt, now, final=True)
        fol = self._follows[attempt.id]
        with _about(f"could not classify the run in {attempt.dir}"):
            ending = outcome.with_hints(self._judge(attempt, fol),
                                        retry_after=fol.retry_after,
                                        rate_limit=fol.rate_limit)
        s = fol.summary
        ending = outcome.with_tool_calls(ending, s.tool_calls, s.tool_errors)
        ended = self._runner_end(attempt, now)
        afresh = (AttemptLog(attempt.dir).runner_record() or {}).get("afresh")
        said = f"{afresh}; {ending.message}" if isinstance(afresh, str) else ending.message
        self.store.update_attempt(
            attempt.id, finished_at=ended, exit_code=ending.exit_code, signal=ending.signal,
            verdict=ending.verdict, message=said, turns=s.turns,
            input_tokens=s.input_tokens, output_tokens=s.output_tokens,
            session_id=s.session_id or attempt.session_id, last_tool=s.last_tool,
            events_offset=fol.offset)
        self._store_summary(task, attempt, now, False)
        self._follows.pop(attempt.id, None)
        self.supervisor.gateway.revoke(attempt)  # its token ends with it
        self.apply_outcome(task, attempt, ending.verdict, ending.message, now, changes,
                           ended=ended)

    @staticmethod
    def _runner_end(attempt: Attempt, now: float) -> float:
        """When the attempt's run ended, by its runner's own exit record: an attempt that
        ended while no fleet-tui process looked is recorded when one looks next, and its run
        time must not count that wait. `now` where the record is missing or its time is out
        of bounds (before the attempt started, or in the future)."""
        assert attempt.dir is not None
        record, _problem = AttemptLog(attempt.dir).exit_record()
        ended = _as_float(record.get("finished_at"), now) if record is not None else now
        low = (attempt.started_at or 0.0) - LAUNCH_SLACK
        return ended if math.isfinite(ended) and low <= ended <= now else now

    def _judge(self, attempt: Attempt, fol: _Follow) -> outcome.Ending:
        assert attempt.dir is not None
        folder = AttemptLog(attempt.dir)
        exit_record, problem = folder.exit_record()
        asked = folder.stop_request()
        no_record = ""
        if exit_record is None:
            # the runner died (or its record is damaged): it may not have cleaned up
            stopped = self.supervisor.stop_leftovers(attempt)
            if problem is None:
                strays = folder.remove_exit_strays()
                no_record = outcome.no_exit_record(
                    str(folder.dir), write_problem=folder.write_problem(),
                    stray=strays[0] if strays else None,
                    runner_log=str(folder.runner_log) if folder.runner_logged() else None,
                    stopped=stopped)
        message = asked.get("message")
        return outcome.judge_attempt(
            exit_record=exit_record, exit_problem=problem, exit_path=str(folder.exit_path),
            stop_reason=asked.get("reason"),
            stop_message=message if isinstance(message, str) else None,
            result=fol.result.data if fol.result is not None else None,
            stderr_tail=folder.stderr_tail(), no_record=no_record)

    def _counts(self, task: Task, *, lost: bool) -> tuple[int, int] | None:
        """(added, deleted) lines of the task at its attempt's end. A task on another
        host: its work fetched here first (`snapshot`: the branch and the uncommitted
        files, the worktree untouched there), unless its host was just lost."""
        assert task.worktree is not None and task.base_commit
        try:
            remote = self.supervisor.host_of(task).remote_worktrees()
            if remote is None:
                worktree = Path(task.worktree)
                return git.diff_stat(worktree, git.fork_point(
                    worktree, task.base_commit, task.base_branch))
            if lost:
                return None
            tip = remote.snapshot(task)
            base = git.fork_point(task.repo, task.base_commit, task.base_branch, head=tip)
            found = git.diff_commits(task.repo, base, tip)
            return found.added, found.deleted
        except (FleetTuiError, OSError) as exc:
            log.info("task %s: its changes were not counted: %s", task.id, exc)
            return None

    def apply_outcome(self, task: Task, attempt: Attempt, verdict: str, message: str,
                      now: float, changes: list[TaskChange], *,
                      ended: float | None = None) -> None:
        """Move the task on as policy.after_attempt says (once, and only if it is still on
        this attempt: another engine may have finished it and started the next one), and
        its endpoint with it (a park, a hold, a lowered cap), in the same transaction."""
        attempts = self.store.list_attempts(task.id)
        endpoint = self.store.get_endpoint(task.endpoint)
        active = self.store.count_tasks(ACTIVE_STATES, endpoint=task.endpoint)
        # the endpoint's own settings: its cap (a lowered one), its small model
        settings = self.settings.for_endpoint(task.endpoint)
        nxt = policy.after_attempt(task, attempts, verdict, message, settings, now,
                                   self.rng, endpoint=endpoint, active=max(1, active))
        fields_: dict[str, Any] = {"state": nxt.state, "verdict": nxt.verdict or verdict,
                                   "message": nxt.message, "not_before": nxt.not_before}
        if nxt.finished:
            fields_["finished_at"] = ended if ended is not None else now
        if task.worktree is not None and task.base_commit:
            counted = self._counts(task, lost=message.startswith("lost: "))
            if counted is not None:
                fields_["added_lines"], fields_["deleted_lines"] = counted
        applied: list[TaskState] = []
        effect = nxt.effect

        def change(current: Task) -> dict[str, Any] | None:
            if current.state not in ACTIVE_STATES or current.attempt_count != attempt.n:
                return None
            applied.append(current.state)
            # inside the task's transaction: the endpoint changes with the task, once
            if nxt.verdict is not None:
                self.store.update_attempt(attempt.id, verdict=nxt.verdict)
            if effect is not None:
                self.store.change_endpoint(
                    task.endpoint,
                    lambda state: policy.apply_effect(state, effect, settings, now), now)
            return fields_

        self.store.modify_task(task.id, change)
        if applied:
            changes.append(TaskChange(task.id, applied[0], nxt.state, nxt.message))

    # --- one task's trouble ---------------------------------------------------------------

    def on_task_error(self, task: Task, attempt: Attempt | None, exc: Exception,
                      changes: list[TaskChange]) -> None:
        if isinstance(exc, sqlite3.OperationalError):
            raise exc  # the database itself (locked, full, gone): not this task's data
        if isinstance(exc, OSError) and exc.errno in PASSING_ERRNOS:
            log.warning("following task %s: %s (tried again next pass)", task.id, exc)
            return
        if isinstance(exc, HostUnknown):
            # its worker may run on a host config.toml gained after this engine read it:
            # left to an engine that knows the host (or to this one once it read it again)
            if self._unknown_said.get(task.id) != str(exc):
                self._unknown_said[task.id] = str(exc)
                log.info("task %s: %s; left to an engine that knows its host", task.id, exc)
            return
        log.error("task %s: %s", task.id, describe_error(exc), exc_info=exc)
        try:
            self.mark_broken(task, attempt, outcome.engine_gave_up(describe_error(exc)),
                             changes)
        except Exception:  # marking failed too: say so in the log, go on with the others
            log.exception("could not mark task %s", task.id)

    def mark_broken(self, task: Task, attempt: Attempt | None, message: str,
                    changes: list[TaskChange]) -> None:
        """Fail one task (verdict crashed) with `message`. A runner of it that still lives
        is stopped: a failed task must not go on working unseen (nor beside a retry)."""
        if attempt is not None and attempt.dir is not None and attempt.finished_at is None:
            try:
                if self.supervisor.runner_state(attempt) == "alive":
                    # marked only once it is gone, so that no retry runs beside it
                    self.supervisor.stop_now(attempt, StopReason.ERROR, message)
            except Exception:
                log.exception("could not stop the runner of task %s", task.id)
        now = self.clock()
        if attempt is not None and attempt.finished_at is None:
            self.store.update_attempt(attempt.id, finished_at=now, verdict=Verdict.CRASHED,
                                      message=message)
            self._follows.pop(attempt.id, None)
        if self.store.update_task(task.id, expect_state=ACTIVE_STATES | PENDING_STATES,
                                  state=TaskState.FAILED, verdict=Verdict.CRASHED,
                                  message=message, finished_at=now, not_before=None):
            changes.append(TaskChange(task.id, task.state, TaskState.FAILED, message))

    # --- reading for the panel and the CLI ------------------------------------------------

    @staticmethod
    def read_events(attempt: Attempt, offset: int = 0, max_bytes: int | None = None
                    ) -> tuple[list[stream.Event], int]:
        """Parsed events from `offset` and the offset to go on from (attemptlog's one
        partial-line rule: a last line without newline counts once the attempt ended)."""
        if attempt.dir is None:
            return [], offset
        return AttemptLog(attempt.dir).read_events(offset, max_bytes,
                                                   finished=attempt_finished(attempt))


__all__ = ["PASSING_ERRNOS", "READ_CHUNK", "Follower", "TaskDataError", "attempt_finished",
           "describe_error"]
