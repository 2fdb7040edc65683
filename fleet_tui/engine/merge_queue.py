"""The engine's side of the merge queue: who joins it (enqueue, pick) and leaves it
(dequeue), and its runners: one detached process per repository works a queue
(`landing.LandingQueue`, started as `python -m fleet_tui.engine.queue_runner SPEC`), and
any engine that finds a queue with work and no runner starts one."""

from __future__ import annotations

import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fleet_tui.core import policy
from fleet_tui.core.errors import NotInQueue
from fleet_tui.core.model import Task
from fleet_tui.core.states import CLOSED_STATES, LAND_ACTIVE, Action
from fleet_tui.engine.actions import Actions, check
from fleet_tui.engine.branches import Branches
from fleet_tui.engine.context import Context, Part, hides_key, log
from fleet_tui.settings import endpoints, hosts
from fleet_tui.settings.config import Settings
from fleet_tui.system import paths
from fleet_tui.system.files import write_json_atomic
from fleet_tui.system.spawn import spawn_detached
from fleet_tui.vcs import git, repolock

__all__ = ["LOG_FILE", "QUEUE_RUNNER_MODULE", "SPEC_FILE", "MergeQueue"]

# the queue runner's folder (paths.queue_dir): its spec (what queue_runner.main reads) and log
SPEC_FILE = "spec.json"
LOG_FILE = "runner.log"
QUEUE_RUNNER_MODULE = "fleet_tui.engine.queue_runner"


def _settings_data(settings: Settings) -> dict[str, Any]:
    data = asdict(settings)
    data["endpoints"] = endpoints.to_data(settings.endpoints)
    data["hosts"] = hosts.to_data(settings.hosts)
    return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
            for k, v in data.items()}


class MergeQueue(Part):
    """Enqueue, dequeue, pick; the queue runners of this engine."""

    def __init__(self, ctx: Context, actions: Actions, branches: Branches) -> None:
        super().__init__(ctx)
        self.actions = actions
        self.branches = branches
        self._queue_procs: list[subprocess.Popen[bytes]] = []  # queue runners started


    @hides_key
    def pick(self, task_id: str) -> tuple[Task, list[str]]:
        """Keep this copy: its siblings are discarded (those in the merge queue are taken
        out of it first; running ones are stopped) and it joins the merge queue, which
        lands it (update, test gate, merge). Returns it and the ids discarded."""
        task = self.get_task(task_id)
        check(task, Action.PICK)
        check(task, Action.QUEUE)
        siblings = [t for t in self.branches.copies(task.id)
                    if t.id != task.id and t.state not in CLOSED_STATES]
        discarded = []
        for sibling in siblings:
            if policy.in_queue(sibling):
                self.dequeue([sibling.id])
            self.actions.discard(sibling.id)
            discarded.append(sibling.id)
        (queued,) = self.enqueue([task.id])
        return queued, discarded

    def enqueue(self, task_ids: list[str]) -> list[Task]:
        """Put finished tasks at the end of the merge queue, in this order, and make sure a
        queue runner works on it (a process of its own: the queue goes on when the panel
        or the CLI is closed). Every task is checked first: one that cannot be queued
        refuses the whole call with the policy's reason."""
        tasks = [self.get_task(t) for t in task_ids]
        for task in tasks:
            check(task, Action.QUEUE)
            self.branches.landing_worktree(task)
        self.store.enqueue_landing([t.id for t in tasks], self.clock())
        for repo in dict.fromkeys(t.repo for t in tasks):
            self.ensure_queue_runner(repo)
        return [self.get_task(t.id) for t in tasks]

    def dequeue(self, task_ids: list[str]) -> list[Task]:
        """Take tasks out of the merge queue (a task back with its worker stays with it;
        one being landed this moment is left alone by the runner from its next step)."""
        out = []
        for task_id in task_ids:
            task = self.get_task(task_id)
            if not policy.in_queue(task):
                raise NotInQueue(f"task {task.id} is not in the merge queue")
            self.store.set_landing(task.id, LAND_ACTIVE, land_state=None, land_order=None,
                                   land_note="taken out of the merge queue")
            out.append(self.get_task(task.id))
        return out

    def landing_queue(self, repo: Path | None = None) -> list[Task]:
        """The merge queue, in landing order."""
        return self.store.landing_queue(Path(repo).resolve() if repo is not None else None)

    # start queue runners (`ensure_queue_runner`, `resume_queues`); off in the queue runner
    # itself (it runs the queue) and where nothing may land on its own (snapshots)
    spawn_queue_runners = True
    QUEUE_CHECK = 5.0  # seconds between two looks (per process) for a queue with no runner
    _queue_checked = 0.0

    def queue_running(self, repo: Path) -> bool:
        """Does a process run the merge queue of `repo` now (holds its lock)?"""
        lock = git.queue_lock_file(Path(repo))
        try:
            with repolock.hold(lock, "checking the merge queue runner", timeout=0):
                return False
        except repolock.LockTimeout:
            return True

    def ensure_queue_runner(self, repo: Path) -> bool:
        """Start a queue runner for `repo` unless one runs or the queue is empty; True
        when one was started."""
        repo = Path(repo).resolve()
        if not self.spawn_queue_runners or not self.store.landing_queue(repo):
            return False
        # one this engine started and that still starts up (it takes the lock only once
        # Python has loaded it) counts as running
        self._queue_procs = [p for p in self._queue_procs if p.poll() is None]
        if any(p.args[-1] == str(paths.queue_dir(repo) / "spec.json")  # type: ignore[index]
               for p in self._queue_procs) or self.queue_running(repo):
            return False
        self._queue_procs.append(self.spawn_runner(repo))
        return True

    def spawn_runner(self, repo: Path) -> subprocess.Popen[bytes]:
        """Start a detached queue runner for `repo` (it exits at once if another one holds the
        queue lock). Its spec holds the repository, the store's path and the engine's settings
        (no secret: the key is resolved from the environment, as the attempt runners do)."""
        folder = paths.private_dir(paths.queue_dir(repo))
        spec = {"repo": str(repo), "db": str(self.store.path),
                "settings": _settings_data(self.settings)}
        write_json_atomic(folder / SPEC_FILE, spec, mode=paths.PRIVATE_FILE, sync=False)
        return spawn_detached([self.ctx.python, "-m", QUEUE_RUNNER_MODULE,
                               str(folder / SPEC_FILE)], cwd=folder, env=self.env,
                              log_path=paths.private_file(folder / LOG_FILE))

    def resume_queues(self) -> None:
        """Every QUEUE_CHECK seconds: a merge queue with work and no runner (its runner was
        killed, or the machine restarted) gets one again."""
        if not self.spawn_queue_runners:
            return
        self._queue_procs = [p for p in self._queue_procs if p.poll() is None]  # reaped
        now = time.monotonic()
        if now - self._queue_checked < self.QUEUE_CHECK:
            return
        self._queue_checked = now
        try:
            repos = {t.repo for t in self.store.landing_queue()}
            for repo in repos:
                self.ensure_queue_runner(repo)
        except Exception as exc:  # never stops a scheduling pass
            log.warning("could not look at the merge queue: %s", exc)
