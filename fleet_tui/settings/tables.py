"""One top-level table of config.toml that a single command reads for itself (`[mcp]`,
`[serve]`): the file is read, the table found, its shape and key names checked, and each
error names the file and the line of the key it is about.

What the values may be is the command's own business (settings/mcp.py, settings/serve.py);
this is only the common part, so every such table refuses the same mistakes in the same words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleet_tui.settings.config_core import ConfigError, _line_of_key, _read_toml


@dataclass(frozen=True, slots=True)
class OwnTable:
    """The `[name]` table of one config file, its keys known to be among the accepted ones."""

    config_file: str
    text: str
    values: Mapping[str, Any]  # TOML values: each reader checks its own

    def where(self, key: str) -> str:
        """The file and, when it can be found, the line where ``key`` is set."""
        line = _line_of_key(self.text, key)
        return f"{self.config_file}, line {line}" if line else self.config_file

    def error(self, key: str, message: str) -> ConfigError:
        """A ConfigError about ``key``: where it is set, then ``message``."""
        return ConfigError(f"{self.where(key)}: {message}", path=self.config_file, key=key)


def read_own_table(config_file: str, name: str, keys: Sequence[str], *,
                   example: str) -> OwnTable | None:
    """The `[name]` table of ``config_file``, or None when the file or the table is absent.
    ConfigError when it is not a table (``example`` shows one) or names a key not in
    ``keys``."""
    data, text = _read_toml(config_file)
    table = data.get(name)
    if table is None:
        return None
    found = OwnTable(config_file, text, table if isinstance(table, dict) else {})
    if not isinstance(table, dict):
        raise found.error(name, f"[{name}] must be a table: {example}")
    unknown = sorted(set(table) - set(keys))
    if unknown:
        raise found.error(unknown[0], f"[{name}]: unknown key {unknown[0]!r}; "
                                      f"known: {', '.join(keys)}")
    return found
