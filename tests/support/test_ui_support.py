"""Shared pieces of the panel tests: the real-engine rig, waiting helpers, quick scripts.

Imported by the other tests/test_ui_*.py modules. The rig is real: a real git repository,
the real SQLite store, the real engine with its scheduler thread, the real claude binary
talking to the scripted endpoint on 127.0.0.1.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from textual.pilot import Pilot
from textual.screen import Screen

from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import TaskSpec, TaskState
from fleet_tui.ui.app import FleetApp
from fleet_tui.ui.screens.main import MainScreen
from fleet_tui.ui.widgets.stream_view import StreamView

TEST_KEY = "ui-test-key-7f3a9c"


def _tool(name: str, **inputs: Any) -> dict[str, Any]:
    return {"type": "tool_use", "name": name, "input": inputs}


QUICK_SCRIPTS: dict[str, Any] = {
    "default": [
        [{"type": "text", "text": "Writing hello.txt."},
         _tool("Write", file_path="{cwd}/hello.txt", content="hello from the worker\n")],
        [_tool("Bash", command="cat hello.txt", description="show it")],
        "Wrote hello.txt.",
    ],
    "second": [
        [_tool("Write", file_path="{cwd}/second.txt", content="second pass\n")],
        "Wrote second.txt.",
    ],
    "side-a": [
        [_tool("Write", file_path="{cwd}/shared.txt", content="from A\n")],
        "A done.",
    ],
    "side-b": [
        [_tool("Write", file_path="{cwd}/shared.txt", content="from B\n")],
        "B done.",
    ],
    "slow": [
        [_tool("Bash", command="sleep 60", description="take a long time")],
        "never reached",
    ],
    # runs long enough to open a dialog on it, then ends by itself
    "pause": [
        [_tool("Bash", command="sleep 4", description="take a moment")],
        "Paused.",
    ],
    "denied": {"faults": [{"status": 401, "times": None}],
               "turns": ["unreachable"]},
}


@dataclass
class Rig:
    """Everything a panel test drives: engine, repository, endpoint."""

    fleet: Fleet
    repo: Path
    endpoint: ScriptedEndpoint

    def app(self, **kwargs: Any) -> FleetApp:
        options: dict[str, Any] = dict(repo=self.repo, default_base="main", bell=False,
                                       poll_interval=0.25, diff_interval=0.5,
                                       stream_interval=0.05, scheduler_interval=0.2)
        options.update(kwargs)
        return FleetApp(self.fleet, **options)

    def submit(self, prompt: str, title: str = "") -> str:
        return self.fleet.submit(TaskSpec(prompt=prompt, title=title, repo=self.repo))[0].id

    def state(self, task_id: str) -> TaskState:
        return self.fleet.get_task(task_id).state


@pytest.fixture
def rig(claude_bin: str, git_repo: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    with ScriptedEndpoint(QUICK_SCRIPTS) as endpoint:
        monkeypatch.setenv("FLEET_WORKER_BASE_URL", endpoint.url)
        monkeypatch.setenv("FLEET_WORKER_CLAUDE", claude_bin)
        monkeypatch.setenv("FLEET_WORKER_KEY_SOURCES", "env")
        monkeypatch.setenv("FLEET_WORKER_BACKOFF_BASE", "0.2")
        monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", TEST_KEY)
        monkeypatch.setenv("CLAUDE_CODE_MAX_RETRIES", "0")
        fleet = Fleet(load_settings())
        yield Rig(fleet=fleet, repo=git_repo, endpoint=endpoint)


async def wait_until(pilot: Pilot[Any], predicate: Callable[[], bool], *,
                     timeout: float = 30.0,
                     what: str | Callable[[], str] = "the condition") -> None:
    """Let the app run until ``predicate()`` holds (fails the test after ``timeout``);
    ``what`` may be a function, to say what the app shows at that moment."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await pilot.pause(0.05)
    said = what() if callable(what) else what
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {said}")


ScreenT = TypeVar("ScreenT", bound=Screen[Any])


async def wait_for_screen(pilot: Pilot[Any], kind: type[ScreenT], *, timeout: float = 30.0,
                          what: str = "") -> ScreenT:
    """Let the app run until its top screen is a ``kind`` that has composed and mounted;
    that screen. A pushed screen is ``app.screen`` at once, before its compose ran: a query
    of one of its widgets then finds none (NoMatches), and its focus is not set yet."""
    app = pilot.app
    await wait_until(pilot, lambda: isinstance(app.screen, kind) and app.screen.is_mounted,
                     timeout=timeout, what=what or f"the {kind.__name__}")
    screen = app.screen
    assert isinstance(screen, kind)
    return screen


def main_screen(app: FleetApp) -> MainScreen:
    return app.main


def stream_text(app: FleetApp) -> str:
    return "\n".join(app.main.query_one(StreamView).plain_lines())


def toasts(app: FleetApp) -> list[str]:
    return [f"{title}: {message}" for _, title, message in app.toasts]


def test_quick_scripts_are_valid() -> None:
    """The endpoint accepts every script the panel tests use."""
    endpoint = ScriptedEndpoint(QUICK_SCRIPTS)
    assert set(endpoint.scripts) >= set(QUICK_SCRIPTS)
