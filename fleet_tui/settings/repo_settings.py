"""Per-repository settings: `.fleet-tui.toml` at a repository's root, `.worktreeinclude`.

A repository says how a new worktree of it is made ready, in a file committed with it:

    # .fleet-tui.toml
    setup = "npm ci"                     # run in each new worktree before claude starts
    include = [".env", "config/*.local"] # ignored files copied from the main checkout
    test_command = "npm test"            # the merge's test gate
    auto_pick = true                     # best of N: land the best copy on its own

    [rank]
    checks = ["ruff check .", "mypy src"]  # more evidence for ranking copies (best of N)

`.worktreeinclude` (one gitignore pattern a line, as Claude Code, Conductor and others read
it) adds to `include`. The user's config.toml overrides any of the three per repository:

    [repos."/home/me/src/shop"]
    setup = "npm ci --prefer-offline"

Precedence: `.fleet-tui.toml` < config.toml's `[repos."<path>"]`; for the test gate, the
merge's own `--test` > the repository's `test_command` > config.toml's top-level
`test_command`. Only files git ignores are copied (a tracked file is in the worktree
already; an untracked one git does not ignore would become part of the task's changes),
never a file that holds the API key.

`RepoSettingsCache` reads both files again when they change (their size and mtime), so the
panel never needs a restart; a file that no longer reads keeps its last good settings and
says why (`problems`). No Textual, no GitPython: the engine imports this.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from fleet_tui.settings.config_core import (
    CAGE_MODES,
    ConfigError,
    _line_of_key,
    _read_toml,
    check_length,
    config_file_location,
    convert_hosts,
)
from fleet_tui.settings.watch import Stamp, file_stamp, settled

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

REPO_FILE = ".fleet-tui.toml"
WORKTREE_INCLUDE = ".worktreeinclude"
KEYS = ("setup", "include", "test_command", "auto_pick", "rank", "sandbox", "allow_hosts")
RANK_KEYS = ("checks",)
# Only the user's config.toml may turn a repository's cage off: a repository's own file is
# written by whoever writes the repository (a worker's branch once merged, say).
USER_KEYS = (*KEYS, "cage")
SANDBOX_KEYS = ("allow_hosts",)  # [sandbox] allow_hosts = [...]
USER_TABLE = "repos"  # config.toml: [repos."<repository path>"]


@dataclass(frozen=True, slots=True)
class RepoSettings:
    """How a repository's new worktrees are made ready, and its test gate."""

    setup: str | None = None
    include: tuple[str, ...] = ()  # gitignore patterns (settings, then .worktreeinclude)
    test_command: str | None = None
    checks: tuple[str, ...] = ()  # [rank] checks: run in each copy, as the test command
    auto_pick: bool = False  # land the best copy once the last copy ends
    cage: str | None = None  # "worker" / "off" (config.toml's [repos."<path>"] only)
    allow_hosts: tuple[str, ...] | None = None  # [sandbox] allow_hosts: the cage's hosts

    def apply(self, settings: Any) -> Any:
        """The (frozen) settings with this repository's cage and allowed hosts."""
        changes: dict[str, object] = {}
        if self.cage is not None:
            changes["cage"] = self.cage
        if self.allow_hosts is not None:
            changes["allow_hosts"] = self.allow_hosts
        return replace(settings, **changes) if changes else settings

    @property
    def prepares(self) -> bool:
        """A new worktree has something to do before claude starts."""
        return bool(self.setup or self.include)


def _where(path: str, text: str, key: str) -> str:
    line = _line_of_key(text, key)
    return f"{path}, line {line}" if line else path


def _values(table: object, path: str, text: str, where: str, keys: tuple[str, ...] = KEYS
            ) -> dict[str, object]:
    """The keys of one table, checked; ConfigError naming the file and line."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table of " + ", ".join(keys), path=path)
    values: dict[str, object] = {}
    for key, raw in table.items():
        at = _where(path, text, key)
        if key == "cage" and key not in keys:
            raise ConfigError(f"{at}: a repository's own file cannot set its cage (a worker "
                              "could turn it off); set it in config.toml's "
                              f'[{USER_TABLE}."<path>"] table', path=path, key=key)
        if key not in keys:
            raise ConfigError(f"{at}: unknown setting {key!r} for a repository; use "
                              + ", ".join(keys), path=path, key=key)
        if key == "cage":
            if raw not in CAGE_MODES:
                raise ConfigError(f"{at}: cage: expected worker or off, got {raw!r}",
                                  path=path, key=key)
            values[key] = raw
            continue
        if key in ("sandbox", "allow_hosts"):
            hosts = _sandbox_hosts(raw, key, at, path)
            if hosts is not None:
                values["allow_hosts"] = hosts
            continue
        if key == "include":
            items = [raw] if isinstance(raw, str) else raw
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise ConfigError(f"{at}: include: expected a list of paths or patterns "
                                  "(strings)", path=path, key=key)
            values[key] = tuple(i.strip() for i in items if i.strip())
        elif key == "auto_pick":
            if not isinstance(raw, bool):
                raise ConfigError(f"{at}: auto_pick: expected true or false", path=path,
                                  key=key)
            values[key] = raw
            continue
        elif key == "rank":
            values["checks"] = _rank_checks(raw, path, text, at)
            continue
        else:
            if not isinstance(raw, str):
                raise ConfigError(f"{at}: {key}: expected a command (a string)", path=path,
                                  key=key)
            values[key] = raw.strip() or None
        value = values[key]
        for item in value if isinstance(value, tuple) else (value,):
            try:
                check_length(item if isinstance(item, str) else "")
            except ValueError as exc:
                raise ConfigError(f"{at}: {key}: {exc}", path=path, key=key) from None
    return values


def _sandbox_hosts(raw: object, key: str, at: str, path: str) -> tuple[str, ...] | None:
    """The hosts of a `[sandbox]` table (or of an `allow_hosts` list)."""
    if key == "sandbox":
        if not isinstance(raw, dict):
            raise ConfigError(f"{at}: sandbox: expected a table: [sandbox] allow_hosts = "
                              '["host", ...]', path=path, key=key)
        unknown = [k for k in raw if k not in SANDBOX_KEYS]
        if unknown:
            raise ConfigError(f"{at}: [sandbox]: unknown setting {unknown[0]!r}; use "
                              + ", ".join(SANDBOX_KEYS), path=path, key=key)
        if "allow_hosts" not in raw:
            return None
        raw = raw["allow_hosts"]
    try:
        return convert_hosts(raw)
    except ValueError as exc:
        raise ConfigError(f"{at}: allow_hosts: {exc}", path=path, key=key) from None


def _rank_checks(table: object, path: str, text: str, at: str) -> tuple[str, ...]:
    """`[rank] checks = ["ruff check .", ...]`: commands run in each copy (best of N)."""
    if not isinstance(table, dict):
        raise ConfigError(f"{at}: rank: expected a table: [rank] checks = [\"COMMAND\", ...]",
                          path=path, key="rank")
    checks: tuple[str, ...] = ()
    for key, raw in table.items():
        where = _where(path, text, key)
        if key not in RANK_KEYS:
            raise ConfigError(f"{where}: unknown setting {key!r} in [rank]; use "
                              + ", ".join(RANK_KEYS), path=path, key=key)
        if not isinstance(raw, list) or not all(isinstance(c, str) and c.strip()
                                                for c in raw):
            raise ConfigError(f"{where}: rank.checks: expected a list of commands "
                              "(non-empty strings)", path=path, key=key)
        for command in raw:
            try:
                check_length(command)
            except ValueError as exc:
                raise ConfigError(f"{where}: rank.checks: {exc}", path=path,
                                  key=key) from None
        checks = tuple(c.strip() for c in raw)
    return checks


def read_repo_file(repo: Path) -> dict[str, object]:
    """The settings of `<repo>/.fleet-tui.toml` ({} when there is none)."""
    path = str(repo / REPO_FILE)
    data, text = _read_toml(path)
    return _values(data, path, text, path) if data else {}


def read_user_override(repo: Path, config_file: str) -> dict[str, object]:
    """The `[repos."<repo>"]` table of the user's config.toml ({} when there is none)."""
    data, text = _read_toml(config_file)
    repos = data.get(USER_TABLE)
    if repos is None:
        return {}
    if not isinstance(repos, dict):
        raise ConfigError(f"{_where(config_file, text, USER_TABLE)}: {USER_TABLE} must be "
                          f'tables: [{USER_TABLE}."/path/to/repository"]', path=config_file)
    wanted = {str(repo), str(repo.resolve())}
    for name, table in repos.items():
        if str(Path(os.path.expanduser(name))) in wanted or \
                str(Path(os.path.expanduser(name)).resolve()) in wanted:
            return _values(table, config_file, text, f"{config_file}: [{USER_TABLE}.{name!r}]",
                           USER_KEYS)
    return {}


def check_user_tables(config_file: str) -> None:
    """Every `[repos."<path>"]` table of config.toml checked, whichever repository it names
    (ConfigError with the file, line and key), so a bad one is refused by every command
    that reads the settings, not when a task of that repository starts."""
    data, text = _read_toml(config_file)
    repos = data.get(USER_TABLE)
    if repos is None:
        return
    if not isinstance(repos, dict):
        raise ConfigError(f"{_where(config_file, text, USER_TABLE)}: {USER_TABLE} must be "
                          f'tables: [{USER_TABLE}."/path/to/repository"]', path=config_file)
    for name, table in repos.items():
        _values(table, config_file, text, f"{config_file}: [{USER_TABLE}.{name!r}]",
                USER_KEYS)


def worktree_include(repo: Path) -> tuple[str, ...]:
    """The patterns of `<repo>/.worktreeinclude` (blank lines and # comments skipped)."""
    try:
        text = (repo / WORKTREE_INCLUDE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ()
    return tuple(line.strip() for line in text.splitlines()
                 if line.strip() and not line.lstrip().startswith("#"))


def load_repo_settings(repo: Path, config_file: str) -> RepoSettings:
    """A repository's settings: its `.fleet-tui.toml`, then the user's override, with
    `.worktreeinclude` added to `include`. ConfigError (file and line) when one is bad."""
    values = read_repo_file(repo)
    values.update(read_user_override(repo, config_file))
    given = values.get("include")
    include: tuple[str, ...] = given if isinstance(given, tuple) else ()
    include += tuple(p for p in worktree_include(repo) if p not in include)
    setup = values.get("setup")
    test = values.get("test_command")
    cage = values.get("cage")
    hosts = values.get("allow_hosts")
    checks = values.get("checks")
    return RepoSettings(setup=setup if isinstance(setup, str) else None, include=include,
                        test_command=test if isinstance(test, str) else None,
                        checks=checks if isinstance(checks, tuple) else (),
                        auto_pick=values.get("auto_pick") is True,
                        cage=cage if isinstance(cage, str) else None,
                        allow_hosts=hosts if isinstance(hosts, tuple) else None)


class RepoSettingsCache:
    """Each repository's settings, read again when one of their files changed; a file
    that no longer reads keeps the last good settings (and `problems` says why). Shared by
    the engine's threads."""

    def __init__(self, env: Mapping[str, str] | None = None,
                 config_file: str | None = None) -> None:
        self.config_file = config_file or config_file_location(env)
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[tuple[Stamp | None, ...], RepoSettings]] = {}
        self._problems: dict[str, str] = {}
        self._seen: dict[str, tuple[Stamp | None, ...]] = {}  # the stamps `check` last looked at

    def _stamps(self, repo: Path) -> tuple[Stamp | None, ...]:
        return (file_stamp(repo / REPO_FILE), file_stamp(repo / WORKTREE_INCLUDE),
                file_stamp(self.config_file))

    def get(self, repo: Path) -> RepoSettings:
        """The repository's settings. ConfigError only when they never read well."""
        key = str(repo)
        stamps = self._stamps(repo)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and cached[0] == stamps:
                return cached[1]
            try:
                settings = load_repo_settings(repo, self.config_file)
            except ConfigError as exc:
                self._problems[key] = str(exc)
                if cached is None:
                    raise
                # keep the last good ones, and do not read the bad file again until it
                # changes
                self._cache[key] = (stamps, cached[1])
                return cached[1]
            self._problems.pop(key, None)
            self._cache[key] = (stamps, settings)
            return settings

    def check(self, repo: Path) -> tuple[str, str | None]:
        """Read the repository's settings again if a file of them changed: ("same", None),
        ("reloaded", None), ("bad", why: the last good ones stay in use), ("none", why:
        they never read well)."""
        key = str(repo)
        stamps = self._stamps(repo)
        with self._lock:
            seen = self._seen.get(key)
            if seen == stamps:
                return "same", None
            if seen is not None and not all(settled(s) for s in stamps):
                return "same", None  # being written: read once it rests (watch.SETTLE)
            self._seen[key] = stamps
        try:
            self.get(repo)
        except ConfigError as exc:
            return "none", str(exc)
        problem = self.problems().get(key)
        if problem is not None:
            return "bad", problem
        return ("reloaded" if seen is not None else "same"), None

    def problems(self) -> dict[str, str]:
        """Repository -> why its settings file does not read (its last good settings are
        in use)."""
        with self._lock:
            return dict(self._problems)
