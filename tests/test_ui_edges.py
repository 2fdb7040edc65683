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
from textual.geometry import Region
from textual.widgets import Input, Label, TextArea

from fleet_tui.config import load_settings
from fleet_tui.fleet import Fleet
from fleet_tui.ui.app import FleetApp
from fleet_tui.ui.screens.landing import QueueScreen
from fleet_tui.ui.screens.launch import LaunchScreen

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


# --- finding 12: the launch form keeps a draft ---------------------------------------------

async def _open_form(pilot: object, app: FleetApp) -> LaunchScreen:
    await pilot.press("n")  # type: ignore[attr-defined]
    await wait_until(pilot, lambda: isinstance(app.screen, LaunchScreen)  # type: ignore[arg-type]
                     and bool(app.screen.query("#copies")), what="the form")
    screen = app.screen
    assert isinstance(screen, LaunchScreen)
    await pilot.pause()  # type: ignore[attr-defined]
    return screen


async def test_escape_in_the_launch_form_keeps_a_draft_that_n_restores_and_ctrl_l_clears(
        fleet: Fleet, git_repo: Path) -> None:
    app = make_app(fleet, git_repo)
    async with app.run_test(size=(120, 40)) as pilot:
        await _ready(pilot, app)
        form = await _open_form(pilot, app)
        form.query_one("#prompt", TextArea).insert("fix the flaky")
        await pilot.press(*" test")  # typed, as a user does
        form.query_one("#timeout", Input).value = "20m"
        await pilot.pause()
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.screen is app.main, what="the form closed")
        assert fleet.list_tasks() == []  # closing launches nothing

        form = await _open_form(pilot, app)
        assert form.query_one("#prompt", TextArea).text == "fix the flaky test"
        assert form.query_one("#timeout", Input).value == "20m"
        note = form.query_one("#draft-note", Label)
        assert note.display and "ctrl+l clears" in str(note.render())
        await pilot.press(*" now")  # the cursor is at the end of the draft
        assert form.query_one("#prompt", TextArea).text == "fix the flaky test now"

        await pilot.press("ctrl+l")
        await pilot.pause()
        assert form.query_one("#prompt", TextArea).text == ""
        assert form.query_one("#timeout", Input).value == ""
        assert form.query_one("#copies", Input).value == "1"
        assert not note.display
        await pilot.press("escape")  # a cleared form closed keeps no draft
        await wait_until(pilot, lambda: app.screen is app.main, what="the form closed")
        form = await _open_form(pilot, app)
        assert form.query_one("#prompt", TextArea).text == ""
        assert not form.query_one("#draft-note").display  # and says no draft

        # launched: the draft is gone, the next form is fresh
        form.query_one("#prompt", TextArea).insert("write the docs")
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.screen is app.main, what="the form closed")
        form = await _open_form(pilot, app)
        assert form.query_one("#prompt", TextArea).text == "write the docs"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: len(fleet.list_tasks()) == 1, what="the launch")
        await wait_until(pilot, lambda: app.screen is app.main, what="the form closed")
        form = await _open_form(pilot, app)
        assert form.query_one("#prompt", TextArea).text == ""
    assert app.errors == []


# --- finding 8 (its last sentence): form errors wrap and show whole ------------------------

@pytest.mark.parametrize("size", [(160, 48), (80, 24)])
async def test_a_form_error_wraps_and_shows_whole(fleet: Fleet, git_repo: Path,
                                                  size: tuple[int, int]) -> None:
    from fleet_tui import durations

    app = make_app(fleet, git_repo)
    async with app.run_test(size=size) as pilot:
        await _ready(pilot, app)
        form = await _open_form(pilot, app)
        form.query_one("#timeout", Input).value = "abc"
        await wait_until(pilot, lambda: form.query_one("#timeout-error").display,
                         what="the timeout's error")
        error = form.query_one("#timeout-error", Label)
        form.query_one("#launch-fields").scroll_to_widget(error, animate=False)
        await pilot.pause()
        with pytest.raises(ValueError) as raised:
            durations.parse_duration("abc")
        expected = f"Expected {raised.value}."
        assert str(error.render()) == expected
        cell = error.parent
        assert cell is not None
        # the label lies inside its column: nothing of it is cut off at the right ...
        assert error.region.right <= cell.region.right, (error.region, cell.region)
        # ... and its lines, as painted, hold the whole sentence
        painted = " ".join(strip.text.strip() for strip in error.render_lines(
            Region(0, 0, error.size.width, error.size.height)))
        assert " ".join(painted.split()) == expected
