"""Settings: defaults < config.toml < FLEET_WORKER_* < flags, and clear errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import platformdirs
import pytest

from fleet_tui.settings.config import (
    FIELD_NAMES,
    ConfigError,
    Settings,
    config_file_path,
    env_name,
    load_settings,
)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_defaults_keep_the_original_names_and_values(tmp_path: Path) -> None:
    s = load_settings(env={"HOME": str(tmp_path)}, config_file=tmp_path / "absent.toml")
    assert s.config_dir == tmp_path / ".fleet-worker" / "cfg"
    assert (s.base_url, s.model, s.small_model) == (
        "https://api.z.ai/api/anthropic", "GLM-5.2", "GLM-4.5-Air")
    assert (s.permission_mode, s.effort) == ("bypassPermissions", "high")
    assert (s.keyring_service, s.keyring_key, s.claude) == ("fleet-worker", "api-key", "claude")
    assert s.sandbox is False
    assert s.key_sources == ("env", "keyring", "zhipu", "glm")
    assert (s.key_helper, s.scrub_tool_env) == (True, False)
    assert (s.max_workers, s.max_attempts, s.fallback_after) == (4, 4, 2)
    assert (s.backoff_base, s.backoff_cap, s.quota_cooldown) == (5, 300, 60)
    assert (s.timeout, s.stall_seconds, s.stall_kill, s.kill_grace) == (3600, 300, False, 5)
    assert (s.merge_strategy, s.test_command) == ("merge", None)


def test_every_field_has_an_environment_variable() -> None:
    assert env_name("small_model") == "FLEET_WORKER_SMALL_MODEL"
    assert set(FIELD_NAMES) == ({f.name for f in dataclasses.fields(Settings)}
                                - {"endpoints", "hosts"})


def test_precedence_defaults_file_env_flags(tmp_path: Path) -> None:
    cfg = write(tmp_path / "config.toml",
                'model = "from-file"\nsmall_model = "small-file"\nmax_workers = 8\n'
                'effort = "low"\n')
    env = {"HOME": str(tmp_path), "FLEET_WORKER_MODEL": "from-env",
           "FLEET_WORKER_EFFORT": "medium"}
    s = load_settings(env=env, config_file=cfg, overrides={"effort": "max", "model": None})
    assert s.small_model == "small-file"  # file over default
    assert s.max_workers == 8
    assert s.model == "from-env"  # env over file; a None flag is "not given"
    assert s.effort == "max"  # flag over env
    assert s.base_url == "https://api.z.ai/api/anthropic"  # default


def test_config_file_location_follows_platformdirs_and_override(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    assert config_file_path(os.environ) == \
        platformdirs.user_config_path("fleet-tui") / "config.toml"
    custom = write(tmp_path / "elsewhere.toml", "max_attempts = 9\n")
    monkeypatch.setenv("FLEET_TUI_CONFIG", str(custom))
    assert config_file_path() == custom
    assert load_settings().max_attempts == 9


def test_default_config_file_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    write(config_file_path(), 'merge_strategy = "squash"\nstall_kill = true\n')
    s = load_settings()
    assert s.merge_strategy == "squash" and s.stall_kill is True


def test_environment_values_are_parsed(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "FLEET_WORKER_SANDBOX": "1",
           "FLEET_WORKER_KEY_SOURCES": "keyring, glm", "FLEET_WORKER_MAX_WORKERS": "6",
           "FLEET_WORKER_TIMEOUT": "0", "FLEET_WORKER_BACKOFF_BASE": "0.5",
           "FLEET_WORKER_CONFIG_DIR": "~/cfg-7", "FLEET_WORKER_CLAUDE": "/opt/claude",
           "FLEET_WORKER_STALL_KILL": "yes", "FLEET_WORKER_TEST_COMMAND": "pytest -q",
           "FLEET_WORKER_KEY_HELPER": "0", "FLEET_WORKER_SCRUB_TOOL_ENV": "on"}
    s = load_settings(env=env, config_file=tmp_path / "none.toml")
    assert s.sandbox is True
    assert s.key_helper is False and s.scrub_tool_env is True
    assert s.key_sources == ("keyring", "glm")
    assert s.max_workers == 6 and s.timeout == 0 and s.backoff_base == 0.5
    assert s.config_dir == tmp_path / "cfg-7"
    assert s.claude == "/opt/claude" and s.stall_kill is True
    assert s.test_command == "pytest -q"


def test_empty_environment_variable_counts_as_unset(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "FLEET_WORKER_MODEL": "", "FLEET_WORKER_SANDBOX": ""}
    s = load_settings(env=env, config_file=tmp_path / "none.toml")
    assert s.model == "GLM-5.2" and s.sandbox is False


def test_malformed_toml_names_file_and_line(tmp_path: Path) -> None:
    cfg = write(tmp_path / "config.toml", 'model = "ok"\nmax_workers = \nbase_url = "x"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(env={"HOME": str(tmp_path)}, config_file=cfg)
    assert str(cfg) in str(info.value) and "line 2" in str(info.value)
    assert info.value.line == 2 and info.value.exit_code == 2


def test_unknown_key_is_an_error_with_a_suggestion(tmp_path: Path) -> None:
    cfg = write(tmp_path / "config.toml", 'model = "m"\nmax_worker = 3\n')
    with pytest.raises(ConfigError) as info:
        load_settings(env={"HOME": str(tmp_path)}, config_file=cfg)
    message = str(info.value)
    assert "'max_worker'" in message and "did you mean 'max_workers'" in message
    assert f"{cfg}, line 2" in message


@pytest.mark.parametrize(("text", "needle"), [
    ("max_workers = 0", "max_workers"),
    ("max_workers = \"8\"", "whole number"),
    ("backoff_base = -1", "backoff_base"),
    ("timeout = -5", "timeout"),
    ("merge_strategy = \"rebase\"", "merge or squash"),
    ("permission_mode = \"yolo\"", "bypassPermissions"),
    ("key_sources = [\"env\", \"vault\"]", "'vault'"),
    ("sandbox = \"maybe\"", "true or false"),
    ("base_url = \"api.z.ai\"", "http(s) URL"),
    ("stall_kill = 1", "true or false"),
])
def test_bad_values_in_the_file_name_key_and_line(tmp_path: Path, text: str,
                                                  needle: str) -> None:
    cfg = write(tmp_path / "config.toml", f"# settings\n{text}\n")
    with pytest.raises(ConfigError) as info:
        load_settings(env={"HOME": str(tmp_path)}, config_file=cfg)
    assert needle in str(info.value)
    assert f"{cfg}, line 2" in str(info.value)


@pytest.mark.parametrize(("var", "value"), [
    ("FLEET_WORKER_MAX_WORKERS", "many"), ("FLEET_WORKER_PERMISSION_MODE", "yolo"),
    ("FLEET_WORKER_KEY_SOURCES", "env,file"), ("FLEET_WORKER_SANDBOX", "perhaps"),
    ("FLEET_WORKER_KILL_GRACE", "0"), ("FLEET_WORKER_STALL_SECONDS", "nan"),
])
def test_bad_environment_value_names_the_variable(tmp_path: Path, var: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(env={"HOME": str(tmp_path), var: value},
                      config_file=tmp_path / "none.toml")
    assert var in str(info.value)


def test_bad_flag_value_and_unknown_override(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    with pytest.raises(ConfigError, match="--max-workers"):
        load_settings(env=env, config_file=tmp_path / "n.toml", overrides={"max_workers": -1})
    with pytest.raises(ConfigError, match="'colour'"):
        load_settings(env=env, config_file=tmp_path / "n.toml", overrides={"colour": "red"})


def test_backoff_cap_below_base_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="backoff_cap"):
        load_settings(env={"HOME": str(tmp_path)}, config_file=tmp_path / "n.toml",
                      overrides={"backoff_base": 10, "backoff_cap": 5})


def test_settings_are_frozen(tmp_path: Path) -> None:
    s = load_settings(env={"HOME": str(tmp_path)}, config_file=tmp_path / "n.toml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.model = "x"  # type: ignore[misc]
    assert dataclasses.replace(s, model="x").model == "x"


def test_unreadable_config_file_is_a_clear_error(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_bytes(b"model = \"\xff\xfe\"\n")
    with pytest.raises(ConfigError, match=r"config\.toml"):
        load_settings(env={"HOME": str(tmp_path)}, config_file=cfg)


def test_the_lean_settings_of_fleet_worker_agree_with_settings(tmp_path: Path) -> None:
    """fleet-worker reads its settings through config_core without the dataclass; the
    fields, defaults and merged values must be those of Settings."""
    from fleet_tui.settings.config_core import _SPEC, load_launch_settings

    fields = [f for f in dataclasses.fields(Settings) if f.name not in ("endpoints", "hosts")]
    assert tuple(f.name for f in fields) == tuple(_SPEC)
    for f in fields:
        default = _SPEC[f.name][2]
        assert (Path(str(default)) if f.name == "config_dir" else default) == f.default
    config = write(tmp_path / "c.toml", 'model = "from-file"\nmax_workers = 7\n')
    env = {"HOME": str(tmp_path), "FLEET_WORKER_EFFORT": "low",
           "FLEET_WORKER_KEY_SOURCES": "glm,env"}
    full = load_settings(env=env, config_file=config, overrides={"claude": "/x/claude"})
    lean = load_launch_settings(env=env, config_file=config, overrides={"claude": "/x/claude"})
    for f in fields:
        value = getattr(lean, f.name)
        assert (Path(value) if f.name == "config_dir" else value) == getattr(full, f.name)
    with pytest.raises(AttributeError):
        lean.model = "changed"  # type: ignore[misc]
    with pytest.raises(ConfigError, match="FLEET_WORKER_MAX_WORKERS"):
        load_launch_settings(env={"FLEET_WORKER_MAX_WORKERS": "0"}, config_file=config)
