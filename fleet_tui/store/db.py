"""SQLite store of tasks and attempts, shared by every fleet-tui process.

Two panels and the CLI may use one database at once. So: WAL mode (readers never block the
writer), a long busy timeout, one connection per thread, and every read-modify-write inside
``BEGIN IMMEDIATE`` (the write lock is taken up front, so two writers queue instead of one of
them failing with "database is locked" on upgrade). Conditional updates
(``update_task(..., expect_state=...)``) and ``claim_next`` are how two engines avoid starting
the same task or exceeding the per-endpoint concurrency cap.

The store never holds a credential: nothing here has a field for one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from fleet_tui.core import redaction
from fleet_tui.core.errors import EXIT_NOT_FOUND, EXIT_USAGE, FleetTuiError
from fleet_tui.core.states import (
    ACTIVE_STATES,
    CLOSED_STATES,
    FINISHED_STATES,
    LAND_ACTIVE,
    PENDING_STATES,
    LandState,
    TaskState,
    Verdict,
)
from fleet_tui.core.titles import task_title
from fleet_tui.system import paths

# TaskState and its phase sets are states.py's (the one table of states), re-exported here
# for the code that has always imported them from the store.
__all__ = [
    "ACTIVE_STATES",
    "ATTEMPT_COLUMNS",
    "CLOSED_STATES",
    "FINISHED_STATES",
    "MAX_COPIES",
    "SCHEMA_VERSION",
    "TASK_COLUMNS",
    "AmbiguousTaskError",
    "Attempt",
    "EndpointState",
    "Store",
    "StoreError",
    "StoreUnusable",
    "Task",
    "TaskSpec",
    "TaskState",
    "UnknownTaskError",
    "new_task_id",
    "to_db",
    "unusable",
]


# how many copies of one task a submit may ask for (the engine and the form agree on it)
MAX_COPIES = 50

ID_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
ID_LENGTH = 6
_ID_PREFIX_RE = re.compile(r"^[0-9a-z]{1,6}$")


class StoreError(FleetTuiError):
    """A store problem with a message meant for the user."""

    title = "Task database"


class StoreUnusable(StoreError, sqlite3.DatabaseError):
    """The task database cannot be written or is damaged: one line that says which and
    what to do. Still a sqlite3.DatabaseError, so the engine's loops that outlive a
    database error go on as they did."""

    exit_code = EXIT_USAGE


def unusable(path: Path, exc: BaseException) -> StoreUnusable | None:
    """The user's message for a database error that no retry mends (a store that cannot be
    written, a damaged file), None for any other (locked, busy: the callers' business)."""
    text = str(exc)
    if isinstance(exc, StoreUnusable):
        return exc
    if "readonly" in text or "read-only" in text:
        return StoreUnusable(
            f"the task database {path} cannot be written ({text}): it, its folder or its "
            "file system is read-only (`chattr +i`, a read-only mount, permissions); make it "
            "writable, or set FLEET_TUI_HOME to a writable folder")
    if "malformed" in text or "not a database" in text:
        return StoreUnusable(
            f"the task database {path} is damaged ({text}): move it aside (`mv {path} "
            f"{path}.damaged`; fleet-tui starts an empty one), or recover what it holds "
            f"with `sqlite3 {path}.damaged .recover | sqlite3 {path}`")
    return None


class UnknownTaskError(StoreError, KeyError):
    """No task has this id (or id prefix)."""

    exit_code = EXIT_NOT_FOUND

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class AmbiguousTaskError(StoreError):
    """An id prefix matches more than one task."""

    exit_code = EXIT_USAGE


def new_task_id() -> str:
    """A random 6-char id from [0-9a-z] (uniqueness is checked on insert)."""
    return "".join(secrets.choice(ID_ALPHABET) for _ in range(ID_LENGTH))


@dataclass
class TaskSpec:
    """What the user asks for; the engine turns it into a stored Task."""

    prompt: str
    title: str = ""
    repo: Path | None = None  # None: the repository of the current directory
    base_ref: str | None = None
    model: str = "main"  # "main" | "small" | an explicit model name
    permission_mode: str | None = None
    effort: str | None = None
    max_turns: int | None = None
    timeout: float | None = None
    extra_args: list[str] = field(default_factory=list)
    endpoint: str | None = None  # a named endpoint of config.toml (None: "default")
    host: str | None = None  # a host of config.toml, or "any" (None: "local")


@dataclass
class Task:
    """One stored task: its spec, where it runs, and the summary of its latest attempt."""

    id: str
    prompt: str
    repo: Path
    title: str = ""
    base_ref: str | None = None
    base_branch: str | None = None
    base_commit: str = ""
    branch: str = ""
    worktree: Path | None = None
    endpoint: str = ""  # its endpoint's name in config.toml (v8; before: the base URL)
    model: str = "main"
    permission_mode: str | None = None
    effort: str | None = None
    max_turns: int | None = None
    timeout: float | None = None
    extra_args: list[str] = field(default_factory=list)
    state: TaskState = TaskState.QUEUED
    verdict: str | None = None
    message: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    not_before: float | None = None
    attempt_count: int = 0
    session_id: str | None = None
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    last_tool: str | None = None
    last_event_at: float | None = None
    added_lines: int = 0
    deleted_lines: int = 0
    claimed_by: str | None = None
    claimed_at: float | None = None
    # landing (issue 12; migration _V3_LANDING)
    group_id: str | None = None  # copies submitted together share it (best of N)
    conflicts: list[str] = field(default_factory=list)  # an update from base stopped here
    pushed: str | None = None  # "remote branch @ commit" of the last push
    land_state: str | None = None  # the merge queue: states.LandState
    land_order: float | None = None  # place in the merge queue (smallest lands first)
    land_fixes: int = 0  # follow-ups the queue sent the worker to fix a conflict or test
    land_note: str | None = None  # why stopped, what it waits for
    land_commit: str | None = None  # the commit the queue tested and is landing
    land_attempt: int = 0  # the attempt number of the queue's fix follow-up
    gate: str | None = None  # the last test gate: "passed" | "failed" (None: never run)
    archived_at: float | None = None  # archived: out of the lists, logs kept (v5)
    # the host its attempts run on (issue 20): a host of config.toml; "any" until the
    # claim that first starts it places it on the host with a free slot
    host: str = "local"
    # Not a column: why the stored row could not be read as it is (None: it could). Such a
    # task is shown failed with this as its message, and the engine never runs it.
    row_error: str | None = None
    # Not a column: the columns that could not be read (their fields hold defaults).
    row_damaged: tuple[str, ...] = ()

    @property
    def short_title(self) -> str:
        """The title, else the one its prompt gives (titles.task_title: the one rule)."""
        return task_title(self.title, self.prompt)


@dataclass
class Attempt:
    """One run of claude for a task (fresh, resumed, or a follow-up)."""

    id: int
    task_id: str
    n: int
    kind: str = "fresh"  # "fresh" | "resume" | "followup"
    prompt: str = ""
    model: str | None = None
    pid: int | None = None
    pid_start: str | None = None  # /proc/<pid>/stat start time, guards against pid reuse
    runner_pid: int | None = None
    dir: Path | None = None
    events_path: Path | None = None
    stderr_path: Path | None = None
    exit_path: Path | None = None
    config_dir: Path | None = None
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    verdict: str | None = None
    message: str | None = None
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    session_id: str | None = None
    last_tool: str | None = None
    last_event_at: float | None = None
    events_offset: int = 0
    port: int | None = None  # the attempt's FLEET_PORT (v5)
    host: str = "local"  # the host it runs on (v6); attempts before v6 ran here
    placement: str | None = None  # JSON: execution.host.Placement.to_record() (v6)
    row_error: str | None = None  # not a column: see Task.row_error


@dataclass
class EndpointState:
    """What the fleet knows of one endpoint's limits, shared by every fleet-tui process
    (policy decides it; the scheduler obeys it): a usage window it is parked for, an
    account problem it is held for, an effective cap lowered below the configured one."""

    endpoint: str
    parked_until: float | None = None  # no request before this (the window's reset + jitter)
    park_reason: str | None = None  # "5-hour window, code 1308"
    park_message: str | None = None  # the refusal, in the provider's words (its reset)
    next_start: float | None = None  # after a park: the earliest next start (staggered)
    held: str | None = None  # why no task may start until the user acts (None: not held)
    held_task: str | None = None  # the task that met it
    held_settings: str | None = None  # fingerprint of the settings it was met with
    cap: int | None = None  # the effective cap (None: the configured one)
    cap_reason: str | None = None
    cap_changed_at: float | None = None
    event: str | None = None  # the latest event: park, hold, cap (the panel says it once)
    event_at: float | None = None
    updated_at: float = 0.0
    row_error: str | None = None  # not a column: see Task.row_error


# --- schema ---------------------------------------------------------------------------------

_V1 = """
CREATE TABLE tasks (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL DEFAULT '',
    prompt TEXT NOT NULL,
    repo TEXT NOT NULL,
    base_ref TEXT,
    base_branch TEXT,
    base_commit TEXT NOT NULL DEFAULT '',
    branch TEXT NOT NULL DEFAULT '',
    worktree TEXT,
    endpoint TEXT NOT NULL DEFAULT '',
    model TEXT NOT NULL DEFAULT 'main',
    permission_mode TEXT,
    effort TEXT,
    max_turns INTEGER,
    timeout REAL,
    extra_args TEXT NOT NULL DEFAULT '[]',
    state TEXT NOT NULL DEFAULT 'queued',
    verdict TEXT,
    message TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    not_before REAL,
    attempt_count INTEGER NOT NULL DEFAULT 0,
    session_id TEXT,
    turns INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    last_tool TEXT,
    last_event_at REAL,
    added_lines INTEGER NOT NULL DEFAULT 0,
    deleted_lines INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX tasks_repo_state_updated ON tasks(repo, state, updated_at);
CREATE INDEX tasks_state_endpoint ON tasks(state, endpoint);
CREATE INDEX tasks_created ON tasks(created_at);
CREATE TABLE attempts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    n INTEGER NOT NULL,
    kind TEXT NOT NULL DEFAULT 'fresh',
    prompt TEXT NOT NULL DEFAULT '',
    model TEXT,
    pid INTEGER,
    pid_start TEXT,
    runner_pid INTEGER,
    dir TEXT,
    events_path TEXT,
    stderr_path TEXT,
    exit_path TEXT,
    config_dir TEXT,
    started_at REAL,
    finished_at REAL,
    exit_code INTEGER,
    signal INTEGER,
    verdict TEXT,
    message TEXT,
    turns INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    session_id TEXT,
    last_tool TEXT,
    last_event_at REAL,
    events_offset INTEGER NOT NULL DEFAULT 0,
    UNIQUE(task_id, n)
);
"""

# v2: who claimed a task and when (claim_next), so a crashed engine's claims can be seen.
_V2 = """
ALTER TABLE tasks ADD COLUMN claimed_by TEXT;
ALTER TABLE tasks ADD COLUMN claimed_at REAL;
"""


# v5 (issue 13): archived tasks (kept with their logs, out of the lists) and each attempt's
# FLEET_PORT (unique among the attempts that run: the store hands it out).
_V5_READY = """
ALTER TABLE tasks ADD COLUMN archived_at REAL;
ALTER TABLE attempts ADD COLUMN port INTEGER
"""

# v6 (issue 18): where each attempt runs, the host seam's record: the host's name and the
# placement (worktree, branch, base, config dir, attempt folder) as JSON. The older columns
# (dir, config_dir, ...) are still written, for older versions sharing the store.
_V6_HOSTS = """
ALTER TABLE attempts ADD COLUMN host TEXT NOT NULL DEFAULT 'local';
ALTER TABLE attempts ADD COLUMN placement TEXT
"""


def _script(sql: str) -> Callable[[sqlite3.Connection], None]:
    def run(conn: sqlite3.Connection) -> None:
        for statement in sql.split(";"):
            if statement.strip():
                conn.execute(statement)
    return run


# landing many branches (issue 12): copies' group, an update's conflicts, the push, the
# merge queue's state per task (the queue is the tasks with an active land_state, ordered by
# land_order), the last test gate's result.
_V3_LANDING = """
ALTER TABLE tasks ADD COLUMN group_id TEXT;
ALTER TABLE tasks ADD COLUMN conflicts TEXT NOT NULL DEFAULT '[]';
ALTER TABLE tasks ADD COLUMN pushed TEXT;
ALTER TABLE tasks ADD COLUMN land_state TEXT;
ALTER TABLE tasks ADD COLUMN land_order REAL;
ALTER TABLE tasks ADD COLUMN land_fixes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN land_note TEXT;
ALTER TABLE tasks ADD COLUMN land_commit TEXT;
ALTER TABLE tasks ADD COLUMN land_attempt INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN gate TEXT;
CREATE INDEX tasks_group ON tasks(group_id);
CREATE INDEX tasks_land ON tasks(land_state, land_order)
"""

# Migration i brings a database from user_version i to i + 1. Append, never edit.
# v4: each endpoint's limits (a usage window's park, an account problem's hold, a lowered
# cap), so that every fleet-tui process honours them and they survive a restart.
_V4_ENDPOINTS = """
CREATE TABLE endpoints (
    endpoint TEXT PRIMARY KEY,
    parked_until REAL,
    park_reason TEXT,
    park_message TEXT,
    next_start REAL,
    held TEXT,
    held_task TEXT,
    held_settings TEXT,
    cap INTEGER,
    cap_reason TEXT,
    cap_changed_at REAL,
    event TEXT,
    event_at REAL,
    updated_at REAL NOT NULL DEFAULT 0
);
"""

# v7 (issue 19): the gateway's records. A token per attempt (only its SHA-256 is kept: the
# store never holds a token a worker could use), valid until revoked; the meter, a row per
# request the gateway passed on (its usage, and its cost from the price table when known).
_V7_GATEWAY = """
CREATE TABLE gateway_tokens (
    token_hash TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    attempt_id INTEGER,
    endpoint TEXT NOT NULL,
    created_at REAL NOT NULL,
    revoked_at REAL
);
CREATE INDEX gateway_tokens_attempt ON gateway_tokens(attempt_id);
CREATE TABLE usage (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    task_id TEXT,
    attempt_id INTEGER,
    endpoint TEXT NOT NULL,
    model TEXT NOT NULL DEFAULT '',
    status INTEGER,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    cost REAL
);
CREATE INDEX usage_task ON usage(task_id);
CREATE INDEX usage_at ON usage(at)
"""

# v8 (issue 19): a task's endpoint is its name in config.toml ("default": the top-level
# settings), no longer its base URL. Every row from before named the base URL the settings
# had then, the default endpoint's: it reads "default", and so does the endpoint's state
# (of several URL rows the latest kept, beside none already named "default").
_V8_ENDPOINT_NAMES = """
UPDATE tasks SET endpoint = 'default' WHERE endpoint = '' OR instr(endpoint, '://') > 0;
DELETE FROM endpoints WHERE instr(endpoint, '://') > 0 AND (
    EXISTS (SELECT 1 FROM endpoints WHERE endpoint = 'default')
    OR rowid <> (SELECT rowid FROM endpoints WHERE instr(endpoint, '://') > 0
                 ORDER BY updated_at DESC, rowid DESC LIMIT 1));
UPDATE endpoints SET endpoint = 'default' WHERE instr(endpoint, '://') > 0
"""

# issue 22: review comments on a task's diff lines (store/reviews.py): the anchor (file,
# side, lines and their text, the rows quoted), the comment, when it was sent and whether
# its lines were as commented then, and its last known state (a closed task's is kept).
_REVIEW_COMMENTS = """
CREATE TABLE IF NOT EXISTS review_comments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    path TEXT NOT NULL,
    side TEXT NOT NULL DEFAULT 'new',
    start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL,
    lines TEXT NOT NULL DEFAULT '[]',
    quote TEXT NOT NULL DEFAULT '[]',
    body TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    sent_at REAL,
    sent_intact INTEGER,
    sent_how TEXT,
    state TEXT NOT NULL DEFAULT 'open'
);
CREATE INDEX IF NOT EXISTS review_comments_task ON review_comments(task_id)
"""

# issue 20: the host a task runs on (its attempts, resumes and follow-ups stay there); the
# tasks before it ran here. Done again over a store that has it (a version number put
# back by hand), it changes nothing.
def _task_host(conn: sqlite3.Connection) -> None:
    columns = {row[1] for row in conn.execute("PRAGMA table_info(tasks)")}
    if "host" not in columns:
        conn.execute("ALTER TABLE tasks ADD COLUMN host TEXT NOT NULL DEFAULT 'local'")
    conn.execute("CREATE INDEX IF NOT EXISTS tasks_state_host ON tasks(state, host)")


# issue 20: the attempts a host lost (silent past its lease) until what they started there
# is swept, so that an engine restarted meanwhile still sweeps them once the host is back.
_LOST_ATTEMPTS = """
CREATE TABLE IF NOT EXISTS lost_attempts (
    host TEXT NOT NULL,
    task_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    lost_at REAL NOT NULL,
    swept_at REAL,
    swept INTEGER,
    PRIMARY KEY (host, task_id, attempt)
);
CREATE INDEX IF NOT EXISTS lost_attempts_pending ON lost_attempts(swept_at, host)
"""


# issue 22: the diff's viewed marks (store/reviews.py, ViewedFiles): a file of a task's
# diff marked viewed, with the digest its part of the patch had then (another digest reads
# "changed since"), so the marks outlive the panel that made them.
_VIEWED_FILES = """
CREATE TABLE IF NOT EXISTS viewed_files (
    task_id TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    path TEXT NOT NULL,
    digest TEXT NOT NULL,
    viewed_at REAL NOT NULL,
    PRIMARY KEY (task_id, path)
)
"""


# the route an attempt's gateway token maps to (gateway/routes.py, a JSON record: endpoint,
# base URL, where its key comes from; never the key): fixed when the attempt starts, so that
# no other fleet-tui process re-points a running worker. Done again over a store that has
# it, it changes nothing.
def _token_route(conn: sqlite3.Connection) -> None:
    columns = {row[1] for row in conn.execute("PRAGMA table_info(gateway_tokens)")}
    if "route" not in columns:
        conn.execute("ALTER TABLE gateway_tokens ADD COLUMN route TEXT")


# An error answer of the provider is metered as an error with its code (z.ai's
# business code, else the HTTP status), not as a request of no model and no price.
# Done again over a store that has it, it changes nothing.
def _usage_error(conn: sqlite3.Connection) -> None:
    columns = {row[1] for row in conn.execute("PRAGMA table_info(usage)")}
    if "error" not in columns:
        conn.execute("ALTER TABLE usage ADD COLUMN error TEXT")


# best of N: each copy's evidence (store/evidence.py: the test command's and the named
# checks' results, the change's size, whether it merges; the fingerprint of what it is
# evidence of), and a group's pick (who was picked as the best, why, by whom: auto_pick's
# one decision per group).
_COPY_EVIDENCE = """
CREATE TABLE IF NOT EXISTS copy_evidence (
    task_id TEXT PRIMARY KEY REFERENCES tasks(id) ON DELETE CASCADE,
    group_id TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    gathered_at REAL NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS copy_evidence_group ON copy_evidence(group_id);
CREATE TABLE IF NOT EXISTS best_picks (
    group_id TEXT PRIMARY KEY,
    task_id TEXT,
    reason TEXT NOT NULL,
    how TEXT NOT NULL,
    picked_at REAL NOT NULL,
    notified INTEGER NOT NULL DEFAULT 0
)
"""


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _script(_V1), _script(_V2), _script(_V3_LANDING), _script(_V4_ENDPOINTS),
    _script(_V5_READY), _script(_V6_HOSTS), _script(_V7_GATEWAY),
    _script(_V8_ENDPOINT_NAMES), _script(_REVIEW_COMMENTS), _task_host,
    _script(_LOST_ATTEMPTS), _script(_VIEWED_FILES), _token_route, _usage_error,
    _script(_COPY_EVIDENCE)]
SCHEMA_VERSION = len(MIGRATIONS)

_NOT_COLUMNS = {"row_error", "row_damaged"}
TASK_COLUMNS = tuple(f.name for f in fields(Task) if f.name not in _NOT_COLUMNS)
ATTEMPT_COLUMNS = tuple(f.name for f in fields(Attempt) if f.name not in _NOT_COLUMNS)
_ATTEMPT_PATH_FIELDS = {"dir", "events_path", "stderr_path", "exit_path", "config_dir"}


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
_WORKER_TEXT = frozenset({"message", "last_tool", "land_note", "park_message", "park_reason",
                          "held", "cap_reason"})


def _to_store(name: str, value: Any) -> Any:
    """to_db, with the key hidden in the columns that hold a worker's words."""
    if name in _WORKER_TEXT and isinstance(value, str) and value:
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
        elif name in _WORKER_TEXT and type(value) is str and value:
            # a row written before the key was hidden on write, or by a process that did
            # not know the key: hidden on the way out too (the panel shows what it reads)
            value = redaction.redact(value)
        data[name] = value
    return data, bad


def _task_from_row(row: sqlite3.Row) -> Task:
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


def _attempt_from_row(row: sqlite3.Row) -> Attempt:
    data, bad = _decode(row, _ATTEMPT_KINDS)
    attempt = Attempt(**data)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        attempt.row_error = (f"the store row of attempt {attempt.n} of task "
                             f"{attempt.task_id} is unreadable: {bad[0][1]}{more}")
    return attempt


def _endpoint_from_row(row: sqlite3.Row) -> EndpointState:
    data, bad = _decode(row, _ENDPOINT_KINDS)
    state = EndpointState(**data)
    if bad:
        # a damaged row must not stop the fleet: its limits are dropped, and said
        state = EndpointState(endpoint=state.endpoint, updated_at=state.updated_at)
        state.row_error = (f"the store row of endpoint {state.endpoint} is unreadable: "
                           f"{bad[0][1]}; its limits were ignored")
    return state


def _states_tuple(states: TaskState | Iterable[TaskState] | str | None) -> tuple[str, ...]:
    if states is None:
        return ()
    if isinstance(states, str):
        return (TaskState(states).value,)
    return tuple(TaskState(s).value for s in states)


class Store:
    """The task database. Safe to share between threads and processes."""

    BUSY_TIMEOUT_MS = 60_000

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else paths.db_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=paths.PRIVATE_DIR)
        except OSError as exc:
            raise StoreError(f"cannot create the folder of the task database {self.path}: "
                             f"{exc.strerror or exc}; set FLEET_TUI_HOME to a writable folder"
                             ) from None
        self._make_private()
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._migrate()

    def _make_private(self) -> None:
        """The database holds every prompt: 0600 (SQLite gives its -wal and -shm files the
        database's mode), in a 0700 data folder. Fixes an older install's modes too."""
        with contextlib.suppress(OSError):
            if self.path.parent.resolve() == paths.home().resolve():
                paths.secure_home()
        if not self.path.exists():
            with contextlib.suppress(OSError):
                paths.private_file(self.path)
        for name in ("", "-wal", "-shm", "-journal"):
            paths.make_private(Path(f"{self.path}{name}"), paths.PRIVATE_FILE)

    # --- connections and transactions ---------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            return conn
        # No connection yet in this thread, or we are a forked child: a SQLite connection
        # must not cross fork(), so open a fresh one.
        try:
            conn = sqlite3.connect(self.path, timeout=self.BUSY_TIMEOUT_MS / 1000,
                                   isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {self.BUSY_TIMEOUT_MS}")
            self._set_wal(conn)
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.DatabaseError as exc:
            raise unusable(self.path, exc) or StoreError(
                f"cannot open the task database {self.path}: {exc}") from None
        self._local.conn = conn
        self._local.pid = os.getpid()
        with self._all_lock:
            self._all.append(conn)
        return conn

    @staticmethod
    def _set_wal(conn: sqlite3.Connection) -> None:
        """Switch to WAL; retried because the switch itself may briefly meet a lock.

        A file system that cannot do WAL answers with another mode: we keep that mode
        (still correct thanks to BEGIN IMMEDIATE and the busy timeout, just less concurrent).
        """
        deadline = time.monotonic() + 30
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL").fetchone()
                return
            except sqlite3.OperationalError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.02)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (``BEGIN IMMEDIATE``): the lock is taken before any read.

        Re-entrant within a thread: a nested call joins the outer transaction.
        """
        conn = self._connect()
        if conn.in_transaction:
            yield conn
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as exc:
            raise (unusable(self.path, exc) or exc) from None
        try:
            yield conn
        except sqlite3.DatabaseError as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            failure = unusable(self.path, exc)
            if failure is None:
                raise
            raise failure from None
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            try:
                conn.execute("COMMIT")
            except sqlite3.DatabaseError as exc:
                raise (unusable(self.path, exc) or exc) from None

    def close(self) -> None:
        """Close every connection this Store opened (any thread)."""
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        self._local = threading.local()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _migrate(self) -> None:
        with self.transaction() as conn:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"the task database {self.path} has schema version {version}, newer than "
                    f"this fleet-tui understands ({SCHEMA_VERSION}); upgrade fleet-tui")
            for index in range(version, SCHEMA_VERSION):
                MIGRATIONS[index](conn)
            if version != SCHEMA_VERSION:
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # --- the attempts hosts lost, until swept ---------------------------------------------

    def record_lost(self, host: str, task_id: str, attempt: int, reason: str,
                    at: float) -> None:
        """A host lost this attempt: keep it until what it started there is swept (the
        first record stays)."""
        with self.transaction() as conn:
            conn.execute("INSERT OR IGNORE INTO lost_attempts (host, task_id, attempt, "
                         "reason, lost_at) VALUES (?, ?, ?, ?, ?)",
                         (host, task_id, attempt, _to_store("message", reason), at))

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

    def schema_version(self) -> int:
        return int(self._connect().execute("PRAGMA user_version").fetchone()[0])

    def journal_mode(self) -> str:
        return str(self._connect().execute("PRAGMA journal_mode").fetchone()[0])

    # --- tasks --------------------------------------------------------------------------------

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
            values = [_to_store(name, getattr(task, name)) for name in TASK_COLUMNS]
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
            return _task_from_row(row)
        rows = conn.execute("SELECT * FROM tasks WHERE id LIKE ? ORDER BY id LIMIT 6",
                            (key + "%",)).fetchall()
        if not rows:
            raise UnknownTaskError(f"no task {task_id!r} (see `fleet-tui ls`)")
        if len(rows) > 1:
            ids = ", ".join(r["id"] for r in rows[:5])
            raise AmbiguousTaskError(
                f"task id {task_id!r} is ambiguous: it matches {ids}"
                f"{' and more' if len(rows) > 5 else ''}; type more characters")
        return _task_from_row(rows[0])

    def repos(self) -> list[Path]:
        """Every repository that has tasks."""
        rows = self._connect().execute("SELECT DISTINCT repo FROM tasks").fetchall()
        return [Path(r[0]) for r in rows if isinstance(r[0], str) and r[0]]

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
        state_values = _states_tuple(states)
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
        return [_task_from_row(r) for r in self._connect().execute(sql, args).fetchall()]

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
        args = [_to_store(name, value) for name, value in fields_.items()]
        sql = f"UPDATE tasks SET {sets} WHERE id = ?"
        args.append(task_id)
        if expect_state is not None:
            expected = _states_tuple(expect_state)
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
            task = _task_from_row(row)
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
        state_values = _states_tuple(states)
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

        ``hosts`` (issue 20): each host's worker cap, in the order `any` prefers them on a
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
            return _task_from_row(fresh)

    # --- the merge queue: tasks with an active land_state, in land_order --------------------

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
        return [_task_from_row(r) for r in self._connect().execute(sql, args).fetchall()]

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

    def group(self, group_id: str) -> list[Task]:
        """The copies submitted together under ``group_id``, oldest first."""
        rows = self._connect().execute(
            "SELECT * FROM tasks WHERE group_id = ? ORDER BY created_at, title, id",
            (group_id,)).fetchall()
        return [_task_from_row(r) for r in rows]

    # --- endpoints: their limits (a park, a hold, a lowered cap) --------------------------------
    # What the limits are is policy's decision; the store keeps them, so that every process
    # sharing the database honours them, and applies them inside its transactions.

    def get_endpoint(self, endpoint: str) -> EndpointState | None:
        row = self._connect().execute("SELECT * FROM endpoints WHERE endpoint = ?",
                                      (endpoint,)).fetchone()
        return _endpoint_from_row(row) if row is not None else None

    def list_endpoints(self) -> list[EndpointState]:
        rows = self._connect().execute("SELECT * FROM endpoints ORDER BY endpoint").fetchall()
        return [_endpoint_from_row(r) for r in rows]

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
                     [*(_to_store(n, v) for n, v in updates.items()), endpoint])

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
            state = _endpoint_from_row(row) if row is not None else EndpointState(endpoint)
            updates = change(state)
            if updates:
                self._write_endpoint(conn, endpoint, updates, now)
                for name, value in {**updates, "updated_at": now}.items():
                    setattr(state, name, value)
            return state

    def claim_gated(self, endpoint: str, now: float, owner: str | None,
                    decide: Callable[[EndpointState | None, int],
                                     tuple[int | None, dict[str, Any] | None,
                                           dict[str, Any] | None, dict[str, Any] | None,
                                           bool]],
                    hosts: Mapping[str, int] | None = None,
                    starting: tuple[int, float] | None = None) -> Task | None:
        """`claim_next` under the endpoint's limits, in one IMMEDIATE transaction, so that
        two engines cannot both start a task into a closed window or past a ramp's step.

        ``decide(state, parked)`` (``parked``: how many of the endpoint's tasks wait with
        verdict window) returns (cap, fields, fields_on_claim, fields_on_idle,
        parked_first): the cap to claim under (None: start nothing now), endpoint fields to
        set now (a hold lifted), fields to set once a task is claimed (the staggered
        resume's next start), fields to set when no task is ready at all (the resume after
        a park is over), and whether parked sessions are claimed before fresh tasks.

        ``starting`` (most, since): nothing is claimed while `most` of the endpoint's tasks
        are starting (`starting_count`: claimed since `since`, their attempt's claude not
        yet begun), the policy.start_window of every engine sharing the store."""
        with self.transaction() as conn:
            if starting is not None and self._starting(conn, endpoint, starting[1]) \
                    >= starting[0]:
                return None
            row = conn.execute("SELECT * FROM endpoints WHERE endpoint = ?",
                               (endpoint,)).fetchone()
            state = _endpoint_from_row(row) if row is not None else None
            parked = 0
            if state is not None and state.parked_until is not None:
                parked = int(conn.execute(
                    "SELECT COUNT(*) FROM tasks WHERE endpoint = ? AND state = ? AND "
                    "verdict = ?", (endpoint, TaskState.WAITING.value,
                                    Verdict.WINDOW.value)).fetchone()[0])
            cap, fields_now, on_claim, on_idle, parked_first = decide(state, parked)
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
        note = _to_store("message", note)
        args: list[Any] = [note, time.time(), endpoint, TaskState.QUEUED.value, note]
        for prefix in prefixes:
            args += [len(prefix), prefix]
        with self.transaction() as conn:
            return conn.execute(
                f"UPDATE tasks SET message = ?, updated_at = ? WHERE endpoint = ? AND "
                f"state = ? AND message IS NOT ? AND (message IS NULL OR {ours})",
                args).rowcount

    # --- claims: one starter per task, and no start after a kill ------------------------------

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
                (TaskState.QUEUED.value, _to_store("message", message), now, task_id,
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
        message = _to_store("message", message)
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

    # --- attempts -----------------------------------------------------------------------------

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
                    [_to_store(c, getattr(attempt, c)) for c in columns])
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
        return _attempt_from_row(row)

    def list_attempts(self, task_id: str) -> list[Attempt]:
        rows = self._connect().execute(
            "SELECT * FROM attempts WHERE task_id = ? ORDER BY n", (task_id,)).fetchall()
        return [_attempt_from_row(r) for r in rows]

    def latest_attempt(self, task_id: str) -> Attempt | None:
        row = self._connect().execute(
            "SELECT * FROM attempts WHERE task_id = ? ORDER BY n DESC LIMIT 1",
            (task_id,)).fetchone()
        return _attempt_from_row(row) if row is not None else None

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
        return [_attempt_from_row(r) for r in rows]

    def update_attempt(self, attempt_id: int, **fields_: Any) -> bool:
        unknown = set(fields_) - set(ATTEMPT_COLUMNS)
        if unknown or {"id", "task_id", "n"} & set(fields_):
            raise TypeError(f"cannot update attempt fields: {', '.join(sorted(fields_))}")
        if not fields_:
            return False
        sets = ", ".join(f"{name} = ?" for name in fields_)
        args = [_to_store(n, v) for n, v in fields_.items()]
        with self.transaction() as conn:
            return conn.execute(f"UPDATE attempts SET {sets} WHERE id = ?",
                                [*args, attempt_id]).rowcount > 0
