"""Request slots: at most `size` requests of an endpoint in flight, the rest wait in order,
fair across tasks.

A task that sends many requests at once (sub-agents) does not starve the others: a freed
slot goes to the task that has waited longest for its turn (round robin over the tasks
with a waiter, each task's own waiters first come first served). One line per endpoint,
on the gateway's event loop (not thread-safe: asyncio only)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

__all__ = ["Slots"]


class Slots:
    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self.in_flight = 0
        # task -> its waiters, oldest first; the dict's order is the tasks' turn
        self._line: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._line.values())

    def waiting_by_task(self) -> dict[str, int]:
        return {task: len(q) for task, q in self._line.items() if q}

    @asynccontextmanager
    async def take(self, task: str) -> AsyncIterator[None]:
        """Hold a slot for the body of the `async with` (waiting for one in line)."""
        await self.acquire(task)
        try:
            yield
        finally:
            self.release()

    async def acquire(self, task: str) -> None:
        """Wait in line for a slot and take it; the caller gives it back with `release`
        (once, whatever happens: the answer that holds it may outlive the request that
        asked for it, as a stream cut downstream is drained upstream to its end)."""
        if self.in_flight < self.size and not self._line:
            self.in_flight += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._line.setdefault(task, deque()).append(fut)
        try:
            await fut  # the slot is ours once it resolves (in_flight counted for us)
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # given to us as we were cancelled: pass it on
            else:
                self._drop(task, fut)
            raise

    def _drop(self, task: str, fut: asyncio.Future[None]) -> None:
        queue = self._line.get(task)
        if queue is not None:
            with suppress(ValueError):
                queue.remove(fut)
            if not queue:
                del self._line[task]

    def release(self) -> None:
        self.in_flight -= 1
        while self._line and self.in_flight < self.size:
            task, queue = next(iter(self._line.items()))
            fut = queue.popleft()
            if queue:
                self._line.move_to_end(task)  # its next request waits for the others' turn
            else:
                del self._line[task]
            if not fut.done():
                self.in_flight += 1
                fut.set_result(None)

    def resize(self, size: int) -> None:
        self.size = max(1, size)
        self.in_flight += 1  # release gives out what the new size allows
        self.release()
