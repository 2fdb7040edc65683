"""The ssh kind's options of `fleet-tui host add` and its columns of `host ls`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from fleet_tui.execution.ssh.config import options
from fleet_tui.settings.config_core import ConfigError

if TYPE_CHECKING:
    from fleet_tui.settings.hosts import HostConfig


class SshOptions:
    flag = None  # picked by its target
    how = "an ssh target (user@host)"

    def add_arguments(self, add: argparse.ArgumentParser) -> None:
        add.add_argument("target", nargs="?", help="as ssh takes it: an alias of "
                         "~/.ssh/config, user@host, host:port (an ssh host)")
        add.add_argument("-p", "--port", type=int, metavar="PORT",
                         help="the ssh port (or write host:port)")
        add.add_argument("--key-on-host", action="store_true",
                         help="keep the key on the host, for workers that must go on while "
                              "this machine is away (default: the key never leaves this "
                              "machine)")

    def picks(self, args: argparse.Namespace) -> bool:
        return args.target is not None

    def refuse_stray(self, args: argparse.Namespace, flag: str | None, label: str) -> None:
        if args.target is not None or args.port is not None or args.key_on_host:
            where = f"host add {flag}" if flag else "host add"
            raise ConfigError(f"{where}: a {label} host has no ssh target, --port or "
                              "--key-on-host")

    def table(self, args: argparse.Namespace) -> dict[str, object]:
        table: dict[str, object] = {"ssh": args.target}
        if args.port is not None:
            table["port"] = args.port
        if args.key_on_host:
            table["key_on_host"] = True
        return table

    def added(self, host: HostConfig) -> str:
        return (f"ssh {host.target}, max_workers {host.max_workers}"
                + (", the key kept on the host" if options(host).key_on_host else ""))

    def blank_row(self) -> dict[str, object]:
        return {"ssh": None, "port": None, "key_on_host": False}

    def row(self, host: HostConfig) -> dict[str, object]:
        own = options(host)
        return {"ssh": own.ssh, "port": own.port, "key_on_host": own.key_on_host}

    def key_shown(self, host: HostConfig) -> str:
        return "on host" if options(host).key_on_host else "here"


OPTIONS = SshOptions()
