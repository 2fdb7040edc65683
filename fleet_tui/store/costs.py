"""The meter summed: per task, per endpoint, per local day.

Two readers: `totals` answers a question once (`fleet-tui cost`, `ls`, `show`, `compare`)
with one GROUP BY query; `Ledger` keeps the panel's figures (each listed task's cost, each
endpoint's spend today) up to date with one query per refresh that reads only the rows
recorded since the last one (the meter only grows, and its ids grow in commit order: the
store's writers take turns).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fleet_tui.store.budgets import day_start
from fleet_tui.store.meter import Totals, usage_filter

if TYPE_CHECKING:
    from datetime import tzinfo

    from fleet_tui.store.db import Store

__all__ = ["BY", "Ledger", "as_json", "totals"]

BY = ("task", "endpoint", "day")
_KEYS = {"task": "COALESCE(task_id, '')", "endpoint": "endpoint",
         "day": "date(at, 'unixepoch', 'localtime')"}
_SUMS = ("COUNT(*), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0), "
         "COALESCE(SUM(cache_read_tokens), 0), COALESCE(SUM(cache_write_tokens), 0), "
         "COALESCE(SUM(cost), 0), COALESCE(SUM(cost IS NULL AND error IS NULL), 0), "
         "COALESCE(SUM(error IS NOT NULL), 0)")


def totals(store: Store, *, by: str, since: float | None = None,
           task_ids: Iterable[str] | None = None, endpoint: str | None = None
           ) -> dict[str, Totals]:
    """The meter summed per task (requests of no task: ""), endpoint or local day
    (YYYY-MM-DD), since a time, for some tasks or one endpoint."""
    if by not in _KEYS:
        raise ValueError(f"by must be one of {', '.join(BY)}")
    found = usage_filter(since=since, endpoint=endpoint, task_ids=task_ids)
    if found is None:
        return {}
    clause, args = found
    sql = f"SELECT {_KEYS[by]} AS k, {_SUMS} FROM usage{clause} GROUP BY k ORDER BY k"
    out: dict[str, Totals] = {}
    for row in store._connect().execute(sql, args).fetchall():
        out[str(row[0])] = Totals(int(row[1]), int(row[2]), int(row[3]), int(row[4]),
                                  int(row[5]), float(row[6]), int(row[7]), int(row[8]))
    return out


def as_json(t: Totals) -> dict[str, object]:
    """A total as `ls --json`, `show --json` and `cost --json` print it."""
    return {"cost": round(t.cost, 6), "requests": t.requests, "unpriced": t.unpriced,
            "errors": t.errors,
            "tokens": {"input": t.input_tokens, "output": t.output_tokens,
                       "cache_read": t.cache_read_tokens, "cache_write": t.cache_write_tokens}}


@dataclass
class Ledger:
    """Each task's totals and each endpoint's spend today, read incrementally."""

    store: Store
    tz: tzinfo | None = None
    tasks: dict[str, Totals] = field(default_factory=dict)
    today: dict[str, float] = field(default_factory=dict)  # endpoint -> USD since midnight
    _last_id: int = 0
    _day: float | None = None

    def refresh(self, now: float) -> None:
        """Fold in the rows recorded since the last refresh (one query; and a second on
        the first refresh of a new day, for the day's spend so far)."""
        conn = self.store._connect()
        day = day_start(now, self.tz)
        if day != self._day:
            self._day = day
            self.today = {str(r[0]): float(r[1]) for r in conn.execute(
                "SELECT endpoint, COALESCE(SUM(cost), 0) FROM usage WHERE at >= ? AND "
                "id <= ? AND cost IS NOT NULL GROUP BY endpoint", (day, self._last_id))}
        rows = conn.execute(
            "SELECT id, at, task_id, endpoint, input_tokens, output_tokens, "
            "cache_read_tokens, cache_write_tokens, cost, error FROM usage WHERE id > ? "
            "ORDER BY id", (self._last_id,)).fetchall()
        for row in rows:
            self._last_id = max(self._last_id, int(row[0]))
            cost = None if row[8] is None else float(row[8])
            if row[2] is not None:
                t = self.tasks.setdefault(str(row[2]), Totals())
                t.requests += 1
                t.input_tokens += int(row[4])
                t.output_tokens += int(row[5])
                t.cache_read_tokens += int(row[6])
                t.cache_write_tokens += int(row[7])
                if row[9] is not None:
                    t.errors += 1
                if cost is None:
                    if row[9] is None:
                        t.unpriced += 1
                else:
                    t.cost += cost
            if cost is not None and float(row[1]) >= day:
                self.today[str(row[3])] = self.today.get(str(row[3]), 0.0) + cost
