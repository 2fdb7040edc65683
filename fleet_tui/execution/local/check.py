"""The local kind's `fleet-tui host check`: the probe run by `sh` on this machine; its
claude looked for where this machine's workers find it (the setting, the demo's copy)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from fleet_tui.execution.probe import Check, check_shell

if TYPE_CHECKING:
    from fleet_tui.settings.config import Settings
    from fleet_tui.settings.hosts import HostConfig

SHELL = ["sh", "-s"]


class LocalChecks:
    probes = False
    records = False

    def describe(self, host: HostConfig) -> str:
        return "this machine"

    def shell(self, host: HostConfig) -> list[str] | None:
        return list(SHELL)

    def claude_where(self, settings: Settings,
                     host: HostConfig) -> tuple[tuple[str, ...], str | None]:
        from fleet_tui.system import paths

        copy = paths.cli_install_dir()
        return (settings.claude, str(copy / "node_modules" / ".bin" / "claude")), str(copy)

    def run(self, host: HostConfig, *, claude: tuple[str, ...], install_to: str | None,
            probe: bool, env: Mapping[str, str] | None = None
            ) -> tuple[list[Check], dict[str, str]]:
        return check_shell(SHELL, where="this machine", reached="this machine", here=True,
                           unreachable=lambda why: "check `sh` works here", env=env,
                           claude=claude, install_to=install_to, name=host.name)


CHECKS = LocalChecks()
