"""The engine's front: the one API the panel and the headless CLI use.

`Fleet` keeps tasks, worktrees, processes and their history; its methods are the contract.
Each one hands the call to the part that owns the job, and says what that part's method
says (its docstring is the part's: the promise lives beside the code that keeps it):

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
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from fleet_tui.core import stream
from fleet_tui.core.errors import FleetError, FleetRefused, InvalidSpec, TaskNotFound
from fleet_tui.core.ranking import Ranked
from fleet_tui.core.review import Anchor
from fleet_tui.engine.actions import Actions
from fleet_tui.engine.branches import Branches, CopyReport, work_at_stake
from fleet_tui.engine.context import Context
from fleet_tui.engine.follower import Follower, attempt_finished
from fleet_tui.engine.gateway_link import weak_keys
from fleet_tui.engine.merge_queue import MergeQueue
from fleet_tui.engine.queries import EndpointStatus, FleetStatus, Queries
from fleet_tui.engine.ranking import Best
from fleet_tui.engine.reload import SettingsNotice, SettingsWatch
from fleet_tui.engine.review import Review, ReviewSent
from fleet_tui.engine.scheduling import Scheduler
from fleet_tui.engine.secret_cache import SecretCache
from fleet_tui.engine.submit import Submissions, check_text
from fleet_tui.engine.supervisor import Supervisor, TaskChange
from fleet_tui.execution.attemptlog import AttemptLog
from fleet_tui.execution.host import Host
from fleet_tui.settings.config import Settings
from fleet_tui.settings.repo_settings import RepoSettingsCache
from fleet_tui.store.db import Attempt, Store, Task, TaskSpec
from fleet_tui.store.evidence import BestPick
from fleet_tui.store.meter import Totals
from fleet_tui.store.reviews import ReviewComment
from fleet_tui.system import paths
from fleet_tui.vcs import git

__all__ = ["CopyReport", "EndpointStatus", "Fleet", "FleetError", "FleetRefused", "FleetStatus",
           "InvalidSpec", "SettingsNotice", "TaskChange", "TaskNotFound", "TaskSpec", "check_text",
           "work_at_stake"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _says(part_method: Callable[..., Any]) -> Callable[[_F], _F]:
    """The front's method promises what the part's method does: the same docstring."""
    def same(method: _F) -> _F:
        method.__doc__ = part_method.__doc__
        return method
    return same


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
        # the gateway holds the key the engine resolves (issue 19); held weakly, so that the
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

    @property
    def settings(self) -> Settings:
        """The settings in use (`apply_settings` replaces them for every part at once)."""
        return self.ctx.settings

    @property
    def last_error(self) -> str | None:
        """Why the last pass of `run` failed (None: it did not); the panel shows it."""
        return self.scheduler.last_error

    @property
    def spawn_queue_runners(self) -> bool:
        """Start merge queue runners (off in a queue runner itself, and in snapshots)."""
        return self.queue.spawn_queue_runners

    @spawn_queue_runners.setter
    def spawn_queue_runners(self, value: bool) -> None:
        self.queue.spawn_queue_runners = value

    # --- settings that change while the panel runs (reload.py) -----------------------------

    @_says(SettingsWatch.watch_settings)
    def watch_settings(self, config_file: str | os.PathLike[str] | None = None,
                       loader: Callable[[], Settings] | None = None) -> None:
        self.settings_watch.watch_settings(config_file, loader)

    @_says(SettingsWatch.apply_settings)
    def apply_settings(self, settings: Settings) -> None:
        self.settings_watch.apply_settings(settings)

    @_says(SettingsWatch.check_settings)
    def check_settings(self, repos: Iterable[Path] = ()) -> list[SettingsNotice]:
        return self.settings_watch.check_settings(repos)

    # --- queries (queries.py) ----------------------------------------------------------------

    @property
    def ingested_events(self) -> int:
        """Events folded in from events files so far (for the panel and benchmarks)."""
        return self.queries.ingested_events

    @property
    def ingested_bytes(self) -> int:
        """Bytes of events files folded in so far."""
        return self.queries.ingested_bytes

    @_says(Queries.list_tasks)
    def list_tasks(self, repo: Path | None = None, *, archived: bool | None = False
                   ) -> list[Task]:
        return self.queries.list_tasks(repo, archived=archived)

    @_says(Queries.tasks_on_host)
    def tasks_on_host(self, host: str) -> list[Task]:
        return self.queries.tasks_on_host(host)

    @_says(Queries.recent_repos)
    def recent_repos(self, limit: int = 10) -> list[Path]:
        return self.queries.recent_repos(limit)

    def get_task(self, task_id: str) -> Task:
        """The task with this id or unique prefix (TaskNotFound: none, or ambiguous)."""
        return self.queries.get_task(task_id)

    @_says(Queries.attempts)
    def attempts(self, task_id: str) -> list[Attempt]:
        return self.queries.attempts(task_id)

    @_says(Queries.status)
    def status(self, tasks: list[Task] | None = None) -> FleetStatus:
        return self.queries.status(tasks)

    @_says(Queries.costs)
    def costs(self, task_ids: list[str]) -> dict[str, Totals]:
        return self.queries.costs(task_ids)

    @_says(Queries.endpoint_status)
    def endpoint_status(self, now: float | None = None) -> list[EndpointStatus]:
        return self.queries.endpoint_status(now)

    @_says(Queries.cooldown_until)
    def cooldown_until(self, endpoint: str | None = None) -> float | None:
        return self.queries.cooldown_until(endpoint)

    @_says(Queries.why_waiting)
    def why_waiting(self, endpoint: str | None = None) -> str | None:
        return self.queries.why_waiting(endpoint)

    @_says(Queries.host_waits)
    def host_waits(self, tasks: list[Task] | None = None) -> dict[str, str]:
        return self.queries.host_waits(tasks)

    @_says(Queries.endpoint_note)
    def endpoint_note(self, endpoint: str | None = None) -> str | None:
        return self.queries.endpoint_note(endpoint)

    @staticmethod
    @_says(Queries.attempt_finished)
    def attempt_finished(attempt: Attempt) -> bool:
        return attempt_finished(attempt)

    @_says(Queries.attempt_log)
    def attempt_log(self, attempt: Attempt) -> AttemptLog | None:
        return self.queries.attempt_log(attempt)

    @_says(Queries.read_events)
    def read_events(self, attempt: Attempt, offset: int = 0, max_bytes: int | None = None
                    ) -> tuple[list[stream.Event], int]:
        return self.queries.read_events(attempt, offset, max_bytes)

    @_says(Queries.follow_events)
    def follow_events(self, attempt: Attempt, offset: int = 0, *,
                      poll: float = 0.2) -> AsyncIterator[stream.Event]:
        return self.queries.follow_events(attempt, offset, poll=poll)

    # --- submit (submit.py) and the scheduling pass (scheduling.py) ------------------------

    @_says(Submissions.submit)
    def submit(self, spec: TaskSpec, copies: int = 1) -> list[Task]:
        return self.submissions.submit(spec, copies)

    @_says(Scheduler.tick)
    def tick(self) -> list[TaskChange]:
        changes = self.scheduler.tick()
        self.best.after_pass(changes)  # a group's last copy ended: rank its copies
        return changes

    @_says(Scheduler.run)
    def run(self, stop: threading.Event, interval: float = 0.25) -> None:
        self.scheduler.run(stop, interval)

    # --- user actions (actions.py) -----------------------------------------------------------

    @_says(Actions.kill)
    def kill(self, task_id: str) -> None:
        self.actions.kill(task_id)

    @_says(Actions.retry)
    def retry(self, task_id: str, *, resume: bool = False) -> Task:
        return self.actions.retry(task_id, resume=resume)

    @_says(Actions.follow_up)
    def follow_up(self, task_id: str, prompt: str) -> Task:
        return self.actions.follow_up(task_id, prompt)

    @_says(Actions.say)
    def say(self, task_id: str, text: str, *, wait: float = 3.0) -> bool:
        return self.actions.say(task_id, text, wait=wait)

    @_says(Actions.discard)
    def discard(self, task_id: str) -> str:
        return self.actions.discard(task_id)

    @_says(Actions.archive)
    def archive(self, task_ids: list[str]) -> list[str]:
        return self.actions.archive(task_ids)

    def unarchive(self, task_ids: list[str]) -> list[str]:
        """Put archived tasks back in the lists; the ids done."""
        return self.actions.unarchive(task_ids)

    @_says(Actions.archive_closed)
    def archive_closed(self, older_than_days: float, repo: Path | None = None) -> list[str]:
        return self.actions.archive_closed(older_than_days, repo)

    # --- review comments (review.py) --------------------------------------------------------

    @_says(Review.comment)
    def add_comment(self, task_id: str, anchor: Anchor, body: str) -> ReviewComment:
        return self.review.comment(task_id, anchor, body)

    @_says(Review.comment_at)
    def comment_at(self, task_id: str, path: str, start: int, end: int,
                   body: str) -> ReviewComment:
        return self.review.comment_at(task_id, path, start, end, body)

    @_says(Review.edit_comment)
    def edit_comment(self, task_id: str, comment_id: int, body: str) -> ReviewComment:
        return self.review.edit_comment(task_id, comment_id, body)

    @_says(Review.delete_comment)
    def delete_comment(self, task_id: str, comment_id: int) -> None:
        self.review.delete_comment(task_id, comment_id)

    @_says(Review.comments)
    def comments(self, task_id: str, diff: git.Diff | None = None) -> list[ReviewComment]:
        return self.review.comments(task_id, diff)

    @_says(Review.open_comments)
    def open_comments(self, task_id: str) -> int:
        return self.review.open_comments(task_id)

    @_says(Review.viewed_files)
    def viewed_files(self, task_id: str) -> dict[str, str]:
        return self.review.viewed_files(task_id)

    @_says(Review.mark_viewed)
    def mark_viewed(self, task_id: str, path: str, digest: str | None) -> None:
        self.review.mark_viewed(task_id, path, digest)

    @_says(Review.send_review)
    def send_review(self, task_id: str, *, wait: float = 3.0) -> ReviewSent:
        return self.review.send_review(task_id, wait=wait)

    # --- the key for the scans (secret_cache.py) ---------------------------------------------

    def prepare_secret_scan(self) -> None:
        """Look the key up now (e.g. in the thread that builds the engine), so the first
        diff or merge preview need not wait for a keyring lookup."""
        self.secrets.get()

    # --- a task's branch: diff, merge, update, push, copies (branches.py) ------------------

    @_says(Branches.work_at_stake)
    def work_at_stake(self, task: Task) -> str | None:
        return self.branches.work_at_stake(task)

    @_says(Actions.worktree_here)
    def worktree_here(self, task: Task) -> Path | None:
        return self.actions.worktree_here(task)

    @staticmethod
    def elsewhere(task: Task) -> str:
        """Why a shell or an editor does not open in the task's worktree: it is on its
        host (worktree_here said None)."""
        return (f"the worktree of task {task.id} is on host {task.host} "
                f"({task.worktree}), not on this machine: open it there (ssh to the host), "
                "or let its worker do it")

    @_says(Branches.diff)
    def diff(self, task_id: str) -> git.Diff:
        return self.branches.diff(task_id)

    @_says(Branches.diff_stat)
    def diff_stat(self, task: Task) -> tuple[int, int]:
        return self.branches.diff_stat(task)

    @_says(Branches.conflict_preview)
    def conflict_preview(self, task_id: str) -> git.ConflictPreview:
        return self.branches.conflict_preview(task_id)

    @_says(Branches.test_command_for)
    def test_command_for(self, task_id: str) -> str | None:
        return self.branches.test_command_for(task_id)

    @_says(Branches.merge)
    def merge(self, task_id: str, *, message: str | None = None,
              test_command: str | None = None) -> git.MergeResult:
        return self.branches.merge(task_id, message=message, test_command=test_command)

    @_says(Branches.found_landed)
    def found_landed(self, task: Task) -> git.MergeResult | None:
        return self.branches.found_landed(task)

    @_says(Branches.update)
    def update(self, task_id: str) -> git.UpdateResult:
        return self.branches.update(task_id)

    @_says(Branches.update_prompt)
    def update_prompt(self, task: Task, conflicts: list[str], operation: str | None) -> str:
        return self.branches.update_prompt(task, conflicts, operation)

    @_says(Branches.resolve_update)
    def resolve_update(self, task_id: str, how: str) -> Task:
        return self.branches.resolve_update(task_id, how)

    @_says(Branches.push)
    def push(self, task_id: str) -> git.PushResult:
        return self.branches.push(task_id)

    @_says(Branches.copies)
    def copies(self, task_id: str) -> list[Task]:
        return self.branches.copies(task_id)

    @_says(Branches.compare)
    def compare(self, task_id: str) -> list[CopyReport]:
        return self.branches.compare(task_id)

    # --- best of N (ranking.py) -----------------------------------------------------------------

    @_says(Best.ranking)
    def rank(self, task_id: str, *, gather: bool = True) -> list[Ranked]:
        return self.best.ranking(task_id, gather=gather)

    @_says(Best.rankings)
    def rankings(self, tasks: Iterable[Task]) -> dict[str, Ranked]:
        return self.best.rankings(tasks)

    @_says(Best.pick_best)
    def pick_best(self, task_id: str, *, choose: str | None = None
                  ) -> tuple[Task, list[str], Ranked]:
        return self.best.pick_best(task_id, choose=choose)

    def best_picks_since(self, since: float) -> list[BestPick]:
        """The groups' picks (auto_pick's and pick --best's) recorded since ``since``."""
        return self.best.picks_since(since)

    # --- the merge queue (merge_queue.py) ----------------------------------------------------

    @_says(MergeQueue.pick)
    def pick(self, task_id: str) -> tuple[Task, list[str]]:
        return self.queue.pick(task_id)

    @_says(MergeQueue.enqueue)
    def enqueue(self, task_ids: list[str]) -> list[Task]:
        return self.queue.enqueue(task_ids)

    @_says(MergeQueue.dequeue)
    def dequeue(self, task_ids: list[str]) -> list[Task]:
        return self.queue.dequeue(task_ids)

    @_says(MergeQueue.landing_queue)
    def landing_queue(self, repo: Path | None = None) -> list[Task]:
        return self.queue.landing_queue(repo)

    @_says(MergeQueue.queue_running)
    def queue_running(self, repo: Path) -> bool:
        return self.queue.queue_running(repo)

    @_says(MergeQueue.ensure_queue_runner)
    def ensure_queue_runner(self, repo: Path) -> bool:
        return self.queue.ensure_queue_runner(repo)

    @_says(MergeQueue.resume_queues)
    def resume_queues(self) -> None:
        self.queue.resume_queues()
