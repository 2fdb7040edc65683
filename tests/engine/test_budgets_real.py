"""Budgets met mid-run, end to end: the real claude against the scripted endpoint, the
engine's passes as `fleet-tui` runs them, and the meter's rows written as the gateway writes
them for the requests the endpoint saw (Meter.record, the cost from budgets.request_cost).

- a budget reached mid-run: the endpoint is held with the figure (one event), the task
  that runs finishes, the queued ones do not start;
- a task's budget reached mid-run: the task is stopped, killed with the figure.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from test_fleet import drive, make_fleet, settled

from fleet_tui.core import policy
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.store import budgets
from fleet_tui.store.db import TaskState
from fleet_tui.store.meter import Meter, Usage

# a tool turn that takes a while (the budget is met meanwhile), then an answer
SLOW: dict[str, Any] = {
    "real_turns": True,
    "turns": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "echo one > one.txt; sleep 4", "description": "one"}}],
        "one file written",
    ],
}
# a tool turn far longer than the test waits: only a stop ends it
ENDLESS: dict[str, Any] = {
    "real_turns": True,
    "turns": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "echo one > one.txt; sleep 60", "description": "one"}}],
        "never reached",
    ],
}


def meter_request(fleet: Fleet, task_id: str, endpoint: str, **tokens: int) -> float:
    """The gateway's row for one request the endpoint answered."""
    cost = budgets.request_cost(fleet.settings, endpoint, "GLM-5.2", **tokens)
    assert cost is not None
    Meter(fleet.store).record(Usage(time.time(), task_id, None, endpoint, "GLM-5.2", 200,
                                    tokens.get("input_tokens", 0),
                                    tokens.get("output_tokens", 0), 0, 0, cost))
    return cost


@pytest.mark.parametrize("gateway", [False, True], ids=["direct", "gateway"])
def test_a_budget_reached_mid_run_holds_the_endpoint_with_the_figure(
        git_repo: Path, claude_bin: str, gateway: bool) -> None:
    """Through the gateway too: the running task's next request still goes out (an
    endpoint's day budget holds its queue, not the run in progress)."""
    from fleet_tui.gateway import control

    with ScriptedEndpoint({"default": SLOW}) as ep:
        fleet = make_fleet(ep, claude_bin, max_workers=1, budget_per_day=1.0,
                           gateway=gateway)
        try:
            first, *queued = fleet.submit(TaskSpec(prompt="write one.txt", repo=git_repo),
                                          copies=3)
            drive(fleet, lambda: len(ep.message_requests()) >= 1)
            # the first request cost $1.40 (1M tokens in): over the day's $1.00
            spent = meter_request(fleet, first.id, first.endpoint, input_tokens=1_000_000)
            drive(fleet, settled(fleet, first.id), timeout=90)
            deadline = time.monotonic() + 2.0  # and a while longer: nothing else starts
            drive(fleet, lambda: time.monotonic() > deadline)
            requests = ep.message_requests()
            worktree = str(fleet.get_task(first.id).worktree)
        finally:
            if gateway:
                control.stop(fleet.env)
    if gateway:  # the gateway metered them: its own rows beside the one written here
        spent = budgets.spent_today(fleet.store, fleet.settings, first.endpoint)
        assert len(Meter(fleet.store).rows()) == len(requests) + 1
    done = fleet.get_task(first.id)
    assert done.state == TaskState.SUCCEEDED, done.message  # what ran goes on
    assert requests and all(r.cwd == worktree for r in requests)  # only the first's
    state = fleet.store.get_endpoint(first.endpoint)
    assert state is not None and policy.budget_held(state)
    figure = f"the endpoint default spent {budgets.usd(spent)} of its $1.00 budget today"
    assert (state.held or "").startswith(figure) and state.event == "hold"
    for t in queued:
        task = fleet.get_task(t.id)
        assert task.state == TaskState.QUEUED and fleet.attempts(t.id) == []
        assert (task.message or "").startswith(f"held: {figure}")
    (status,) = fleet.status().endpoints
    assert status.budget and status.held_reason == f"budget met: {budgets.usd(spent)} " \
                                                   "of $1.00 today"


def test_a_task_budget_reached_mid_run_stops_the_task_with_the_figure(
        git_repo: Path, claude_bin: str) -> None:
    with ScriptedEndpoint({"default": ENDLESS}) as ep:
        fleet = make_fleet(ep, claude_bin, budget_per_task=0.5, kill_grace=1.0)
        (task,) = fleet.submit(TaskSpec(prompt="write one.txt", repo=git_repo))
        drive(fleet, lambda: len(ep.message_requests()) >= 1)
        drive(fleet, lambda: (Path(str(fleet.get_task(task.id).worktree)) / "one.txt")
              .exists())  # its tool runs: the sleep is under way
        started = time.monotonic()
        spent = meter_request(fleet, task.id, task.endpoint, input_tokens=100_000,
                              output_tokens=100_000)  # $0.58
        drive(fleet, settled(fleet, task.id), timeout=40)
        took = time.monotonic() - started
    done = fleet.get_task(task.id)
    assert done.state == TaskState.KILLED and done.verdict == "killed", done.message
    assert done.message == (f"stopped: task {task.id} spent {budgets.usd(spent)} of its "
                            "$0.50 budget; raise budget_per_task (config.toml) and retry "
                            "it to go on")
    (attempt,) = fleet.attempts(task.id)
    assert attempt.verdict == "killed" and attempt.message == done.message
    assert took < 30  # stopped, not the 60 s sleep's end


# a short tool turn (the budget is met meanwhile), then a next request the gateway refuses
TWO_TURNS: dict[str, Any] = {
    "real_turns": True,
    "turns": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "echo one > one.txt; sleep 3", "description": "one"}}],
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "echo two > two.txt", "description": "two"}}],
        "never reached",
    ],
}


def test_through_the_gateway_a_task_over_its_budget_is_stopped_for_it_not_for_the_key(
        git_repo: Path, claude_bin: str) -> None:
    """The gateway refuses the next request of a task over its budget; the task ends killed
    with the figure (its attempt marked stopped for the budget first), never as a refused
    key, and the endpoint is not held: its other tasks may still run."""
    from fleet_tui.gateway import control

    with ScriptedEndpoint({"default": TWO_TURNS}) as ep:
        fleet = make_fleet(ep, claude_bin, budget_per_task=0.5, kill_grace=1.0,
                           gateway=True)
        try:
            (task,) = fleet.submit(TaskSpec(prompt="write one.txt", repo=git_repo))
            drive(fleet, lambda: (Path(str(fleet.get_task(task.id).worktree)) / "one.txt")
                  .exists())  # its first tool runs
            spent = meter_request(fleet, task.id, task.endpoint, input_tokens=100_000,
                                  output_tokens=100_000)  # $0.58
            drive(fleet, settled(fleet, task.id), timeout=60)
        finally:
            control.stop(fleet.env)
    # the gateway metered the requests it passed on too: the figure is their sum
    total = Meter(fleet.store).spent(task_id=task.id)
    assert total > spent
    done = fleet.get_task(task.id)
    assert done.state == TaskState.KILLED and done.verdict == "killed", done.message
    assert done.message == (f"stopped: task {task.id} spent {budgets.usd(total)} of its "
                            "$0.50 budget; raise budget_per_task (config.toml) and retry "
                            "it to go on")
    state = fleet.store.get_endpoint(task.endpoint)
    assert state is None or state.held is None, state
    assert not (Path(str(done.worktree)) / "two.txt").exists()  # its next step never ran
