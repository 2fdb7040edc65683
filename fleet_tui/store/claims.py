"""Claims: which engine starts which task. One IMMEDIATE transaction for each decision, so
the endpoint's cap, the hosts' caps and the endpoint's limits hold across every process
sharing the database; one starter per task, and no start after a kill."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fleet_tui.core.model import EndpointState, Task
from fleet_tui.core.states import ACTIVE_STATES, PENDING_STATES, TaskState, Verdict
from fleet_tui.store.attempts import AttemptRows
from fleet_tui.store.endpoints import EndpointRows
from fleet_tui.store.rows import endpoint_from_row, task_from_row, to_store
from fleet_tui.store.tasks import TaskRows

__all__ = ["Claims"]


class Claims(TaskRows, AttemptRows, EndpointRows):
    """Claiming tasks to start, under the caps and the endpoint's limits."""

    def claim_next(self, endpoint: str, cap: int, now: float | None = None,
                   owner: str | None = None, parked_first: bool = False,
                   hosts: Mapping[str, int] | None = None) -> Task | None:
        """Atomically move the oldest ready task of ``endpoint`` to running, under ``cap``.

        Ready: pending (queued, or waiting) with no ``not_before`` or one that has come.
        Returns None when the endpoint already has ``cap`` active (running/stalled) tasks or
        nothing is ready. ``parked_first``: the tasks parked by a window (waiting, verdict
        window) go before the others (the resume after a park). The states are the phases
        of states.py's table. One IMMEDIATE transaction, so the cap holds across every
        process sharing the database.

        ``hosts``: each host's worker cap, in the order `any` prefers them on a
        tie. A task of a host at its cap waits (a host not listed has no cap here: its
        start fails, saying why); a task of host "any" is placed on the listed host with
        the most free slots, and never when all are full. The endpoint's cap holds too.
        """
        now = time.time() if now is None else now
        active = sorted(s.value for s in ACTIVE_STATES)
        pending = sorted(s.value for s in PENDING_STATES)
        with self.transaction() as conn:
            running = conn.execute(
                f"SELECT COUNT(*) FROM tasks WHERE endpoint = ? AND state IN "
                f"({', '.join('?' for _ in active)})", (endpoint, *active)).fetchone()[0]
            if running >= cap:
                return None
            full: list[str] = []
            free: list[tuple[int, int, str]] = []  # (-free slots, order, name) for "any"
            if hosts is not None:
                busy = dict(conn.execute(
                    f"SELECT host, COUNT(*) FROM tasks WHERE state IN "
                    f"({', '.join('?' for _ in active)}) GROUP BY host", active).fetchall())
                for order, (name, host_cap) in enumerate(hosts.items()):
                    left = host_cap - int(busy.get(name, 0))
                    if left > 0:
                        free.append((-left, order, name))
                    else:
                        full.append(name)
                if not free:
                    full.append("any")
            not_full = f"AND host NOT IN ({', '.join('?' for _ in full)}) " if full else ""
            row = conn.execute(
                f"SELECT * FROM tasks WHERE endpoint = ? AND state IN "
                f"({', '.join('?' for _ in pending)}) AND "
                f"(not_before IS NULL OR not_before <= ?) "
                f"{not_full}ORDER BY "
                f"{'(state = ? AND verdict = ?) DESC, ' if parked_first else ''}"
                f"created_at, id LIMIT 1",
                (endpoint, *pending, now, *full,
                 *((TaskState.WAITING.value, Verdict.WINDOW.value) if parked_first else ())
                 )).fetchone()
            if row is None:
                return None
            host = row["host"]
            if host == "any" and free:
                host = min(free)[2]
            conn.execute(
                "UPDATE tasks SET state = ?, claimed_by = ?, claimed_at = ?, updated_at = ?, "
                "not_before = NULL, started_at = COALESCE(started_at, ?), host = ? "
                "WHERE id = ?",
                (TaskState.RUNNING.value, owner, now, now, now, host, row["id"]))
            fresh = conn.execute("SELECT * FROM tasks WHERE id = ?", (row["id"],)).fetchone()
            return task_from_row(fresh)

    def claim_gated(self, endpoint: str, now: float, owner: str | None,
                    decide: Callable[[EndpointState | None, int, float],
                                     tuple[int | None, dict[str, Any] | None,
                                           dict[str, Any] | None, dict[str, Any] | None,
                                           bool]],
                    hosts: Mapping[str, int] | None = None,
                    starting: tuple[int, float] | None = None) -> Task | None:
        """`claim_next` under the endpoint's limits, in one IMMEDIATE transaction, so that
        two engines cannot both start a task into a closed window or past a ramp's step.

        ``decide(state, parked, now)`` (``parked``: how many of the endpoint's tasks wait
        with verdict window; ``now``: the time the claim is stamped with, so that a gate
        counting from an earlier claim, as the staggered resume does, counts between the
        times the store keeps, however long this claim waited for the lock) returns (cap,
        fields, fields_on_claim, fields_on_idle, parked_first): the cap to claim under
        (None: start nothing now), endpoint fields to set now (a hold lifted), fields to
        set once a task is claimed (the staggered resume's next start), fields to set when
        no task is ready at all (the resume after a park is over), and whether parked
        sessions are claimed before fresh tasks.

        ``starting`` (most, since): nothing is claimed while `most` of the endpoint's tasks
        are starting (`starting_count`: claimed since `since`, their attempt's claude not
        yet begun), the policy.start_window of every engine sharing the store."""
        with self.transaction() as conn:
            if starting is not None and self._starting(conn, endpoint, starting[1]) \
                    >= starting[0]:
                return None
            row = conn.execute("SELECT * FROM endpoints WHERE endpoint = ?",
                               (endpoint,)).fetchone()
            state = endpoint_from_row(row) if row is not None else None
            parked = 0
            if state is not None and state.parked_until is not None:
                parked = int(conn.execute(
                    "SELECT COUNT(*) FROM tasks WHERE endpoint = ? AND state = ? AND "
                    "verdict = ?", (endpoint, TaskState.WAITING.value,
                                    Verdict.WINDOW.value)).fetchone()[0])
            cap, fields_now, on_claim, on_idle, parked_first = decide(state, parked, now)
            if fields_now:
                self._write_endpoint(conn, endpoint, fields_now, now)
            if cap is None:
                return None
            task = self.claim_next(endpoint, cap, now, owner=owner, parked_first=parked_first,
                                   hosts=hosts)
            if task is not None and on_claim:
                self._write_endpoint(conn, endpoint, on_claim, now)
            if task is None and on_idle:
                pending = sorted(s.value for s in PENDING_STATES)
                ready = conn.execute(
                    f"SELECT COUNT(*) FROM tasks WHERE endpoint = ? AND state IN "
                    f"({', '.join('?' for _ in pending)}) AND "
                    f"(not_before IS NULL OR not_before <= ?)",
                    (endpoint, *pending, now)).fetchone()[0]
                if ready == 0:  # nothing held back any more (not merely at the cap)
                    self._write_endpoint(conn, endpoint, on_idle, now)
            return task

    def starting_count(self, endpoint: str, since: float) -> int:
        """How many of the endpoint's active tasks are starting: claimed (or their claim
        refreshed by the start threads) after `since`, and no unfinished attempt of theirs
        has a session yet (the follower stores it from claude's init event, which claude
        prints just before its first request; a setup command's lines carry none). A task
        claimed longer ago counts as started, whatever its claude does."""
        return self._starting(self._connect(), endpoint, since)

    def _starting(self, conn: sqlite3.Connection, endpoint: str, since: float) -> int:
        active = sorted(s.value for s in ACTIVE_STATES)
        return int(conn.execute(
            f"SELECT COUNT(*) FROM tasks t WHERE t.endpoint = ? AND t.state IN "
            f"({', '.join('?' for _ in active)}) AND t.claimed_at > ? AND NOT EXISTS ("
            f"SELECT 1 FROM attempts a WHERE a.task_id = t.id AND a.finished_at IS NULL "
            f"AND a.session_id IS NOT NULL)", (endpoint, *active, since)).fetchone()[0])

    def note_queued(self, endpoint: str, note: str | None, prefixes: tuple[str, ...]) -> int:
        """Set the message of the endpoint's queued tasks to ``note`` (None: clear it), on
        tasks with no message or one starting with one of ``prefixes`` (a note written
        before): why they do not start (a park, a hold). Returns how many changed."""
        if not prefixes:
            return 0
        ours = " OR ".join("substr(message, 1, ?) = ?" for _ in prefixes)
        note = to_store("message", note)
        args: list[Any] = [note, time.time(), endpoint, TaskState.QUEUED.value, note]
        for prefix in prefixes:
            args += [len(prefix), prefix]
        with self.transaction() as conn:
            return conn.execute(
                f"UPDATE tasks SET message = ?, updated_at = ? WHERE endpoint = ? AND "
                f"state = ? AND message IS NOT ? AND (message IS NULL OR {ours})",
                args).rowcount

    def touch_claims(self, task_ids: Iterable[str], owner: str, now: float) -> int:
        """Heartbeat: an engine still starting the tasks it claimed says so (claimed_at)."""
        ids = list(task_ids)
        if not ids:
            return 0
        active = tuple(s.value for s in ACTIVE_STATES)
        with self.transaction() as conn:
            return conn.execute(
                f"UPDATE tasks SET claimed_at = ? WHERE claimed_by = ? AND state IN "
                f"({', '.join('?' for _ in active)}) AND id IN "
                f"({', '.join('?' for _ in ids)})", (now, owner, *active, *ids)).rowcount

    def requeue_claim(self, task_id: str, claimed_by: str | None, claimed_at: float | None,
                      now: float, message: str) -> bool:
        """Put a claimed task back in the queue, only while it is still that same claim
        (claimer and claim time) and active: two engines that both found the claimer gone
        requeue it once, and never a claim made since by a third."""
        active = tuple(s.value for s in ACTIVE_STATES)
        with self.transaction() as conn:
            return conn.execute(
                f"UPDATE tasks SET state = ?, message = ?, claimed_by = NULL, claimed_at = NULL,"
                f" updated_at = ? WHERE id = ? AND claimed_by IS ? AND claimed_at IS ? AND "
                f"state IN ({', '.join('?' for _ in active)})",
                (TaskState.QUEUED.value, to_store("message", message), now, task_id,
                 claimed_by, claimed_at, *active)).rowcount > 0

    def record_launch(self, task_id: str, attempt_id: int, owner: str,
                      attempt_fields: dict[str, Any], task_fields: dict[str, Any]) -> bool:
        """The starter's point of no return, before it spawns the runner: record where the
        attempt runs, if the task is still active and still claimed by `owner` (not killed
        or taken over meanwhile). False: do not spawn."""
        active = {s.value for s in ACTIVE_STATES}
        with self.transaction() as conn:
            row = conn.execute("SELECT state, claimed_by FROM tasks WHERE id = ?",
                               (task_id,)).fetchone()
            if row is None or row["state"] not in active or row["claimed_by"] != owner:
                return False
            self.update_attempt(attempt_id, **attempt_fields)
            self.update_task(task_id, **task_fields)
            return True

    def kill_unlaunched(self, task_id: str, now: float, message: str) -> bool:
        """Kill an active task none of whose attempts has been launched (no attempt folder
        recorded): its starter, at record_launch, then finds it killed and spawns nothing.
        False: a runner was (being) launched; stop that one instead."""
        active = tuple(s.value for s in ACTIVE_STATES)
        message = to_store("message", message)
        with self.transaction() as conn:
            changed = conn.execute(
                f"UPDATE tasks SET state = ?, verdict = ?, message = ?, finished_at = ?,"
                f" not_before = NULL, updated_at = ? WHERE id = ? AND state IN "
                f"({', '.join('?' for _ in active)}) AND NOT EXISTS (SELECT 1 FROM attempts "
                f"WHERE attempts.task_id = tasks.id AND finished_at IS NULL AND dir IS NOT NULL)",
                (TaskState.KILLED.value, Verdict.KILLED.value, message, now, now, task_id,
                 *active)).rowcount > 0
            if changed:
                conn.execute("UPDATE attempts SET finished_at = ?, verdict = ?, "
                             "message = ? WHERE task_id = ? AND finished_at IS NULL",
                             (now, Verdict.KILLED.value, message, task_id))
            return changed
