"""Every action of the main screen, driven by its key, on the real engine and real claude."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from test_ui_support import Rig, rig, stream_text, toasts, wait_for_screen, wait_until
from textual.command import CommandPalette
from textual.widgets import Input, TextArea

from fleet_tui.store.db import TaskState
from fleet_tui.ui.app import FleetApp
from fleet_tui.ui.screens.help import HelpScreen
from fleet_tui.ui.screens.launch import LaunchScreen
from fleet_tui.ui.screens.main import MainScreen
from fleet_tui.ui.screens.modals import (
    AttemptScreen,
    ChoiceScreen,
    ConfirmScreen,
    MergeScreen,
    PromptScreen,
)
from fleet_tui.ui.widgets.diff_view import DiffView, FileList
from fleet_tui.ui.widgets.stream_view import StreamView
from fleet_tui.ui.widgets.task_table import TaskTable

__all__ = ["rig"]

pytestmark = pytest.mark.real_claude

FINISHED = (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.KILLED)


async def _select(pilot: object, app: FleetApp, task_id: str, rig: Rig | None = None) -> None:
    """Select a task once the panel shows it in the state the store has now."""
    main = app.main
    if rig is not None:
        # the store's state when the check runs: one read before waiting raced the
        # scheduler (a task queued at the read may be running before the panel's first poll)
        await wait_until(pilot, lambda: task_id in main.task_list.tasks  # type: ignore[arg-type]
                         and main.task_list.tasks[task_id].state == rig.state(task_id),
                         what=f"{task_id} shown in its stored state")
    await wait_until(pilot, lambda: task_id in main.query_one(TaskTable).keys,  # type: ignore[arg-type]
                     what=f"{task_id} in the table")
    main.query_one(TaskTable).select_key(task_id)
    await wait_until(pilot, lambda: main.task_list.selected_id == task_id,  # type: ignore[arg-type]
                     what=f"{task_id} selected")


def _finished(rig: Rig, *task_ids: str) -> bool:
    return all(rig.state(t) in FINISHED for t in task_ids)


async def test_discard_asks_and_removes_worktree_and_branch(rig: Rig) -> None:
    task_id = rig.submit("write a file")
    app = rig.app()
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: _finished(rig, task_id), what="the task")
        await _select(pilot, app, task_id, rig)
        worktree = rig.fleet.get_task(task_id).worktree
        assert worktree is not None and worktree.is_dir()
        await wait_until(pilot, lambda: app.main.check_action("discard", ()) is True,
                         what="discard to apply")
        await pilot.press("d")
        await wait_for_screen(pilot, ConfirmScreen, what="confirm")
        await pilot.press("n")  # no: nothing happens
        await wait_until(pilot, lambda: app.screen is app.main, what="the confirm closed")
        assert rig.state(task_id) == TaskState.SUCCEEDED
        await pilot.press("d")
        await wait_for_screen(pilot, ConfirmScreen, what="confirm")
        await pilot.press("y")
        await wait_until(pilot, lambda: rig.state(task_id) == TaskState.DISCARDED,
                         what="the discard")
        # A discarded task cannot be merged or discarded again: those keys are hidden.
        await wait_until(pilot, lambda: app.main.task_list.tasks[task_id].state
                         == TaskState.DISCARDED,
                         what="the list to update")
        assert app.main.check_action("merge", ()) is False
        assert app.main.check_action("discard", ()) is False
    assert not worktree.exists()
    branches = subprocess.run(["git", "branch", "--list", f"fleet/{task_id}"], cwd=rig.repo,
                              capture_output=True, text=True, check=True).stdout
    assert branches.strip() == ""


async def test_kill_a_running_task(rig: Rig) -> None:
    task_id = rig.submit("[script:slow] take your time")
    app = rig.app()
    async with app.run_test(size=(120, 36)) as pilot:
        await _select(pilot, app, task_id, rig)
        await wait_until(pilot, lambda: "Bash sleep 60" in stream_text(app),
                         what="the slow tool call")
        assert app.main.check_action("kill", ()) is True
        assert app.main.check_action("merge", ()) is False  # not while it runs
        await pilot.press("k")
        await wait_for_screen(pilot, ConfirmScreen, what="confirm")
        await pilot.press("escape")  # escape answers no
        await wait_until(pilot, lambda: app.screen is app.main, what="the confirm closed")
        assert rig.state(task_id) in (TaskState.RUNNING, TaskState.STALLED)
        await pilot.press("k")
        await wait_for_screen(pilot, ConfirmScreen, what="confirm")
        await pilot.press("y")
        await wait_until(pilot, lambda: rig.state(task_id) == TaskState.KILLED,
                         what="the kill", timeout=30)


async def test_discard_a_running_task_stops_its_worker_first(rig: Rig) -> None:
    """The policy offers discard for a running task (the engine stops it first); the
    confirm says so, and after `y` the worker is gone with its worktree."""
    from fleet_tui.system import procs

    task_id = rig.submit("[script:slow] take your time")
    app = rig.app()
    async with app.run_test(size=(120, 36)) as pilot:
        await _select(pilot, app, task_id, rig)
        await wait_until(pilot, lambda: "Bash sleep 60" in stream_text(app),
                         what="the slow tool call")
        runner = rig.fleet.attempts(task_id)[-1].runner_pid
        worktree = rig.fleet.get_task(task_id).worktree
        assert runner and procs.is_alive(runner) and worktree is not None
        assert app.main.check_action("discard", ()) is True
        await pilot.press("d")
        await wait_for_screen(pilot, ConfirmScreen, what="confirm")
        body = str(app.screen.query_one(".dialog-body").render())
        assert "still running or queued: it is stopped first" in body
        await pilot.press("y")
        await wait_until(pilot, lambda: rig.state(task_id) == TaskState.DISCARDED,
                         what="the discard", timeout=30)
    assert procs.wait_gone([runner], 10)
    assert not worktree.exists()


async def test_retry_fresh_then_resume_and_choose_attempt(rig: Rig) -> None:
    task_id = rig.submit("write a file")
    app = rig.app()
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: _finished(rig, task_id), what="the first attempt")
        await _select(pilot, app, task_id, rig)
        await pilot.press("r")
        await wait_for_screen(pilot, ChoiceScreen, what="choice")
        await pilot.press("f")
        await wait_until(pilot, lambda: len(rig.fleet.attempts(task_id)) == 2,
                         what="a second attempt")
        await wait_until(pilot, lambda: _finished(rig, task_id), what="the second attempt")
        await wait_until(pilot, lambda: app.main.task_list.tasks[task_id].attempt_count == 2
                         and app.main.check_action("retry", ()) is True, what="the list")
        await pilot.press("r")
        await wait_for_screen(pilot, ChoiceScreen, what="choice")
        await pilot.press("r")
        await wait_until(pilot, lambda: len(rig.fleet.attempts(task_id)) == 3,
                         what="a resumed attempt")
        await wait_until(pilot, lambda: _finished(rig, task_id), what="the resumed attempt")
        attempts = rig.fleet.attempts(task_id)
        assert [a.kind for a in attempts] == ["fresh", "fresh", "resume"]

        # The stream follows the newest attempt; `a` picks an older one.
        await wait_until(pilot, lambda: "attempt 3/3" in str(
            app.main.query_one("#stream-caption").render()), what="the third attempt")
        await pilot.press("a")
        await wait_for_screen(pilot, AttemptScreen, what="the attempt list")
        await pilot.press("home", "enter")
        await wait_until(pilot, lambda: "attempt 1/3" in str(
            app.main.query_one("#stream-caption").render()), what="attempt 1 shown")
        await wait_until(pilot, lambda: "Write hello.txt" in stream_text(app),
                         what="attempt 1's events")


async def test_follow_up_continues_the_session(rig: Rig) -> None:
    task_id = rig.submit("write a file")
    app = rig.app()
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: _finished(rig, task_id), what="the first attempt")
        await _select(pilot, app, task_id, rig)
        await wait_until(pilot, lambda: app.main.check_action("follow_up", ()) is True,
                         what="follow-up to apply")
        await pilot.press("f")
        prompt = await wait_for_screen(pilot, PromptScreen, what="prompt")
        await pilot.press("ctrl+s")  # empty: refused inline (once the keys before it are in)
        await wait_until(pilot, lambda: "Write a prompt" in str(
            prompt.query_one("#prompt-error").render()), what="the refusal")
        assert app.screen is prompt
        await pilot.press(*"once more")
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: len(rig.fleet.attempts(task_id)) == 2,
                         what="the follow-up attempt")
        await wait_until(pilot, lambda: _finished(rig, task_id), what="the follow-up")
        attempt = rig.fleet.attempts(task_id)[-1]
        assert attempt.kind == "followup"
        # The stream switches to the follow-up attempt and shows its run to the end.
        await wait_until(pilot, lambda: "attempt 2/2 (followup)" in str(
            app.main.query_one("#stream-caption").render()), what="the follow-up attempt")
        await wait_until(pilot, lambda: "done in" in stream_text(app),
                         what="the follow-up's stream")
        assert "Write hello.txt" not in stream_text(app)


async def test_marked_tasks_are_discarded_together(rig: Rig) -> None:
    ids = [rig.submit("write a file") for _ in range(3)]
    app = rig.app()
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: _finished(rig, *ids), what="three tasks",
                         timeout=60)
        await _select(pilot, app, ids[0], rig)
        await pilot.press("space")
        await _select(pilot, app, ids[1], rig)
        await pilot.press("space")
        assert app.main.task_list.marked == {ids[0], ids[1]}
        assert "●" in str(app.main.query_one(TaskTable).get_row(ids[0])[0])
        await pilot.press("d")
        await wait_for_screen(pilot, ConfirmScreen, what="confirm")
        body = str(app.screen.query_one(".dialog-body").render())
        assert ids[0] in body and ids[1] in body and ids[2] not in body
        await pilot.press("y")
        await wait_until(pilot, lambda: rig.state(ids[0]) == TaskState.DISCARDED
                         and rig.state(ids[1]) == TaskState.DISCARDED, what="both discarded")
        assert rig.state(ids[2]) == TaskState.SUCCEEDED
        await wait_until(pilot, lambda: not app.main.task_list.marked, what="marks cleared")


async def test_conflicting_merge_shows_preview_and_refuses(rig: Rig) -> None:
    a = rig.submit("[script:side-a] write shared")
    b = rig.submit("[script:side-b] write shared")
    app = rig.app()
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: _finished(rig, a, b), what="both tasks", timeout=60)
        await _select(pilot, app, a, rig)
        await pilot.press("m")
        await wait_for_screen(pilot, MergeScreen, what="merge A")
        await pilot.press("y")
        await wait_until(pilot, lambda: rig.state(a) == TaskState.MERGED, what="A merged")
        await _select(pilot, app, b, rig)
        await pilot.press("m")
        await wait_for_screen(pilot, MergeScreen, what="merge B")
        text = " ".join(str(w.render()) for w in app.screen.query(".merge-item"))
        assert "conflicts" in text and "shared.txt" in text
        await pilot.press("y")  # refused: the modal stays, a warning says why
        await wait_until(pilot, lambda: any("does not merge cleanly" in t for t in toasts(app)),
                         what="the refusal")
        assert isinstance(app.screen, MergeScreen)
        await pilot.press("n")
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen), what="closed")
        assert rig.state(b) == TaskState.SUCCEEDED


async def test_filter_help_tabs_and_stream_toggles(rig: Rig) -> None:
    a = rig.submit("write a file", title="alpha task")
    b = rig.submit("[script:second] another", title="beta task")
    app = rig.app()
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: _finished(rig, a, b), what="both tasks", timeout=60)
        table = app.main.query_one(TaskTable)
        await wait_until(pilot, lambda: set(table.keys) == {a, b}, what="both rows")
        await pilot.press("slash")
        assert isinstance(app.focused, Input)
        await pilot.press(*"beta")
        await wait_until(pilot, lambda: table.keys == [b], what="the filter")
        await pilot.press("enter")
        assert app.focused is table and table.keys == [b]
        await pilot.press("escape")
        await wait_until(pilot, lambda: set(table.keys) == {a, b}, what="filter cleared")

        await _select(pilot, app, a, rig)
        await wait_until(pilot, lambda: "done in" in stream_text(app), what="a's stream")
        everything = stream_text(app)
        assert "▌ Writing hello.txt." in everything
        await pilot.press("t")  # tool calls only: the assistant's text goes
        tools_only = stream_text(app)
        assert "Write hello.txt" in tools_only and "Writing hello.txt." not in tools_only
        await pilot.press("t")
        await pilot.press("J")  # raw JSON lines
        await wait_until(pilot, lambda: '"type":"system"' in stream_text(app).replace(" ", ""),
                         what="raw lines")
        assert app.main.query_one(StreamView).total_rows >= 5
        await pilot.press("J")
        await wait_until(pilot, lambda: "Write hello.txt" in stream_text(app), what="readable")

        await pilot.press("2")
        diff = app.main.query_one(DiffView)
        await wait_until(pilot, lambda: diff.prepared is not None, what="the diff")
        await pilot.press("1")
        await pilot.press("question_mark")
        help_screen = await wait_for_screen(pilot, HelpScreen, what="help")
        keys = {key for _, rows in help_screen.sections for key, _ in rows}
        for binding in MainScreen.BINDINGS:  # every key of the main screen is listed
            assert app.get_key_display(binding) in keys, binding  # type: ignore[arg-type]
        assert {"n", "m", "d", "r", "f", "k", "space", "o", "e", "/", "?"} <= keys
        await pilot.press("escape")
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen), what="help closed")
        # shown again, it is the same screen (kept, not composed and laid out anew)
        await pilot.press("question_mark")
        assert await wait_for_screen(pilot, HelpScreen, what="help again") is help_screen
        await pilot.press("q")
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen), what="closed again")


@contextmanager
def _no_suspend(app: FleetApp) -> Iterator[None]:
    """Stand-in for App.suspend: the headless test driver has no terminal to hand over."""
    yield


async def test_shell_and_editor_run_in_the_worktree(rig: Rig, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "record.txt"
    tool = tmp_path / "tool.sh"
    tool.write_text(f'#!/bin/sh\necho "$(pwd) $*" >> {record}\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("SHELL", str(tool))
    monkeypatch.setenv("EDITOR", str(tool))
    monkeypatch.delenv("VISUAL", raising=False)
    task_id = rig.submit("write a file")
    app = rig.app()
    monkeypatch.setattr(app, "suspend", lambda: _no_suspend(app))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: _finished(rig, task_id), what="the task")
        await _select(pilot, app, task_id, rig)
        worktree = rig.fleet.get_task(task_id).worktree
        assert worktree is not None
        await wait_until(pilot, lambda: app.main.check_action("shell", ()) is True,
                         what="shell to apply")
        await pilot.press("o")
        await wait_until(pilot, lambda: record.exists(), what="the shell")
        assert record.read_text().split()[0] == str(worktree)

        # e needs a file highlighted in the diff's file list.
        assert app.main.check_action("edit", ()) is False
        await pilot.press("2")
        diff = app.main.query_one(DiffView)
        await wait_until(pilot, lambda: diff.prepared is not None, what="the diff")
        files = diff.query_one(FileList)
        files.focus()
        await pilot.press("down")
        await wait_until(pilot, lambda: diff.selected_path == "hello.txt", what="hello.txt")
        assert app.main.check_action("edit", ()) is True
        await pilot.press("e")
        await wait_until(pilot, lambda: len(record.read_text().splitlines()) == 2,
                         what="the editor")
        line = record.read_text().splitlines()[1]
        assert line == f"{worktree} {worktree / 'hello.txt'}"


async def test_engine_errors_become_a_notification(rig: Rig) -> None:
    app = rig.app(run_scheduler=False)
    async with app.run_test(size=(100, 30)) as pilot:
        app.main.task_actions._engine_each(rig.fleet, "kill", ["zzzzzz"], "killed")
        await wait_until(pilot, lambda: bool(app.errors), what="the error")
        assert "zzzzzz" in app.errors[0]
        assert "Traceback" not in app.errors[0]
        assert any("Failed" in t for t in toasts(app))


async def test_alerts_when_a_task_fails(rig: Rig) -> None:
    task_id = rig.submit("[script:denied] nothing")
    app = rig.app()
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: rig.state(task_id) == TaskState.FAILED,
                         what="the failure")
        await wait_until(pilot, lambda: any(f"{task_id} failed" in t for t in toasts(app)),
                         what="the failure toast")
        assert app.bells >= 1
        await _select(pilot, app, task_id, rig)
        await wait_until(pilot, lambda: "API error" in stream_text(app)
                         or "failed" in stream_text(app), what="the error in the stream")


async def test_command_palette_offers_applicable_actions(rig: Rig) -> None:
    task_id = rig.submit("write a file")
    app = rig.app()
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: _finished(rig, task_id), what="the task")
        await _select(pilot, app, task_id, rig)
        await wait_until(pilot, lambda: app.main.check_action("merge", ()) is True,
                         what="merge to apply")
        titles = [c.title for c in app.get_system_commands(app.main)]
        assert "Merge (m)" in titles and "New (n)" in titles
        assert "Kill (k)" not in titles  # a finished task cannot be killed
        await pilot.press("ctrl+p")
        await wait_for_screen(pilot, CommandPalette, what="the palette")
        await pilot.press(*"Discard")

        def offered() -> str:  # the palette's matches, searched in a worker
            return " ".join(str(o.prompt) for o in app.screen.query_one(
                "CommandList").options)  # type: ignore[attr-defined]

        await wait_until(pilot, lambda: "Discard" in offered(), what="the palette's match")
        await pilot.press("enter")
        await wait_for_screen(pilot, ConfirmScreen, what="the discard confirm from the palette")
        await pilot.press("n")


async def test_launch_form_validates_inline(rig: Rig) -> None:
    app = rig.app(run_scheduler=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("n")
        screen = await wait_for_screen(pilot, LaunchScreen, what="the form")
        await pilot.press("ctrl+s")  # the check runs once the keys before it are in

        def error(field: str) -> str:
            return str(screen.query_one(f"#{field}-error").render())

        await wait_until(pilot, lambda: "prompt is empty" in error("prompt"),
                         what="the empty prompt refused")
        screen.query_one("#prompt", TextArea).text = "Do the thing"
        screen.query_one("#max-turns", Input).value = "ten"
        screen.query_one("#timeout", Input).value = "soon"
        screen.query_one("#copies", Input).value = "0"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: "whole number" in error("max-turns"),
                         what="the fields checked")
        assert "seconds" in error("timeout")
        assert "between 1 and" in error("copies")
        screen.query_one("#max-turns", Input).value = "5"
        screen.query_one("#timeout", Input).value = "15m"
        screen.query_one("#copies", Input).value = "2"
        screen.query_one("#base-ref", Input).value = "no-such-branch"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: "unknown ref" in error("base-ref"),
                         what="the base ref check")
        assert app.screen is screen and rig.fleet.list_tasks() == []
        screen.query_one("#base-ref", Input).value = "main"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: len(rig.fleet.list_tasks()) == 2, what="two copies")
        tasks = rig.fleet.list_tasks()
        assert {t.max_turns for t in tasks} == {5} and {t.timeout for t in tasks} == {900.0}
        assert all(t.title.startswith("Do the thing") for t in tasks)
        # The form remembers the options for next time.
        await pilot.press("n")
        await wait_until(pilot, lambda: app.screen is not screen
                         and isinstance(app.screen, LaunchScreen) and app.screen.is_mounted,
                         what="the form again")
        assert app.screen.query_one("#max-turns", Input).value == "5"
        assert app.screen.query_one("#base-ref", Input).value == "main"
        assert app.screen.query_one("#prompt", TextArea).text == ""
        await pilot.press("escape")
    assert os.path.exists(Path(os.environ["FLEET_TUI_HOME"]) / "launch-form.json")
