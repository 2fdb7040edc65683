"""The ssh kind's `fleet-tui host check`: the probe goes through the user's own ssh (their
~/.ssh/config, agent and known-hosts checking, never switched off) with BatchMode, so a
password or a host-key question fails the check instead of waiting for an answer."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING

from fleet_tui.execution.probe import Check, check_shell
from fleet_tui.execution.ssh.config import options, ssh_args

if TYPE_CHECKING:
    from fleet_tui.settings.config import Settings
    from fleet_tui.settings.hosts import HostConfig

CONNECT_TIMEOUT = 10


def ssh_argv(host: HostConfig, ssh: str = "ssh") -> list[str]:
    """ssh's argv for a command on `host`, with the user's own config and BatchMode."""
    return [ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT}",
            *ssh_args(host)]


def unreachable_fix(host: HostConfig, why: str) -> str:
    """What to do when ssh does not get in: the sentence depends on what ssh said."""
    target = " ".join(shlex.quote(a) for a in ssh_args(host) if a != "--")
    lowered = why.lower()
    if "host key verification failed" in lowered or "no matching host key" in lowered:
        hint = ("its host key is not in your known_hosts: connect once by hand and check "
                "the fingerprint")
    elif "permission denied" in lowered:
        hint = ("your key is not accepted: load it into your agent (ssh-add) or name it with "
                "IdentityFile in ~/.ssh/config, and add it to the host's authorized_keys")
    elif "could not resolve" in lowered or "name or service not known" in lowered:
        hint = "the name does not resolve: check the host name, or add it to ~/.ssh/config"
    else:
        hint = "check that the host is up and sshd listens on that port"
    return (f"{hint}; then `ssh {target} true` must succeed without asking anything "
            "(fleet-tui runs ssh with BatchMode=yes)")


class SshChecks:
    probes = False
    records = True

    def describe(self, host: HostConfig) -> str:
        return f"ssh {host.target}"

    def shell(self, host: HostConfig) -> list[str] | None:
        return [*ssh_argv(host), "sh -s"]

    def claude_where(self, settings: Settings,
                     host: HostConfig) -> tuple[tuple[str, ...], str | None]:
        return (), None  # the host's record, its data dir's copy, then its PATH

    def run(self, host: HostConfig, *, claude: tuple[str, ...], install_to: str | None,
            probe: bool, env: Mapping[str, str] | None = None
            ) -> tuple[list[Check], dict[str, str]]:
        return check_shell([*ssh_argv(host), "sh -s"], where=host.target,
                           reached=f"ssh {host.target}", here=False,
                           unreachable=lambda why: unreachable_fix(host, why), env=env,
                           claude=claude, install_to=install_to, name=host.name,
                           cage=options(host).cage)


CHECKS = SshChecks()

__all__ = ["CHECKS", "ssh_argv", "unreachable_fix"]
