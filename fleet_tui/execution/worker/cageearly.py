"""The warm cage host started first thing in a runner, before the runner's own modules load
(~30 ms of imports): node and srt load meanwhile, which is most of what a caged worker's
start costs more than an uncaged one's (bench 16).

Only where the attempt's processes will be held by a cgroup: the runner moves the host into
the attempt's cgroup once it has made it, before the host is told anything (it starts no
process before its order). Where the runner would use a PID namespace instead (no cgroup to
be had), nothing starts here: a host started now would be outside that namespace.

The runner adopts what was started (`take`) or, when its run does not go on as planned (the
attempt folder is locked by another runner, the spec changed its mind, no cgroup after
all), lets it go (`drop`): closing the host's order pipe ends it.

Standard library only, and as little of it as will do: this runs before everything else.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess

from fleet_tui.execution.worker import cage
from fleet_tui.system import cgroups, pidns, procs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import IO

SPEC_FILE = "spec.json"  # as attemptlog's names (not imported: it would load the rest)
STDERR_FILE = "stderr.log"
TOKEN_ENV = "FLEET_ATTEMPT_TOKEN"


class Early:
    """The host started early, and what was opened for it."""

    def __init__(self, proc: subprocess.Popen[bytes], go_fd: int, stdin_fd: int,
                 err_fh: IO[bytes], cwd: str) -> None:
        self.proc = proc
        self.go_fd = go_fd
        self.stdin_fd = stdin_fd
        self.err_fh = err_fh
        self.cwd = cwd


started: Early | None = None


def cgroup_name(attempt_dir: str) -> str:
    """The attempt's cgroup's name (the runner makes it with this name)."""
    resolved = os.path.realpath(attempt_dir)
    return "a-" + hashlib.sha256(resolved.encode()).hexdigest()[:20]


def _attempt_dir(args: Sequence[str]) -> str | None:
    rest = list(args)
    while len(rest) >= 3 and rest[0] in ("--lock-fd", "--env-fd") and rest[1].isdigit():
        rest = rest[2:]
    return rest[0] if len(rest) == 1 and not rest[0].startswith("-") else None


def start(args: Sequence[str]) -> None:
    """Start the cage host now when this run will most likely be caged and held by a
    cgroup; nothing otherwise (the runner then starts it as before, if at all)."""
    global started
    if procs.PORTABLE or pidns.mode(os.environ) != "auto":
        return
    attempt_dir = _attempt_dir(args)
    if attempt_dir is None:
        return
    try:
        with open(os.path.join(attempt_dir, SPEC_FILE), encoding="utf-8") as fh:
            spec = json.load(fh)
    except (OSError, ValueError):
        return
    if not isinstance(spec, dict):
        return
    settings = spec.get("settings")
    cwd = spec.get("cwd")
    env = dict(os.environ)
    if not isinstance(cwd, str) or not os.path.isdir(cwd) or \
            not cage.wanted(settings if isinstance(settings, dict) else {}, env):
        return
    if cgroups.make(cgroup_name(attempt_dir)) is None:
        return  # the runner will use a PID namespace, if anything
    argv = cage.warm_argv(env)
    if argv is None:
        return
    token = spec.get("token")
    if isinstance(token, str) and token:
        env[TOKEN_ENV] = token
    procs.preload_libc()
    parent = os.getpid()

    def preexec() -> None:  # as the runner's child_preexec, the cgroup joined later
        os.setpgid(0, 0)
        procs.set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)

    go_r, go_w = os.pipe()
    stdin_r, stdin_w = os.pipe()
    try:
        # private, as the runner's own files are (its umask is not set yet)
        err_fd = os.open(os.path.join(attempt_dir, STDERR_FILE),
                         os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        err_fh = os.fdopen(err_fd, "ab")
    except OSError:
        for fd in (go_r, go_w, stdin_r, stdin_w):
            os.close(fd)
        return
    try:
        proc = subprocess.Popen(
            [*argv, str(go_r)], cwd=cwd, env=env, stdin=stdin_r, stdout=subprocess.PIPE,
            stderr=err_fh, preexec_fn=preexec, close_fds=True, pass_fds=(go_r,))
    except OSError:
        err_fh.close()
        for fd in (go_w, stdin_w):
            os.close(fd)
        return
    finally:
        os.close(go_r)
        os.close(stdin_r)
    started = Early(proc, go_w, stdin_w, err_fh, cwd)


def take() -> Early | None:
    """The host started early, now the runner's (None: none was)."""
    global started
    early, started = started, None
    return early


def drop(early: Early | None = None, grace: float = 2.0) -> None:
    """Let an early host go: its pipe closed, it ends (killed should it linger)."""
    global started
    if early is None:
        early, started = started, None
    if early is None:
        return
    for fd in (early.go_fd, early.stdin_fd):
        with contextlib.suppress(OSError):
            os.close(fd)
    early.err_fh.close()
    try:
        early.proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(early.proc.pid, signal.SIGKILL)
        early.proc.wait()
    if early.proc.stdout is not None:
        early.proc.stdout.close()
