"""The local kind has no options of `fleet-tui host add` (it is not added:
this machine is always a host) and no columns of its own in `host ls`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleet_tui.settings.hosts import HostConfig


class NoOptions:
    flag = None
    how = ""

    def add_arguments(self, add: argparse.ArgumentParser) -> None:
        return None

    def picks(self, args: argparse.Namespace) -> bool:
        return False

    def refuse_stray(self, args: argparse.Namespace, flag: str | None, label: str) -> None:
        return None

    def table(self, args: argparse.Namespace) -> dict[str, object]:
        return {}

    def added(self, host: HostConfig) -> str:
        return f"max_workers {host.max_workers}"

    def blank_row(self) -> dict[str, object]:
        return {}

    def row(self, host: HostConfig) -> dict[str, object]:
        return {}

    def key_shown(self, host: HostConfig) -> str:
        return "-"


OPTIONS = NoOptions()
