"""The ray kind's options of `fleet-tui host add` and its columns of `host ls`."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from fleet_tui.execution.ray.config import options
from fleet_tui.settings.config_core import ConfigError

if TYPE_CHECKING:
    from fleet_tui.settings.hosts import HostConfig


class RayOptions:
    flag = "--ray"
    how = "--ray ADDRESS"

    def add_arguments(self, add: argparse.ArgumentParser) -> None:
        add.add_argument("--ray", metavar="ADDRESS",
                         help="a Ray cluster's Jobs address (e.g. http://head:8265): each "
                              "attempt a Ray job (needs pip install 'fleet-tui[ray]')")
        add.add_argument("--resources", metavar="JSON",
                         help='with --ray: the resources each job asks for, e.g. '
                              '\'{"gpu_box": 1}\' (its node)')

    def picks(self, args: argparse.Namespace) -> bool:
        return args.ray is not None

    def refuse_stray(self, args: argparse.Namespace, flag: str | None, label: str) -> None:
        if args.resources is not None:
            raise ConfigError("--resources is for a Ray host (with --ray ADDRESS)")

    def table(self, args: argparse.Namespace) -> dict[str, object]:
        table: dict[str, object] = {"ray": args.ray}
        if args.resources is not None:
            try:
                table["resources"] = json.loads(args.resources)
            except ValueError as exc:
                raise ConfigError(f"host add: --resources: not JSON ({exc}); e.g. "
                                  '\'{"gpu_box": 1}\'', key="resources") from None
        return table

    def added(self, host: HostConfig) -> str:
        own = options(host)
        asked = (", resources " + ", ".join(f"{k}={v:g}" for k, v in own.resources.items())
                 if own.resources else "")
        return f"Ray cluster {own.ray}{asked}, max_workers {host.max_workers}"

    def blank_row(self) -> dict[str, object]:
        return {"ray": None, "resources": None, "key_env": None}

    def row(self, host: HostConfig) -> dict[str, object]:
        own = options(host)
        return {"ray": own.ray, "resources": own.resources, "key_env": own.key_env}

    def key_shown(self, host: HostConfig) -> str:
        key_env = options(host).key_env
        return f"${key_env} there" if key_env else "here"


OPTIONS = RayOptions()
