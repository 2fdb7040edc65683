"""Settings: defaults < config.toml < FLEET_WORKER_* environment < command-line flags.

Every knob of the original fleet-worker keeps its name and default, so an existing
`FLEET_WORKER_MODEL=...` setup behaves the same. `fleet-worker` imports this module on
every launch, so it stays cheap: `tomllib` is imported only when a config file exists,
and the XDG config path is computed here on Linux instead of importing platformdirs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

APP_NAME = "fleet-tui"
ENV_PREFIX = "FLEET_WORKER_"
CONFIG_FILE_ENV = "FLEET_TUI_CONFIG"

PERMISSION_MODES = ("default", "acceptEdits", "plan", "auto", "dontAsk", "bypassPermissions")
KEY_SOURCES = ("env", "keyring", "zhipu", "glm")
MERGE_STRATEGIES = ("merge", "squash")

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class ConfigError(Exception):
    """A setting that cannot be used. The message names where it came from (file and
    line, or the environment variable) and what would be accepted."""

    exit_code = 2

    def __init__(self, message: str, *, path: Path | None = None, line: int | None = None,
                 key: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line
        self.key = key


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the launcher and the engine can be told. Frozen: derive with
    `dataclasses.replace` or `load_settings(overrides=...)`."""

    # launcher (names and defaults of the original fleet-worker)
    config_dir: Path = Path("~/.fleet-worker/cfg")
    base_url: str = "https://api.z.ai/api/anthropic"
    model: str = "GLM-5.2"
    small_model: str = "GLM-4.5-Air"
    permission_mode: str = "bypassPermissions"
    effort: str = "high"
    keyring_service: str = "fleet-worker"
    keyring_key: str = "api-key"
    claude: str = "claude"
    sandbox: bool = False
    key_sources: tuple[str, ...] = KEY_SOURCES
    # engine
    max_workers: int = 4
    max_attempts: int = 4
    backoff_base: float = 5.0
    backoff_cap: float = 300.0
    fallback_after: int = 2
    quota_cooldown: float = 60.0
    timeout: float = 3600.0
    stall_seconds: float = 300.0
    stall_kill: bool = False
    kill_grace: float = 5.0
    merge_strategy: str = "merge"
    test_command: str | None = None


# field name -> (kind, minimum). Kinds: str, path, bool, int, float, sources, optstr.
# A minimum of 0 allows zero (timeout: 0 means none); 1 / 1e-9 mean "positive".
_POSITIVE = 1e-9
_SPEC: dict[str, tuple[str, float | None]] = {
    "config_dir": ("path", None),
    "base_url": ("str", None),
    "model": ("str", None),
    "small_model": ("str", None),
    "permission_mode": ("str", None),
    "effort": ("str", None),
    "keyring_service": ("str", None),
    "keyring_key": ("str", None),
    "claude": ("str", None),
    "sandbox": ("bool", None),
    "key_sources": ("sources", None),
    "max_workers": ("int", 1),
    "max_attempts": ("int", 1),
    "backoff_base": ("float", _POSITIVE),
    "backoff_cap": ("float", _POSITIVE),
    "fallback_after": ("int", 1),
    "quota_cooldown": ("float", _POSITIVE),
    "timeout": ("float", 0),
    "stall_seconds": ("float", _POSITIVE),
    "stall_kill": ("bool", None),
    "kill_grace": ("float", _POSITIVE),
    "merge_strategy": ("str", None),
    "test_command": ("optstr", None),
}

FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Settings))


def env_name(field: str) -> str:
    """The environment variable of one setting: `FLEET_WORKER_<FIELD UPPERCASE>`."""
    return ENV_PREFIX + field.upper()


def _expand_home(text: str, env: Mapping[str, str]) -> Path:
    """`~` expanded against the given environment's HOME (so tests and callers that pass
    their own env get their own home)."""
    if text == "~" or text.startswith("~/"):
        home = env.get("HOME") or str(Path.home())
        return Path(home + text[1:])
    return Path(text).expanduser()


def config_file_path(env: Mapping[str, str] | None = None) -> Path:
    """Where config.toml lives: `FLEET_TUI_CONFIG`, else the platform's user config dir."""
    env = os.environ if env is None else env
    override = env.get(CONFIG_FILE_ENV)
    if override:
        return _expand_home(override, env)
    if sys.platform.startswith("linux"):
        # What platformdirs.user_config_path computes on Linux (XDG), without paying ~13 ms
        # to import platformdirs on every fleet-worker launch.
        xdg = env.get("XDG_CONFIG_HOME", "").strip()
        base = Path(xdg) if xdg else _expand_home("~/.config", env)
        return base / APP_NAME / "config.toml"
    import platformdirs

    return platformdirs.user_config_path(APP_NAME) / "config.toml"


def _describe_kind(kind: str, minimum: float | None) -> str:
    if kind == "int":
        return "a whole number" + (" >= 1" if minimum == 1 else f" >= {minimum:g}")
    if kind == "float":
        return "a number of seconds" + (" > 0" if minimum == _POSITIVE else " >= 0")
    if kind == "bool":
        return "true or false (1/0, yes/no, on/off)"
    if kind == "sources":
        return "a comma-separated list of " + ", ".join(KEY_SOURCES)
    return "a non-empty string"


def _convert(name: str, raw: object, *, from_text: bool) -> object:
    """Turn one raw value (TOML value, env text or flag value) into the field's type.
    Raises ValueError with the expectation; the caller adds where it came from."""
    kind, minimum = _SPEC[name]
    expected = _describe_kind(kind, minimum)
    if kind in ("str", "path", "optstr"):
        if not isinstance(raw, str | Path):
            raise ValueError(f"expected {expected}")
        text = str(raw).strip()
        if not text:
            if kind == "optstr":
                return None
            raise ValueError(f"expected {expected}")
        if name == "permission_mode" and text not in PERMISSION_MODES:
            raise ValueError(f"{text!r} is not a permission mode; use one of "
                             + ", ".join(PERMISSION_MODES))
        if name == "base_url" and not text.startswith(("http://", "https://")):
            raise ValueError(f"{text!r} is not an http(s) URL")
        if name == "merge_strategy" and text not in MERGE_STRATEGIES:
            raise ValueError(f"{text!r} is not a merge strategy; use merge or squash")
        return text
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        if from_text and isinstance(raw, str):
            low = raw.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE or low == "":
                return False
        raise ValueError(f"expected {expected}")
    if kind == "sources":
        items: list[str]
        if isinstance(raw, str):
            items = [part.strip() for part in raw.split(",") if part.strip()]
        elif isinstance(raw, list | tuple) and all(isinstance(p, str) for p in raw):
            items = [str(p).strip() for p in raw]
        else:
            raise ValueError(f"expected {expected}")
        if not items:
            raise ValueError(f"expected {expected} (at least one)")
        bad = [p for p in items if p not in KEY_SOURCES]
        if bad:
            raise ValueError(f"unknown key source {bad[0]!r}; use " + ", ".join(KEY_SOURCES))
        return tuple(dict.fromkeys(items))  # keep order, drop repeats
    # numbers
    value: float
    if isinstance(raw, bool):
        raise ValueError(f"expected {expected}")
    if kind == "int":
        if isinstance(raw, int):
            value = raw
        elif from_text and isinstance(raw, str):
            try:
                value = int(raw.strip())
            except ValueError:
                raise ValueError(f"expected {expected}") from None
        else:
            raise ValueError(f"expected {expected}")
    else:
        if isinstance(raw, int | float):
            value = float(raw)
        elif from_text and isinstance(raw, str):
            try:
                value = float(raw.strip())
            except ValueError:
                raise ValueError(f"expected {expected}") from None
        else:
            raise ValueError(f"expected {expected}")
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"expected {expected}")
    if minimum is not None and value < minimum:
        raise ValueError(f"expected {expected}, got {raw!r}")
    return value


def _line_of_key(text: str, key: str) -> int | None:
    """The line where `key = ...` is set at the top level of a TOML text, if findable."""
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.lstrip()
        for candidate in (key, f'"{key}"', f"'{key}'"):
            if stripped.startswith(candidate):
                rest = stripped[len(candidate):].lstrip()
                if rest.startswith("="):
                    return number
    return None


def _read_toml(path: Path) -> tuple[dict[str, object], str]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}, ""
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the settings file ({exc})", path=path) from None
    import re
    import tomllib

    try:
        return tomllib.loads(text), text
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
        line = int(match.group(1)) if match else None
        if line is None and "end of document" in str(exc):
            line = max(1, len(text.splitlines()))
        reason = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)", "", str(exc))
        if "end of document" in str(exc):
            reason += " (the file ends too early)"
        where = f"{path}, line {line}" if line else str(path)
        raise ConfigError(f"{where}: not valid TOML: {reason}", path=path, line=line) from None


def _from_file(path: Path) -> dict[str, object]:
    data, text = _read_toml(path)
    values: dict[str, object] = {}
    for key, raw in data.items():
        line = _line_of_key(text, key)
        where = f"{path}, line {line}" if line else str(path)
        if key not in _SPEC:
            import difflib

            close = difflib.get_close_matches(key, FIELD_NAMES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"{where}: unknown setting {key!r}{hint}. Known settings: "
                + ", ".join(FIELD_NAMES), path=path, line=line, key=key)
        try:
            values[key] = _convert(key, raw, from_text=False)
        except ValueError as exc:
            raise ConfigError(f"{where}: {key}: {exc}", path=path, line=line, key=key) from None
    return values


def _from_env(env: Mapping[str, str]) -> dict[str, object]:
    values: dict[str, object] = {}
    for name in FIELD_NAMES:
        var = env_name(name)
        raw = env.get(var)
        # An empty variable counts as unset, like the original's ${VAR:-default}.
        if raw is None or (raw.strip() == "" and _SPEC[name][0] != "bool"):
            continue
        try:
            values[name] = _convert(name, raw, from_text=True)
        except ValueError as exc:
            raise ConfigError(f"{var}={raw!r}: {exc}", key=var) from None
    return values


def _from_overrides(overrides: Mapping[str, object]) -> dict[str, object]:
    values: dict[str, object] = {}
    for name, raw in overrides.items():
        if raw is None:
            continue  # an option that was not given
        if name not in _SPEC:
            raise ConfigError(f"unknown setting {name!r}", key=name)
        try:
            values[name] = _convert(name, raw, from_text=isinstance(raw, str))
        except ValueError as exc:
            raise ConfigError(f"--{name.replace('_', '-')}: {exc}", key=name) from None
    return values


def load_settings(*, env: Mapping[str, str] | None = None, config_file: Path | None = None,
                  overrides: Mapping[str, object] | None = None) -> Settings:
    """Merge defaults < config file < FLEET_WORKER_* env < overrides into one Settings.

    `config_file` defaults to `config_file_path(env)`; a missing file is fine. Overrides
    are field names (flag values); `None` values are ignored so that parsed options can be
    passed straight through. Raises ConfigError naming the file and line or the variable.
    """
    env = os.environ if env is None else env
    path = config_file_path(env) if config_file is None else config_file
    merged: dict[str, object] = {}
    merged.update(_from_file(path))
    merged.update(_from_env(env))
    if overrides:
        merged.update(_from_overrides(overrides))
    raw_dir = merged.get("config_dir", "~/.fleet-worker/cfg")
    merged["config_dir"] = _expand_home(str(raw_dir), env)
    settings = Settings(**merged)  # type: ignore[arg-type]
    if settings.backoff_cap < settings.backoff_base:
        raise ConfigError(f"backoff_cap ({settings.backoff_cap:g}) must be at least "
                          f"backoff_base ({settings.backoff_base:g})", key="backoff_cap")
    return settings
