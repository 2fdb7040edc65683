"""The order pytest-xdist hands tests out in: the tests marked `long` early, spread out.

pytest-xdist (--dist loadgroup) sends the xdist_groups first, largest first, then the other
tests in collection order, each to the next worker that has room. A test of 25-65 s of
wall (mostly waiting on a timeout, a cluster or a fresh venv) collected late ran on while
the other workers had finished: a pass's last ~50 s ran at ~1.3 of 2 cores. All of them
first left the cores part idle at the start instead (~1.75 of 2 over its first 3 minutes,
several workers waiting at once), so one goes out every SPACING tests: at ~3 tests a
second handed out, one every ~13 s, ~3 of them at a time. tests/conftest.py calls this
from its pytest_collection_modifyitems."""

from __future__ import annotations

import pytest

SPACING = 40


def long_early(items: list[pytest.Item], spacing: int = SPACING) -> None:
    """Puts the tests marked `long` at the front, one every `spacing` tests, each kind
    keeping its order."""
    long = [item for item in items if item.get_closest_marker("long") is not None]
    rest = [item for item in items if item.get_closest_marker("long") is None]
    ordered: list[pytest.Item] = []
    for n, item in enumerate(long):
        ordered.append(item)
        ordered.extend(rest[n * (spacing - 1):(n + 1) * (spacing - 1)])
    ordered.extend(rest[len(long) * (spacing - 1):])
    items[:] = ordered
