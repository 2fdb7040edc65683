"""Review comments in the panel: C on a diff line (and a shift+arrow range),
the comments inline under their lines and in the R list (edit, delete), ctrl+r sends them
(a follow-up for a finished task), their states on the next diff, the merge dialog asking
about open comments; snapshots of a review with comments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_ui_snapshots import _git, _main_ready, _no_blink, _settle, build_fleet
from test_ui_support import wait_for_screen, wait_until
from textual.pilot import Pilot
from textual.widgets import Button, TextArea

from fleet_tui.core.review import anchor_of
from fleet_tui.engine.fleet import Fleet
from fleet_tui.store.db import TaskState
from fleet_tui.ui.app import FleetApp
from fleet_tui.ui.screens.modals import ConfirmScreen, MergeScreen, PromptScreen
from fleet_tui.ui.screens.review import ReviewScreen
from fleet_tui.ui.widgets.diff_view import DiffLines, DiffView
from fleet_tui.ui.widgets.task_table import TaskTable

NOW = 1_800_000_000.0
TASK = "s4n7ud"  # succeeded, with a worktree: src/app.py changed, hello.txt untracked


def _app(fleet: Fleet, repo: Path) -> FleetApp:
    return FleetApp(fleet, repo=repo, default_base="main", clock=lambda: NOW,
                    run_scheduler=False, bell=False, poll_interval=0.1, diff_interval=60)


async def _diff_of_task(pilot: Pilot[Any], app: FleetApp) -> tuple[DiffView, DiffLines]:
    await _main_ready(pilot)
    app.main.query_one(TaskTable).select_key(TASK)
    await pilot.press("2")
    view = app.main.query_one(DiffView)
    await _settle(pilot, lambda: view.prepared is not None
                  and len(view.prepared.diff.files) == 2)
    lines = view.query_one(DiffLines)
    lines.focus()
    await pilot.pause()
    return view, lines


def _row(lines: DiffLines, text: str) -> int:
    return next(i for i in range(lines.row_count()) if lines.row_text(i) == text)


def _texts(lines: DiffLines) -> list[str]:
    return [lines.row_text(i) for i in range(lines.row_count())]


async def _merge_asks_and_is_refused(pilot: Pilot[Any], app: FleetApp, yes: str = "") -> None:
    """`m`: the merge dialog says TASK's one comment is open; its yes asks again (the
    button saying ``yes``), and no, then no again, leave the main screen as it was."""
    await pilot.press("m")
    merge = await wait_for_screen(pilot, MergeScreen)
    assert "1 review comment is open" in str(
        merge.query_one(f"#merge-item-{TASK}").render())
    await pilot.press("y")
    asked = await wait_for_screen(pilot, ConfirmScreen)
    assert "1 review comment is open" in str(asked.query_one(".dialog-title").render())
    if yes:
        assert yes in str(asked.query_one("#yes", Button).label)
    await pilot.press("n")
    await wait_for_screen(pilot, MergeScreen)  # back to the dialog
    await pilot.press("n")
    await wait_until(pilot, lambda: app.screen is app.main)


async def test_comment_list_edit_delete_send_and_the_states(git_repo: Path,
                                                             tmp_path: Path) -> None:
    fleet = build_fleet(git_repo, tmp_path)
    app = _app(fleet, git_repo)
    async with app.run_test(size=(160, 48)) as pilot:
        view, lines = await _diff_of_task(pilot, app)
        # a range: the cursor on "return 2", shift+up takes the docstring's line too
        lines.move_cursor(_row(lines, "+    return 2"))
        await pilot.press("shift+up")
        assert [r.shown for r in view.lines_at_cursor()] == [
            '+    """Entry point."""', "+    return 2"]
        await pilot.press("C")
        prompt = await wait_for_screen(pilot, PromptScreen)
        assert "src/app.py:2-3" in str(prompt.query_one(".dialog-title").render())
        await pilot.press(*"say why 2")
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: len(fleet.comments(TASK)) == 1, what="the comment")
        (made,) = fleet.comments(TASK)
        assert (made.anchor.path, made.anchor.start, made.anchor.end) == ("src/app.py", 2, 3)
        assert made.body == "say why 2"
        # inline, under the range's last line
        await wait_until(pilot, lambda: any("#" in t and "say why 2" in t
                                            for t in _texts(lines)), what="the inline row")
        texts = _texts(lines)
        at = texts.index("+    return 2")
        assert texts[at + 1] == f"  ┃ #{made.id} open (not sent) src/app.py:2-3: say why 2"
        # the cursor stays on a patch line; a second comment on one line (hello.txt's)
        lines.move_cursor(_row(lines, "+hello"))
        await pilot.press("C")
        await wait_for_screen(pilot, PromptScreen)
        await pilot.press(*"greet the world", "ctrl+s")
        await wait_until(pilot, lambda: len(fleet.comments(TASK)) == 2, what="comment 2")

        # R: the list; e edits the highlighted one (the first: src/app.py comes first)
        await pilot.press("R")
        listing = await wait_for_screen(pilot, ReviewScreen)
        assert [c.body for c in listing.comments] == ["greet the world", "say why 2"]
        await pilot.press("down", "e")
        edit = await wait_for_screen(pilot, PromptScreen)
        assert edit.query_one(TextArea).text == "say why 2"
        edit.query_one(TextArea).text = "why 2, not 1?"
        await pilot.press("ctrl+s")
        listing = await wait_for_screen(pilot, ReviewScreen)
        await wait_until(pilot, lambda: "why 2, not 1?" in [
            c.body for c in fleet.comments(TASK)], what="the edit")
        # d asks, then deletes the highlighted comment
        await pilot.press("d")
        await wait_for_screen(pilot, ConfirmScreen)
        await pilot.press("y")
        listing = await wait_for_screen(pilot, ReviewScreen)
        await wait_until(pilot, lambda: len(listing.comments) == 1, what="the list again")
        assert [c.body for c in fleet.comments(TASK)] == ["why 2, not 1?"]
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, ReviewScreen))

        # the merge dialog says one comment is open, and asks before merging
        app.main.query_one(TaskTable).focus()
        await _merge_asks_and_is_refused(pilot, app)  # nothing merged
        assert fleet.get_task(TASK).state == "succeeded"

        # ctrl+r sends the review: the task has finished, so a follow-up in its session
        # (a run that never started a session takes no follow-up: the refusal is said)
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: any("no session to continue" in m
                                            for _, _, m in app.toasts), what="the refusal")
        assert not any(c.sent for c in fleet.comments(TASK))
        fleet.store.update_task(TASK, session_id="5e55-10n")
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: all(c.sent for c in fleet.comments(TASK)),
                         what="the review sent")
        followup = fleet.attempts(TASK)[-1]
        assert followup.kind == "followup"
        assert "src/app.py:2-3" in followup.prompt and "why 2, not 1?" in followup.prompt
        assert '> +    """Entry point."""' in followup.prompt

        # the worker's next change touches the lines: the comment shows addressed
        worktree = Path(fleet.get_task(TASK).worktree or "")
        (worktree / "src" / "app.py").write_text("def main():\n    return 3\n")
        app.main.diff.reload()
        await wait_until(pilot, lambda: any("addressed (sent)" in t for t in _texts(lines)),
                         what="the addressed row")
        assert fleet.open_comments(TASK) == 0


async def test_the_comment_key_needs_a_line_and_the_diff(git_repo: Path,
                                                         tmp_path: Path) -> None:
    fleet = build_fleet(git_repo, tmp_path)
    app = _app(fleet, git_repo)
    async with app.run_test(size=(160, 48)) as pilot:
        _view, lines = await _diff_of_task(pilot, app)
        lines.move_cursor(0)  # "diff --git ...": a header
        await pilot.press("C")
        await wait_until(pilot, lambda: any("Put the cursor on a line" in m
                                            for _, _, m in app.toasts), what="the hint")
        assert fleet.comments(TASK) == []
        assert app.main.check_action("send_review", ()) is False  # nothing to send
        app.main.query_one(TaskTable).focus()
        await pilot.pause()
        assert app.main.check_action("comment", ()) is False  # not in the diff


async def test_landing_through_the_queue_or_a_pick_asks_about_open_comments(
        git_repo: Path, tmp_path: Path) -> None:
    """The merge queue's ways in (m with marks, p on a copy) ask as the merge does; no
    is nothing queued."""
    fleet = build_fleet(git_repo, tmp_path)
    # a second finished task to mark with it (its own worktree and change)
    other = git_repo / ".fleet-work" / "x2c9ok"
    _git(git_repo, "worktree", "add", "-q", "-b", "fleet/x2c9ok", str(other))
    (other / "other.txt").write_text("other\n")
    base = fleet.get_task(TASK).base_commit
    fleet.store.create_task(task_id="x2c9ok", prompt="Other", now=NOW - 650, title="Other",
                            repo=git_repo, base_branch="main", base_commit=base,
                            model="main", endpoint="default", state=TaskState.SUCCEEDED,
                            started_at=NOW - 190, finished_at=NOW - 110, worktree=other)
    diff = fleet.diff(TASK)
    fleet.comment_at(TASK, "src/app.py", 3, 3, "why 2?")
    fleet.store.update_task(TASK, group_id="g-copies")  # one of several copies: p picks
    assert diff.files and fleet.open_comments(TASK) == 1
    app = _app(fleet, git_repo)
    async with app.run_test(size=(160, 48)) as pilot:
        table = app.main.query_one(TaskTable)
        await wait_until(pilot, lambda: {TASK, "x2c9ok"} <= set(table.keys), what="the list")
        table.focus()
        for task_id in (TASK, "x2c9ok"):
            table.select_key(task_id)
            await wait_until(pilot, lambda t=task_id: app.main.task_list.cursor_task is not None
                             and app.main.task_list.cursor_task.id == t, what=f"{task_id} selected")
            await pilot.press("space")
        assert app.main.task_list.marked == {TASK, "x2c9ok"}
        await _merge_asks_and_is_refused(pilot, app, yes="Land anyway")
        assert fleet.get_task(TASK).land_state is None  # nothing queued

        await pilot.press("escape")  # unmark all
        await wait_until(pilot, lambda: not app.main.task_list.marked, what="no marks")
        table.select_key(TASK)
        await wait_until(pilot, lambda: app.main.task_list.cursor_task is not None
                         and app.main.task_list.cursor_task.id == TASK, what="the copy selected")
        await pilot.press("p")
        pick = await wait_for_screen(pilot, ConfirmScreen)
        body = str(pick.query_one(".dialog-body").render())
        assert "1 review comment is open" in body and "Land it anyway?" in body
        assert "Pick anyway" in str(pick.query_one("#yes", Button).label)
        await pilot.press("n")
        await wait_until(pilot, lambda: app.screen is app.main)
        task = fleet.get_task(TASK)
        assert (task.state, task.land_state) == ("succeeded", None)
    assert app.errors == []


def _with_comments(git_repo: Path, tmp_path: Path) -> FleetApp:
    """The snapshot fleet with a review: one comment addressed, one open, one outdated."""
    fleet = build_fleet(git_repo, tmp_path)
    diff = fleet.diff(TASK)
    from fleet_tui.core.review import diff_lines

    rows = [r for r in diff_lines(diff.patch.splitlines(), [f.path for f in diff.files])
            if r is not None]
    by_text = {r.shown: r for r in rows}
    fleet.add_comment(TASK, anchor_of([by_text["+    return 2"]]),
                      "Why 2? The tests expect 1.")
    fleet.add_comment(TASK, anchor_of([by_text["+hello"]]), "Say hello to the world.")
    fleet.add_comment(TASK, anchor_of([by_text['+    """Entry point."""']]),
                      "A docstring that says more,\nplease.")
    fleet.store.update_task(TASK, session_id="5e55-10n")
    fleet.send_review(TASK)  # a follow-up (queued: no scheduler runs it here)
    worktree = Path(fleet.get_task(TASK).worktree or "")
    (worktree / "src" / "app.py").write_text(
        'def main():\n    """Entry point."""\n    return 1\n')
    fleet.add_comment(TASK, anchor_of([by_text["+    return 2"]]), "(too late)")
    assert sorted(c.state for c in fleet.comments(TASK)) == [
        "addressed", "open", "open", "outdated"]
    return _app(fleet, git_repo)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_review_snapshot_inline(snap_compare: Any, git_repo: Path, tmp_path: Path,
                                size: tuple[int, int]) -> None:
    app = _with_comments(git_repo, tmp_path)

    async def run_before(pilot: Pilot[Any]) -> None:
        _view, lines = await _diff_of_task(pilot, app)
        await _settle(pilot, lambda: any("outdated" in t for t in _texts(lines)))
        lines.move_cursor(_row(lines, "+hello"))
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


def test_review_snapshot_list(snap_compare: Any, git_repo: Path, tmp_path: Path) -> None:
    app = _with_comments(git_repo, tmp_path)

    async def run_before(pilot: Pilot[Any]) -> None:
        await _diff_of_task(pilot, app)
        await pilot.press("R")
        await wait_for_screen(pilot, ReviewScreen)
        _no_blink(app)
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=(160, 48), run_before=run_before)
