"""The panel's landing keys and views, on the real engine with the real claude
against the scripted endpoint: `u` (update from base; on conflicts the worker resolves,
or abort), `m` with marks (the merge queue) and `Q` (its view), `c` (compare copies, each
one's diff below) and `p` (pick), `P` (push), and the merge dialog's commit message box.
Snapshots of the new screens are in tests/ui/test_ui_landing_snapshots.py."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from landing_support import checkout_state, git
from test_ui_support import TEST_KEY, Rig, stream_text, toasts, wait_for_screen, wait_until
from textual.widgets import Button, DataTable, Input

from fleet_tui.core.states import LandState, TaskState
from fleet_tui.demo.endpoint import ScriptedEndpoint, resolve_conflict_turns
from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import TaskSpec
from fleet_tui.ui.actions import find
from fleet_tui.ui.screens.landing import CompareScreen, QueueScreen
from fleet_tui.ui.screens.main import MainScreen
from fleet_tui.ui.screens.modals import ChoiceScreen, ConfirmScreen, MergeScreen
from fleet_tui.ui.widgets.diff_view import DiffView
from fleet_tui.ui.widgets.task_table import TaskTable

pytestmark = pytest.mark.real_claude

RESOLVED = "from A and from B\n"


def _write(path: str, content: str) -> list[dict[str, Any]]:
    return [{"type": "tool_use", "name": "Write",
             "input": {"file_path": "{cwd}/" + path, "content": content}}]


SCRIPTS: dict[str, Any] = {
    "side-a": [_write("shared.txt", "from A\n"), "A done."],
    "side-b": {"turns": [_write("shared.txt", "from B\n"), "B done."],
               "followup": resolve_conflict_turns("shared.txt", RESOLVED)},
    "own": [[{"type": "tool_use", "name": "Bash",
              "input": {"command": "basename $PWD > \"own-$(basename $PWD).txt\"",
                        "description": "a file of its own"}}], "Added my file."],
}


@pytest.fixture
def rig(claude_bin: str, git_repo: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    with ScriptedEndpoint(SCRIPTS) as endpoint:
        monkeypatch.setenv("FLEET_WORKER_BASE_URL", endpoint.url)
        monkeypatch.setenv("FLEET_WORKER_CLAUDE", claude_bin)
        monkeypatch.setenv("FLEET_WORKER_KEY_SOURCES", "env")
        monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", TEST_KEY)
        monkeypatch.setenv("CLAUDE_CODE_MAX_RETRIES", "0")
        yield Rig(fleet=Fleet(load_settings()), repo=git_repo, endpoint=endpoint)


def _finished(rig: Rig, prompt: str, copies: int = 1, title: str = "") -> list[str]:
    tasks = rig.fleet.submit(TaskSpec(prompt=prompt, title=title, repo=rig.repo),
                             copies=copies)
    return [t.id for t in tasks]


async def _select(pilot: Any, main: MainScreen, task_id: str) -> None:
    await wait_until(pilot, lambda: task_id in main.table.keys, what=f"{task_id} listed")
    main.table.select_key(task_id)
    listed = main.task_list
    await wait_until(pilot, lambda: listed.selected_id == task_id
                     and listed.cursor_task is not None and listed.cursor_task.id == task_id
                     and listed.cursor_task.state == rig_state(main, task_id),
                     what=f"{task_id} selected")


def rig_state(main: MainScreen, task_id: str) -> TaskState:
    assert main.fleet is not None
    return main.fleet.get_task(task_id).state


async def _all_done(pilot: Any, rig: Rig, ids: list[str]) -> None:
    await wait_until(pilot, lambda: all(rig.state(t) == TaskState.SUCCEEDED for t in ids),
                     timeout=60, what="the workers")


async def test_merge_dialog_message_box_keeps_its_text_and_y_n_type_into_it(rig: Rig) -> None:
    first, _second = _finished(rig, "[script:own] add a file", copies=2, title="Add a file")
    app = rig.app()
    async with app.run_test(size=(140, 40)) as pilot:
        main = app.main
        await _all_done(pilot, rig, [first])
        await _select(pilot, main, first)
        await pilot.press("m")
        dialog = await wait_for_screen(pilot, MergeScreen, what="merge")
        box = dialog.query_one("#merge-message", Input)
        assert box.value == "Add a file"  # the copy's "(1/2)" is not in the message
        assert isinstance(app.focused, Button)
        await pilot.press("e")  # one key to the message box
        await wait_until(pilot, lambda: app.focused is box, what="the message box focused")
        assert box.cursor_position == len("Add a file")
        await pilot.press(*" - yes, now")  # y and n are typed, never answered
        # the default kept, not wiped
        await wait_until(pilot, lambda: box.value == "Add a file - yes, now", what="the typing")
        assert app.screen is dialog
        await pilot.press("enter")  # done editing: back to the buttons
        await wait_until(pilot, lambda: isinstance(app.focused, Button), what="the buttons")
        assert app.focused is dialog.query_one("#yes")
        await pilot.press("y")
        await wait_until(pilot, lambda: rig.state(first) == TaskState.MERGED, what="merge")
    subject = git(rig.repo, "log", "-1", "--format=%B", "main^2")
    assert subject.splitlines()[0] == "Add a file - yes, now"
    assert app.errors == []


async def test_update_key_conflict_resolved_by_the_worker_then_merged(rig: Rig) -> None:
    (a,) = _finished(rig, "[script:side-a] write shared.txt")
    (b,) = _finished(rig, "[script:side-b] write shared.txt")
    app = rig.app()
    async with app.run_test(size=(150, 44)) as pilot:
        main = app.main
        await _all_done(pilot, rig, [a, b])
        assert rig.fleet.merge(a).merged
        before = checkout_state(rig.repo)
        await _select(pilot, main, b)
        await pilot.press("u")
        await wait_for_screen(pilot, ChoiceScreen, what="the conflict choice")
        body = "\n".join(str(w.render()) for w in app.screen.query(".dialog-body"))
        assert "shared.txt" in body and "abort" in body
        await pilot.press("w")
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen), what="back")
        await wait_until(pilot, lambda: rig.fleet.get_task(b).attempt_count == 2,
                         what="the follow-up")
        await wait_until(pilot, lambda: rig.state(b) == TaskState.SUCCEEDED
                         and not rig.fleet.get_task(b).conflicts, timeout=60,
                         what="the worker's resolution")
        await wait_until(pilot, lambda: "Resolved the conflict in shared.txt"
                         in stream_text(app), what="its work in the stream")
        assert checkout_state(rig.repo) == before  # nothing of this touched main
        await _select(pilot, main, b)
        await wait_until(pilot, lambda: main.task_list.tasks[b].conflicts == []
                         and main.check_action("merge", ()) is True,
                         what="the panel to see it resolved")
        await pilot.press("m")
        dialog = await wait_for_screen(pilot, MergeScreen, what="merge")
        assert not dialog.query_one("#yes", Button).disabled  # clean now
        await pilot.press("y")
        await wait_until(pilot, lambda: rig.state(b) == TaskState.MERGED, what="the merge")
    assert (rig.repo / "shared.txt").read_text() == RESOLVED
    assert app.errors == []


async def test_update_key_abort_puts_everything_back(rig: Rig) -> None:
    (a,) = _finished(rig, "[script:side-a] write shared.txt")
    (b,) = _finished(rig, "[script:side-b] write shared.txt")
    app = rig.app()
    async with app.run_test(size=(150, 44)) as pilot:
        main = app.main
        await _all_done(pilot, rig, [a, b])
        assert rig.fleet.merge(a).merged
        worktree = Path(rig.fleet.get_task(b).worktree or "")
        before, wt_before = checkout_state(rig.repo), checkout_state(worktree)
        await _select(pilot, main, b)
        await pilot.press("u")
        await wait_for_screen(pilot, ChoiceScreen, what="choice")
        await pilot.press("a")
        await wait_until(pilot, lambda: any(f"{b} update aborted" in t for t in toasts(app)),
                         what="the abort")
        assert checkout_state(worktree) == wt_before
        assert checkout_state(rig.repo) == before
        assert rig.fleet.get_task(b).conflicts == []
        # the shell choice cannot hand over the terminal here: said, nothing changed
        await pilot.press("u")
        await wait_for_screen(pilot, ChoiceScreen, what="choice")
        await pilot.press("o")
        await wait_until(pilot, lambda: any("cannot hand over" in t for t in toasts(app)),
                         what="the shell's refusal")
        await wait_for_screen(pilot, ChoiceScreen, what="asked again")
        await pilot.press("escape")
        await wait_until(pilot, lambda: any("Left mid-merge" in t for t in toasts(app)),
                         what="left as it is")
        await wait_until(pilot, lambda: b in main.task_list.tasks
                         and main.task_list.tasks[b].conflicts != [],
                         what="the conflicts listed")
        row = "".join(c.plain for c in main.query_one(TaskTable).get_row(b))
        assert "⚠conflicts" in row
        merge = find("merge")
        assert merge is not None
        assert "stopped on conflicts" in (main.why_not(merge) or "")  # m says why not
        assert checkout_state(rig.repo) == before
    assert app.errors == []


async def test_marked_tasks_land_through_the_queue_and_q_shows_it(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_WORKER_TEST_COMMAND", "sleep 1.5")
    rig.fleet = Fleet(load_settings())
    ids = _finished(rig, "[script:own] add a file", copies=3, title="Own file")
    app = rig.app()
    async with app.run_test(size=(160, 44)) as pilot:
        main = app.main
        await _all_done(pilot, rig, ids)
        listed = main.task_list
        await wait_until(pilot, lambda: all(t in listed.tasks and listed.tasks[t].state
                                            == TaskState.SUCCEEDED for t in ids),
                         what="the rows finished")
        await pilot.press("ctrl+a")  # mark every task listed: the three copies
        await wait_until(pilot, lambda: main.task_list.marked == set(ids), what="the marks")
        order = [t for t in main.table.keys if t in ids]
        await pilot.press("m")
        await wait_for_screen(pilot, MergeScreen, what="dialog")
        title = str(app.screen.query_one(".dialog-title").render())
        assert "Land 3 tasks through the merge queue" in title
        assert not app.screen.query("#merge-message")  # the queue writes its own
        await pilot.press("y")
        await wait_until(pilot, lambda: any(t.land_state == LandState.TESTING
                                            for t in main.task_list.tasks.values()),
                         what="a task under test")
        testing = next(t for t in main.task_list.tasks.values()
                       if t.land_state == LandState.TESTING)
        row = "".join(c.plain for c in main.query_one(TaskTable).get_row(testing.id))
        assert "⇡testing" in row
        await pilot.press("Q")
        queue_screen = await wait_for_screen(pilot, QueueScreen, what="Q")
        await wait_until(pilot, lambda: len(queue_screen.rows) >= 2, what="queue rows")
        shown = [r.task_id for r in queue_screen.rows]
        assert shown == [t for t in order if t in shown]  # in landing order
        assert queue_screen.query_one(DataTable).row_count == len(queue_screen.rows)
        await wait_until(pilot, lambda: all(rig.state(t) == TaskState.MERGED for t in ids),
                         timeout=90, what="the queue to land all three")
        await wait_until(pilot, lambda: queue_screen.rows == [], what="the queue empty")
        await pilot.press("escape")
    landed = git(rig.repo, "log", "--first-parent", "--reverse",
                 "--format=%(trailers:key=Fleet-Task,valueonly,separator=)").split()
    assert landed == order
    assert app.errors == []


async def test_compare_view_shows_each_copys_diff_and_picks_one(rig: Rig) -> None:
    ids = _finished(rig, "[script:own] add a file", copies=3, title="Own file")
    app = rig.app()
    async with app.run_test(size=(160, 48)) as pilot:
        main = app.main
        await _all_done(pilot, rig, ids)
        await _select(pilot, main, ids[0])
        await pilot.press("c")
        screen = await wait_for_screen(pilot, CompareScreen, what="compare")
        assert [r.task_id for r in screen.rows] == ids
        assert all(r.files == [f"own-{r.task_id}.txt"] and r.clean for r in screen.rows)
        view = screen.query_one(DiffView)
        await wait_until(pilot, lambda: view.prepared is not None, what="the first diff")
        assert view.prepared is not None
        assert [f.path for f in view.prepared.diff.files] == [f"own-{ids[0]}.txt"]
        await pilot.press("down")  # one key: the next copy's diff
        await wait_until(pilot, lambda: view.prepared is not None and [
            f.path for f in view.prepared.diff.files] == [f"own-{ids[1]}.txt"],
            what="the second copy's diff")
        await pilot.press("p")
        await wait_for_screen(pilot, ConfirmScreen, what="ask")
        body = str(app.screen.query_one(".dialog-body").render())
        assert ids[0] in body and ids[2] in body
        await pilot.press("y")
        await wait_until(pilot, lambda: rig.state(ids[1]) == TaskState.MERGED, timeout=60,
                         what="the pick to land")
        assert [rig.state(t) for t in (ids[0], ids[2])] == [TaskState.DISCARDED] * 2
    assert sorted(p.name for p in rig.repo.glob("own-*.txt")) == [f"own-{ids[1]}.txt"]
    assert app.errors == []


async def test_push_key_pushes_and_the_row_says_so(rig: Rig) -> None:
    remote = rig.repo.parent / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    git(rig.repo, "remote", "add", "origin", str(remote))
    (task_id,) = _finished(rig, "[script:own] add a file")
    app = rig.app()
    async with app.run_test(size=(150, 40)) as pilot:
        main = app.main
        await _all_done(pilot, rig, [task_id])
        await _select(pilot, main, task_id)
        await pilot.press("P")
        await wait_until(pilot, lambda: any(f"{task_id} pushed" in t for t in toasts(app)),
                         what="the push")
        await wait_until(pilot, lambda: "↑pushed" in "".join(
            c.plain for c in main.query_one(TaskTable).get_row(task_id)), what="the mark")
    assert git(remote, "branch", "--list").split() == [f"fleet/{task_id}"]
    assert app.errors == []
