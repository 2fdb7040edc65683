"""What the tests of the SSH host share (tests/test_ssh_host.py, the host rows of
tests/test_reliability.py): a real sshd on 127.0.0.1 (tests/sshd.py), an `SshHost` on it,
and the host's processes read on the host over ssh.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path

import pytest
import sshd

from fleet_tui.execution.ssh.connection import Connection
from fleet_tui.execution.ssh.host import SshHost

_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
HOST_PYTHON = "/usr/bin/python3"


def start_sshd(base: Path, alias: str = "fleet-test-host") -> sshd.Sshd:
    """A running sshd under `base`; the test is skipped where none can run (it fails on
    CI, where scripts/test installs it)."""
    why = sshd.missing()
    if why is not None:
        if _CI:
            pytest.fail(why)
        pytest.skip(why)
    return sshd.Sshd(base, alias=alias).start()


def same_machine_claude() -> str | None:
    """The same-machine shortcut: the "host" is this machine as this user, so this
    machine's claude is the host's too, given to the host as its own (`SshHost(claude=)`).
    The real path (another user, nothing of this machine there) is
    tests/test_ssh_user_path.py."""
    return os.environ.get("FLEET_TEST_CLAUDE") or None


def record_claude(server: sshd.Sshd, claude: str) -> None:
    """The same-machine shortcut for a host built from config.toml: this machine's claude
    recorded as the host's, where `fleet-tui host check` records the one it found."""
    server.ssh('mkdir -p -m 700 "$HOME/.fleet-tui-host" && cat > '
               '"$HOME/.fleet-tui-host/claude-path"', input=claude + "\n")


def ssh_host(server: sshd.Sshd, env: Mapping[str, str], *, name: str = "box",
             lease: float = 60.0, key_on_host: bool = True) -> SshHost:
    """The same-machine shortcut's host (see same_machine_claude). The suite's workers go
    straight to their endpoint (FLEET_WORKER_GATEWAY=0, as the older tests were written),
    which a host allows only when it keeps the key (`--key-on-host`): a test through the
    gateway says ``key_on_host=False``."""
    return SshHost(name=name, target=server.alias, env=env, python=HOST_PYTHON,
                   ssh_config=server.client_config, lease=lease, key_on_host=key_on_host,
                   claude=same_machine_claude())


def host_config(server: sshd.Sshd, *, name: str = "box", lease: float = 60.0
                ) -> dict[str, object]:
    """`ssh_host`'s arguments as JSON, for an engine in a process of its own
    (tests/engine_child.py)."""
    return {"name": name, "target": server.alias, "ssh_config": str(server.client_config),
            "python": HOST_PYTHON, "lease": lease, "key_on_host": True,
            "claude": same_machine_claude()}


def master(server: sshd.Sshd) -> Connection:
    """The connection every SshHost on `server` shares (one master, by its ControlPath):
    to find or close the master another process made."""
    return Connection(server.alias, config=server.client_config)


LIST = ("for d in /proc/[0-9]*; do printf '%s\\t%s\\t' \"${d#/proc/}\" "
        "\"$(readlink \"$d/cwd\" 2>/dev/null)\"; tr '\\0' ' ' < \"$d/cmdline\" 2>/dev/null; "
        "echo; done")


def host_pids(server: sshd.Sshd, *markers: str) -> list[int]:
    """The host's processes working under its HOME whose command line is one of
    `markers` (or holds one ending in "/"), read on the host over ssh (other tests'
    processes on this machine are not counted)."""
    pids = []
    for line in server.ssh(LIST).splitlines():
        pid, _, rest = line.partition("\t")
        cwd, _, args = rest.partition("\t")
        args = args.strip()
        if not cwd.startswith(str(server.home)):
            continue
        if any(m == args or (m.endswith("/") and m in args) for m in markers):
            pids.append(int(pid))
    return pids


def token_holders(server: sshd.Sshd, token: str) -> list[int]:
    """The host's processes whose environment holds the attempt's token (the token on
    stdin, never an argv of the host)."""
    scan = ("read -r t; for d in /proc/[0-9]*; do grep -qaF \"FLEET_ATTEMPT_TOKEN=$t\" "
            "\"$d/environ\" 2>/dev/null && echo \"${d#/proc/}\"; done; true")
    out = server.ssh(f"exec bash -c {shlex.quote(scan)}", input=token + "\n")
    return [int(line) for line in out.split()]


__all__ = ["HOST_PYTHON", "host_config", "host_pids", "master", "record_claude", "same_machine_claude",
           "ssh_host", "start_sshd", "token_holders"]
