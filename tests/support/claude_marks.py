"""Keeps the `real_claude` mark true (conftest.py installs these two hooks).

A test runs the real claude exactly when it asks for the `claude_bin` fixture, directly or
through another fixture: that fixture is the suite's only way to the binary (run the suite
with the binary hidden and every other test still passes). So:

- every test that asks for `claude_bin` gets the mark, written or not (`-m real_claude`
  and `-m "not real_claude"` select on it);
- a test that carries the mark (its own, its class's or its module's `pytestmark`) but
  never asks for `claude_bin` fails, saying so: it does not run claude, and marking it
  would hide it from a run without claude, or slow a run that wants only claude.
"""

from __future__ import annotations

import pytest

CLAUDE_FIXTURE = "claude_bin"
MARK = "real_claude"


def _asks_for_claude(item: pytest.Item) -> bool:
    return CLAUDE_FIXTURE in getattr(item, "fixturenames", ())


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects on the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _asks_for_claude(item) and item.get_closest_marker(MARK) is None:
            item.add_marker(MARK)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker(MARK) is not None and not _asks_for_claude(item):
        pytest.fail(f"{item.nodeid} is marked {MARK} but never asks for the "
                    f"{CLAUDE_FIXTURE} fixture, so it does not run claude: remove the mark "
                    "(from its module's pytestmark too) or take claude from the fixture",
                    pytrace=False)
