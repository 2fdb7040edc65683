"""The ray kind's table:

    [hosts.cluster]
    ray = "http://head:8265"    # a Ray cluster's Jobs address: each attempt a job
    resources = { agenthost = 1 }  # optional: the job's entrypoint_resources (its node)
    max_workers = 8
    data_dir = "/var/tmp/fleet-tui-ray"  # optional: on the nodes (repos, worktrees, attempts)
    python = "python3"          # optional: the nodes' python
    claude = "/opt/claude/bin/claude"  # optional: the nodes' claude (else the setting's)
    key_env = "TEAM_ANTHROPIC_KEY"  # optional: the nodes hold the key in that variable
                                # (unset: through this machine's gateway, with a token)
    gateway_host = "10.0.0.5"   # optional: how the nodes reach this machine's gateway
    cage = "off"                # optional: its workers run uncaged (else as the tasks say)
    srt = "/opt/srt"            # optional: the nodes' srt (its package folder or an npm
                                # prefix holding it; else each node finds its own)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fleet_tui.settings.config_core import ConfigError
from fleet_tui.settings.hosts import HostConfig, cage_of, cap_of, unknown_fields

KIND = "ray"
FIELDS = ("ray", "resources", "max_workers", "data_dir", "python", "claude", "key_env",
          "gateway_host", "cage", "srt")
TEXTS = ("data_dir", "python", "claude", "key_env", "gateway_host", "srt")


@dataclass(frozen=True)
class RayOptions:
    ray: str  # the cluster's Jobs address
    resources: dict[str, float] | None = None
    data_dir: str | None = None
    python: str | None = None
    claude: str | None = None
    key_env: str | None = None
    gateway_host: str | None = None
    srt: str | None = None  # the nodes' srt (None: each node finds its own)
    cage: str | None = None  # "off": its workers run uncaged (None: as the tasks' settings say)


def options(host: HostConfig) -> RayOptions:
    """The Ray options of a Ray host."""
    assert isinstance(host.options, RayOptions), f"{host.name} is not a Ray host"
    return host.options


def ray_host(name: str, max_workers: int, ray: str, **given: Any) -> HostConfig:
    return HostConfig(name, max_workers, KIND, RayOptions(ray, **given))


def parse_ray_address(raw: object, where: str = "host") -> str:
    """A Ray cluster's Jobs address (http[s]://HOST:PORT, the dashboard's), or ConfigError
    saying what is accepted."""
    from urllib.parse import urlsplit

    text = raw.strip().rstrip("/") if isinstance(raw, str) else ""
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1 \
            or parts.path or parts.query or parts.fragment or any(c.isspace() for c in text):
        raise ConfigError(f"{where}: ray: {raw!r} is not a Ray Jobs address (the cluster's "
                          "dashboard, e.g. http://head:8265)", key="ray")
    return text


def parse_resources(raw: object, where: str = "host") -> dict[str, float]:
    """A job's entrypoint_resources: names to amounts > 0 (ConfigError otherwise)."""
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{where}: resources: expected a table of resource names and "
                          f"amounts, e.g. {{ agenthost = 1 }}, got {raw!r}", key="resources")
    out: dict[str, float] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not key or any(c.isspace() for c in key):
            raise ConfigError(f"{where}: resources: {key!r} is not a resource name",
                              key="resources")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"{where}: resources: {key} = {value!r}: expected an amount "
                              "> 0", key="resources")
        out[key] = float(value)
    return out


class RaySchema:
    mark = "ray"
    label = "Ray"
    fields = FIELDS

    def parse(self, name: str, table: dict[str, Any], where: str,
              default_cap: int) -> HostConfig:
        unknown_fields(table, FIELDS, where, "a Ray host")
        address = parse_ray_address(table["ray"], where)
        resources = parse_resources(table["resources"], where) if "resources" in table \
            else None
        texts: dict[str, str | None] = {}
        for key in TEXTS:
            value = table.get(key)
            if value is not None and (not isinstance(value, str) or not value.strip()
                                      or any(c in value for c in "\n\r\x00")):
                raise ConfigError(f"{where}: {key}: expected a non-empty string, got "
                                  f"{value!r}", key=key)
            texts[key] = value
        data_dir, key_env = texts["data_dir"], texts["key_env"]
        if data_dir is not None and not data_dir.startswith("/"):
            raise ConfigError(f"{where}: data_dir: expected an absolute path on the nodes, "
                              f"got {data_dir!r}", key="data_dir")
        if key_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key_env):
            raise ConfigError(f"{where}: key_env: expected the name of an environment "
                              f"variable, got {key_env!r}", key="key_env")
        cap = cap_of(table.get("max_workers", default_cap), where)
        return ray_host(name, cap, address, resources=resources, cage=cage_of(table, where),
                        **texts)

    def table(self, host: HostConfig) -> dict[str, object]:
        own = options(host)
        out: dict[str, object] = {"ray": own.ray}
        if own.resources:
            out["resources"] = {k: int(v) if float(v).is_integer() else v
                                for k, v in own.resources.items()}
        out["max_workers"] = host.max_workers
        for key in TEXTS:
            if getattr(own, key) is not None:
                out[key] = getattr(own, key)
        if own.cage is not None:
            out["cage"] = own.cage
        return out

    def target(self, host: HostConfig) -> str:
        return options(host).ray


SCHEMA = RaySchema()

__all__ = ["SCHEMA", "RayOptions", "options", "parse_ray_address", "parse_resources",
           "ray_host"]
