"""Hosts (issue 20): `[hosts.NAME]` tables of config.toml, where workers may run.

    [hosts.box]
    ssh = "box"                 # as ssh takes it: an alias of ~/.ssh/config, user@host,
                                # host:port, [v6addr]:port
    port = 2222                 # optional: the port, when the target does not say it
    max_workers = 8             # workers at once on that host (default: the top-level cap)
    key_on_host = false         # true: the key is kept on the host (its own gateway)

    [hosts.cluster]
    ray = "http://head:8265"    # a Ray cluster's Jobs address (issue 21): each attempt a job
    resources = { agenthost = 1 }  # optional: the job's entrypoint_resources (its node)
    max_workers = 8
    data_dir = "/var/tmp/fleet-tui-ray"  # optional: on the nodes (repos, worktrees, attempts)
    python = "python3"          # optional: the nodes' python
    claude = "/opt/claude/bin/claude"  # optional: the nodes' claude (else the setting's)
    key_env = "TEAM_ANTHROPIC_KEY"  # optional: the nodes hold the key in that variable
                                # (unset: through this machine's gateway, with a token)
    gateway_host = "10.0.0.5"   # optional: how the nodes reach this machine's gateway

`local` (this machine) is always a host. Its cap is the fleet's (the sum of the endpoints'
caps: the top-level `max_workers` with one endpoint), so that hosts change nothing for a
fleet that has none; `[hosts.local]` with `max_workers` alone bounds this machine below it
(then a remote host's workers add to the endpoints' caps, not to this machine's). `any` is
not a host: `run --host any` places a task on the host with a free slot. Nothing here
opens a connection: the host's code is chosen by `execution.hosts`, and the user's own
ssh (their config, agent and known-hosts checking) does the connecting.

The writer (`add_host`, `remove_host`) keeps the user's file: it appends or cuts one
`[hosts.NAME]` table as text, keeps every other byte, and writes only when the new file
reads back as the old one with exactly that table added or removed.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fleet_tui.settings.config_core import ConfigError, _read_toml, check_length

LOCAL = "local"
ANY = "any"
TABLE = "hosts"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")
FIELDS = ("ssh", "port", "max_workers", "key_on_host", "cage")
RAY_FIELDS = ("ray", "resources", "max_workers", "data_dir", "python", "claude", "key_env",
              "gateway_host", "cage", "srt")
# what ssh takes as a destination: no option (a leading '-'), no space or control character
_TARGET_RE = re.compile(r"[^\s\x00-\x1f\x7f-][^\s\x00-\x1f\x7f]{0,252}")


@dataclass(frozen=True)
class HostConfig:
    """One host workers can run on. `ssh` and `ray` are None for `local`."""

    name: str
    max_workers: int
    ssh: str | None = None  # the destination as ssh takes it (without the port)
    port: int | None = None
    key_on_host: bool = False
    # a Ray cluster (issue 21): its Jobs address, and what its jobs are given
    ray: str | None = None
    resources: dict[str, float] | None = None
    data_dir: str | None = None
    python: str | None = None
    claude: str | None = None
    key_env: str | None = None
    gateway_host: str | None = None
    # "off": the host's workers run uncaged (None: as the task's settings say); `srt`: a
    # Ray host's srt on its nodes (its package folder or an npm prefix holding it)
    cage: str | None = None
    srt: str | None = None

    @property
    def is_local(self) -> bool:
        return self.ssh is None and self.ray is None

    @property
    def is_ray(self) -> bool:
        return self.ray is not None

    @property
    def target(self) -> str:
        """The target as the user wrote it (host:port when a port is set; a Ray host's
        Jobs address)."""
        if self.ray is not None:
            return self.ray
        if self.ssh is None:
            return LOCAL
        if self.port is None:
            return self.ssh
        host = f"[{self.ssh}]" if ":" in self.ssh else self.ssh
        return f"{host}:{self.port}"

    def ssh_args(self) -> list[str]:
        """ssh's arguments for this host's destination: `-p PORT` (when set), then the
        destination (never an option: a target starting with '-' is refused)."""
        assert self.ssh is not None, "the local host has no ssh destination"
        return [*(["-p", str(self.port)] if self.port is not None else []), "--", self.ssh]


def local_host(settings: object, own_cap: int | None = None) -> HostConfig:
    """This machine. Its cap: `own_cap` ([hosts.local] max_workers), else the fleet's: the
    sum of the endpoints' caps (the top-level max_workers with one endpoint)."""
    if own_cap is not None:
        return HostConfig(LOCAL, own_cap)
    named = getattr(settings, "endpoints", ())
    cap = sum(e.max_workers for e in named) if named else getattr(settings, "max_workers", 4)
    return HostConfig(LOCAL, int(cap))


def parse_target(raw: str, where: str = "host") -> tuple[str, int | None]:
    """(destination, port) from a target as ssh takes it: `alias`, `user@host`,
    `host:port`, `[v6addr]:port`; a bare IPv6 address keeps its colons. ConfigError
    naming what is accepted otherwise."""
    text = raw.strip() if isinstance(raw, str) else ""
    if not text or not _TARGET_RE.fullmatch(text):
        raise ConfigError(f"{where}: ssh: {raw!r} is not an ssh target (an alias of "
                          "~/.ssh/config, user@host or host:port; no spaces, not starting "
                          "with '-')", key="ssh")
    match = re.fullmatch(r"(.*)\[([0-9A-Fa-f:.%]+)\](?::(\d+))?", text)
    if match:
        user, addr, port = match.groups()
        return f"{user}{addr}", _port(port, where) if port else None
    if text.count(":") == 1:
        dest, _, port = text.partition(":")
        if not dest:
            raise ConfigError(f"{where}: ssh: {raw!r} has no host before the port", key="ssh")
        return dest, _port(port, where)
    return text, None


def _port(raw: object, where: str) -> int:
    value: object = raw
    if isinstance(raw, str):
        value = int(raw) if raw.isdigit() else raw
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ConfigError(f"{where}: port: expected a port number 1-65535, got {raw!r}",
                          key="port")
    return value


def _cap(cap: object, where: str) -> int:
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ConfigError(f"{where}: max_workers: expected a whole number >= 1, got {cap!r}",
                          key="max_workers")
    return cap


def check_name(name: str, where: str) -> None:
    if name == ANY:
        raise ConfigError(f"{where}: 'any' is not a host: `--host any` means the host with a "
                          "free slot; give this host another name", key=name)
    if not NAME_RE.fullmatch(name):
        raise ConfigError(f"{where}: a host's name is letters, digits, '-', '_' or '.' (at "
                          "most 40), starting with a letter or digit", key=name)


def host_from_table(name: str, table: object, where: str, default_cap: int) -> HostConfig:
    """One `[hosts.NAME]` table, checked (ConfigError saying what is accepted)."""
    check_name(name, where)
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table of settings ({', '.join(FIELDS)})")
    if name == LOCAL:
        if set(table) != {"max_workers"}:
            raise ConfigError(f"{where}: 'local' is this machine, always a host: its table "
                              "takes max_workers alone (give an ssh host another name)",
                              key=name)
        return HostConfig(LOCAL, _cap(table["max_workers"], where))
    if "ray" in table:
        return ray_host_from_table(name, table, where, default_cap)
    unknown = sorted(set(table) - set(FIELDS))
    if unknown:
        raise ConfigError(f"{where}: unknown setting {unknown[0]!r}; a host takes "
                          + ", ".join(FIELDS), key=unknown[0])
    if "ssh" not in table:
        raise ConfigError(f"{where}: ssh is missing (the target as ssh takes it: an alias, "
                          "user@host or host:port)", key="ssh")
    raw = table["ssh"]
    if not isinstance(raw, str):
        raise ConfigError(f"{where}: ssh: expected a string, got {raw!r}", key="ssh")
    try:
        check_length(raw)
    except ValueError as exc:
        raise ConfigError(f"{where}: ssh: {exc}", key="ssh") from None
    dest, port = parse_target(raw, where)
    if "port" in table:
        given = _port(table["port"], where)
        if port is not None and port != given:
            raise ConfigError(f"{where}: the target {raw!r} says port {port} and port says "
                              f"{given}; keep one", key="port")
        port = given
    cap = _cap(table.get("max_workers", default_cap), where)
    key_on_host = table.get("key_on_host", False)
    if not isinstance(key_on_host, bool):
        raise ConfigError(f"{where}: key_on_host: expected true or false, got "
                          f"{key_on_host!r}", key="key_on_host")
    return HostConfig(name, cap, dest, port, key_on_host, cage=_cage(table, where))


def _cage(table: dict[str, object], where: str) -> str | None:
    value = table.get("cage")
    if value is not None and value not in ("worker", "off"):
        raise ConfigError(f"{where}: cage: expected \"worker\" (its workers in the cage, as "
                          f"the tasks' settings say) or \"off\" (uncaged), got {value!r}",
                          key="cage")
    return value if isinstance(value, str) else None


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


def ray_host_from_table(name: str, table: dict[str, object], where: str,
                        default_cap: int) -> HostConfig:
    unknown = sorted(set(table) - set(RAY_FIELDS))
    if unknown:
        raise ConfigError(f"{where}: unknown setting {unknown[0]!r}; a Ray host takes "
                          + ", ".join(RAY_FIELDS), key=unknown[0])
    address = parse_ray_address(table["ray"], where)
    resources = parse_resources(table["resources"], where) if "resources" in table else None
    texts: dict[str, str | None] = {}
    for key in ("data_dir", "python", "claude", "key_env", "gateway_host", "srt"):
        value = table.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()
                                  or any(c in value for c in "\n\r\x00")):
            raise ConfigError(f"{where}: {key}: expected a non-empty string, got {value!r}",
                              key=key)
        texts[key] = value
    if texts["data_dir"] is not None and not texts["data_dir"].startswith("/"):
        raise ConfigError(f"{where}: data_dir: expected an absolute path on the nodes, got "
                          f"{texts['data_dir']!r}", key="data_dir")
    if texts["key_env"] is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*",
                                                         texts["key_env"]):
        raise ConfigError(f"{where}: key_env: expected the name of an environment variable, "
                          f"got {texts['key_env']!r}", key="key_env")
    cap = _cap(table.get("max_workers", default_cap), where)
    return HostConfig(name, cap, ray=address, resources=resources,
                      data_dir=texts["data_dir"], python=texts["python"],
                      claude=texts["claude"], key_env=texts["key_env"],
                      gateway_host=texts["gateway_host"], cage=_cage(table, where),
                      srt=texts["srt"])


def read_hosts(config_file: str, settings: object) -> tuple[HostConfig, ...]:
    """Every `[hosts.NAME]` of config.toml in file order (`[hosts.local]`: this machine's
    own cap). ConfigError (the file, the table, what is accepted) for a bad table or
    value. `Settings.all_hosts` puts `local` first."""
    data, _text = _read_toml(config_file)
    tables = data.get(TABLE)
    if tables is None:
        return ()
    if not isinstance(tables, dict):
        raise ConfigError(f"{config_file}: {TABLE} must be tables: [{TABLE}.NAME] with "
                          + ", ".join(FIELDS), path=config_file, key=TABLE)
    found = []
    for name, table in tables.items():
        where = f"{config_file}: [{TABLE}.{name}]"
        try:
            found.append(host_from_table(name, table, where,
                                         int(getattr(settings, "max_workers", 4))))
        except ConfigError as exc:
            exc.path = config_file
            raise
    return tuple(found)


def find(hosts: tuple[HostConfig, ...], name: str | None) -> HostConfig:
    """The host of that name (None: local); ConfigError naming the known ones."""
    wanted = name or LOCAL
    for host in hosts:
        if host.name == wanted:
            return host
    if wanted == LOCAL:
        return HostConfig(LOCAL, 4)
    known = ", ".join(h.name for h in hosts) or LOCAL
    raise ConfigError(f"unknown host {wanted!r}; the hosts are: {known} (add it with "
                      f"`fleet-tui host add {wanted} TARGET`)", key="host")


def to_data(hosts: tuple[HostConfig, ...]) -> list[dict[str, object]]:
    """The hosts as JSON-ready data (a detached process's spec carries them)."""
    return [dict(vars(h)) for h in hosts]


def from_data(data: object) -> tuple[HostConfig, ...]:
    """Back from `to_data` (anything else: none)."""
    if not isinstance(data, list):
        return ()
    return tuple(HostConfig(**item) for item in data if isinstance(item, dict))


# --- writing config.toml: one table added or cut, every other byte kept ----------------------

_HEADER_RE = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")


def _header_name(line: str) -> list[str] | None:
    """The dotted key of a `[table]` header line (quotes taken off), else None."""
    match = _HEADER_RE.match(line)
    if not match or line.lstrip().startswith("[["):
        return None
    parts = [p.strip().strip("\"'") for p in match.group(1).split(".")]
    return parts


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_value(value: object) -> str:
    if isinstance(value, dict):
        inner = ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + inner + " }"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (int, float)):
        return repr(value)
    return _quoted(str(value))


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _quoted(key)


def host_table(host: HostConfig) -> str:
    """The `[hosts.NAME]` table of `host`, as `host add` writes it."""
    if host.ray is not None:
        lines = [f"[{TABLE}.{host.name}]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in _as_data(host).items()]
        return "\n".join(lines) + "\n"
    assert host.ssh is not None
    lines = [f"[{TABLE}.{host.name}]", f"ssh = {_quoted(host.target)}",
             f"max_workers = {host.max_workers}"]
    if host.key_on_host:
        lines.append("key_on_host = true")
    return "\n".join(lines) + "\n"


def add_host(config_file: Path, host: HostConfig) -> None:
    """Append `host`'s table to config.toml (made when missing). ConfigError when the name
    is taken or the file does not read; nothing written then."""
    data, text = _read_toml(str(config_file))
    tables = data.get(TABLE)
    if isinstance(tables, dict) and host.name in tables:
        raise ConfigError(f"{config_file}: the host {host.name!r} is there already; "
                          f"`fleet-tui host rm {host.name}` first, or edit its table",
                          path=config_file, key=host.name)
    if tables is not None and not isinstance(tables, dict):
        raise ConfigError(f"{config_file}: {TABLE} is not a table of [{TABLE}.NAME] tables; "
                          "fix it by hand first", path=config_file, key=TABLE)
    new = (text.rstrip("\n") + "\n\n" if text.strip() else "") + host_table(host)
    expected = dict(data)
    expected[TABLE] = {**(tables or {}), host.name: _as_data(host)}
    _write_checked(config_file, new, expected)


def remove_host(config_file: Path, name: str) -> None:
    """Cut the `[hosts.NAME]` table out of config.toml. ConfigError when there is none, or
    when it is written in a form this writer does not cut (an inline table)."""
    data, text = _read_toml(str(config_file))
    tables = data.get(TABLE)
    if not isinstance(tables, dict) or name not in tables:
        raise ConfigError(f"{config_file}: no host {name!r} in it", path=config_file, key=name)
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines)
                  if _header_name(line) == [TABLE, name]), None)
    if start is None:
        raise ConfigError(f"{config_file}: the host {name!r} is not written as a "
                          f"[{TABLE}.{name}] table; remove it by hand", path=config_file,
                          key=name)
    end = next((i for i in range(start + 1, len(lines))
                if _header_name(lines[i]) is not None or lines[i].lstrip().startswith("[[")),
               len(lines))
    # comments and blank lines just above the next table are that table's
    while end - 1 > start and (not lines[end - 1].strip()
                               or lines[end - 1].lstrip().startswith("#")):
        end -= 1
    before = lines[:start]
    while before and not before[-1].strip():
        before.pop()
    rest = lines[end:]
    while rest and not rest[0].strip():
        rest.pop(0)
    new = "".join(before) + ("\n" if before and rest else "") + "".join(rest)
    expected = dict(data)
    left = {k: v for k, v in tables.items() if k != name}
    if left:
        expected[TABLE] = left
    else:
        expected.pop(TABLE, None)
    _write_checked(config_file, new, expected)


def _as_data(host: HostConfig) -> dict[str, object]:
    if host.ray is not None:
        ray: dict[str, object] = {"ray": host.ray}
        if host.resources:
            ray["resources"] = {k: int(v) if float(v).is_integer() else v
                                for k, v in host.resources.items()}
        ray["max_workers"] = host.max_workers
        for key in ("data_dir", "python", "claude", "key_env", "gateway_host"):
            if getattr(host, key) is not None:
                ray[key] = getattr(host, key)
        return ray
    out: dict[str, object] = {"ssh": host.target, "max_workers": host.max_workers}
    if host.key_on_host:
        out["key_on_host"] = True
    return out


def _write_checked(config_file: Path, new: str, expected: dict[str, object]) -> None:
    """Write `new` atomically, only if it reads as `expected` (the mode of the old file
    kept; a new file private to the user)."""
    import tomllib

    try:
        parsed = tomllib.loads(new)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{config_file}: the edit would not read back ({exc}); "
                          "nothing written", path=config_file) from None
    if _plain(parsed) != _plain(expected):
        raise ConfigError(f"{config_file}: the edit would change more than the one host "
                          "table; nothing written (edit the file by hand)", path=config_file)
    config_file.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = config_file.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o600
    fd, tmp = tempfile.mkstemp(prefix=".config.", suffix=".toml", dir=config_file.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(new)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, config_file)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _plain(value: object) -> object:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


__all__ = ["ANY", "LOCAL", "HostConfig", "add_host", "find", "from_data", "host_from_table",
           "host_table", "local_host", "parse_ray_address", "parse_resources", "parse_target",
           "read_hosts", "remove_host", "to_data"]
