"""The endpoints table: what the fleet knows of each endpoint's limits."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any

from fleet_tui.core.model import EndpointState
from fleet_tui.store.connection import Database
from fleet_tui.store.rows import ENDPOINT_COLUMNS, endpoint_from_row, to_store

__all__ = ["EndpointRows"]


class EndpointRows(Database):
    """The endpoints table."""

    # --- endpoints: their limits (a park, a hold, a lowered cap) --------------------------------
    # What the limits are is policy's decision; the store keeps them, so that every process
    # sharing the database honours them, and applies them inside its transactions.

    def get_endpoint(self, endpoint: str) -> EndpointState | None:
        row = self._connect().execute("SELECT * FROM endpoints WHERE endpoint = ?",
                                      (endpoint,)).fetchone()
        return endpoint_from_row(row) if row is not None else None

    def list_endpoints(self) -> list[EndpointState]:
        rows = self._connect().execute("SELECT * FROM endpoints ORDER BY endpoint").fetchall()
        return [endpoint_from_row(r) for r in rows]

    def _write_endpoint(self, conn: sqlite3.Connection, endpoint: str,
                        updates: dict[str, Any], now: float) -> None:
        unknown = set(updates) - set(ENDPOINT_COLUMNS) | ({"endpoint"} & set(updates))
        if unknown:
            raise TypeError(f"cannot update endpoint fields: {', '.join(sorted(unknown))}")
        updates = {**updates, "updated_at": now}
        conn.execute("INSERT OR IGNORE INTO endpoints (endpoint, updated_at) VALUES (?, ?)",
                     (endpoint, now))
        sets = ", ".join(f"{name} = ?" for name in updates)
        conn.execute(f"UPDATE endpoints SET {sets} WHERE endpoint = ?",
                     [*(to_store(n, v) for n, v in updates.items()), endpoint])

    def change_endpoint(self, endpoint: str,
                        change: Callable[[EndpointState], dict[str, Any] | None],
                        now: float | None = None) -> EndpointState:
        """Read-modify-write of one endpoint's limits in one IMMEDIATE transaction:
        ``change(state)`` (a row with no limits when there is none yet) returns the fields
        to set, or None. Returns the state as it is afterwards."""
        now = time.time() if now is None else now
        with self.transaction() as conn:
            row = conn.execute("SELECT * FROM endpoints WHERE endpoint = ?",
                               (endpoint,)).fetchone()
            state = endpoint_from_row(row) if row is not None else EndpointState(endpoint)
            updates = change(state)
            if updates:
                self._write_endpoint(conn, endpoint, updates, now)
                for name, value in {**updates, "updated_at": now}.items():
                    setattr(state, name, value)
            return state
