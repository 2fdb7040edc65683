"""The tasks table: a task's row created, found, listed, changed, archived, deleted."""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from fleet_tui.core.model import Task, new_task_id
from fleet_tui.core.states import CLOSED_STATES, TaskState
from fleet_tui.store.connection import Database
from fleet_tui.store.errors import AmbiguousTaskError, StoreError, UnknownTaskError
from fleet_tui.store.rows import TASK_COLUMNS, states_tuple, task_from_row, to_store

__all__ = ["TaskRows"]

_ID_PREFIX_RE = re.compile(r"^[0-9a-z]{1,6}$")


class TaskRows(Database):
    """The tasks table."""

    def create_task(self, *, prompt: str, repo: Path, task_id: str | None = None,
                    now: float | None = None, **fields_: Any) -> Task:
        """Store a new task (queued unless ``state`` says otherwise) with a fresh unique id.

        ``branch`` defaults to ``fleet/<id>``; any other Task field may be given.
        """
        unknown = set(fields_) - set(TASK_COLUMNS)
        if unknown:
            raise TypeError(f"unknown task fields: {', '.join(sorted(unknown))}")
        now = time.time() if now is None else now
        for _ in range(100):
            tid = task_id or new_task_id()
            task = Task(id=tid, prompt=prompt, repo=Path(repo), created_at=now, updated_at=now,
                        **fields_)
            if not task.branch:
                task.branch = f"fleet/{tid}"
            task.state = TaskState(task.state)
            values = [to_store(name, getattr(task, name)) for name in TASK_COLUMNS]
            try:
                with self.transaction() as conn:
                    conn.execute(
                        f"INSERT INTO tasks ({', '.join(TASK_COLUMNS)}) "
                        f"VALUES ({', '.join('?' for _ in TASK_COLUMNS)})", values)
            except sqlite3.IntegrityError:
                if task_id is not None:
                    raise StoreError(f"a task with id {task_id} exists already") from None
                continue
            return task
        raise StoreError("could not find a free task id")  # pragma: no cover

    def get_task(self, task_id: str) -> Task:
        """The task with this id, or the only task whose id starts with this prefix."""
        key = task_id.strip().lower()
        if not _ID_PREFIX_RE.match(key):
            raise UnknownTaskError(f"no task {task_id!r}: a task id is 1 to 6 characters "
                                   "from 0-9 and a-z (see `fleet-tui ls`)")
        conn = self._connect()
        row = conn.execute("SELECT * FROM tasks WHERE id = ?", (key,)).fetchone()
        if row is not None:
            return task_from_row(row)
        rows = conn.execute("SELECT * FROM tasks WHERE id LIKE ? ORDER BY id LIMIT 6",
                            (key + "%",)).fetchall()
        if not rows:
            raise UnknownTaskError(f"no task {task_id!r} (see `fleet-tui ls`)")
        if len(rows) > 1:
            ids = ", ".join(r["id"] for r in rows[:5])
            raise AmbiguousTaskError(
                f"task id {task_id!r} is ambiguous: it matches {ids}"
                f"{' and more' if len(rows) > 5 else ''}; type more characters")
        return task_from_row(rows[0])

    def repos(self) -> list[Path]:
        """Every repository that has tasks."""
        rows = self._connect().execute("SELECT DISTINCT repo FROM tasks").fetchall()
        return [Path(r[0]) for r in rows if isinstance(r[0], str) and r[0]]

    def tasks_on_host(self, host: str) -> list[Task]:
        """The tasks whose work lives on that host (every state but merged and discarded:
        a worktree, a session there), newest first: a host is not removed under them.
        A read of the store alone: `host ls` and `host rm` ask it without an engine."""
        return [t for t in self.list_tasks(archived=None)
                if t.host == host and t.state not in CLOSED_STATES]

    def list_tasks(self, repo: Path | None = None,
                   states: TaskState | Iterable[TaskState] | None = None,
                   limit: int | None = None, *, endpoint: str | None = None,
                   archived: bool | None = False) -> list[Task]:
        """Tasks, newest first, optionally of one repository / in some states. Archived
        tasks are left out (`archived=True`: only them; None: every task)."""
        where: list[str] = []
        args: list[Any] = []
        if archived is not None:
            where.append("archived_at IS NOT NULL" if archived else "archived_at IS NULL")
        if repo is not None:
            where.append("repo = ?")
            args.append(str(repo))
        state_values = states_tuple(states)
        if states is not None:
            if not state_values:
                return []
            where.append(f"state IN ({', '.join('?' for _ in state_values)})")
            args.extend(state_values)
        if endpoint is not None:
            where.append("endpoint = ?")
            args.append(endpoint)
        sql = "SELECT * FROM tasks"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, id"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        return [task_from_row(r) for r in self._connect().execute(sql, args).fetchall()]

    def recent_repos(self, limit: int = 10) -> list[Path]:
        """Repositories by their newest task, newest first (the panel offers them)."""
        rows = self._connect().execute(
            "SELECT repo, MAX(created_at) AS newest FROM tasks GROUP BY repo "
            "ORDER BY newest DESC LIMIT ?", (int(limit),)).fetchall()
        return [Path(r[0]) for r in rows if isinstance(r[0], str) and r[0]]

    def archive_tasks(self, task_ids: Iterable[str], now: float, *,
                      closed_before: float | None = None,
                      repo: Path | None = None) -> list[str]:
        """Archive closed tasks (merged, discarded): out of the lists, their rows and logs
        kept. `task_ids`, or with `closed_before`, every closed task (of `repo`) last
        changed before then. The ids archived (a task not closed, or archived already, is
        left)."""
        closed = tuple(s.value for s in CLOSED_STATES)
        marks = ", ".join("?" for _ in closed)
        with self.transaction() as conn:
            if closed_before is not None:
                where = "" if repo is None else " AND repo = ?"
                rows = conn.execute(
                    f"SELECT id FROM tasks WHERE archived_at IS NULL AND state IN ({marks}) "
                    f"AND updated_at < ?{where}",
                    (*closed, closed_before, *(() if repo is None else (str(repo),)))
                ).fetchall()
            else:
                ids = list(task_ids)
                rows = conn.execute(
                    f"SELECT id FROM tasks WHERE archived_at IS NULL AND state IN ({marks}) "
                    f"AND id IN ({', '.join('?' for _ in ids)})", (*closed, *ids)
                ).fetchall() if ids else []
            done = [str(r[0]) for r in rows]
            for tid in done:
                conn.execute("UPDATE tasks SET archived_at = ? WHERE id = ?", (now, tid))
        return done

    def unarchive_tasks(self, task_ids: Iterable[str]) -> list[str]:
        """Bring archived tasks back to the lists; the ids brought back."""
        done: list[str] = []
        with self.transaction() as conn:
            for tid in task_ids:
                if conn.execute("UPDATE tasks SET archived_at = NULL WHERE id = ? AND "
                                "archived_at IS NOT NULL", (tid,)).rowcount:
                    done.append(tid)
        return done

    def update_task(self, task_id: str,
                    expect_state: TaskState | Iterable[TaskState] | None = None,
                    **fields_: Any) -> bool:
        """Set fields of a task; with ``expect_state``, only if it is (one of) that state.

        Returns whether a row changed. ``updated_at`` is set to now unless given.
        """
        unknown = set(fields_) - set(TASK_COLUMNS) - {"id"}
        if unknown or "id" in fields_:
            raise TypeError(f"cannot update task fields: {', '.join(sorted(unknown or {'id'}))}")
        fields_.setdefault("updated_at", time.time())
        if "state" in fields_:
            fields_["state"] = TaskState(fields_["state"])
        sets = ", ".join(f"{name} = ?" for name in fields_)
        args = [to_store(name, value) for name, value in fields_.items()]
        sql = f"UPDATE tasks SET {sets} WHERE id = ?"
        args.append(task_id)
        if expect_state is not None:
            expected = states_tuple(expect_state)
            if not expected:
                return False
            sql += f" AND state IN ({', '.join('?' for _ in expected)})"
            args.extend(expected)
        with self.transaction() as conn:
            return conn.execute(sql, args).rowcount > 0

    def modify_task(self, task_id: str, change: Callable[[Task], dict[str, Any] | None]) -> Task:
        """Read-modify-write in one IMMEDIATE transaction: ``change(task)`` returns fields.

        This is the way to add to counters (tokens, turns) without losing another process's
        update.
        """
        with self.transaction() as conn:
            row = conn.execute("SELECT * FROM tasks WHERE id = ?", (task_id,)).fetchone()
            if row is None:
                raise UnknownTaskError(f"no task {task_id!r}")
            task = task_from_row(row)
            updates = dict(change(task) or {})
            if updates:
                self.update_task(task_id, **updates)
                for name, value in updates.items():
                    setattr(task, name, value)
            return task

    def delete_task(self, task_id: str) -> bool:
        """Remove a task and its attempts (the engine deletes files and config dir)."""
        with self.transaction() as conn:
            conn.execute("DELETE FROM attempts WHERE task_id = ?", (task_id,))
            return conn.execute("DELETE FROM tasks WHERE id = ?", (task_id,)).rowcount > 0

    def count_tasks(self, states: TaskState | Iterable[TaskState] | None = None,
                    endpoint: str | None = None, *, host: str | None = None) -> int:
        where: list[str] = []
        args: list[Any] = []
        if host is not None:
            where.append("host = ?")
            args.append(host)
        state_values = states_tuple(states)
        if states is not None:
            if not state_values:
                return 0
            where.append(f"state IN ({', '.join('?' for _ in state_values)})")
            args.extend(state_values)
        if endpoint is not None:
            where.append("endpoint = ?")
            args.append(endpoint)
        sql = "SELECT COUNT(*) FROM tasks" + (" WHERE " + " AND ".join(where) if where else "")
        return int(self._connect().execute(sql, args).fetchone()[0])

    def group(self, group_id: str) -> list[Task]:
        """The copies submitted together under ``group_id``, oldest first."""
        rows = self._connect().execute(
            "SELECT * FROM tasks WHERE group_id = ? ORDER BY created_at, title, id",
            (group_id,)).fetchall()
        return [task_from_row(r) for r in rows]
