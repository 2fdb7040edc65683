"""The store's errors: each with a message meant for the user."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from fleet_tui.core.errors import EXIT_NOT_FOUND, EXIT_USAGE, FleetTuiError

__all__ = ["AmbiguousTaskError", "StoreError", "StoreUnusable", "UnknownTaskError", "unusable"]


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
