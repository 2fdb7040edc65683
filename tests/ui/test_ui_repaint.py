"""What the panel sends to its terminal when little changes (a browser, or a
terminal over ssh, receives every repainted cell): a screen over the main one (the help)
is not repainted by the main screen's polls. The real store and engine; no claude."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_long_list import NOW, make_repo
from test_ui_support import wait_for_screen, wait_until

from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store, TaskState
from fleet_tui.ui.app import FleetApp
from fleet_tui.ui.screens.help import HelpScreen
from fleet_tui.ui.widgets.task_table import TaskTable


def filled(tmp_path: Path, count: int = 30) -> tuple[Store, Path]:
    repo = make_repo(tmp_path / "shop")
    store = Store(tmp_path / "fleet.db")
    for i in range(count):
        store.create_task(task_id=f"t{i:03d}", prompt=f"task {i}", repo=repo,
                          title=f"task number {i:03d}", state=TaskState.SUCCEEDED,
                          base_branch="main", base_commit="0" * 40, endpoint="default",
                          now=NOW - 1000 + i, started_at=NOW - 1000 + i,
                          finished_at=NOW - 500 + i)
    return store, repo


def app_for(store: Store, repo: Path) -> FleetApp:
    return FleetApp(Fleet(load_settings(), store, clock=lambda: NOW), repo=repo,
                    default_base="main", clock=lambda: NOW, run_scheduler=False,
                    bell=False, poll_interval=0.1, diff_interval=60)


class Polls:
    """Counts the main screen's list reads as they land."""

    def __init__(self, app: FleetApp) -> None:
        self.count = 0
        controller = app.main.task_list
        original = controller.tasks_loaded

        def counted(message: Any) -> None:
            original(message)
            self.count += 1

        controller.tasks_loaded = counted  # type: ignore[method-assign]

    async def wait(self, pilot: Any, more: int) -> None:
        goal = self.count + more
        await wait_until(pilot, lambda: self.count >= goal, what=f"{more} more polls")


async def test_the_main_screens_polls_do_not_repaint_the_help_over_it(tmp_path: Path
                                                                      ) -> None:
    store, repo = filled(tmp_path)
    app = app_for(store, repo)
    async with app.run_test(size=(140, 40)) as pilot:
        table = app.main.query_one(TaskTable)
        await wait_until(pilot, lambda: table.row_count == 30, what="the list")
        polls = Polls(app)
        frames: list[str] = []
        display = app._display

        def recorded(screen: Any, renderable: Any) -> None:
            if renderable is not None:
                frames.append(type(screen).__name__)
            display(screen, renderable)

        app._display = recorded  # type: ignore[method-assign]
        await pilot.press("question_mark")
        await wait_for_screen(pilot, HelpScreen)
        await wait_until(pilot, lambda: "HelpScreen" in frames, what="the help's frame")
        await polls.wait(pilot, 2)
        frames.clear()
        # the main screen below changes (a poll brings a task's new turns) and repaints
        # its line there; the help over it paints every cell, so nothing is sent
        for turns in (3, 4, 5):
            store.update_task("t002", turns=turns)
            await wait_until(pilot, lambda t=turns: app.main.task_list.tasks["t002"].turns == t,
                             what="the change under the help")
            await polls.wait(pilot, 1)
        assert frames == []
        # closed, the main screen shows what changed meanwhile
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.screen is app.main, what="the main screen")
        await wait_until(pilot, lambda: "MainScreen" in frames, what="the main's frame")
        assert "5" in [str(cell).strip() for cell in table.get_row("t002")]
        line = table.keys.index("t002") + 1 - int(table.scroll_y)
        assert "task number 002" in table.render_line(line).text
