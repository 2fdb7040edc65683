"""Snapshots of the landing screens at 80x24 and 160x48, from fixed data: the
compare view of three copies, the merge queue view, the merge dialog in queue mode and the
choice an update that stopped on conflicts asks for.

Deterministic by construction: fixed ids, titles and timestamps, an injected clock, no
scheduler and no queue runner (the engine never lands anything on its own here), worktrees
whose contents are written by the test. The tasks are store rows as finished workers leave
them (a stand-in for the worker runs: tests/ui/test_ui_landing.py runs the real claude).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from landing_support import commit_all
from textual.pilot import Pilot

from fleet_tui.core.states import LandState, TaskState
from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store
from fleet_tui.ui.app import FleetApp
from fleet_tui.ui.screens.landing import CompareScreen, QueueScreen
from fleet_tui.ui.screens.main import MainScreen
from fleet_tui.ui.screens.modals import ChoiceScreen, MergeScreen
from fleet_tui.ui.widgets.diff_view import DiffView
from fleet_tui.ui.widgets.task_table import TaskTable
from fleet_tui.vcs import git as fgit

NOW = 1_800_000_000.0
SIZES = [(80, 24), (160, 48)]
COPIES = ("c1aaaa", "c2bbbb", "c3cccc")
QUEUED = ("q1dddd", "q2eeee", "q3ffff", "q4gggg")


def build_fleet(repo: Path, tmp: Path) -> Fleet:
    """Three finished copies of one prompt (each with its own change), four tasks in the
    merge queue at each step of it, and one update stopped on conflicts."""
    store = Store(tmp / "fleet.db")
    endpoint = "default"  # the store names a task's endpoint
    contents = ("return a + b\n", "return sum((a, b))\n", "return b + a  # commutes\n")
    for n, (task_id, body) in enumerate(zip(COPIES, contents, strict=True)):
        info = fgit.create_worktree(repo, task_id, "main")
        (info.path / "src" / "add.py").write_text(f"def add(a, b):\n    {body}")
        if n == 2:
            (info.path / "tests.txt").write_text("add(1, 2) == 3\n")
        store.create_task(task_id=task_id, prompt="Write add()", now=NOW - 600 + n,
                          title=f"Write add() ({n + 1}/3)", repo=repo, base_branch="main",
                          base_commit=info.base_commit, branch=info.branch,
                          worktree=info.path, state=TaskState.SUCCEEDED, verdict="ok",
                          started_at=NOW - 590, finished_at=NOW - 500 + 10 * n,
                          turns=3 + n, input_tokens=20_000 + 1000 * n, output_tokens=700,
                          added_lines=2 + (n == 2), deleted_lines=0, group_id="gfixed01",
                          endpoint=endpoint, gate="passed" if n == 1 else None)
    states = [(LandState.MERGING, "merging 1a2b3c4d5e into main"),
              (LandState.TESTING, "testing 6f7a8b9c0d: pytest -q"),
              (LandState.FIXING, "the test gate failed on 2c3d4e5f6a; back with its worker "
                                 "(fix 1 of 1)"),
              (LandState.WAITING, None)]
    for n, (task_id, (land, note)) in enumerate(zip(QUEUED, states, strict=True)):
        store.create_task(task_id=task_id, prompt=f"Queued task {n + 1}", now=NOW - 400 + n,
                          title=f"Queued task {n + 1}", repo=repo, base_branch="main",
                          base_commit="0" * 40, state=TaskState.RUNNING if land ==
                          LandState.FIXING else TaskState.SUCCEEDED, verdict="ok",
                          started_at=NOW - 300, finished_at=NOW - 200, turns=2,
                          endpoint=endpoint, land_state=land, land_order=float(n + 1),
                          land_note=note, land_fixes=1 if land == LandState.FIXING else 0)
    store.create_task(task_id="s9stop", prompt="Stopped one", now=NOW - 100,
                      title="Rename the config keys", repo=repo, base_branch="main",
                      base_commit="0" * 40, state=TaskState.SUCCEEDED, verdict="ok",
                      endpoint=endpoint, land_state=LandState.STOPPED,
                      land_note="updating from main conflicted in config.py; stopped after "
                                "1 fix attempt")
    fleet = Fleet(load_settings(), store, clock=lambda: NOW)
    fleet.spawn_queue_runners = False  # nothing lands on its own in a snapshot
    return fleet


@pytest.fixture
def landing_app(git_repo: Path, tmp_path: Path) -> FleetApp:
    fleet = build_fleet(git_repo, tmp_path)
    return FleetApp(fleet, repo=git_repo, default_base="main", clock=lambda: NOW,
                    run_scheduler=False, bell=False, poll_interval=0.5, diff_interval=60)


async def _settle(pilot: Pilot[Any], predicate: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the screen did not settle"
        await pilot.pause(0.05)
    await pilot.pause(0.3)


async def _listed(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, FleetApp)
    await _settle(pilot, lambda: any(len(t.keys) == 8 for t in app.main.query(TaskTable)))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_compare_view(snap_compare: Any, landing_app: FleetApp, size: tuple[int, int]) -> None:
    """Three copies side by side, the second highlighted with its diff below."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await _listed(pilot)
        landing_app.main.query_one(TaskTable).select_key(COPIES[0])
        await _settle(pilot, lambda: landing_app.main.task_list.selected_id == COPIES[0])
        await pilot.press("c")
        await _settle(pilot, lambda: isinstance(landing_app.screen, CompareScreen))
        await pilot.press("down")
        view = landing_app.screen.query_one(DiffView)
        await _settle(pilot, lambda: view.prepared is not None and
                      view.prepared.diff.files[0].patch.count("sum((a, b))") == 1)

    assert snap_compare(landing_app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_queue_view(snap_compare: Any, landing_app: FleetApp, size: tuple[int, int]) -> None:
    """The queue in landing order at each step, then the task it stopped."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await _listed(pilot)
        await pilot.press("Q")
        await _settle(pilot, lambda: isinstance(landing_app.screen, QueueScreen)
                      and len(landing_app.screen.rows) == 5)

    assert snap_compare(landing_app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_queue_merge_dialog(snap_compare: Any, landing_app: FleetApp,
                            size: tuple[int, int]) -> None:
    """m with the three copies marked: land them through the merge queue."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await _listed(pilot)
        main = landing_app.main
        for task_id in COPIES:
            main.query_one(TaskTable).select_key(task_id)
            await _settle(pilot, lambda t=task_id: main.task_list.cursor_task is not None
                          and main.task_list.cursor_task.id == t, timeout=5)
            await pilot.press("space")
        await _settle(pilot, lambda: main.task_list.marked == set(COPIES))
        await pilot.press("m")
        await _settle(pilot, lambda: isinstance(landing_app.screen, MergeScreen))

    assert snap_compare(landing_app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_update_conflict_choice(snap_compare: Any, landing_app: FleetApp, git_repo: Path,
                                size: tuple[int, int]) -> None:
    """u on a copy whose update from main conflicts: worker, shell or abort."""
    (git_repo / "src" / "add.py").write_text("def add(a, b):\n    return int(a) + int(b)\n")
    commit_all(git_repo, "main's own add()")

    async def run_before(pilot: Pilot[Any]) -> None:
        await _listed(pilot)
        main = landing_app.main
        main.query_one(TaskTable).select_key(COPIES[2])
        await _settle(pilot, lambda: main.task_list.cursor_task is not None
                      and main.task_list.cursor_task.id == COPIES[2])
        await pilot.press("u")
        await _settle(pilot, lambda: isinstance(landing_app.screen, ChoiceScreen))

    assert snap_compare(landing_app, terminal_size=size, run_before=run_before)


def test_the_snapshot_fleet_lands_nothing_on_its_own(git_repo: Path, tmp_path: Path) -> None:
    fleet = build_fleet(git_repo, tmp_path)
    assert fleet.ensure_queue_runner(git_repo) is False
    assert [t.id for t in fleet.landing_queue(git_repo)] == list(QUEUED)
    assert isinstance(MainScreen, type)


# --- best of N: the compare view ranked by evidence ------------------------------------------

# c2bbbb's add() is the one the repository's test command refuses
RANKED_TEST = "! grep -q sum src/add.py"


def _with_test_command(repo: Path) -> None:
    (repo / ".fleet-tui.toml").write_text(f'test_command = "{RANKED_TEST}"\n')
    commit_all(repo, "the repository's test command")


async def _open_compare(pilot: Pilot[Any], app: FleetApp) -> CompareScreen:
    await _listed(pilot)
    app.main.query_one(TaskTable).select_key(COPIES[1])
    await _settle(pilot, lambda: app.main.task_list.selected_id == COPIES[1])
    await pilot.press("c")
    await _settle(pilot, lambda: isinstance(app.screen, CompareScreen), timeout=60)
    screen = app.screen
    assert isinstance(screen, CompareScreen)
    return screen


def test_compare_view_ranked(snap_compare: Any, landing_app: FleetApp, git_repo: Path) -> None:
    """The copies best first: the smallest passing change marked ★ with its reason on one
    line, the larger passing one second, the one failing the test command last."""
    _with_test_command(git_repo)

    async def run_before(pilot: Pilot[Any]) -> None:
        screen = await _open_compare(pilot, landing_app)
        view = screen.query_one(DiffView)
        await _settle(pilot, lambda: view.prepared is not None)

    assert snap_compare(landing_app, terminal_size=(160, 48), run_before=run_before)


async def test_compare_view_marks_the_best_and_b_picks_it(landing_app: FleetApp,
                                                          git_repo: Path) -> None:
    from fleet_tui.ui.screens.modals import ConfirmScreen

    _with_test_command(git_repo)
    async with landing_app.run_test(size=(160, 48)) as pilot:
        screen = await _open_compare(pilot, landing_app)
        assert [(r.task_id, r.place, r.best, r.tests.split()[0]) for r in screen.rows] == [
            (COPIES[0], 1, True, "passed"), (COPIES[2], 2, False, "passed"),
            (COPIES[1], 3, False, "FAILED")]
        why = str(screen.query_one("#compare-why").render())
        # the cursor starts on the copy asked about: the failing one, and why
        assert why == f"#3: fails the test command ({RANKED_TEST})", why
        await pilot.press("up")
        await _settle(pilot, lambda: "larger change" in str(
            screen.query_one("#compare-why").render()))
        await pilot.press("b")
        await _settle(pilot, lambda: isinstance(landing_app.screen, ConfirmScreen))
        title = str(landing_app.screen.query_one(".dialog-title").render())
        assert title == f"Pick {COPIES[0]}?", title
        await pilot.press("escape")
    assert landing_app.errors == []  # type: ignore[attr-defined]


async def test_a_group_decided_on_its_own_is_told_once(landing_app: FleetApp) -> None:
    """auto_pick's decision (here written to the store as the rank runner writes it) is
    one toast naming the winner and why; a decision from before the panel opened is not."""
    from fleet_tui.store.evidence import EvidenceStore

    async with landing_app.run_test(size=(160, 48)) as pilot:
        await _listed(pilot)
        fleet = landing_app.fleet
        assert fleet is not None
        picks = EvidenceStore(fleet.store)
        picks.record_pick("old-group", "q1dddd", "best of 2: long ago", "auto",
                          time.time() - 3600)
        reason = "best of 3: passes the tests; +2/-0 in 1 file; the smallest passing change"
        picks.record_pick("gfixed01", COPIES[0], reason, "auto", time.time())
        told = f"{COPIES[0]} picked as the best: {reason}"
        await _settle(pilot, lambda: told in [f"{t}: {m}" for _, t, m in landing_app.toasts])
        for _ in range(3):  # more polls: still one toast
            landing_app.main.task_list.poll()
            await pilot.pause(0.3)
        said = [f"{t}: {m}" for _, t, m in landing_app.toasts]
        assert said.count(told) == 1
        assert not any("long ago" in s for s in said)
