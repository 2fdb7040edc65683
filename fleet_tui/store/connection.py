"""The task database's connections and transactions, the base every part of the Store
builds on.

Two panels and the CLI may use one database at once. So: WAL mode (readers never block the
writer), a long busy timeout, one connection per thread, and every read-modify-write inside
``BEGIN IMMEDIATE`` (the write lock is taken up front, so two writers queue instead of one of
them failing with "database is locked" on upgrade).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Self

from fleet_tui.store.errors import StoreError, unusable
from fleet_tui.store.schema import MIGRATIONS, SCHEMA_VERSION
from fleet_tui.system import paths

__all__ = ["Database"]


class Database:
    """The task database's file, its connections (one per thread, opened again after a fork)
    and its write transactions. Safe to share between threads and processes."""

    BUSY_TIMEOUT_MS = 60_000
    # Seconds between two looks of a thread's connection at the file at the database's path
    # (a stat is ~15 µs here: one at every read was 5 % of a loop of list_tasks and get_task)
    LOOK_EVERY = 0.25

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

    def _file_id(self) -> tuple[int, int] | None:
        """The database file's (device, inode) now; None while nothing is at its path."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _connect(self) -> sqlite3.Connection:
        local = self._local
        conn: sqlite3.Connection | None = getattr(local, "conn", None)
        if conn is not None and local.pid == os.getpid():
            now = time.monotonic()
            if now < local.looked + self.LOOK_EVERY or conn.in_transaction:
                return conn
            local.looked = now
            there = self._file_id()
            if there is None or there == local.file:
                return conn
            # Another file is at the path now (a backup restored, a copy moved over it):
            # this connection reads the one that was there, unlinked, for ever. Open the
            # one that is there, as a new process would.
            self._forget(conn)
        # No connection yet in this thread, or we are a forked child: a SQLite connection
        # must not cross fork(), so open a fresh one.
        while True:
            before = self._file_id()
            conn = self._open()
            if self._file_id() == before:  # not replaced while it was opened
                break
            self._forget(conn)
        local = self._local
        local.conn = conn
        local.pid = os.getpid()
        local.file = before
        local.looked = time.monotonic()
        with self._all_lock:
            self._all.append(conn)
        return conn

    def _open(self) -> sqlite3.Connection:
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
        return conn

    def _forget(self, conn: sqlite3.Connection) -> None:
        """Close one of this Store's connections (this thread's) and drop it."""
        with self._all_lock:
            if conn in self._all:
                self._all.remove(conn)
        with contextlib.suppress(sqlite3.Error):
            conn.close()
        self._local.conn = None

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

    def __enter__(self) -> Self:
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

    def schema_version(self) -> int:
        return int(self._connect().execute("PRAGMA user_version").fetchone()[0])

    def journal_mode(self) -> str:
        return str(self._connect().execute("PRAGMA journal_mode").fetchone()[0])
