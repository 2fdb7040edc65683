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

from fleet_tui.settings.config_core import ConfigError, _line_of_key, _read_toml

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
    data, text = _read_toml(config_file)
    table = data.get(TABLE)
    if table is None:
        return McpSettings()

    def where(key: str) -> str:
        line = _line_of_key(text, key)
        return f"{config_file}, line {line}" if line else config_file

    if not isinstance(table, dict):
        raise ConfigError(f"{where(TABLE)}: [mcp] must be a table: [mcp] max_tasks = 20",
                          path=config_file, key=TABLE)
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ConfigError(f"{where(unknown[0])}: [mcp]: unknown key {unknown[0]!r}; "
                          f"known: {', '.join(KEYS)}", path=config_file, key=unknown[0])
    max_tasks = table.get("max_tasks", DEFAULT_MAX_TASKS)
    if isinstance(max_tasks, bool) or not isinstance(max_tasks, int) \
            or not 0 <= max_tasks <= MAX_TASKS_LIMIT:
        raise ConfigError(f"{where('max_tasks')}: [mcp] max_tasks: expected a whole number "
                          f"from 0 (no cap) to {MAX_TASKS_LIMIT}, got {max_tasks!r}",
                          path=config_file, key="max_tasks")
    max_spend = table.get("max_spend", DEFAULT_MAX_SPEND)
    if isinstance(max_spend, bool) or not isinstance(max_spend, int | float) \
            or not 0 <= max_spend < float("inf"):
        raise ConfigError(f"{where('max_spend')}: [mcp] max_spend: expected USD, a number "
                          f"0 (no cap) or more, got {max_spend!r}",
                          path=config_file, key="max_spend")
    return McpSettings(max_tasks=max_tasks, max_spend=float(max_spend))
