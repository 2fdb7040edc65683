"""A group's rank runner: `python -m fleet_tui.engine.rank_runner SPEC`.

A detached process (`Best.spawn_runner` starts it when a pass sees a group's last copy
end), so the copies' evidence is gathered, and with the repository's `auto_pick` the best
copy is landed through the merge queue, when the panel or the CLI that saw the end is
closed. It holds the group's lock while it works: a second runner, or `compare`, waits and
then finds the evidence fresh.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from fleet_tui.core.errors import FleetTuiError
from fleet_tui.engine.context import log
from fleet_tui.engine.fleet import Fleet
from fleet_tui.engine.queue_runner import read_spec

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Gather the evidence of the spec's group and auto_pick when asked (exit 0); 2 when
    the spec does not read."""
    parser = argparse.ArgumentParser(prog="fleet_tui.engine.rank_runner")
    parser.add_argument("spec", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s rank[{os.getpid()}] %(levelname)s %(message)s")
    try:
        spec, settings, store = read_spec(args.spec)
        task_id = str(spec["task"])
    except (OSError, ValueError, KeyError, TypeError, FleetTuiError) as exc:
        log.error("cannot read the rank spec %s: %s", args.spec, exc)
        return 2
    fleet = Fleet(settings, store)
    try:
        fleet.best.gather(task_id)
        pick = fleet.best.auto_pick(task_id)
    except FleetTuiError as exc:
        log.error("ranking the copies of %s: %s", task_id, exc)
        return 1
    if pick is not None:
        log.info("auto_pick: %s (%s)", pick.task_id or "none", pick.reason)
    return 0


if __name__ == "__main__":  # pragma: no cover - the detached runner
    from fleet_tui.system.leave import leave

    leave(main())
