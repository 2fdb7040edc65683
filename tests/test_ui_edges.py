"""The panel at its edges (issue 17, findings 4, 12 and the form error of 8): the merge
queue view of an empty queue or of a store it cannot read, the launch form's draft, which
pane has the keys, the key bar and the stream's caption at 80x24, steering messages that
wrap, and form errors shown whole.

Real engine, real SQLite, a real git repository; no claude (the scheduler is off) except
where a running worker is needed, and there the real claude against the scripted endpoint.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_ui_support import wait_until
from textual.widgets import Label

from fleet_tui.config import load_settings
from fleet_tui.fleet import Fleet
from fleet_tui.ui.app import FleetApp
from fleet_tui.ui.screens.landing import QueueScreen

EMPTY_QUEUE = "The merge queue is empty: mark tasks and press m."


@pytest.fixture
def fleet(git_repo: Path) -> Fleet:
    return Fleet(load_settings())


def make_app(fleet: Fleet, repo: Path, **kwargs: object) -> FleetApp:
    options: dict[str, object] = dict(repo=repo, default_base="main", run_scheduler=False,
                                      bell=False, poll_interval=0.1, diff_interval=60)
    options.update(kwargs)
    return FleetApp(fleet, **options)  # type: ignore[arg-type]


def queue_note(screen: QueueScreen) -> str:
    """The line under the queue's table, as shown ("" when hidden)."""
    label = screen.query_one("#queue-empty", Label)
    return str(label.render()) if label.display else ""


async def _ready(pilot: object, app: FleetApp) -> None:
    await wait_until(pilot, lambda: app.main.fleet is not None  # type: ignore[arg-type]
                     and app.main.status is not None, what="the first task list")


# --- finding 4: the merge queue view ------------------------------------------------------

async def test_q_on_an_empty_queue_says_at_once_that_it_is_empty(fleet: Fleet,
                                                                 git_repo: Path) -> None:
    app = make_app(fleet, git_repo)
    async with app.run_test(size=(120, 36)) as pilot:
        await _ready(pilot, app)
        await pilot.press("Q")
        await wait_until(pilot, lambda: isinstance(app.screen, QueueScreen), what="the view")
        screen = app.screen
        assert isinstance(screen, QueueScreen)
        await wait_until(pilot, lambda: screen.loaded_at > 0, what="the first read")
        await pilot.pause()
        assert queue_note(screen) == EMPTY_QUEUE  # not "Reading the queue…" for ever
        assert screen.rows == []
    assert app.errors == []


async def test_a_queue_that_cannot_be_read_is_said_in_the_view_and_read_again(
        fleet: Fleet, git_repo: Path, tmp_path: Path) -> None:
    import sqlite3

    db = fleet.store.path
    backup = tmp_path / "backup.db"
    with sqlite3.connect(db) as src, sqlite3.connect(backup) as dst:
        src.backup(dst)
    app = make_app(fleet, git_repo, poll_interval=60)
    async with app.run_test(size=(120, 36)) as pilot:
        await _ready(pilot, app)
        garbage = tmp_path / "garbage"
        garbage.write_bytes(b"this is not an SQLite database\n" * 200)
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        os.replace(garbage, db)
        fleet.store.close()  # as test_ui_store_errors: threads reopen the file they read
        await pilot.press("Q")
        await wait_until(pilot, lambda: isinstance(app.screen, QueueScreen), what="the view")
        screen = app.screen
        assert isinstance(screen, QueueScreen)
        await wait_until(pilot, lambda: queue_note(screen).startswith(
            "Cannot read the merge queue"), what="the error said in the view")
        assert "not a database" in queue_note(screen) and "Reading" not in queue_note(screen)
        assert app.errors == []  # said in the view, not one toast per read
        os.replace(backup, db)
        fleet.store.close()
        await wait_until(pilot, lambda: queue_note(screen) == EMPTY_QUEUE, what="read again")
