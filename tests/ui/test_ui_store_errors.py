"""A store the panel cannot read is said on screen, never shown as an empty fleet.

The damage is real: a row changed with sqlite3 behind the engine's back, and the database
file swapped for one that is not a database while the panel runs. No claude here (the
scheduler is off).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from test_ui_support import wait_until
from textual.widgets import Label

from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import TaskSpec
from fleet_tui.ui.app import FleetApp
from fleet_tui.ui.widgets.task_table import TaskTable

EMPTY = "No tasks yet"


@pytest.fixture
def fleet(git_repo: Path) -> Fleet:
    return Fleet(load_settings())


def make_app(fleet: Fleet, repo: Path) -> FleetApp:
    return FleetApp(fleet, repo=repo, default_base="main", run_scheduler=False, bell=False,
                    poll_interval=0.1, diff_interval=60)


def notice(app: FleetApp) -> str:
    label = app.main.query_one("#list-notice", Label)
    return str(label.render()) if label.display else ""


async def test_a_tampered_row_is_not_an_empty_fleet(fleet: Fleet, git_repo: Path) -> None:
    """Whatever the engine makes of a row it cannot decode, the panel does not say that
    there are no tasks: it lists them, or it says what is wrong."""
    ids = [fleet.submit(TaskSpec(prompt=f"task {i}", repo=git_repo))[0].id for i in range(3)]
    with sqlite3.connect(fleet.store.path) as db:
        db.execute("UPDATE tasks SET state = 'exploded' WHERE id = ?", (ids[1],))
    app = make_app(fleet, git_repo)
    async with app.run_test(size=(120, 36)) as pilot:
        table = app.main.query_one(TaskTable)
        await wait_until(pilot, lambda: bool(notice(app)) or bool(table.keys),
                         what="the list or a notice")
        await pilot.pause(0.5)  # several polls
        assert EMPTY not in notice(app)
        if not set(ids) <= set(table.keys):
            said = notice(app)
            assert said.startswith("Cannot read the task list")
            assert "exploded" in said  # it names the cause


async def test_a_store_that_is_not_a_database_is_said_and_polling_goes_on(
        fleet: Fleet, git_repo: Path, tmp_path: Path) -> None:
    ids = [fleet.submit(TaskSpec(prompt=f"task {i}", repo=git_repo))[0].id for i in range(2)]
    db = fleet.store.path
    backup = tmp_path / "backup.db"
    with sqlite3.connect(db) as src, sqlite3.connect(backup) as dst:
        src.backup(dst)
    app = make_app(fleet, git_repo)
    async with app.run_test(size=(120, 36)) as pilot:
        table = app.main.query_one(TaskTable)
        await wait_until(pilot, lambda: set(ids) <= set(table.keys), what="the tasks")
        assert notice(app) == ""

        # the file is replaced by something else (a bad restore, a stray copy)
        garbage = tmp_path / "garbage"
        garbage.write_bytes(b"this is not an SQLite database\n" * 200)
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        os.replace(garbage, db)
        # nothing else: the store's connections (one per thread; the panel's reads run on
        # pool threads) see that another file is at the path and open it, as a new process
        # would (they once read the unlinked file on, and this test closed them by hand)
        await wait_until(pilot, lambda: "not a database" in notice(app),
                         what=lambda: f"the notice (shown: {notice(app)!r})")
        said = notice(app)
        assert "not a database" in said and str(db) in said
        assert said.endswith(".") and ". " not in said  # one sentence
        assert EMPTY not in said
        assert set(ids) <= set(table.keys)  # the last list read stays, and says so
        assert "last list read" in said

        # put the database back: the next poll reads it, and the notice goes
        os.replace(backup, db)
        await wait_until(pilot, lambda: notice(app) == "", what="the notice to go")
        assert set(ids) <= set(table.keys)


async def test_an_empty_store_still_says_no_tasks_yet(fleet: Fleet, git_repo: Path) -> None:
    app = make_app(fleet, git_repo)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: EMPTY in notice(app), what="the empty hint")
