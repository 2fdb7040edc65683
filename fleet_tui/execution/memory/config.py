"""The memory kind's table: a name and a cap (built in code, never read from config.toml:
it has no mark)."""

from __future__ import annotations

from typing import Any

from fleet_tui.settings.hosts import HostConfig, cap_of, unknown_fields

KIND = "memory"


class MemorySchema:
    mark = None
    label = "in-memory"
    fields = ("max_workers",)

    def parse(self, name: str, table: dict[str, Any], where: str,
              default_cap: int) -> HostConfig:
        unknown_fields(table, self.fields, where, "an in-memory host")
        return HostConfig(name, cap_of(table.get("max_workers", default_cap), where), KIND)

    def table(self, host: HostConfig) -> dict[str, object]:
        return {"max_workers": host.max_workers}

    def target(self, host: HostConfig) -> str:
        return "memory"


SCHEMA = MemorySchema()
