"""The merge queue: lands a repository's queued tasks one at a time, in order.

For each task, in its own worktree: bring it up to date with its base branch (an update,
as `fleet-tui update` does), run the test gate there (`test_command`), and merge exactly the
commit that passed into the base branch (`git.merge(expect_side=...)`: a fast-forward or a
merge commit per `merge_strategy`). The main checkout moves only after the gate passed on
that commit. A conflict or a red gate sends the task back to its worker as a follow-up (the
conflict list, or the failing output), up to `queue_fix_attempts` times; once the worker
is done it rejoins the end of the queue; after that it stops with the reason, and the queue
goes on with the next task (`policy.land_failure`, `policy.after_fix`).

Where a task is in the queue lives in the store (`Task.land_state`, `land_order`, ...), so
the queue survives its runner: one process runs a repository's queue at a time (it holds
the queue lock, `git.queue_lock_file`; the kernel drops it when the process dies), and any
fleet-tui engine that finds a queue with work and no runner starts one
(`Fleet.ensure_queue_runner`). A runner killed mid-step is resumed by the next one at that
task: every step can be done again (the update finds the branch current, the gate runs
again, a merge that happened is found by its commit, and a merge killed midway is put
right by the next one from its intent record: `git.recover_merge`). The queue never
removes the worktree or the branch of a task still in it: only a merge does, of the task
it merged.

The runner is a detached process, like an attempt's runner: `python -m
fleet_tui.engine.queue_runner SPEC` (the spec names the repository, the store and the
settings; no secret), so the queue goes on when the panel or the CLI that started it is
closed. `LandingQueue` works over an `Engine` (the Protocol below: a `Fleet`'s public
methods and its parts'), so this module imports nothing of the front.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from fleet_tui.core import policy
from fleet_tui.core.errors import FleetTuiError
from fleet_tui.core.states import FINISHED_STATES, LAND_ACTIVE, LandState
from fleet_tui.settings.config import Settings
from fleet_tui.store.db import Store, Task
from fleet_tui.vcs import git, repolock

if TYPE_CHECKING:
    from collections.abc import Callable

    from fleet_tui.engine.actions import Actions
    from fleet_tui.engine.branches import Branches
    from fleet_tui.engine.secret_cache import SecretCache
    from fleet_tui.engine.supervisor import TaskChange

__all__ = ["GATE_TAIL", "Engine", "LandingQueue"]

log = logging.getLogger("fleet_tui.engine.landing")
_T = TypeVar("_T")

GATE_TAIL = 4000  # characters of a failing gate's output sent to the worker
PAUSE = 5.0  # seconds the queue waits when the main checkout refuses every merge
IDLE = 0.5  # seconds between two looks at a queue that has nothing to do now
MAX_RETESTS = 5  # the base moved under a tested task this often in a row: stop it
# seconds before each new try of a step that failed for a reason of the moment (a host's
# dropped connection: the next command makes it again); then the task stops
AGAIN_WAITS = (1.0, 2.0, 4.0, 8.0, 15.0)

# merge refusals that are the main checkout's, not the task's: the queue waits for them
_PAUSING = frozenset({"checkout", "identity"})


class Engine(Protocol):
    """What the merge queue needs of an engine (a `Fleet`: its front and its parts)."""

    @property
    def store(self) -> Store: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def branches(self) -> Branches: ...
    @property
    def actions(self) -> Actions: ...
    @property
    def secrets(self) -> SecretCache: ...
    def tick(self) -> list[TaskChange]: ...
    def get_task(self, task_id: str) -> Task: ...
    def found_landed(self, task: Task) -> git.MergeResult | None: ...
    def test_command_for(self, task_id: str) -> str | None: ...
    def update_prompt(self, task: Task, conflicts: list[str], operation: str | None
                      ) -> str: ...
    def follow_up(self, task_id: str, prompt: str) -> Task: ...
    def resolve_update(self, task_id: str, how: str) -> Task: ...


class LandingQueue:
    """The merge queue of one repository, worked by whoever holds its lock."""

    def __init__(self, fleet: Engine, repo: Path, *, interval: float = IDLE) -> None:
        self.fleet = fleet
        self.store = fleet.store
        self.settings = fleet.settings
        self.repo = Path(repo).resolve()
        self.interval = interval
        self.paused: str | None = None  # why the queue waits (the main checkout), if it does
        self._retests: dict[str, int] = {}

    # --- the loop --------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None, *, until_empty: bool = True) -> bool:
        """Work the queue while this process holds its lock: False at once when another
        process runs it. With ``until_empty`` it returns once the queue is empty, else when
        ``stop`` is set. While a task of the queue has a worker running (a fix it sent) it
        ticks the engine between steps, so that worker runs and is finished even when no
        panel is open."""
        stop = stop or threading.Event()
        try:
            with repolock.hold(git.queue_lock_file(self.repo), "running the merge queue",
                               timeout=0):
                self._loop(stop, until_empty)
        except repolock.LockTimeout:
            return False
        return True

    def _loop(self, stop: threading.Event, until_empty: bool) -> None:
        while not stop.is_set():
            queue = self.store.landing_queue(self.repo)
            if until_empty and not queue:
                return
            if any(t.state not in FINISHED_STATES for t in queue):
                # a worker of the queue runs (a fix, or a follow-up by hand): a scheduling
                # pass starts and finishes it even when no panel is open
                try:
                    self.fleet.tick()
                except Exception as exc:  # a pass that failed: the queue goes on
                    log.warning("scheduling pass failed: %s", exc)
            try:
                worked = self.step()
            except Exception:  # said in the runner's log; the queue goes on
                log.exception("merge queue step failed")
                worked = False
            if not worked:
                stop.wait(PAUSE if self.paused else self.interval)

    def step(self) -> bool:
        """One step: move tasks back from their workers, then land the next one. True when
        a task was landed or moved on (call again at once), False when there was nothing
        to do now."""
        queue = self.store.landing_queue(self.repo)
        moved = False
        for fixing in queue:
            if fixing.land_state == LandState.FIXING:
                moved |= self._back_from_fix(fixing)
        if moved:
            queue = self.store.landing_queue(self.repo)
        task = policy.next_to_land(queue)
        if task is None:
            return moved
        self.land(task)
        return not self.paused

    # --- one task ----------------------------------------------------------------------------

    def _set(self, task: Task, state: LandState | None, note: str | None, **fields: Any
             ) -> bool:
        """Move a task on in the queue, only while it is still in it."""
        return self.store.set_landing(task.id, LAND_ACTIVE, land_state=state,
                                      land_note=note, **fields)

    def _back_from_fix(self, task: Task) -> bool:
        nxt = policy.after_fix(task)
        if nxt is None:
            return False
        if nxt.state == LandState.WAITING:
            return self.store.land_rejoin(task.id, nxt.note, self.fleet.clock())
        return self._set(task, nxt.state, nxt.note)

    def land(self, task: Task) -> None:
        """Update, test, merge one task; on a conflict or a red gate, back to its worker or
        stop it (policy.land_failure)."""
        self.paused = None
        if task.land_state == LandState.MERGING and task.land_commit \
                and self._landed_already(task, task.land_commit):
            return
        found = self.fleet.found_landed(task)  # its merge concluded after it was stopped
        if found is not None:
            self._retests.pop(task.id, None)
            self._set(task, LandState.MERGED, found.message)
            return
        base = task.base_branch or "its base"
        if not self._set(task, LandState.UPDATING, f"bringing it up to date with {base}"):
            return
        try:
            updated = self._again(task, "updating it",
                                  lambda: self.fleet.branches.update_from_base(task))
        except FleetTuiError as exc:
            self._set(task, LandState.STOPPED, f"could not update it: {exc}")
            return
        task = self.fleet.get_task(task.id)
        if updated.status == "refused":
            self._set(task, LandState.STOPPED, f"could not update it: {updated.message}")
            return
        if updated.status == "conflicts":
            self._failed(task, f"updating from {base} conflicted in "
                         f"{', '.join(updated.conflicts)}",
                         self.fleet.update_prompt(task, updated.conflicts, updated.operation),
                         conflicted=True)
            return
        command = self.fleet.test_command_for(task.id)

        def gate() -> tuple[bool, str, str] | None:
            # its worktree, or (on another host) a checkout here of its work as fetched
            with self.fleet.branches.gate_checkout(task, checkout=bool(command)) \
                    as (where, commit):
                if not command:
                    return True, "", commit
                if not self._set(task, LandState.TESTING, f"testing {commit[:10]}: {command}"):
                    return None
                passed, output = git.run_test_command(
                    command, where or Path(task.repo),
                    secrets=self.fleet.secrets.get(fresh=True))
                return passed, output, commit

        try:
            tested = self._again(task, "testing it", gate)
        except FleetTuiError as exc:
            self._set(task, LandState.STOPPED, f"could not test it: {exc}")
            return
        if tested is None:
            return
        passed, output, commit = tested
        if command:
            self.store.update_task(task.id, gate="passed" if passed else "failed")
            if not passed:
                tail = output[-GATE_TAIL:]
                self._failed(task, f"the test gate failed on {commit[:10]}",
                             self.gate_prompt(task, command, tail))
                return
        if not self._set(task, LandState.MERGING, f"merging {commit[:10]} into {base}",
                         land_commit=commit):
            return
        task = self.fleet.get_task(task.id)
        merging = task
        try:
            result = self._again(task, "merging it", lambda: self.fleet.branches.merge_task(
                merging, message=None, test_command=None, expect_side=commit))
        except FleetTuiError as exc:
            self._set(task, LandState.STOPPED, f"not merged: {exc}")
            return
        if result.merged:
            self._retests.pop(task.id, None)
            self._set(task, LandState.MERGED, result.message)
            return
        if result.reason in ("moved", "changed"):
            # the base branch moved (a merge by hand), or the worktree changed after the
            # test: update and test again, in its place
            count = self._retests[task.id] = self._retests.get(task.id, 0) + 1
            if count > MAX_RETESTS:
                self._set(task, LandState.STOPPED, f"not merged: {result.message} "
                          f"({count} times in a row)")
            else:
                self._set(task, LandState.WAITING, result.message)
            return
        if result.reason in _PAUSING:
            self.paused = result.message
            self._set(task, LandState.WAITING, f"the queue waits: {result.message}")
            return
        self._set(task, LandState.STOPPED, f"not merged: {result.message}")

    def _again(self, task: Task, what: str, step: Callable[[], _T]) -> _T:
        """`step`, tried again after AGAIN_WAITS while it fails for a reason of the moment
        (FleetTuiError.transient: a host's connection dropped, made again by the next
        command); a reason that stays, or the last try's, is raised."""
        for wait in (*AGAIN_WAITS, None):
            try:
                return step()
            except FleetTuiError as exc:
                if not exc.transient or wait is None:
                    raise
                log.warning("task %s: %s failed for now (%s); again in %g s", task.id, what,
                            exc, wait)
                time.sleep(wait)
        raise AssertionError("unreachable")

    def _landed_already(self, task: Task, commit: str) -> bool:
        """A runner died after it merged `commit` and before it said so: finish that
        merge's bookkeeping (the branch and worktree go, as after any merge)."""
        assert task.base_branch is not None
        where = git.landed(self.repo, commit, task.base_branch)
        if where is None:
            return False
        with contextlib.suppress(git.GitError):
            git.discard(self.repo, self.fleet.actions.worktree_here(task), task.branch)
        self.fleet.actions.remove_config_dir(task.id)
        self.store.update_task(task.id, state="merged", worktree=None,
                               message=f"merged {task.branch} into {task.base_branch} as "
                                       f"{where[:10]} (found after a restart)")
        self._set(task, LandState.MERGED, f"merged as {where[:10]}")
        return True

    def _failed(self, task: Task, reason: str, prompt: str, *, conflicted: bool = False
                ) -> None:
        """A conflict or a red gate: a follow-up to the worker, or out of the queue."""
        nxt = policy.land_failure(task, self.settings, reason)
        if nxt.state == LandState.FIXING:
            if not self._set(task, LandState.FIXING, nxt.note,
                             land_fixes=task.land_fixes + 1):
                return
            try:
                followed = self.fleet.follow_up(task.id, prompt)
            except FleetTuiError as exc:
                self._set(task, LandState.STOPPED, f"{reason}; the follow-up was refused: "
                          f"{exc}")
                return
            self._set(task, LandState.FIXING, nxt.note, land_attempt=followed.attempt_count)
            return
        if conflicted:  # out of the queue: its worktree is put back as it was
            with contextlib.suppress(FleetTuiError):
                self.fleet.resolve_update(task.id, "abort")
        self._set(task, LandState.STOPPED, nxt.note)

    def gate_prompt(self, task: Task, command: str, output: str) -> str:
        """The follow-up that asks the worker to fix a red test gate."""
        base = task.base_branch or "the base branch"
        return (f"The merge queue's test gate failed on your branch after it was brought "
                f"up to date with {base}.\n\n"
                f"The test command `{command}` ended with this output:\n\n{output.strip()}"
                "\n\nFix the code so that the test command passes, then commit your changes "
                "(the queue tests the committed branch again and lands it).")
