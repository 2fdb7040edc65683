"""The engine's front: the one API the panel and the headless CLI use.

`Fleet` keeps tasks, worktrees, processes and their history; its names are the contract.
Each name is the part's that owns the job (`Via`, `Field`): `fleet.merge` *is*
`fleet.branches.merge`, with its signature and its docstring (the promise lives beside the
code that keeps it), so no call is relayed and nothing is written twice. The front's own
methods are those that do more than hand a call on (`tick` ranks a group after the pass):

- `scheduling.Scheduler`: the pass (`tick`) and its loop (`run`), the start threads;
- `actions.Actions`: kill, retry, follow-up, say, discard, archive, each checked first;
- `submit.Submissions`: a new task, validated before anything is stored;
- `queries.Queries`: lists, a task and its attempts, status, an attempt's events;
- `branches.Branches`: diff, conflict preview, merge, update from base, push, compare;
- `merge_queue.MergeQueue`: enqueue, dequeue, pick, the queue runners;
- `review.Review`: comments on diff lines, their states, the review sent to the worker;
  the diff's viewed marks;
- `secret_cache.SecretCache`: the key for the scans (and redaction);
- `reload.SettingsWatch`: config.toml and the repositories' settings read again.

They share one `context.Context` (settings, store, environment, clock, the supervisor and
the follower). Below them: `supervisor.Supervisor` starts runners, signals and reaps them
and tells a claim whose starter is gone; `follower.Follower` reads what running attempts
write, runs the watchdogs and records how each attempt ended; `policy` decides (the model,
backoff, cooldown, giving up, what a task's state allows); `attemptlog.AttemptLog` is the
only reader and writer of an attempt's folder; `outcome` gives every verdict; `store`
keeps what survives a restart.

Everything that survives a restart lives in the store and in each attempt's folder, so any
number of fleet-tui processes can share the work: `tick()` claims queued tasks through the
store (the per-endpoint cap holds across processes), follows every running attempt, and
finishes attempts whose runner is gone, whoever started them. A runner is a detached
process; the engine never holds a pipe to it, so closing the panel loses nothing. Each
attempt has exactly one runner: its folder is recorded and its lock taken before the runner
is spawned, and the runner holds that lock until it is gone.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from fleet_tui.core.errors import FleetError, FleetRefused, InvalidSpec, TaskNotFound
from fleet_tui.core.model import Task, TaskSpec
from fleet_tui.engine.actions import Actions
from fleet_tui.engine.branches import Branches, CopyReport, work_at_stake
from fleet_tui.engine.context import Context
from fleet_tui.engine.follower import Follower, attempt_finished
from fleet_tui.engine.gateway_link import weak_keys
from fleet_tui.engine.merge_queue import MergeQueue
from fleet_tui.engine.queries import EndpointStatus, FleetStatus, Queries
from fleet_tui.engine.ranking import Best
from fleet_tui.engine.reload import SettingsNotice, SettingsWatch
from fleet_tui.engine.review import Review
from fleet_tui.engine.scheduling import Scheduler
from fleet_tui.engine.secret_cache import SecretCache
from fleet_tui.engine.submit import Submissions, check_text
from fleet_tui.engine.supervisor import Supervisor, TaskChange
from fleet_tui.execution.host import Host
from fleet_tui.settings.config import Settings
from fleet_tui.settings.repo_settings import RepoSettingsCache
from fleet_tui.store.db import Store
from fleet_tui.system import paths

__all__ = ["CopyReport", "EndpointStatus", "Fleet", "FleetError", "FleetRefused", "FleetStatus",
           "InvalidSpec", "SettingsNotice", "TaskChange", "TaskNotFound", "TaskSpec", "check_text",
           "work_at_stake"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class Via(Generic[P, R]):
    """A name of the front for a part's method: read on an engine, it is the part's own
    bound method (``fleet.merge`` is ``fleet.branches.merge``): no call in between, the
    signature and the docstring the part's. ``part`` names the engine's attribute."""

    def __init__(self, part: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self.part = part
        self.method = method.__name__
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, engine: None, owner: type) -> Via[P, R]: ...
    @overload
    def __get__(self, engine: object, owner: type) -> Callable[P, R]: ...

    def __get__(self, engine: object, owner: type) -> Via[P, R] | Callable[P, R]:
        if engine is None:
            return self
        bound: Callable[P, R] = getattr(getattr(engine, self.part), self.method)
        return bound


class Field(Generic[T]):
    """A name of the front for a part's attribute (read, and written where the part's
    is): ``fleet.last_error`` is ``fleet.scheduler.last_error``."""

    def __init__(self, part: str, doc: str) -> None:
        self.part = part
        self.__doc__ = doc
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, engine: None, owner: type) -> Field[T]: ...
    @overload
    def __get__(self, engine: object, owner: type) -> T: ...

    def __get__(self, engine: object, owner: type) -> Field[T] | T:
        if engine is None:
            return self
        value: T = getattr(getattr(engine, self.part), self.name)
        return value

    def __set__(self, engine: object, value: T) -> None:
        setattr(getattr(engine, self.part), self.name, value)


class Fleet:
    """The engine. Thread-safe: the panel ticks in one thread and acts from others."""

    def __init__(self, settings: Settings, store: Store | None = None, *,
                 env: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.time,
                 python: str | None = None, rng: random.Random | None = None,
                 host: Host | None = None, hosts: Mapping[str, Host] | None = None) -> None:
        self.env = dict(os.environ if env is None else env)
        self.store = store if store is not None else Store(paths.db_path(self.env))
        self.clock = clock
        self.python = python or sys.executable
        self.rng = rng or random.Random()
        # each repository's .fleet-tui.toml and the user's [repos."<path>"] overrides,
        # read again when they change
        self.repo_settings = RepoSettingsCache(self.env)
        # where attempts run (execution.host): `host` for local (this machine unless
        # told), `hosts` by name for others (else built from config.toml's [hosts.NAME])
        self.supervisor = Supervisor(settings, self.store, env=self.env, clock=clock,
                                     python=self.python, repo_settings=self.repo_settings,
                                     host=host, hosts=hosts)
        self.follower = Follower(settings, self.store, self.supervisor, clock=clock,
                                 rng=self.rng)
        # who claims tasks (see Supervisor.owner)
        self.owner = self.supervisor.owner
        self.ctx = ctx = Context(settings, self.env, self.store, clock, self.python, self.rng,
                                 self.repo_settings, self.supervisor, self.follower)
        self.secrets = SecretCache(ctx)
        # the gateway holds the key the engine resolves; held weakly, so that the
        # supervisor does not keep the engine's parts alive (an engine dropped is gone at
        # once: its claims count as abandoned)
        self.supervisor.gateway.keys = weak_keys(self.secrets.by_endpoint)
        self.queries = Queries(ctx, self.secrets)
        self.actions = Actions(ctx)
        self.submissions = Submissions(ctx)
        self.branches = Branches(ctx, self.secrets, self.actions)
        self.review = Review(ctx, self.actions, self.branches)
        self.queue = MergeQueue(ctx, self.actions, self.branches)
        self.scheduler = Scheduler(ctx, self.secrets, self.actions, self.branches, self.queue)
        self.best = Best(ctx, self.secrets, self.actions, self.branches, self.queue,
                         self.review)
        self.settings_watch = SettingsWatch(ctx)

    # The front's names for its parts' methods and attributes: each reads as the part's own
    # (Via, Field), so a call goes straight to the part that does the job, with its
    # signature and its docstring; the methods below do more than hand a call on.
    settings = Field[Settings]("ctx", "The settings in use (`apply_settings` replaces them "
                               "for every part at once).")
    last_error = Field[str | None]("scheduler", "Why the last pass of `run` failed (None: "
                                   "it did not); the panel shows it.")
    spawn_queue_runners = Field[bool]("queue", "Start merge queue runners (off in a queue "
                                      "runner itself, and in snapshots).")

    # --- settings that change while the panel runs (reload.py) -----------------------------
    watch_settings = Via("settings_watch", SettingsWatch.watch_settings)
    apply_settings = Via("settings_watch", SettingsWatch.apply_settings)
    check_settings = Via("settings_watch", SettingsWatch.check_settings)

    # --- queries (queries.py) ----------------------------------------------------------------
    ingested_events = Field[int]("queries", "Events folded in from events files so far "
                                 "(for the panel and benchmarks).")
    ingested_bytes = Field[int]("queries", "Bytes of events files folded in so far.")
    list_tasks = Via("queries", Queries.list_tasks)
    tasks_on_host = Via("store", Store.tasks_on_host)
    recent_repos = Via("queries", Queries.recent_repos)
    get_task = Via("queries", Queries.get_task)
    attempts = Via("queries", Queries.attempts)
    status = Via("queries", Queries.status)
    costs = Via("queries", Queries.costs)
    endpoint_status = Via("queries", Queries.endpoint_status)
    cooldown_until = Via("queries", Queries.cooldown_until)
    why_waiting = Via("queries", Queries.why_waiting)
    host_waits = Via("queries", Queries.host_waits)
    endpoint_note = Via("queries", Queries.endpoint_note)
    attempt_finished = staticmethod(attempt_finished)
    attempt_log = Via("queries", Queries.attempt_log)
    read_events = Via("queries", Queries.read_events)
    follow_events = Via("queries", Queries.follow_events)

    # --- submit (submit.py) and the scheduling pass (scheduling.py) ------------------------
    submit = Via("submissions", Submissions.submit)
    run = Via("scheduler", Scheduler.run)

    def tick(self) -> list[TaskChange]:
        """One scheduling pass (Scheduler.tick); then the groups whose last copy ended in
        it are ranked (best of N)."""
        changes = self.scheduler.tick()
        self.best.after_pass(changes)
        return changes

    # --- user actions (actions.py) -----------------------------------------------------------
    kill = Via("actions", Actions.kill)
    retry = Via("actions", Actions.retry)
    follow_up = Via("actions", Actions.follow_up)
    say = Via("actions", Actions.say)
    discard = Via("actions", Actions.discard)
    archive = Via("actions", Actions.archive)
    unarchive = Via("actions", Actions.unarchive)
    archive_closed = Via("actions", Actions.archive_closed)

    # --- review comments (review.py) --------------------------------------------------------
    add_comment = Via("review", Review.comment)
    comment_at = Via("review", Review.comment_at)
    edit_comment = Via("review", Review.edit_comment)
    delete_comment = Via("review", Review.delete_comment)
    comments = Via("review", Review.comments)
    open_comments = Via("review", Review.open_comments)
    viewed_files = Via("review", Review.viewed_files)
    mark_viewed = Via("review", Review.mark_viewed)
    send_review = Via("review", Review.send_review)

    # --- the key for the scans (secret_cache.py) ---------------------------------------------

    def prepare_secret_scan(self) -> None:
        """Look the key up now (e.g. in the thread that builds the engine), so the first
        diff or merge preview need not wait for a keyring lookup. (The key is not
        returned: the front never hands it out.)"""
        self.secrets.get()

    # --- a task's branch: diff, merge, update, push, copies (branches.py) ------------------
    work_at_stake = Via("branches", Branches.work_at_stake)
    worktree_here = Via("actions", Actions.worktree_here)

    @staticmethod
    def elsewhere(task: Task) -> str:
        """Why a shell or an editor does not open in the task's worktree: it is on its
        host (worktree_here said None)."""
        return (f"the worktree of task {task.id} is on host {task.host} "
                f"({task.worktree}), not on this machine: open it there (ssh to the host), "
                "or let its worker do it")

    diff = Via("branches", Branches.diff)
    diff_stat = Via("branches", Branches.diff_stat)
    conflict_preview = Via("branches", Branches.conflict_preview)
    test_command_for = Via("branches", Branches.test_command_for)
    merge = Via("branches", Branches.merge)
    found_landed = Via("branches", Branches.found_landed)
    update = Via("branches", Branches.update)
    update_prompt = Via("branches", Branches.update_prompt)
    resolve_update = Via("branches", Branches.resolve_update)
    push = Via("branches", Branches.push)
    copies = Via("branches", Branches.copies)
    compare = Via("branches", Branches.compare)

    # --- best of N (ranking.py) -----------------------------------------------------------------
    rank = Via("best", Best.ranking)
    rankings = Via("best", Best.rankings)
    pick_best = Via("best", Best.pick_best)
    best_picks_since = Via("best", Best.picks_since)

    # --- the merge queue (merge_queue.py) ----------------------------------------------------
    pick = Via("queue", MergeQueue.pick)
    enqueue = Via("queue", MergeQueue.enqueue)
    dequeue = Via("queue", MergeQueue.dequeue)
    landing_queue = Via("queue", MergeQueue.landing_queue)
    queue_running = Via("queue", MergeQueue.queue_running)
    ensure_queue_runner = Via("queue", MergeQueue.ensure_queue_runner)
    resume_queues = Via("queue", MergeQueue.resume_queues)
