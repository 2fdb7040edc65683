"""Budgets as the running gateway keeps them: it reads config.toml again as the
engine does (a raised budget_per_task lets the next request through, no restart), and a
budget_per_day met mid-run parks the endpoint's running tasks at their next request (the
gateway answers, nothing goes upstream); they resume in their sessions once it is raised.

Real claude through the gateway against the scripted endpoint; the budgets in config.toml
(which the engine and the gateway both read); the spend that meets a budget written as the
gateway writes its meter rows."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from endpoint_helpers import shared
from test_budgets_real import meter_request
from test_fleet import KEY, drive, settled
from test_gateway_routes import gate_step

from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.gateway import control
from fleet_tui.settings.config import config_file_path, load_settings
from fleet_tui.settings.watch import SETTLE
from fleet_tui.store.db import Store, TaskState
from fleet_tui.system import paths


def write_config(text: str) -> None:
    path = config_file_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def budget_fleet(ep: ScriptedEndpoint, claude: str, **overrides: Any) -> Fleet:
    """An engine whose settings are config.toml's (budgets there), watched as the panel
    watches it; the CLI's own retries off."""
    import os

    values: dict[str, Any] = {"base_url": ep.url, "claude": claude,
                              "sandbox": os.geteuid() == 0, "key_sources": "env",
                              "backoff_base": 0.2, "backoff_cap": 1.0, "kill_grace": 1.0,
                              "max_workers": 4, "gateway": True, **overrides}
    env = dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0")
    fleet = Fleet(load_settings(env=os.environ, overrides=values), Store(paths.db_path()),
                  env=env)
    fleet.watch_settings(config_file_path(),
                         loader=lambda: load_settings(env=os.environ, overrides=values))
    return fleet


def _saved_session(task_id: str) -> bool:
    """claude's transcript of the task's session is on disk (its config dir's projects/)."""
    return any(paths.task_config_dir(task_id).glob("projects/*/*.jsonl"))


def raise_budget(fleet: Fleet, text: str) -> None:
    """config.toml written again, and rested, so that a look at it reads it."""
    time.sleep(0.01)  # a new mtime even on a coarse clock
    write_config(text)
    deadline = time.monotonic() + SETTLE + 10
    while not fleet.check_settings():
        assert time.monotonic() < deadline, "the engine never read the new settings"
        time.sleep(0.05)


def test_a_raised_task_budget_lets_the_next_request_through_without_a_restart(
        git_repo: Path, claude_bin: str, tmp_path: Path) -> None:
    gate = shared(git_repo, "gate") / "go"
    script = {"real_turns": True, "turns": [[gate_step(gate)], [gate_step(gate)], "done"]}
    write_config("budget_per_task = 0.5\n")
    with ScriptedEndpoint({"default": script}) as ep:
        fleet = budget_fleet(ep, claude_bin)
        try:
            (task,) = fleet.submit(TaskSpec(prompt="answer", repo=git_repo))
            drive(fleet, lambda: len(ep.message_requests()) >= 1, timeout=120)
            # claude saves its session a moment after the first answer: killed before, it
            # leaves nothing to resume ("No conversation found"), which this test is not about
            drive(fleet, lambda: _saved_session(task.id), timeout=60)
            first = control.read_info(fleet.env)
            assert first is not None
            meter_request(fleet, task.id, task.endpoint, input_tokens=100_000,
                          output_tokens=100_000)  # $0.58: over its $0.50
            gate.touch()
            drive(fleet, settled(fleet, task.id), timeout=120)
            stopped = fleet.get_task(task.id)
            assert stopped.state == TaskState.KILLED, stopped.message
            assert "budget" in (stopped.message or "")
            served = len(ep.message_requests())
            raise_budget(fleet, "budget_per_task = 5.0\n")
            fleet.retry(task.id, resume=True)
            drive(fleet, settled(fleet, task.id), timeout=120, each=fleet.check_settings)
            done = fleet.get_task(task.id)
            assert done.state == TaskState.SUCCEEDED, done.message
            assert len(ep.message_requests()) > served  # the next request went through
            assert control.read_info(fleet.env) == first  # the same gateway: no restart
        finally:
            control.stop(fleet.env)


def test_a_day_budget_met_mid_run_parks_the_running_tasks_until_it_is_raised(
        git_repo: Path, claude_bin: str, tmp_path: Path) -> None:
    gate = shared(git_repo, "gate") / "go"
    script = {"real_turns": True, "turns": [[gate_step(gate)], [gate_step(gate)], "done"]}
    write_config("budget_per_day = 1.0\n")
    with ScriptedEndpoint({"default": script}) as ep:
        fleet = budget_fleet(ep, claude_bin)
        try:
            tasks = fleet.submit(TaskSpec(prompt="answer", repo=git_repo), copies=2)
            # both workers have had their first answer and wait in their first step
            drive(fleet, lambda: len(ep.message_requests()) >= 2, timeout=120)
            meter_request(fleet, tasks[0].id, tasks[0].endpoint, input_tokens=200_000,
                          output_tokens=200_000)  # $1.16: the day's $1.00 met
            served = len(ep.message_requests())
            gate.touch()

            def parked() -> bool:
                return all(fleet.get_task(t.id).state == TaskState.WAITING
                           and fleet.get_task(t.id).verdict == "budget" for t in tasks)

            drive(fleet, parked, timeout=120)
            # no request of theirs reached the endpoint after the budget was met
            assert len(ep.message_requests()) == served
            state = fleet.store.get_endpoint(tasks[0].endpoint)
            assert state is not None and state.held is not None and "budget" in state.held
            for task in tasks:
                message = fleet.get_task(task.id).message or ""
                assert "$1.00 budget today" in message and "resumes in its session" \
                    in message, message
            for _ in range(20):  # they stay parked while the budget is met
                fleet.tick()
                time.sleep(0.05)
            assert parked() and len(ep.message_requests()) == served
            raise_budget(fleet, "budget_per_day = 100.0\n")
            drive(fleet, settled(fleet, *[t.id for t in tasks]), timeout=180,
                  each=fleet.check_settings)
        finally:
            control.stop(fleet.env)
    for task in tasks:
        done = fleet.get_task(task.id)
        assert done.state == TaskState.SUCCEEDED, done.message
        attempts = fleet.attempts(task.id)
        assert [a.verdict for a in attempts] == ["budget", "ok"], attempts
        assert attempts[-1].kind == "resume"  # in its session
        assert attempts[-1].session_id == attempts[0].session_id
