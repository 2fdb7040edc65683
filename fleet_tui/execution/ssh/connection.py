"""One SSH host's connection: the system `ssh` with the user's own setup.

Every command goes through the user's `ssh`, so their `~/.ssh/config` (aliases,
ProxyJump, IdentityFile, the agent) and their known-hosts checking apply as they set them:
nothing here turns StrictHostKeyChecking off or accepts a new host key. `BatchMode=yes`:
never a prompt (a passphrase or an unknown host key is an error the user is told about).
One multiplexed connection per host (ControlMaster=auto, ControlPersist) whose socket is
in a private folder, so a command costs a channel, not a handshake, and a dropped master is
made again by the next command.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from fleet_tui.core.errors import FleetError

CONNECT_TIMEOUT = 10  # seconds for the TCP connect and the handshake (ssh's ConnectTimeout)
PERSIST = "600"  # the master outlives its last command this long (ssh's ControlPersist)


class SshError(FleetError):
    """The host could not be reached or a command there failed; says which host and why
    (`transient`: the connection failed, not the command)."""


# what git says when its ssh transport failed (the command there did not fail)
DROPPED = ("remote end hung up", "connection closed", "connection refused",
           "connection reset", "connection timed out", "broken pipe", "mux_client",
           "kex_exchange_identification", "could not read from remote repository")


def dropped(stderr: str) -> bool:
    """A git command over ssh failed because its connection did."""
    low = stderr.lower()
    return any(sign in low for sign in DROPPED)


def control_dir() -> Path:
    """A folder only this user can enter, for the masters' sockets (a short path: a Unix
    socket's path is limited to 108 bytes)."""
    base = Path(tempfile.gettempdir()) / f"fleet-tui-ssh-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o700)
    info = base.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() \
            or stat.S_IMODE(info.st_mode) & 0o077:
        raise SshError(f"{base} is not a private folder of this user; remove it and try "
                       "again")
    return base


def split_target(target: str) -> tuple[str, int | None]:
    """`host:port` -> (host, port); anything else as ssh takes it (an alias, user@host)."""
    match = re.fullmatch(r"([^:\[\]]+):(\d{1,5})", target)
    if match:
        return match.group(1), int(match.group(2))
    return target, None


class Connection:
    """`ssh` to one target through one master connection."""

    def __init__(self, target: str, *, port: int | None = None,
                 config: str | os.PathLike[str] | None = None, ssh: str = "ssh",
                 env: Mapping[str, str] | None = None) -> None:
        host, given = split_target(target)
        self.target = host
        self.port = port if port is not None else given
        self.config = os.fspath(config) if config is not None else None
        self.ssh = ssh
        self.env = dict(env) if env is not None else None
        self.control_path = str(control_dir() / "%C")
        # when the host last answered (a command ssh ran there, a frame of a stream): the
        # lease counts from it (monotonic, and the wall clock for the messages)
        self.reached_at = time.monotonic()
        self.reached_wall = time.time()

    def reached(self) -> None:
        """The host answered just now."""
        self.reached_at, self.reached_wall = time.monotonic(), time.time()

    def options(self) -> list[str]:
        """ssh's options for every command (the user's config first: -F only when given)."""
        opts = ["-F", self.config] if self.config else []
        opts += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT}",
                 "-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_path}",
                 "-o", f"ControlPersist={PERSIST}", "-o", "ServerAliveInterval=5",
                 "-o", "ServerAliveCountMax=3"]
        if self.port is not None:
            opts += ["-p", str(self.port)]
        return opts

    def ssh_command(self) -> str:
        """The command line git uses to reach the host (GIT_SSH_COMMAND)."""
        return shlex.join([self.ssh, *self.options()])

    def argv(self, command: Sequence[str] | str) -> list[str]:
        line = command if isinstance(command, str) else shlex.join(command)
        return [self.ssh, *self.options(), self.target, "--", line]

    def run(self, command: Sequence[str] | str, *, input: bytes | None = None,
            timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        """Run one command on the host (through its shell); SshError when ssh itself fails
        (255) or, with `check`, when the command does."""
        try:
            done = subprocess.run(self.argv(command), input=input, capture_output=True,
                                  timeout=timeout, env=self.env, check=False)
        except subprocess.TimeoutExpired:
            raise SshError(f"{self.target}: no answer within {timeout:g} s") from None
        except OSError as exc:
            raise SshError(f"cannot run {self.ssh}: {exc.strerror or exc}") from None
        if done.returncode != 255:
            self.reached()
        if done.returncode == 255:  # ssh itself: the host unreachable, the master dropped
            raise SshError(f"{self.target}: {self.why(done)}", transient=True)
        if check and done.returncode != 0:
            raise SshError(f"{self.target}: {self.why(done)}")
        return done

    @staticmethod
    def why(done: subprocess.CompletedProcess[bytes]) -> str:
        lines = [line for line in done.stderr.decode("utf-8", "replace").splitlines()
                 if line.strip()]
        if done.returncode == 255:
            return (lines[-1] if lines else "ssh failed") + " (check it with `ssh` yourself)"
        return lines[-1] if lines else f"exit {done.returncode}"

    def popen(self, command: Sequence[str] | str) -> subprocess.Popen[bytes]:
        """A long command (the follower's stream): stdout a pipe, stdin closed."""
        return subprocess.Popen(self.argv(command), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env)

    def control(self, operation: str, *extra: str) -> subprocess.CompletedProcess[bytes]:
        """`ssh -O operation` on the master (check, exit, forward, cancel)."""
        return subprocess.run([self.ssh, *self.options(), "-O", operation, *extra,
                               self.target], capture_output=True, timeout=30,
                              env=self.env, check=False)

    def master_pid(self) -> int | None:
        """The master's pid while it lives (`ssh -O check` says it)."""
        done = self.control("check")
        match = re.search(rb"pid=(\d+)", done.stderr + done.stdout)
        return int(match.group(1)) if done.returncode == 0 and match else None

    def forward_remote(self, local_port: int, remote_port: int = 0) -> int:
        """A port on the host's loopback forwarded to `local_port` here (-R over the
        master; 0: the host picks it): the port. Bound on 127.0.0.1 by name: without a
        bind address sshd binds every loopback address and reports success when only ::1
        was free, so the workers' 127.0.0.1:PORT reached whatever else listened there
        (seen in CI: another server's 404 for the worker's model)."""
        done = self.control("forward", "-R",
                            f"127.0.0.1:{remote_port}:127.0.0.1:{local_port}")
        out = done.stdout.decode().strip()
        if done.returncode != 0 or (remote_port == 0 and not out.isdigit()):
            raise SshError(f"{self.target}: cannot forward a port to this machine: "
                           f"{self.why(done)}")
        return int(out) if remote_port == 0 else remote_port

    def close(self) -> None:
        self.control("exit")


__all__ = ["Connection", "SshError", "control_dir", "dropped", "split_target"]
