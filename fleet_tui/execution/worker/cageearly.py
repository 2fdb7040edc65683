"""The warm cage host started first thing in a runner, before the runner's own modules load
(~30 ms of imports): node and srt load meanwhile, which is most of what a caged worker's
start costs more than an uncaged one's (bench 16).

It imports as little as will do (json, subprocess and cage.py, ~15 ms), and starts node
through `setpriv --pdeathsig KILL` (util-linux), so that no preexec function is needed
(that would mean ctypes, and a fork of this process instead of a vfork). The runner then
makes the attempt's cgroup and moves the host into it before the host is told anything (it
starts no process before its order). Where the runner uses a PID namespace instead (no
cgroup to be had), or its run does not go on as planned (the attempt folder is locked by
another runner, the spec changed its mind), it lets the host go (`drop`): killed before it
did anything.

Standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fleet_tui.execution.worker import cage

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import IO

# As attemptlog's, spec's, procs' and pidns' names: those modules are not imported here (they
# would load what this start is ahead of); tests/execution/worker/test_cageearly.py checks
# that the names agree.
SPEC_FILE = "spec.json"
STDERR_FILE = "stderr.log"
TOKEN_ENV = "FLEET_ATTEMPT_TOKEN"
PORTABLE_ENV = "FLEET_TUI_PORTABLE_PROCS"
CONTAIN_ENV = "FLEET_TUI_CONTAIN"


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
    import hashlib

    resolved = os.path.realpath(attempt_dir)
    return "a-" + hashlib.sha256(resolved.encode()).hexdigest()[:20]


def _attempt_dir(args: Sequence[str]) -> str | None:
    rest = list(args)
    while len(rest) >= 3 and rest[0] in ("--lock-fd", "--env-fd") and rest[1].isdigit():
        rest = rest[2:]
    return rest[0] if len(rest) == 1 and not rest[0].startswith("-") else None


def start(args: Sequence[str]) -> None:
    """Start the cage host now when this run will most likely be caged in a cgroup (Linux,
    containment "auto"); nothing otherwise (the runner then starts it as before, if at
    all)."""
    global started
    env = dict(os.environ)
    if not sys.platform.startswith("linux") or env.get(PORTABLE_ENV, "") not in ("", "0") \
            or env.get(CONTAIN_ENV, "").strip().lower() not in ("", "auto"):
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
    if not isinstance(cwd, str) or not os.path.isdir(cwd) or \
            not cage.wanted(settings if isinstance(settings, dict) else {}, env):
        return
    argv = cage.warm_argv(env)
    setpriv = cage._which("setpriv", env.get("PATH", os.defpath))
    if argv is None or setpriv is None:
        return
    token = spec.get("token")
    if isinstance(token, str) and token:
        env[TOKEN_ENV] = token
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
        # its own process group, as claude's; dead with the runner (the parent-death
        # signal, set by setpriv, which then becomes node)
        proc = subprocess.Popen(
            [setpriv, "--pdeathsig", "KILL", "--", *argv, str(go_r)], cwd=cwd, env=env,
            stdin=stdin_r, stdout=subprocess.PIPE, stderr=err_fh, close_fds=True,
            pass_fds=(go_r,), process_group=0)
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


def drop(early: Early | None = None) -> None:
    """Let an early host go: it has been told nothing, so it has started nothing; killed
    with its process group, reaped."""
    global started
    if early is None:
        early, started = started, None
    if early is None:
        return
    import contextlib
    import signal

    with contextlib.suppress(OSError):
        os.killpg(early.proc.pid, signal.SIGKILL)
    for fd in (early.go_fd, early.stdin_fd):
        with contextlib.suppress(OSError):
            os.close(fd)
    early.err_fh.close()
    early.proc.wait()
    if early.proc.stdout is not None:
        early.proc.stdout.close()
