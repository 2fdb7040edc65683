"""Marks: `space` marks the row under the cursor, every press counts, and the bulk actions
act on exactly the marked set.

No claude here: the scheduler is off, so submitted tasks stay queued and every action
(kill, retry, discard, merge) is the real engine's on a real store and real git.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, git
from test_ui_support import wait_for_screen, wait_until
from textual import events
from textual.command import CommandPalette
from textual.pilot import Pilot
from textual.widgets import Button, Input

from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import TaskSpec, TaskState
from fleet_tui.ui.app import FleetApp
from fleet_tui.ui.screens.help import HelpScreen
from fleet_tui.ui.screens.modals import ChoiceScreen, ConfirmScreen, MergeScreen
from fleet_tui.ui.widgets.bars import KeyBar
from fleet_tui.ui.widgets.stream_view import StreamView
from fleet_tui.ui.widgets.task_table import TaskTable

SIZE = (120, 36)


@pytest.fixture
def fleet(git_repo: Path) -> Fleet:
    return Fleet(load_settings())


def submit(fleet: Fleet, repo: Path, n: int) -> list[str]:
    return [fleet.submit(TaskSpec(prompt=f"task number {i}", repo=repo))[0].id
            for i in range(n)]


def make_app(fleet: Fleet, repo: Path) -> FleetApp:
    return FleetApp(fleet, repo=repo, default_base="main", run_scheduler=False, bell=False,
                    poll_interval=0.1, diff_interval=60, stream_interval=0.02)


def press_at_once(app: FleetApp, *keys: str) -> None:
    """Queue every key before the app handles the first: a user typing faster than the
    panel draws (Pilot.press waits for the app to go idle after each key)."""
    for key in keys:
        char = " " if key == "space" else (key if len(key) == 1 else None)
        app.post_message(events.Key(key, char))


async def listed(pilot: Pilot[Any], app: FleetApp, ids: list[str]) -> TaskTable:
    table = app.main.query_one(TaskTable)
    await wait_until(pilot, lambda: set(ids) <= set(table.keys), what="the tasks listed")
    return table


def mark_cells(table: TaskTable) -> dict[str, str]:
    """The mark column as painted, per task."""
    return {key: table.get_row(key)[0].plain for key in table.keys}


async def test_three_quick_presses_mark_three_rows(fleet: Fleet, git_repo: Path) -> None:
    ids = submit(fleet, git_repo, 5)
    app = make_app(fleet, git_repo)
    async with app.run_test(size=SIZE) as pilot:
        table = await listed(pilot, app, ids)
        rows = table.keys
        press_at_once(app, "space", "space", "space")
        await wait_until(pilot, lambda: table.cursor_row == 3, what="three presses handled")
        assert app.main.task_list.marked == set(rows[:3])
        cells = mark_cells(table)
        assert [cells[k] for k in rows] == ["●", "●", "●", " ", " "]
        # a fourth press lands on the fourth row, then one back up and again unmarks it
        press_at_once(app, "space", "up", "space")
        await wait_until(pilot, lambda: table.cursor_row == 4
                         and len(app.main.task_list.marked) == 3,
                         what="the three presses handled")
        assert app.main.task_list.marked == set(rows[:3])


def _grow_events(path: Path, stop: threading.Event) -> None:
    """A worker streaming fast: real CLI event lines appended as quickly as the disk takes
    them, so the panel reads and draws a big stream while keys arrive."""
    lines = (FIXTURES / "stream-json" / "nonroot_stream" / "stdout.jsonl").read_bytes()
    chunk = [ln for ln in lines.splitlines(keepends=True) if b'"assistant"' in ln] * 200
    with open(path, "ab") as fh:
        while not stop.is_set():
            fh.write(b"".join(chunk))
            fh.flush()
            time.sleep(0.01)


@pytest.fixture
def streaming(fleet: Fleet, git_repo: Path, tmp_path: Path) -> Iterator[str]:
    """A running task whose events file grows by megabytes a second."""
    task_id = submit(fleet, git_repo, 1)[0]
    attempt_dir = tmp_path / "logs" / task_id / "1"
    attempt_dir.mkdir(parents=True)
    events_file = attempt_dir / "events.jsonl"
    events_file.write_bytes(b"")
    fleet.store.add_attempt(task_id, now=time.time(), dir=attempt_dir,
                            events_path=events_file)
    fleet.store.update_task(task_id, state=TaskState.RUNNING, started_at=time.time())
    stop = threading.Event()
    writer = threading.Thread(target=_grow_events, args=(events_file, stop), daemon=True)
    writer.start()
    yield task_id
    stop.set()
    writer.join(5)


async def test_every_press_counts_while_a_big_stream_is_drawn(
        fleet: Fleet, git_repo: Path, streaming: str) -> None:
    ids = submit(fleet, git_repo, 6)
    app = make_app(fleet, git_repo)
    async with app.run_test(size=SIZE) as pilot:
        table = await listed(pilot, app, [*ids, streaming])
        table.select_key(streaming)  # the running task is the first row; its stream flows
        stream = app.main.query_one(StreamView)
        await wait_until(pilot, lambda: stream.row_count() > 100, what="the stream flowing")
        rows = table.keys
        start = table.cursor_row
        for _ in range(3):
            # the event loop is kept busy (a slow frame) while three presses queue up
            app.call_later(lambda: time.sleep(0.2))
            press_at_once(app, "space", "space")
            await pilot.pause(0.05)
        await wait_until(pilot, lambda: table.cursor_row == start + 6,
                         what="the six presses handled")
        assert app.main.task_list.marked == set(rows[start:start + 6])


async def test_mark_all_and_unmark_all(fleet: Fleet, git_repo: Path) -> None:
    ids = submit(fleet, git_repo, 4)
    odd = fleet.submit(TaskSpec(prompt="something else entirely", repo=git_repo))[0].id
    app = make_app(fleet, git_repo)
    async with app.run_test(size=SIZE) as pilot:
        await listed(pilot, app, [*ids, odd])
        main = app.main
        bar = main.query_one(KeyBar)
        assert "Mark all" in bar.render().plain
        assert "Unmark all" not in bar.render().plain  # nothing marked yet
        await pilot.press("ctrl+a")
        assert main.task_list.marked == {*ids, odd}
        assert set(mark_cells(main.query_one(TaskTable)).values()) == {"●"}
        await wait_until(pilot, lambda: "Unmark all" in bar.render().plain,
                         what="unmark all in the key bar")
        assert "5 marked" in str(main.query_one("#status").render())
        await pilot.press("escape")
        assert main.task_list.marked == set()
        # mark all marks what the list shows: with a filter, only the tasks it keeps
        await pilot.press("slash", *"number", "enter")
        await wait_until(pilot, lambda: len(main.query_one(TaskTable).keys) == 4,
                         what="the filter")
        await pilot.press("ctrl+a")
        assert main.task_list.marked == set(ids)
        await pilot.press("escape")  # first escape: the filter goes, the marks stay
        assert main.task_list.marked == set(ids) and main.task_list.filter_text == ""
        await pilot.press("escape")  # second: the marks go
        assert main.task_list.marked == set()
        # help and the command palette name both
        await pilot.press("question_mark")
        help_screen = await wait_for_screen(pilot, HelpScreen, what="help")
        rows = dict(row for _, section in help_screen.sections for row in section)
        assert rows["^a"].startswith("mark every task shown")
        assert rows["esc"].startswith("unmark every task")
        await pilot.press("escape")
        await pilot.press("ctrl+a")
        await pilot.press("ctrl+p")
        palette = await wait_for_screen(pilot, CommandPalette, what="the palette")
        palette.query_one(Input).value = "mark all"

        def shown() -> str:
            return " ".join(str(o.prompt) for o in palette.query_one(
                "CommandList").options)  # type: ignore[attr-defined]

        await wait_until(pilot, lambda: "Unmark all" in shown(), what="the palette's match")


async def _answer(pilot: Pilot[Any], app: FleetApp, screen: type, key: str) -> str:
    """Press ``key`` and return the title and body of the dialog it opens."""
    await pilot.press(key)
    dialog = await wait_for_screen(pilot, screen, what=f"{screen.__name__} composed")
    return " ".join(str(w.render()) for w in dialog.query(".dialog-title, .dialog-body"))


async def test_bulk_kill_retry_discard_act_on_exactly_the_marked_set(
        fleet: Fleet, git_repo: Path) -> None:
    ids = submit(fleet, git_repo, 6)
    app = make_app(fleet, git_repo)
    async with app.run_test(size=SIZE) as pilot:
        table = await listed(pilot, app, ids)
        rows = table.keys
        # rows 0, 2 and 3: space, down, space, space
        press_at_once(app, "space", "down", "space", "space")
        await wait_until(pilot, lambda: table.cursor_row == 4, what="the presses handled")
        chosen = {rows[0], rows[2], rows[3]}
        others = set(ids) - chosen
        assert app.main.task_list.marked == chosen
        said = await _answer(pilot, app, ConfirmScreen, "k")
        assert "Kill 3 tasks?" in said
        assert all(t in said for t in chosen) and not any(t in said for t in others)
        await pilot.press("y")
        await wait_until(pilot, lambda: all(fleet.get_task(t).state == TaskState.KILLED
                                            for t in chosen), what="the three killed")
        assert all(fleet.get_task(t).state == TaskState.QUEUED for t in others)
        await wait_until(pilot, lambda: any("Killed 3 tasks" in f"{t} {m}"
                                            for _, t, m in app.toasts), what="the count")
        await wait_until(pilot, lambda: not app.main.task_list.marked, what="the marks cleared")

        # retry two of the killed ones
        killed = sorted(chosen)
        await wait_until(pilot, lambda: all(app.main.task_list.tasks[t].state == TaskState.KILLED
                                            for t in chosen), what="the list to update")
        for task_id in killed[:2]:
            table.select_key(task_id)
            await pilot.press("space")
        assert app.main.task_list.marked == set(killed[:2])
        said = await _answer(pilot, app, ChoiceScreen, "r")
        assert "Retry 2 tasks?" in said
        await pilot.press("f")
        await wait_until(pilot, lambda: all(fleet.get_task(t).state == TaskState.QUEUED
                                            for t in killed[:2]), what="two retried")
        assert fleet.get_task(killed[2]).state == TaskState.KILLED
        await wait_until(pilot, lambda: any("Queued 2 tasks again" in f"{t} {m}"
                                            for _, t, m in app.toasts), what="the count")

        # discard the last killed one and one queued: discard stops the queued one first
        await wait_until(pilot, lambda: app.main.task_list.tasks[killed[0]].state
                         == TaskState.QUEUED, what="the list to update")
        keep = sorted(others)[0]
        table.select_key(killed[2])
        await pilot.press("space")
        table.select_key(keep)
        await pilot.press("space")
        assert app.main.task_list.marked == {killed[2], keep}
        await wait_until(pilot, lambda: app.main.check_action("kill", ()) is False,
                         what="kill to be off for a mixed set")
        said = await _answer(pilot, app, ConfirmScreen, "d")
        assert "Discard 2 tasks?" in said
        await pilot.press("y")
        await wait_until(pilot, lambda: fleet.get_task(killed[2]).state == TaskState.DISCARDED
                         and fleet.get_task(keep).state == TaskState.DISCARDED,
                         what="the two discarded")
        untouched = set(ids) - {killed[2], keep}
        assert all(fleet.get_task(t).state in (TaskState.QUEUED, TaskState.KILLED)
                   for t in untouched)
        await wait_until(pilot, lambda: any("Discarded 2 tasks" in f"{t} {m}"
                                            for _, t, m in app.toasts), what="the count")


def _finished_with_change(fleet: Fleet, repo: Path, task_id: str, name: str) -> None:
    """What a worker leaves behind: a worktree on the task's branch with a new file."""
    from fleet_tui.vcs import git as gitmod

    task = fleet.get_task(task_id)
    info = gitmod.create_worktree(repo, task.id, task.base_commit)
    (info.path / name).write_text(f"{name} from {task_id}\n")
    fleet.store.update_task(task_id, state=TaskState.SUCCEEDED, worktree=info.path,
                            branch=info.branch, verdict="ok", finished_at=time.time(),
                            started_at=time.time() - 5)


async def test_bulk_merge_lands_exactly_the_marked_set(fleet: Fleet, git_repo: Path) -> None:
    ids = submit(fleet, git_repo, 4)
    for i, task_id in enumerate(ids):
        _finished_with_change(fleet, git_repo, task_id, f"file{i}.txt")
    app = make_app(fleet, git_repo)
    async with app.run_test(size=SIZE) as pilot:
        table = await listed(pilot, app, ids)
        rows = table.keys
        press_at_once(app, "down", "space", "space")
        await wait_until(pilot, lambda: table.cursor_row == 3, what="the presses handled")
        chosen = {rows[1], rows[2]}
        assert app.main.task_list.marked == chosen
        await wait_until(pilot, lambda: app.main.check_action("merge", ()) is True,
                         what="merge to apply")
        said = await _answer(pilot, app, MergeScreen, "m")
        # several marked tasks land through the merge queue
        assert "Land 2 tasks through the merge queue?" in said
        items = " ".join(str(w.render()) for w in app.screen.query(".merge-item"))
        assert all(t in items for t in chosen) and not any(t in items for t in
                                                           set(ids) - chosen)
        await pilot.press("y")
        await wait_until(pilot, lambda: any("Queued 2 tasks to land" in f"{t} {m}"
                                            for _, t, m in app.toasts), what="the count")
        await wait_until(pilot, lambda: all(fleet.get_task(t).state == TaskState.MERGED
                                            for t in chosen), what="the two merged",
                         timeout=60)
        assert all(fleet.get_task(t).state == TaskState.SUCCEEDED
                   for t in set(ids) - chosen)
    landed = set(git(git_repo, "ls-tree", "--name-only", "main").split())
    merged_files = {f"file{ids.index(t)}.txt" for t in chosen}
    assert merged_files <= landed
    assert not ({f"file{i}.txt" for i in range(4)} - merged_files) & landed


async def test_bulk_merge_leaves_out_a_task_that_cannot_land_and_queues_the_others(
        fleet: Fleet, git_repo: Path) -> None:
    """One marked task's preview fails (its worktree deleted by hand): before, the merge
    dialog failed for every marked task (one error toast, nothing landed). Its row says
    why it cannot land, the others are queued, and the toast names the one left out."""
    ids = submit(fleet, git_repo, 3)
    for i, task_id in enumerate(ids):
        _finished_with_change(fleet, git_repo, task_id, f"file{i}.txt")
    broken = ids[1]
    worktree = fleet.get_task(broken).worktree
    assert worktree is not None
    shutil.rmtree(worktree)  # by hand, outside fleet-tui
    landable = set(ids) - {broken}
    app = make_app(fleet, git_repo)
    async with app.run_test(size=SIZE) as pilot:
        await listed(pilot, app, ids)
        await pilot.press("ctrl+a")
        assert app.main.task_list.marked == set(ids)
        await wait_until(pilot, lambda: app.main.check_action("merge", ()) is True,
                         what="merge to apply")
        said = await _answer(pilot, app, MergeScreen, "m")
        assert "Land 2 of 3 marked tasks through the merge queue?" in said
        items = {w.id: str(w.render()) for w in app.screen.query(".merge-item")}
        assert set(items) == {f"merge-item-{t}" for t in ids}
        row = items[f"merge-item-{broken}"]
        assert "✗ cannot land:" in row and "is missing" in row and "deleted outside" in row
        assert all("✗" not in items[f"merge-item-{t}"] for t in landable)
        button = app.screen.query_one("#yes", Button)
        assert not button.disabled
        await pilot.press("y")
        await wait_until(pilot, lambda: any("Queued 2 of 3 tasks to land" in t
                                            for _, t, _m in app.toasts), what="the toast")
        toast = next(m for _, t, m in app.toasts if "Queued 2 of 3" in t)
        assert f"Left out (still marked): {broken}: " in toast and "is missing" in toast
        assert app.main.task_list.marked == {broken}
        await wait_until(pilot, lambda: all(fleet.get_task(t).state == TaskState.MERGED
                                            for t in landable), what="the two merged",
                         timeout=60)
        assert fleet.get_task(broken).state == TaskState.SUCCEEDED
        assert app.errors == []
    landed = set(git(git_repo, "ls-tree", "--name-only", "main").split())
    assert {"file0.txt", "file2.txt"} <= landed and "file1.txt" not in landed


async def test_merge_dialog_of_tasks_that_none_can_land_offers_no_merge(
        fleet: Fleet, git_repo: Path) -> None:
    """Every marked task fails its preview: each row says why, and the dialog's button is
    off (y says why instead of queuing nothing)."""
    ids = submit(fleet, git_repo, 2)
    for i, task_id in enumerate(ids):
        _finished_with_change(fleet, git_repo, task_id, f"file{i}.txt")
        worktree = fleet.get_task(task_id).worktree
        assert worktree is not None
        shutil.rmtree(worktree)
    app = make_app(fleet, git_repo)
    async with app.run_test(size=SIZE) as pilot:
        await listed(pilot, app, ids)
        await pilot.press("ctrl+a")
        await wait_until(pilot, lambda: app.main.check_action("merge", ()) is True,
                         what="merge to apply")
        said = await _answer(pilot, app, MergeScreen, "m")
        assert "None of the 2 marked tasks can land" in said
        items = [str(w.render()) for w in app.screen.query(".merge-item")]
        assert len(items) == 2 and all("✗ cannot land:" in r for r in items)
        assert app.screen.query_one("#yes", Button).disabled
        await pilot.press("y")
        await wait_until(pilot, lambda: any("None of these tasks can land now" in m
                                            for _, _t, m in app.toasts), what="y's answer")
        assert isinstance(app.screen, MergeScreen)  # still open: nothing to queue
        await pilot.press("escape")
        assert all(fleet.get_task(t).state == TaskState.SUCCEEDED for t in ids)
        assert app.errors == []


async def test_merge_dialog_of_one_task_that_cannot_land_says_why(
        fleet: Fleet, git_repo: Path) -> None:
    """The selected task's worktree was deleted by hand: the dialog opens (before: an
    error toast "Failed: previewing the merge"), its row says why, and nothing merges."""
    task_id = submit(fleet, git_repo, 1)[0]
    _finished_with_change(fleet, git_repo, task_id, "file0.txt")
    worktree = fleet.get_task(task_id).worktree
    assert worktree is not None
    shutil.rmtree(worktree)
    app = make_app(fleet, git_repo)
    async with app.run_test(size=SIZE) as pilot:
        await listed(pilot, app, [task_id])
        await wait_until(pilot, lambda: app.main.check_action("merge", ()) is True,
                         what="merge to apply")
        said = await _answer(pilot, app, MergeScreen, "m")
        assert f"Merge fleet/{task_id}" in said
        row = str(app.screen.query_one(f"#merge-item-{task_id}").render())
        assert "✗ cannot land:" in row and "is missing" in row
        assert app.screen.query_one("#yes", Button).disabled
        assert not app.screen.query("#merge-message")  # no commit for it to name
        await pilot.press("y")
        await wait_until(pilot, lambda: any("It cannot land now" in m
                                            for _, _t, m in app.toasts), what="y's answer")
        assert isinstance(app.screen, MergeScreen)
        await pilot.press("escape")
        assert fleet.get_task(task_id).state == TaskState.SUCCEEDED
        assert app.errors == []
