"""The door between panel and engine: readiness is one message (EngineReady), and what needs
the engine starts when it arrives; keys are records that users can rebind.

No claude here: a real store, a real engine (scheduler off), a real git repository. The
engine is made in a thread after the first frame, the way `fleet-tui` makes it: the maker
looks the repository up around the current directory.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_ui_support import wait_for_screen, wait_until
from textual.message import Message
from textual.widgets import TextArea

from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import TaskSpec
from fleet_tui.ui.app import GC_THRESHOLDS, FleetApp
from fleet_tui.ui.messages import EngineReady, TasksLoaded
from fleet_tui.ui.screens.help import HelpScreen
from fleet_tui.ui.screens.launch import LaunchScreen
from fleet_tui.vcs import git

SIZE = (120, 36)


def looking_around(delay: float = 0.3, gate: threading.Event | None = None) -> Any:
    """What `fleet-tui` gives the app: a maker that takes a moment (GitPython, the store)
    and finds the repository around the current directory. With `gate`, the moment lasts
    until the test sets it (at most 30 s): a press is then surely before the engine."""

    def make() -> EngineReady:
        if gate is not None:
            gate.wait(30)
        else:
            time.sleep(delay)
        try:
            repo: Path | None = git.main_worktree(Path.cwd())
        except git.GitError:
            repo = None
        base = (git.current_branch(repo) or "") if repo is not None else ""
        return EngineReady(Fleet(load_settings()), repo, base)

    return make


def said(app: FleetApp) -> list[str]:
    return [f"{title}: {message}" for _, title, message in app.toasts]


async def test_n_pressed_right_after_start_opens_the_form(
        git_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the repository was set on the app from the engine's thread and `n` read it
    when pressed, so a press before the engine was made said "No repository"."""
    monkeypatch.chdir(git_repo)
    gate = threading.Event()
    app = FleetApp(looking_around(gate=gate), run_scheduler=False, bell=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("n")
        assert app.fleet is None  # pressed before the engine was there
        gate.set()  # (under load a fixed 0.3 s was over before the press was handled)
        await wait_until(pilot, lambda: isinstance(app.screen, LaunchScreen)
                         and bool(app.screen.query("#base-ref")), what="the form")
        assert not any("No repository" in s for s in said(app))
        form = app.screen
        assert f"New task in {git_repo.name}" in str(form.query_one(".dialog-title").render())
        assert form.query_one("#base-ref").placeholder == "main"  # type: ignore[attr-defined]
        form.query_one("#prompt", TextArea).text = "early bird"
        await pilot.press("ctrl+s")
        fleet = app.fleet
        assert fleet is not None
        await wait_until(pilot, lambda: len(fleet.list_tasks()) == 1, what="the task")
        assert fleet.list_tasks()[0].repo == git_repo


async def test_outside_a_repository_n_asks_which_one_once_the_engine_is_ready(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`n` pressed before the engine is ready waits for it, then asks which
    repository (it used to say "No repository" and stop there)."""
    from fleet_tui.ui.screens.modals import RepoScreen

    outside = tmp_path / "not-a-repo"
    outside.mkdir()
    monkeypatch.chdir(outside)
    app = FleetApp(looking_around(0.1), run_scheduler=False, bell=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("n")
        await wait_for_screen(pilot, RepoScreen, what="the question")
        assert app.fleet is not None and not isinstance(app.screen, LaunchScreen)


async def test_polling_starts_when_the_engine_is_ready(
        git_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EngineReady is posted once, by the start-up worker; the task list is read only
    after it (nothing waits for the engine on a thread)."""
    monkeypatch.chdir(git_repo)
    Fleet(load_settings()).submit(TaskSpec(prompt="listed", repo=git_repo))
    seen: list[Message] = []

    def hook(message: Message) -> None:
        if isinstance(message, EngineReady | TasksLoaded):
            seen.append(message)

    app = FleetApp(looking_around(), run_scheduler=False, bell=False, poll_interval=0.1)
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await wait_until(pilot, lambda: any(isinstance(m, TasksLoaded) for m in seen),
                         what="the first list")
        await pilot.pause(0.3)
    kinds = [type(m).__name__ for m in seen]
    assert kinds[0] == "EngineReady" and kinds.count("EngineReady") == 1, kinds
    ready = seen[0]
    assert isinstance(ready, EngineReady) and ready.repo == git_repo
    assert ready.default_base == "main" and app.repo == git_repo
    loaded = [m for m in seen if isinstance(m, TasksLoaded)]
    assert len(loaded[0].tasks) == 1


async def test_keys_can_be_rebound_by_binding_id(git_repo: Path) -> None:
    """A keymap names a binding's id; the key, the help and the palette follow it."""
    fleet = Fleet(load_settings())
    app = FleetApp(fleet, repo=git_repo, default_base="main", run_scheduler=False,
                   bell=False, keymap={"task.new": "N"})
    async with app.run_test(size=SIZE) as pilot:
        main = app.main
        await wait_until(pilot, lambda: main.fleet is not None, what="the engine")
        await pilot.press("n")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, LaunchScreen)  # n no longer launches
        await pilot.press("N")
        await wait_for_screen(pilot, LaunchScreen, what="the form")
        await pilot.press("escape")
        await pilot.press("question_mark")
        help_screen = await wait_for_screen(pilot, HelpScreen, what="help")
        rows = dict(row for _, section in help_screen.sections for row in section)
        assert rows["N"].startswith("launch a task") and "n" not in rows
        titles = [c.title for c in app.get_system_commands(main)]
        assert "New (N)" in titles


def test_a_keymap_naming_no_binding_is_refused(git_repo: Path) -> None:
    with pytest.raises(ValueError, match=r"no key binding has the id 'task\.nwe'") as info:
        FleetApp(Fleet(load_settings()), repo=git_repo, keymap={"task.nwe": "N"})
    assert "task.new" in str(info.value)  # the message lists the ids there are


@pytest.fixture
def gc_restored() -> Any:
    """Whatever a test does to the garbage collector is undone after it."""
    import gc

    was = gc.isenabled()
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    if was:
        gc.enable()
    else:
        gc.disable()


async def test_the_collector_paused_for_the_start_up_resumes_after_the_first_frame(
        git_repo: Path, monkeypatch: pytest.MonkeyPatch, gc_restored: None) -> None:
    """`fleet-tui` pauses the cyclic garbage collector until the first frame (it ran ~116
    times over the start-up's live objects); the app freezes those and resumes it once the
    frame is out. An app not told so leaves the collector alone."""
    import gc

    monkeypatch.chdir(git_repo)
    gc.disable()
    app = FleetApp(looking_around(0.0), run_scheduler=False, bell=False, resume_gc=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, gc.isenabled, what="the collector resumed")
        assert gc.get_freeze_count() > 1000  # the start-up's objects: not walked again
        # and a larger youngest generation, the oldest walked a quarter as often
        assert gc.get_threshold() == GC_THRESHOLDS != (700, 10, 10)
        await wait_until(pilot, lambda: app.main.task_list.poll_error is None
                         and app.fleet is not None,
                         what="the engine")
    gc.unfreeze()
    gc.disable()
    plain = FleetApp(looking_around(0.0), run_scheduler=False, bell=False)
    async with plain.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: plain.fleet is not None, what="the engine")
        await pilot.pause(0.1)
        assert not gc.isenabled() and gc.get_freeze_count() == 0


def test_the_panel_command_pauses_the_collector_for_the_app(tmp_path: Path) -> None:
    """`fleet-tui` (the panel command) runs the app with the collector paused and tells it
    to resume it; after the app the collector is on again. FleetApp.run is replaced by a
    stand-in that records what it was given (the real run is the tests above)."""
    import subprocess
    import sys

    probe = (
        "import gc\n"
        "from fleet_tui.ui import app as appmod\n"
        "seen = {}\n"
        "def run(self, *a, **k):\n"
        "    seen.update(paused=not gc.isenabled(), resume=self._resume_gc)\n"
        "appmod.FleetApp.run = run\n"
        "from fleet_tui.commands import panel\n"
        "code = panel.main([])\n"
        "print('seen', seen['paused'], seen['resume'], 'after', gc.isenabled(), code)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path, check=False)
    assert out.stdout.strip().splitlines()[-1:] == ["seen True True after True 0"], (
        out.stdout + out.stderr)


async def test_the_collector_settles_once_the_first_list_is_shown(
        git_repo: Path, monkeypatch: pytest.MonkeyPatch, gc_restored: None) -> None:
    """After the first freeze no full collection had ever run, so the collector made every
    tenth collection of the middle generation a full one, walking all that the engine made
    since (10-20 ms with the loop stopped, about once a second: the key latency's tail). Once the
    first list is shown: one full collection, then a second freeze."""
    import gc

    monkeypatch.chdir(git_repo)
    gc.disable()
    app = FleetApp(looking_around(0.0), run_scheduler=False, bell=False, resume_gc=True)
    seen: dict[str, int] = {}
    resume = app._gc_resume

    def resumed() -> None:
        resume()
        seen.update(frozen=gc.get_freeze_count(), full=gc.get_stats()[2]["collections"])

    app._gc_resume = resumed  # type: ignore[method-assign]
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: "frozen" in seen, what="the collector resumed")
        await wait_until(pilot, lambda: gc.get_freeze_count() > seen["frozen"],
                         what="the second freeze")
        assert app.main.task_list._polled  # after the first list
        assert gc.get_stats()[2]["collections"] > seen["full"]
        assert gc.isenabled()
