"""The engine's supervisor: it starts runners, signals them and knows whether they live.

Starting one attempt (`start`): the worktree, the task's config dir, the attempt's folder
and `spec.json`, then the runner, a detached process. The runner is known before it can
run: the attempt's folder is recorded in the store (only while the task is still claimed
by this engine and not killed) and its lock taken before the spawn; the runner inherits the
held lock. Afterwards: whether a runner lives (its lock), adoption of a runner whose engine
died before recording it, the stop request and the signals (SIGTERM to the runner, which
passes it on; SIGKILL to the whole tree), the processes a dead runner left behind (found
by the attempt's token), reaping, and claims whose starter is provably gone.

What to run (the model, the time limit) is policy's; what the folder holds is attemptlog's.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fleet_tui.core import outcome, policy
from fleet_tui.core.errors import FleetError, FleetTuiError
from fleet_tui.core.states import ACTIVE_STATES, StopReason, TaskState, Verdict
from fleet_tui.core.stream import one_line
from fleet_tui.execution.local.attemptlog import AttemptLog
from fleet_tui.execution.local.runner import LEFTOVER_GRACE, RUNNER_MODULE, TOKEN_ENV, RunSpec
from fleet_tui.settings.config import ConfigError, Settings
from fleet_tui.settings.repo_settings import RepoSettingsCache
from fleet_tui.store.db import Attempt, Store, Task
from fleet_tui.system import paths, procs
from fleet_tui.system.spawn import package_env, spawn_detached
from fleet_tui.vcs import git

log = logging.getLogger("fleet_tui.engine.fleet")

START_GRACE = 60.0  # a claim by another host's engine with no heartbeat for this long is dead
CHILD_POLL = 0.01  # while our runners live, the scheduler checks this often whether one exited

_HOST = socket.gethostname()
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


class NotStarted(Exception):
    """A start that must not happen (killed or taken over meanwhile, or a runner of the
    attempt lives already): nothing to mark, nothing spawned."""


def describe(exc: BaseException) -> str:
    """One line naming the cause of an unexpected exception (and, for a file, which)."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return one_line(f"{type(exc).__name__}: {exc}", 300)


def parse_owner(owner: str | None) -> tuple[str, int, str | None] | None:
    """host, pid and start time from an engine's owner string (host:pid:start:object; an
    older one has no start time)."""
    if not owner:
        return None
    parts = owner.split(":")
    if len(parts) not in (3, 4) or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1]), parts[2] if len(parts) == 4 else None


def free_port() -> int:
    """A TCP port nothing listens on now (the system's pick, on 127.0.0.1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# The variables the launcher may take the key from (its env sources). The runner gets them
# through an inherited pipe, not its environment: /proc/PID/environ of the runner, the
# parent of claude, is readable by every process of the worker (a Bash step walking up).
KEY_VARIABLES = ("ANTHROPIC_AUTH_TOKEN", "ZHIPU_API_KEY", "GLM_API_KEY")
_HANDOVER_LIMIT = 60_000  # below a pipe's buffer: written before the runner starts


def _hand_over(values: dict[str, str]) -> int | None:
    """A pipe's read end holding `values` as JSON (its write end closed), for the runner to
    inherit; None when there is nothing to hand over."""
    if not values:
        return None
    data = json.dumps(values).encode()
    if len(data) > _HANDOVER_LIMIT:
        raise FleetError("the key variables of the environment are too long to hand to "
                         "the runner; check ANTHROPIC_AUTH_TOKEN, ZHIPU_API_KEY, GLM_API_KEY")
    read_end, write_end = os.pipe()
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(write_end, view):]
    except OSError:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return read_end


class Supervisor:
    """Spawns, signals and reaps the runners of one engine (thread-safe for its callers:
    the engine starts several attempts at once in its start threads)."""

    def __init__(self, settings: Settings, store: Store, *, env: Mapping[str, str],
                 clock: Any, python: str, repo_settings: RepoSettingsCache | None = None
                 ) -> None:
        self.settings = settings
        self.store = store
        # each repository's .fleet-tui.toml (setup, include): read when an attempt starts
        self.repo_settings = repo_settings or RepoSettingsCache(env)
        self.env = env
        self.clock = clock
        self.python = python
        # who claims tasks: host, pid and its start time (so a claim's starter can be proven
        # gone), and this object (several engines may live in one process)
        self.owner = (f"{_HOST}:{os.getpid()}:{procs.start_time(os.getpid()) or 0}:"
                      f"{next(_ENGINE_SEQ)}-{id(self):x}")
        _LIVE_OWNERS[self.owner] = self
        self.children: dict[int, subprocess.Popen[bytes]] = {}

    # --- our children ---------------------------------------------------------------------

    def reap(self) -> None:
        for pid, proc in list(self.children.items()):
            if proc.poll() is not None:
                del self.children[pid]

    def wait(self, stop: threading.Event, interval: float) -> None:
        """Sleep up to `interval`; return early when `stop` is set or one of our runners
        has exited (a waitpid(WNOHANG) per child every CHILD_POLL seconds)."""
        deadline = time.monotonic() + interval
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            children = list(self.children.values())
            if not children:
                stop.wait(left)
                return
            if stop.wait(min(left, CHILD_POLL)):
                return
            if any(proc.poll() is not None for proc in children):
                return

    # --- starting -------------------------------------------------------------------------

    def _settings_overrides(self, task: Task) -> dict[str, Any]:
        s = self.settings
        return {
            "base_url": task.endpoint or s.base_url, "model": s.model,
            "small_model": s.small_model, "permission_mode": s.permission_mode,
            "effort": task.effort or s.effort, "keyring_service": s.keyring_service,
            "keyring_key": s.keyring_key, "claude": s.claude, "sandbox": s.sandbox,
            "key_sources": list(s.key_sources), "config_dir": str(s.config_dir),
            "key_helper": s.key_helper, "scrub_tool_env": s.scrub_tool_env,
        }

    def _runner_env(self) -> dict[str, str]:
        """The runner's environment: the engine's, with the package on PYTHONPATH (launch
        takes the KEY_VARIABLES out and hands them over through a pipe, `--env-fd`)."""
        return package_env(self.env)

    def start(self, task: Task, old: TaskState, changes: list[TaskChange]) -> None:
        """Worktree, config dir, spec.json, runner. A failure fails the task, clearly; never
        raises (it runs in the start threads)."""
        try:
            attempt = self.launch(task)
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

    def launch(self, task: Task) -> Attempt:
        """Start one attempt. The runner is known before it can run: the attempt's folder
        is recorded in the store (only while the task is still ours and not killed) and its
        lock taken before the spawn; the runner inherits the held lock."""
        now = self.clock()
        attempts = self.store.list_attempts(task.id)
        if attempts and attempts[-1].row_error is not None:
            raise FleetError(attempts[-1].row_error)
        pending = attempts[-1] if attempts and attempts[-1].runner_pid is None \
            and attempts[-1].finished_at is None else None
        # one live worker per task: an earlier attempt's runner still stopping (a kill's
        # grace) comes first; the task goes back to the queue and is tried again
        for earlier in attempts:
            if earlier is not pending and earlier.dir is not None \
                    and AttemptLog(earlier.dir).lock_held() is True:
                current = self.store.get_task(task.id)
                self.store.requeue_claim(task.id, self.owner, current.claimed_at, now,
                                         f"waiting for the runner of attempt {earlier.n} "
                                         "to stop")
                raise NotStarted(f"the runner of attempt {earlier.n} still lives")
        worktree = task.worktree
        # the engine's own retry after the endpoint cut a run off resumes its session
        # when it made progress (policy.automatic_attempt); else a fresh start
        kind, prompt = policy.automatic_attempt(task, attempts)
        if pending is not None:  # the user's: a retry, a resume or a follow-up
            kind = pending.kind
        if worktree is None or not Path(worktree).is_dir():
            if kind in ("resume", "followup") and task.session_id:
                # its folder deleted by hand: the session continues the work on the branch,
                # so the branch is checked out again as it is (BranchGone when it is gone)
                info = git.reattach_worktree(task.repo, task.id)
            else:
                # A retry may find what a failed start left behind, and so may a task
                # claimed before by an engine that died while making its worktree (no
                # runner ran: that needs the attempt folder, recorded later): then start
                # clean.
                claimed_before = (task.started_at is not None and task.claimed_at is not None
                                  and task.started_at < task.claimed_at)
                info = git.create_worktree(task.repo, task.id,
                                           task.base_commit or task.base_ref,
                                           reset=worktree is not None or bool(attempts)
                                           or claimed_before)
            worktree = info.path
            self.store.update_task(task.id, worktree=info.path, branch=info.branch,
                                   base_commit=task.base_commit or info.base_commit,
                                   base_branch=task.base_branch or info.base_branch)
        # never run in the main checkout, whatever happened to the worktree
        git.verify_worktree(Path(worktree), task.branch or f"fleet/{task.id}")
        if Path(worktree).resolve() == Path(task.repo).resolve():
            raise FleetError(f"refusing to run task {task.id} in the main checkout {task.repo}")
        config_dir = paths.private_dir(paths.task_config_dir(task.id, self.env))

        model = policy.model_for(task, attempts, self.settings)
        if pending is None:
            attempt = self.store.add_attempt(task.id, kind=kind, prompt=prompt, now=now,
                                             model=model)
        else:
            attempt = pending
            attempt.model = model
        adir = paths.attempt_dir(task.repo, task.id, attempt.n)
        for folder in (paths.logs_dir(task.repo), adir.parent, adir):
            paths.private_dir(folder)
        try:
            ready = self.repo_settings.get(Path(task.repo))
        except ConfigError as exc:  # never read well: the task cannot start as asked
            raise FleetError(f"the repository's settings do not read: {exc}") from None
        # FLEET_PORT: free on this machine now, and held by no other running attempt
        port = self.store.assign_port(attempt.id, free_port)
        folder_log = AttemptLog(adir)
        lock_fd = folder_log.acquire_lock()
        if lock_fd is None:  # a runner of this attempt lives: following adopts it
            raise NotStarted(f"a runner holds {folder_log.lock_path} already")
        key_fd: int | None = None
        try:
            folder_log.clear_run_records()
            resume = task.session_id if attempt.kind in ("resume", "followup") else None
            spec = RunSpec(cwd=str(worktree), prompt=attempt.prompt or task.prompt,
                           config_dir=str(config_dir), args=list(task.extra_args),
                           model=model, permission_mode=task.permission_mode,
                           max_turns=task.max_turns, resume=resume,
                           settings=self._settings_overrides(task), task_id=task.id,
                           attempt=attempt.n, token=secrets.token_hex(16),
                           timeout=policy.time_limit(task, self.settings),
                           kill_grace=self.settings.kill_grace,
                           repo=str(task.repo), include=list(ready.include),
                           setup=ready.setup,
                           env={"FLEET_TASK_ID": task.id, "FLEET_PORT": str(port)})
            folder_log.write_spec(asdict(spec))
            paths.private_file(folder_log.events)
            paths.private_file(folder_log.runner_log)
            # events_path, stderr_path and exit_path are written for older fleet-tui
            # versions sharing the store; nothing reads them (the folder is the truth)
            if not self.store.record_launch(
                    task.id, attempt.id, self.owner,
                    {"runner_pid": None, "started_at": now, "model": model, "dir": adir,
                     "events_path": folder_log.events, "stderr_path": folder_log.stderr,
                     "exit_path": folder_log.exit_path, "config_dir": config_dir,
                     "events_offset": 0},
                    {"verdict": None, "message": None, "finished_at": None,
                     "last_event_at": None, "attempt_count": attempt.n}):
                current = self.store.get_task(task.id)
                if current.state not in ACTIVE_STATES:  # killed meanwhile: close the attempt
                    self.store.update_attempt(attempt.id, finished_at=now,
                                              verdict=current.verdict or Verdict.KILLED,
                                              message=current.message)
                raise NotStarted("it was killed, or taken over, before its runner started")
            env = self._runner_env()
            key_fd = _hand_over({name: env.pop(name) for name in KEY_VARIABLES
                                 if name in env})
            handover = ["--env-fd", str(key_fd)] if key_fd is not None else []
            proc = spawn_detached(
                [self.python, "-m", RUNNER_MODULE, "--lock-fd", str(lock_fd), *handover,
                 str(adir)], cwd=adir, env=env, log_path=folder_log.runner_log,
                pass_fds=(lock_fd,) if key_fd is None else (lock_fd, key_fd))
        finally:
            os.close(lock_fd)  # the runner holds it now (or nobody, if the spawn failed)
            if key_fd is not None:
                os.close(key_fd)
        self.children[proc.pid] = proc
        # The runner runs whatever happens below; if this bookkeeping fails, following
        # adopts the runner from its own record (runner.json).
        try:
            folder_log.write_launch_record({"runner_pid": proc.pid,
                                            "runner_start": procs.start_time(proc.pid),
                                            "started_at": now, "owner": self.owner})
            self.store.update_attempt(attempt.id, runner_pid=proc.pid)
        except Exception:
            log.exception("recording the runner of task %s", task.id)
        attempt.runner_pid = proc.pid
        attempt.dir = adir
        attempt.started_at = now
        return attempt

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
        """The runner's pid and /proc start time: from the engine's launch record or the
        runner's own (the runner of an engine that died before recording it)."""
        if attempt.dir is None:
            return attempt.runner_pid, None
        folder = AttemptLog(attempt.dir)
        for rec in (folder.launch_record(), folder.runner_record()):
            pid = rec.get("runner_pid") if rec else None
            if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
                continue
            if attempt.runner_pid is not None and pid != attempt.runner_pid:
                continue
            start = rec.get("runner_start") if rec else None
            return pid, str(start) if isinstance(start, (str, int)) else None
        return attempt.runner_pid, None

    def runner_state(self, attempt: Attempt) -> str:
        """"alive": the attempt's runner lives (its lock is held); "dead": it ran and is
        gone; "never": no runner was ever spawned for it (a start that did not happen)."""
        assert attempt.dir is not None
        folder = AttemptLog(attempt.dir)
        held = folder.lock_held()
        if held is None:  # no lock file: an attempt from before locks, by pid and start
            if attempt.runner_pid is None and not folder.has_runner_record():
                return "dead" if folder.exited else "never"
            return "alive" if procs.is_alive(*self.runner_identity(attempt)) else "dead"
        if held:
            return "alive"
        if attempt.runner_pid is not None or folder.has_run():
            return "dead"
        return "never"

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
        pid, _start = self.runner_identity(attempt)
        deadline = time.monotonic() + timeout
        while True:
            child = self.children.get(pid or -1)
            if child is not None:
                child.poll()
            if not self.runner_alive(attempt):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    # --- stopping -------------------------------------------------------------------------

    def request_stop(self, attempt: Attempt, reason: StopReason, message: str) -> None:
        """Record why (so any engine that finishes the attempt classifies it right), then
        SIGTERM the runner, which passes it to claude's group and every descendant and
        sends SIGKILL after the kill grace by itself."""
        assert attempt.dir is not None
        AttemptLog(attempt.dir).request_stop(reason, message, at=self.clock(), by=self.owner)
        self.signal(attempt, signal.SIGTERM)

    def stop_now(self, attempt: Attempt, reason: StopReason, message: str) -> None:
        """Ask the runner to stop and wait for it to be gone: SIGKILL to the whole tree
        once the kill grace (and the runner's head start) has passed."""
        self.request_stop(attempt, reason, message)
        if not self.wait_runner(attempt, self.settings.kill_grace + policy.RUNNER_HEADSTART):
            self.signal(attempt, signal.SIGKILL)
            self.wait_runner(attempt, 5.0)

    def signal(self, attempt: Attempt, sig: int) -> None:
        pid, start = self.runner_identity(attempt)
        claude = attempt.pid
        if claude is None and attempt.dir is not None:
            rec = AttemptLog(attempt.dir).runner_record()
            found = rec.get("claude_pid") if rec else None
            claude = found if isinstance(found, int) and not isinstance(found, bool) else None
        runner_ok = procs.is_alive(pid, start)
        if sig == signal.SIGTERM and runner_ok and pid:
            procs.signal_pid(pid, sig)
            return
        groups = [g for g in (pid, claude) if g]
        if runner_ok and pid:
            procs.signal_tree(pid, sig, groups=groups)
        else:
            # The runner is gone: claude dies with it (pdeathsig); what claude started is
            # found by the attempt's token, wherever it went.
            if claude:
                procs.signal_group(claude, sig)
            self.stop_leftovers(attempt)

    def stop_leftovers(self, attempt: Attempt) -> int:
        """Stop every process the attempt started that outlived its runner (a Bash step's
        setsid/nohup/double-fork daemon now under pid 1): they carry the attempt's token in
        their environment. Returns how many there were."""
        if attempt.dir is None:
            return 0
        token = AttemptLog(attempt.dir).spec_token()
        if token is None:
            return 0  # an attempt from before tokens: only claude's group could be told
        found = procs.with_env(TOKEN_ENV, token)
        if found:
            log.warning("task %s: stopping %d process(es) left by its dead runner: %s",
                        attempt.task_id, len(found), found)
            procs.stop(found, LEFTOVER_GRACE)
        return len(found)


__all__ = ["CHILD_POLL", "START_GRACE", "NotStarted", "Supervisor", "TaskChange", "describe",
           "free_port", "parse_owner"]
