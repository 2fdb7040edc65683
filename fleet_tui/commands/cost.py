"""fleet-tui cost [--since 7d] [--by task|endpoint|day] [--json]: what the workers cost.

The meter (a row per request the gateway passed on, store/meter.py) summed per task,
endpoint or local day since a time, the requests whose model has no price called out (they
are counted, their cost is not: a price in config.toml mends it), and what the budgets
leave: each endpoint's budget_per_day today, each task's budget_per_task.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any, NoReturn

from fleet_tui.core import redaction
from fleet_tui.core.errors import EXIT_OK, EXIT_USAGE, FleetTuiError
from fleet_tui.core.terminal import visible
from fleet_tui.settings.config import Settings, load_settings
from fleet_tui.store import budgets
from fleet_tui.store.costs import BY, as_json, totals
from fleet_tui.store.db import Store
from fleet_tui.store.meter import Totals
from fleet_tui.system import paths

EPILOG = """\
--since takes a span back from now: 7d, 12h, 90m, 2w, 1d12h; `today` (since local
midnight) or `all`.

exit codes:
  0  ok
  2  usage or setup error (a bad option, an unreadable config.toml)
"""
_SPAN = re.compile(r"(\d+(?:\.\d+)?)\s*([wdhm])")
_UNIT = {"w": 7 * 86400.0, "d": 86400.0, "h": 3600.0, "m": 60.0}
MAX_SPAN = 3660 * 86400.0  # ten years: more is a typo


class _Usage(FleetTuiError):
    exit_code = EXIT_USAGE


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _Usage(f"{message} (see `{self.prog} --help`)")


def parse_since(text: str, now: float) -> float | None:
    """The time `--since` names (None: all of it); ValueError saying what is accepted."""
    words = text.strip().lower()
    if words == "all":
        return None
    if words == "today":
        return budgets.day_start(now)
    parts = _SPAN.findall(words)
    if not parts or _SPAN.sub("", words).strip():
        raise ValueError(f"{text!r}: expected a span such as 7d, 12h, 90m, 2w or 1d12h, "
                         "or today, or all")
    span = sum(float(n) * _UNIT[u] for n, u in parts)
    if span <= 0 or span > MAX_SPAN:
        raise ValueError(f"{text!r}: expected a span of more than 0 and at most ten years")
    return now - span


def _tokens(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def _out(text: str = "") -> None:
    sys.stdout.write(visible(redaction.redact(text)) + "\n")  # titles come from workers


def _grouped(settings: Settings, rows: dict[str, Totals], by: str) -> dict[str, Totals]:
    """By endpoint: the names a store may hold for one endpoint (its name, the default's
    base URL) as one row, under its name."""
    if by != "endpoint":
        return rows
    out: dict[str, Totals] = {}
    for key, t in rows.items():
        found = budgets.endpoint_settings(settings, key)
        name = found.name if found is not None else key
        into = out.setdefault(name, Totals())
        for f in ("requests", "input_tokens", "output_tokens", "cache_read_tokens",
                  "cache_write_tokens", "cost", "unpriced"):
            setattr(into, f, getattr(into, f) + getattr(t, f))
    return dict(sorted(out.items()))


def _sum(rows: dict[str, Totals]) -> Totals:
    total = Totals()
    for t in rows.values():
        for f in ("requests", "input_tokens", "output_tokens", "cache_read_tokens",
                  "cache_write_tokens", "cost", "unpriced"):
            setattr(total, f, getattr(total, f) + getattr(t, f))
    return total


def _unpriced_models(store: Store, since: float | None) -> list[str]:
    sql = "SELECT DISTINCT model FROM usage WHERE cost IS NULL"
    args: list[object] = []
    if since is not None:
        sql += " AND at >= ?"
        args.append(since)
    return sorted(str(r[0]) or "(none)" for r in store._connect().execute(
        sql + " ORDER BY model", args))


def _endpoint_budgets(store: Store, settings: Settings, now: float) -> list[dict[str, Any]]:
    out = []
    for endpoint in settings.endpoints or (settings.endpoint(None),):
        if not endpoint.budget_per_day:
            continue
        spent = budgets.spent_today(store, settings, endpoint.name, now)
        state = None
        for key in budgets.endpoint_keys(settings, endpoint.name):
            state = state or store.get_endpoint(key)
        held = state is not None and state.held is not None
        out.append({"endpoint": endpoint.name, "budget_per_day": endpoint.budget_per_day,
                    "spent_today": round(spent, 6),
                    "left": round(max(0.0, endpoint.budget_per_day - spent), 6),
                    "held": held})
    return out


def _task_budgets(store: Store, settings: Settings, task_ids: list[str]
                  ) -> list[dict[str, Any]]:
    out = []
    endpoints = {}
    for task_id in task_ids:
        try:
            endpoints[task_id] = store.get_task(task_id).endpoint
        except (FleetTuiError, LookupError):
            continue
    spent = totals(store, by="task", task_ids=list(endpoints))
    for task_id, endpoint in endpoints.items():
        budget = budgets.task_budget(settings, endpoint)
        if not budget:
            continue
        cost = spent[task_id].cost if task_id in spent else 0.0
        out.append({"id": task_id, "budget_per_task": budget, "spent": round(cost, 6),
                    "left": round(max(0.0, budget - cost), 6)})
    return out


def _titles(store: Store, task_ids: list[str]) -> dict[str, str]:
    out = {}
    for task_id in task_ids:
        try:
            out[task_id] = store.get_task(task_id).short_title
        except (FleetTuiError, LookupError):
            out[task_id] = "(no such task now)"
    return out


def main(argv: list[str]) -> int:
    """Every failure is one line on stderr and an exit code."""
    try:
        return _main(argv)
    except SystemExit as exc:  # --help
        return int(exc.code or 0) if isinstance(exc.code, int | None) else EXIT_USAGE
    except FleetTuiError as exc:
        sys.stderr.write(f"fleet-tui cost: {redaction.redact(exc.message)}\n")
        return exc.exit_code
    except BrokenPipeError:
        return EXIT_OK


def _main(argv: list[str]) -> int:
    p = _Parser(prog="fleet-tui cost", epilog=EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter,
                description="What the workers' requests cost (the gateway's meter), and "
                            "what the budgets leave.")
    p.add_argument("--since", default="7d", help="how far back (default 7d)")
    p.add_argument("--by", default="endpoint", choices=BY,
                   help="one row per task, endpoint or local day (default endpoint)")
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)
    now = time.time()
    try:
        since = parse_since(args.since, now)
    except ValueError as exc:
        raise _Usage(f"--since: {exc}") from None
    settings = load_settings()  # a ConfigError is a usage error (exit 2)
    report, rows, titles = cost_report(settings, since, args.by, now)
    if args.json:
        _out(json.dumps(report, indent=2))
        return EXIT_OK
    _print(report, rows, titles, args.since)
    return EXIT_OK


def cost_report(settings: Settings, since: float | None, by: str, now: float
                ) -> tuple[dict[str, Any], dict[str, Totals], dict[str, str]]:
    """What `cost --json` prints (the report), its rows, and the tasks' titles (by task):
    the one reading of the meter the command and the MCP server's `cost` tool share."""
    store = Store(paths.db_path())
    try:
        rows = _grouped(settings, totals(store, by=by, since=since), by)
        in_window = list(totals(store, by="task", since=since))
        task_ids = [t for t in in_window if t]
        report = {
            "since": since, "by": by,
            "rows": [{by: key or None, **as_json(t)} for key, t in rows.items()],
            "total": as_json(_sum(rows)),
            "unpriced_models": _unpriced_models(store, since),
            "budgets": {"endpoints": _endpoint_budgets(store, settings, now),
                        "tasks": _task_budgets(store, settings, task_ids)},
        }
        titles = _titles(store, [k for k in rows if k]) if by == "task" else {}
    finally:
        store.close()
    return report, rows, titles


def _print(report: dict[str, Any], rows: dict[str, Totals], titles: dict[str, str],
           since_text: str) -> None:
    by = report["by"]
    span = "all time" if report["since"] is None else (
        "today" if since_text.strip().lower() == "today" else f"the last {since_text}")
    if not rows:
        _out(f"no metered requests in {span} (requests are metered when workers go "
             "through the gateway: gateway = true in config.toml)")
    else:
        width = max(8, *(len(k or "-") for k in rows))
        _out(f"{by.upper():<{width}}  {'REQUESTS':>8}  {'IN':>7}  {'OUT':>7}  "
             f"{'CACHE R':>7}  {'CACHE W':>7}  {'COST':>10}" + ("  TITLE" if titles else ""))
        for key, t in [*rows.items(), ("total", _sum(rows))]:
            cost = budgets.usd(t.cost) + ("*" if t.unpriced else "")
            title = f"  {titles.get(key, '')}" if titles and key != "total" else ""
            _out(f"{key or '-':<{width}}  {t.requests:>8}  {_tokens(t.input_tokens):>7}  "
                 f"{_tokens(t.output_tokens):>7}  {_tokens(t.cache_read_tokens):>7}  "
                 f"{_tokens(t.cache_write_tokens):>7}  {cost:>10}{title}")
        unpriced = report["total"]["unpriced"]
        if unpriced:
            models = ", ".join(report["unpriced_models"])
            _out(f"* {unpriced} request{'s' if unpriced != 1 else ''} of a model with no "
                 f"price ({models}) counted without a cost; give it one in config.toml: "
                 '[prices."MODEL"] input = ..., output = ... (USD per million tokens)')
    ends = report["budgets"]["endpoints"]
    if ends:
        _out("budgets today (budget_per_day):")
        for e in ends:
            held = "; held: its tasks start at midnight" if e["held"] else ""
            _out(f"  {e['endpoint']}: {budgets.usd(e['spent_today'])} of "
                 f"{budgets.usd(e['budget_per_day'])} spent, {budgets.usd(e['left'])} "
                 f"left{held}")
    tasks = report["budgets"]["tasks"]
    if tasks:
        _out("task budgets (budget_per_task):")
        for t in tasks:
            _out(f"  {t['id']}: {budgets.usd(t['spent'])} of "
                 f"{budgets.usd(t['budget_per_task'])} spent, {budgets.usd(t['left'])} left")
