"""The panel at scale: a thousand tasks, a long events file, the engine made after the first
frame. Real store, real engine, real recordings of claude's stream."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from test_ui_snapshots import FIXTURES, NOW, build_fleet
from textual.pilot import Pilot

from fleet_tui.engine.fleet import Fleet, FleetError
from fleet_tui.execution.worker.attemptlog import AttemptLog
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store, TaskState
from fleet_tui.ui.app import FleetApp
from fleet_tui.ui.widgets.stream_pane import TAIL_BYTES
from fleet_tui.ui.widgets.stream_view import StreamView
from fleet_tui.ui.widgets.task_table import TaskTable


async def _until(pilot: Pilot[Any], test: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not test():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.02)


def test_status_from_the_task_list_is_the_engines(git_repo: Path, tmp_path: Path) -> None:
    """One read of the task list gives what Fleet.status() reads the store again for."""
    fleet = build_fleet(git_repo, tmp_path)
    derived = fleet.status(fleet.list_tasks())
    assert derived == fleet.status()
    assert derived.cooldown_until == NOW + 42 and derived.running == 2


def test_tail_start_is_a_line_start_within_the_tail(tmp_path: Path) -> None:
    """Where the stream pane starts reading an attempt (AttemptLog.tail_start): whole lines,
    whatever the window."""
    log = AttemptLog(tmp_path)
    lines = [b"a" * 5 + b"\n", b"b" * 50 + b"\n", b"c" * 3 + b"\n", b"d" * 4 + b"\n"]
    log.events.write_bytes(b"".join(lines))
    tail_start = log.tail_start
    starts = [0, 6, 57, 61, 66]
    assert tail_start(10) == 57  # "ccc\n" and "dddd\n" fit in the last 10 bytes
    assert tail_start(100) == 0
    assert tail_start(3) == 61  # inside the last line: from its start
    assert tail_start(20) == 57
    assert tail_start(20, end=57) == 6  # the long line covers the window: its start
    for end in starts[1:]:
        for tail in range(1, 70):
            assert tail_start(tail, end=end) in starts[:starts.index(end)]
    assert AttemptLog(tmp_path / "missing").tail_start(10) == 0


def _many_tasks(tmp_path: Path, repo: Path, count: int) -> Fleet:
    store = Store(tmp_path / "fleet.db")
    # tasks the list shows (merged and discarded ones are hidden until H)
    states = [TaskState.KILLED, TaskState.SUCCEEDED, TaskState.FAILED, TaskState.SUCCEEDED]
    for i in range(count):
        store.create_task(task_id=f"t{i:05d}", prompt=f"task {i}", repo=repo,
                          title=f"task number {i:04d}", state=states[i % len(states)],
                          base_branch="main", base_commit="0" * 40, model="main",
                          endpoint="default", now=NOW - 10_000 + i,
                          started_at=NOW - 10_000 + i, finished_at=NOW - 9_000 + i)
    return Fleet(load_settings(), store, clock=lambda: NOW)


async def test_a_thousand_tasks_list_at_once_and_scroll(git_repo: Path, tmp_path: Path) -> None:
    """Only the rows on screen are built; the cursor walks the whole list."""
    fleet = _many_tasks(tmp_path, git_repo, 1000)
    app = FleetApp(fleet, repo=git_repo, clock=lambda: NOW, run_scheduler=False, bell=False,
                   poll_interval=60, diff_interval=60)
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.main.query_one(TaskTable)
        await _until(pilot, lambda: table.row_count == 1000, "the list")
        assert len(table._strips) < 60  # a screenful, not a thousand rows
        first = table.selected_key
        await pilot.press("down", "down")
        await _until(pilot, lambda: app.main.task_list.selected_id == table.keys[2],
                     "the selection")
        assert table.selected_key != first and table.cursor_row == 2
        await pilot.press("end")
        await _until(pilot, lambda: app.main.task_list.selected_id == table.keys[-1],
                     "the last row")
        assert table.scroll_y > 900  # scrolled with the cursor
        row = table.get_row(table.keys[-1])
        assert table.keys[-1] in str(row[2])
        await pilot.press("home")
        await _until(pilot, lambda: table.cursor_row == 0 and table.scroll_y == 0, "the top")
        await pilot.click(TaskTable, offset=(20, 3))  # header + rows 0, 1: the third row
        await _until(pilot, lambda: app.main.task_list.selected_id == table.keys[2], "the click")


async def test_stream_shows_the_tail_then_reads_back(git_repo: Path, tmp_path: Path) -> None:
    """A long events file: the view starts with its end; `home` brings in the rest."""
    fleet = build_fleet(git_repo, tmp_path)
    task = fleet.get_task("s4n7ud")
    attempt = fleet.attempts(task.id)[-1]
    assert attempt.events_path is not None
    one_run = (FIXTURES / "root_529_then_ok" / "stdout.jsonl").read_bytes()
    repeats = 3 * TAIL_BYTES // len(one_run) + 1
    attempt.events_path.write_bytes(one_run * repeats)
    every = len(fleet.read_events(attempt)[0])
    app = FleetApp(fleet, repo=git_repo, clock=lambda: NOW, run_scheduler=False, bell=False,
                   poll_interval=60, diff_interval=60)
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.main.query_one(TaskTable)
        view = app.main.query_one(StreamView)
        await _until(pilot, lambda: task.id in table.keys, "the list")
        table.select_key(task.id)
        await _until(pilot, lambda: view.has_older and view.row_count() > 0, "the tail")
        tail_rows = view.total_rows
        assert view.plain_lines()[-1].startswith("■ done")  # the end of the file
        view.focus()
        await pilot.press("home")
        await _until(pilot, lambda: not view.has_older, "the older events")
        assert view.total_rows > tail_rows
        assert view.plain_lines()[0].startswith("● session started")
        assert view.scroll_y == 0
        assert sum(line.startswith("● session started") for line in view.plain_lines()) \
            == repeats
        assert every >= repeats


async def test_engine_is_made_after_the_first_frame(git_repo: Path, tmp_path: Path) -> None:
    """The main screen's first frame is painted while the engine is still being made: the
    maker waits for that frame (up to 10 s) before it builds the engine. Made before the
    first frame (in the constructor, or on the event loop), no frame can come while it
    waits, and the engine is done before the first frame."""
    from fleet_tui.ui.screens.main import MainScreen

    first_frame: list[float] = []
    painted = threading.Event()
    made: list[tuple[float, float, bool]] = []  # (called, returned, saw the frame first)

    def make() -> Fleet:
        called = time.monotonic()
        saw = painted.wait(10)
        fleet = build_fleet(git_repo, tmp_path)
        made.append((called, time.monotonic(), saw))
        return fleet

    app = FleetApp(make, repo=git_repo, clock=lambda: NOW, run_scheduler=False, bell=False,
                   poll_interval=0.1, diff_interval=60)
    display = app._display

    def record(screen: Any, renderable: Any) -> None:
        if renderable is not None and isinstance(screen, MainScreen) and not first_frame:
            first_frame.append(time.monotonic())
            painted.set()
        display(screen, renderable)

    app._display = record  # type: ignore[method-assign]
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.main.query_one(TaskTable)
        await _until(pilot, lambda: table.row_count == 6, "the list")  # the merged one hidden
        assert len(made) == 1 and app.fleet is not None
    (_, returned, saw), frame = made[0], first_frame[0]
    assert saw, "no frame was painted while the engine was being made"
    assert frame < returned, "the engine was made before the first frame"


async def test_an_engine_that_cannot_start_ends_the_panel_with_its_message(
        git_repo: Path) -> None:
    def make() -> Fleet:
        raise FleetError("the store is locked by a newer fleet-tui; upgrade")

    app = FleetApp(make, repo=git_repo, run_scheduler=True, bell=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await _until(pilot, lambda: app.return_code == 1, "the exit")
    assert app.return_code == 1
    assert app.errors and "newer fleet-tui" in app.errors[0]


async def test_the_hidden_widgets_are_not_mounted_once_the_panel_closes(
        git_repo: Path, monkeypatch: Any) -> None:
    """CI saw the engine's failure end the panel while the 50 ms timer that mounts the
    filter box fired: MountError on a list pane being taken down, a traceback instead of
    the message. The engine failing now closes the screen first, and mount_hidden checks
    each pane before it mounts into it."""
    import fleet_tui.ui.app as app_module

    started = threading.Event()

    def make() -> Fleet:
        started.set()
        raise FleetError("the store is locked by a newer fleet-tui; upgrade")

    # the timer fires in the same refresh as the exit (the order CI met)
    monkeypatch.setattr(app_module, "HIDDEN_DELAY", 0.001)
    app = FleetApp(make, repo=git_repo, run_scheduler=True, bell=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await _until(pilot, lambda: app.return_code == 1, "the exit")
        assert started.is_set()
        main = app.main
        assert main.closing
        await main.mount_hidden()  # a second call after the close: no mount, no error
        assert main._hidden_done.is_set()
    assert app.errors == ["the store is locked by a newer fleet-tui; upgrade"]


async def test_diff_reloads_when_the_selected_task_finishes(git_repo: Path,
                                                            tmp_path: Path) -> None:
    """A worker that writes and finishes between two timed refreshes: the state change
    alone brings the final diff (the timed refresh is set far away here)."""
    from fleet_tui.ui.widgets.diff_view import DiffView
    from fleet_tui.vcs import git as fgit

    store = Store(tmp_path / "fleet.db")
    info = fgit.create_worktree(git_repo, "dfin01")
    store.create_task(task_id="dfin01", prompt="write it", repo=git_repo, title="write it",
                      state=TaskState.RUNNING, base_branch="main",
                      base_commit=info.base_commit, branch=info.branch, worktree=info.path,
                      model="main", endpoint="default", now=NOW,
                      started_at=NOW)
    fleet = Fleet(load_settings(), store, clock=lambda: NOW)
    app = FleetApp(fleet, repo=git_repo, clock=lambda: NOW, run_scheduler=False, bell=False,
                   poll_interval=0.1, diff_interval=600)
    async with app.run_test(size=(120, 40)) as pilot:
        await _until(pilot, lambda: app.main.task_list.selected_id == "dfin01", "the selection")
        await pilot.press("2")
        diff = app.main.query_one(DiffView)
        await _until(pilot, lambda: diff.prepared is not None, "the first (empty) diff")
        assert diff.prepared is not None and diff.prepared.diff.files == []
        (info.path / "late.txt").write_text("written just before the end\n")
        assert store.update_task("dfin01", state=TaskState.SUCCEEDED, finished_at=NOW)
        await _until(pilot, lambda: diff.prepared is not None and any(
            f.path == "late.txt" for f in diff.prepared.diff.files), "the final diff")


async def test_no_git_diff_runs_while_the_diff_tab_is_hidden(git_repo: Path,
                                                             tmp_path: Path) -> None:
    """Selecting a task on the stream tab computes no diff; showing the diff tab does."""
    from fleet_tui.ui.widgets.diff_view import DiffView
    from fleet_tui.vcs import git as fgit

    store = Store(tmp_path / "fleet.db")
    info = fgit.create_worktree(git_repo, "hid001")
    (info.path / "new.txt").write_text("hello\n")
    store.create_task(task_id="hid001", prompt="p", repo=git_repo, title="p",
                      state=TaskState.SUCCEEDED, base_branch="main",
                      base_commit=info.base_commit, branch=info.branch, worktree=info.path,
                      model="main", endpoint="default", now=NOW,
                      started_at=NOW, finished_at=NOW)
    fleet = Fleet(load_settings(), store, clock=lambda: NOW)
    calls: list[str] = []
    real_diff = fleet.diff

    def counted_diff(task_id: str) -> Any:  # a spy: counts, then runs the real diff
        calls.append(task_id)
        return real_diff(task_id)

    fleet.diff = counted_diff  # type: ignore[method-assign]
    app = FleetApp(fleet, repo=git_repo, clock=lambda: NOW, run_scheduler=False, bell=False,
                   poll_interval=0.1, diff_interval=0.1)
    async with app.run_test(size=(120, 40)) as pilot:
        await _until(pilot, lambda: app.main.task_list.selected_id == "hid001", "the selection")
        await pilot.pause(0.5)  # several polls and diff ticks on the stream tab
        assert calls == []
        await pilot.press("2")
        diff = app.main.query_one(DiffView)
        await _until(pilot, lambda: diff.prepared is not None and any(
            f.path == "new.txt" for f in diff.prepared.diff.files), "the diff")
        assert calls == ["hid001"]
