"""Cost per task in the CLI: `ls` (its cost column), `ls --json`, `show`,
`compare` and `fleet-tui cost --by task|endpoint|day`, each a real `fleet-tui` process over
a real store whose meter rows are written as the gateway writes them (Meter.record, the
cost from budgets.request_cost). Every figure printed equals the rows' sum.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from endpoint_helpers import cli_env, run_cli

from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.settings.config import load_settings
from fleet_tui.store import budgets
from fleet_tui.store.db import Store, TaskState
from fleet_tui.store.meter import Meter, Usage
from fleet_tui.system import paths

KEY = "sk-cost-cli-SECRET-77aa"


@pytest.fixture
def noon_zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A time zone where it is about noon now, here and in the CLI's processes: the test's
    "today" and "yesterday" rows then stay on their days however long it runs (in UTC a
    run just after midnight put the rows of a minute ago in yesterday: CI saw it)."""
    hour = datetime.fromtimestamp(time.time(), UTC).hour
    east = (12 - hour) % 24
    east = east - 24 if east > 12 else east
    zone = f"NOON{-east:d}"  # POSIX: the hours west of Greenwich
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    yield zone
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint({"default": ["done"]}) as ep:
        yield ep


def meter(store: Store, settings_env: dict[str, str], rows: list[dict[str, Any]]
          ) -> list[Usage]:
    """Record rows as the gateway would; returns them with their costs."""
    settings = load_settings(env=settings_env)
    out = []
    for row in rows:
        cost = budgets.request_cost(settings, row["endpoint"], row["model"],
                                    **{k: row.get(k, 0) for k in (
                                        "input_tokens", "output_tokens",
                                        "cache_read_tokens", "cache_write_tokens")})
        usage = Usage(row["at"], row.get("task"), None, row["endpoint"], row["model"], 200,
                      row.get("input_tokens", 0), row.get("output_tokens", 0),
                      row.get("cache_read_tokens", 0), row.get("cache_write_tokens", 0),
                      cost)
        Meter(store).record(usage)
        out.append(usage)
    return out


def cost_of(rows: list[Usage], **where: Any) -> float:
    return sum(r.cost or 0.0 for r in rows
               if all(getattr(r, k) == v for k, v in where.items()))


def cli_json(env: dict[str, str], repo: Path, *args: str) -> Any:
    out = run_cli(env, repo, *args)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_every_figure_of_a_tasks_cost_is_the_sum_of_its_rows(
        endpoint: ScriptedEndpoint, claude_bin: str, git_repo: Path, noon_zone: str) -> None:
    env = cli_env(endpoint.url, claude_bin, KEY, FLEET_WORKER_BUDGET_PER_TASK="1.0",
                  FLEET_WORKER_BUDGET_PER_DAY="20", TZ=noon_zone)
    out = run_cli(env, git_repo, "run", "say done", "--copies", "2", "--wait")
    assert out.returncode == 0, out.stderr
    first, second = (line.split()[0] for line in out.stdout.splitlines() if line.strip())
    store = Store(paths.db_path())
    ep = store.get_task(first).endpoint
    now = time.time()
    yesterday = budgets.day_start(now) - 3600
    rows = meter(store, env, [
        {"at": now - 60, "task": first, "endpoint": ep, "model": "GLM-5.2",
         "input_tokens": 120_000, "output_tokens": 8_000, "cache_read_tokens": 400_000},
        {"at": now - 30, "task": first, "endpoint": ep, "model": "claude-sonnet-4-5-20250929",
         "input_tokens": 1_000, "output_tokens": 2_000, "cache_write_tokens": 50_000},
        {"at": now - 20, "task": first, "endpoint": ep, "model": "mystery-model",
         "input_tokens": 10, "output_tokens": 10},
        {"at": yesterday, "task": second, "endpoint": ep, "model": "GLM-5.2",
         "input_tokens": 300_000, "output_tokens": 30_000},
    ])
    first_cost, second_cost = cost_of(rows, task_id=first), cost_of(rows, task_id=second)
    assert first_cost > 0 and second_cost > 0

    listed = {t["id"]: t for t in cli_json(env, git_repo, "ls", "--json")}
    assert listed[first]["cost"] == pytest.approx(first_cost)
    assert listed[first]["requests"] == 3 and listed[first]["unpriced"] == 1
    assert listed[first]["tokens"] == {"input": 121_010, "output": 10_010,
                                       "cache_read": 400_000, "cache_write": 50_000}
    assert listed[second]["cost"] == pytest.approx(second_cost)
    assert listed[second]["unpriced"] == 0

    table = run_cli(env, git_repo, "ls").stdout.splitlines()
    assert "COST" in table[0]
    line = next(x for x in table if x.startswith(first))
    assert f"{budgets.usd(first_cost)}*" in line  # * : some requests unpriced
    assert any("no price" in x for x in table)

    shown = cli_json(env, git_repo, "show", first, "--json")
    assert shown["cost"] == pytest.approx(first_cost) and shown["requests"] == 3
    text = run_cli(env, git_repo, "show", first).stdout
    cost_line = next(x for x in text.splitlines() if x.startswith("cost:"))
    assert budgets.usd(first_cost) in cost_line and "3 requests" in cost_line
    assert "1 of a model with no price" in cost_line
    assert f"{budgets.usd(1.0 - first_cost)} of its $1.00 budget left" in cost_line

    compared = {c["id"]: c for c in cli_json(env, git_repo, "compare", first, "--json")}
    assert compared[first]["cost"] == pytest.approx(first_cost)
    assert compared[second]["cost"] == pytest.approx(second_cost)
    assert budgets.usd(second_cost) in run_cli(env, git_repo, "compare", first).stdout

    by_task = cli_json(env, git_repo, "cost", "--json", "--by", "task", "--since", "all")
    assert {r["task"]: r["cost"] for r in by_task["rows"]} == {
        first: pytest.approx(first_cost), second: pytest.approx(second_cost)}
    assert by_task["total"]["cost"] == pytest.approx(first_cost + second_cost)
    assert by_task["total"]["unpriced"] == 1
    assert by_task["unpriced_models"] == ["mystery-model"]
    tasks_left = {t["id"]: t for t in by_task["budgets"]["tasks"]}
    assert tasks_left[first]["left"] == pytest.approx(1.0 - first_cost)

    by_endpoint = cli_json(env, git_repo, "cost", "--json", "--by", "endpoint",
                           "--since", "all")
    (row,) = by_endpoint["rows"]
    assert row["endpoint"] == "default" and row["requests"] == 4  # the base URL's rows
    assert row["cost"] == pytest.approx(first_cost + second_cost)
    (day_budget,) = by_endpoint["budgets"]["endpoints"]
    assert day_budget["spent_today"] == pytest.approx(first_cost)  # not yesterday's
    assert day_budget["left"] == pytest.approx(20 - first_cost)

    by_day = cli_json(env, git_repo, "cost", "--json", "--by", "day", "--since", "all")
    days = {r["day"]: r["cost"] for r in by_day["rows"]}
    today = datetime.fromtimestamp(now).strftime("%Y-%m-%d")
    before = datetime.fromtimestamp(yesterday).strftime("%Y-%m-%d")
    assert days == {today: pytest.approx(first_cost), before: pytest.approx(second_cost)}

    recent = cli_json(env, git_repo, "cost", "--json", "--by", "task", "--since", "2h")
    assert [r["task"] for r in recent["rows"]] == [first]  # noon: yesterday's is 13 h ago
    text = run_cli(env, git_repo, "cost", "--by", "task", "--since", "all").stdout
    assert budgets.usd(first_cost + second_cost) + "*" in text
    assert "mystery-model" in text and "budgets today (budget_per_day):" in text
    assert f"default: {budgets.usd(first_cost)} of $20.00 spent" in text


def test_cost_refuses_bad_input_with_a_clear_line(tmp_path: Path) -> None:
    env = cli_env("http://127.0.0.1:9", "/nonexistent/claude", None)
    for args, words in ((["--since", "soon"], "--since: 'soon': expected a span"),
                        (["--since", "0d"], "more than 0"),
                        (["--by", "week"], "invalid choice: 'week'"),
                        (["--bogus"], "unrecognized arguments")):
        out = run_cli(env, tmp_path, "cost", *args)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stderr.startswith("fleet-tui cost: ") and words in out.stderr, out.stderr
    out = run_cli(env, tmp_path, "cost")
    assert out.returncode == 0 and "no metered requests in the last 7d" in out.stdout


def test_an_empty_list_has_no_cost_column(tmp_path: Path, git_repo: Path) -> None:
    store = Store(paths.db_path())
    store.create_task(prompt="p", repo=git_repo, state=TaskState.SUCCEEDED)
    env = cli_env("http://127.0.0.1:9", "/nonexistent/claude", None)
    out = run_cli(env, git_repo, "ls")
    assert out.returncode == 0, out.stderr
    assert "COST" not in out.stdout.splitlines()[0]
    (task,) = json.loads(run_cli(env, git_repo, "ls", "--json").stdout)
    assert task["cost"] == 0.0 and task["requests"] == 0 and task["unpriced"] == 0
