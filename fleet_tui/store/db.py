"""SQLite store of tasks and attempts, shared by every fleet-tui process.

Two panels and the CLI may use one database at once. So: WAL mode (readers never block the
writer), a long busy timeout, one connection per thread, and every read-modify-write inside
``BEGIN IMMEDIATE`` (the write lock is taken up front, so two writers queue instead of one of
them failing with "database is locked" on upgrade). Conditional updates
(``update_task(..., expect_state=...)``) and ``claim_next`` are how two engines avoid starting
the same task or exceeding the per-endpoint concurrency cap.

The Store persists the domain model (core/model.py: Task, Attempt, EndpointState); it is
composed of one part per concern, each a module of this folder: the connections and
transactions (connection.py), the schema's migrations (schema.py), rows to and from the
model (rows.py), the tasks, attempts and endpoints tables (tasks.py, attempts.py,
endpoints.py), the merge queue's order (merge_queue.py) and the claims (claims.py).

The store never holds a credential: nothing here has a field for one.
"""

from __future__ import annotations

from fleet_tui.core.model import MAX_COPIES, Attempt, EndpointState, Task, TaskSpec, new_task_id
from fleet_tui.core.states import (
    ACTIVE_STATES,
    CLOSED_STATES,
    FINISHED_STATES,
    TaskState,
)
from fleet_tui.store.attempts import AttemptRows
from fleet_tui.store.claims import Claims
from fleet_tui.store.endpoints import EndpointRows
from fleet_tui.store.errors import (
    AmbiguousTaskError,
    StoreError,
    StoreUnusable,
    UnknownTaskError,
    unusable,
)
from fleet_tui.store.merge_queue import MergeQueue
from fleet_tui.store.rows import ATTEMPT_COLUMNS, TASK_COLUMNS, to_db
from fleet_tui.store.schema import MIGRATIONS, SCHEMA_VERSION
from fleet_tui.store.tasks import TaskRows

# The model (core/model.py) and the states (core/states.py) are re-exported here for the
# tests and scripts that have always imported them from the store; the package's own code
# imports them from core.
__all__ = [
    "ACTIVE_STATES",
    "ATTEMPT_COLUMNS",
    "CLOSED_STATES",
    "FINISHED_STATES",
    "MAX_COPIES",
    "MIGRATIONS",
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


class Store(Claims, MergeQueue, TaskRows, AttemptRows, EndpointRows):
    """The task database. Safe to share between threads and processes."""
