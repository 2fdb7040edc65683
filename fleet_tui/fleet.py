"""The engine's front: the one API the panel and the headless CLI use.

`Fleet` keeps tasks, worktrees, processes and their history; its methods are the contract
(their docstrings say what each promises). Behind it:

- `supervisor.Supervisor` starts runners (worktree, attempt folder, the detached runner),
  signals them (stop requests, SIGKILL to a tree, what a dead runner left behind), reaps
  them, and tells a claim whose starter is gone;
- `follower.Follower` reads what running attempts write, runs the watchdogs, and records
  how each attempt ended;
- `policy` decides: the model of the next attempt, backoff, cooldown, giving up, what a
  task's state allows (the engine refuses with the same reasons the panel shows);
- `attemptlog.AttemptLog` is the only reader and writer of an attempt's folder; `outcome`
  gives every verdict; `store` keeps what survives a restart.

Everything that survives a restart lives in the store and in each attempt's folder, so any
number of fleet-tui processes can share the work: `tick()` claims queued tasks through the
store (the per-endpoint cap holds across processes), follows every running attempt, and
finishes attempts whose runner is gone, whoever started them. A runner is a detached
process; the engine never holds a pipe to it, so closing the panel loses nothing. Each
attempt has exactly one runner: its folder is recorded and its lock taken before the runner
is spawned, and the runner holds that lock until it is gone.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from pathlib import Path

from fleet_tui import git, launcher, outcome, paths, policy, stream, supervisor, titles
from fleet_tui.config import PERMISSION_MODES, ConfigError, Settings
from fleet_tui.errors import FleetError, FleetRefused, InvalidSpec, TaskNotFound
from fleet_tui.follower import Follower, attempt_finished
from fleet_tui.repo_settings import RepoSettingsCache
from fleet_tui.states import (
    ACTIVE_STATES,
    CLOSED_STATES,
    FINISHED_STATES,
    PENDING_STATES,
    Action,
    TaskState,
)
from fleet_tui.store import (
    MAX_COPIES,
    AmbiguousTaskError,
    Attempt,
    Store,
    StoreError,
    Task,
    TaskSpec,
)
from fleet_tui.supervisor import Supervisor, TaskChange

__all__ = ["Fleet", "FleetError", "FleetRefused", "FleetStatus", "InvalidSpec",
           "SettingsNotice", "TaskChange", "TaskNotFound", "TaskSpec", "check_text",
           "work_at_stake"]

log = logging.getLogger(__name__)

RESUME_PROMPT = "Continue the task where you left off, then summarise what you did."
START_THREADS = 4  # worktrees made and runners spawned at once (git and fork wait on I/O)


def check_text(what: str, text: str) -> None:
    """Refuse text claude cannot be given: a NUL byte (no process argument or environment
    can hold one) or text that is not valid UTF-8 (bytes that did not decode arrive as
    surrogate escapes, e.g. from argv). InvalidSpec names the first bad spot."""
    nul = text.find("\0")
    if nul >= 0:
        raise InvalidSpec(f"the {what} contains a NUL byte (at character {nul + 1}), which "
                          "cannot be passed to claude; remove it")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        bad = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else \
            f"character U+{code:04X}"
        raise InvalidSpec(f"the {what} is not valid UTF-8 text ({bad} at character "
                          f"{exc.start + 1}); convert it to UTF-8") from None


@dataclass(frozen=True)
class SettingsNotice:
    """What `Fleet.check_settings` found: settings reloaded, or an edit that is not used
    (the previous settings stay); said once per change of the file."""

    severity: str  # "information" | "error"
    title: str
    message: str


def _file_stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


@dataclass
class FleetStatus:
    running: int
    queued: int
    waiting: int
    cap: int
    cooldown_until: float | None
    total_tokens: int


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def work_at_stake(task: Task) -> str | None:
    """What a fresh retry would throw away (changed or untracked files in the worktree,
    commits on the branch beyond its base), as a short phrase; None when there is nothing.
    A fresh `Fleet.retry` resets both, so the CLI asks first (and the panel should)."""
    parts: list[str] = []
    if task.worktree is not None and Path(task.worktree).is_dir():
        try:
            diff = git.diff(Path(task.worktree), task.base_commit)
        except git.GitError:
            parts.append("a worktree whose changes could not be read")
        else:
            if diff.files:
                names = ", ".join(f.path for f in diff.files[:3])
                more = f" and {len(diff.files) - 3} more" if len(diff.files) > 3 else ""
                added = sum(f.added for f in diff.files)
                deleted = sum(f.deleted for f in diff.files)
                parts.append(f"{_plural(len(diff.files), 'changed file')} ({names}{more}; "
                             f"+{added}/-{deleted})")
    if task.branch and task.base_commit:
        count = _git_count(task.repo, "rev-list", "--count",
                           f"{task.base_commit}..refs/heads/{task.branch}")
        if count:
            parts.append(f"{_plural(count, 'commit')} on {task.branch}")
    return " and ".join(parts) or None


def _git_count(repo: Path, *args: str) -> int:
    """A number git prints (0 when git fails: then there is no such branch to lose)."""
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                             timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    text = out.stdout.strip()
    return int(text) if out.returncode == 0 and text.isdigit() else 0


class Fleet:
    """The engine. Thread-safe: the panel ticks in one thread and acts from others."""

    def __init__(self, settings: Settings, store: Store | None = None, *,
                 env: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.time,
                 python: str | None = None, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.env = dict(os.environ if env is None else env)
        self.store = store if store is not None else Store(paths.db_path(self.env))
        self.clock = clock
        self.python = python or sys.executable
        self.rng = rng or random.Random()
        # each repository's .fleet-tui.toml and the user's [repos."<path>"] overrides,
        # read again when they change
        self.repo_settings = RepoSettingsCache(self.env)
        self.supervisor = Supervisor(settings, self.store, env=self.env, clock=clock,
                                     python=self.python, repo_settings=self.repo_settings)
        self.follower = Follower(settings, self.store, self.supervisor, clock=clock,
                                 rng=self.rng)
        # who claims tasks (see Supervisor.owner)
        self.owner = self.supervisor.owner
        self._secured = False
        self.last_error: str | None = None
        self._lock = threading.RLock()
        self._pool: ThreadPoolExecutor | None = None

    # --- settings that change while the panel runs ----------------------------------------

    _settings_file: str | None = None
    _settings_loader: Callable[[], Settings] | None = None
    _settings_stamp: tuple[int, int] | None = None

    def watch_settings(self, config_file: str | os.PathLike[str] | None = None,
                       loader: Callable[[], Settings] | None = None) -> None:
        """Reload the settings whenever config.toml changes (`check_settings`): `loader`
        makes them again (default: load_settings with this engine's environment). Only a
        caller whose settings come from that file alone asks for this (the panel)."""
        from fleet_tui.config import config_file_path, load_settings

        self._settings_file = os.fspath(config_file or config_file_path(self.env))
        self._settings_loader = loader or (lambda: load_settings(env=self.env))
        self._settings_stamp = _file_stamp(self._settings_file)

    def apply_settings(self, settings: Settings) -> None:
        """Use new settings from now on (the scheduler's next pass, the next launch)."""
        self.settings = settings
        self.supervisor.settings = settings
        self.follower.settings = settings

    def check_settings(self, repos: Iterable[Path] = ()) -> list[SettingsNotice]:
        """Read again what changed since the last look: config.toml (when watched) and
        the `.fleet-tui.toml` (and `.worktreeinclude`) of `repos`. A file that no longer
        reads is reported and its previous settings stay in use; each change is said
        once. Cheap when nothing changed (a stat per file)."""
        notices: list[SettingsNotice] = []
        config_changed = False
        if self._settings_file is not None and self._settings_loader is not None:
            stamp = _file_stamp(self._settings_file)
            if stamp != self._settings_stamp:
                config_changed = True
                self._settings_stamp = stamp
                try:
                    settings = self._settings_loader()
                except ConfigError as exc:
                    notices.append(SettingsNotice(
                        "error", "Settings not reloaded",
                        f"{exc}. The previous settings stay in use until the file reads."))
                else:
                    if settings != self.settings:
                        self.apply_settings(settings)
                        notices.append(SettingsNotice(
                            "information", "Settings reloaded",
                            f"{self._settings_file} changed; the new settings are in use."))
        for repo in sorted(set(repos)):
            outcome_, problem = self.repo_settings.check(Path(repo))
            if outcome_ == "reloaded" and not config_changed:  # (config.toml said so)
                notices.append(SettingsNotice(
                    "information", "Repository settings reloaded",
                    f"{Path(repo) / '.fleet-tui.toml'} changed; the new settings are in "
                    "use."))
            elif problem is not None:
                notices.append(SettingsNotice(
                    "error", "Repository settings not reloaded",
                    f"{problem}. " + ("The previous settings stay in use until the file "
                                      "reads." if outcome_ == "bad" else
                                      "Its tasks cannot start until the file reads.")))
        return notices

    @property
    def ingested_events(self) -> int:
        """Events folded in from events files so far (for the panel and benchmarks)."""
        return self.follower.ingested_events

    @property
    def ingested_bytes(self) -> int:
        """Bytes of events files folded in so far."""
        return self.follower.ingested_bytes

    def _secure_logs(self) -> None:
        """Make each repository's attempt folders private (0700 `.fleet-work/.logs`); in an
        install from before this was done, also every folder and file under it."""
        try:
            repos = self.store.repos()
        except sqlite3.Error:
            return
        for repo in repos:
            logs = paths.logs_dir(repo)
            if not paths.make_private(logs, paths.PRIVATE_DIR):
                continue
            for folder, dirs, files in os.walk(logs):
                for name in dirs:
                    paths.make_private(Path(folder, name), paths.PRIVATE_DIR)
                for name in files:
                    paths.make_private(Path(folder, name), paths.PRIVATE_FILE)

    # --- queries ------------------------------------------------------------------------------

    def list_tasks(self, repo: Path | None = None, *, archived: bool | None = False
                   ) -> list[Task]:
        """Tasks, newest first (of one repository); archived ones only when asked."""
        return self.store.list_tasks(Path(repo).resolve() if repo is not None else None,
                                     archived=archived)

    def recent_repos(self, limit: int = 10) -> list[Path]:
        """Repositories by their newest task (what the panel offers for a new task)."""
        return self.store.recent_repos(limit)

    def archive(self, task_ids: list[str]) -> list[str]:
        """Archive merged or discarded tasks: out of the lists (`ls --archived` shows
        them), their rows and attempt logs kept. FleetError naming a task that is not
        closed (its worktree and branch still hold work)."""
        tasks = [self.get_task(t) for t in task_ids]
        for task in tasks:
            if task.state not in CLOSED_STATES:
                raise FleetError(f"cannot archive task {task.id}: it is {task.state}; only "
                                 "merged or discarded tasks are archived (merge or discard "
                                 "it first)")
        return self.store.archive_tasks([t.id for t in tasks], self.clock())

    def unarchive(self, task_ids: list[str]) -> list[str]:
        return self.store.unarchive_tasks([self.get_task(t).id for t in task_ids])

    def archive_closed(self, older_than_days: float, repo: Path | None = None) -> list[str]:
        """Archive every merged or discarded task (of `repo`) last changed more than
        `older_than_days` ago (0: every one); the ids archived."""
        now = self.clock()
        return self.store.archive_tasks(
            [], now, closed_before=now - older_than_days * 86400,
            repo=Path(repo).resolve() if repo is not None else None)

    AUTO_ARCHIVE_EVERY = 600.0  # seconds between two auto-archive passes of one engine
    _auto_archived_at = 0.0

    def _auto_archive(self) -> None:
        """The archive_after_days setting, applied by the scheduling pass now and then."""
        days = self.settings.archive_after_days
        now = self.clock()
        if days <= 0 or now - self._auto_archived_at < self.AUTO_ARCHIVE_EVERY:
            return
        self._auto_archived_at = now
        archived = self.archive_closed(days)
        if archived:
            log.info("archived %d closed task(s) older than %g days", len(archived), days)

    def get_task(self, task_id: str) -> Task:
        try:
            return self.store.get_task(task_id)
        except StoreError as exc:
            raise TaskNotFound(str(exc),
                               ambiguous=isinstance(exc, AmbiguousTaskError)) from None

    def attempts(self, task_id: str) -> list[Attempt]:
        return self.store.list_attempts(self.get_task(task_id).id)

    def status(self, tasks: list[Task] | None = None) -> FleetStatus:
        """Counts, tokens and the cooldown over every task. ``tasks``: a full task list the
        caller has just read (the panel polls it anyway), so the store is not read twice."""
        if tasks is None:
            tasks = self.store.list_tasks()
        now = self.clock()
        cooldowns = [policy.cooldown_until(ep, tasks, now) for ep in {t.endpoint for t in tasks}]
        until = max((c for c in cooldowns if c is not None), default=None)
        return FleetStatus(
            running=sum(1 for t in tasks if t.state in ACTIVE_STATES),
            queued=sum(1 for t in tasks if t.state == TaskState.QUEUED),
            waiting=sum(1 for t in tasks if t.state == TaskState.WAITING),
            cap=self.settings.max_workers, cooldown_until=until,
            total_tokens=sum(t.input_tokens + t.output_tokens for t in tasks))

    def cooldown_until(self, endpoint: str | None = None) -> float | None:
        """When the endpoint's 429 cooldown ends (None: no cooldown)."""
        ep = endpoint or self.settings.base_url
        return policy.cooldown_until(ep, self.store.list_tasks(endpoint=ep), self.clock())

    # --- submit -------------------------------------------------------------------------------

    def submit(self, spec: TaskSpec, copies: int = 1) -> list[Task]:
        """Validate a task spec and store `copies` queued tasks (they start in `tick`).

        Everything that would only fail at launch is refused here, before anything is
        stored (InvalidSpec): text claude cannot take (`check_text`), numbers out of range,
        and a setup claude refuses (root with bypassPermissions without the sandbox
        opt-in; scrub_tool_env without bubblewrap). Prompts of any length are accepted."""
        prompt = spec.prompt.strip() if isinstance(spec.prompt, str) else ""
        if not prompt:
            raise InvalidSpec("the prompt is empty; say what the worker should do")
        check_text("prompt", spec.prompt)
        for what, text in (("title", spec.title), ("base ref", spec.base_ref),
                           ("model", spec.model), ("effort", spec.effort)):
            if isinstance(text, str):
                check_text(what, text)
        for arg in spec.extra_args:
            check_text("argument", arg)
        if isinstance(copies, bool) or not isinstance(copies, int) or \
                not 1 <= copies <= MAX_COPIES:
            raise InvalidSpec(f"copies must be a whole number from 1 to {MAX_COPIES} "
                              f"(got {copies!r})")
        turns = spec.max_turns
        if turns is not None and (isinstance(turns, bool) or not isinstance(turns, int)
                                  or turns < 1):
            raise InvalidSpec(f"max turns must be a whole number of at least 1 (got {turns!r})")
        limit = spec.timeout
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int | float)
                                  or not math.isfinite(limit) or limit < 0):
            raise InvalidSpec(f"the timeout must be a number of seconds, 0 (none) or more "
                              f"(got {limit!r})")
        if spec.permission_mode is not None and spec.permission_mode not in PERMISSION_MODES:
            raise InvalidSpec(f"unknown permission mode {spec.permission_mode!r}; use one of "
                              + ", ".join(PERMISSION_MODES))
        try:
            launcher.check_setup(self.settings, self.env, args=spec.extra_args,
                                 permission_mode=spec.permission_mode)
        except launcher.LaunchError as exc:
            raise InvalidSpec(str(exc)) from None
        model = (spec.model or "main").strip()
        if not model:
            raise InvalidSpec("the model is empty; use main, small or a model name")
        repo = git.main_worktree(spec.repo if spec.repo is not None else Path.cwd())
        base_ref = spec.base_ref.strip() if spec.base_ref else None
        base = git.resolve_base(repo, base_ref)
        title = titles.task_title(spec.title, prompt)
        tasks: list[Task] = []
        for i in range(copies):
            tasks.append(self.store.create_task(
                prompt=spec.prompt, repo=repo, now=self.clock(),
                title=title if copies == 1 else f"{title} ({i + 1}/{copies})",
                base_ref=base_ref,
                base_branch=base.branch, base_commit=base.commit,
                endpoint=self.settings.base_url, model=model,
                permission_mode=spec.permission_mode, effort=spec.effort,
                max_turns=spec.max_turns, timeout=spec.timeout,
                extra_args=list(spec.extra_args)))
        return tasks

    # --- the scheduling pass ------------------------------------------------------------------

    def tick(self) -> list[TaskChange]:
        """One pass: follow and finish running attempts (whoever started them), then start
        what the cap allows. Safe to call from several processes at once.

        One task's trouble stays that task's: an exception while following, finishing or
        starting it marks that task failed (verdict crashed) with a one-line reason naming
        the cause and the file, is logged, and every other task goes on. Only a problem of
        the database itself (locked for longer than the busy timeout, disk full) fails the
        whole pass."""
        with self._lock:
            try:
                return self._tick()
            except sqlite3.OperationalError as exc:  # locked past the busy timeout, full...
                raise StoreError(f"the task database {self.store.path} could not be used: "
                                 f"{exc}") from exc

    def _tick(self) -> list[TaskChange]:
        changes: list[TaskChange] = []
        self.supervisor.reap()
        if not self._secured:
            self._secured = True
            self._secure_logs()
        now = self.clock()
        active = self.store.list_tasks(states=ACTIVE_STATES)
        live: set[int] = set()
        for task in active:
            attempt: Attempt | None = None
            try:
                attempt = self.store.latest_attempt(task.id)
                if attempt is not None:
                    live.add(attempt.id)
                self.follower.follow(task, attempt, now, changes)
            except Exception as exc:
                self.follower.on_task_error(task, attempt, exc, changes)
        self.follower.forget_all_but(live)
        self._start_ready(changes)
        self._auto_archive()
        return changes

    def run(self, stop: threading.Event, interval: float = 0.25) -> None:
        """Tick until `stop` is set (meant for a thread of the panel or the CLI).

        Between ticks it waits `interval`, but a runner this engine started that exits
        ends the wait at once: its slot is refilled without waiting for the next tick."""
        while not stop.is_set():
            try:
                self.tick()
                self.last_error = None
            except Exception as exc:  # keep scheduling; the panel shows last_error
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("fleet tick failed")
            self.supervisor.wait(stop, interval)

    def _start_ready(self, changes: list[TaskChange]) -> None:
        ready = self.store.list_tasks(states=PENDING_STATES)
        endpoints = sorted({t.endpoint for t in ready})
        claimed: list[tuple[Task, TaskState]] = []
        for endpoint in endpoints:
            # the cooldown comes from finished attempts, which only a tick moves on; its
            # tasks (waiting, verdict quota) are among `ready`, so no second read
            if policy.cooldown_until(endpoint, ready, self.clock()) is not None:
                continue
            while True:
                task = self.store.claim_next(endpoint, self.settings.max_workers,
                                             self.clock(), owner=self.owner)
                if task is None:
                    break
                old = TaskState.WAITING if task.verdict in policy.TRANSIENT \
                    else TaskState.QUEUED
                if task.row_error is not None:  # never run what cannot be read as it is
                    try:
                        self.follower.mark_broken(task, None, task.row_error, changes)
                    except Exception:
                        log.exception("could not mark task %s", task.id)
                    continue
                claimed.append((task, old))
        if len(claimed) <= 1:
            for task, old in claimed:
                self.supervisor.start(task, old, changes)
            return
        # Several at once (the cap just opened, or a batch was queued): their worktrees and
        # runners are made in parallel; the tick returns once every one has started or
        # failed. Meanwhile the claims not yet started are kept fresh (claimed_at), the
        # heartbeat by which an engine on another host tells a slow start from a dead one.
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=START_THREADS,
                                            thread_name_prefix="fleet-start")
        pending = {self._pool.submit(self.supervisor.start, task, old, changes): task
                   for task, old in claimed}
        while pending:
            done, _ = futures_wait(pending, timeout=max(0.05, supervisor.START_GRACE / 4))
            for future in done:
                del pending[future]
                future.result()
            if pending:
                try:
                    self.store.touch_claims([t.id for t in pending.values()], self.owner,
                                            self.clock())
                except sqlite3.Error as exc:
                    log.warning("could not refresh the claims: %s", exc)

    # --- user actions ---------------------------------------------------------------------

    @staticmethod
    def _check(task: Task, action: Action, why: str | None = None) -> None:
        """Refuse `action` as the panel would (policy.why_not), with the same reason."""
        refused = policy.refusal(task, action, why)
        if refused is not None:
            raise FleetError(refused)

    def kill(self, task_id: str) -> None:
        """Stop a task now: SIGTERM to the worker's whole tree, SIGKILL after the grace.
        A task not started yet (queued, waiting) is killed in the store."""
        task = self.get_task(task_id)
        now = self.clock()
        if task.state in PENDING_STATES:
            if self.store.update_task(task.id, expect_state=PENDING_STATES,
                                      state=TaskState.KILLED, verdict=outcome.Verdict.KILLED,
                                      message=outcome.KILLED_BEFORE_START, finished_at=now,
                                      not_before=None):
                return
            task = self.get_task(task.id)
        self._check_running(task)
        # claimed, its runner not launched yet: killed in the store, so that its starter
        # spawns nothing (record_launch refuses)
        if self.store.kill_unlaunched(task.id, now, outcome.KILLED_BEFORE_START):
            return
        task = self.get_task(task.id)
        self._check_running(task)
        attempt = self.store.latest_attempt(task.id)
        deadline = time.monotonic() + supervisor.START_GRACE
        while attempt is None or attempt.dir is None or (
                self.supervisor.runner_identity(attempt)[0] is None
                and self.supervisor.runner_state(attempt) == "alive"):
            # being launched this very moment: wait for the runner to be known
            if time.monotonic() > deadline:
                raise FleetError(f"task {task.id} is starting; try again in a moment")
            time.sleep(0.02)
            attempt = self.store.latest_attempt(task.id)
        self.supervisor.stop_now(attempt, "kill", outcome.KILLED_BY_USER)
        with self._lock:
            task = self.get_task(task.id)
            if task.state in ACTIVE_STATES:
                try:
                    self.follower.finish(task, attempt, [])
                except Exception as exc:
                    self.follower.on_task_error(task, attempt, exc, [])

    def _check_running(self, task: Task) -> None:
        why = policy.why_not(task, Action.KILL)
        if why is None and task.state not in ACTIVE_STATES:  # queued again meanwhile
            why = f"it is not running (it is {task.state})"
        self._check(task, Action.KILL, why)

    def retry(self, task_id: str, *, resume: bool = False) -> Task:
        """Queue a new attempt: fresh (worktree reset to the base) or resume the session."""
        task = self.get_task(task_id)
        self._check(task, Action.RETRY, policy.why_not_resume(task) if resume else None)
        if resume:
            self.store.add_attempt(task.id, kind="resume", prompt=RESUME_PROMPT,
                                   started_at=None)
        else:
            if task.worktree is not None:
                info = git.create_worktree(task.repo, task.id, task.base_commit, reset=True)
                self.store.update_task(task.id, worktree=info.path, branch=info.branch)
            self.store.add_attempt(task.id, kind="fresh", prompt=task.prompt,
                                   started_at=None)
        self.store.update_task(task.id, expect_state=FINISHED_STATES, state=TaskState.QUEUED,
                               verdict=None, message=None, finished_at=None, not_before=None,
                               **({} if resume else {"session_id": None}))
        return self.get_task(task.id)

    def follow_up(self, task_id: str, prompt: str) -> Task:
        """Queue a follow-up in the same session and worktree (`--resume` + new prompt)."""
        task = self.get_task(task_id)
        if not prompt or not prompt.strip():
            raise FleetError("the follow-up prompt is empty; say what the worker should do")
        self._check(task, Action.FOLLOW_UP)
        self.store.add_attempt(task.id, kind="followup", prompt=prompt, started_at=None)
        self.store.update_task(task.id, expect_state=FINISHED_STATES, state=TaskState.QUEUED,
                               verdict=None, message=None, finished_at=None, not_before=None)
        return self.get_task(task.id)

    def say(self, task_id: str, text: str, *, wait: float = 3.0) -> bool:
        """Send a message to a running worker: it joins the turn claude is in, or starts
        the next one (the stream shows it as the user's turn when claude takes it in).
        True once the worker's runner has taken it (within `wait` seconds; False: it is
        waiting in the attempt folder and will be). FleetError when the task does not run,
        or its worker takes no message any more (it finished its turn and is stopping:
        a follow-up is the way then)."""
        from fleet_tui.attemptlog import AttemptLog, InputClosed

        task = self.get_task(task_id)
        if not isinstance(text, str) or not text.strip():
            raise InvalidSpec("the message is empty; say what the worker should do")
        check_text("message", text)
        self._check(task, Action.SAY)
        attempt = self.store.latest_attempt(task.id)
        if attempt is None or attempt.dir is None or attempt.finished_at is not None:
            raise FleetError(f"cannot send a message to task {task.id}: its worker is "
                             "starting; try again in a moment")
        log = AttemptLog(attempt.dir)
        try:
            message_id = log.send_input(text, by=self.owner)
        except InputClosed as exc:
            if not log.has_run() or not (log.runner_record() or {}).get("claude_pid"):
                why = f"{exc} yet (it is starting); try again in a moment"
            else:
                why = (f"{exc}: it has finished its work and is stopping; send a follow-up "
                       f"once it has finished (`fleet-tui follow-up {task.id} TEXT`)")
            raise FleetError(f"cannot send a message to task {task.id}: {why}") from None
        deadline = time.monotonic() + max(0.0, wait)
        while log.input_waiting(message_id):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    # The key, as resolved for the diff's and the merge's scan: (when, values); see _secrets.
    _secret_cache: tuple[float, tuple[str, ...]] | None = None
    SECRET_TTL = 30.0

    @staticmethod
    def _missing_worktree(task: Task) -> str:
        return (f"the worktree of task {task.id} ({task.worktree}) is missing: it was "
                "deleted outside fleet-tui; discard the task, or retry it to start fresh")

    def _worktree_of(self, task: Task) -> Path:
        if task.state in CLOSED_STATES:
            raise FleetError(f"task {task.id} was {task.state}; its worktree is gone")
        if task.worktree is None:
            raise FleetError(f"task {task.id} has no worktree yet (it is {task.state})")
        if not Path(task.worktree).is_dir():
            raise FleetError(self._missing_worktree(task))
        return Path(task.worktree)

    def _cached_secrets(self) -> tuple[str, ...] | None:
        cached = self._secret_cache
        if cached is not None and time.monotonic() - cached[0] < self.SECRET_TTL:
            return cached[1]
        return None

    def _secrets(self, *, fresh: bool = False) -> tuple[str, ...]:
        """The API key workers get (resolved as they resolve it), for the diff's and the
        merge's scan; () when none can be resolved (then nothing is scanned for).

        Remembered for SECRET_TTL seconds: the panel reloads a running task's diff every
        2 s, and a keyring lookup costs more than the scan (the first one imports the
        keyring library: ~100 ms). The merge itself asks afresh (``fresh``)."""
        cached = None if fresh else self._cached_secrets()
        if cached is not None:
            return cached
        now = time.monotonic()
        from fleet_tui.launcher import LaunchError, resolve_credential

        try:
            found: tuple[str, ...] = (resolve_credential(self.settings, self.env).value,)
        except (LaunchError, OSError):
            found = ()
        self._secret_cache = (now, found)
        return found

    def diff(self, task_id: str) -> git.Diff:
        """The task's changes; ``secret_paths`` names files that hold the API key (the key
        is replaced in the patch, never shown)."""
        task = self.get_task(task_id)
        worktree = self._worktree_of(task)
        secrets = self._cached_secrets()
        if secrets is not None:
            return git.diff(worktree, task.base_commit, secrets=secrets)
        # Not resolved lately: look the key up while git diff runs (the panel's first
        # paint of a diff waits for both).
        with ThreadPoolExecutor(1, thread_name_prefix="fleet-key") as pool:
            resolving = pool.submit(self._secrets)
            result = git.diff(worktree, task.base_commit)
            git.mark_secrets(worktree, result, resolving.result())
        return result

    def prepare_secret_scan(self) -> None:
        """Look the key up now (e.g. in the thread that builds the engine), so the first
        diff or merge preview need not wait for a keyring lookup."""
        self._secrets()

    def conflict_preview(self, task_id: str) -> git.ConflictPreview:
        """What merge() would do now, short of the test command: clean, or why not
        (identity, main checkout, nothing to merge, conflicts, files in the way, the key)."""
        task = self.get_task(task_id)
        worktree = self._worktree_of(task)
        if not task.base_branch:
            raise FleetError(f"task {task.id} was started from a commit, not a branch; "
                             "merge its branch by hand")
        return git.conflict_preview(task.repo, task.branch, task.base_branch,
                                    worktree=worktree, secrets=self._secrets(),
                                    strategy=self.settings.merge_strategy)

    def test_command_for(self, task_id: str) -> str | None:
        """The merge's test gate for a task: its repository's test_command
        (.fleet-tui.toml, or config.toml's [repos."<path>"]), else the test_command
        setting; None when there is none. Read afresh: an edit counts at once."""
        task = self.get_task(task_id)
        try:
            own = self.repo_settings.get(Path(task.repo)).test_command
        except ConfigError:
            own = None  # said by settings_problems(); the global one applies
        return own or self.settings.test_command

    def merge(self, task_id: str, *, message: str | None = None,
              test_command: str | None = None) -> git.MergeResult:
        """Land a finished task into its base branch (test gate, conflict check), then
        delete its config dir. A refusal comes back as MergeResult(merged=False).
        `test_command` (None: `test_command_for` the task) runs in the worktree first."""
        task = self.get_task(task_id)
        self._check(task, Action.MERGE)
        assert task.base_branch is not None  # policy refuses a task started from a commit
        if task.worktree is not None and not Path(task.worktree).is_dir():
            raise FleetRefused(self._missing_worktree(task))
        trailers = {"Fleet-Task": task.id}
        if task.session_id:
            trailers["Fleet-Session"] = task.session_id
        try:
            result = git.merge(task.repo, task.worktree, task.branch, task.base_branch,
                               message=message or task.short_title,
                               trailers=trailers,
                               test_command=test_command or self.test_command_for(task.id),
                               strategy=self.settings.merge_strategy,
                               secrets=self._secrets(fresh=True))
        except git.GitError as exc:
            # nothing was merged: to the user that is a refusal (exit 4), not a failure
            raise FleetRefused(str(exc)) from None
        if result.merged:
            self._remove_config_dir(task.id)
            self.store.update_task(task.id, state=TaskState.MERGED, message=result.message,
                                   worktree=None)
        return result

    def discard(self, task_id: str) -> None:
        """Throw a task's work away: worktree, branch and config dir. A task that runs or
        waits to run is killed first."""
        task = self.get_task(task_id)
        self._check(task, Action.DISCARD)
        if task.state in ACTIVE_STATES or task.state in PENDING_STATES:
            with contextlib.suppress(FleetError):
                self.kill(task.id)
            task = self.get_task(task.id)
        git.discard(task.repo, task.worktree, task.branch)
        self._remove_config_dir(task.id)
        self.store.update_task(task.id, state=TaskState.DISCARDED, worktree=None,
                               message="discarded", finished_at=task.finished_at
                               or self.clock())

    def _remove_config_dir(self, task_id: str) -> None:
        shutil.rmtree(paths.task_config_dir(task_id, self.env), ignore_errors=True)

    # --- events -------------------------------------------------------------------------------

    @staticmethod
    def attempt_finished(attempt: Attempt) -> bool:
        """The attempt has ended (closed in the store, or its exit record is written)."""
        return attempt_finished(attempt)

    def read_events(self, attempt: Attempt, offset: int = 0, max_bytes: int | None = None
                    ) -> tuple[list[stream.Event], int]:
        """Parsed events of the attempt from `offset` (a byte offset at a line start) and
        the offset to continue from, at most about `max_bytes` (a longer line is read
        whole). Works the same for running and finished attempts; a last line without
        newline is only returned once the attempt has finished (attemptlog's rule)."""
        return self.follower.read_events(attempt, offset, max_bytes)

    async def follow_events(self, attempt: Attempt, offset: int = 0, *,
                            poll: float = 0.2) -> AsyncIterator[stream.Event]:
        """Yield events as they are written, until the attempt has finished."""
        import asyncio  # here: the CLI never pays for it

        while True:
            fresh = self.store.get_attempt(attempt.id)
            done = self.attempt_finished(fresh)
            events, offset = await asyncio.to_thread(self.read_events, fresh, offset)
            for ev in events:
                yield ev
            if done and not events:
                return
            await asyncio.sleep(poll)
