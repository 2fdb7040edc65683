"""Prices and budgets, against a real SQLite store and a real git
repository; the meter's rows are written with Meter.record, as the gateway writes them,
their cost from the price lookup the gateway uses (budgets.request_cost).

- the price table: the shipped prices, dated and suffixed ids, an endpoint's overrides;
- a day's budget reached holds the endpoint with the figure, one event (the panel's one
  notification), no new task starts; the next local day (an injected clock) or a higher
  budget lifts it; the engine's own hosts: the in-memory host (the test ends the runs);
- a task's budget stops it: killed with the figure, and refused before its next start.

The real claude's run with a budget met mid-run is in test_budgets_real.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from fleet_tui.core import policy, prices
from fleet_tui.core.states import TaskState
from fleet_tui.engine.fleet import Fleet
from fleet_tui.execution.memory import MemoryHost
from fleet_tui.settings.config import Settings, load_settings
from fleet_tui.settings.endpoints import Price
from fleet_tui.store import budgets
from fleet_tui.store.db import Store, TaskSpec
from fleet_tui.store.meter import Meter, Usage
from fleet_tui.system import paths

KEY = "sk-budget-test-key"


class Clock:
    """The engine's clock, moved by the test."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make(tmp_path: Path, clock: Clock, **overrides: Any) -> tuple[Fleet, MemoryHost]:
    host = MemoryHost(tmp_path / "memory-host", clock=clock)
    values: dict[str, Any] = {"key_sources": "env", "max_workers": 4, "max_attempts": 1,
                              "kill_grace": 0.5}
    values.update(overrides)
    settings = load_settings(env=os.environ, overrides=values)
    env = dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY)
    return Fleet(settings, Store(paths.db_path()), env=env, host=host, clock=clock), host


def spend(fleet: Fleet, task_id: str | None, endpoint: str, at: float, *,
          model: str = "GLM-5.2", input_tokens: int = 0, output_tokens: int = 0,
          cache_read_tokens: int = 0, cache_write_tokens: int = 0) -> float | None:
    """One request metered as the gateway meters it; its cost."""
    cost = budgets.request_cost(fleet.settings, endpoint, model, input_tokens=input_tokens,
                                output_tokens=output_tokens,
                                cache_read_tokens=cache_read_tokens,
                                cache_write_tokens=cache_write_tokens)
    Meter(fleet.store).record(Usage(at, task_id, None, endpoint, model, 200, input_tokens,
                                    output_tokens, cache_read_tokens, cache_write_tokens,
                                    cost))
    return cost


# --- the price table -----------------------------------------------------------------------


@pytest.mark.parametrize(("model", "expected"), [
    ("GLM-5.2", (1.40, 0.26, 1.40, 4.40)),
    ("glm-5.3", (1.40, 0.26, 1.40, 4.40)),
    ("GLM-4.5-Air", (0.20, 0.03, 0.20, 1.10)),
    ("claude-sonnet-4-5-20250929", (3.0, 0.30, 3.75, 15.0)),  # dated: its model
    ("claude-sonnet-4-6", (3.0, 0.30, 3.75, 15.0)),
    ("anthropic/claude-sonnet-4.5", (3.0, 0.30, 3.75, 15.0)),  # a gateway's prefix, dots
    ("claude-haiku-4-5[1m]", (1.0, 0.10, 1.25, 5.0)),
    ("claude-opus-4-20250514", (15.0, 1.50, 18.75, 75.0)),  # Opus 4: the old tier
    ("claude-opus-4-1-20250805", (15.0, 1.50, 18.75, 75.0)),
    ("Claude-Opus-4-5-20251101", (5.0, 0.50, 6.25, 25.0)),
    ("claude-opus-4-9", (5.0, 0.50, 6.25, 25.0)),  # a 4.x not in the table: its family's
])
def test_the_shipped_table_prices_models_and_their_dated_ids(
        model: str, expected: tuple[float, float, float, float]) -> None:
    price = prices.price_for(model)
    assert price is not None
    got = (price.input, price.cached_input, price.cache_write, price.output)
    assert got == pytest.approx(expected)


def test_an_unknown_model_is_unpriced_and_costs_none() -> None:
    assert prices.price_for("gpt-4o") is None
    assert prices.price_for("") is None
    assert prices.cost_of(None, input_tokens=10) is None


def test_an_endpoint_override_wins_case_insensitively_and_for_its_dated_ids() -> None:
    mine = Price(input=2.0, cached_input=0.5, cache_write=2.5, output=8.0)
    overrides = {"GLM-5.2": mine}
    assert prices.price_for("glm-5.2", overrides) is mine
    assert prices.price_for("GLM-5.2-0901", overrides) is mine  # a suffix finds it too
    assert prices.price_for("GLM-5.3", overrides) == prices.PRICES["glm-5-3"]  # the table
    assert prices.price_for("my-model", {"My-Model": mine}) is mine  # one the table lacks


def test_cost_of_counts_each_kind_at_its_price() -> None:
    price = prices.price_for("claude-sonnet-4-5")
    cost = prices.cost_of(price, input_tokens=1_000_000, output_tokens=200_000,
                          cache_read_tokens=2_000_000, cache_write_tokens=400_000)
    assert cost == pytest.approx(3.0 + 0.2 * 15.0 + 2 * 0.30 + 0.4 * 3.75)


def test_the_gateway_lookup_takes_the_endpoints_overrides(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[prices."GLM-5.2"]\ninput = 2.0\noutput = 10.0\n'
                      '[endpoints.zai]\nbase_url = "https://api.z.ai/api/anthropic"\n'
                      '[endpoints.zai.prices."glm-5.2"]\ninput = 1.0\noutput = 1.0\n')
    settings = load_settings(env={}, config_file=config)
    assert budgets.request_cost(settings, "default", "GLM-5.2",
                                input_tokens=1_000_000, output_tokens=1_000_000) == 12.0
    assert budgets.request_cost(settings, "zai", "GLM-5.2-0901",
                                input_tokens=1_000_000, output_tokens=1_000_000) == 2.0
    # tasks from before named endpoints name the default one by its base URL
    assert budgets.request_cost(settings, settings.base_url, "GLM-5.2",
                                output_tokens=1_000_000) == 10.0
    assert budgets.request_cost(settings, "zai", "unknown-model", output_tokens=5) is None


# --- a day's budget -------------------------------------------------------------------------


def noon(days: int = 0) -> float:
    """Noon local time, `days` from today: a clock far from midnight."""
    start = budgets.day_start(time.time())
    for _ in range(days):
        start = budgets.next_day(start + 1)
    return start + 12 * 3600


def held_state(fleet: Fleet, endpoint: str) -> Any:
    state = fleet.store.get_endpoint(endpoint)
    assert state is not None
    return state


def test_a_days_budget_met_holds_the_endpoint_with_the_figure_once_and_lifts_next_day(
        git_repo: Path, tmp_path: Path) -> None:
    clock = Clock(noon())
    fleet, host = make(tmp_path, clock, budget_per_day=5.0)
    (first,) = fleet.submit(TaskSpec(prompt="first", repo=git_repo))
    fleet.tick()
    assert fleet.get_task(first.id).state == TaskState.RUNNING
    ep = first.endpoint
    # the first task's requests cost $5.02 (1M in at $1.40, 822,728 out at $4.40)
    costs = [spend(fleet, first.id, ep, clock.now, input_tokens=1_000_000),
             spend(fleet, first.id, ep, clock.now + 1, output_tokens=822_728)]
    total = sum(c or 0 for c in costs)
    assert total == pytest.approx(5.02, abs=0.005)
    clock.now += 2
    queued = fleet.submit(TaskSpec(prompt="second", repo=git_repo), copies=2)
    fleet.tick()
    state = held_state(fleet, ep)
    figure = f"the endpoint default spent {budgets.usd(total)} of its $5.00 budget today"
    assert state.held is not None and state.held.startswith(figure)
    assert "budget_per_day (config.toml)" in state.held
    assert state.event == "hold" and policy.budget_held(state)
    event_at = state.event_at
    for t in queued:  # no new task starts, each says why
        task = fleet.get_task(t.id)
        assert task.state == TaskState.QUEUED and fleet.attempts(t.id) == []
        assert (task.message or "").startswith(f"held: {figure}")
    assert fleet.get_task(first.id).state == TaskState.RUNNING  # what runs goes on
    (status,) = fleet.status().endpoints
    assert status.budget and status.held_reason == \
        f"budget met: {budgets.usd(total)} of $5.00 today"
    assert status.held_task is None
    assert fleet.status().spent_today == {"default": pytest.approx(total)}
    # more spend: the figure follows, the event (the one notification) does not
    clock.now += 5
    more = spend(fleet, first.id, ep, clock.now, output_tokens=100_000) or 0
    host.runs_of(first.id)[0].finish("done")
    for _ in range(3):
        clock.now += 1
        fleet.tick()
    state = held_state(fleet, ep)
    assert budgets.usd(total + more) in (state.held or "")
    assert state.event == "hold" and state.event_at == event_at
    assert all(fleet.get_task(t.id).state == TaskState.QUEUED for t in queued)
    assert len(host.started) == 1
    assert budgets.budget_refusal(fleet.store, fleet.settings, queued[0].id, ep,
                                  clock.now) == state.held  # the gateway's answer
    # the next local day: the hold lifts by itself, the queue starts
    clock.now = budgets.next_day(clock.now) + 60
    fleet.tick()
    state = held_state(fleet, ep)
    assert state.held is None and state.held_settings is None
    assert all(fleet.get_task(t.id).state == TaskState.RUNNING for t in queued)
    assert not any((fleet.get_task(t.id).message or "").startswith("held: ")
                   for t in queued)
    assert budgets.budget_refusal(fleet.store, fleet.settings, queued[0].id, ep,
                                  clock.now) is None


def test_a_higher_budget_in_the_settings_lifts_the_hold(git_repo: Path,
                                                         tmp_path: Path) -> None:
    clock = Clock(noon())
    fleet, host = make(tmp_path, clock, budget_per_day=1.0)
    (task,) = fleet.submit(TaskSpec(prompt="one", repo=git_repo))
    spend(fleet, None, task.endpoint, clock.now, input_tokens=1_000_000)  # $1.40
    fleet.tick()
    assert held_state(fleet, task.endpoint).held is not None
    assert fleet.get_task(task.id).state == TaskState.QUEUED and host.started == []
    # an account hold's way out (new settings) does not lift a budget's...
    fleet.apply_settings(load_settings(env=os.environ, overrides={
        "key_sources": "env", "max_workers": 4, "budget_per_day": 1.0, "model": "GLM-5.3"}))
    clock.now += 1
    fleet.tick()
    assert fleet.get_task(task.id).state == TaskState.QUEUED
    # ...a budget above the spend does
    fleet.apply_settings(_with_budget(fleet.settings, 2.0))
    clock.now += 1
    fleet.tick()
    assert held_state(fleet, task.endpoint).held is None
    assert fleet.get_task(task.id).state == TaskState.RUNNING


def _with_budget(settings: Settings, per_day: float) -> Settings:
    return load_settings(env=os.environ, overrides={
        "key_sources": "env", "max_workers": 4, "budget_per_day": per_day,
        "model": settings.model})


def test_an_account_hold_is_not_lifted_by_the_budget_check(git_repo: Path,
                                                             tmp_path: Path) -> None:
    clock = Clock(noon())
    fleet, _ = make(tmp_path, clock, budget_per_day=100.0)
    (task,) = fleet.submit(TaskSpec(prompt="one", repo=git_repo))
    effect = policy.Effect("hold", reason="z.ai: arrears (code 1113)", task="x",
                           settings=policy.settings_key(fleet.settings))
    fleet.store.change_endpoint(task.endpoint, lambda s: policy.apply_effect(
        s, effect, fleet.settings, clock.now), clock.now)
    fleet.tick()
    state = held_state(fleet, task.endpoint)
    assert state.held == "z.ai: arrears (code 1113)"
    assert fleet.get_task(task.id).state == TaskState.QUEUED


# --- a task's budget ------------------------------------------------------------------------


def test_a_task_over_its_budget_is_stopped_with_the_figure(git_repo: Path,
                                                           tmp_path: Path) -> None:
    clock = Clock(noon())
    fleet, host = make(tmp_path, clock, budget_per_task=0.5)
    (task, other) = fleet.submit(TaskSpec(prompt="spend", repo=git_repo), copies=2)
    fleet.tick()
    run = host.runs_of(task.id)[0]
    spend(fleet, task.id, task.endpoint, clock.now, input_tokens=100_000)  # $0.14
    clock.now += 1
    fleet.tick()
    assert run.alive  # under its budget
    spend(fleet, task.id, task.endpoint, clock.now, output_tokens=100_000)  # +$0.44
    refusal = budgets.budget_refusal(fleet.store, fleet.settings, task.id, task.endpoint)
    assert refusal == (f"stopped: task {task.id} spent $0.58 of its $0.50 budget; raise "
                       "budget_per_task (config.toml) and retry it to go on")
    clock.now += 1
    fleet.tick()
    assert not run.alive  # the engine asked it to stop (the memory host: exit 143)
    clock.now += 1
    fleet.tick()
    done = fleet.get_task(task.id)
    assert done.state == TaskState.KILLED and done.verdict == "killed"
    assert done.message == refusal
    assert fleet.get_task(other.id).state == TaskState.RUNNING  # its copy is not stopped
    assert budgets.budget_refusal(fleet.store, fleet.settings, other.id,
                                  other.endpoint) is None


def test_a_task_over_its_budget_is_not_started_again(git_repo: Path,
                                                      tmp_path: Path) -> None:
    clock = Clock(noon())
    fleet, host = make(tmp_path, clock, budget_per_task=0.1)
    (task,) = fleet.submit(TaskSpec(prompt="spend", repo=git_repo))
    # its earlier attempts spent it all (a retry queued it again)
    spend(fleet, task.id, task.endpoint, clock.now, input_tokens=100_000)  # $0.14
    fleet.tick()
    done = fleet.get_task(task.id)
    assert host.started == []
    assert done.state == TaskState.KILLED
    assert done.message is not None and "spent $0.14 of its $0.10 budget" in done.message


# --- policy's part: a budget hold is the scheduler's to lift ---------------------------------


def test_policy_keeps_a_budget_hold_closed_whatever_the_settings() -> None:
    from fleet_tui.store.db import EndpointState

    settings = load_settings(env={}, config_file="/nonexistent/config.toml")
    held = ("the endpoint default spent $5.02 of its $5.00 budget today; its tasks start "
            "again at midnight (local time), or when budget_per_day (config.toml) is raised")
    state = EndpointState("default", held=held, held_settings=f"{policy.BUDGET_HOLD}0")
    gate = policy.gate(state, settings, time.time(), 0, settings_now="another-key")
    assert gate.cap is None and gate.why == f"held: {held}" and gate.fields is None
    assert policy.stop_for_endpoint(state, time.time()) is None  # runs go on
    assert policy.held_reason(held) == "budget met: $5.02 of $5.00 today"
    assert policy.endpoint_note(state, settings, time.time()) == f"held: {held}"
    # an account hold is still lifted by new settings
    account = EndpointState("default", held="arrears", held_settings="old-key")
    assert policy.gate(account, settings, time.time(), 0,
                       settings_now="new-key").fields == {
        "held": None, "held_task": None, "held_settings": None}
