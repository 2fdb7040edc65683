"""Rows <-> the domain model (core/model.py): each dataclass field is the column of the same
name. The one encoding on the way in (to_db, to_store: the key hidden in a worker's words)
and a total decoding on the way out (a damaged row is marked, never raised)."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable
from dataclasses import MISSING, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from fleet_tui.core import redaction
from fleet_tui.core.model import Attempt, EndpointState, Task
from fleet_tui.core.states import TaskState, Verdict

__all__ = ["ATTEMPT_COLUMNS", "ENDPOINT_COLUMNS", "TASK_COLUMNS", "WORKER_TEXT",
           "attempt_from_row", "endpoint_from_row", "states_tuple", "task_from_row", "to_db",
           "to_store"]

_NOT_COLUMNS = {"row_error", "row_damaged"}
TASK_COLUMNS = tuple(f.name for f in fields(Task) if f.name not in _NOT_COLUMNS)
ATTEMPT_COLUMNS = tuple(f.name for f in fields(Attempt) if f.name not in _NOT_COLUMNS)


def to_db(name: str, value: Any) -> Any:
    """A field's Python value -> the value its column holds (the one encoding: the store and
    anything that fills a database in bulk, such as the start-up benchmark)."""
    if value is None:
        return None
    if name in ("extra_args", "conflicts"):
        return json.dumps(list(value))
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, StrEnum):
        return value.value
    return value


# Columns that hold what a worker, its stderr or the provider said (a result text, a tool
# summary, an error): the API key is hidden in them on every write (redaction.redact, with
# the keys this process knows). The prompt and the title are the user's own words.
WORKER_TEXT = frozenset({"message", "last_tool", "land_note", "park_message", "park_reason",
                          "held", "cap_reason"})


def to_store(name: str, value: Any) -> Any:
    """to_db, with the key hidden in the columns that hold a worker's words."""
    if name in WORKER_TEXT and isinstance(value, str) and value:
        return redaction.redact(value)
    return to_db(name, value)


# --- decoding rows, totally ------------------------------------------------------------------
# A row is whatever SQLite holds, and SQLite keeps any value in any column: a hand-edited or
# damaged row must not stop a listing. Each column is checked against its field's type; a
# value that does not fit is replaced by the field's default and the row is marked (with the
# first bad column named), never raised.

_NONE = type(None)
_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    # annotation -> (accepted SQLite value types, conversion)
    "str": ((str,), ""), "str | None": ((str, _NONE), ""),
    "int": ((int,), ""), "int | None": ((int, _NONE), ""),
    "float": ((float, int), ""), "float | None": ((float, int, _NONE), ""),
    "Path": ((str,), "path"), "Path | None": ((str, _NONE), "path?"),
    "TaskState": ((str,), "state"), "list[str]": ((str,), "json-list"),
}


def _column_kinds(cls: type) -> list[tuple[str, tuple[type, ...], str, Any]]:
    out: list[tuple[str, tuple[type, ...], str, Any]] = []
    for f in fields(cls):
        if f.name in _NOT_COLUMNS:
            continue
        types, conv = _KINDS[str(f.type)]
        if f.default is not MISSING:
            default: Any = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory
        elif conv:
            default = Path(".")
        else:
            default = 0 if int in types else ""
        out.append((f.name, types, conv, default))
    return out


_TASK_KINDS = _column_kinds(Task)
_ATTEMPT_KINDS = _column_kinds(Attempt)
_ENDPOINT_KINDS = _column_kinds(EndpointState)
ENDPOINT_COLUMNS = tuple(f.name for f in fields(EndpointState) if f.name not in _NOT_COLUMNS)
_STATE_BY_VALUE = {s.value: s for s in TaskState}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _decode(row: sqlite3.Row, kinds: list[tuple[str, tuple[type, ...], str, Any]]
            ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Column values -> field values; the complaints about the columns that did not fit."""
    data: dict[str, Any] = {}
    bad: list[tuple[str, str]] = []
    keys = set(row.keys())
    for name, types, conv, default in kinds:
        if name not in keys:
            continue  # an older schema's row: the field's default
        value = row[name]
        ok = type(value) in types
        if ok and conv:
            if conv == "path":
                # fleet-tui stores absolute paths only: a relative one would be read
                # against whatever folder the reader runs in (another repository)
                ok = os.path.isabs(value)
                value = Path(value)
            elif conv == "path?":
                ok = not value or os.path.isabs(value)
                value = Path(value) if value else None
            elif conv == "state":
                ok = value in _STATE_BY_VALUE
                value = _STATE_BY_VALUE.get(value)
            else:  # json-list
                try:
                    value = json.loads(value or "[]")
                except (ValueError, RecursionError):
                    ok = False
                else:
                    ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        if not ok:
            bad.append((name, f"column {name} holds {_shown(row[name])}"))
            value = default() if callable(default) else default
        elif name in WORKER_TEXT and type(value) is str and value:
            # a row written before the key was hidden on write, or by a process that did
            # not know the key: hidden on the way out too (the panel shows what it reads)
            value = redaction.redact(value)
        data[name] = value
    return data, bad


def task_from_row(row: sqlite3.Row) -> Task:
    data, bad = _decode(row, _TASK_KINDS)
    task = Task(**data)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        task.row_error = (f"the store row of task {task.id} is unreadable: {bad[0][1]}{more}"
                          "; discard the task, or correct the row")
        task.row_damaged = tuple(name for name, _ in bad)
        task.message = task.row_error
        task.verdict = Verdict.CRASHED
        if any(name == "state" for name, _ in bad):
            task.state = TaskState.FAILED
    return task


def attempt_from_row(row: sqlite3.Row) -> Attempt:
    data, bad = _decode(row, _ATTEMPT_KINDS)
    attempt = Attempt(**data)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        attempt.row_error = (f"the store row of attempt {attempt.n} of task "
                             f"{attempt.task_id} is unreadable: {bad[0][1]}{more}")
    return attempt


def endpoint_from_row(row: sqlite3.Row) -> EndpointState:
    data, bad = _decode(row, _ENDPOINT_KINDS)
    state = EndpointState(**data)
    if bad:
        # a damaged row must not stop the fleet: its limits are dropped, and said
        state = EndpointState(endpoint=state.endpoint, updated_at=state.updated_at)
        state.row_error = (f"the store row of endpoint {state.endpoint} is unreadable: "
                           f"{bad[0][1]}; its limits were ignored")
    return state


def states_tuple(states: TaskState | Iterable[TaskState] | str | None) -> tuple[str, ...]:
    if states is None:
        return ()
    if isinstance(states, str):
        return (TaskState(states).value,)
    return tuple(TaskState(s).value for s in states)
