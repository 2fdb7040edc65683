"""The attempts table (each run of a task), and the attempts hosts lost until what they
started there is swept."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any

from fleet_tui.core.model import Attempt
from fleet_tui.store.connection import Database
from fleet_tui.store.errors import StoreError, UnknownTaskError
from fleet_tui.store.rows import ATTEMPT_COLUMNS, attempt_from_row, to_store

__all__ = ["AttemptRows"]


class AttemptRows(Database):
    """The attempts table and the lost attempts."""

    def add_attempt(self, task_id: str, *, kind: str = "fresh", prompt: str = "",
                    now: float | None = None, **fields_: Any) -> Attempt:
        """Record a new attempt (n = previous + 1) and bump the task's attempt_count."""
        unknown = set(fields_) - set(ATTEMPT_COLUMNS) - {"id", "task_id", "n"}
        if unknown or {"id", "task_id", "n"} & set(fields_):
            raise TypeError(f"bad attempt fields: {', '.join(sorted(fields_))}")
        now = time.time() if now is None else now
        fields_.setdefault("started_at", now)
        with self.transaction() as conn:
            n = int(conn.execute("SELECT COALESCE(MAX(n), 0) + 1 FROM attempts WHERE task_id = ?",
                                 (task_id,)).fetchone()[0])
            attempt = Attempt(id=0, task_id=task_id, n=n, kind=kind, prompt=prompt, **fields_)
            columns = [c for c in ATTEMPT_COLUMNS if c != "id"]
            try:
                cur = conn.execute(
                    f"INSERT INTO attempts ({', '.join(columns)}) "
                    f"VALUES ({', '.join('?' for _ in columns)})",
                    [to_store(c, getattr(attempt, c)) for c in columns])
            except sqlite3.IntegrityError:
                raise UnknownTaskError(f"no task {task_id!r}") from None
            attempt.id = int(cur.lastrowid or 0)
            conn.execute("UPDATE tasks SET attempt_count = ?, updated_at = ? WHERE id = ?",
                         (n, now, task_id))
        return attempt

    def get_attempt(self, attempt_id: int) -> Attempt:
        row = self._connect().execute("SELECT * FROM attempts WHERE id = ?",
                                      (attempt_id,)).fetchone()
        if row is None:
            raise StoreError(f"no attempt {attempt_id}")
        return attempt_from_row(row)

    def list_attempts(self, task_id: str) -> list[Attempt]:
        rows = self._connect().execute(
            "SELECT * FROM attempts WHERE task_id = ? ORDER BY n", (task_id,)).fetchall()
        return [attempt_from_row(r) for r in rows]

    def latest_attempt(self, task_id: str) -> Attempt | None:
        row = self._connect().execute(
            "SELECT * FROM attempts WHERE task_id = ? ORDER BY n DESC LIMIT 1",
            (task_id,)).fetchone()
        return attempt_from_row(row) if row is not None else None

    def assign_port(self, attempt_id: int, pick: Callable[[], int], tries: int = 64) -> int:
        """Give an attempt a port that no other unfinished attempt holds (its FLEET_PORT),
        in one transaction, so two engines never hand out the same one. `pick` proposes a
        port (one free on this machine now); StoreError when none of `tries` is free."""
        with self.transaction() as conn:
            taken = {int(r[0]) for r in conn.execute(
                "SELECT port FROM attempts WHERE finished_at IS NULL AND port IS NOT NULL "
                "AND id != ?", (attempt_id,)).fetchall() if isinstance(r[0], int)}
            for _ in range(tries):
                port = pick()
                if port not in taken:
                    conn.execute("UPDATE attempts SET port = ? WHERE id = ?", (port, attempt_id))
                    return port
        raise StoreError(f"no free port for attempt {attempt_id} after {tries} tries")

    def unfinished_attempts(self) -> list[Attempt]:
        """Attempts with no finish time: what a starting engine must re-adopt or close."""
        rows = self._connect().execute(
            "SELECT * FROM attempts WHERE finished_at IS NULL ORDER BY id").fetchall()
        return [attempt_from_row(r) for r in rows]

    def update_attempt(self, attempt_id: int, **fields_: Any) -> bool:
        unknown = set(fields_) - set(ATTEMPT_COLUMNS)
        if unknown or {"id", "task_id", "n"} & set(fields_):
            raise TypeError(f"cannot update attempt fields: {', '.join(sorted(fields_))}")
        if not fields_:
            return False
        sets = ", ".join(f"{name} = ?" for name in fields_)
        args = [to_store(n, v) for n, v in fields_.items()]
        with self.transaction() as conn:
            return conn.execute(f"UPDATE attempts SET {sets} WHERE id = ?",
                                [*args, attempt_id]).rowcount > 0

    # --- the attempts hosts lost, until swept ---------------------------------------------

    def record_lost(self, host: str, task_id: str, attempt: int, reason: str,
                    at: float) -> None:
        """A host lost this attempt: keep it until what it started there is swept (the
        first record stays)."""
        with self.transaction() as conn:
            conn.execute("INSERT OR IGNORE INTO lost_attempts (host, task_id, attempt, "
                         "reason, lost_at) VALUES (?, ?, ?, ?, ?)",
                         (host, task_id, attempt, to_store("message", reason), at))

    def lost_to_sweep(self, host: str | None = None) -> list[tuple[str, str, int, str]]:
        """(host, task, attempt, reason) of the lost attempts not swept yet (of one host,
        or of all), oldest first."""
        query = ("SELECT host, task_id, attempt, reason FROM lost_attempts "
                 "WHERE swept_at IS NULL")
        params: tuple[Any, ...] = ()
        if host is not None:
            query += " AND host = ?"
            params = (host,)
        rows = self._connect().execute(query + " ORDER BY lost_at, task_id, attempt",
                                       params).fetchall()
        return [(str(r["host"]), str(r["task_id"]), int(r["attempt"]), str(r["reason"]))
                for r in rows]

    def mark_swept(self, host: str, task_id: str, attempt: int, processes: int,
                   at: float) -> None:
        """The host swept the lost attempt (`processes` stopped); kept as a record."""
        with self.transaction() as conn:
            conn.execute("UPDATE lost_attempts SET swept_at = ?, swept = ? WHERE host = ? "
                         "AND task_id = ? AND attempt = ? AND swept_at IS NULL",
                         (at, processes, host, task_id, attempt))
