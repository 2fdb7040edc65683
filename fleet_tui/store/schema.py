"""The task database's schema: the migrations, in order. A database at version n has had
MIGRATIONS[:n] applied (its `PRAGMA user_version`); each is run once, inside the
transaction that opens the store (connection.Database._migrate). Never edit one that has
shipped: add the next."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

__all__ = ["MIGRATIONS", "SCHEMA_VERSION"]


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


# v5: archived tasks (kept with their logs, out of the lists) and each attempt's
# FLEET_PORT (unique among the attempts that run: the store hands it out).
_V5_READY = """
ALTER TABLE tasks ADD COLUMN archived_at REAL;
ALTER TABLE attempts ADD COLUMN port INTEGER
"""

# v6: where each attempt runs, the host seam's record: the host's name and the
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


# landing many branches: copies' group, an update's conflicts, the push, the
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

# v7: the gateway's records. A token per attempt (only its SHA-256 is kept: the
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

# v8: a task's endpoint is its name in config.toml ("default": the top-level
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

# review comments on a task's diff lines (store/reviews.py): the anchor (file,
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

# the host a task runs on (its attempts, resumes and follow-ups stay there); the
# tasks before it ran here. Done again over a store that has it (a version number put
# back by hand), it changes nothing.
def _task_host(conn: sqlite3.Connection) -> None:
    columns = {row[1] for row in conn.execute("PRAGMA table_info(tasks)")}
    if "host" not in columns:
        conn.execute("ALTER TABLE tasks ADD COLUMN host TEXT NOT NULL DEFAULT 'local'")
    conn.execute("CREATE INDEX IF NOT EXISTS tasks_state_host ON tasks(state, host)")


# the attempts a host lost (silent past its lease) until what they started there
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


# the diff's viewed marks (store/reviews.py, ViewedFiles): a file of a task's
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
