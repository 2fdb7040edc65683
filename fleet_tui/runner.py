"""The runner's old module name, kept for runners an older fleet-tui started.

Runners are started as `python -m fleet_tui.execution.worker.runner`; before the layers they
were `python -m fleet_tui.runner`, and an engine adopting such a runner (or a queue runner
an older version spawned that starts one) may still run that name. This module forwards to
the runner, nothing else. Remove it once no supported version starts runners by it.
"""

from __future__ import annotations

from fleet_tui.execution.worker.runner import main

__all__ = ["main"]

if __name__ == "__main__":  # pragma: no cover - exercised by tests/project/test_layers.py in a
# child
    raise SystemExit(main())
