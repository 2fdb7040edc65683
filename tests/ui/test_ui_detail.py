"""The whole tool call and search in the panel, driven with the Pilot.

No claude here: a real CLI recording (tests/support/fixtures/stream-json/root_bash_output: a Bash
step that fails with exit 3, then one that prints 41 lines) in a real attempt folder, the
real store and engine, a real worktree for the diff.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from test_ui_support import wait_for_screen, wait_until
from textual.widgets import Input

from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store, TaskState
from fleet_tui.ui.app import FleetApp
from fleet_tui.ui.screens.launch import LaunchScreen
from fleet_tui.ui.screens.modals import ToolCallScreen
from fleet_tui.ui.widgets.diff_view import DiffLines
from fleet_tui.ui.widgets.line_view import SearchBar, TextLines
from fleet_tui.ui.widgets.stream_view import StreamView

FIXTURE = (Path(__file__).resolve().parents[1] / "support" / "fixtures" / "stream-json"
           / "root_bash_output")
SIZE = (120, 36)


@pytest.fixture
def app(git_repo: Path, tmp_path: Path) -> FleetApp:
    """One succeeded task: its attempt is the recording, its worktree has a change."""
    store = Store(tmp_path / "fleet.db")
    now = time.time()
    worktree = git_repo / ".fleet-work" / "b4sh01"
    subprocess.run(["git", "worktree", "add", "-q", "-b", "fleet/b4sh01", str(worktree)],
                   cwd=git_repo, check=True)
    (worktree / "src" / "app.py").write_text("def main():\n    return 2  # fixed\n")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=git_repo, check=True,
                          capture_output=True, text=True).stdout.strip()
    store.create_task(task_id="b4sh01", prompt="Fix the failing test", repo=git_repo,
                      now=now - 60, title="Fix the failing test", state=TaskState.SUCCEEDED,
                      base_branch="main", base_commit=head, worktree=worktree,
                      started_at=now - 50, finished_at=now - 10, verdict="ok",
                      endpoint="default")
    folder = tmp_path / "logs" / "1"
    folder.mkdir(parents=True)
    (folder / "events.jsonl").write_bytes((FIXTURE / "stdout.jsonl").read_bytes())
    store.add_attempt("b4sh01", now=now - 50, dir=folder, finished_at=now - 10,
                      events_path=folder / "events.jsonl", verdict="ok")
    return FleetApp(Fleet(load_settings(), store), repo=git_repo, default_base="main",
                    run_scheduler=False, bell=False, poll_interval=0.1, diff_interval=60)


def _view(app: FleetApp) -> StreamView:
    return app.main.query_one(StreamView)


async def _stream_ready(pilot: object, app: FleetApp) -> StreamView:
    view = _view(app)
    await wait_until(pilot, lambda: any("(+40 lines: x)" in line  # type: ignore[arg-type]
                                        for line in view.plain_lines()), what="the stream")
    return view


def _row(view: StreamView, text: str) -> int:
    return next(i for i, line in enumerate(view.plain_lines()) if text in line)


async def test_enter_on_a_result_shows_the_whole_output_and_the_exit_status(
        app: FleetApp) -> None:
    async with app.run_test(size=SIZE) as pilot:
        view = await _stream_ready(pilot, app)
        view.focus()
        view.move_cursor(_row(view, "(+40 lines: x)"))
        await pilot.press("enter")
        screen = await wait_for_screen(pilot, ToolCallScreen, what="the tool call")
        lines = screen.lines
        assert lines[0] == "── input ──" and lines[1].startswith("$ printf '%s'")
        output = lines[lines.index("── output ──") + 1:]
        assert len(output) == 41 and "40 passed in 0.12s" in output[-1]
        status = str(screen.query_one("#toolcall-status").render())
        assert status == "exit 0 · 41 lines of output"
        # search inside it: / then text; enter keeps it; n moves on; escape ends it
        await pilot.press("slash", *"test_case_3")
        bar = screen.query_one(SearchBar)
        lines_view = screen.query_one(TextLines)
        # ten names in the command (the input), ten in what it printed
        await wait_until(pilot, lambda: lines_view.search_status == "1/20", what="matches")
        await pilot.press("enter", "n")
        assert lines_view.search_status == "2/20" and lines_view.has_focus
        assert "test_case_31" in lines_view.row_text(lines_view.matches[1])
        assert "test_case_39 PASSED" in lines_view.row_text(lines_view.matches[-1])
        await pilot.press("N", "N")
        assert lines_view.search_status == "20/20"  # wraps around
        await pilot.press("escape")
        assert lines_view.search_status == "" and not bar.display
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, ToolCallScreen),
                         what="the detail to close")


async def test_x_on_a_failed_step_and_on_a_line_without_a_call(app: FleetApp) -> None:
    async with app.run_test(size=SIZE) as pilot:
        view = await _stream_ready(pilot, app)
        # x works from the task list too: on the stream's cursor line (the failed step's)
        view.move_cursor(_row(view, "Exit code 3"))
        app.main.table.focus()
        await pilot.press("x")
        screen = await wait_for_screen(pilot, ToolCallScreen, what="the failed step")
        assert str(screen.query_one("#toolcall-status").render()) == \
            "error, exit 3 · 4 lines of output"
        assert screen.lines[-1] == "E   assert 2 == 1"
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, ToolCallScreen),
                         what="the detail to close")
        # the session line belongs to no call: said, nothing opens
        view.move_cursor(0)
        await pilot.press("x")
        await wait_until(pilot, lambda: any("No tool call" in title
                                            for _, title, _ in app.toasts), what="a toast")
        assert not isinstance(app.screen, ToolCallScreen)


async def test_search_in_the_stream_then_n_is_new_again(app: FleetApp) -> None:
    async with app.run_test(size=SIZE) as pilot:
        view = await _stream_ready(pilot, app)
        await pilot.press("ctrl+f", *"bash")
        bar = app.main.query_one("#stream-search", SearchBar)
        await wait_until(pilot, lambda: view.search_status == "1/2", what="two matches")
        assert bar.display and isinstance(app.focused, Input)
        first = view.cursor
        assert "Bash" in view.row_text(first) and not view.follow
        await pilot.press("enter", "n")
        assert view.search_status == "2/2" and view.cursor > first
        await pilot.press("escape")  # in the view: ends the search
        assert view.search_status == "" and not bar.display and view.has_focus
        # with no search, n is the panel's "new task" again
        await pilot.press("n")
        await wait_for_screen(pilot, LaunchScreen, what="the launch form")


async def test_search_in_the_diff(app: FleetApp) -> None:
    async with app.run_test(size=SIZE) as pilot:
        await _stream_ready(pilot, app)
        await pilot.press("2")
        diff = app.main.query_one(DiffLines)
        await wait_until(pilot, lambda: any("return 2" in line for line in diff.lines),
                         what="the diff")
        diff.focus()
        await pilot.press("slash", *"RETURN")
        await wait_until(pilot, lambda: diff.search_status == "1/2", what="the matches")
        assert [diff.row_text(i).strip() for i in diff.matches] == [
            "-    return 1", "+    return 2  # fixed"]
        bar = app.main.query_one("#diff-search", SearchBar)
        assert bar.display
        await pilot.press("enter", "n")
        assert diff.search_status == "2/2"


async def test_the_setup_step_reads_as_a_step_and_x_shows_its_whole_output(
        app: FleetApp) -> None:
    """The lines the runner writes before claude starts (a failing setup here) read as one
    step in the stream; x on it shows the whole setup.log."""
    fleet = app._fleet_given
    assert fleet is not None
    attempt = fleet.attempts("b4sh01")[-1]
    folder = Path(attempt.dir or "")
    output = "".join(f"fetching package {i}\n" for i in range(30)) + "no network\n"
    (folder / "setup.log").write_text(output)
    lines = [
        {"type": "system", "subtype": "fleet_setup", "phase": "start",
         "command": "npm ci", "include": [".env"]},
        {"type": "system", "subtype": "fleet_setup", "phase": "end", "command": "npm ci",
         "exit_code": 7, "output": output[-200:], "copied": [".env"],
         "skipped": ["key.env: it holds the API key"], "seconds": 2.5},
    ]
    import json

    (folder / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    async with app.run_test(size=SIZE) as pilot:
        view = _view(app)
        await wait_until(pilot, lambda: len(view.plain_lines()) == 2, what="the setup step")
        start, end = view.plain_lines()
        assert start == "⚙ setup npm ci"
        assert end.startswith("  └ ✗ setup failed (exit 7): no network · copied .env · "
                              "skipped key.env: it holds the API key")
        view.move_cursor(1)
        await pilot.press("x")
        screen = await wait_for_screen(pilot, ToolCallScreen, what="the setup detail")
        shown = screen.lines
        assert shown[:2] == ["── setup ──", "$ npm ci"]
        assert "copied  .env" in shown and "skipped key.env: it holds the API key" in shown
        assert shown[-31:] == output.splitlines()  # the whole output, not the stream's tail
        assert str(screen.query_one("#toolcall-status").render()) == "exit 7 · 2.5 s"
