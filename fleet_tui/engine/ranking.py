"""Best of N, the engine's side: each copy's evidence gathered once its copies have ended
(and again when one changes), the ranking with its reasons, `pick --best`, and auto_pick.

Evidence of a copy (core.ranking.CopyEvidence): the repository's test command and its
named checks (`[rank] checks`) run in the copy's worktree as the merge gate runs them
(`git.run_test_command`: its own session, the key kept out, the gate's time limit), the
copies at once up to the worker cap; its diff's size and files, the files no other copy
touched; whether it merges cleanly on its base's tip (the conflict preview); its open
review comments. It is kept in the store with a fingerprint of what it is evidence of (the
worktree's HEAD, the attempt that ended last, the base's tip, the commands), so asking
again costs nothing until something changed.

Where it runs: a detached rank runner per group (`python -m fleet_tui.engine.rank_runner
SPEC`, as the merge queue's runner), started by any engine's pass that sees a group's last
copy end, so the evidence is gathered (and auto_pick lands the winner through the merge
queue) when the panel or the CLI that saw the end is closed. `compare` and `pick --best`
gather what is missing themselves; a lock per group makes them wait for a runner at work
instead of running the tests twice.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path

from fleet_tui.core import policy, redaction
from fleet_tui.core.errors import FleetError, FleetRefused, FleetTuiError
from fleet_tui.core.model import Task
from fleet_tui.core.ranking import CheckResult, CopyEvidence, Ranked, rank
from fleet_tui.core.states import (
    ACTIVE_STATES,
    CLOSED_STATES,
    FINISHED_STATES,
    PENDING_STATES,
    Action,
    TaskState,
)
from fleet_tui.engine.actions import Actions
from fleet_tui.engine.branches import Branches, _scratch_checkout
from fleet_tui.engine.context import Context, Part, hides_key, log
from fleet_tui.engine.merge_queue import MergeQueue, _settings_data
from fleet_tui.engine.review import Review
from fleet_tui.engine.secret_cache import SecretCache
from fleet_tui.engine.supervisor import TaskChange
from fleet_tui.settings.config import ConfigError
from fleet_tui.store.costs import totals
from fleet_tui.store.evidence import BestPick, EvidenceStore
from fleet_tui.system import paths
from fleet_tui.system.files import write_json_atomic
from fleet_tui.system.spawn import spawn_detached
from fleet_tui.vcs import git, repolock

TYPE_CHECKING = False
if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

__all__ = ["RANK_RUNNER_MODULE", "Best", "NonePassed"]

RANK_RUNNER_MODULE = "fleet_tui.engine.rank_runner"
GATE_TIMEOUT = 600.0  # the merge gate's time limit (vcs.merge's test_timeout)
_TAIL = 2000  # the end of a failing command's output kept with the evidence


class NonePassed(FleetRefused):
    """`pick --best` found no copy that passes (exit 4): nothing was landed."""


def rank_dir(repo: Path) -> Path:
    """The rank runners' folder of a repository: a spec, a log and a lock per group."""
    return paths.logs_dir(Path(repo)) / ".rank"


class Best(Part):
    """Evidence, ranking, pick --best and auto_pick over one engine's parts."""

    def __init__(self, ctx: Context, secrets: SecretCache, actions: Actions,
                 branches: Branches, queue: MergeQueue, review: Review) -> None:
        super().__init__(ctx)
        self.secrets = secrets
        self.actions = actions
        self.branches = branches
        self.queue = queue
        self.review = review
        self.evidence = EvidenceStore(self.store)
        self._procs: list[subprocess.Popen[bytes]] = []

    # --- what a copy's evidence is of --------------------------------------------------------

    def commands_for(self, task: Task) -> tuple[str | None, tuple[str, ...]]:
        """The test command (the merge gate's) and the named checks of the task's
        repository."""
        try:
            checks = self.repo_settings.get(Path(task.repo)).checks
        except ConfigError:
            checks = ()  # said by settings_problems(); nothing named then
        return self.branches.test_command_for(task.id), checks

    def auto_pick_on(self, task: Task) -> bool:
        try:
            return self.repo_settings.get(Path(task.repo)).auto_pick
        except ConfigError:
            return False

    def fingerprint(self, task: Task, commands: tuple[str | None, tuple[str, ...]]) -> str:
        """What the evidence of a copy is of: its worktree's HEAD (a worktree here), the
        attempt that ended last, the base it stands on and its base branch's tip, an
        update's conflicts, and the commands run. Any change makes the evidence stale."""
        head = ""
        with contextlib.suppress(git.GitError, OSError, FleetTuiError):
            if task.worktree is not None and self.branches.remote_of(task) is None:
                head = git.head_commit(Path(task.worktree))
        tip = ""
        if task.base_branch:
            with contextlib.suppress(git.GitError, OSError):
                tip = git.branch_tip(Path(task.repo), task.base_branch)
        parts = [str(task.state), repr(task.finished_at), str(task.attempt_count),
                 task.base_commit, tip, head, ",".join(task.conflicts),
                 commands[0] or "", *commands[1]]
        import hashlib  # here: OpenSSL loads for a command that ranks alone

        return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]

    # --- gathering ----------------------------------------------------------------------------

    @staticmethod
    def ended(copies: Iterable[Task]) -> bool:
        """Every copy has ended (none queued, starting or running)."""
        return not any(t.state in PENDING_STATES or t.state in ACTIVE_STATES
                       for t in copies)

    def _lock(self, task: Task, timeout: float) -> contextlib.AbstractContextManager[None]:
        folder = paths.private_dir(rank_dir(Path(task.repo)))
        return repolock.hold(folder / f"{task.group_id or task.id}.lock",
                             f"ranking the copies of {task.id}", timeout=timeout)

    def stale(self, copies: list[Task]) -> list[tuple[Task, str]]:
        """The ended copies still open whose evidence is missing or out of date, each with
        the fingerprint its evidence will have."""
        if not copies or not copies[0].group_id:
            return []
        have = self.evidence.of_group(copies[0].group_id)
        out = []
        for task in copies:
            if task.state not in FINISHED_STATES or policy.in_queue(task):
                continue
            ev = have.get(task.id)
            fingerprint = self.fingerprint(task, self.commands_for(task))
            if ev is None or ev.fingerprint != fingerprint:
                out.append((task, fingerprint))
        return out

    @hides_key
    def gather(self, task_id: str, *, wait: float = GATE_TIMEOUT + 60) -> dict[str, CopyEvidence]:
        """The evidence of every copy of the task's group, gathering what is missing or
        stale (the copies' commands at once, up to the worker cap) and keeping it in the
        store. Waits for a rank runner at work on the group (then uses what it found)."""
        copies = self.branches.copies(task_id)
        group = copies[0].group_id if copies else None
        if not group:
            raise FleetRefused(f"task {task_id} was not launched as one of several copies "
                               "(`fleet-tui run --copies N`); there is nothing to rank")
        try:
            with self._lock(copies[0], wait):
                copies = self.branches.copies(task_id)
                todo = self.stale(copies)
                if todo:
                    self._gather(copies, todo)
        except repolock.LockTimeout as exc:
            raise FleetRefused(f"the copies of {task_id} are being ranked by another "
                               f"process: {exc}") from None
        return self.evidence.of_group(group)

    def _gather(self, copies: list[Task], todo: list[tuple[Task, str]]) -> None:
        group = copies[0].group_id
        assert group is not None
        cap = max(1, min(len(todo), int(self.settings.max_workers or 1)))
        started = time.monotonic()
        self.secrets.get()  # resolved once, before the threads ask for it
        # the commands run up to the cap at once; each copy's git work (diff, preview,
        # comments) runs beside its commands, so the gathering takes about as long as
        # the slowest command
        from concurrent.futures import ThreadPoolExecutor  # here: a ranking's alone

        with ThreadPoolExecutor(cap, thread_name_prefix="fleet-rank") as pool, \
                ThreadPoolExecutor(2 * len(todo), thread_name_prefix="fleet-rank-git") as side:
            found = list(pool.map(lambda item: self._one(item[0], item[1], side), todo))
        # the files each copy touched that no other copy did (of all the open copies)
        have = {**self.evidence.of_group(group), **{ev.task_id: ev for ev in found}}
        touched = {t.id: set(have[t.id].files) for t in copies if t.id in have
                   and t.state not in CLOSED_STATES}
        out = []
        for ev in [*found, *(have[t] for t in touched if t not in {e.task_id for e in found})]:
            others: set[str] = set()
            for other, files in touched.items():
                if other != ev.task_id:
                    others |= files
            out.append(replace(ev, outside=tuple(f for f in ev.files if f not in others)))
        self.evidence.put(group, out)
        log.info("evidence of %d copies of group %s gathered in %.2f s", len(found), group,
                 time.monotonic() - started)

    def _one(self, task: Task, fingerprint: str, side: ThreadPoolExecutor) -> CopyEvidence:
        """One copy's evidence (a thread of the gathering; its git work on `side`)."""
        started = time.monotonic()
        report_of = side.submit(self.branches._report, task)
        comments_of = side.submit(self._open_comments, task)
        test: CheckResult | None = None
        checks: list[CheckResult] = []
        test_command, named = self.commands_for(task)
        if self._has_worktree(task) and (test_command or named):
            try:
                with self._where(task) as where:
                    if test_command:
                        test = self._run(test_command, where)
                    checks = [self._run(c, where) for c in named]
            except (FleetTuiError, git.GitError, OSError,
                    subprocess.CalledProcessError) as exc:
                why = f"could not be run: {exc}"
                test = CheckResult(test_command or "", False, 0.0, why) \
                    if test_command else None
                checks = [CheckResult(c, False, 0.0, why) for c in named]
        report = report_of.result()
        if test_command and test is None:  # no worktree to run it in
            test = CheckResult(test_command, False, 0.0, report.merges or "no worktree")
        comments = comments_of.result()
        return CopyEvidence(task.id, fingerprint, self.clock(), test, tuple(checks),
                            report.added, report.deleted, tuple(report.files), (),
                            report.clean, report.merges, comments, None,
                            time.monotonic() - started)

    def _open_comments(self, task: Task) -> int:
        try:
            return self.review.open_comments(task.id)
        except (FleetTuiError, git.GitError, OSError):
            return 0

    def _has_worktree(self, task: Task) -> bool:
        if task.state in CLOSED_STATES or task.worktree is None:
            return False
        try:
            remote = self.branches.remote_of(task)
        except FleetTuiError:
            return False
        return remote.has_worktree(task) if remote is not None \
            else Path(task.worktree).is_dir()

    @contextlib.contextmanager
    def _where(self, task: Task) -> Iterator[Path]:
        """Where a copy's commands run: its worktree, or (its worktree on another host) a
        scratch checkout here of its work as it is now (a snapshot: the worker's files
        are left as they are)."""
        remote = self.branches.remote_of(task)
        if remote is None:
            yield Path(task.worktree or "")
            return
        commit = remote.snapshot(task)
        with _scratch_checkout(Path(task.repo), commit) as where:
            yield where

    def _run(self, command: str, where: Path) -> CheckResult:
        started = time.monotonic()
        passed, output = git.run_test_command(command, where, GATE_TIMEOUT,
                                              secrets=self.secrets.get())
        # the tail is kept in the store: the key hidden in it, as in every stored text
        return CheckResult(command, passed, time.monotonic() - started,
                           "" if passed else redaction.redact(output[-_TAIL:]))

    # --- the ranking ----------------------------------------------------------------------------

    def ranking(self, task_id: str, *, gather: bool = True) -> list[Ranked]:
        """The copies of the task's group, best first, each with its reason (gathering
        the evidence that is missing or stale first; `gather=False`: what the store
        holds, nothing run)."""
        copies = self.branches.copies(task_id)
        evidence = self.gather(task_id) if gather else (
            self.evidence.of_group(copies[0].group_id) if copies[0].group_id else {})
        return self.rank_copies(copies, evidence)

    def rank_copies(self, copies: list[Task], evidence: dict[str, CopyEvidence]
                    ) -> list[Ranked]:
        """Rank copies from evidence at hand; whether each can be landed is asked now."""
        costs = self.ctx_costs([t.id for t in copies])
        entries = []
        for task in copies:
            ev = evidence.get(task.id)
            if ev is not None and task.state != TaskState.MERGED:  # a merged one landed
                # a worker that failed or was killed left work it did not finish: never
                # the best, whatever its tests say
                unfinished = None if task.state == TaskState.SUCCEEDED else (
                    f"its worker ended {task.state} (verdict {task.verdict or '-'})")
                ev = replace(ev, landable=unfinished or policy.refusal(task, Action.PICK)
                             or policy.refusal(task, Action.QUEUE))
            entries.append((task.id, ev, costs.get(task.id, 0.0)))
        return rank(entries)

    def ctx_costs(self, task_ids: list[str]) -> dict[str, float]:
        return {k: v.cost for k, v in totals(self.store, by="task", task_ids=task_ids).items()}

    def rankings(self, tasks: Iterable[Task]) -> dict[str, Ranked]:
        """task id -> its place, for the copies among ``tasks`` whose group has evidence
        (what `ls --json` and `show --json` carry; nothing is run)."""
        groups = {t.group_id for t in tasks if t.group_id}
        if not groups:
            return {}
        evidence = self.evidence.of_groups(g for g in groups if g)
        out: dict[str, Ranked] = {}
        for group in groups:
            assert group is not None
            copies = self.store.group(group)
            if any(t.id in evidence for t in copies):
                out.update({r.task_id: r for r in self.rank_copies(copies, evidence)})
        return out

    # --- pick --best and auto_pick ------------------------------------------------------------

    @staticmethod
    def none_passed(ranked: list[Ranked]) -> str:
        return "no copy passes: " + "; ".join(f"{r.task_id} {r.reason}" for r in ranked)

    @hides_key
    def pick_best(self, task_id: str, *, choose: str | None = None, how: str = "best"
                  ) -> tuple[Task, list[str], Ranked]:
        """Land the best copy of the task's group through the merge queue (its gate runs
        again on the queue's tip) and discard the others. Refuses (NonePassed, exit 4)
        when no copy passes; with copies tied at the top, `choose` names one of them
        (None: the first, in copy order: the smallest change of equal evidence)."""
        ranked = self.ranking(task_id)
        best = [r for r in ranked if r.best]
        if not best:
            raise NonePassed(self.none_passed(ranked) + "; nothing was landed")
        winner = best[0]
        if choose is not None:
            chosen = [r for r in best if r.task_id == choose]
            if not chosen:
                raise FleetRefused(f"{choose} is not among the best copies "
                                   f"({', '.join(r.task_id for r in best)})")
            winner = chosen[0]
        task = self.get_task(winner.task_id)
        if task.group_id:
            self.evidence.record_pick(task.group_id, task.id, winner.reason, how,
                                      self.clock())
        queued, discarded = self.queue.pick(task.id)
        return queued, discarded, winner

    def undecided(self, copies: list[Task]) -> bool:
        """auto_pick has this group to decide: the repository asks for it, every copy has
        ended, none is landed, discarded or queued, and no pick is recorded."""
        return bool(copies) and bool(copies[0].group_id) and self.ended(copies) \
            and self.auto_pick_on(copies[0]) and not any(
                t.state in CLOSED_STATES or policy.in_queue(t) for t in copies) \
            and self.evidence.pick_of(copies[0].group_id or "") is None

    def auto_pick(self, task_id: str) -> BestPick | None:
        """auto_pick: once per group, when its copies have all ended, land the best (or
        record that none passed). The pick recorded (None: not this group's turn)."""
        copies = self.branches.copies(task_id)
        group = copies[0].group_id if copies else None
        if not group or not self.undecided(copies):
            return None  # not asked for, not ended, decided, or the user picked already
        ranked = self.ranking(task_id)
        best = [r for r in ranked if r.best]
        if not best:
            reason = self.none_passed(ranked)
            self.evidence.record_pick(group, None, reason, "auto", self.clock())
            return self.evidence.pick_of(group)
        winner = best[0]
        reason = f"best of {len(copies)}: {winner.reason}"
        if not self.evidence.record_pick(group, winner.task_id, reason, "auto", self.clock()):
            return None  # another engine decided first
        try:
            self.queue.pick(winner.task_id)
            self.store.update_task(winner.task_id, message=f"picked automatically as the "
                                   f"{reason}")
        except FleetError as exc:
            log.warning("auto_pick could not land %s: %s", winner.task_id, exc)
            with self.store.transaction() as conn:
                conn.execute("UPDATE best_picks SET reason = ? WHERE group_id = ?",
                             (f"{reason}; but it could not be queued: {exc}", group))
        return self.evidence.pick_of(group)

    def picks_since(self, since: float) -> list[BestPick]:
        """The groups' picks (auto_pick's and pick --best's) recorded since ``since``."""
        return self.evidence.picks_since(since)

    # --- the rank runners -----------------------------------------------------------------------

    spawn_runners = True

    RESUME_CHECK = 30.0  # seconds between two looks (per process) for an undecided group
    RESUME_WITHIN = 86_400.0  # groups whose copies ended this long ago at most
    _resume_checked = 0.0

    def after_pass(self, changes: list[TaskChange]) -> None:
        """A copy ended: once its group's copies have all ended, a rank runner gathers
        their evidence (and lands the best with auto_pick) in a process of its own. Every
        RESUME_CHECK seconds, an auto_pick group left undecided (its runner killed, the
        machine restarted) gets a runner again."""
        self._procs = [p for p in self._procs if p.poll() is None]
        groups: dict[str, Task] = {}
        self._resume(groups)
        for change in changes:
            if change.new not in FINISHED_STATES and change.new not in CLOSED_STATES:
                continue
            try:
                task = self.get_task(change.task_id)
            except FleetTuiError:
                continue
            if task.group_id:
                groups.setdefault(task.group_id, task)
        for group, task in groups.items():
            try:
                copies = self.store.group(group)
                if not self.ended(copies):
                    continue
                if not self.stale(copies) and not self.undecided(copies):
                    continue
                if self.spawn_runners and self.queue.spawn_queue_runners:
                    self._procs.append(self.spawn_runner(Path(task.repo), group, task.id))
            except Exception as exc:  # never stops a scheduling pass
                log.warning("could not start ranking the copies of %s: %s", task.id, exc)

    def _resume(self, groups: dict[str, Task]) -> None:
        """Add the recent auto_pick groups with no decision and no runner at work."""
        now = time.monotonic()
        if now - self._resume_checked < self.RESUME_CHECK:
            return
        self._resume_checked = now
        try:
            since = self.clock() - self.RESUME_WITHIN
            for task in self.store.list_tasks(states=FINISHED_STATES):
                if not task.group_id or task.group_id in groups or \
                        (task.finished_at or 0.0) < since or not self.auto_pick_on(task):
                    continue
                if not self.undecided(self.store.group(task.group_id)):
                    continue
                try:
                    with self._lock(task, 0):
                        groups[task.group_id] = task  # nobody at work on it
                except repolock.LockTimeout:
                    continue
        except Exception as exc:  # never stops a scheduling pass
            log.warning("could not look for undecided groups of copies: %s", exc)

    def spawn_runner(self, repo: Path, group: str, task_id: str) -> subprocess.Popen[bytes]:
        """A detached rank runner for one group (it waits for the group's lock, gathers
        what is stale, then auto_picks when the repository says so)."""
        folder = paths.private_dir(rank_dir(repo))
        spec_path = folder / f"{group}.json"
        spec = {"repo": str(repo), "task": task_id, "db": str(self.store.path),
                "settings": _settings_data(self.settings)}
        write_json_atomic(spec_path, spec, mode=paths.PRIVATE_FILE, sync=False)
        return spawn_detached([self.ctx.python, "-m", RANK_RUNNER_MODULE, str(spec_path)],
                              cwd=folder, env=self.env,
                              log_path=paths.private_file(folder / f"{group}.log"))

    def wait_runners(self, timeout: float) -> None:
        """Wait for the rank runners this engine started (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
