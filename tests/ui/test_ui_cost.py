"""The panel and the meter: a cost column in the task list once a listed task has
metered requests, its figure the rows' sum; today's spend per endpoint in the status line;
a day's budget met is one notification and a hold with the figure in the status line.

No claude: the meter's rows are written as the gateway writes them (Meter.record, the cost
from budgets.request_cost) into a real store; the engine's pass that holds the endpoint
runs in a thread beside the panel (the in-memory host: nothing is started).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from test_ui_marks import SIZE, listed, make_app, submit
from test_ui_support import wait_until

from fleet_tui.engine.fleet import Fleet
from fleet_tui.execution.memory import MemoryHost
from fleet_tui.settings.config import load_settings
from fleet_tui.store import budgets
from fleet_tui.store.db import Store
from fleet_tui.store.meter import Meter, Usage
from fleet_tui.system import paths
from fleet_tui.ui.widgets.status_line import StatusLine
from fleet_tui.ui.widgets.task_table import TaskTable


def status_text(app: Any) -> str:
    return str(app.main.query_one(StatusLine).render())


def spend(fleet: Fleet, task_id: str, endpoint: str, **tokens: int) -> float:
    cost = budgets.request_cost(fleet.settings, endpoint, "GLM-5.2", **tokens)
    assert cost is not None
    Meter(fleet.store).record(Usage(time.time(), task_id, None, endpoint, "GLM-5.2", 200,
                                    tokens.get("input_tokens", 0),
                                    tokens.get("output_tokens", 0), 0, 0, cost))
    return cost


def cost_cell(table: TaskTable, task_id: str) -> str:
    columns = [c[0] for c in table._columns()]
    return table.get_row(task_id)[columns.index("cost")].plain


async def test_the_cost_column_the_days_spend_and_a_budget_met_once(
        git_repo: Path, tmp_path: Path) -> None:
    settings = load_settings(env=os.environ, overrides={"budget_per_day": 1.0,
                                                        "key_sources": "env"})
    fleet = Fleet(settings, Store(paths.db_path()), host=MemoryHost(tmp_path / "host"))
    ids = submit(fleet, git_repo, 3)
    endpoint = fleet.get_task(ids[0]).endpoint
    app = make_app(fleet, git_repo)
    async with app.run_test(size=SIZE) as pilot:
        def said() -> list[tuple[str, str]]:
            return [(title, message) for _, title, message in app.toasts]

        table = await listed(pilot, app, ids)
        await pilot.pause(0.3)  # polls: nothing metered, no column, no spend
        assert not table.shows_cost and "today" not in status_text(app)

        first = spend(fleet, ids[0], endpoint, input_tokens=100_000)  # $0.14
        first += spend(fleet, ids[0], endpoint, output_tokens=100_000)  # $0.44
        await wait_until(pilot, lambda: table.shows_cost, what="the cost column")
        assert cost_cell(table, ids[0]) == "$0.58" == budgets.usd(first)
        assert cost_cell(table, ids[1]) == ""
        await wait_until(pilot, lambda: "today default $0.58" in status_text(app),
                         what="today's spend in the status line")

        second = spend(fleet, ids[1], endpoint, input_tokens=500_000)  # $0.70
        await asyncio.to_thread(fleet.tick)  # the engine's pass: $1.28 of $1.00
        figure = f"budget met: {budgets.usd(first + second)} of $1.00 today"
        await wait_until(pilot, lambda: f"held: {figure}" in status_text(app),
                         what="the budget hold in the status line")
        assert cost_cell(table, ids[1]) == "$0.70"
        await asyncio.to_thread(fleet.tick)  # more passes, more polls: said once
        await pilot.pause(0.5)
        assert [title for title, _ in said()] == ["Endpoint budget met"]
        message = said()[0][1]
        assert message.startswith(f"the endpoint default spent {budgets.usd(first + second)}"
                                  " of its $1.00 budget today")
        assert message.endswith("3 tasks held; running tasks go on.")
