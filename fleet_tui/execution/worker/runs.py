"""A host's runs, for the code that runs there (the SSH agent, the Ray job): a runner
started detached with its key variables through a pipe, its state read from its attempt
folder, what it left swept; the one-JSON-line answers of the host's commands. Standard
library only (tests/execution/worker/test_host_stdlib.py runs it under `python3 -I -S`)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

from fleet_tui.execution.worker import hostcage
from fleet_tui.execution.worker.attemptlog import AttemptLog
from fleet_tui.execution.worker.spec import LEFTOVER_GRACE, TOKEN_ENV
from fleet_tui.system import cgroups, procs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

RUNNER_MODULE = "fleet_tui.execution.worker.runner"
SPAWN_WAIT = 10.0  # seconds for a new runner to take its lock


def answer(data: Any) -> None:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


def stdin_json() -> Any:
    return json.loads(sys.stdin.buffer.read() or b"null")


def runner_state(folder: AttemptLog) -> str:
    """alive | dead | never, as the local host says it (the lock, else the records)."""
    held = folder.lock_held()
    if held:
        return "alive"
    if held is None and folder.has_runner_record() and not folder.exited:
        rec = folder.runner_record() or {}
        pid = rec.get("runner_pid")
        start = rec.get("runner_start")
        if isinstance(pid, int) and procs.is_alive(pid, str(start) if start else None):
            return "alive"
    return "dead" if folder.has_run() or folder.exited else "never"


def pids(folder: AttemptLog) -> tuple[int | None, str | None, int | None]:
    rec = folder.runner_record() or {}
    pid, start, claude = rec.get("runner_pid"), rec.get("runner_start"), rec.get("claude_pid")
    return (pid if isinstance(pid, int) and pid > 0 else None,
            str(start) if start is not None else None,
            claude if isinstance(claude, int) and claude > 0 else None)


def sweep(folder: AttemptLog) -> int:
    """The processes carrying the attempt's token and those of its cgroup, stopped."""
    token = folder.spec_token()
    found = procs.with_env(TOKEN_ENV, token) if token is not None else []
    if found:
        procs.stop(found, LEFTOVER_GRACE)
    cgroup = cgroups.recorded(folder.runner_record())
    contained = cgroups.end(cgroup, LEFTOVER_GRACE) if cgroup is not None else []
    return len(set(found) | set(contained))


def start_runner(folder: AttemptLog, env: dict[str, str], keys: dict[str, str],
                 wait: float) -> subprocess.Popen[bytes]:
    """The runner started detached (its own session, stdin /dev/null, its output in
    runner.log), the key variables through a pipe it inherits (`--env-fd`), never its
    environment or argv; returned once it took its lock (or ended, or `wait` passed)."""
    # started as this process was: without the site module (-S), the host's installed
    # packages are never on the runner's path either (the package copy alone is)
    argv = [sys.executable, *(["-S"] if sys.flags.no_site else []), "-m", RUNNER_MODULE]
    with contextlib.suppress(OSError):  # a caged attempt: the host's srt, as stage found it
        env = hostcage.runner_env(folder.read_spec(), dict(env))
    pass_fds: tuple[int, ...] = ()
    read_fd: int | None = None
    if keys:
        read_fd, write_fd = os.pipe()
        with os.fdopen(write_fd, "wb") as fh:
            fh.write(json.dumps(keys).encode())  # a pipe's buffer holds 64 KiB: enough
        argv += ["--env-fd", str(read_fd)]
        pass_fds = (read_fd,)
    argv.append(str(folder.dir))
    with open(folder.runner_log, "ab") as out:
        proc = subprocess.Popen(argv, cwd=folder.dir, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                pass_fds=pass_fds, close_fds=True)
    if read_fd is not None:
        os.close(read_fd)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None or folder.has_runner_record():
            break
        time.sleep(0.01)
    return proc
