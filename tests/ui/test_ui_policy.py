"""What the keys offer is what the policy allows, and where the panel says why not it gives
the policy's reason (the engine and the CLI follow the same rule, fleet_tui/core/policy.py).

No claude here: the scheduler is off; tasks are put in the states they are in after a real
run by writing the store the way the engine does (a real store, a real git repository).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from test_ui_support import wait_for_screen, wait_until
from textual.pilot import Pilot

from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import TaskSpec, TaskState
from fleet_tui.ui.actions import find
from fleet_tui.ui.app import FleetApp
from fleet_tui.ui.screens.main import MainScreen
from fleet_tui.ui.screens.modals import ConfirmScreen, PromptScreen
from fleet_tui.ui.widgets.bars import KeyBar
from fleet_tui.ui.widgets.task_table import TaskTable
from fleet_tui.vcs import git as gitmod

SIZE = (120, 36)


@pytest.fixture
def fleet(git_repo: Path) -> Fleet:
    return Fleet(load_settings())


def make_app(fleet: Fleet, repo: Path) -> FleetApp:
    return FleetApp(fleet, repo=repo, default_base="main", run_scheduler=False, bell=False,
                    poll_interval=0.1, diff_interval=60)


def finished(fleet: Fleet, repo: Path, *, session: str | None, base_ref: str | None = None,
             ) -> str:
    """A task as a run leaves it: succeeded, with a worktree; ``session`` as claude
    reported it (None: the run never started one)."""
    task = fleet.submit(TaskSpec(prompt="change something", repo=repo, base_ref=base_ref))[0]
    info = gitmod.create_worktree(repo, task.id, task.base_commit)
    (info.path / "new.txt").write_text("new\n")
    fleet.store.update_task(task.id, state=TaskState.SUCCEEDED, worktree=info.path,
                            branch=info.branch, verdict="ok", session_id=session,
                            started_at=time.time() - 5, finished_at=time.time())
    return task.id


async def selected(pilot: Pilot[Any], app: FleetApp, task_id: str,
                   state: TaskState) -> MainScreen:
    main = app.main
    await wait_until(pilot, lambda: task_id in main.task_list.tasks
                     and main.task_list.tasks[task_id].state == state, what=f"{task_id} {state}")
    main.query_one(TaskTable).select_key(task_id)
    await wait_until(pilot, lambda: main.task_list.selected_id == task_id, what="the selection")
    return main


def key_bar_span(app: FleetApp, label: str) -> int:
    text = app.main.query_one(KeyBar).render().plain
    return text.index(label)


async def test_follow_up_without_a_session_is_dimmed_with_the_reason(
        fleet: Fleet, git_repo: Path) -> None:
    """Before: `f` was offered for any finished task and the engine then refused a task
    whose run never started a session."""
    task_id = finished(fleet, git_repo, session=None)
    with_session = finished(fleet, git_repo, session="3c4a0d1e-session")
    app = make_app(fleet, git_repo)
    async with app.run_test(size=SIZE) as pilot:
        main = await selected(pilot, app, task_id, TaskState.SUCCEEDED)
        assert main.check_action("follow_up", ()) is None  # shown, dimmed
        assert main.check_action("merge", ()) is True
        await pilot.press("f")
        await pilot.pause(0.2)
        assert isinstance(app.screen, MainScreen)  # no prompt for a session that is not
        # the key bar shows it dimmed; a click says the policy's reason
        await wait_until(pilot, lambda: "Follow-up" in app.main.query_one(KeyBar).render()
                         .plain, what="the key bar")
        await pilot.click(KeyBar, offset=(key_bar_span(app, "Follow-up"), 0))
        await wait_until(pilot, lambda: any("no session" in m for _, _, m in app.toasts),
                         what="the reason")
        reason = next(m for _, _, m in app.toasts if "no session" in m)
        assert reason.startswith(f"Cannot follow up {task_id}: it has no session")
        # the palette lists it with the same reason
        commands = {c.title: c.help for c in app.get_system_commands(main)}
        assert commands["Follow-up (f)"] == f"Not now: {reason}"
        # a task with a session: offered
        main = await selected(pilot, app, with_session, TaskState.SUCCEEDED)
        assert main.check_action("follow_up", ()) is True
        await pilot.press("f")
        await wait_for_screen(pilot, PromptScreen, what="prompt")


async def test_merge_of_a_task_started_from_a_commit_says_why_not(
        fleet: Fleet, git_repo: Path) -> None:
    head = gitmod.current_branch(git_repo)
    assert head == "main"
    commit = fleet.submit(TaskSpec(prompt="probe", repo=git_repo))[0].base_commit
    task_id = finished(fleet, git_repo, session="s-1", base_ref=commit)
    assert fleet.get_task(task_id).base_branch is None
    app = make_app(fleet, git_repo)
    async with app.run_test(size=SIZE) as pilot:
        main = await selected(pilot, app, task_id, TaskState.SUCCEEDED)
        assert main.check_action("merge", ()) is None
        record = find("merge")
        assert record is not None
        reason = main.why_not(record)
        assert reason is not None and "started from a commit" in reason


async def test_discard_is_offered_for_a_running_task_and_says_it_stops_it(
        fleet: Fleet, git_repo: Path) -> None:
    """Before: the panel refused to discard a running task while Fleet.discard allowed
    it (it kills the task first). The policy offers it; the confirm says so."""
    task = fleet.submit(TaskSpec(prompt="long job", repo=git_repo))[0]
    info = gitmod.create_worktree(git_repo, task.id, task.base_commit)
    fleet.store.update_task(task.id, state=TaskState.RUNNING, worktree=info.path,
                            branch=info.branch, started_at=time.time())
    done = finished(fleet, git_repo, session="s-2")
    app = make_app(fleet, git_repo)
    async with app.run_test(size=SIZE) as pilot:
        main = await selected(pilot, app, task.id, TaskState.RUNNING)
        assert main.check_action("discard", ()) is True
        assert main.check_action("kill", ()) is True
        await pilot.press("d")
        await wait_for_screen(pilot, ConfirmScreen, what="confirm")
        body = str(app.screen.query_one(".dialog-body").render())
        assert f"{task.id} is still running or queued: it is stopped first." in body
        await pilot.press("y")
        await wait_until(pilot, lambda: fleet.get_task(task.id).state == TaskState.DISCARDED,
                         what="the discard")
        assert not info.path.exists()
        # a finished task's confirm says nothing about stopping
        main = await selected(pilot, app, done, TaskState.SUCCEEDED)
        await pilot.press("d")
        await wait_for_screen(pilot, ConfirmScreen, what="confirm")
        assert "stopped first" not in str(app.screen.query_one(".dialog-body").render())
        await pilot.press("n")
