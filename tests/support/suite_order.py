"""The order pytest-xdist hands tests out in: the tests marked `long` first.

pytest-xdist (--dist loadgroup) sends the xdist_groups first, largest first, then the other
tests in collection order, each to the next worker that has room. A test of 25-65 s of
wall (mostly waiting on a timeout, a cluster or a fresh venv) collected late ran on while
the other workers had finished: a pass's last ~50 s ran at ~1.3 of 2 cores. tests/conftest.py
calls this from its pytest_collection_modifyitems."""

from __future__ import annotations

import pytest


def long_first(items: list[pytest.Item]) -> None:
    """Moves the tests marked `long` to the front, each group keeping its order."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
