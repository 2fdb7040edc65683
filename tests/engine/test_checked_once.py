"""Each input is checked where it enters, once: what a check resolved travels on with it.

- A task's endpoint settings (`Settings.for_endpoint`) are resolved once on the path from a
  claim to its runner: the pass that claims it resolves them (its gate and cap) and the
  launch uses those, for the model and the runner's settings alike (resolved again there,
  a reload between the two could give the runner one endpoint's model and another's URL).
- A base ref typed in the launch form is resolved by the form's check, and the engine
  takes that base as it is: it is not looked up in git a second time.

Real engine, real store, real git; the host is the in-memory one (no claude needed).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_ui_support import wait_until
from textual.widgets import Input, TextArea

from fleet_tui.engine.fleet import Fleet
from fleet_tui.execution.memory import MemoryHost
from fleet_tui.settings.config import Settings, load_settings
from fleet_tui.store.db import Store, TaskSpec
from fleet_tui.system import paths
from fleet_tui.ui.app import FleetApp
from fleet_tui.ui.screens.launch import LaunchScreen
from fleet_tui.vcs import git


def test_a_start_resolves_its_endpoint_settings_once(git_repo: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings(env=os.environ, overrides={
        "key_sources": "env", "max_workers": 4, "max_attempts": 1})
    fleet = Fleet(settings, Store(paths.db_path()),
                  env=dict(os.environ, ANTHROPIC_AUTH_TOKEN="sk-once"),
                  host=MemoryHost(tmp_path / "memory-host"))
    (task,) = fleet.submit(TaskSpec(prompt="once", repo=git_repo))
    calls: Counter[str | None] = Counter()
    real = Settings.for_endpoint

    def counted(self: Settings, name: str | None) -> Settings:
        calls[name] += 1
        return real(self, name)

    monkeypatch.setattr(Settings, "for_endpoint", counted)
    fleet.tick()
    started = fleet.get_task(task.id)
    assert started.state == "running", (started.state, started.message)
    assert calls[task.endpoint] == 1, calls


async def test_a_base_the_form_checked_is_not_resolved_again(
        git_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = Fleet(load_settings())
    resolved: list[tuple[Any, ...]] = []
    real = git.resolve_base

    def counted(repo: Path, base_ref: str | None = None, **kw: Any) -> git.Base:
        resolved.append((repo, base_ref))
        return real(repo, base_ref, **kw)

    monkeypatch.setattr(git, "resolve_base", counted)
    app = FleetApp(fleet, repo=git_repo, default_base="main", run_scheduler=False,
                   bell=False, poll_interval=0.1, diff_interval=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("n")
        await wait_until(pilot, lambda: isinstance(app.screen, LaunchScreen)
                         and bool(app.screen.query("#base-ref")), what="the form")
        form = app.screen
        form.query_one("#prompt", TextArea).text = "on main"
        form.query_one("#base-ref", Input).value = "main"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: len(fleet.list_tasks()) == 1, what="the task")
    (task,) = fleet.list_tasks()
    assert (task.base_commit, task.base_branch) == real(git_repo, "main")
    assert [ref for _, ref in resolved] == ["main"], resolved
