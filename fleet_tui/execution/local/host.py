"""The local host: each attempt is a detached runner process on this machine.

The placement is a git worktree of the main repository (`.fleet-work/<id>`), the task's
config dir under the state folder and the attempt folder under `.fleet-work/.logs`. The
runner (`python -m fleet_tui.execution.worker.runner`) is started in a session of its own
and inherits the attempt's lock, taken before the spawn; the key variables reach it through
an inherited pipe, never its environment (a worker's Bash step can read its parent's
/proc/PID/environ). Liveness is the lock (and, for an attempt from before locks, the pid
with its start time); signals go to the runner, which passes them on, or, with the runner
gone, to claude's group and to whatever carries the attempt's token.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from fleet_tui.core.errors import FleetError
from fleet_tui.execution.host import LostLedger, NotStarted, Placement, RunnerState
from fleet_tui.execution.worker import launch
from fleet_tui.execution.worker.attemptlog import AttemptLog
from fleet_tui.execution.worker.runner import RUNNER_MODULE
from fleet_tui.execution.worker.spec import LEFTOVER_GRACE, TOKEN_ENV, RunSpec
from fleet_tui.system import cgroups, paths, procs, spawn
from fleet_tui.system.spawn import package_env, spawn_detached
from fleet_tui.vcs import git

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from fleet_tui.core.model import Attempt, Task
    from fleet_tui.core.states import StopReason
    from fleet_tui.settings.config import Settings
    from fleet_tui.settings.hosts import HostConfig

log = logging.getLogger("fleet_tui.engine.fleet")

CHILD_POLL = 0.01  # while our runners live, the scheduler checks this often whether one exited

# The variables the launcher may take the key from (its env sources). The runner gets them
# through an inherited pipe, not its environment: /proc/PID/environ of the runner, the
# parent of claude, is readable by every process of the worker (a Bash step walking up).
KEY_VARIABLES = ("ANTHROPIC_AUTH_TOKEN", "ZHIPU_API_KEY", "GLM_API_KEY")


def hand_over(values: dict[str, str]) -> int | None:
    """A pipe's read end holding `values` as JSON (its write end closed), for the runner to
    inherit; None when there is nothing to hand over."""
    if not values:
        return None
    data = json.dumps(values).encode()
    if len(data) > spawn.HANDOVER_LIMIT:
        raise FleetError("the key variables of the environment are too long to hand to "
                         "the runner; check ANTHROPIC_AUTH_TOKEN, ZHIPU_API_KEY, GLM_API_KEY")
    return spawn.pipe_holding(data)


class LocalStaged:
    """The attempt's lock held and its spec written, on this machine."""

    def __init__(self, host: LocalHost, folder: AttemptLog, lock_fd: int) -> None:
        self.host = host
        self.folder = folder
        self.lock_fd: int | None = lock_fd

    def spawn(self, env: dict[str, str]) -> int:
        lock_fd = self.lock_fd
        assert lock_fd is not None, "spawned or abandoned already"
        self.lock_fd = None
        key_fd: int | None = None
        adir = self.folder.dir
        try:
            key_fd = hand_over({name: env.pop(name) for name in KEY_VARIABLES if name in env})
            handover = ["--env-fd", str(key_fd)] if key_fd is not None else []
            proc = self.host.spawn(
                [self.host.python, "-m", RUNNER_MODULE, "--lock-fd", str(lock_fd),
                 *handover, str(adir)], cwd=adir, env=env, log_path=self.folder.runner_log,
                pass_fds=(lock_fd,) if key_fd is None else (lock_fd, key_fd))
        finally:
            os.close(lock_fd)  # the runner holds it now (or nobody, if the spawn failed)
            if key_fd is not None:
                os.close(key_fd)
        return proc.pid

    def abandon(self) -> None:
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None


class LocalRun:
    """One attempt's runner on this machine."""

    def __init__(self, host: LocalHost, attempt: Attempt) -> None:
        assert attempt.dir is not None, "an attempt that was never placed has no run"
        self.host = host
        self.attempt = attempt
        self._log = AttemptLog(attempt.dir)

    @property
    def log(self) -> AttemptLog:
        return self._log

    def identity(self) -> tuple[int | None, str | None]:
        attempt = self.attempt
        for rec in (self._log.launch_record(), self._log.runner_record()):
            pid = rec.get("runner_pid") if rec else None
            if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
                continue
            if attempt.runner_pid is not None and pid != attempt.runner_pid:
                continue
            start = rec.get("runner_start") if rec else None
            return pid, str(start) if isinstance(start, (str, int)) else None
        return attempt.runner_pid, None

    def state(self) -> RunnerState:
        folder = self._log
        held = folder.lock_held()
        if held is None:  # no lock file: an attempt from before locks, by pid and start
            if self.attempt.runner_pid is None and not folder.has_runner_record():
                return "dead" if folder.exited else "never"
            return "alive" if procs.is_alive(*self.identity()) else "dead"
        if held:
            return "alive"
        if self.attempt.runner_pid is not None or folder.has_run():
            return "dead"
        return "never"

    def request_stop(self, reason: StopReason, message: str, *, at: float, by: str) -> None:
        self._log.request_stop(reason, message, at=at, by=by)
        self.signal(signal.SIGTERM)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def signal(self, sig: int) -> None:
        """SIGTERM to a live runner (it passes it on); any other signal to the runner's and
        claude's groups and their descendants; with the runner gone, to claude's group and
        to what the attempt left behind."""
        pid, start = self.identity()
        claude = self.attempt.pid
        if claude is None:
            rec = self._log.runner_record()
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
            self.sweep()

    def sweep(self) -> int:
        """What the attempt left: the processes carrying its token, and every process of
        its cgroup (system/cgroups.py: those that dropped the token too), stopped."""
        token = self._log.spec_token()
        found = procs.with_env(TOKEN_ENV, token) if token is not None else []
        if found:
            log.warning("task %s: stopping %d process(es) left by its dead runner: %s",
                        self.attempt.task_id, len(found), found)
            procs.stop(found, LEFTOVER_GRACE)
        cgroup = cgroups.recorded(self._log.runner_record())
        contained = cgroups.end(cgroup, LEFTOVER_GRACE) if cgroup is not None else []
        if contained:
            log.warning("task %s: stopped %d process(es) left in its cgroup: %s",
                        self.attempt.task_id, len(contained), contained)
        return len(set(found) | set(contained))

    def wait_gone(self, timeout: float) -> bool:
        pid, _start = self.identity()
        deadline = time.monotonic() + timeout
        while True:
            self.host.poll_child(pid)
            if self.state() != "alive":
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def send_input(self, text: str, *, by: str = "") -> str:
        return self._log.send_input(text, by=by)


class LocalHost:
    """This machine. Thread-safe for the engine's start threads (children are added from
    them and reaped from the scheduler's thread)."""

    name = "local"

    def __init__(self, *, env: Mapping[str, str], python: str) -> None:
        self.env = env
        self.python = python
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    # --- placing -----------------------------------------------------------------------

    def free_port(self) -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])

    def check_setup(self, settings: Settings, env: Mapping[str, str], *,
                    args: Sequence[str] = (), permission_mode: str | None = None) -> None:
        launch.check_setup(settings, env, args=args, permission_mode=permission_mode)

    def make_worktree(self, task: Task, *, reattach: bool, reset: bool) -> git.WorktreeInfo:
        if reattach:
            return git.reattach_worktree(task.repo, task.id)
        return git.create_worktree(task.repo, task.id, task.base_commit or task.base_ref,
                                   reset=reset)

    def keep_lost_in(self, ledger: LostLedger) -> None:
        pass  # its runners are this machine's: none is ever lost

    def remote_worktrees(self) -> None:
        return None  # the worktrees are folders of this machine

    def check_worktree(self, task: Task, worktree: Path) -> None:
        git.verify_worktree(worktree, task.branch or f"fleet/{task.id}")
        if worktree.resolve() == Path(task.repo).resolve():
            raise FleetError(f"refusing to run task {task.id} in the main checkout {task.repo}")

    def place(self, task: Task, worktree: Path, attempt_n: int) -> Placement:
        config_dir = paths.private_dir(paths.task_config_dir(task.id, self.env))
        adir = paths.attempt_dir(task.repo, task.id, attempt_n)
        for folder in (paths.logs_dir(task.repo), adir.parent, adir):
            paths.private_dir(folder)
        return Placement(host=self.name, worktree=worktree,
                         branch=task.branch or f"fleet/{task.id}",
                         base_commit=task.base_commit or "", base_branch=task.base_branch,
                         config_dir=config_dir, attempt_dir=adir)

    def stage(self, placement: Placement, spec: RunSpec) -> LocalStaged:
        folder = AttemptLog(placement.attempt_dir)
        lock_fd = folder.acquire_lock()
        if lock_fd is None:  # a runner of this attempt lives: following adopts it
            raise NotStarted(f"a runner holds {folder.lock_path} already")
        try:
            folder.clear_run_records()
            folder.write_spec(asdict(spec))
            paths.private_file(folder.events)
            paths.private_file(folder.runner_log)
        except BaseException:
            os.close(lock_fd)
            raise
        return LocalStaged(self, folder, lock_fd)

    # --- running -------------------------------------------------------------------------

    def runner_env(self) -> dict[str, str]:
        """The engine's environment with the package on PYTHONPATH (the key variables are
        taken out at the spawn and handed over through a pipe, `--env-fd`)."""
        return package_env(self.env)

    def spawn(self, argv: list[str], *, cwd: Path, env: dict[str, str], log_path: Path,
              pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
        """A detached child (system.spawn: a session of its own, stdin from /dev/null, its
        output appended to `log_path`), kept to be reaped."""
        proc = spawn_detached(argv, cwd=cwd, env=env, log_path=log_path, pass_fds=pass_fds)
        with self._lock:
            self.children[proc.pid] = proc
        return proc

    def attach(self, attempt: Attempt) -> LocalRun:
        return LocalRun(self, attempt)

    def collect(self, task: Task) -> str:
        """Nothing to bring: the worktree is the main repository's, its commits are on the
        task's branch already."""
        return task.branch

    def release(self, task_id: str) -> None:
        shutil.rmtree(paths.task_config_dir(task_id, self.env), ignore_errors=True)

    def poll_child(self, pid: int | None) -> None:
        with self._lock:
            child = self.children.get(pid or -1)
        if child is not None:
            child.poll()

    def reap(self) -> None:
        with self._lock:
            for pid, proc in list(self.children.items()):
                if proc.poll() is not None:
                    del self.children[pid]

    def wait(self, stop: threading.Event, interval: float) -> None:
        """A waitpid(WNOHANG) per child every CHILD_POLL seconds."""
        deadline = time.monotonic() + interval
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            with self._lock:
                children = list(self.children.values())
            if not children:
                stop.wait(left)
                return
            if stop.wait(min(left, CHILD_POLL)):
                return
            if any(proc.poll() is not None for proc in children):
                return


__all__ = ["KEY_VARIABLES", "RUNNER_MODULE", "LocalHost", "LocalRun", "LocalStaged",
           "hand_over"]


def build(config: HostConfig, *, env: Mapping[str, str], python: str) -> LocalHost:
    """This machine (the kinds table's entry): each attempt a detached runner process."""
    return LocalHost(env=env, python=python)
