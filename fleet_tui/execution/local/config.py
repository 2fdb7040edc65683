"""The local kind's table: `[hosts.local]`, this machine, with `max_workers` alone."""

from __future__ import annotations

from typing import Any

from fleet_tui.settings.config_core import ConfigError
from fleet_tui.settings.hosts import LOCAL, HostConfig, cap_of


class LocalSchema:
    mark = None  # `local` by its name, always a host
    label = "local"
    fields = ("max_workers",)

    def parse(self, name: str, table: dict[str, Any], where: str,
              default_cap: int) -> HostConfig:
        if set(table) != {"max_workers"}:
            raise ConfigError(f"{where}: 'local' is this machine, always a host: its table "
                              "takes max_workers alone (give an ssh host another name)",
                              key=name)
        return HostConfig(LOCAL, cap_of(table["max_workers"], where))

    def table(self, host: HostConfig) -> dict[str, object]:
        return {"max_workers": host.max_workers}

    def target(self, host: HostConfig) -> str:
        return LOCAL


SCHEMA = LocalSchema()
