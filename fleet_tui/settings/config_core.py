"""The lean half of config.py: where settings come from and how they are checked.

`fleet-worker` runs before every worker, and a Python launcher pays for every module it
imports (~10 ms for `dataclasses`, ~12 ms for `pathlib` with the `re` it pulls in, ~10 ms
for `typing`). So this module imports nothing but `os`, `sys` and `fleet_tui.core.errors` (which
imports nothing) at the top: paths are
strings here, `tomllib` is imported only when a config file exists, and the result for the
launcher is a plain slotted `LaunchSettings`. `config.load_settings` builds the frozen
`Settings` dataclass from the same merged values, so both always agree.
"""

from __future__ import annotations

import os
import sys

from fleet_tui.core.errors import FleetTuiError

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: these imports cost start-up time
    from collections.abc import Mapping
    from typing import Protocol

    class SettingsLike(Protocol):
        """What the launcher reads of the settings (`Settings` and `LaunchSettings`)."""

        @property
        def config_dir(self) -> str | os.PathLike[str]: ...
        @property
        def base_url(self) -> str: ...
        @property
        def model(self) -> str: ...
        @property
        def small_model(self) -> str: ...
        @property
        def permission_mode(self) -> str: ...
        @property
        def effort(self) -> str: ...
        @property
        def keyring_service(self) -> str: ...
        @property
        def keyring_key(self) -> str: ...
        @property
        def claude(self) -> str: ...
        @property
        def sandbox(self) -> bool: ...
        @property
        def key_sources(self) -> tuple[str, ...]: ...
        @property
        def key_helper(self) -> bool: ...
        @property
        def scrub_tool_env(self) -> bool: ...
        @property
        def cage(self) -> str: ...
        @property
        def allow_hosts(self) -> tuple[str, ...]: ...

APP_NAME = "fleet-tui"
ENV_PREFIX = "FLEET_WORKER_"
CONFIG_FILE_ENV = "FLEET_TUI_CONFIG"

PERMISSION_MODES = ("default", "acceptEdits", "plan", "auto", "dontAsk", "bypassPermissions")
KEY_SOURCES = ("env", "keyring", "zhipu", "glm")
MERGE_STRATEGIES = ("merge", "squash", "ff")
UPDATE_STRATEGIES = ("merge", "rebase")
DEFAULT_CONFIG_DIR = "~/.fleet-worker/cfg"
# The cage (execution/worker/cage.py): a worker in an OS sandbox where srt can make one.
CAGE_MODES = ("worker", "off")
DEFAULT_CAGE = "worker" if sys.platform.startswith(("linux", "darwin")) else "off"
# The hosts a caged worker reaches by default besides its endpoint: the package registries
# a build needs (Python, JavaScript, Rust, Go).
DEFAULT_ALLOW_HOSTS = ("pypi.org", "files.pythonhosted.org", "registry.npmjs.org",
                       "registry.yarnpkg.com", "crates.io", "static.crates.io",
                       "index.crates.io", "proxy.golang.org", "sum.golang.org")

# The longest text a setting may be (a model name, a URL, a command): every such value ends
# up in claude's argv or environment, where Linux takes at most 128 KiB per string; a
# setting over this is refused where it is read, not when claude fails to start.
MAX_SETTING_CHARS = 4096

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class ConfigError(FleetTuiError):
    """A setting that cannot be used. The message names where it came from (file and
    line, or the environment variable) and what would be accepted."""

    exit_code = 2
    title = "Settings"

    def __init__(self, message: str, *, path: str | os.PathLike[str] | None = None,
                 line: int | None = None, key: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line
        self.key = key


# Every setting, in the order of the Settings fields: name -> (kind, minimum, default).
# Kinds: str, path, bool, int, seconds, days, sources, optstr. A minimum of 0 allows zero
# (timeout: 0 means none); 1 / 1e-9 mean "positive". Seconds are durations.py's: a number
# of seconds or a duration (`"15m"`), at most 7 days, as `--timeout` and the launch form.
_POSITIVE = 1e-9
_SPEC: dict[str, tuple[str, float | None, object]] = {
    # launcher (names and defaults of the original fleet-worker)
    "config_dir": ("path", None, DEFAULT_CONFIG_DIR),
    "base_url": ("str", None, "https://api.z.ai/api/anthropic"),
    "model": ("str", None, "GLM-5.2"),
    "small_model": ("str", None, "GLM-4.5-Air"),
    "permission_mode": ("str", None, "bypassPermissions"),
    "effort": ("str", None, "high"),
    "keyring_service": ("str", None, "fleet-worker"),
    "keyring_key": ("str", None, "api-key"),
    "claude": ("str", None, "claude"),
    "sandbox": ("bool", None, False),
    "key_sources": ("sources", None, KEY_SOURCES),
    # keeping the key away from the tools claude runs (see launcher.plan_launch)
    "key_helper": ("bool", None, True),
    "scrub_tool_env": ("bool", None, False),
    # the cage: worker (claude and all it starts in an OS sandbox) or off; the hosts it may
    # reach besides its endpoint
    "cage": ("str", None, DEFAULT_CAGE),
    "allow_hosts": ("hosts", None, DEFAULT_ALLOW_HOSTS),
    # engine
    "max_workers": ("int", 1, 4),
    "max_attempts": ("int", 1, 4),
    "backoff_base": ("seconds", _POSITIVE, 5.0),
    "backoff_cap": ("seconds", _POSITIVE, 300.0),
    "fallback_after": ("int", 1, 2),
    "quota_cooldown": ("seconds", _POSITIVE, 60.0),
    # the endpoint's limits: a park's jitter past the reset, the stagger of the sessions
    # that resume after it, how long a lowered cap holds before each step back up
    "park_jitter": ("seconds", 0, 30.0),
    "resume_stagger": ("seconds", 0, 10.0),
    "cap_hold": ("seconds", 0, 300.0),
    "timeout": ("seconds", 0, 3600.0),
    "stall_seconds": ("seconds", _POSITIVE, 300.0),
    "stall_kill": ("bool", None, False),
    "kill_grace": ("seconds", _POSITIVE, 5.0),
    "merge_strategy": ("str", None, "merge"),
    "test_command": ("optstr", None, None),
    # landing many branches
    "update_strategy": ("str", None, "merge"),
    "queue_fix_attempts": ("int", 0, 1),
    "pr_command": ("optstr", None, None),
    # the list: merged and discarded tasks older than this are archived (their
    # logs kept); 0: never
    "archive_after_days": ("days", 0, 14.0),
    # the gateway: workers go through it (false: straight to the endpoint);
    # the default endpoint's requests in flight through it (0: any number), its budgets
    # in USD (0: none)
    "gateway": ("bool", None, True),
    "max_requests": ("int", 0, 0),
    "budget_per_day": ("usd", 0, 0.0),
    "budget_per_task": ("usd", 0, 0.0),
}

FIELD_NAMES: tuple[str, ...] = tuple(_SPEC)
# config.toml tables that are not settings of their own: [repos."<path>"] (per-repository
# overrides of .fleet-tui.toml, see repo_settings), [serve] (`fleet-tui serve`, settings/serve.py),
# [hosts.NAME] (where workers run, settings/hosts.py), [mcp] (`fleet-tui mcp`'s caps,
# settings/mcp.py)
TABLES = frozenset({"repos", "endpoints", "prices", "serve", "hosts", "mcp"})


def env_name(field: str) -> str:
    """The environment variable of one setting: `FLEET_WORKER_<FIELD UPPERCASE>`."""
    return ENV_PREFIX + field.upper()


def expand_home(text: str, env: Mapping[str, str]) -> str:
    """`~` expanded against the given environment's HOME (so tests and callers that pass
    their own env get their own home)."""
    if text == "~" or text.startswith("~/"):
        home = env.get("HOME") or os.path.expanduser("~")
        return home + text[1:]
    return os.path.expanduser(text)


def config_file_location(env: Mapping[str, str] | None = None) -> str:
    """Where config.toml lives: `FLEET_TUI_CONFIG`, else the platform's user config dir."""
    env = os.environ if env is None else env
    override = env.get(CONFIG_FILE_ENV)
    if override:
        return expand_home(override, env)
    if sys.platform.startswith("linux"):
        # What platformdirs.user_config_path computes on Linux (XDG), without paying ~13 ms
        # to import platformdirs on every fleet-worker launch.
        xdg = env.get("XDG_CONFIG_HOME", "").strip()
        base = xdg if xdg else expand_home("~/.config", env)
        return os.path.join(base, APP_NAME, "config.toml")
    import platformdirs

    return str(platformdirs.user_config_path(APP_NAME) / "config.toml")


def check_length(text: str) -> None:
    """ValueError when a setting's text is longer than MAX_SETTING_CHARS."""
    if len(text) > MAX_SETTING_CHARS:
        raise ValueError(f"too long ({len(text)} characters, at most {MAX_SETTING_CHARS}): "
                         f"{text[:40]!r}...")


def _describe_kind(kind: str, minimum: float | None) -> str:
    if kind == "int":
        return "a whole number" + (" >= 1" if minimum == 1 else f" >= {minimum:g}")
    if kind == "seconds":
        return ("a number of seconds or a duration such as \"90s\", \"15m\" or \"1h30m\""
                + (", more than 0" if minimum == _POSITIVE else ", 0 or more")
                + ", at most 7 days")
    if kind == "days":
        return "a number of days >= 0 (0: never)"
    if kind == "bool":
        return "true or false (1/0, yes/no, on/off)"
    if kind == "sources":
        return "a comma-separated list of " + ", ".join(KEY_SOURCES)
    if kind == "usd":
        return "an amount in USD >= 0 (0: none)"
    if kind == "hosts":
        return "a list of host names (host or host:port; \"*.example.org\" for a domain's hosts)"
    return "a non-empty string"


def _convert(name: str, raw: object, *, from_text: bool) -> object:
    """Turn one raw value (TOML value, env text or flag value) into the field's type.
    Raises ValueError with the expectation; the caller adds where it came from."""
    kind, minimum, _ = _SPEC[name]
    expected = _describe_kind(kind, minimum)
    if kind in ("str", "path", "optstr"):
        return _convert_text(name, kind, raw, expected)
    if kind == "bool":
        return _convert_bool(raw, expected, from_text=from_text)
    if kind == "sources":
        return _convert_sources(raw, expected)
    if kind == "hosts":
        return convert_hosts(raw, expected)
    if kind == "seconds":  # durations.py's rule, as --timeout and the launch form
        from fleet_tui.core import durations

        try:
            return durations.parse_seconds(raw, allow_zero=minimum != _POSITIVE)
        except ValueError as exc:
            raise ValueError(f"expected {exc}, got {raw!r}") from None
    value = _convert_number(kind, raw, expected, from_text=from_text)
    if minimum is not None and value < minimum:
        raise ValueError(f"expected {expected}, got {raw!r}")
    return value


def _convert_text(name: str, kind: str, raw: object, expected: str) -> str | None:
    """A str, path or optstr field (blank: None for optstr), with the fields whose text
    must be one of a few words or an http(s) URL checked."""
    if not isinstance(raw, str | os.PathLike):
        raise ValueError(f"expected {expected}")
    text = os.fspath(raw).strip()
    if not text:
        if kind == "optstr":
            return None
        raise ValueError(f"expected {expected}")
    check_length(text)
    if name == "permission_mode" and text not in PERMISSION_MODES:
        raise ValueError(f"{text!r} is not a permission mode; use one of "
                         + ", ".join(PERMISSION_MODES))
    if name == "base_url" and not text.startswith(("http://", "https://")):
        raise ValueError(f"{text!r} is not an http(s) URL")
    if name == "merge_strategy" and text not in MERGE_STRATEGIES:
        raise ValueError(f"{text!r} is not a merge strategy; use merge or squash "
                         "(or ff: fast-forward only)")
    if name == "cage" and text not in CAGE_MODES:
        raise ValueError(f"{text!r} is not a cage mode; use worker (the worker in an OS "
                         "sandbox) or off")
    if name == "update_strategy" and text not in UPDATE_STRATEGIES:
        raise ValueError(f"{text!r} is not an update strategy; use merge or rebase")
    return text


def _convert_bool(raw: object, expected: str, *, from_text: bool) -> bool:
    """A bool field: a TOML bool, or from text one of the words of _TRUE / _FALSE (blank
    is false)."""
    if isinstance(raw, bool):
        return raw
    if from_text and isinstance(raw, str):
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE or low == "":
            return False
    raise ValueError(f"expected {expected}")


def _convert_sources(raw: object, expected: str) -> tuple[str, ...]:
    """The key's sources: comma-separated text or a TOML list, each a known source, in
    the order given without repeats."""
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


def convert_hosts(raw: object, expected: str = "a list of host names") -> tuple[str, ...]:
    """allow_hosts: comma-separated text or a TOML list of `host` / `host:port` (no scheme,
    path or spaces), in order without repeats; empty allows none."""
    if isinstance(raw, str):
        items = [part.strip() for part in raw.split(",") if part.strip()]
    elif isinstance(raw, list | tuple) and all(isinstance(p, str) for p in raw):
        items = [str(p).strip() for p in raw if str(p).strip()]
    else:
        raise ValueError(f"expected {expected}")
    for item in items:
        check_length(item)
        if any(c.isspace() for c in item) or "/" in item or "@" in item:
            raise ValueError(f"{item!r} is not a host name: write host or host:port, "
                             "without a scheme or a path")
    return tuple(dict.fromkeys(items))


def _convert_number(kind: str, raw: object, expected: str, *, from_text: bool) -> float:
    """An int or float field (a bool is neither; a float must be finite); text only from
    the environment or a flag."""
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


def _read_toml(path: str) -> tuple[dict[str, object], str]:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
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


def _from_file(path: str) -> dict[str, object]:
    data, text = _read_toml(path)
    values: dict[str, object] = {}
    for key, raw in data.items():
        line = _line_of_key(text, key)
        where = f"{path}, line {line}" if line else str(path)
        if key in TABLES:
            continue  # read by their own readers (repo_settings: [repos."<path>"])
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
            shown = repr(raw) if len(raw) <= 80 else f"{raw[:40]!r}... ({len(raw)} characters)"
            raise ConfigError(f"{var}={shown}: {exc}", key=var) from None
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


def merged_values(*, env: Mapping[str, str] | None = None,
                  config_file: str | os.PathLike[str] | None = None,
                  overrides: Mapping[str, object] | None = None) -> dict[str, object]:
    """Every setting, defaults < config file < FLEET_WORKER_* env < overrides, checked.

    `config_dir` comes back as a string with `~` expanded. Raises ConfigError naming the
    file and line or the variable."""
    env = os.environ if env is None else env
    path = config_file_location(env) if config_file is None else os.fspath(config_file)
    merged: dict[str, object] = {name: spec[2] for name, spec in _SPEC.items()}
    merged.update(_from_file(path))
    merged.update(_from_env(env))
    if overrides:
        merged.update(_from_overrides(overrides))
    merged["config_dir"] = expand_home(os.fspath(merged["config_dir"]), env)  # type: ignore[call-overload]
    base, cap = merged["backoff_base"], merged["backoff_cap"]
    assert isinstance(base, float) and isinstance(cap, float)
    if cap < base:
        raise ConfigError(f"backoff_cap ({cap:g}) must be at least backoff_base ({base:g})",
                          key="backoff_cap")
    return merged


def setting_sources(*, env: Mapping[str, str] | None = None,
                    config_file: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Where each setting's value comes from: its FLEET_WORKER_* variable's name, the config
    file's path, or "default" (what `fleet-doctor` reports). Raises ConfigError as
    merged_values does."""
    env = os.environ if env is None else env
    path = config_file_location(env) if config_file is None else os.fspath(config_file)
    sources = dict.fromkeys(_SPEC, "default")
    sources.update(dict.fromkeys(_from_file(path), path))
    sources.update({name: env_name(name) for name in _from_env(env)})
    return sources


class LaunchSettings:
    """The settings as fleet-worker holds them: the same names and values as
    `config.Settings`, in a plain slotted object (no dataclasses import, `config_dir` a
    string). Anything else should use `config.load_settings()`."""

    __slots__ = FIELD_NAMES

    config_dir: str
    base_url: str
    model: str
    small_model: str
    permission_mode: str
    effort: str
    keyring_service: str
    keyring_key: str
    claude: str
    sandbox: bool
    key_sources: tuple[str, ...]
    key_helper: bool
    scrub_tool_env: bool
    cage: str
    allow_hosts: tuple[str, ...]

    def __init__(self, values: Mapping[str, object]) -> None:
        for name in FIELD_NAMES:
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"LaunchSettings is read-only ({name})")

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in FIELD_NAMES)
        return f"LaunchSettings({inner})"


def load_launch_settings(*, env: Mapping[str, str] | None = None,
                         config_file: str | os.PathLike[str] | None = None,
                         overrides: Mapping[str, object] | None = None) -> LaunchSettings:
    """`config.load_settings` for fleet-worker: same sources, checks and errors."""
    return LaunchSettings(merged_values(env=env, config_file=config_file,
                                        overrides=overrides))
