"""Every task runs once (issue 9, finding 14): an engine killed while it starts a runner,
and a second engine (another terminal's `fleet-tui ls`) beside a slow first one, never
make two workers of one task. Real engine processes, real SIGKILL, real git (a real
post-checkout hook makes the checkout slow), real runners and the real claude."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_tui import fleet as fleet_mod
from fleet_tui import paths, procs
from fleet_tui.config import load_settings
from fleet_tui.endpoint import ScriptedEndpoint
from fleet_tui.fleet import Fleet, TaskSpec
from fleet_tui.runner import EVENTS_FILE
from fleet_tui.store import FINISHED_STATES, Store, TaskState

pytestmark = pytest.mark.real_claude

KEY = "sk-fleet-once-SECRET-0c1e"
TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

SCRIPTS: dict[str, Any] = {
    # long enough that a second runner would overlap the first one
    "default": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "sleep 2; echo once >> once.txt", "description": "work"}}],
        "done once",
    ],
}


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(SCRIPTS) as ep:
        yield ep


def _overrides(endpoint: ScriptedEndpoint, claude: str, **more: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "base_url": endpoint.url, "claude": claude, "sandbox": os.geteuid() == 0,
        "key_sources": "env", "kill_grace": 2.0, "max_workers": 4,
    }
    values.update(more)
    return values


def _env() -> dict[str, str]:
    return dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0")


def make_fleet(endpoint: ScriptedEndpoint, claude: str, **more: Any) -> Fleet:
    settings = load_settings(env=os.environ, overrides=_overrides(endpoint, claude, **more))
    return Fleet(settings, Store(paths.db_path()), env=_env())


def engine_process(tmp_path: Path, endpoint: ScriptedEndpoint, claude: str, *,
                   die_at: str | None = None, until_settled: list[str] | None = None,
                   **more: Any) -> subprocess.Popen[bytes]:
    """Start tests/engine_child.py: a real engine in its own process."""
    config = tmp_path / f"engine-{time.monotonic_ns()}.json"
    config.write_text(json.dumps({
        "settings": _overrides(endpoint, claude, **more), "env": _env(),
        "db": str(paths.db_path()), "die_at": die_at, "until_settled": until_settled}))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)]))
    return subprocess.Popen([sys.executable, str(TESTS / "engine_child.py"), str(config)],
                            env=env)


def drive(fleet: Fleet, until: Callable[[], bool], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            states = {t.id: (t.state, t.message) for t in fleet.list_tasks()}
            pytest.fail(f"timed out waiting; tasks: {states}")
        fleet.tick()
        time.sleep(0.05)


def runs_in(endpoint: ScriptedEndpoint, worktree: Path) -> int:
    """How many claude runs the endpoint saw in this worktree (first turns of the task's
    conversation; the CLI's title request is not a run)."""
    return sum(1 for r in endpoint.requests if r.turn == 0 and r.cwd == str(worktree)
               and not (r.prompt or "").startswith("<session>"))


def init_lines(events: Path) -> int:
    count = 0
    for line in events.read_bytes().splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if obj.get("type") == "system" and obj.get("subtype") == "init":
            count += 1
    return count


def runner_processes(adir: Path) -> list[int]:
    return [st.pid for st in procs.all_stats() if st.state != "Z"
            and procs.cmdline(st.pid)[-1:] == [str(adir)]
            and "fleet_tui.runner" in procs.cmdline(st.pid)]


def assert_ran_once(fleet: Fleet, endpoint: ScriptedEndpoint, task_id: str) -> None:
    done = fleet.get_task(task_id)
    assert done.state == TaskState.SUCCEEDED, (done.state, done.message)
    attempts = fleet.attempts(task_id)
    assert len(attempts) == 1, [(a.n, a.verdict, a.message) for a in attempts]
    adir = Path(attempts[0].dir or "")
    assert init_lines(adir / EVENTS_FILE) == 1
    assert runs_in(endpoint, Path(done.worktree or "")) == 1
    assert (Path(done.worktree or "") / "once.txt").read_text() == "once\n"


@pytest.fixture
def no_runner_left() -> Iterator[None]:
    yield
    for st in procs.all_stats():
        if "fleet_tui.runner" in procs.cmdline(st.pid) and st.state != "Z":
            procs.signal_tree(st.pid, signal.SIGKILL)


@pytest.mark.parametrize("die_at", ["after-claim", "after-runner-spawn"])
def test_an_engine_killed_while_starting_a_task_never_runs_it_twice(
        die_at: str, git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_runner_left: None) -> None:
    fleet = make_fleet(endpoint, claude_bin)
    (task,) = fleet.submit(TaskSpec(prompt="work once", repo=git_repo))
    child = engine_process(tmp_path, endpoint, claude_bin, die_at=die_at)
    assert child.wait(timeout=60) == -signal.SIGKILL
    assert fleet.get_task(task.id).state == TaskState.RUNNING  # claimed by the dead engine
    # "any fleet-tui ls 60 s later": the start grace has passed
    monkeypatch.setattr(fleet_mod, "START_GRACE", 0.5)
    time.sleep(0.6)
    drive(fleet, lambda: fleet.get_task(task.id).state in FINISHED_STATES)
    assert_ran_once(fleet, endpoint, task.id)


def test_a_second_engine_beside_a_slow_start_never_runs_a_task_twice(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, no_runner_left: None) -> None:
    # a slow checkout: git runs this hook for every `git worktree add`
    hook = git_repo / ".git" / "hooks" / "post-checkout"
    hook.write_text("#!/bin/sh\nsleep 1\n")
    hook.chmod(0o755)
    copies = 6
    fleet = make_fleet(endpoint, claude_bin, max_workers=copies)
    tasks = fleet.submit(TaskSpec(prompt="work once", repo=git_repo), copies=copies)
    ids = [t.id for t in tasks]
    first = engine_process(tmp_path, endpoint, claude_bin, until_settled=ids,
                           max_workers=copies)
    # the first engine claims all of them, then needs ~1 s per worktree
    deadline = time.monotonic() + 30
    while fleet.store.count_tasks(TaskState.RUNNING) < copies:
        assert time.monotonic() < deadline, "the first engine claimed nothing"
        time.sleep(0.02)
    # another terminal's `fleet-tui ls`, long enough after the claims (the grace shortened)
    monkeypatch.setattr(fleet_mod, "START_GRACE", 0.5)
    try:
        drive(fleet, lambda: first.poll() is not None, timeout=180)
        assert first.returncode == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    for task_id in ids:
        assert_ran_once(fleet, endpoint, task_id)
