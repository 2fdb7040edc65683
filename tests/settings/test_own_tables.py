"""The tables one command reads for itself (`[mcp]`, `[serve]`) refuse the same mistakes in
the same words, each naming the file and the line of the key."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from fleet_tui.settings.config_core import ConfigError
from fleet_tui.settings.mcp import McpSettings, read_mcp_settings
from fleet_tui.settings.serve import ServeSettings, read_serve_settings

READERS: list[tuple[str, Callable[[str], object], str]] = [
    ("mcp", read_mcp_settings, "max_tasks, max_spend"),
    ("serve", read_serve_settings, "token, port, origins"),
]


@pytest.mark.parametrize(("name", "read", "known"), READERS)
def test_a_wrong_shape_or_key_is_said_with_its_line(tmp_path: Path, name: str,
                                                    read: Callable[[str], object],
                                                    known: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'model = "m"\n{name} = 3\n')
    with pytest.raises(ConfigError) as exc:
        read(str(config))
    assert str(exc.value).startswith(f"{config}, line 2: [{name}] must be a table: [{name}] ")
    assert exc.value.key == name
    config.write_text(f'model = "m"\n[{name}]\n\nzeta = 1\nalpha = 2\n')
    with pytest.raises(ConfigError) as exc:
        read(str(config))
    assert str(exc.value) == f"{config}, line 5: [{name}]: unknown key 'alpha'; known: {known}"
    assert exc.value.key == "alpha"


def test_absent_tables_and_files_give_the_defaults(tmp_path: Path) -> None:
    missing = str(tmp_path / "none.toml")
    assert read_mcp_settings(missing) == McpSettings()
    assert read_serve_settings(missing) == ServeSettings()
    other = tmp_path / "config.toml"
    other.write_text('[serve]\nport = 9000\n')
    assert read_mcp_settings(str(other)) == McpSettings()  # the other table is not its own
    assert read_serve_settings(str(other)).port == 9000


def test_a_bad_value_names_its_own_line(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[mcp]\nmax_tasks = 3\nmax_spend = -1\n")
    with pytest.raises(ConfigError, match=r"line 3: \[mcp\] max_spend: expected USD") as exc:
        read_mcp_settings(str(config))
    assert exc.value.key == "max_spend"
    config.write_text("[serve]\norigins = ['https://a.example']\nport = 70000\n")
    with pytest.raises(ConfigError, match=r"line 3: \[serve\] port: expected a whole") as exc:
        read_serve_settings(str(config))
    assert exc.value.key == "port"
