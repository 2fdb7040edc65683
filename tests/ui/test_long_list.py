"""A long list stays usable: a thousand tasks in three repositories,
closed ones hidden until H, S cycling the order, a repository column, the panel opened
outside a repository asking where a new task goes, `fleet-tui archive` and the
archive_after_days setting. The real store, engine and git repositories; no claude."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_ui_support import wait_for_screen, wait_until
from textual.widgets import Input, OptionList

from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import CLOSED_STATES, Store, TaskState
from fleet_tui.ui.app import FleetApp
from fleet_tui.ui.screens.launch import LaunchScreen
from fleet_tui.ui.screens.modals import RepoScreen
from fleet_tui.ui.widgets.status_line import StatusLine
from fleet_tui.ui.widgets.task_table import TaskTable

NOW = 1_800_000_000.0
ROOT = Path(__file__).resolve().parents[2]
# one state in eight is running, a third or so needs the user, the rest is history
STATES = [TaskState.MERGED, TaskState.SUCCEEDED, TaskState.DISCARDED, TaskState.MERGED,
          TaskState.FAILED, TaskState.MERGED, TaskState.KILLED, TaskState.QUEUED]


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    for args in (["init", "-q", "-b", "main"], ["config", "user.name", "T"],
                 ["config", "user.email", "t@example.invalid"],
                 ["commit", "-q", "--allow-empty", "-m", "init"]):
        subprocess.run(["git", *args], cwd=path, check=True, capture_output=True)
    return path


@pytest.fixture
def repos(tmp_path: Path) -> list[Path]:
    return [make_repo(tmp_path / name) for name in ("shop", "api", "docs")]


def fill(store: Store, repos: list[Path], count: int = 1000) -> None:
    for i in range(count):
        state = STATES[i % len(STATES)]
        store.create_task(task_id=f"t{i:05d}", prompt=f"task {i}", repo=repos[i % 3],
                          title=f"task number {i:04d}", state=state, base_branch="main",
                          base_commit="0" * 40, endpoint="default",
                          now=NOW - 100_000 + i * 60, started_at=NOW - 100_000 + i * 60,
                          finished_at=None if state == TaskState.QUEUED else NOW - 50_000)
    store.update_task("t00999", state=TaskState.RUNNING)  # the newest task runs


def app_for(store: Store, repo: Path | None) -> FleetApp:
    return FleetApp(Fleet(load_settings(), store, clock=lambda: NOW), repo=repo,
                    default_base="main", clock=lambda: NOW, run_scheduler=False,
                    bell=False, poll_interval=0.2, diff_interval=60)


async def test_a_thousand_tasks_in_three_repositories(repos: list[Path],
                                                      tmp_path: Path) -> None:
    store = Store(tmp_path / "fleet.db")
    fill(store, repos)
    every = store.list_tasks()
    closed = sum(t.state in CLOSED_STATES for t in every)
    app = app_for(store, repos[0])
    async with app.run_test(size=(140, 40)) as pilot:
        table = app.main.query_one(TaskTable)
        await wait_until(pilot, lambda: table.row_count > 0, what="the list")
        # closed tasks are hidden, and the status line says so
        assert table.row_count == 1000 - closed and closed == 500
        status = app.main.query_one(StatusLine)
        await wait_until(pilot, lambda: f"{closed} closed hidden (H)" in str(status.render()),
                         what="the status line")
        assert not any(app.main.task_list.tasks[k].state in CLOSED_STATES for k in table.keys)
        # three repositories in view: a repository column tells them apart
        assert table.shows_repo
        assert {str(table.get_row(k)[3]) for k in table.keys} == {"shop", "api", "docs"}
        # needs you first: stalled / failed / done / killed above running and queued
        order = [app.main.task_list.tasks[k].state for k in table.keys]
        assert order[0] == TaskState.FAILED and order.index(TaskState.RUNNING) > 100
        # S: newest first (the running task is the newest), then by repository, then state
        await pilot.press("S")
        assert app.main.task_list.sort_mode == "newest" and table.keys[0] == "t00999"
        assert "newest first" in str(status.render())
        await pilot.press("S")
        names = [str(table.get_row(k)[3]) for k in table.keys]
        assert names == sorted(names)  # api, docs, shop
        await pilot.press("S")
        assert table.keys[0] == "t00999"  # by state: running first
        assert app.main.task_list.tasks[table.keys[-1]].state == TaskState.KILLED
        await pilot.press("S")
        assert app.main.task_list.sort_mode == "attention"
        # H: the history too; H again hides it
        await pilot.press("H")
        assert table.row_count == 1000
        assert "closed hidden" not in str(status.render())
        await pilot.press("H")
        assert table.row_count == 500
        # a filter still narrows what is shown, by repository name too
        app.main.task_list.filter_text = "docs"
        app.main.task_list.render()
        assert table.row_count and all(app.main.task_list.tasks[k].repo == repos[2]
                                       for k in table.keys)


async def test_one_repository_has_no_repository_column(repos: list[Path],
                                                       tmp_path: Path) -> None:
    store = Store(tmp_path / "fleet.db")
    store.create_task(task_id="one001", prompt="x", repo=repos[0], title="alone", now=NOW,
                      state=TaskState.SUCCEEDED)
    app = app_for(store, repos[0])
    async with app.run_test(size=(140, 30)) as pilot:
        table = app.main.query_one(TaskTable)
        await wait_until(pilot, lambda: table.row_count == 1, what="the list")
        assert not table.shows_repo and len(table.get_row("one001")) == 10  # no repo cell


async def test_only_closed_tasks_say_how_to_see_them(repos: list[Path],
                                                     tmp_path: Path) -> None:
    store = Store(tmp_path / "fleet.db")
    for i in range(3):
        store.create_task(task_id=f"old{i:03d}", prompt="x", repo=repos[0], now=NOW - i,
                          state=TaskState.MERGED)
    app = app_for(store, repos[0])
    async with app.run_test(size=(140, 30)) as pilot:
        await wait_until(pilot, lambda: app.main.task_list.closed_hidden == 3, what="the list")
        notice = str(app.main.query_one("#list-notice").render())
        assert notice.startswith("No open tasks: H shows the 3 merged or discarded ones")


async def test_outside_a_repository_n_asks_which_one(repos: list[Path],
                                                     tmp_path: Path) -> None:
    store = Store(tmp_path / "fleet.db")
    store.create_task(task_id="aaa001", prompt="x", repo=repos[1], now=NOW - 10)
    store.create_task(task_id="aaa002", prompt="x", repo=repos[2], now=NOW)
    app = app_for(store, None)
    async with app.run_test(size=(140, 36)) as pilot:
        await wait_until(pilot, lambda: app.main.table.row_count == 2, what="the list")
        assert "all repositories" in str(app.main.query_one(StatusLine).render())
        await pilot.press("n")
        await wait_for_screen(pilot, RepoScreen, what="the ask")
        options = app.screen.query_one(OptionList)
        # the recent ones, newest first
        assert [options.get_option_at_index(i).id for i in range(options.option_count)] \
            == [str(repos[2]), str(repos[1])]
        # a path that is no repository: said, and asked again
        app.screen.query_one(Input).focus()
        await pilot.press(*str(tmp_path), "enter")
        await wait_until(pilot, lambda: any(title == "Not a repository"
                                            for _, title, _ in app.toasts), what="a toast")
        await wait_for_screen(pilot, RepoScreen, what="again")
        await pilot.press("down", "enter")  # the second recent one
        await wait_for_screen(pilot, LaunchScreen, what="the launch form")
        assert app.screen._repo == repos[1]


# --- archive ---------------------------------------------------------------------------------


def test_auto_archive_of_old_closed_tasks_keeps_their_logs(repos: list[Path],
                                                           tmp_path: Path) -> None:
    store = Store(tmp_path / "fleet.db")
    clock = {"now": NOW}
    logs = repos[0] / ".fleet-work" / ".logs" / "old001" / "1"
    logs.mkdir(parents=True)
    (logs / "events.jsonl").write_text("{}\n")
    store.create_task(task_id="old001", prompt="x", repo=repos[0], now=NOW - 9 * 86400,
                      state=TaskState.MERGED)
    store.create_task(task_id="new001", prompt="x", repo=repos[0], now=NOW - 86400,
                      state=TaskState.DISCARDED)
    store.create_task(task_id="done01", prompt="x", repo=repos[0], now=NOW - 30 * 86400,
                      state=TaskState.SUCCEEDED)
    settings = load_settings(overrides={"archive_after_days": 7})
    fleet = Fleet(settings, store, clock=lambda: clock["now"])
    fleet.tick()
    assert [t.id for t in fleet.list_tasks(archived=True)] == ["old001"]
    assert {t.id for t in fleet.list_tasks()} == {"new001", "done01"}  # not closed: kept
    assert (logs / "events.jsonl").exists() and fleet.get_task("old001").archived_at == NOW
    clock["now"] += 7 * 86400  # a week later, the next pass takes the discarded one too
    fleet.tick()
    assert {t.id for t in fleet.list_tasks(archived=True)} == {"old001", "new001"}
    never = Fleet(load_settings(overrides={"archive_after_days": 0}),
                  Store(tmp_path / "other.db"), clock=lambda: clock["now"])
    never.store.create_task(task_id="x00001", prompt="x", repo=repos[0], now=0.0,
                            state=TaskState.MERGED)
    never.tick()
    assert never.list_tasks(archived=True) == []


def test_fleet_tui_archive(repos: list[Path], tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = Store(home / "fleet.db")
    now = time.time()
    for i, (repo, state) in enumerate([(repos[0], TaskState.MERGED),
                                       (repos[0], TaskState.DISCARDED),
                                       (repos[0], TaskState.SUCCEEDED),
                                       (repos[1], TaskState.MERGED)]):
        store.create_task(task_id=f"arc{i:03d}", prompt="x", repo=repo, now=now - 3600,
                          state=state)
    env = dict(os.environ, FLEET_TUI_HOME=str(home),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([sys.executable, "-m", "fleet_tui.cli", *args], cwd=repos[0],
                             env=env, capture_output=True, text=True, timeout=60)
        assert "Traceback" not in out.stderr, out.stderr
        return out

    def ids(*args: str) -> set[str]:
        out = cli("ls", "--json", *args)
        assert out.returncode == 0, out.stderr
        data: list[dict[str, Any]] = json.loads(out.stdout)
        return {t["id"] for t in data}

    refused = cli("archive", "arc002")
    assert refused.returncode == 4  # refused: the task's state does not allow it
    assert "cannot archive task arc002: it is succeeded" in refused.stderr
    done = cli("archive")  # this repository's closed tasks
    assert done.returncode == 0 and done.stdout.startswith("archived 2 tasks in ")
    assert ids() == {"arc002"} and ids("--archived") == {"arc000", "arc001"}
    assert ids("--all-repos") == {"arc002", "arc003"}
    assert cli("archive", "--older-than", "2").stdout.startswith("archived 0 tasks")
    assert cli("archive", "--all-repos").stdout.startswith("archived 1 task:")
    back = cli("archive", "--undo", "arc000")
    assert back.stdout.strip() == "brought back 1 task: arc000"
    assert ids() == {"arc000", "arc002"}
    show = cli("show", "arc001")  # an archived task is still there to look at
    assert show.returncode == 0 and "state:     discarded" in show.stdout
    assert "archived:  yes (`fleet-tui archive --undo arc001` brings it back)" in show.stdout
    bad = cli("archive", "--older-than", "soon")
    assert bad.returncode == 2 and "not a number of days" in bad.stderr
