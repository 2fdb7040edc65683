"""Hosts: `[hosts.NAME]` tables of config.toml, where workers may run.

    [hosts.box]
    ssh = "box"                 # an ssh host (execution/ssh/config.py: its fields)
    max_workers = 8             # workers at once on that host (default: the top-level cap)

    [hosts.cluster]
    ray = "http://head:8265"    # a Ray cluster (execution/ray/config.py: its fields)

This module reads what every host has (its name, `max_workers`) and hands the rest of a
table to its kind (settings/kinds.py: the table names the kind by its mark, `ssh = ...`,
`ray = ...`): a `HostConfig` is the common part and the kind's own options.

`local` (this machine) is always a host. Its cap is the fleet's (the sum of the endpoints'
caps: the top-level `max_workers` with one endpoint), so that hosts change nothing for a
fleet that has none; `[hosts.local]` with `max_workers` alone bounds this machine below it
(then a remote host's workers add to the endpoints' caps, not to this machine's). `any` is
not a host: `run --host any` places a task on the host with a free slot. Nothing here
opens a connection: the host's code is chosen by `execution.hosts`.

The writer (`add_host`, `remove_host`) keeps the user's file: it appends or cuts one
`[hosts.NAME]` table as text, keeps every other byte, and writes only when the new file
reads back as the old one with exactly that table added or removed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_tui.settings import kinds
from fleet_tui.settings.config_core import ConfigError, _read_toml

LOCAL = "local"
ANY = "any"
TABLE = "hosts"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")


@dataclass(frozen=True)
class HostConfig:
    """One host workers can run on: what every host has, and its kind's own options (a
    frozen record of the kind's config.py; None for `local`)."""

    name: str
    max_workers: int
    kind: str = LOCAL
    options: Any = None

    @property
    def is_local(self) -> bool:
        """This machine."""
        return self.kind == LOCAL

    @property
    def label(self) -> str:
        """The kind's name in messages ("ssh", "Ray")."""
        return kinds.schema(self.kind).label

    @property
    def target(self) -> str:
        """Where the host is, as the user wrote it (`local` for this machine)."""
        return kinds.schema(self.kind).target(self)


def local_host(settings: object, own_cap: int | None = None) -> HostConfig:
    """This machine. Its cap: `own_cap` ([hosts.local] max_workers), else the fleet's: the
    sum of the endpoints' caps (the top-level max_workers with one endpoint)."""
    if own_cap is not None:
        return HostConfig(LOCAL, own_cap)
    named = getattr(settings, "endpoints", ())
    cap = sum(e.max_workers for e in named) if named else getattr(settings, "max_workers", 4)
    return HostConfig(LOCAL, int(cap))


def cap_of(cap: object, where: str) -> int:
    """A host's `max_workers` (ConfigError saying what is accepted)."""
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ConfigError(f"{where}: max_workers: expected a whole number >= 1, got {cap!r}",
                          key="max_workers")
    return cap


def unknown_fields(table: dict[str, Any], fields: tuple[str, ...], where: str,
                   what: str = "a host") -> None:
    """ConfigError for the first setting of `table` that is not one of `fields`."""
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown setting {unknown[0]!r}; {what} takes "
                          + ", ".join(fields), key=unknown[0])


def cage_of(table: dict[str, Any], where: str) -> str | None:
    """A remote host's `cage` setting: "worker" (its workers caged, as the tasks' settings
    say), "off" (uncaged there) or None (not set: as the tasks' settings say)."""
    value = table.get("cage")
    if value is not None and value not in ("worker", "off"):
        raise ConfigError(f"{where}: cage: expected \"worker\" (its workers in the cage, as "
                          f"the tasks' settings say) or \"off\" (uncaged), got {value!r}",
                          key="cage")
    return value if isinstance(value, str) else None


def check_name(name: str, where: str) -> None:
    if name == ANY:
        raise ConfigError(f"{where}: 'any' is not a host: `--host any` means the host with a "
                          "free slot; give this host another name", key=name)
    if not NAME_RE.fullmatch(name):
        raise ConfigError(f"{where}: a host's name is letters, digits, '-', '_' or '.' (at "
                          "most 40), starting with a letter or digit", key=name)


def host_from_table(name: str, table: object, where: str, default_cap: int) -> HostConfig:
    """One `[hosts.NAME]` table, checked (ConfigError saying what is accepted): `local`'s
    by the local kind, any other by the kind its mark names (none: the first kind's, whose
    parser says what is missing)."""
    check_name(name, where)
    kinds_marked = kinds.marked()
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table of settings ("
                          + "; ".join(", ".join(s.fields) for _k, s in kinds_marked) + ")")
    if name == LOCAL:
        return kinds.schema(LOCAL).parse(name, table, where, default_cap)
    chosen = next((s for _k, s in kinds_marked if s.mark in table), kinds_marked[0][1])
    return chosen.parse(name, table, where, default_cap)


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
                          + "; ".join(", ".join(s.fields) for _k, s in kinds.marked()),
                          path=config_file, key=TABLE)
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
    """The hosts as JSON-ready data (a detached process's spec carries them): each its
    name, kind and table."""
    return [{"name": h.name, "kind": h.kind, "table": as_table(h)} for h in hosts]


def from_data(data: object) -> tuple[HostConfig, ...]:
    """Back from `to_data` (anything else: none), each table read by its kind again."""
    if not isinstance(data, list):
        return ()
    out = []
    for item in data:
        if isinstance(item, dict) and isinstance(item.get("table"), dict):
            name, table = str(item.get("name")), item["table"]
            schema = kinds.schema(str(item.get("kind")))
            out.append(schema.parse(name, table, f"host {name}",
                                    int(table.get("max_workers", 4))))
    return tuple(out)


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
    lines = [f"[{TABLE}.{host.name}]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in as_table(host).items()]
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
    expected[TABLE] = {**(tables or {}), host.name: as_table(host)}
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


def as_table(host: HostConfig) -> dict[str, object]:
    """The host's table as config.toml holds it (its kind writes it)."""
    return kinds.schema(host.kind).table(host)


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
    import tempfile  # here: `host add` and `rm` alone write the file

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


__all__ = ["ANY", "LOCAL", "HostConfig", "add_host", "as_table", "cage_of", "cap_of",
           "check_name", "find", "from_data", "host_from_table", "host_table", "local_host",
           "read_hosts", "remove_host", "to_data", "unknown_fields"]
