"""Snapshots of every screen at 80x24 and 160x48, from fixed data.

Deterministic by construction: a store filled with fixed ids and timestamps, an injected
clock, finished (and one "running") attempts whose events files are real CLI recordings
from tests/support/fixtures/stream-json, no scheduler and no live process, cursor blink off.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, TextArea

from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store, TaskState
from fleet_tui.ui.app import FleetApp
from fleet_tui.ui.screens.main import MainScreen
from fleet_tui.ui.widgets.diff_view import DiffView
from fleet_tui.ui.widgets.stream_view import StreamView
from fleet_tui.ui.widgets.task_table import TaskTable

NOW = 1_800_000_000.0
SIZES = [(80, 24), (160, 48)]
FIXTURES = Path(__file__).resolve().parents[1] / "support" / "fixtures" / "stream-json"


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def _events(store: Store, task_id: str, sample: str, logs: Path, *, keep: int | None = None,
            finished: bool = True, **fields: Any) -> None:
    """An attempt whose events file is a real recording (optionally cut short)."""
    attempt_dir = logs / task_id / "1"
    attempt_dir.mkdir(parents=True)
    lines = (FIXTURES / sample / "stdout.jsonl").read_text().splitlines(keepends=True)
    (attempt_dir / "events.jsonl").write_text("".join(lines[:keep] if keep else lines))
    (attempt_dir / "cage.json").write_text("{}")  # a caged worker's, as by default
    store.add_attempt(task_id, now=NOW - 100, dir=attempt_dir,
                      events_path=attempt_dir / "events.jsonl",
                      finished_at=NOW - 20 if finished else None, **fields)


def build_fleet(repo: Path, tmp: Path) -> Fleet:
    """A fleet in every state: stalled, failed, succeeded, running, waiting, queued,
    merged. The succeeded task has a real worktree with a diff."""
    store = Store(tmp / "fleet.db")
    logs = tmp / "logs"
    common = dict(repo=repo, base_branch="main", base_commit="0" * 40, model="main",
                  endpoint="default")
    store.create_task(task_id="k3v9qa", prompt="Refactor the parser", now=NOW - 900,
                      title="Refactor the parser into modules", state=TaskState.STALLED,
                      started_at=NOW - 700, turns=9, input_tokens=88_000, output_tokens=4_100,
                      last_tool="Bash pytest -q tests/test_parser.py", added_lines=140,
                      deleted_lines=96, message="no output for 300 s", **common)
    _events(store, "k3v9qa", "root_sandbox_stream", logs, keep=5, finished=False)
    store.create_task(task_id="f8w2zc", prompt="Add retries", now=NOW - 800,
                      title="Add retries to the HTTP client", state=TaskState.FAILED,
                      started_at=NOW - 300, finished_at=NOW - 290, turns=0,
                      verdict="overload", message="API Error: 529 Overloaded", **common)
    _events(store, "f8w2zc", "root_529_retries2", logs, verdict="overload")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()
    worktree = repo / ".fleet-work" / "s4n7ud"
    _git(repo, "worktree", "add", "-q", "-b", "fleet/s4n7ud", str(worktree))
    (worktree / "src" / "app.py").write_text(
        "def main():\n    \"\"\"Entry point.\"\"\"\n    return 2\n")
    (worktree / "hello.txt").write_text("hello\n")
    store.create_task(task_id="s4n7ud", prompt="Create hello.txt", now=NOW - 700,
                      title="Create hello.txt and fix main", state=TaskState.SUCCEEDED,
                      started_at=NOW - 200, finished_at=NOW - 120, turns=3,
                      input_tokens=31_200, output_tokens=912, last_tool="Bash ls",
                      added_lines=3, deleted_lines=1, verdict="ok",
                      message="finished in 3 turns", worktree=worktree,
                      **{**common, "base_commit": head})
    _events(store, "s4n7ud", "root_529_then_ok", logs, verdict="ok", turns=3)
    store.create_task(task_id="r2p5xe", prompt="Write docs", now=NOW - 600,
                      title="Document the public API", state=TaskState.RUNNING,
                      started_at=NOW - 95, turns=2, input_tokens=20_400, output_tokens=380,
                      last_tool="Bash ls", added_lines=12, deleted_lines=0, **common)
    _events(store, "r2p5xe", "nonroot_stream", logs, keep=6, finished=False)
    store.create_task(task_id="w6h1mb", prompt="Bump versions", now=NOW - 500,
                      title="Bump dependency versions", state=TaskState.WAITING,
                      verdict="quota", not_before=NOW + 42, message="429: retrying", **common)
    store.create_task(task_id="q7j3tt", prompt="Add a CLI flag", now=NOW - 400,
                      title="Add a --verbose flag", state=TaskState.QUEUED, **common)
    store.create_task(task_id="m1c8ee", prompt="Fix typo", now=NOW - 1000,
                      title="Fix a typo in the README", state=TaskState.MERGED,
                      started_at=NOW - 1000, finished_at=NOW - 950, turns=1,
                      input_tokens=9_000, output_tokens=120, added_lines=1, deleted_lines=1,
                      **common)
    return Fleet(load_settings(), store, clock=lambda: NOW)


@pytest.fixture
def snapshot_app(git_repo: Path, tmp_path: Path) -> FleetApp:
    fleet = build_fleet(git_repo, tmp_path)
    return FleetApp(fleet, repo=git_repo, default_base="main", clock=lambda: NOW,
                    run_scheduler=False, bell=False, poll_interval=0.5, diff_interval=60)


async def _settle(pilot: Pilot[Any], predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the screen did not settle"
        await pilot.pause(0.05)
    await pilot.pause(0.2)


def _no_blink(app: FleetApp) -> None:
    for widget in app.screen.query("Input, TextArea"):
        assert isinstance(widget, Input | TextArea)
        widget.cursor_blink = False


async def _main_ready(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, FleetApp)
    main = app.main
    # the screen's nested widgets may still be mounting when the pilot starts
    # seven tasks, the merged one hidden until H
    await _settle(pilot, lambda: any(len(t.keys) == 6 for t in main.query(TaskTable))
                  and main.query_one(StreamView).row_count() >= 4)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_main_screen(snap_compare: Any, snapshot_app: FleetApp, size: tuple[int, int]) -> None:
    """Attention first: stalled, failed (its stream: two API retries, then the error)."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await _main_ready(pilot)
        main = snapshot_app.main
        main.query_one(TaskTable).select_key("f8w2zc")
        await _settle(pilot, lambda: main.task_list.selected_id == "f8w2zc"
                      and "API Error" in "".join(main.query_one(StreamView).plain_lines()))

    assert snap_compare(snapshot_app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_marked_rows(snap_compare: Any, snapshot_app: FleetApp, size: tuple[int, int]) -> None:
    """Two rows marked with space (the ● column, "2 marked" in the header), the cursor
    moved on below them, and the key bar offering to unmark."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await _main_ready(pilot)
        await pilot.press("space", "down", "space")
        main = snapshot_app.main
        await _settle(pilot, lambda: len(main.task_list.marked) == 2
                      and main.task_list.selected_id == main.query_one(TaskTable).selected_key)

    assert snap_compare(snapshot_app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_diff_view(snap_compare: Any, snapshot_app: FleetApp, size: tuple[int, int]) -> None:
    """The succeeded task's diff: a modified and an untracked file."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await _main_ready(pilot)
        app = snapshot_app
        app.main.query_one(TaskTable).select_key("s4n7ud")
        await pilot.press("2")
        diff = app.main.query_one(DiffView)
        await _settle(pilot, lambda: diff.prepared is not None
                      and len(diff.prepared.diff.files) == 2)

    assert snap_compare(snapshot_app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_diff_viewed_file(snap_compare: Any, snapshot_app: FleetApp,
                          size: tuple[int, int]) -> None:
    """hello.txt marked viewed (v: ✓), then ] to src/app.py, whose changed line
    shows the changed word on its own background and the code in syntax colours."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await _main_ready(pilot)
        app = snapshot_app
        app.main.query_one(TaskTable).select_key("s4n7ud")
        await pilot.press("2")
        diff = app.main.query_one(DiffView)
        await _settle(pilot, lambda: diff.prepared is not None
                      and len(diff.prepared.diff.files) == 2)
        await pilot.press("right_square_bracket", "v", "right_square_bracket")
        await _settle(pilot, lambda: diff.selected == "src/app.py"
                      and diff.view_mark("hello.txt") == "viewed")

    assert snap_compare(snapshot_app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_launch_form(snap_compare: Any, snapshot_app: FleetApp, size: tuple[int, int]) -> None:
    """The form with a prompt typed and one inline error (a non-number)."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await _main_ready(pilot)
        await pilot.press("n")
        await _settle(pilot, lambda: bool(snapshot_app.screen.query("#prompt")))
        _no_blink(snapshot_app)
        await pilot.press(*"Add a health check endpoint", "enter", *"with a test")
        snapshot_app.screen.query_one("#max-turns", Input).value = "lots"
        await pilot.pause(0.2)

    assert snap_compare(snapshot_app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_confirm_modal(snap_compare: Any, snapshot_app: FleetApp,
                       size: tuple[int, int]) -> None:
    """Discard asks first and names the task."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await _main_ready(pilot)
        snapshot_app.main.query_one(TaskTable).select_key("s4n7ud")
        await _settle(pilot, lambda: snapshot_app.main.task_list.selected_id == "s4n7ud")
        await pilot.press("d")
        await _settle(pilot, lambda: not isinstance(snapshot_app.screen, MainScreen))

    assert snap_compare(snapshot_app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_help_screen(snap_compare: Any, snapshot_app: FleetApp, size: tuple[int, int]) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        await _main_ready(pilot)
        await pilot.press("question_mark")
        await _settle(pilot, lambda: not isinstance(snapshot_app.screen, MainScreen))

    assert snap_compare(snapshot_app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_tool_call_detail(snap_compare: Any, snapshot_app: FleetApp,
                          size: tuple[int, int]) -> None:
    """x on a tool call's line: its whole input and output, the status line, the hint."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await _main_ready(pilot)
        main = snapshot_app.main
        main.query_one(TaskTable).select_key("s4n7ud")
        view = main.query_one(StreamView)
        await _settle(pilot, lambda: main.task_list.selected_id == "s4n7ud"
                      and any(line.startswith("$ Bash ls") for line in view.plain_lines()))
        view.move_cursor(next(i for i, line in enumerate(view.plain_lines())
                              if line.startswith("$ Bash ls")))
        await pilot.press("x")
        await _settle(pilot, lambda: type(snapshot_app.screen).__name__ == "ToolCallScreen")

    assert snap_compare(snapshot_app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_stream_search(snap_compare: Any, snapshot_app: FleetApp,
                       size: tuple[int, int]) -> None:
    """ctrl+f in the stream: the search bar with its count, the matches highlighted, the
    cursor on the current one."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await _main_ready(pilot)
        main = snapshot_app.main
        main.query_one(TaskTable).select_key("s4n7ud")
        view = main.query_one(StreamView)
        await _settle(pilot, lambda: main.task_list.selected_id == "s4n7ud"
                      and any("hello" in line for line in view.plain_lines()))
        await pilot.press("ctrl+f", *"hello", "enter")
        await _settle(pilot, lambda: view.search_status.startswith("1/"))
        _no_blink(snapshot_app)

    assert snap_compare(snapshot_app, terminal_size=size, run_before=run_before)


def test_fixture_samples_exist() -> None:
    for sample in ("root_529_retries2", "root_529_then_ok", "nonroot_stream"):
        assert (FIXTURES / sample / "stdout.jsonl").is_file(), sample
    assert shutil.which("git")


def test_the_list_marks_a_task_that_ran_uncaged(git_repo: Path, tmp_path: Path) -> None:
    """A task whose attempt ran without the cage (no cage.json in its folder: cage = "off")
    is marked `[uncaged]` in the panel's list, as `ls` marks it; the caged ones are not."""
    fleet = build_fleet(git_repo, tmp_path)
    (tmp_path / "logs" / "s4n7ud" / "1" / "cage.json").unlink()
    app = FleetApp(fleet, repo=git_repo, default_base="main", clock=lambda: NOW,
                   run_scheduler=False, bell=False, poll_interval=0.5, diff_interval=60)

    async def scenario() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            await _main_ready(pilot)
            table = app.main.query_one(TaskTable)
            await _settle(pilot, lambda: "[uncaged]" in _title(table, "s4n7ud"))
            assert _title(table, "s4n7ud").startswith("[uncaged] Create hello.txt")
            for caged in ("k3v9qa", "f8w2zc", "r2p5xe", "w6h1mb", "q7j3tt"):
                assert "[uncaged]" not in _title(table, caged), caged

    asyncio.run(scenario())


def _title(table: TaskTable, task_id: str) -> str:
    keys = [key for key, _label, _width in table._columns()]
    return table.get_row(task_id)[keys.index("title")].plain
