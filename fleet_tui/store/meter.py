"""The gateway's records in the store: a token per attempt, and the meter.

A worker never holds the provider's key when it goes through the gateway: it holds a token
minted for its attempt, which the gateway checks on every request and which is revoked when
the attempt ends. The store keeps only each token's SHA-256, so that neither the store nor
a copy of it gives a token that works. The meter is a row per request the gateway passed
on: its usage (input, output, cache read, cache write), the model, the answer's status, and
its cost in USD when the price table knows the model (None when it does not)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fleet_tui.store.db import Store

TOKEN_PREFIX = "fleet-gw-"
"""Every gateway token starts with this: a secret scan can find one anywhere."""


def token_hash(token: str) -> str:
    import hashlib  # here, as each hashlib user: OpenSSL loads for a command that hashes

    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class TokenInfo:
    """Who a token was minted for."""

    task_id: str
    attempt_id: int | None
    endpoint: str
    created_at: float
    revoked_at: float | None
    # the route fixed when its attempt started (gateway.routes.Route.to_record; no key),
    # None for a token minted without one
    route: dict[str, Any] | None = None

    @property
    def valid(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True)
class Usage:
    """One request's worth of the meter."""

    at: float
    task_id: str | None
    attempt_id: int | None
    endpoint: str
    model: str
    status: int | None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost: float | None = None
    error: str | None = None  # an error answer's code (z.ai's "1308", else "429")


@dataclass
class Totals:
    """The meter summed over some requests."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost: float = 0.0
    unpriced: int = 0  # requests whose model had no price: their cost is not in ``cost``
    errors: int = 0  # error answers (refusals): counted, priced at what they served

    def add(self, row: Usage) -> None:
        self.requests += 1
        if row.error is not None:
            self.errors += 1
        self.input_tokens += row.input_tokens
        self.output_tokens += row.output_tokens
        self.cache_read_tokens += row.cache_read_tokens
        self.cache_write_tokens += row.cache_write_tokens
        if row.cost is None:
            self.unpriced += 1
        else:
            self.cost += row.cost


def usage_filter(*, since: float | None = None, endpoint: str | None = None,
                 task_ids: Iterable[str] | None = None, priced: bool = False
                 ) -> tuple[str, list[object]] | None:
    """The WHERE clause (" WHERE ..." or "") and its arguments that pick usage rows by time,
    endpoint, tasks (each once) and, with `priced`, a known cost; None when `task_ids` is
    empty (no row can match)."""
    where: list[str] = ["cost IS NOT NULL"] if priced else []
    args: list[object] = []
    if since is not None:
        where.append("at >= ?")
        args.append(since)
    if endpoint is not None:
        where.append("endpoint = ?")
        args.append(endpoint)
    if task_ids is not None:
        ids = list(dict.fromkeys(task_ids))
        if not ids:
            return None
        where.append(f"task_id IN ({', '.join('?' for _ in ids)})")
        args.extend(ids)
    return (" WHERE " + " AND ".join(where) if where else ""), args


def _route(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        found = json.loads(text)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


class Meter:
    """The tokens and the meter of one store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # --- tokens ---------------------------------------------------------------------------

    def mint(self, task_id: str, attempt_id: int | None, endpoint: str,
             now: float | None = None, *, route: dict[str, Any] | None = None) -> str:
        """A new token for an attempt; only its hash is stored, with the route it maps to
        for the attempt's life (`route`: a record without a key)."""
        import secrets  # here, as hashlib

        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO gateway_tokens (token_hash, task_id, attempt_id, endpoint, "
                "created_at, route) VALUES (?, ?, ?, ?, ?, ?)",
                (token_hash(token), task_id, attempt_id, endpoint,
                 time.time() if now is None else now,
                 None if route is None else json.dumps(route, sort_keys=True)))
        return token

    def bind(self, token: str, attempt_id: int) -> None:
        """Tie a token minted before its attempt had a row to that attempt."""
        with self.store.transaction() as conn:
            conn.execute("UPDATE gateway_tokens SET attempt_id = ? WHERE token_hash = ?",
                         (attempt_id, token_hash(token)))

    def check(self, token: str) -> TokenInfo | None:
        """Who the token belongs to (revoked ones included: ``valid`` says); None when it
        was never minted here."""
        if not token.startswith(TOKEN_PREFIX):
            return None
        row = self.store._connect().execute(
            "SELECT task_id, attempt_id, endpoint, created_at, revoked_at, route "
            "FROM gateway_tokens WHERE token_hash = ?", (token_hash(token),)).fetchone()
        if row is None:
            return None
        return TokenInfo(str(row["task_id"]), row["attempt_id"], str(row["endpoint"]),
                         float(row["created_at"]), row["revoked_at"], _route(row["route"]))

    def revoke(self, *, attempt_ids: Iterable[int] = (), task_ids: Iterable[str] = (),
               token: str | None = None, now: float | None = None) -> int:
        """Revoke the tokens of these attempts, of every attempt of these tasks, or one
        token; the number revoked."""
        when = time.time() if now is None else now
        count = 0
        with self.store.transaction() as conn:
            for attempt in attempt_ids:
                count += conn.execute(
                    "UPDATE gateway_tokens SET revoked_at = ? WHERE attempt_id = ? "
                    "AND revoked_at IS NULL", (when, attempt)).rowcount
            for task in task_ids:
                count += conn.execute(
                    "UPDATE gateway_tokens SET revoked_at = ? WHERE task_id = ? "
                    "AND revoked_at IS NULL", (when, task)).rowcount
            if token is not None:
                count += conn.execute(
                    "UPDATE gateway_tokens SET revoked_at = ? WHERE token_hash = ? "
                    "AND revoked_at IS NULL", (when, token_hash(token))).rowcount
        return count

    def any_valid(self) -> bool:
        """Is a token not revoked (a worker may be using the gateway)?"""
        return self.store._connect().execute(
            "SELECT 1 FROM gateway_tokens WHERE revoked_at IS NULL LIMIT 1").fetchone() \
            is not None

    def live_attempts(self) -> list[tuple[int, dict[str, Any] | None]]:
        """The attempts with a token not revoked, and each one's route (the gateway's
        watch: a token dies with its attempt's runner)."""
        rows = self.store._connect().execute(
            "SELECT attempt_id, route FROM gateway_tokens WHERE revoked_at IS NULL "
            "AND attempt_id IS NOT NULL").fetchall()
        return [(int(r["attempt_id"]), _route(r["route"])) for r in rows]

    def live_routes(self) -> set[str]:
        """The ids of the routes a token not revoked maps to."""
        rows = self.store._connect().execute(
            "SELECT route FROM gateway_tokens WHERE revoked_at IS NULL AND route IS NOT NULL"
        ).fetchall()
        return {str(found["id"]) for r in rows
                if (found := _route(r["route"])) is not None and "id" in found}

    # --- the meter ------------------------------------------------------------------------

    def record(self, usage: Usage) -> None:
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO usage (at, task_id, attempt_id, endpoint, model, status, "
                "input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost, "
                "error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (usage.at, usage.task_id, usage.attempt_id, usage.endpoint, usage.model,
                 usage.status, usage.input_tokens, usage.output_tokens,
                 usage.cache_read_tokens, usage.cache_write_tokens, usage.cost, usage.error))

    def rows(self, *, since: float | None = None, task_ids: Iterable[str] | None = None,
             endpoint: str | None = None) -> list[Usage]:
        """The meter's rows, oldest first, filtered by time, tasks and endpoint."""
        found = usage_filter(since=since, endpoint=endpoint, task_ids=task_ids)
        if found is None:
            return []
        clause, args = found
        sql = f"SELECT * FROM usage{clause} ORDER BY at, id"
        return [Usage(float(r["at"]), r["task_id"], r["attempt_id"], str(r["endpoint"]),
                      str(r["model"]), r["status"], int(r["input_tokens"]),
                      int(r["output_tokens"]), int(r["cache_read_tokens"]),
                      int(r["cache_write_tokens"]), r["cost"], r["error"])
                for r in self.store._connect().execute(sql, args).fetchall()]

    def by_task(self, task_ids: Iterable[str] | None = None) -> dict[str, Totals]:
        """The meter summed per task."""
        out: dict[str, Totals] = {}
        for row in self.rows(task_ids=task_ids):
            if row.task_id is not None:
                out.setdefault(row.task_id, Totals()).add(row)
        return out

    def spent(self, *, endpoint: str | None = None, task_id: str | None = None,
              since: float | None = None) -> float:
        """USD spent (priced requests only) by an endpoint or a task since a time."""
        found = usage_filter(since=since, endpoint=endpoint,
                             task_ids=None if task_id is None else [task_id], priced=True)
        assert found is not None  # one task id: never empty
        clause, args = found
        row = self.store._connect().execute(
            f"SELECT COALESCE(SUM(cost), 0) FROM usage{clause}", args).fetchone()
        return float(row[0])
