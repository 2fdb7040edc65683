"""The scheduling pass: follow and finish every running attempt (whoever started it), then
claim what the per-endpoint cap and the endpoint's limits allow and start it (several at
once in the start threads, their claims kept fresh meanwhile), and now and then the chores
of a pass (attempt folders made private, closed tasks archived, merge queues without a
runner). `run` is the loop of a panel's or a CLI's scheduler thread."""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet_tui.core import policy
from fleet_tui.core.model import Attempt, EndpointState, Task
from fleet_tui.core.states import ACTIVE_STATES, PENDING_STATES, StopReason, TaskState
from fleet_tui.engine import supervisor
from fleet_tui.engine.actions import Actions
from fleet_tui.engine.branches import Branches
from fleet_tui.engine.context import Context, Part, log
from fleet_tui.engine.merge_queue import MergeQueue
from fleet_tui.engine.secret_cache import SecretCache
from fleet_tui.engine.supervisor import TaskChange
from fleet_tui.execution.worker.attemptlog import AttemptLog
from fleet_tui.settings.config import ConfigError, Settings
from fleet_tui.settings.config_core import config_file_location
from fleet_tui.settings.hosts import read_hosts
from fleet_tui.settings.watch import file_stamp, settled
from fleet_tui.store import budgets
from fleet_tui.store.db import StoreError
from fleet_tui.system import paths

TYPE_CHECKING = False
if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

__all__ = ["START_THREADS", "Scheduler"]

START_THREADS = 4  # worktrees made and runners spawned at once (git and fork wait on I/O)


class Scheduler(Part):
    """The pass (`tick`) and its loop (`run`)."""

    def __init__(self, ctx: Context, secrets: SecretCache, actions: Actions,
                 branches: Branches, queue: MergeQueue) -> None:
        super().__init__(ctx)
        self.secrets = secrets
        self.actions = actions
        self.branches = branches
        self.queue = queue
        self._secured = False
        self.last_error: str | None = None  # the last pass's failure (run); the panel shows it
        self._pool: ThreadPoolExecutor | None = None
        self._config_file = config_file_location(self.env)
        self._config_stamp = file_stamp(self._config_file)  # as the settings were read


    def tick(self) -> list[TaskChange]:
        """One pass: follow and finish running attempts (whoever started them), then start
        what the cap allows. Safe to call from several processes at once.

        One task's trouble stays that task's: an exception while following, finishing or
        starting it marks that task failed (verdict crashed) with a one-line reason naming
        the cause and the file, is logged, and every other task goes on. Only a problem of
        the database itself (locked for longer than the busy timeout, disk full) fails the
        whole pass."""
        with self.ctx.lock:
            try:
                changes = self._tick()
            except sqlite3.OperationalError as exc:  # locked past the busy timeout, full...
                raise StoreError(f"the task database {self.store.path} could not be used: "
                                 f"{exc}") from exc
            self.branches.settle_finished(changes)
        self.queue.resume_queues()
        return changes

    def _hosts_again(self) -> None:
        """config.toml's [hosts] read again once the file changed (and rested): every
        engine, a CLI's too, knows a host added while it runs (the panel reads all of its
        settings again, `check_settings`; this is the hosts alone). A file that does not
        read keeps the hosts in use."""
        stamp = file_stamp(self._config_file)
        if stamp == self._config_stamp or not settled(stamp):
            return
        self._config_stamp = stamp
        try:
            found = read_hosts(self._config_file, self.settings)
        except (ConfigError, OSError) as exc:
            log.warning("config.toml's hosts not read again: %s", exc)
            return
        if found != self.settings.hosts:
            log.info("config.toml's hosts read again: %s",
                     ", ".join(h.name for h in found) or "none")
            settings = dataclasses.replace(self.settings, hosts=found)
            self.ctx.settings = settings
            self.supervisor.apply_settings(settings)
            self.follower.settings = settings

    def _tick(self) -> list[TaskChange]:
        changes: list[TaskChange] = []
        self._hosts_again()
        self.supervisor.reap()
        if not self._secured:
            self._secured = True
            self._secure_logs()
        now = self.clock()
        active = self.store.list_tasks(states=ACTIVE_STATES)
        if active:
            # the key known before a worker's words are read and stored (redaction)
            self.secrets.get()
        live: set[int] = set()
        for task in active:
            attempt: Attempt | None = None
            try:
                attempt = self.store.latest_attempt(task.id)
                if attempt is not None:
                    live.add(attempt.id)
                self.follower.follow(task, attempt, now, changes)
                self._stop_over_budget(task, attempt)
            except Exception as exc:
                self.follower.on_task_error(task, attempt, exc, changes)
        self.follower.forget_all_but(live)
        self.supervisor.gateway.keep_alive(self.settings, bool(active))
        self._start_ready(changes)
        self._auto_archive()
        return changes

    def run(self, stop: threading.Event, interval: float = 0.25) -> None:
        """Tick until `stop` is set (meant for a thread of the panel or the CLI).

        Between ticks it waits `interval`, but a runner this engine started that exits
        ends the wait at once: its slot is refilled without waiting for the next tick."""
        while not stop.is_set():
            try:
                self.tick()
                self.last_error = None
            except Exception as exc:  # keep scheduling; the panel shows last_error
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("fleet tick failed")
            self.supervisor.wait(stop, interval)

    def _start_ready(self, changes: list[TaskChange]) -> None:
        ready = self.store.list_tasks(states=PENDING_STATES)
        # endpoints with work to start, and those whose limits may end (a park over)
        states = self.store.list_endpoints()
        limited = {e.endpoint for e in states
                   if e.parked_until is not None or e.held is not None}
        endpoints = sorted({t.endpoint for t in ready} | limited)
        # each claim with its endpoint's settings as this pass resolved them: its launch
        # uses those (one resolution from the claim to the runner)
        claimed: list[tuple[Task, TaskState, Settings]] = []
        held = {e.endpoint for e in states if policy.budget_held(e)}
        for endpoint in endpoints:
            self._budget_hold(endpoint, endpoint in held)
            # the cooldown comes from finished attempts, which only a tick moves on; its
            # tasks (waiting, verdict quota) are among `ready`, so no second read
            if policy.cooldown_until(endpoint, ready, self.clock()) is not None:
                continue
            # its key is a variable of the environment this engine lacks: its tasks wait for
            # a fleet-tui that has it (another shell's value is never theirs)
            lacks = self.supervisor.gateway.cannot_start(self.settings, endpoint)
            if lacks is not None:
                self._note_queued(endpoint, lacks, ready)
                continue
            closed: list[str | None] = [None]
            # each endpoint under its own settings: its worker cap, its key's fingerprint
            own = self.settings.for_endpoint(endpoint)
            decide = self._decider(own, closed)
            caps = self.supervisor.host_caps()  # each host's max_workers
            # a host these settings do not have (config.toml gained it since): its tasks
            # are left to an engine that knows it (a cap of 0 here), never failed
            for name in {t.host for t in ready} - set(caps) - {"any"}:
                if not self.supervisor.hosts.knows(name):
                    caps[name] = 0
            # its attempts start in step with its request slots (policy.start_window)
            window = policy.start_window(self.settings, endpoint)
            while True:
                # the endpoint's limits (a park, a hold, a lowered cap) are read and obeyed
                # in the claim's own transaction: no engine starts a task into a window
                now = self.clock()
                task = self.store.claim_gated(
                    endpoint, now, self.owner, decide, hosts=caps,
                    starting=None if window is None else (window, now - policy.START_BOUND))
                if task is None:
                    break
                old = TaskState.WAITING if task.verdict in policy.TRANSIENT \
                    else TaskState.QUEUED
                if task.row_error is not None:  # never run what cannot be read as it is
                    try:
                        self.follower.mark_broken(task, None, task.row_error, changes)
                    except Exception:
                        log.exception("could not mark task %s", task.id)
                    continue
                spent = budgets.task_refusal(self.store, self.settings, task.id, endpoint)
                if spent is not None and self.store.kill_unlaunched(task.id, self.clock(),
                                                                    spent):
                    changes.append(TaskChange(task.id, old, TaskState.KILLED, spent))
                    continue
                claimed.append((task, old, own))
            self._note_queued(endpoint, policy.queued_note(closed[0]), ready)
        if len(claimed) <= 1:
            for task, old, own in claimed:
                self.supervisor.start(task, old, changes, own)
            return
        # Several at once (the cap just opened, or a batch was queued): their worktrees and
        # runners are made in parallel; the tick returns once every one has started or
        # failed. Meanwhile the claims not yet started are kept fresh (claimed_at), the
        # heartbeat by which an engine on another host tells a slow start from a dead one.
        from concurrent.futures import ThreadPoolExecutor  # here: a pass that starts several
        from concurrent.futures import wait as futures_wait

        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=START_THREADS,
                                            thread_name_prefix="fleet-start")
        pending = {self._pool.submit(self.supervisor.start, task, old, changes, own): task
                   for task, old, own in claimed}
        while pending:
            done, _ = futures_wait(pending, timeout=max(0.05, supervisor.START_GRACE / 4))
            for future in done:
                del pending[future]
                future.result()
            if pending:
                try:
                    self.store.touch_claims([t.id for t in pending.values()], self.owner,
                                            self.clock())
                except sqlite3.Error as exc:
                    log.warning("could not refresh the claims: %s", exc)

    def _budget_hold(self, endpoint: str, held: bool) -> None:
        """Hold the endpoint once its spend since the local day began has met its
        budget_per_day, with the figure (the event said once: the panel's one
        notification; the figure kept up to date); lift the hold when the budget allows
        again (the next day, a higher budget in config.toml). Running tasks go on."""
        now = self.clock()
        try:
            refusal = budgets.endpoint_refusal(self.store, self.settings, endpoint, now)
            if refusal is None and not held:
                return

            def change(state: EndpointState) -> dict[str, Any] | None:
                if refusal is None:
                    return ({"held": None, "held_task": None, "held_settings": None}
                            if policy.budget_held(state) else None)
                if state.held is None:
                    log.info("endpoint %s held: %s", endpoint, refusal)
                    return {"held": refusal, "held_task": None,
                            "held_settings": f"{policy.BUDGET_HOLD}{budgets.day_start(now)}",
                            "event": "hold", "event_at": now}
                if policy.budget_held(state) and state.held != refusal:
                    return {"held": refusal}  # the figure grew: no new event
                return None

            self.store.change_endpoint(endpoint, change, now)
        except sqlite3.Error as exc:
            log.warning("could not check the budget of %s: %s", endpoint, exc)

    def _stop_over_budget(self, task: Task, attempt: Attempt | None) -> None:
        """Stop a running attempt whose task has met its budget_per_task (killed, the
        figure its message); the gateway refuses its next request meanwhile."""
        if attempt is None or attempt.dir is None or attempt.finished_at is not None \
                or task.state not in ACTIVE_STATES:
            return
        refusal = budgets.task_refusal(self.store, self.settings, task.id, task.endpoint)
        if refusal is None:
            return
        if not AttemptLog(attempt.dir).stop_request():
            log.info("task %s: %s", task.id, refusal)
            self.supervisor.request_stop(attempt, StopReason.BUDGET, refusal)

    def _decider(self, settings: Settings, closed: list[str | None]) -> Callable[
            [EndpointState | None, int, float],
            tuple[int | None, dict[str, Any] | None, dict[str, Any] | None,
                  dict[str, Any] | None, bool]]:
        """store.claim_gated's `decide`: policy.gate, keeping why it is closed in
        `closed[0]`. `settings`: the endpoint's (Settings.for_endpoint)."""
        key = policy.settings_key(settings)

        def decide(state: EndpointState | None, parked: int, now: float
                   ) -> tuple[int | None, dict[str, Any] | None, dict[str, Any] | None,
                              dict[str, Any] | None, bool]:
            gate = policy.gate(state, settings, now, parked, settings_now=key)
            closed[0] = gate.why
            return gate.as_tuple()
        return decide

    def _note_queued(self, endpoint: str, note: str | None, ready: list[Task]) -> None:
        """Tell the endpoint's queued tasks why they do not start (a park, a hold), or
        take that back; written only when one of them (as just read) says otherwise."""
        prefixes = policy.NOTE_PREFIXES
        if any(t.endpoint == endpoint and t.state == TaskState.QUEUED and t.message != note
               and (t.message is None or t.message.startswith(prefixes)) for t in ready):
            try:
                self.store.note_queued(endpoint, note, prefixes)
            except sqlite3.Error as exc:
                log.warning("could not note why the tasks of %s wait: %s", endpoint, exc)

    def _secure_logs(self) -> None:
        """Make each repository's attempt folders private (0700 `.fleet-work/.logs`); in an
        install from before this was done, also every folder and file under it."""
        try:
            repos = self.store.repos()
        except sqlite3.Error:
            return
        for repo in repos:
            logs = paths.logs_dir(repo)
            if not paths.make_private(logs, paths.PRIVATE_DIR):
                continue
            for folder, dirs, files in os.walk(logs):
                for name in dirs:
                    paths.make_private(Path(folder, name), paths.PRIVATE_DIR)
                for name in files:
                    paths.make_private(Path(folder, name), paths.PRIVATE_FILE)

    AUTO_ARCHIVE_EVERY = 600.0  # seconds between two auto-archive passes of one engine
    _auto_archived_at = 0.0

    def _auto_archive(self) -> None:
        """The archive_after_days setting, applied by the scheduling pass now and then."""
        days = self.settings.archive_after_days
        now = self.clock()
        if days <= 0 or now - self._auto_archived_at < self.AUTO_ARCHIVE_EVERY:
            return
        self._auto_archived_at = now
        archived = self.actions.archive_closed(days)
        if archived:
            log.info("archived %d closed task(s) older than %g days", len(archived), days)
