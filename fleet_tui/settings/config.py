"""Settings: defaults < config.toml < FLEET_WORKER_* environment < command-line flags.

Every knob of the original fleet-worker keeps its name and default, so an existing
`FLEET_WORKER_MODEL=...` setup behaves the same. Where the values come from and how they
are checked lives in `config_core` (which fleet-worker imports alone, to start fast); this
module adds the frozen `Settings` dataclass the engine, panel and commands use.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from fleet_tui.settings.config_core import (
    APP_NAME,
    CONFIG_FILE_ENV,
    DEFAULT_ALLOW_HOSTS,
    DEFAULT_CAGE,
    ENV_PREFIX,
    FIELD_NAMES,
    KEY_SOURCES,
    MERGE_STRATEGIES,
    PERMISSION_MODES,
    UPDATE_STRATEGIES,
    ConfigError,
    config_file_location,
    env_name,
    merged_values,
    setting_sources,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from fleet_tui.settings.endpoints import Endpoint
    from fleet_tui.settings.hosts import HostConfig

__all__ = ["APP_NAME", "CONFIG_FILE_ENV", "ENV_PREFIX", "FIELD_NAMES", "KEY_SOURCES",
           "MERGE_STRATEGIES", "PERMISSION_MODES", "UPDATE_STRATEGIES", "ConfigError",
           "Settings", "config_file_path", "env_name", "load_settings", "setting_sources"]


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the launcher and the engine can be told. Frozen: derive with
    `dataclasses.replace` or `load_settings(overrides=...)`. The fields and defaults are
    those of `config_core._SPEC` (a test keeps them equal)."""

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
    # keeping the key away from the tools claude runs
    key_helper: bool = True  # the key reaches claude through a one-shot pipe, not its env
    scrub_tool_env: bool = False  # CLAUDE_CODE_SUBPROCESS_ENV_SCRUB (needs bubblewrap, socat)
    # the cage: "worker" (claude and all it starts in an OS sandbox) or "off"; the hosts a
    # caged worker reaches besides its endpoint
    cage: str = DEFAULT_CAGE
    allow_hosts: tuple[str, ...] = DEFAULT_ALLOW_HOSTS
    # engine
    max_workers: int = 4
    max_attempts: int = 4
    backoff_base: float = 5.0
    backoff_cap: float = 300.0
    fallback_after: int = 2
    quota_cooldown: float = 60.0
    park_jitter: float = 30.0  # a parked endpoint waits 50-100 % of this past the reset
    resume_stagger: float = 10.0  # parked sessions resume this far apart
    cap_hold: float = 300.0  # a lowered cap steps back up after a success this much later
    timeout: float = 3600.0
    stall_seconds: float = 300.0
    stall_kill: bool = False
    kill_grace: float = 5.0
    merge_strategy: str = "merge"  # merge | squash | ff (fast-forward only)
    test_command: str | None = None
    # landing many branches
    update_strategy: str = "merge"  # how `update` brings a branch up to date: merge | rebase
    queue_fix_attempts: int = 1  # follow-ups the merge queue sends a task before it stops
    pr_command: str | None = None  # run after `push` (never by default): opens a PR
    archive_after_days: float = 14.0  # closed tasks older than this leave the list (0: never)
    # the gateway
    gateway: bool = True  # workers go through the local gateway (false: straight out)
    max_requests: int = 0  # the default endpoint's requests in flight (0: any number)
    budget_per_day: float = 0.0  # USD a day on the default endpoint (0: no budget)
    budget_per_task: float = 0.0  # USD a task (0: no budget)
    # not a setting of its own: the default endpoint (the fields above), then each
    # [endpoints.NAME] of config.toml (settings/endpoints.py)
    endpoints: tuple[Endpoint, ...] = ()
    # not a setting of its own either: `local`, then each [hosts.NAME] (settings/hosts.py)
    hosts: tuple[HostConfig, ...] = ()

    def endpoint(self, name: str | None = None) -> Endpoint:
        """The named endpoint (None: "default"); ConfigError naming the known ones."""
        from fleet_tui.settings import endpoints

        return endpoints.find(self.endpoints or (endpoints.default_endpoint(self),), name)

    def endpoint_of(self, name: str | None) -> Endpoint:
        """A stored task's endpoint: that name's, else the default (endpoints.lookup)."""
        from fleet_tui.settings import endpoints

        found = endpoints.lookup(self.endpoints, name) if self.endpoints else None
        if found is None or found.name == endpoints.DEFAULT:
            # from these settings as they are now (a replace() of them may have changed one)
            return endpoints.default_endpoint(self, found.prices if found else None)
        return found

    def for_endpoint(self, name: str | None) -> Settings:
        """These settings as a task on that endpoint sees them (its base URL, models,
        worker cap and key settings), so the rules written for the settings (policy's
        gate, cap, model choice) apply per endpoint. The default (and a name that is not
        an endpoint's, endpoint_of) is these settings themselves."""
        endpoint = self.endpoint_of(name)
        from fleet_tui.settings import endpoints

        if endpoint.name == endpoints.DEFAULT:
            return self
        # its URL, models and key's source (neither key_env nor key_keyring: the usual)
        return dataclasses.replace(self, max_workers=endpoint.max_workers,
                                   **endpoints.launch_overrides(endpoint))  # type: ignore[arg-type]

    @property
    def endpoint_names(self) -> tuple[str, ...]:
        """The configured endpoints' names, the default first."""
        return tuple(e.name for e in self.endpoints) or ("default",)

    def host(self, name: str | None = None) -> HostConfig:
        """The named host (None: "local"); ConfigError naming the known ones."""
        from fleet_tui.settings import hosts

        return hosts.find(self.all_hosts, name)

    @property
    def all_hosts(self) -> tuple[HostConfig, ...]:
        """`local` (with the worker cap as it is now), then each [hosts.NAME]."""
        from fleet_tui.settings import hosts

        own = next((h.max_workers for h in self.hosts if h.name == hosts.LOCAL), None)
        return (hosts.local_host(self, own), *(h for h in self.hosts if h.name != hosts.LOCAL))

    @property
    def host_names(self) -> tuple[str, ...]:
        """The hosts' names, `local` first."""
        return tuple(h.name for h in self.all_hosts)


def config_file_path(env: Mapping[str, str] | None = None) -> Path:
    """Where config.toml lives: `FLEET_TUI_CONFIG`, else the platform's user config dir."""
    return Path(config_file_location(env))


def load_settings(*, env: Mapping[str, str] | None = None,
                  config_file: str | os.PathLike[str] | None = None,
                  overrides: Mapping[str, object] | None = None) -> Settings:
    """Merge defaults < config file < FLEET_WORKER_* env < overrides into one Settings.

    `config_file` defaults to `config_file_path(env)`; a missing file is fine. Overrides
    are field names (flag values); `None` values are ignored so that parsed options can be
    passed straight through. Raises ConfigError naming the file and line or the variable.
    """
    values = merged_values(env=env, config_file=config_file, overrides=overrides)
    from fleet_tui.settings.repo_settings import check_user_tables

    check_user_tables(config_file_location(env) if config_file is None
                      else os.fspath(config_file))
    values["config_dir"] = Path(str(values["config_dir"]))
    settings = Settings(**values)  # type: ignore[arg-type]
    from fleet_tui.settings.endpoints import read_endpoints
    from fleet_tui.settings.hosts import read_hosts

    path = config_file_location(env) if config_file is None else os.fspath(config_file)
    return dataclasses.replace(settings, endpoints=read_endpoints(path, settings),
                               hosts=read_hosts(path, settings))
