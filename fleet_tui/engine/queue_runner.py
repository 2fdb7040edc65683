"""A repository's merge queue runner: `python -m fleet_tui.engine.queue_runner SPEC`.

A detached process (`MergeQueue.spawn_runner` starts it), so the queue goes on when the
panel or the CLI that started it is closed. The spec names the repository, the store and
the settings (no secret). It builds an engine of its own (it ticks it while a worker of
the queue runs a fix) and works the queue (`landing.LandingQueue`) until it is empty, or
exits at once when another process runs it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from fleet_tui.core.errors import FleetTuiError
from fleet_tui.engine.fleet import Fleet
from fleet_tui.engine.landing import LandingQueue, log
from fleet_tui.settings import endpoints, hosts
from fleet_tui.settings.config import Settings
from fleet_tui.store.db import Store

__all__ = ["main", "read_spec"]


def read_spec(path: Path) -> tuple[dict[str, Any], Settings, Store]:
    """A detached runner's spec (the merge queue's, a rank runner's): the spec, the
    engine's settings it names and its store."""
    spec = json.loads(path.read_text(encoding="utf-8"))
    settings = Settings(**{**spec["settings"],
                           "config_dir": Path(spec["settings"]["config_dir"]),
                           "key_sources": tuple(spec["settings"]["key_sources"]),
                           "endpoints": endpoints.from_data(spec["settings"].get("endpoints")),
                           "hosts": hosts.from_data(spec["settings"].get("hosts"))})
    return spec, settings, Store(Path(spec["db"]))


def main(argv: list[str] | None = None) -> int:
    """`python -m fleet_tui.engine.queue_runner SPEC`: run a repository's merge queue until
    it is empty (exit 0), or exit at once when another process runs it (exit 0 as well)."""
    parser = argparse.ArgumentParser(prog="fleet_tui.engine.queue_runner")
    parser.add_argument("spec", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s queue[{os.getpid()}] %(levelname)s %(message)s")
    try:
        spec, settings, store = read_spec(args.spec)
    except (OSError, ValueError, KeyError, TypeError, FleetTuiError) as exc:
        log.error("cannot read the queue spec %s: %s", args.spec, exc)
        return 2
    fleet = Fleet(settings, store)
    fleet.spawn_queue_runners = False
    queue = LandingQueue(fleet, Path(spec["repo"]))
    if not queue.run():
        log.info("another process runs the merge queue of %s", queue.repo)
        return 0
    log.info("the merge queue of %s is empty", queue.repo)
    return 0


if __name__ == "__main__":  # pragma: no cover - the detached runner
    from fleet_tui.system.leave import leave

    leave(main())
