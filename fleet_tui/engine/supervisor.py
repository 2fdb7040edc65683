"""The engine's supervisor: it starts attempts on a host and knows whether they live.

Starting one attempt (`start`): the host makes the worktree, checks it and places the
attempt (config dir, attempt folder), the attempt's spec is written and its lock taken
(`Host.stage`), the placement is recorded in the store (only while the task is still
claimed by this engine and not killed), and only then does the host start the runner.
Afterwards, through the attempt's `Run` on its host: whether a runner lives, adoption of a
runner whose engine died before recording it, the stop request and the signals, the
processes a dead runner left behind (found by the attempt's token). Claims whose starter
is provably gone are the supervisor's own (they are the store's, not a host's).

What to run (the model, the time limit) is policy's; where and how is the host's
(`execution.host`); what the folder holds is attemptlog's.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_tui.core import outcome, policy
from fleet_tui.core.errors import FleetError, FleetTuiError
from fleet_tui.core.model import Attempt, Task
from fleet_tui.core.states import ACTIVE_STATES, StopReason, TaskState, Verdict
from fleet_tui.core.stream import one_line
from fleet_tui.engine.gateway_link import GatewayLink
from fleet_tui.execution import remote_cage
from fleet_tui.execution.host import Host, NotStarted, Placement, Run, RunnerState
from fleet_tui.execution.hosts import Hosts
from fleet_tui.execution.worker.attemptlog import AttemptLog
from fleet_tui.execution.worker.spec import RunSpec
from fleet_tui.settings import endpoints
from fleet_tui.settings.config import ConfigError, Settings
from fleet_tui.settings.hosts import LOCAL
from fleet_tui.settings.repo_settings import RepoSettingsCache
from fleet_tui.store.db import Store
from fleet_tui.system import procs

log = logging.getLogger("fleet_tui.engine.fleet")

LOST_LOOK = 5.0  # seconds between two looks in the store for hosts with lost attempts
START_GRACE = 60.0  # a claim by another host's engine with no heartbeat for this long is dead

_HOST = os.uname().nodename  # gethostname's answer, without loading socket
# the supervisors of this process by owner string: a claim by one of them that no longer
# exists is abandoned even though the process lives
_LIVE_OWNERS: weakref.WeakValueDictionary[str, Supervisor] = weakref.WeakValueDictionary()
_ENGINE_SEQ = itertools.count(1)  # owner strings stay unique in a process (ids are reused)


@dataclass
class TaskChange:
    task_id: str
    old: TaskState | None
    new: TaskState
    message: str | None = None


def describe(exc: BaseException) -> str:
    """One line naming the cause of an unexpected exception (and, for a file, which)."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return one_line(f"{type(exc).__name__}: {exc}", 300)


class StoreLedger:
    """The hosts' lost attempts in the store (`Host.keep_lost_in`)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def lost(self, host: str, task_id: str, attempt: int, reason: str) -> None:
        self.store.record_lost(host, task_id, attempt, reason, time.time())

    def swept(self, host: str, task_id: str, attempt: int, processes: int) -> None:
        self.store.mark_swept(host, task_id, attempt, processes, time.time())

    def to_sweep(self, host: str) -> list[tuple[str, int, str]]:
        return [(t, n, r) for _h, t, n, r in self.store.lost_to_sweep(host)]


def parse_owner(owner: str | None) -> tuple[str, int, str | None] | None:
    """host, pid and start time from an engine's owner string (host:pid:start:object; an
    older one has no start time)."""
    if not owner:
        return None
    parts = owner.split(":")
    if len(parts) not in (3, 4) or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1]), parts[2] if len(parts) == 4 else None


class Supervisor:
    """Starts and stops the attempts of one engine on its host (thread-safe for its
    callers: the engine starts several attempts at once in its start threads)."""

    def __init__(self, settings: Settings, store: Store, *, env: Mapping[str, str],
                 clock: Any, python: str, repo_settings: RepoSettingsCache | None = None,
                 host: Host | None = None, hosts: Mapping[str, Host] | None = None) -> None:
        self.settings = settings
        self.store = store
        # each repository's .fleet-tui.toml (setup, include): read when an attempt starts
        self.repo_settings = repo_settings or RepoSettingsCache(env)
        self.env = env
        self.clock = clock
        self.python = python
        # where attempts run, by name (execution.hosts): `local` (this machine unless
        # given), and each [hosts.NAME] of config.toml, built when first used
        self.hosts = Hosts(settings.all_hosts, env=env, python=python, local=host,
                           given=hosts)
        # the gateway's tokens; the engine's front gives it the key's source
        self.gateway = GatewayLink(store, env=env, python=python)
        # who claims tasks: host, pid and its start time (so a claim's starter can be proven
        # gone), and this object (several engines may live in one process)
        self.owner = (f"{_HOST}:{os.getpid()}:{procs.start_time(os.getpid()) or 0}:"
                      f"{next(_ENGINE_SEQ)}-{id(self):x}")
        _LIVE_OWNERS[self.owner] = self
        # the hosts handed the store to keep their lost attempts in (each object once)
        self._ledgered: weakref.WeakSet[Host] = weakref.WeakSet()
        self._lost_looked = -LOST_LOOK
        self.lost_ledger = StoreLedger(store)

    # --- our hosts and runners -------------------------------------------------------------

    @property
    def host(self) -> Host:
        """The local host (this machine, or the host the engine was given for it)."""
        return self.hosts.local

    def host_of(self, task: Task) -> Host:
        """The host the task runs on (FleetError: gone from config.toml; HostUnavailable:
        this build cannot use it). A task still placed "any" has none yet: local."""
        return self.host_of_name(task.host)

    def host_of_name(self, name: str | None) -> Host:
        """The host of that name (None, and "any" not placed yet: local)."""
        return self.hosts.get(name if name and name != "any" else None)

    def apply_settings(self, settings: Settings) -> None:
        self.settings = settings
        self.hosts.configure(settings.all_hosts)

    def host_caps(self) -> dict[str, int]:
        """Each host's worker cap, in the order `any` prefers them on a tie (local first,
        then config.toml's), the hosts this build cannot use left out (their tasks start
        and fail saying why; `any` never picks them)."""
        caps = {h.name: h.max_workers for h in self.settings.all_hosts}
        for name in self.hosts.names():
            caps.setdefault(name, self.settings.max_workers)
        return {name: cap for name, cap in caps.items() if self.hosts.why_not(name) is None}

    def reap(self) -> None:
        self._keep_lost()
        for host in self.hosts.built():
            host.reap()

    def _keep_lost(self) -> None:
        """Every host keeps the attempts it loses in the store, and a host with lost
        attempts not swept yet is built (by an engine restarted since: no task of it may
        run now), so that it sweeps them once it answers."""
        now = time.monotonic()
        if now - self._lost_looked >= LOST_LOOK:
            self._lost_looked = now
            for name in dict.fromkeys(h for h, _t, _n, _r in self.store.lost_to_sweep()):
                try:
                    self.hosts.named(name)
                except FleetError as exc:
                    log.info("lost attempts of host %s not swept: %s", name, exc)
        for host in self.hosts.built():
            if host not in self._ledgered:
                self._ledgered.add(host)
                host.keep_lost_in(self.lost_ledger)

    def wait(self, stop: threading.Event, interval: float) -> None:
        """Sleep up to `interval`; return early when `stop` is set or one of our runners
        has exited. With several hosts in use, each is asked in turn for a slice of it."""
        hosts = list(self.hosts.built())
        if len(hosts) <= 1:
            (hosts[0] if hosts else self.host).wait(stop, interval)
            return
        import time

        deadline = time.monotonic() + interval
        step = min(0.05, interval / len(hosts))
        while not stop.is_set():
            for host in hosts:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                slice_ = min(step, left)
                begun = time.monotonic()
                host.wait(stop, slice_)
                if time.monotonic() - begun < slice_ * 0.5:
                    return  # it returned early: one of its runners ended

    def run(self, attempt: Attempt) -> Run:
        """The attempt's run on the host it was placed on."""
        return self.hosts.for_attempt(attempt).attach(attempt)

    # --- starting -------------------------------------------------------------------------

    @staticmethod
    def _settings_overrides(task: Task, s: Settings) -> dict[str, Any]:
        """The launcher's settings for the task's runner (spec.json: never a key): its
        endpoint's base URL, models and key settings (`s`: Settings.for_endpoint, with the
        repository's settings applied: its cage and hosts)."""
        return {
            "base_url": s.base_url, "model": s.model,
            "small_model": s.small_model, "permission_mode": s.permission_mode,
            "effort": task.effort or s.effort, "keyring_service": s.keyring_service,
            "keyring_key": s.keyring_key, "claude": s.claude, "sandbox": s.sandbox,
            "key_sources": list(s.key_sources), "config_dir": str(s.config_dir),
            "key_helper": s.key_helper, "scrub_tool_env": s.scrub_tool_env,
            "cage": s.cage, "allow_hosts": list(s.allow_hosts),
        }

    def _endpoint_env(self, task: Task, env: dict[str, str]) -> dict[str, str]:
        """The runner's environment for the task's endpoint (endpoints.runner_env): no
        endpoint's key_env variable, and for an endpoint with a key of its own only that
        key among the key variables (the host hands those over through a pipe). A
        key_env endpoint whose variable is unset: the start fails, saying which."""
        try:
            return endpoints.runner_env(self.settings.endpoint_of(task.endpoint),
                                        self.settings.endpoints, env, keys_from=self.env)
        except endpoints.MissingKey as exc:
            raise FleetError(str(exc)) from None

    def runner_env(self) -> dict[str, str]:
        """The environment a detached process of this engine starts with here (the merge
        queue's runner): the local host's."""
        return self.host.runner_env()

    def start(self, task: Task, old: TaskState, changes: list[TaskChange],
              settings: Settings | None = None) -> None:
        """Worktree, config dir, spec.json, runner. A failure fails the task, clearly; never
        raises (it runs in the start threads). `settings`: as for `launch`."""
        try:
            attempt = self.launch(task, settings)
        except NotStarted as exc:
            log.info("task %s not started: %s", task.id, exc)
            return
        except Exception as exc:
            if isinstance(exc, FleetTuiError):
                reason = str(exc)
            else:
                if not isinstance(exc, OSError):
                    log.error("starting task %s", task.id, exc_info=exc)
                reason = describe(exc)
            message = outcome.could_not_start(reason)
            try:
                now = self.clock()
                if self.store.update_task(task.id, expect_state=ACTIVE_STATES,
                                          state=TaskState.FAILED, verdict=Verdict.CRASHED,
                                          message=message, finished_at=now):
                    latest = self.store.latest_attempt(task.id)
                    if latest is not None and latest.finished_at is None:
                        self.store.update_attempt(latest.id, finished_at=now,
                                                  verdict=Verdict.CRASHED, message=message)
                    changes.append(TaskChange(task.id, old, TaskState.FAILED, message))
            except Exception:
                log.exception("could not mark task %s as failed to start", task.id)
            return
        changes.append(TaskChange(task.id, old, TaskState.RUNNING,
                                  f"attempt {attempt.n} started ({attempt.model})"))

    def launch(self, task: Task, settings: Settings | None = None) -> Attempt:
        """Start one attempt. The runner is known before it can run: the attempt is staged
        on its host (lock taken, spec written) and recorded in the store (only while the
        task is still ours and not killed) before the host starts its runner.

        `settings`: the task's endpoint's (Settings.for_endpoint), as the pass that claimed
        it resolved them (None: resolved here); the model and the runner's settings both
        come from them."""
        now = self.clock()
        gone = endpoints.missing(self.settings.endpoints, task.endpoint)
        if gone is not None:  # never sent to another provider than the one it was given
            raise FleetError(gone)
        own = settings if settings is not None else self.settings.for_endpoint(task.endpoint)
        attempts = self.store.list_attempts(task.id)
        if attempts and attempts[-1].row_error is not None:
            raise FleetError(attempts[-1].row_error)
        pending = attempts[-1] if attempts and attempts[-1].runner_pid is None \
            and attempts[-1].finished_at is None else None
        host = self.host_of(task)  # placed by its claim (tasks.host): all its attempts there
        self._one_worker(task, attempts, pending, now)
        # the engine's own retry after the endpoint cut a run off resumes its session
        # when it made progress (policy.automatic_attempt); else a fresh start
        kind, prompt = policy.automatic_attempt(task, attempts)
        if pending is not None:  # the user's: a retry, a resume or a follow-up
            kind = pending.kind
        worktree = self._worktree(host, task, attempts, kind)
        # never run in the main checkout, whatever happened to the worktree
        host.check_worktree(task, worktree)
        model = policy.model_for(task, attempts, own)
        if pending is None:
            attempt = self.store.add_attempt(task.id, kind=kind, prompt=prompt, now=now,
                                             model=model)
        else:
            attempt = pending
            attempt.model = model
        placement = host.place(task, worktree, attempt.n)
        try:
            ready = self.repo_settings.get(Path(task.repo))
        except ConfigError as exc:  # never read well: the task cannot start as asked
            raise FleetError(f"the repository's settings do not read: {exc}") from None
        # FLEET_PORT: free on the host now, and held by no other running attempt
        port = self.store.assign_port(attempt.id, host.free_port)
        resume = task.session_id if attempt.kind in ("resume", "followup") else None
        runner_settings = own
        with contextlib.suppress(ConfigError):  # a bad file fails the start later, saying why
            runner_settings = self.repo_settings.get(Path(task.repo)).apply(own)
        overrides = self._settings_overrides(task, runner_settings)
        if host.name != LOCAL:  # the host's own cage setting ("off": uncaged there)
            overrides["cage"] = remote_cage.mode_for(host, overrides["cage"])
        # the endpoint's key variables, then (gateway on) the token in their place
        runner_env = self._endpoint_env(task, host.runner_env())
        token = self._through_gateway(host, task, attempt, overrides, runner_env)
        try:
            return self._stage_and_spawn(host, task, attempt, placement, worktree, model, port,
                                         resume, ready, overrides, runner_env, now)
        except BaseException:
            if token is not None:  # only this one: a live runner of the attempt keeps its own
                self.gateway.revoke_token(token)
            raise

    def _through_gateway(self, host: Host, task: Task, attempt: Attempt,
                         overrides: dict[str, Any], runner_env: dict[str, str]) -> str | None:
        """With the `gateway` setting on: the attempt's base URL is the gateway's, its key
        a token of its own (both changed in place; the token returned); off: nothing
        changes (direct, None)."""
        # a remote host that forwards the gateway's port over its connection says so
        remote_ok = bool(getattr(host, "reaches_gateway", False))
        return self.gateway.through(self.settings, task, attempt, host.name, overrides,
                                    runner_env, remote_ok=remote_ok)

    def _stage_and_spawn(self, host: Host, task: Task, attempt: Attempt, placement: Placement,
                         worktree: Path, model: str | None, port: int, resume: str | None,
                         ready: Any, overrides: dict[str, Any], runner_env: dict[str, str],
                         now: float) -> Attempt:
        import secrets  # here: it loads hmac, hashlib and random, for a start alone

        spec = RunSpec(cwd=str(worktree), prompt=attempt.prompt or task.prompt,
                       config_dir=str(placement.config_dir), args=list(task.extra_args),
                       model=model, permission_mode=task.permission_mode,
                       max_turns=task.max_turns, resume=resume,
                       fresh_prompt=self._fresh_prompt(task, attempt) if resume else None,
                       settings=overrides, task_id=task.id,
                       attempt=attempt.n, token=secrets.token_hex(16),
                       timeout=policy.time_limit(task, self.settings),
                       kill_grace=self.settings.kill_grace,
                       repo=str(task.repo), include=list(ready.include), setup=ready.setup,
                       env={"FLEET_TASK_ID": task.id, "FLEET_PORT": str(port)})
        staged = host.stage(placement, spec)
        try:
            self._record_launch(task, attempt, placement, model, now)
            pid = staged.spawn(runner_env)
        except BaseException:
            staged.abandon()
            raise
        # The runner runs whatever happens below; if this bookkeeping fails, following
        # adopts the runner from its own record (runner.json).
        try:
            AttemptLog(placement.attempt_dir).write_launch_record(
                {"runner_pid": pid, "runner_start": procs.start_time(pid),
                 "started_at": now, "owner": self.owner})
            self.store.update_attempt(attempt.id, runner_pid=pid)
        except Exception:
            log.exception("recording the runner of task %s", task.id)
        attempt.runner_pid = pid
        attempt.dir = placement.attempt_dir
        attempt.started_at = now
        return attempt

    @staticmethod
    def _fresh_prompt(task: Task, attempt: Attempt) -> str:
        """What a resume starts with instead when claude never saved the session (the
        runner looks, RunSpec.afresh): the task's prompt; a follow-up's after it."""
        if attempt.kind == "followup" and attempt.prompt:
            return f"{task.prompt}\n\n{attempt.prompt}"
        return task.prompt

    def _one_worker(self, task: Task, attempts: list[Attempt], pending: Attempt | None,
                    now: float) -> None:
        """One live worker per task: an earlier attempt's runner still stopping (a kill's
        grace) comes first; the task goes back to the queue and is tried again."""
        for earlier in attempts:
            if earlier is not pending and earlier.dir is not None \
                    and AttemptLog(earlier.dir).lock_held() is True:
                current = self.store.get_task(task.id)
                self.store.requeue_claim(task.id, self.owner, current.claimed_at, now,
                                         f"waiting for the runner of attempt {earlier.n} "
                                         "to stop")
                raise NotStarted(f"the runner of attempt {earlier.n} still lives")

    def _worktree(self, host: Host, task: Task, attempts: list[Attempt], kind: str) -> Path:
        """The task's worktree, made by the host when it has none (recorded at once)."""
        worktree = task.worktree
        remote = host.remote_worktrees()
        if worktree is not None and (Path(worktree).is_dir() if remote is None
                                     else remote.has_worktree(task)):
            return Path(worktree)  # (a remote host's: asked there, never looked at here)
        # its folder deleted by hand with a session to continue: the branch is checked out
        # again as it is (BranchGone when it is gone). A retry may find what a failed start
        # left behind, and so may a task claimed before by an engine that died while making
        # its worktree (no runner ran: that needs the attempt folder, recorded later): then
        # start clean.
        reattach = kind in ("resume", "followup") and bool(task.session_id)
        claimed_before = (task.started_at is not None and task.claimed_at is not None
                          and task.started_at < task.claimed_at)
        info = host.make_worktree(
            task, reattach=reattach,
            reset=worktree is not None or bool(attempts) or claimed_before)
        self.store.update_task(task.id, worktree=info.path, branch=info.branch,
                               base_commit=task.base_commit or info.base_commit,
                               base_branch=task.base_branch or info.base_branch)
        return Path(info.path)

    def _record_launch(self, task: Task, attempt: Attempt, placement: Placement,
                       model: str | None, now: float) -> None:
        """The placement in the store before anything runs; NotStarted when the task was
        killed or taken over meanwhile (the attempt closed as the task says)."""
        folder_log = AttemptLog(placement.attempt_dir)
        # events_path, stderr_path and exit_path are written for older fleet-tui versions
        # sharing the store; nothing reads them (the folder is the truth)
        if self.store.record_launch(
                task.id, attempt.id, self.owner,
                {"runner_pid": None, "started_at": now, "model": model,
                 "dir": placement.attempt_dir, "events_path": folder_log.events,
                 "stderr_path": folder_log.stderr, "exit_path": folder_log.exit_path,
                 "config_dir": placement.config_dir, "events_offset": 0,
                 "host": placement.host, "placement": json.dumps(placement.to_record())},
                {"verdict": None, "message": None, "finished_at": None,
                 "last_event_at": None, "attempt_count": attempt.n}):
            return
        current = self.store.get_task(task.id)
        if current.state not in ACTIVE_STATES:  # killed meanwhile: close the attempt
            self.store.update_attempt(attempt.id, finished_at=now,
                                      verdict=current.verdict or Verdict.KILLED,
                                      message=current.message)
        raise NotStarted("it was killed, or taken over, before its runner started")

    # --- claims ---------------------------------------------------------------------------

    def claimer_gone(self, task: Task, now: float) -> str | None:
        """Why the engine that claimed `task` is provably gone, or None when it may still
        be starting it. On this host: its pid and start time (and, in this very process,
        whether that engine object still exists). Elsewhere: no heartbeat for START_GRACE."""
        owner = task.claimed_by
        claimed = task.claimed_at or task.updated_at
        parsed = parse_owner(owner)
        if parsed is None or parsed[0] != _HOST:
            if now - claimed > START_GRACE:
                where = f" on {parsed[0]}" if parsed else ""
                return (f"its engine{where} gave no sign of life for {START_GRACE:g} s while "
                        "starting it")
            return None
        _host, pid, start = parsed
        if pid == os.getpid():
            alive = owner in _LIVE_OWNERS
        elif start is None:  # a claim from before start times were recorded
            alive = procs.is_alive(pid) and now - claimed <= START_GRACE
        else:
            alive = procs.is_alive(pid, start)
        return None if alive else f"its engine (pid {pid}) stopped while starting it"

    def requeue_if_abandoned(self, task: Task, now: float,
                             changes: list[TaskChange]) -> None:
        if task.claimed_by == self.owner:
            return  # ours: being started (or its failure already marked)
        why = self.claimer_gone(task, now)
        if why is None:
            return
        if self.store.requeue_claim(task.id, task.claimed_by, task.claimed_at, now,
                                    f"requeued: {why}"):
            changes.append(TaskChange(task.id, task.state, TaskState.QUEUED, "requeued"))

    # --- is it alive ----------------------------------------------------------------------

    def runner_identity(self, attempt: Attempt) -> tuple[int | None, str | None]:
        """The runner's pid and start time on its host: from the engine's launch record or
        the runner's own (the runner of an engine that died before recording it)."""
        if attempt.dir is None:
            return attempt.runner_pid, None
        return self.run(attempt).identity()

    def runner_state(self, attempt: Attempt) -> RunnerState:
        """"alive": the attempt's runner lives; "dead": it ran and is gone; "never": no
        runner was ever started for it (a start that did not happen)."""
        assert attempt.dir is not None
        return self.run(attempt).state()

    def runner_alive(self, attempt: Attempt) -> bool:
        return attempt.dir is not None and self.runner_state(attempt) == "alive"

    def adopt(self, attempt: Attempt) -> None:
        """Record the runner an engine started but died before recording."""
        pid, _start = self.runner_identity(attempt)
        if pid is not None and attempt.runner_pid is None:
            self.store.update_attempt(attempt.id, runner_pid=pid)
            attempt.runner_pid = pid
            log.info("adopted the runner %s of task %s", pid, attempt.task_id)

    def wait_runner(self, attempt: Attempt, timeout: float) -> bool:
        return self.run(attempt).wait_gone(timeout)

    # --- stopping -------------------------------------------------------------------------

    def request_stop(self, attempt: Attempt, reason: StopReason, message: str) -> None:
        """Record why (so any engine that finishes the attempt classifies it right), then
        ask the runner to stop: it passes the request on to claude's group and every
        descendant and kills them after the kill grace by itself."""
        assert attempt.dir is not None
        self.run(attempt).request_stop(reason, message, at=self.clock(), by=self.owner)

    def stop_now(self, attempt: Attempt, reason: StopReason, message: str) -> None:
        """Ask the runner to stop and wait for it to be gone: killed with all it started
        once the kill grace (and the runner's head start) has passed."""
        self.request_stop(attempt, reason, message)
        run = self.run(attempt)
        if not run.wait_gone(self.settings.kill_grace + policy.RUNNER_HEADSTART):
            run.kill()
            run.wait_gone(5.0)
        self.gateway.revoke(attempt)

    def kill(self, attempt: Attempt) -> None:
        """End the attempt's runner and everything it started, now (the engine's backstop
        after the kill grace)."""
        self.run(attempt).kill()
        self.gateway.revoke(attempt)

    def stop_leftovers(self, attempt: Attempt) -> int:
        """Stop every process the attempt started that outlived its runner (a Bash step's
        setsid/nohup/double-fork daemon now under pid 1): found by the attempt's token.
        Returns how many there were."""
        if attempt.dir is None:
            return 0
        return self.run(attempt).sweep()


__all__ = ["START_GRACE", "NotStarted", "Supervisor", "TaskChange", "describe", "parse_owner"]
