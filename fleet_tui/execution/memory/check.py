"""The memory kind's `fleet-tui host check`: nothing to reach, nothing to install."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from fleet_tui.execution.probe import Check

if TYPE_CHECKING:
    from fleet_tui.settings.config import Settings
    from fleet_tui.settings.hosts import HostConfig


class MemoryChecks:
    probes = False
    records = False

    def describe(self, host: HostConfig) -> str:
        return "in memory"

    def shell(self, host: HostConfig) -> list[str] | None:
        return None

    def claude_where(self, settings: Settings,
                     host: HostConfig) -> tuple[tuple[str, ...], str | None]:
        return (), None

    def run(self, host: HostConfig, *, claude: tuple[str, ...], install_to: str | None,
            probe: bool, env: Mapping[str, str] | None = None
            ) -> tuple[list[Check], dict[str, str]]:
        return [Check("reachable", True, "in this process (no claude, no git)")], {}


CHECKS = MemoryChecks()
