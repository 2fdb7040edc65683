"""Reading a diff in the panel, driven with the Pilot: the file list's viewed
marks (kept with the file's digest: a file the worker changes again says so), `]` / `[`
along the files, `}` / `{` along the hunks and on into the next file, and the painted
rows' changed words and syntax classes.

No claude here: a real repository, a real task worktree with real changes, the real store
and engine's `diff`.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from test_ui_support import wait_until
from textual.pilot import Pilot

from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store, TaskState
from fleet_tui.ui.app import FleetApp
from fleet_tui.ui.formatting import ALL_FILES
from fleet_tui.ui.widgets.diff_view import DiffLines, DiffView, FileList

SIZE = (120, 30)
LONG = "src/long.py"


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def _long_module(changed: set[int]) -> str:
    return "".join(
        f"def step_{n}(value):\n    return value * {n + 1 if n in changed else n}\n\n"
        for n in range(60))


@pytest.fixture
def app(git_repo: Path, tmp_path: Path) -> FleetApp:
    """One succeeded task whose worktree changes three files: src/app.py (one line),
    src/long.py (three long hunks) and a new notes.md."""
    (git_repo / LONG).write_text(_long_module(set()))
    _git(git_repo, "add", "-A")
    _git(git_repo, "commit", "-q", "-m", "a long module")
    head = _git(git_repo, "rev-parse", "HEAD")
    worktree = git_repo / ".fleet-work" / "rd22ab"
    _git(git_repo, "worktree", "add", "-q", "-b", "fleet/rd22ab", str(worktree))
    (worktree / "src" / "app.py").write_text("def main():\n    return 2\n")
    (worktree / LONG).write_text(_long_module({*range(2, 10), *range(28, 36), *range(52, 58)}))
    (worktree / "notes.md").write_text("# notes\n")
    store = Store(tmp_path / "fleet.db")
    now = time.time()
    store.create_task(task_id="rd22ab", prompt="Change three files", repo=git_repo,
                      now=now - 60, title="Change three files", state=TaskState.SUCCEEDED,
                      base_branch="main", base_commit=head, worktree=worktree,
                      started_at=now - 50, finished_at=now - 10, verdict="ok",
                      endpoint="default")
    return FleetApp(Fleet(load_settings(), store), repo=git_repo, default_base="main",
                    run_scheduler=False, bell=False, poll_interval=0.1, diff_interval=60)


async def _diff_shown(pilot: Pilot[Any], app: FleetApp) -> DiffView:
    await wait_until(pilot, lambda: app.main.task_list.selected_id == "rd22ab", what="the task")
    await pilot.press("2")
    await wait_until(pilot, lambda: bool(app.main.query(DiffView)), what="the diff view")
    view = app.main.query_one(DiffView)
    await wait_until(pilot, lambda: view.prepared is not None
                     and len(view.prepared.diff.files) == 3, what="the diff")
    return view


def _label(view: DiffView, path: str) -> str:
    files = view.query_one(FileList)
    return str(files.get_option(path).prompt)


async def test_files_are_marked_viewed_until_they_change_again(app: FleetApp) -> None:
    async with app.run_test(size=SIZE) as pilot:
        view = await _diff_shown(pilot, app)
        paths = [f.path for f in view.prepared.diff.files]  # type: ignore[union-attr]
        assert paths == ["notes.md", "src/app.py", LONG]
        assert view.selected == ALL_FILES
        # ] and [ move along the file list (the keys stay on the task list)
        await pilot.press("right_square_bracket")
        assert view.selected == "notes.md"
        await pilot.press("right_square_bracket", "right_square_bracket")
        assert view.selected == LONG
        await pilot.press("right_square_bracket")  # the last file: nowhere further
        assert view.selected == LONG
        await pilot.press("left_square_bracket")
        assert view.selected == "src/app.py"
        assert "✓" not in _label(view, "src/app.py")
        await pilot.press("v")
        assert view.view_mark("src/app.py") == "viewed"
        assert _label(view, "src/app.py").startswith("M ✓ src/app.py")
        assert "1 viewed" in _label(view, ALL_FILES)
        await pilot.press("right_square_bracket", "v")
        assert view.view_mark(LONG) == "viewed"
        # the worker changes src/app.py again: its mark says so; long.py stays viewed
        worktree = app.main.task_list.tasks["rd22ab"].worktree
        assert worktree is not None
        (Path(worktree) / "src" / "app.py").write_text("def main():\n    return 3\n")
        app.main.diff.reload()
        await wait_until(pilot, lambda: view.view_mark("src/app.py") == "changed",
                         what="the changed mark")
        assert _label(view, "src/app.py").startswith("M ! src/app.py")
        assert view.view_mark(LONG) == "viewed" and "✓" in _label(view, LONG)
        # marking it again marks the file as it is now; v once more takes the mark off
        await pilot.press("left_square_bracket", "v")
        assert view.selected == "src/app.py" and view.view_mark("src/app.py") == "viewed"
        await pilot.press("v")
        assert view.view_mark("src/app.py") == "unviewed"


async def test_viewed_marks_outlive_the_panel(app: FleetApp) -> None:
    """v's marks are kept in the store: a new panel on the same store shows them, and one
    that changed since says so."""
    async with app.run_test(size=SIZE) as pilot:
        view = await _diff_shown(pilot, app)
        fleet = app.fleet
        assert fleet is not None
        await pilot.press("right_square_bracket", "right_square_bracket")
        assert view.selected == "src/app.py"
        await pilot.press("v", "right_square_bracket", "v")  # app.py and long.py
        await pilot.press("left_square_bracket", "left_square_bracket", "v", "v")  # notes:
        # marked and unmarked again
        assert [view.view_mark(p) for p in ("notes.md", "src/app.py", LONG)] == [
            "unviewed", "viewed", "viewed"]
        await wait_until(pilot, lambda: set(fleet.viewed_files("rd22ab")) == {
            "src/app.py", LONG}, what="the marks in the store")
    # the worker changes long.py while no panel runs
    worktree = fleet.get_task("rd22ab").worktree
    assert worktree is not None
    (Path(worktree) / LONG).write_text(_long_module({*range(2, 10), 40}))
    again = FleetApp(Fleet(load_settings(), Store(fleet.store.path)), repo=app.repo,
                     default_base="main", run_scheduler=False, bell=False,
                     poll_interval=0.1, diff_interval=60)
    async with again.run_test(size=SIZE) as pilot:
        view = await _diff_shown(pilot, again)
        await wait_until(pilot, lambda: view.view_mark("src/app.py") == "viewed",
                         what="the kept mark")
        assert _label(view, "src/app.py").startswith("M ✓ src/app.py")
        assert view.view_mark(LONG) == "changed" and _label(view, LONG).startswith("M ! ")
        assert view.view_mark("notes.md") == "unviewed"
        assert "1 viewed" in _label(view, ALL_FILES)
    assert app.errors == [] and again.errors == []


async def test_hunk_keys_walk_the_hunks_and_on_into_the_next_file(app: FleetApp) -> None:
    async with app.run_test(size=SIZE) as pilot:
        view = await _diff_shown(pilot, app)
        lines = view.query_one(DiffLines)
        await pilot.press("right_square_bracket", "right_square_bracket")
        assert view.selected == "src/app.py"
        # app.py has one hunk: } goes to it, then on into long.py's first hunk
        await pilot.press("right_curly_bracket")
        assert lines.lines[lines.top_row].startswith("@@")
        await pilot.press("right_curly_bracket")
        assert view.selected == LONG
        renderer = lines.renderer
        assert renderer is not None
        hunks = renderer.layout.hunk_starts
        assert len(hunks) == 3 and lines.top_row == hunks[0]
        await pilot.press("right_curly_bracket")
        assert lines.top_row == hunks[1] and int(lines.scroll_y) == hunks[1]  # scrolled
        await pilot.press("right_curly_bracket")
        assert lines.top_row == hunks[2]
        await pilot.press("right_curly_bracket")  # no hunk, no file after: said, not moved
        assert view.selected == LONG and lines.top_row == hunks[2]
        await wait_until(pilot, lambda: any("No next hunk" in str(n.message)
                                            for n in app._notifications), what="the notice")
        await pilot.press("left_curly_bracket", "left_curly_bracket")
        assert lines.top_row == hunks[0]
        # back past the first hunk: the previous file's last hunk
        await pilot.press("left_curly_bracket")
        assert view.selected == "src/app.py"
        assert lines.lines[lines.top_row].startswith("@@")


async def test_a_changed_line_is_painted_with_its_changed_words_and_syntax(
        app: FleetApp) -> None:
    async with app.run_test(size=SIZE) as pilot:
        view = await _diff_shown(pilot, app)
        await pilot.press("right_square_bracket", "right_square_bracket")
        lines = view.query_one(DiffLines)
        added = lines.lines.index("+    return 2")
        removed = lines.lines.index("-    return 1")
        row = lines.get_row(added)
        assert ("add syn-num word", "2") in row and ("add syn-kw", "return") in row
        assert ("del syn-num word", "1") in lines.get_row(removed)
        # the styles: a changed word's background differs from its line's
        add = lines._style("add")
        word = lines._style("add syn-num word")
        assert word.bgcolor is not None and word.bgcolor != add.bgcolor
        assert word.color != add.color  # the number's colour, not the line's
        # a search looks in the lines as they are, colouring nothing
        renderer = lines.renderer
        assert renderer is not None
        before = len(renderer._rows)
        lines.set_search("return")
        assert lines.matches and len(renderer._rows) == before
