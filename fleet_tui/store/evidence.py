"""Best of N in the store: each copy's evidence (the table `copy_evidence`, one row a copy:
the fingerprint of what it is evidence of, and the evidence as JSON) and each group's pick
(`best_picks`: the copy picked as the best, or none, why, and whether the panel said so).

The rules that order the copies are core/ranking.py's; the engine gathers (engine/ranking.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fleet_tui.core.ranking import CheckResult, CopyEvidence
from fleet_tui.store.db import Store

__all__ = ["BestPick", "EvidenceStore"]


@dataclass(frozen=True)
class BestPick:
    """A group's pick: `task_id` None when no copy passed."""

    group_id: str
    task_id: str | None
    reason: str
    how: str  # "auto" (auto_pick) or "best" (pick --best, the panel)
    picked_at: float
    notified: bool = False


def _check(data: Any) -> CheckResult | None:
    if not isinstance(data, dict):
        return None
    return CheckResult(str(data.get("command", "")), bool(data.get("passed")),
                       float(data.get("seconds", 0.0)), str(data.get("tail", "")))


def _to_data(ev: CopyEvidence) -> str:
    def check(c: CheckResult | None) -> dict[str, Any] | None:
        return None if c is None else {"command": c.command, "passed": c.passed,
                                       "seconds": c.seconds, "tail": c.tail}
    return json.dumps({"test": check(ev.test), "checks": [check(c) for c in ev.checks],
                       "added": ev.added, "deleted": ev.deleted, "files": list(ev.files),
                       "outside": list(ev.outside), "clean": ev.clean, "merges": ev.merges,
                       "open_comments": ev.open_comments, "landable": ev.landable,
                       "seconds": ev.seconds})


def _from_row(row: Any) -> CopyEvidence | None:
    try:
        data = json.loads(row["data"])
        checks = tuple(c for c in (_check(x) for x in data.get("checks", [])) if c)
        clean = data.get("clean")
        return CopyEvidence(
            str(row["task_id"]), str(row["fingerprint"]), float(row["gathered_at"]),
            _check(data.get("test")), checks, int(data.get("added", 0)),
            int(data.get("deleted", 0)), tuple(str(f) for f in data.get("files", [])),
            tuple(str(f) for f in data.get("outside", [])),
            None if clean is None else bool(clean), str(data.get("merges", "")),
            int(data.get("open_comments", 0)),
            None if data.get("landable") is None else str(data["landable"]),
            float(data.get("seconds", 0.0)))
    except (ValueError, TypeError, AttributeError):
        return None  # a row that does not read is no evidence: gathered again


class EvidenceStore:
    """The copies' evidence and the groups' picks of one store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def put(self, group_id: str, evidence: Iterable[CopyEvidence]) -> None:
        with self.store.transaction() as conn:
            for ev in evidence:
                conn.execute(
                    "INSERT INTO copy_evidence (task_id, group_id, fingerprint, gathered_at, "
                    "data) VALUES (?, ?, ?, ?, ?) ON CONFLICT(task_id) DO UPDATE SET "
                    "group_id = excluded.group_id, fingerprint = excluded.fingerprint, "
                    "gathered_at = excluded.gathered_at, data = excluded.data",
                    (ev.task_id, group_id, ev.fingerprint, ev.gathered_at, _to_data(ev)))

    def of_group(self, group_id: str) -> dict[str, CopyEvidence]:
        rows = self.store._connect().execute(
            "SELECT * FROM copy_evidence WHERE group_id = ?", (group_id,)).fetchall()
        return {ev.task_id: ev for ev in map(_from_row, rows) if ev is not None}

    def of_groups(self, group_ids: Iterable[str]) -> dict[str, CopyEvidence]:
        """task id -> evidence, for every copy of these groups (one query per 500)."""
        ids = sorted(set(group_ids))
        out: dict[str, CopyEvidence] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            rows = self.store._connect().execute(
                "SELECT * FROM copy_evidence WHERE group_id IN "
                f"({', '.join('?' * len(chunk))})", chunk).fetchall()
            out.update({ev.task_id: ev for ev in map(_from_row, rows) if ev is not None})
        return out

    def record_pick(self, group_id: str, task_id: str | None, reason: str, how: str,
                    now: float) -> bool:
        """Record a group's pick once: False when it has one already (auto_pick decides
        once per group, whichever engine gets there first)."""
        with self.store.transaction() as conn:
            cursor = conn.execute(
                "INSERT OR IGNORE INTO best_picks (group_id, task_id, reason, how, picked_at) "
                "VALUES (?, ?, ?, ?, ?)", (group_id, task_id, reason, how, now))
            return cursor.rowcount == 1

    def pick_of(self, group_id: str) -> BestPick | None:
        row = self.store._connect().execute(
            "SELECT * FROM best_picks WHERE group_id = ?", (group_id,)).fetchone()
        return None if row is None else _pick(row)

    def picks_since(self, since: float) -> list[BestPick]:
        rows = self.store._connect().execute(
            "SELECT * FROM best_picks WHERE picked_at >= ? ORDER BY picked_at",
            (since,)).fetchall()
        return [_pick(r) for r in rows]


def _pick(row: Any) -> BestPick:
    return BestPick(str(row["group_id"]), row["task_id"], str(row["reason"]), str(row["how"]),
                    float(row["picked_at"]), bool(row["notified"]))
