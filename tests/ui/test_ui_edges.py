"""The panel at its edges (and the launch form's errors): the merge
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
from test_ui_support import Rig, rig, wait_for_screen, wait_until
from textual.geometry import Region
from textual.widgets import Input, Label, TextArea

from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import TaskState
from fleet_tui.ui.app import FleetApp
from fleet_tui.ui.screens.landing import QueueScreen
from fleet_tui.ui.screens.launch import LaunchScreen
from fleet_tui.ui.widgets.bars import KeyBar

__all__ = ["rig"]  # the real-claude rig, for the test that needs a running worker

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
                     and app.main.task_list.status is not None, what="the first task list")


# --- the merge queue view -----------------------------------------------------------------

async def test_q_on_an_empty_queue_says_at_once_that_it_is_empty(fleet: Fleet,
                                                                 git_repo: Path) -> None:
    app = make_app(fleet, git_repo)
    async with app.run_test(size=(120, 36)) as pilot:
        await _ready(pilot, app)
        await pilot.press("Q")
        screen = await wait_for_screen(pilot, QueueScreen, what="the view")
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
        screen = await wait_for_screen(pilot, QueueScreen, what="the view")
        await wait_until(pilot, lambda: queue_note(screen).startswith(
            "Cannot read the merge queue"), what="the error said in the view")
        assert "not a database" in queue_note(screen) and "Reading" not in queue_note(screen)
        assert app.errors == []  # said in the view, not one toast per read
        os.replace(backup, db)
        fleet.store.close()
        await wait_until(pilot, lambda: queue_note(screen) == EMPTY_QUEUE, what="read again")


# --- the launch form keeps a draft ---------------------------------------------------------

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


# --- form errors wrap and show whole -------------------------------------------------------

@pytest.mark.parametrize("size", [(160, 48), (80, 24)])
async def test_a_form_error_wraps_and_shows_whole(fleet: Fleet, git_repo: Path,
                                                  size: tuple[int, int]) -> None:
    from fleet_tui.core import durations

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


# --- the key bar, the stream's caption and "» you:" lines at 80x24 -----------------------

LONG_PROMPT = ("[script:slow] Please rework the greeting so that it reads warmly, keeps the "
               "shop's name, and mention in the docstring why the old greeting was changed "
               "end")


def bar_entries(bar: KeyBar) -> list[str]:
    """The key bar's entries as shown ("n New", "? Help +3"), the palette key left out."""
    left = bar.render().plain.split("▏")[0]
    return [" ".join(part.split()) for part in left.split("  ") if part.strip()]


async def test_at_80x24_the_key_bar_keeps_whole_keys_and_help_holds_the_rest(
        rig: Rig) -> None:
    task_id = rig.submit(LONG_PROMPT)
    app = rig.app()
    async with app.run_test(size=(80, 24)) as pilot:
        main = app.main
        await wait_until(pilot, lambda: task_id in main.task_list.tasks
                         and main.task_list.tasks[task_id].state == TaskState.RUNNING
                         and main.task_list.cursor_task is not None, timeout=90, what="the worker")
        await wait_until(pilot, lambda: main.check_action("say", ()) is True,
                         what="s applies")
        bar = main.query_one(KeyBar)
        await pilot.pause()
        plain = bar.render().plain
        assert "…" not in plain  # nothing cut in a word ("o Shel…" before)
        entries = bar_entries(bar)
        words = {e.split(" ", 1)[1] for e in entries}
        assert {"New", "Say", "Kill", "Quit"} <= words | {w.split(" +")[0] for w in words}
        # every key that applies and is not shown is counted on the help key
        applies = [b for _, b, enabled, _ in main.active_bindings.values()
                   if b.show and enabled is not False and b.key != "ctrl+p"]
        labels = {b.description for b in applies}
        shown = {w.split(" +")[0] for w in words}
        assert shown <= labels
        help_entry = next(e for e in entries if e.startswith("? Help"))
        hidden = len({b.action for b in applies}) - len(shown)
        assert hidden > 0  # 80 columns do not hold them all ...
        assert help_entry == f"? Help +{hidden}"  # ... and help says how many it holds

        # the stream's caption: each key whole, the rest behind ?
        caption = main.stream.caption
        assert caption.endswith("?: more")
        hints = caption.split("   ")[-1].split("  ")
        for hint in hints[:-1]:
            assert hint in main.stream.hints.split("  ")  # "a:" alone was cut before
        assert len(caption) <= main.stream.size.width
        rig.fleet.kill(task_id)
    assert app.errors == []


async def test_what_the_user_said_wraps_in_the_stream_and_needs_no_horizontal_scrollbar(
        rig: Rig) -> None:
    """The prompt and steering messages ("» you:") wrap in words at the stream's width.
    Cut, the row was wider than the view: a horizontal scrollbar came, whose thumb's end
    (a partial block, ▉ ▌) was the stray glyph above the key bar after a say."""
    task_id = rig.submit(LONG_PROMPT)
    app = rig.app()
    async with app.run_test(size=(80, 24)) as pilot:
        main = app.main
        await wait_until(pilot, lambda: main.task_list.selected_id == task_id, what="the task")
        view = main.stream.view
        await wait_until(pilot, lambda: any(line.startswith("» you: ")
                                            for line in view.plain_lines()),
                         timeout=90, what="the prompt in the stream")
        lines = view.plain_lines()
        start = next(n for n, line in enumerate(lines) if line.startswith("» you: "))
        said = [lines[start]]
        for line in lines[start + 1:]:
            if not line.startswith("       "):
                break
            said.append(line)
        assert len(said) > 1
        width = view.size.width
        assert all(len(line) <= width for line in said), (width, said)
        assert " ".join(" ".join(said)[len("» you: "):].split()) == LONG_PROMPT
        assert view.virtual_size.width <= width  # no row wider than the view ...
        # ... so no horizontal scrollbar, whose thumb end was the stray block glyph
        assert not view.show_horizontal_scrollbar
        rig.fleet.kill(task_id)
    assert app.errors == []


# --- which pane has the keys; the list keys from the diff tab -----------------------------

async def test_after_2_the_arrows_move_the_task_list_and_the_pane_with_the_keys_is_said(
        fleet: Fleet, git_repo: Path) -> None:
    from fleet_tui.store.db import TaskSpec
    from fleet_tui.ui.widgets.bars import TabBar
    from fleet_tui.ui.widgets.stream_view import StreamView

    ids = [fleet.submit(TaskSpec(prompt=f"task {i}", repo=git_repo))[0].id for i in range(3)]
    app = make_app(fleet, git_repo)
    async with app.run_test(size=(120, 36)) as pilot:
        main = app.main
        table = main.table
        await wait_until(pilot, lambda: set(ids) <= set(table.keys), what="the tasks")
        first, second, third = table.keys[:3]
        await wait_until(pilot, lambda: main.task_list.selected_id == first, what="the first task")
        await pilot.click(StreamView)  # reading the stream: its view takes the keys
        await pilot.pause()
        assert app.focused is main.stream.view
        await pilot.press("2")  # the diff
        await wait_until(pilot, lambda: main.detail.active_tab == "tab-diff", what="the diff tab")
        await pilot.press("down")  # moves the task list (before: the diff's file list)
        await wait_until(pilot, lambda: main.task_list.selected_id == second, timeout=5,
                         what="the list to move from the diff tab")
        assert main.task_list.cursor_task is not None and main.task_list.cursor_task.id == second
        title = str(main.query_one("#detail-title", Label).render())
        assert title.startswith(second)  # the task the keys act on is the one shown
        assert app.focused is table

        bar = main.query_one(TabBar)
        assert main.keys_pane == "list" and bar.note == "keys: task list"
        # a click on a tab chooses the view, and the keys stay on the list
        plain = bar.render().plain
        await pilot.click(TabBar, offset=(plain.index("Stream"), 0))
        await wait_until(pilot, lambda: main.detail.active_tab == "tab-stream", what="the stream")
        assert app.focused is table
        await pilot.press("down")
        await wait_until(pilot, lambda: main.task_list.selected_id == third, what="the list moved")

        # tab moves the keys into the views, and the header says where they are
        await pilot.press("tab")
        await pilot.pause()
        assert main.keys_pane == "tabs" and "esc: task list" in bar.note
        await pilot.press("tab")
        await pilot.pause()
        assert main.keys_pane == "stream" and bar.note.startswith("keys: stream")
        assert main.query_one("#detail-pane").has_focus_within
        await pilot.press("escape")  # back to the list
        await pilot.pause()
        assert app.focused is table and bar.note == "keys: task list"
        assert not main.query_one("#detail-pane").has_focus_within
    assert app.errors == []
