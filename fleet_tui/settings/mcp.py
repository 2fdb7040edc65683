"""The `[mcp]` table of config.toml: the guard rails of `fleet-tui mcp`, whose caller is a
model (an orchestrating Claude Code session), not a person at a terminal.

    [mcp]
    max_tasks = 20      # tasks one server (one Claude Code session) may start; 0: no cap
    max_spend = 5.0     # USD its tasks may spend before it starts no more work; 0: no cap

The caps count per server process: Claude Code starts one for each session, so a runaway
orchestrator stops at them and says so in its tool's answer. Read here and only by the
server: the engine and the CLI do not know them.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet_tui.settings.tables import read_own_table

TABLE = "mcp"
DEFAULT_MAX_TASKS = 20
DEFAULT_MAX_SPEND = 5.0
KEYS = ("max_tasks", "max_spend")
MAX_TASKS_LIMIT = 10_000  # more is a typo, not a cap


@dataclass(frozen=True, slots=True)
class McpSettings:
    max_tasks: int = DEFAULT_MAX_TASKS  # 0: no cap
    max_spend: float = DEFAULT_MAX_SPEND  # USD; 0: no cap


def read_mcp_settings(config_file: str) -> McpSettings:
    """The `[mcp]` table of ``config_file`` (absent: the defaults); ConfigError naming the
    file, the line and what is accepted when a value cannot be used."""
    table = read_own_table(config_file, TABLE, KEYS, example="[mcp] max_tasks = 20")
    if table is None:
        return McpSettings()
    max_tasks = table.values.get("max_tasks", DEFAULT_MAX_TASKS)
    if isinstance(max_tasks, bool) or not isinstance(max_tasks, int) \
            or not 0 <= max_tasks <= MAX_TASKS_LIMIT:
        raise table.error("max_tasks", f"[mcp] max_tasks: expected a whole number from 0 "
                                       f"(no cap) to {MAX_TASKS_LIMIT}, got {max_tasks!r}")
    max_spend = table.values.get("max_spend", DEFAULT_MAX_SPEND)
    if isinstance(max_spend, bool) or not isinstance(max_spend, int | float) \
            or not 0 <= max_spend < float("inf"):
        raise table.error("max_spend", f"[mcp] max_spend: expected USD, a number 0 (no cap) "
                                       f"or more, got {max_spend!r}")
    return McpSettings(max_tasks=max_tasks, max_spend=float(max_spend))
