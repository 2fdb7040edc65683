"""What the engine's parts share, and the base they are built on.

`Fleet` (fleet.py) is the front; behind it each part owns one job: `scheduling.Scheduler`
(the pass), `actions.Actions` (what the user does to a task), `submit.Submissions` (a new
task, validated), `queries.Queries` (lists, status, events), `branches.Branches` (the git
side: diff, merge, update, push, copies), `merge_queue.MergeQueue` (who is in the queue, its
runners), `secret_cache.SecretCache` (the key, for the scans) and `reload.SettingsWatch`
(settings read again). They share one `Context`: the settings (replaced whole when
config.toml changes, so every part sees the new ones at once), the store, the environment,
the clock, the supervisor and the follower, and the lock by which a scheduling pass and the
end of a kill take turns. A `Part` reads them through properties, so a method moved from
the front reads as it did there (`self.store`, `self.settings`).
"""

from __future__ import annotations

import functools
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

from fleet_tui.core import redaction
from fleet_tui.core.errors import FleetTuiError, TaskNotFound
from fleet_tui.core.model import Task
from fleet_tui.engine.follower import Follower
from fleet_tui.engine.supervisor import Supervisor
from fleet_tui.settings.config import Settings
from fleet_tui.settings.repo_settings import RepoSettingsCache
from fleet_tui.store.db import AmbiguousTaskError, Store, StoreError

__all__ = ["Context", "Part", "hides_key", "log"]

# the parts log as the front always did (operators and tests filter on this name)
log = logging.getLogger("fleet_tui.engine.fleet")


@dataclass
class Context:
    """The state every part of one engine shares (one object, held by reference)."""

    settings: Settings
    env: dict[str, str]
    store: Store
    clock: Callable[[], float]
    python: str
    rng: random.Random
    repo_settings: RepoSettingsCache
    supervisor: Supervisor
    follower: Follower
    # the panel ticks in one thread and acts from others: a pass and a kill's end take turns
    lock: threading.RLock = field(default_factory=threading.RLock)


class Part:
    """One part of the engine: its jobs' methods over the shared `Context`."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    @property
    def settings(self) -> Settings:
        return self.ctx.settings

    @property
    def env(self) -> dict[str, str]:
        return self.ctx.env

    @property
    def store(self) -> Store:
        return self.ctx.store

    @property
    def clock(self) -> Callable[[], float]:
        return self.ctx.clock

    @property
    def repo_settings(self) -> RepoSettingsCache:
        return self.ctx.repo_settings

    @property
    def supervisor(self) -> Supervisor:
        return self.ctx.supervisor

    @property
    def follower(self) -> Follower:
        return self.ctx.follower

    @property
    def owner(self) -> str:
        """Who claims tasks (see Supervisor.owner)."""
        return self.ctx.supervisor.owner

    def get_task(self, task_id: str) -> Task:
        """The task with this id or unique prefix (TaskNotFound: none, or ambiguous)."""
        try:
            return self.store.get_task(task_id)
        except StoreError as exc:
            raise TaskNotFound(str(exc),
                               ambiguous=isinstance(exc, AmbiguousTaskError)) from None


_P = ParamSpec("_P")
_R = TypeVar("_R")


def hides_key(action: Callable[_P, _R]) -> Callable[_P, _R]:
    """An action whose error may quote git or a worker (a file's name, git's own words):
    the key the engine knows is hidden in the message it raises (redaction)."""
    @functools.wraps(action)
    def hiding(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return action(*args, **kwargs)
        except FleetTuiError as exc:
            hidden = redaction.redact(exc.message)
            if hidden != exc.message:
                exc.args = (hidden, *exc.args[1:])
            raise
    return hiding
