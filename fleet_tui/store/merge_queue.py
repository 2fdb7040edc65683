"""The merge queue, as the store keeps it: the tasks with an active land_state, in
land_order. The engine's merge queue (engine/merge_queue.py) decides; this keeps its order
safe across processes."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fleet_tui.core.model import Task
from fleet_tui.core.states import LAND_ACTIVE, LandState
from fleet_tui.store.rows import TASK_COLUMNS, task_from_row
from fleet_tui.store.tasks import TaskRows

__all__ = ["MergeQueue"]


class MergeQueue(TaskRows):
    """The merge queue's order and its tasks' land_* fields."""

    def enqueue_landing(self, task_ids: Iterable[str], now: float | None = None) -> list[str]:
        """Put tasks at the end of the merge queue, in the order given (one transaction);
        a task in the queue already keeps its place. Returns the ids that joined."""
        now = time.time() if now is None else now
        active = tuple(s.value for s in LAND_ACTIVE)
        marks = ", ".join("?" for _ in active)
        joined: list[str] = []
        with self.transaction() as conn:
            last = conn.execute(f"SELECT COALESCE(MAX(land_order), 0) FROM tasks WHERE "
                                f"land_state IN ({marks})", active).fetchone()[0]
            order = float(last or 0)
            for task_id in task_ids:
                if task_id in joined:
                    continue
                order += 1
                changed = conn.execute(
                    f"UPDATE tasks SET land_state = ?, land_order = ?, land_fixes = 0, "
                    f"land_note = NULL, land_commit = NULL, land_attempt = 0, updated_at = ? "
                    f"WHERE id = ? AND (land_state IS NULL OR land_state NOT IN ({marks}))",
                    (LandState.WAITING.value, order, now, task_id, *active)).rowcount
                if changed:
                    joined.append(task_id)
        return joined

    def landing_queue(self, repo: Path | None = None) -> list[Task]:
        """The merge queue (of one repository, or all): its tasks in landing order."""
        active = tuple(s.value for s in LAND_ACTIVE)
        sql = (f"SELECT * FROM tasks WHERE land_state IN ({', '.join('?' for _ in active)})")
        args: list[Any] = list(active)
        if repo is not None:
            sql += " AND repo = ?"
            args.append(str(repo))
        sql += " ORDER BY land_order, id"
        return [task_from_row(r) for r in self._connect().execute(sql, args).fetchall()]

    def set_landing(self, task_id: str, expect: Iterable[str] | None = None,
                    **fields_: Any) -> bool:
        """Set fields of a task in the merge queue, only while its land_state is one of
        ``expect`` (None: whatever it is): a task taken out of the queue meanwhile, or
        moved on by another process, is left alone. Returns whether it changed."""
        unknown = set(fields_) - set(TASK_COLUMNS)
        if unknown:
            raise TypeError(f"cannot update task fields: {', '.join(sorted(unknown))}")
        fields_.setdefault("updated_at", time.time())
        with self.transaction() as conn:
            row = conn.execute("SELECT land_state FROM tasks WHERE id = ?",
                               (task_id,)).fetchone()
            if row is None:
                return False
            if expect is not None and row["land_state"] not in {str(e) for e in expect}:
                return False
            return self.update_task(task_id, **fields_)

    def land_rejoin(self, task_id: str, note: str, now: float | None = None) -> bool:
        """A task back from its worker joins the end of the merge queue (only while it is
        still FIXING)."""
        now = time.time() if now is None else now
        active = tuple(s.value for s in LAND_ACTIVE)
        with self.transaction() as conn:
            last = conn.execute(f"SELECT COALESCE(MAX(land_order), 0) FROM tasks WHERE "
                                f"land_state IN ({', '.join('?' for _ in active)})",
                                active).fetchone()[0]
            return conn.execute(
                "UPDATE tasks SET land_state = ?, land_order = ?, land_note = ?, "
                "updated_at = ? WHERE id = ? AND land_state = ?",
                (LandState.WAITING.value, float(last or 0) + 1, note, now, task_id,
                 LandState.FIXING.value)).rowcount > 0
