"""What the panel mends in the pinned Textual (fleet_tui/ui/textual_fixes.py), and why it
matters to a key press: frames leave no cyclic garbage for the collector, so its
full collections stay short. The real store and engine; no claude."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.segment import Segment
from test_ui_repaint import app_for, filled
from test_ui_support import wait_for_screen, wait_until
from textual.strip import Strip

from fleet_tui.ui import textual_fixes
from fleet_tui.ui.screens.help import HelpScreen
from fleet_tui.ui.widgets.task_table import TaskTable


@pytest.fixture
def saved_garbage() -> Iterator[list[Any]]:
    """What the cyclic collector finds from here on is kept (gc.garbage), not freed."""
    gc.collect()
    gc.garbage.clear()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def cyclic_strips(garbage: list[Any]) -> int:
    gc.collect()
    return sum(1 for thing in garbage if type(thing) is Strip)


def test_a_strip_divided_at_its_end_is_freed_by_its_count(saved_garbage: list[Any]) -> None:
    textual_fixes.apply()
    strip = Strip([Segment("abc"), Segment("def")])
    assert strip.divide([6]) == [strip]  # the answer Textual gives
    assert [s.text for s in strip.divide([2, 6])] == ["ab", "cdef"]  # cut: Textual's own
    del strip
    assert cyclic_strips(saved_garbage) == 0


async def test_the_help_opened_and_closed_leaves_no_strip_to_the_collector(
        tmp_path: Path, saved_garbage: list[Any]) -> None:
    """Each full frame divided every line at its end; unmended, the help opened and closed
    five times left ~650 strips in cycles (each with its seven caches)."""
    store, repo = filled(tmp_path)
    app = app_for(store, repo)
    async with app.run_test(size=(140, 40)) as pilot:
        table = app.main.query_one(TaskTable)
        await wait_until(pilot, lambda: table.row_count == 30, what="the list")
        await pilot.press("question_mark")  # the help's first build: not counted
        await wait_for_screen(pilot, HelpScreen)
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.screen is app.main, what="the main screen")
        gc.collect()
        saved_garbage.clear()
        for _ in range(5):
            await pilot.press("question_mark")
            await wait_for_screen(pilot, HelpScreen)
            await pilot.pause()
            await pilot.press("escape")
            await wait_until(pilot, lambda: app.screen is app.main, what="the main screen")
            await pilot.pause()
        assert cyclic_strips(saved_garbage) == 0
