"""The ssh kind's table:

    [hosts.box]
    ssh = "box"                 # as ssh takes it: an alias of ~/.ssh/config, user@host,
                                # host:port, [v6addr]:port
    port = 2222                 # optional: the port, when the target does not say it
    max_workers = 8             # workers at once on that host (default: the top-level cap)
    key_on_host = false         # true: the key is kept on the host (its own gateway)
    cage = "off"                # optional: its workers run uncaged (else as the tasks say)

The user's own ssh (their config, agent and known-hosts checking) does the connecting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fleet_tui.settings.config_core import ConfigError, check_length
from fleet_tui.settings.hosts import HostConfig, cage_of, cap_of, unknown_fields

KIND = "ssh"
FIELDS = ("ssh", "port", "max_workers", "key_on_host", "cage")
# what ssh takes as a destination: no option (a leading '-'), no space or control character
_TARGET_RE = re.compile(r"[^\s\x00-\x1f\x7f-][^\s\x00-\x1f\x7f]{0,252}")


@dataclass(frozen=True)
class SshOptions:
    ssh: str  # the destination as ssh takes it (without the port)
    port: int | None = None
    key_on_host: bool = False
    cage: str | None = None  # "off": its workers run uncaged (None: as the tasks' settings say)


def options(host: HostConfig) -> SshOptions:
    """The ssh options of an ssh host."""
    assert isinstance(host.options, SshOptions), f"{host.name} is not an ssh host"
    return host.options


def ssh_host(name: str, max_workers: int, ssh: str, port: int | None = None,
             key_on_host: bool = False, cage: str | None = None) -> HostConfig:
    return HostConfig(name, max_workers, KIND, SshOptions(ssh, port, key_on_host, cage))


def ssh_args(host: HostConfig) -> list[str]:
    """ssh's arguments for this host's destination: `-p PORT` (when set), then the
    destination (never an option: a target starting with '-' is refused)."""
    own = options(host)
    return [*(["-p", str(own.port)] if own.port is not None else []), "--", own.ssh]


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


class SshSchema:
    mark = "ssh"
    label = "ssh"
    fields = FIELDS

    def parse(self, name: str, table: dict[str, Any], where: str,
              default_cap: int) -> HostConfig:
        unknown_fields(table, FIELDS, where)
        if "ssh" not in table:
            raise ConfigError(f"{where}: ssh is missing (the target as ssh takes it: an "
                              "alias, user@host or host:port)", key="ssh")
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
                raise ConfigError(f"{where}: the target {raw!r} says port {port} and port "
                                  f"says {given}; keep one", key="port")
            port = given
        cap = cap_of(table.get("max_workers", default_cap), where)
        key_on_host = table.get("key_on_host", False)
        if not isinstance(key_on_host, bool):
            raise ConfigError(f"{where}: key_on_host: expected true or false, got "
                              f"{key_on_host!r}", key="key_on_host")
        return ssh_host(name, cap, dest, port, key_on_host, cage_of(table, where))

    def table(self, host: HostConfig) -> dict[str, object]:
        out: dict[str, object] = {"ssh": self.target(host), "max_workers": host.max_workers}
        if options(host).key_on_host:
            out["key_on_host"] = True
        if options(host).cage is not None:
            out["cage"] = options(host).cage
        return out

    def target(self, host: HostConfig) -> str:
        own = options(host)
        if own.port is None:
            return own.ssh
        where = f"[{own.ssh}]" if ":" in own.ssh else own.ssh
        return f"{where}:{own.port}"


SCHEMA = SshSchema()

__all__ = ["SCHEMA", "SshOptions", "options", "parse_target", "ssh_args", "ssh_host"]
