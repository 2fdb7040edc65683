"""The newcomer's path, from the keyboard only, on the real engine and the real claude:
launch from the form, watch the tool calls arrive, review the diff, merge, find the change
on the branch."""

from __future__ import annotations

import subprocess

import pytest
from test_ui_support import TEST_KEY, Rig, rig, stream_text, toasts, wait_for_screen, wait_until
from textual.widgets import TextArea

from fleet_tui.store.db import TaskState
from fleet_tui.ui.screens.launch import LaunchScreen
from fleet_tui.ui.screens.modals import MergeScreen
from fleet_tui.ui.widgets.diff_view import DiffLines, DiffView
from fleet_tui.ui.widgets.task_table import TaskTable

__all__ = ["rig"]

pytestmark = pytest.mark.real_claude


async def test_launch_watch_review_merge(rig: Rig) -> None:
    app = rig.app()
    async with app.run_test(size=(160, 48)) as pilot:
        main = app.main
        await pilot.press("n")
        await wait_for_screen(pilot, LaunchScreen, what="the form")
        assert isinstance(app.focused, TextArea)
        await pilot.press(*"Say hello in a file", "enter", *"second line")
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, LaunchScreen),
                         what="the form to close")
        await wait_until(pilot, lambda: main.task_list.selected_id is not None, what="a selection")
        task_id = main.task_list.selected_id
        assert task_id is not None
        task = rig.fleet.get_task(task_id)
        assert task.title == "Say hello in a file"  # title defaults to the first line
        assert main.query_one(TaskTable).selected_key == task_id  # selected at once
        assert main.detail.active_tab == "tab-stream"

        # The tool calls arrive in the stream while the worker runs.
        await wait_until(pilot, lambda: "Write hello.txt" in stream_text(app),
                         what="the Write call in the stream")
        await wait_until(pilot, lambda: rig.state(task_id) == TaskState.SUCCEEDED,
                         what="the task to succeed")
        await wait_until(pilot, lambda: "done in" in stream_text(app), what="the result line")
        text = stream_text(app)
        assert "$ Bash cat hello.txt" in text
        assert "└ hello from the worker" in text
        assert TEST_KEY not in text
        await wait_until(pilot, lambda: any(f"{task_id} finished" in t for t in toasts(app)),
                         what="the finish toast")

        # Review the diff.
        await pilot.press("2")
        diff = main.query_one(DiffView)
        await wait_until(pilot, lambda: diff.prepared is not None
                         and any(f.path == "hello.txt" for f in diff.prepared.diff.files),
                         what="the diff")
        assert "+hello from the worker" in diff.query_one(DiffLines).lines

        # Merge: the confirm modal with the preview, then y.
        await pilot.press("m")
        await wait_for_screen(pilot, MergeScreen, what="the merge modal")
        await pilot.press("y")
        await wait_until(pilot, lambda: rig.state(task_id) == TaskState.MERGED,
                         what="the merge")
        await wait_until(pilot, lambda: any(f"{task_id} merged" in t for t in toasts(app)),
                         what="the merge toast")
    shown = subprocess.run(["git", "show", "main:hello.txt"], cwd=rig.repo, check=True,
                           capture_output=True, text=True).stdout
    assert shown == "hello from the worker\n"
    assert app.errors == []


async def test_the_tab_bar_and_the_key_bar_answer_the_mouse(rig: Rig) -> None:
    """The one-line bars (cheaper than TabbedContent and Footer at start-up) still do
    what those did: a click on a tab shows it, a click on a key presses it."""
    from fleet_tui.ui.screens.help import HelpScreen
    from fleet_tui.ui.widgets.bars import KeyBar, TabBar

    app = rig.app(run_scheduler=False)
    async with app.run_test(size=(120, 30)) as pilot:
        main = app.main
        bar = main.query_one(TabBar)
        plain = bar.render().plain
        await pilot.click(TabBar, offset=(plain.index("Diff"), 0))
        await wait_until(pilot, lambda: main.detail.active_tab == "tab-diff", what="the diff tab")
        await wait_until(pilot, lambda: bool(main.query(DiffView)), what="the diff view")
        assert main.query_one(DiffView).display
        await pilot.press("1")
        assert main.detail.active_tab == "tab-stream" and bar.active == "tab-stream"

        keys = main.query_one(KeyBar)
        await wait_until(pilot, lambda: "Help" in keys.render().plain, what="the keys")
        text = keys.render().plain
        assert "^p" in text and "palette" in text and "Quit" in text
        await pilot.click(KeyBar, offset=(text.index("Help"), 0))
        await wait_for_screen(pilot, HelpScreen, what="help")


async def test_a_message_to_a_worker_that_finished_meanwhile_goes_as_a_follow_up(
        rig: Rig) -> None:
    """`s` on a running worker opens the message dialog; the worker ends its turn while
    the message is written: the text is not lost, it goes to the same session as a
    follow-up (before: "cannot send a message ... send a follow-up instead")."""
    from fleet_tui.ui.screens.modals import PromptScreen

    task_id = rig.submit("[script:pause] take a moment")
    app = rig.app()
    async with app.run_test(size=(160, 48)) as pilot:
        # the panel's own copy of the task says it runs (the key applies to what it shows)
        await wait_until(pilot, lambda: app.main.task_list.cursor_task is not None
                         and app.main.task_list.cursor_task.state == TaskState.RUNNING,
                         what="the worker to run")
        await pilot.press("s")
        await wait_for_screen(pilot, PromptScreen, what="the message dialog")
        await wait_until(pilot, lambda: rig.state(task_id) == TaskState.SUCCEEDED,
                         what="the worker to finish")
        await pilot.press(*"also say goodbye")
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: len(rig.fleet.attempts(task_id)) == 2,
                         what="the follow-up")
        attempt = rig.fleet.attempts(task_id)[-1]
        assert attempt.kind == "followup" and attempt.prompt == "also say goodbye"
        # the same session: a follow-up resumes the task's session
        assert rig.fleet.get_task(task_id).session_id == \
            rig.fleet.attempts(task_id)[0].session_id is not None
        await wait_until(pilot, lambda: any("sent as a follow-up" in t for t in toasts(app)),
                         what="the toast")
    assert app.errors == []
