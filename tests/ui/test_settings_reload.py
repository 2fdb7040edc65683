"""Settings reload without a restart: config.toml and a repository's
`.fleet-tui.toml` edited while the panel runs; the merge dialog shows the new test gate,
a bad edit is reported (file and line) and the settings in use stay. The real panel,
engine, store and git worktree; no claude (the task has finished)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from test_ui_support import wait_for_screen, wait_until
from textual.widgets import Static

from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.settings.watch import SETTLE
from fleet_tui.store.db import Store, TaskState
from fleet_tui.ui.app import FleetApp
from fleet_tui.ui.screens.modals import MergeScreen


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config.toml"
    path.write_text("max_workers = 4\n")
    monkeypatch.setenv("FLEET_TUI_CONFIG", str(path))
    return path


@pytest.fixture
def app(git_repo: Path, tmp_path: Path, config: Path) -> FleetApp:
    head = _git(git_repo, "rev-parse", "HEAD")
    worktree = git_repo / ".fleet-work" / "mrg001"
    _git(git_repo, "worktree", "add", "-q", "-b", "fleet/mrg001", str(worktree))
    (worktree / "new.txt").write_text("new\n")
    _git(worktree, "add", "new.txt")
    _git(worktree, "commit", "-q", "-m", "new file")
    store = Store(tmp_path / "fleet.db")
    store.create_task(task_id="mrg001", prompt="add new.txt", repo=git_repo,
                      title="Add new.txt", state=TaskState.SUCCEEDED, base_branch="main",
                      base_commit=head, worktree=worktree, branch="fleet/mrg001",
                      endpoint="default", finished_at=time.time())
    fleet = Fleet(load_settings(), store)
    fleet.watch_settings()
    return FleetApp(fleet, repo=git_repo, default_base="main", run_scheduler=False,
                    bell=False, poll_interval=0.1, diff_interval=60)


async def _gate(pilot: Any, app: FleetApp, expect: str = "Test gate") -> str:
    """Open the merge dialog, read what it says of the test gate once it says `expect`
    (or give up at the deadline and return what it says), close it. Under load the dialog's
    hint can still be settling when the screen is already up."""
    await pilot.press("m")
    await wait_for_screen(pilot, MergeScreen, what="the dialog")

    def hints_now() -> list[str]:
        return [str(w.render()) for w in app.screen.query(Static)
                if "dialog-hint" in w.classes]

    deadline = time.monotonic() + 20
    while expect not in " ".join(hints_now()) and time.monotonic() < deadline:
        await pilot.pause(0.05)
    hints = hints_now()
    await pilot.press("escape")
    await wait_until(pilot, lambda: not isinstance(app.screen, MergeScreen),
                     what="the dialog to close")
    return " ".join(hints)


def _said(app: FleetApp, title: str) -> list[str]:
    return [message for _, t, message in app.toasts if t == title]


async def _edit(path: Path, text: str) -> None:
    """An editor's save that replaces the file whole (a new file renamed over it). Written
    in place (truncated, then written), a bad edit once left the settings at the defaults
    in a full run (6 test workers on 2 cores), most likely the truncated file read as empty
    once it had rested the watcher's SETTLE: a writer stalled that long mid-write, which
    this test is not about (tests of the rest itself write with their times set back)."""
    fresh = path.with_name(path.name + ".saving")
    fresh.write_text(text)
    os.replace(fresh, path)


async def test_an_edited_test_command_reaches_the_merge_dialog(
        app: FleetApp, config: Path, git_repo: Path) -> None:
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: app.main.task_list.cursor_task is not None, what="the list")
        assert "No test command configured" in await _gate(pilot, app, "No test command configured")
        # config.toml gets a test command: used at once, no restart
        await _edit(config, 'max_workers = 4\ntest_command = "pytest -q"\n')
        await wait_until(pilot, lambda: bool(_said(app, "Settings reloaded")),
                         what="the reload")
        assert "Test gate: pytest -q" in await _gate(pilot, app, "Test gate: pytest -q")
        assert app.fleet is not None and app.fleet.settings.test_command == "pytest -q"
        # a bad edit: said with the file and line, the settings in use stay
        await _edit(config, 'max_workers = 4\ntest_command = ["pytest"]\n')
        await wait_until(pilot, lambda: bool(_said(app, "Settings not reloaded")),
                         what="the complaint")
        (complaint,) = _said(app, "Settings not reloaded")
        assert complaint.startswith(f"{config}, line 2: test_command: expected")
        assert complaint.endswith("The previous settings stay in use until the file reads.")
        assert "Test gate: pytest -q" in await _gate(pilot, app, "Test gate: pytest -q")
        # the repository's own test gate wins over the user's default
        repo_file = git_repo / ".fleet-tui.toml"
        await _edit(repo_file, 'test_command = "make check"\n')
        await wait_until(pilot, lambda: bool(_said(app, "Repository settings reloaded")),
                         what="the repository's reload")
        assert "Test gate: make check" in await _gate(pilot, app, "Test gate: make check")
        await _edit(repo_file, 'test_command = "make check\n')
        await wait_until(pilot, lambda: bool(_said(app, "Repository settings not reloaded")),
                         what="the repository's complaint")
        assert str(repo_file) in _said(app, "Repository settings not reloaded")[0]
        assert "Test gate: make check" in await _gate(pilot, app, "Test gate: make check")
        # each change is said once, not at every poll
        await pilot.pause(0.5)
        assert len(_said(app, "Settings not reloaded")) == 1
        assert len(_said(app, "Repository settings not reloaded")) == 1


def _settled(path: Path, text: str) -> None:
    """Write `path` as an edit that has rested (settings.watch.SETTLE): its time set back
    rather than waited for."""
    path.write_text(text)
    then = time.time() - SETTLE - 0.1
    os.utime(path, (then, then))


def test_the_engine_uses_reloaded_settings(git_repo: Path, tmp_path: Path,
                                           config: Path) -> None:
    fleet = Fleet(load_settings(), Store(tmp_path / "fleet.db"))
    fleet.watch_settings()
    assert fleet.check_settings([git_repo]) == []  # nothing changed
    _settled(config, "max_workers = 9\nkill_grace = 2\n")
    (notice,) = fleet.check_settings([git_repo])
    assert notice.title == "Settings reloaded"
    assert fleet.settings.max_workers == 9 and fleet.supervisor.settings.kill_grace == 2
    assert fleet.follower.settings is fleet.settings
    assert fleet.check_settings([git_repo]) == []
    _settled(config, "max_workers = 0\n")
    (bad,) = fleet.check_settings([git_repo])
    assert bad.severity == "error" and "max_workers" in bad.message
    assert fleet.settings.max_workers == 9
    # a bad edit of a repository's file: the previous (here: none) stay in use
    _settled(git_repo / ".fleet-tui.toml", "setup = 1\n")
    (repo_bad,) = fleet.check_settings([git_repo])
    assert "previous settings stay" in repo_bad.message
    assert fleet.repo_settings.get(git_repo).setup is None
    # a repository whose file never read: said once, its tasks cannot start
    other = tmp_path / "other"
    other.mkdir()
    (other / ".fleet-tui.toml").write_text("setup = 1\n")
    (never,) = fleet.check_settings([other])
    assert "cannot start" in never.message and fleet.check_settings([other, git_repo]) == []
