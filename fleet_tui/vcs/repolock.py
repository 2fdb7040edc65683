"""One lock per repository that every fleet-tui process honours.

Merges, discards and worktree creation change a repository's refs, its main checkout and its
worktree list. Two of them at once (two `fleet-tui merge` commands, a merge from the panel
while another engine starts workers) corrupted the main checkout: one `git merge` failed on
the HEAD the other had moved and its rollback staged the removal of the other task's files.
So they take turns: `hold(path, what)` takes an exclusive `flock(2)` on a lock file (git.py
puts it in the repository's common git dir), shared by every process and thread.

- Re-entrant within a thread (a merge removes the task's worktree under the same lock);
  threads of one process queue on a per-file mutex, processes on the flock.
- The kernel drops a flock when its process dies, so a crashed holder never blocks anyone.
- Fair between processes: a waiter first takes a turnstile (a second flock, on the lock
  file's name + ".turn") and holds it while it waits for the lock, so a holder that
  releases the lock and asks for it again queues behind the waiter instead of taking it
  back at once (which starved a waiter for as long as the holder looped).
- While held, the file names the holder (pid and what it does), so a waiter that gives up
  after `timeout` seconds can say who it waited for.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from fleet_tui.core.errors import FleetTuiError

__all__ = ["LockTimeout", "hold"]

POLL = 0.01  # first wait between two tries of a busy lock; doubles up to POLL_MAX
POLL_MAX = 0.05
TURNSTILE = ".turn"  # beside the lock file: waiters queue on it (see _take_file)


class LockTimeout(FleetTuiError):
    """The lock stayed busy for longer than the caller would wait; the message says who
    holds it (when known) and what to do."""


class _Entry:
    __slots__ = ("depth", "fd", "mutex", "owner")

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.owner: int | None = None  # thread ident holding it
        self.depth = 0
        self.fd: int | None = None


_TABLE: dict[str, _Entry] = {}
_TABLE_LOCK = threading.Lock()


def _entry(key: str) -> _Entry:
    with _TABLE_LOCK:
        return _TABLE.setdefault(key, _Entry())


def _holder(fd: int | None, path: str) -> str:
    """What the lock file says about its holder ('pid 123 merging fleet/x for 4 s')."""
    try:
        if fd is not None:
            raw = os.pread(fd, 512, 0)
        else:
            with open(path, "rb") as fh:
                raw = fh.read(512)
    except OSError:
        return ""
    parts = raw.decode("utf-8", "replace").strip().split(" ", 2)
    if len(parts) < 3 or not parts[0].isdigit():
        return ""
    pid, since, what = parts
    try:
        age = f" for {max(0.0, time.time() - float(since)):.0f} s"
    except ValueError:
        age = ""
    return f"pid {pid} {what}{age}"


def _busy_message(path: str, what: str, waited: float, holder: str) -> str:
    who = f"another fleet-tui process ({holder})" if holder else "another fleet-tui process"
    return (f"{what} waited {waited:.0f} s for {who}, which holds the repository lock "
            f"{path}; wait for it to finish (or stop it), then try again")


def _open(path: str) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise LockTimeout(f"cannot open the repository lock {path}: "
                          f"{exc.strerror or exc}") from None


def _flock(fd: int, path: str, what: str, deadline: float, started: float) -> None:
    """Take the flock on ``fd`` by polling (a blocking flock could not give up at the
    deadline); LockTimeout naming the lock's holder once the deadline has passed."""
    delay = POLL
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        now = time.monotonic()
        if now >= deadline:
            raise LockTimeout(_busy_message(path, what, now - started, _holder(None, path)))
        time.sleep(min(delay, max(0.0, deadline - now)))
        delay = min(delay * 2, POLL_MAX)


def _take_file(path: str, what: str, deadline: float, started: float) -> int:
    """The flock on ``path``, taken through its turnstile ``path + TURNSTILE``: a process
    first takes the turnstile, then waits for the lock holding it, and lets it go once the
    lock is its own. A holder that releases the lock and asks again at once must take the
    turnstile too, which the waiter holds, so the waiter gets the lock next (without it, the
    holder took the lock back within microseconds, before a polling waiter looked again).
    Both are flocks: a process that dies holding either releases it."""
    turn = _open(path + TURNSTILE)
    try:
        _flock(turn, path, what, deadline, started)
        fd = _open(path)
        try:
            _flock(fd, path, what, deadline, started)
            note = f"{os.getpid()} {time.time():.3f} {' '.join(what.split())}\n".encode()
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, note, 0)
            return fd
        except BaseException:
            os.close(fd)
            raise
    finally:
        os.close(turn)  # the next waiter may queue for the lock now


@contextlib.contextmanager
def hold(path: Path | str, what: str, timeout: float = 120.0) -> Iterator[None]:
    """Hold the lock at ``path`` (created if missing) for the block.

    ``what`` says what the holder does ("merging fleet/abc"); it is shown to a waiter that
    gives up. Raises LockTimeout after ``timeout`` seconds of waiting.
    """
    key = os.path.abspath(path)
    entry = _entry(key)
    me = threading.get_ident()
    if entry.owner == me:  # re-entered by the thread that holds it
        entry.depth += 1
        try:
            yield
        finally:
            entry.depth -= 1
        return
    started = time.monotonic()
    deadline = started + max(0.0, timeout)
    if not entry.mutex.acquire(timeout=max(0.0, timeout)):
        waited = time.monotonic() - started
        raise LockTimeout(_busy_message(key, what, waited, _holder(None, key)))
    try:
        entry.fd = _take_file(key, what, deadline, started)
        entry.owner = me
        entry.depth = 1
        try:
            yield
        finally:
            entry.owner = None
            entry.depth = 0
            fd, entry.fd = entry.fd, None
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
                os.close(fd)  # closing the only descriptor drops the flock
    finally:
        entry.mutex.release()
