"""The gateway's listener against abuse from its own machine: any local process may connect
to 127.0.0.1, a worker's Bash step too, with no token at all.

- `Guard` wraps each connection's protocol (aiohttp's request handler) and keeps the ones
  that have not yet shown a valid token ("unproven") in order of arrival: one that has not
  shown a token `HEADER_TIMEOUT` seconds after it connected is closed (slow or partial
  headers, a trickled body before the token), and at most `UNPROVEN_CAP` of them are kept:
  the oldest is closed to make room for a new one. A connection is proven by a request
  whose token the store knows as valid (`prove`): from then on only the idle timeout of
  the HTTP server closes it. So a flood of connections costs the gateway at most the cap
  in descriptors, and a worker's new connection, which sends its headers at once, always
  finds room (the flood's are older).
- `raise_fd_limit`: the soft limit of open files up to the hard one (room for the cap, the
  workers and their answers upstream).
- `CappedLog`: the gateway's log, whatever floods it: at most `LOG_RATE` lines a second
  (a burst of `LOG_BURST`), the lines dropped counted and said once the flood is over; the
  file rotated at `LOG_MAX` bytes (one old file kept, `gateway.log.1`), so the log never
  weighs more than twice that. The log file is the process's stderr (the spawner opened
  it), and a rotation points stderr at the new file, so that what Python or a library
  writes there follows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import time
from pathlib import Path
from typing import Any

__all__ = ["HEADER_TIMEOUT", "IDLE_TIMEOUT", "LOG_BURST", "LOG_MAX", "LOG_RATE",
           "UNPROVEN_CAP", "CappedLog", "Guard", "raise_fd_limit"]

HEADER_TIMEOUT = 10.0  # seconds a connection has to show a valid token in a request's head
BODY_TIMEOUT = 120.0  # seconds a request's body may take once its head was read
IDLE_TIMEOUT = 60.0  # seconds a kept-alive connection may stay idle (aiohttp's keepalive)
UNPROVEN_CAP = 2048  # connections kept at once that have shown no valid token
SWEEP_EVERY = 1.0
LOG_RATE = 20.0  # log lines a second, on average
LOG_BURST = 200
LOG_MAX = 1 << 20  # bytes of gateway.log before it is rotated


def raise_fd_limit() -> int:
    """The soft RLIMIT_NOFILE raised to the hard one; the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
    return int(soft)


class _Guarded(asyncio.Protocol):
    """A connection's protocol, passed through to aiohttp's handler, seen by the guard."""

    def __init__(self, inner: Any, guard: Guard) -> None:
        self.inner = inner
        self.guard = guard
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.guard._admit(transport)
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.guard._forget(self.transport)
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()  # type: ignore[no-any-return]

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class Guard:
    """The connections of one listener: the unproven ones in order of arrival, closed past
    `header_timeout` or beyond `cap`; counters for the status."""

    def __init__(self, *, cap: int = UNPROVEN_CAP, header_timeout: float = HEADER_TIMEOUT
                 ) -> None:
        self.cap = max(1, cap)
        self.header_timeout = header_timeout
        self._unproven: dict[asyncio.Transport, float] = {}  # in order of arrival
        self._proven: set[asyncio.Transport] = set()
        self.closed_slow = 0  # closed: no valid token within header_timeout
        self.closed_over = 0  # closed: beyond the cap (the oldest unproven one)
        self.accepted = 0

    def factory(self, inner: Any) -> Any:
        """A protocol factory for loop.create_server: `inner()` wrapped."""
        return lambda: _Guarded(inner(), self)

    @property
    def unproven(self) -> int:
        return len(self._unproven)

    @property
    def proven(self) -> int:
        return len(self._proven)

    def prove(self, transport: asyncio.BaseTransport | None) -> None:
        """The connection sent a valid token: no longer counted against the cap."""
        if isinstance(transport, asyncio.Transport) \
                and self._unproven.pop(transport, None) is not None:
            self._proven.add(transport)

    def _admit(self, transport: asyncio.Transport) -> None:
        self.accepted += 1
        self._unproven[transport] = time.monotonic()
        while len(self._unproven) > self.cap:
            oldest = next(iter(self._unproven))
            del self._unproven[oldest]
            self.closed_over += 1
            oldest.abort()  # its connection_lost comes later: _forget finds nothing

    def _forget(self, transport: asyncio.Transport) -> None:
        self._unproven.pop(transport, None)
        self._proven.discard(transport)

    def sweep(self, now: float | None = None) -> int:
        """Close the unproven connections older than the header timeout; how many."""
        limit = (time.monotonic() if now is None else now) - self.header_timeout
        old = []
        for transport, since in self._unproven.items():
            if since > limit:
                break  # in order of arrival: the rest are younger
            old.append(transport)
        for transport in old:
            del self._unproven[transport]
            transport.abort()
        self.closed_slow += len(old)
        return len(old)

    async def keep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY)
            self.sweep()

    def status(self) -> dict[str, int]:
        return {"unproven": self.unproven, "proven": self.proven, "accepted": self.accepted,
                "closed_slow": self.closed_slow, "closed_over_cap": self.closed_over}


class CappedLog(logging.Handler):
    """A handler writing to stderr (the log file), rate-limited and rotated by size."""

    def __init__(self, path: Path, *, rate: float = LOG_RATE, burst: int = LOG_BURST,
                 max_bytes: int = LOG_MAX, fd: int = 2) -> None:
        super().__init__()
        self.path = path
        self.rate = rate
        self.burst = float(burst)
        self.max_bytes = max_bytes
        self.fd = fd
        self._tokens = float(burst)
        self._at = time.monotonic()
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            if self._tokens < 1.0:
                self.dropped += 1
                return
            self._tokens -= 1.0
            line = self.format(record)
            if self.dropped:
                line = (f"({self.dropped} log lines dropped: more than {self.rate:g} a "
                        f"second)\n{line}")
                self.dropped = 0
            self._write((line + "\n").encode("utf-8", "replace"))
        except Exception:  # a log that cannot be written never stops the gateway
            self.handleError(record)

    def _write(self, data: bytes) -> None:
        try:
            mine = os.fstat(self.fd)
            size = mine.st_size
            ours = (mine.st_dev, mine.st_ino) == (lambda s: (s.st_dev, s.st_ino))(
                os.stat(self.path))
        except OSError:
            size, ours = 0, False
        # rotated only when stderr is the log file (not a terminal, not a test's pipe)
        if ours and size + len(data) > self.max_bytes:
            self._rotate()
        os.write(self.fd, data)

    def _rotate(self) -> None:
        """gateway.log -> gateway.log.1 (the one before dropped), a new gateway.log on the
        same descriptor number (stderr follows)."""
        with contextlib.suppress(OSError):
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        try:
            new = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError:
            return
        try:
            os.dup2(new, self.fd)
        finally:
            os.close(new)
