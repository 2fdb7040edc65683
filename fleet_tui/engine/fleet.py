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
import functools
import logging
import os
import random
import secrets
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from fleet_tui.core import outcome, policy, redaction, stream, titles
from fleet_tui.core.durations import check_seconds
from fleet_tui.core.errors import (
    FleetError,
    FleetRefused,
    FleetTuiError,
    InvalidSpec,
    NotInQueue,
    TaskNotFound,
    WorkerFinished,
)
from fleet_tui.core.states import (
    ACTIVE_STATES,
    CLOSED_STATES,
    FINISHED_STATES,
    LAND_ACTIVE,
    PENDING_STATES,
    Action,
    StopReason,
    TaskState,
)
from fleet_tui.engine import supervisor
from fleet_tui.engine.follower import Follower, attempt_finished
from fleet_tui.engine.supervisor import Supervisor, TaskChange
from fleet_tui.execution.host import Host
from fleet_tui.execution.local import launcher
from fleet_tui.settings.config import PERMISSION_MODES, ConfigError, Settings
from fleet_tui.settings.config_core import check_length
from fleet_tui.settings.repo_settings import RepoSettingsCache
from fleet_tui.store.db import (
    MAX_COPIES,
    AmbiguousTaskError,
    Attempt,
    EndpointState,
    Store,
    StoreError,
    Task,
    TaskSpec,
)
from fleet_tui.system import paths
from fleet_tui.vcs import git, repolock

__all__ = ["CopyReport", "EndpointStatus", "Fleet", "FleetError", "FleetRefused", "FleetStatus",
           "InvalidSpec", "SettingsNotice", "TaskChange", "TaskNotFound", "TaskSpec", "check_text",
           "work_at_stake"]

log = logging.getLogger(__name__)

# a task's columns that name its place in git: a damaged one leaves git alone (discard)
_GIT_COLUMNS = frozenset({"repo", "worktree", "branch"})
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
class EndpointStatus:
    """One endpoint's limits as the panel's status line shows them."""

    endpoint: str
    cap: int  # the effective cap
    max_workers: int  # the configured one
    parked_until: float | None = None
    park_reason: str | None = None
    held: str | None = None
    held_task: str | None = None
    held_reason: str | None = None  # short: "account in arrears, code 1113"
    cap_reason: str | None = None  # why the cap is lowered
    note: str | None = None  # policy.endpoint_note: the whole sentence
    event: str | None = None  # the latest event (park, hold, cap) and when it began:
    event_at: float | None = None  # the panel notifies once per event


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _hides_key(action: Callable[_P, _R]) -> Callable[_P, _R]:
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


@dataclass
class FleetStatus:
    running: int
    queued: int
    waiting: int
    cap: int
    cooldown_until: float | None
    total_tokens: int
    endpoints: list[EndpointStatus] = field(default_factory=list)


@dataclass
class CopyReport:
    """One copy of a task in the compare view (`Fleet.compare`)."""

    task: Task
    added: int = 0
    deleted: int = 0
    files: list[str] = field(default_factory=list)
    clean: bool | None = None  # merges cleanly into its base now (None: not known)
    merges: str = ""  # "yes", or why not (conflicts, not finished, ...)
    diff: git.Diff | None = None  # its changes (None: no worktree to read)

    @property
    def gate(self) -> str:
        """The last test gate's result: passed, failed or "-" (never run)."""
        return self.task.gate or "-"


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
                 python: str | None = None, rng: random.Random | None = None,
                 host: Host | None = None) -> None:
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
                                     python=self.python, repo_settings=self.repo_settings,
                                     host=host)
        self.follower = Follower(settings, self.store, self.supervisor, clock=clock,
                                 rng=self.rng)
        # who claims tasks (see Supervisor.owner)
        self.owner = self.supervisor.owner
        self._secured = False
        self.last_error: str | None = None
        self._lock = threading.RLock()
        self._pool: ThreadPoolExecutor | None = None
        self._queue_procs: list[subprocess.Popen[bytes]] = []  # merge queue runners started

    # --- settings that change while the panel runs ----------------------------------------

    _settings_file: str | None = None
    _settings_loader: Callable[[], Settings] | None = None
    _settings_stamp: tuple[int, int] | None = None

    def watch_settings(self, config_file: str | os.PathLike[str] | None = None,
                       loader: Callable[[], Settings] | None = None) -> None:
        """Reload the settings whenever config.toml changes (`check_settings`): `loader`
        makes them again (default: load_settings with this engine's environment). Only a
        caller whose settings come from that file alone asks for this (the panel)."""
        from fleet_tui.settings.config import config_file_path, load_settings

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
                raise FleetRefused(f"cannot archive task {task.id}: it is {task.state}; only "
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
            total_tokens=sum(t.input_tokens + t.output_tokens for t in tasks),
            endpoints=self.endpoint_status(now))

    def endpoint_status(self, now: float | None = None) -> list[EndpointStatus]:
        """The limits of every endpoint that has some (parked, held, a lowered cap)."""
        now = self.clock() if now is None else now
        out: list[EndpointStatus] = []
        for state in self.store.list_endpoints():
            note = policy.endpoint_note(state, self.settings, now)
            if note is None and state.event is None:
                continue
            out.append(EndpointStatus(
                endpoint=state.endpoint, cap=policy.effective_cap(state, self.settings),
                max_workers=self.settings.max_workers, parked_until=state.parked_until,
                park_reason=state.park_reason, held=state.held, held_task=state.held_task,
                held_reason=policy.held_reason(state.held), cap_reason=state.cap_reason,
                note=note, event=state.event, event_at=state.event_at))
        return out

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
        for what, text in (("base ref", spec.base_ref), ("model", spec.model),
                           ("effort", spec.effort), *(("argument", a) for a in spec.extra_args)):
            try:  # each reaches claude's argv or environment: refused here, not at launch
                if isinstance(text, str):
                    check_length(text)
            except ValueError as exc:
                raise InvalidSpec(f"the {what} is {exc}") from None
        if isinstance(copies, bool) or not isinstance(copies, int) or \
                not 1 <= copies <= MAX_COPIES:
            raise InvalidSpec(f"copies must be a whole number from 1 to {MAX_COPIES} "
                              f"(got {copies!r})")
        turns = spec.max_turns
        if turns is not None and (isinstance(turns, bool) or not isinstance(turns, int)
                                  or turns < 1):
            raise InvalidSpec(f"max turns must be a whole number of at least 1 (got {turns!r})")
        if spec.timeout is not None:  # durations.py's rule, as --timeout and the form
            try:
                check_seconds(spec.timeout)
            except ValueError as exc:
                raise InvalidSpec(f"the timeout must be {exc}; 0 for none "
                                  f"(got {spec.timeout!r})") from None
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
        try:  # a repository whose settings never read would fail each attempt at its start
            self.repo_settings.get(repo)
        except ConfigError as exc:
            raise InvalidSpec(f"the repository's settings do not read: {exc}") from None
        base_ref = spec.base_ref.strip() if spec.base_ref else None
        base = git.resolve_base(repo, base_ref)
        title = titles.task_title(spec.title, prompt)
        # copies of one prompt share a group (the compare view and pick find them by it)
        group_id = f"g{secrets.token_hex(6)}" if copies > 1 else None
        tasks: list[Task] = []
        for i in range(copies):
            tasks.append(self.store.create_task(
                prompt=spec.prompt, repo=repo, now=self.clock(), group_id=group_id,
                title=titles.copy_title(title, i + 1, copies),
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
                changes = self._tick()
            except sqlite3.OperationalError as exc:  # locked past the busy timeout, full...
                raise StoreError(f"the task database {self.store.path} could not be used: "
                                 f"{exc}") from exc
            self._settle_finished(changes)
        self.resume_queues()
        return changes

    def _tick(self) -> list[TaskChange]:
        changes: list[TaskChange] = []
        self.supervisor.reap()
        if not self._secured:
            self._secured = True
            self._secure_logs()
        now = self.clock()
        active = self.store.list_tasks(states=ACTIVE_STATES)
        if active:
            # the key known before a worker's words are read and stored (redaction)
            self._secrets()
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
        # endpoints with work to start, and those whose limits may end (a park over)
        limited = {e.endpoint for e in self.store.list_endpoints()
                   if e.parked_until is not None or e.held is not None}
        endpoints = sorted({t.endpoint for t in ready} | limited)
        key = policy.settings_key(self.settings)
        claimed: list[tuple[Task, TaskState]] = []
        for endpoint in endpoints:
            # the cooldown comes from finished attempts, which only a tick moves on; its
            # tasks (waiting, verdict quota) are among `ready`, so no second read
            if policy.cooldown_until(endpoint, ready, self.clock()) is not None:
                continue
            closed: list[str | None] = [None]
            decide = self._decider(key, closed)
            while True:
                # the endpoint's limits (a park, a hold, a lowered cap) are read and obeyed
                # in the claim's own transaction: no engine starts a task into a window
                task = self.store.claim_gated(endpoint, self.clock(), self.owner, decide)
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
            self._note_queued(endpoint, policy.queued_note(closed[0]), ready)
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

    def _decider(self, key: str, closed: list[str | None]) -> Callable[
            [EndpointState | None, int],
            tuple[int | None, dict[str, Any] | None, dict[str, Any] | None,
                  dict[str, Any] | None, bool]]:
        """store.claim_gated's `decide`: policy.gate, keeping why it is closed in
        `closed[0]`."""
        def decide(state: EndpointState | None, parked: int
                   ) -> tuple[int | None, dict[str, Any] | None, dict[str, Any] | None,
                              dict[str, Any] | None, bool]:
            gate = policy.gate(state, self.settings, self.clock(), parked, settings_now=key)
            closed[0] = gate.why
            return gate.as_tuple()
        return decide

    def _note_queued(self, endpoint: str, note: str | None, ready: list[Task]) -> None:
        """Tell the endpoint's queued tasks why they do not start (a park, a hold), or
        take that back; written only when one of them (as just read) says otherwise."""
        prefixes = policy.NOTE_PREFIXES
        if any(t.endpoint == endpoint and t.state == TaskState.QUEUED and t.message != note
               and (t.message is None or t.message.startswith(prefixes)) for t in ready):
            try:
                self.store.note_queued(endpoint, note, prefixes)
            except sqlite3.Error as exc:
                log.warning("could not note why the tasks of %s wait: %s", endpoint, exc)

    def why_waiting(self, endpoint: str | None = None) -> str | None:
        """Why no task starts on an endpoint now and will not until a time or the user
        (held, or parked until a reset), or None: the CLI stops waiting for a start then."""
        ep = endpoint or self.settings.base_url
        state = self.store.get_endpoint(ep)
        gate = policy.gate(state, self.settings, self.clock(), parked=1,
                           settings_now=policy.settings_key(self.settings))
        return None if gate.cap is not None or gate.why is None \
            or gate.why.startswith("resuming") else gate.why

    def endpoint_note(self, endpoint: str | None = None) -> str | None:
        """What to know of an endpoint's limits now (held, parked, resuming, its cap
        lowered), or None (`fleet-tui ls` and `show` print it)."""
        ep = endpoint or self.settings.base_url
        return policy.endpoint_note(self.store.get_endpoint(ep), self.settings, self.clock())

    # --- user actions ---------------------------------------------------------------------

    @staticmethod
    def _check(task: Task, action: Action, why: str | None = None) -> None:
        """Refuse `action` as the panel would (policy.why_not), with the same reason."""
        refused = policy.refusal(task, action, why)
        if refused is not None:
            raise FleetRefused(refused)

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
        self.supervisor.stop_now(attempt, StopReason.KILL, outcome.KILLED_BY_USER)
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

    @_hides_key
    def retry(self, task_id: str, *, resume: bool = False) -> Task:
        """Queue a new attempt: fresh (worktree reset to the base) or resume the session."""
        task = self.get_task(task_id)
        self._check(task, Action.RETRY, policy.why_not_resume(task) if resume else None)
        if resume:
            self._check_branch_left(task)
        # the user acted on the endpoint's stop (recharged, renewed, a new key): lift it
        self.store.change_endpoint(
            task.endpoint, lambda state: {"held": None, "held_task": None,
                                          "held_settings": None} if state.held else None,
            self.clock())
        if resume:
            self.store.add_attempt(task.id, kind="resume", prompt=RESUME_PROMPT,
                                   started_at=None)
        else:
            if task.worktree is not None:
                info = self.supervisor.host.make_worktree(task, reattach=False, reset=True)
                # a fresh worktree: an update that stopped on conflicts is gone with it
                shutil.rmtree(paths.update_dir(task.repo, task.id), ignore_errors=True)
                self.store.update_task(task.id, worktree=info.path, branch=info.branch,
                                       conflicts=[])
            self.store.add_attempt(task.id, kind="fresh", prompt=task.prompt,
                                   started_at=None)
        self.store.update_task(task.id, expect_state=FINISHED_STATES, state=TaskState.QUEUED,
                               verdict=None, message=None, finished_at=None, not_before=None,
                               **({} if resume else {"session_id": None}))
        return self.get_task(task.id)

    @_hides_key
    def follow_up(self, task_id: str, prompt: str) -> Task:
        """Queue a follow-up in the same session and worktree (`--resume` + new prompt)."""
        task = self.get_task(task_id)
        if not prompt or not prompt.strip():
            raise FleetError("the follow-up prompt is empty; say what the worker should do")
        self._check(task, Action.FOLLOW_UP)
        self._check_branch_left(task)
        self.store.add_attempt(task.id, kind="followup", prompt=prompt, started_at=None)
        self.store.update_task(task.id, expect_state=FINISHED_STATES, state=TaskState.QUEUED,
                               verdict=None, message=None, finished_at=None, not_before=None)
        return self.get_task(task.id)

    @staticmethod
    def _check_branch_left(task: Task) -> None:
        """A resume or a follow-up continues the work on the task's branch: when its
        worktree folder was deleted by hand the branch is checked out again at the start
        (supervisor.launch); with the branch gone too there is nothing to continue."""
        if task.worktree is None or Path(task.worktree).is_dir():
            return
        if not git.branch_exists(Path(task.repo), task.branch or f"fleet/{task.id}"):
            raise FleetRefused(str(git.BranchGone(task.id, Path(task.worktree))))

    def say(self, task_id: str, text: str, *, wait: float = 3.0) -> bool:
        """Send a message to a running worker: it joins the turn claude is in, or starts
        the next one (the stream shows it as the user's turn when claude takes it in).
        True once the worker's runner has taken it (within `wait` seconds; False: it is
        waiting in the attempt folder and will be). FleetError when the task does not run,
        or its worker takes no message any more (it finished its turn and is stopping:
        a follow-up is the way then)."""
        from fleet_tui.execution.attemptlog import AttemptLog, InputClosed

        task = self.get_task(task_id)
        if not isinstance(text, str) or not text.strip():
            raise InvalidSpec("the message is empty; say what the worker should do")
        check_text("message", text)
        if task.state in FINISHED_STATES:
            raise WorkerFinished(policy.refusal(task, Action.SAY) or
                                 f"cannot send a message to task {task.id}: it has finished")
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
                raise WorkerFinished(
                    f"cannot send a message to task {task.id}: {exc}: it has finished its "
                    "work and is stopping; send a follow-up once it has finished "
                    f"(`fleet-tui follow-up {task.id} TEXT`)") from None
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
        branch = task.branch or f"fleet/{task.id}"
        kept = (f"its branch {branch} still holds the commits (a follow-up or "
                "`retry --resume` checks it out again), ") \
            if task.session_id and git.branch_exists(Path(task.repo), branch) else ""
        return (f"the worktree of task {task.id} ({task.worktree}) is missing: it was "
                f"deleted outside fleet-tui; {kept}discard the task, or retry it to start "
                "fresh")

    def _worktree_of(self, task: Task) -> Path:
        if task.state in CLOSED_STATES:
            raise FleetRefused(f"task {task.id} was {task.state}; its worktree is gone")
        if task.worktree is None:
            raise FleetRefused(f"task {task.id} has no worktree yet (it is {task.state})")
        if not Path(task.worktree).is_dir():
            raise FleetRefused(self._missing_worktree(task))
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
        from fleet_tui.execution.local.launcher import LaunchError, resolve_credential

        try:
            found: tuple[str, ...] = (resolve_credential(self.settings, self.env).value,)
        except (LaunchError, OSError):
            found = ()
        self._secret_cache = (now, found)
        # hidden from now on wherever this process writes or shows what a worker said
        redaction.remember(found)
        return found

    @_hides_key
    def diff(self, task_id: str) -> git.Diff:
        """The task's changes; ``secret_paths`` names files that hold the API key (the key
        is replaced in the patch, never shown)."""
        task = self.get_task(task_id)
        worktree = self._worktree_of(task)
        # measured from where the task stands against its base branch's tip now: what
        # landed on the base meanwhile (merged in by an update) is not the task's change
        base = git.fork_point(worktree, task.base_commit, task.base_branch)
        found = self._cached_secrets()
        if found is not None:
            return git.diff(worktree, base, secrets=found)
        # Not resolved lately: look the key up while git diff runs (the panel's first
        # paint of a diff waits for both).
        with ThreadPoolExecutor(1, thread_name_prefix="fleet-key") as pool:
            resolving = pool.submit(self._secrets)
            result = git.diff(worktree, base)
            git.mark_secrets(worktree, result, resolving.result())
        return result

    @_hides_key
    def diff_stat(self, task: Task) -> tuple[int, int]:
        """(added, deleted) lines of a task against where it stands (see diff)."""
        worktree = self._worktree_of(task)
        return git.diff_stat(worktree, git.fork_point(worktree, task.base_commit,
                                                      task.base_branch))

    def prepare_secret_scan(self) -> None:
        """Look the key up now (e.g. in the thread that builds the engine), so the first
        diff or merge preview need not wait for a keyring lookup."""
        self._secrets()

    @_hides_key
    def conflict_preview(self, task_id: str) -> git.ConflictPreview:
        """What merge() would do now, short of the test command: clean, or why not
        (identity, main checkout, nothing to merge, conflicts, files in the way, the key)."""
        task = self.get_task(task_id)
        if task.worktree is not None and not Path(task.worktree).is_dir():
            self._refuse_if_landed(task)
            raise FleetRefused(self._missing_worktree(task))  # as the merge itself does
        worktree = self._worktree_of(task)
        if not task.base_branch:
            raise FleetRefused(f"task {task.id} was started from a commit, not a branch; "
                               "merge its branch by hand")
        try:
            preview = git.conflict_preview(task.repo, task.branch, task.base_branch,
                                           worktree=worktree, secrets=self._secrets(),
                                           strategy=self.settings.merge_strategy)
        except git.GitError:
            self._refuse_if_landed(task)
            raise
        if preview.reason in ("nothing", "gone"):
            self._refuse_if_landed(task)
        return preview

    def _refuse_if_landed(self, task: Task) -> None:
        """A task whose merge is on its base branch (a merge stopped midway and concluded
        after): recorded as merged, and said so."""
        found = self.found_landed(task)
        if found is not None:
            raise FleetRefused(f"task {task.id} is merged already: {found.message}")

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

    @_hides_key
    def merge(self, task_id: str, *, message: str | None = None,
              test_command: str | None = None) -> git.MergeResult:
        """Land a finished task into its base branch (test gate, conflict check), then
        delete its config dir. A refusal comes back as MergeResult(merged=False). The
        default commit message is the task's title without a copy's "(1/3)";
        `test_command` (None: `test_command_for` the task) runs in the worktree first."""
        task = self.get_task(task_id)
        self._check(task, Action.MERGE)
        return self._merge(task, message=message,
                           test_command=test_command or self.test_command_for(task.id))

    @staticmethod
    def _trailers(task: Task) -> dict[str, str]:
        trailers = {"Fleet-Task": task.id}
        if task.session_id:
            trailers["Fleet-Session"] = task.session_id
        return trailers

    def _merge(self, task: Task, *, message: str | None, test_command: str | None,
               expect_side: str | None = None) -> git.MergeResult:
        """The merge itself (no policy check: the merge queue lands its own tasks)."""
        assert task.base_branch is not None  # policy refuses a task started from a commit
        if task.worktree is not None and not Path(task.worktree).is_dir():
            found = self.found_landed(task)
            if found is not None:
                return found
            raise FleetRefused(self._missing_worktree(task))
        try:
            result = git.merge(task.repo, task.worktree, task.branch, task.base_branch,
                               message=message or titles.commit_title(task.short_title),
                               trailers=self._trailers(task),
                               test_command=test_command,
                               strategy=self.settings.merge_strategy,
                               secrets=self._secrets(fresh=True), expect_side=expect_side)
        except git.GitError as exc:
            # nothing was merged: to the user that is a refusal (exit 4), not a failure
            raise FleetRefused(str(exc)) from None
        if result.reason in ("gone", "nothing"):
            found = self.found_landed(task)
            if found is not None:
                return found
        gate = None
        if result.test_output is not None:
            gate = "failed" if result.reason == "test" else "passed"
        if result.merged:
            self._remove_config_dir(task.id)
            self.store.update_task(task.id, state=TaskState.MERGED, message=result.message,
                                   worktree=None, gate=gate or task.gate)
        elif gate:
            self.store.update_task(task.id, gate=gate)
        return result

    def found_landed(self, task: Task) -> git.MergeResult | None:
        """A task whose merge is on its base branch already (a merge that was stopped
        midway and concluded by the next one, or by the user; its `Fleet-Task` trailer
        says so) is merged: its worktree, branch and config dir go, as after any merge."""
        if not task.base_branch:
            return None
        commit = git.landed_task(Path(task.repo), task.base_branch, task.id)
        if commit is None:
            return None
        with contextlib.suppress(git.GitError):
            git.discard(task.repo, task.worktree, task.branch)
        self._remove_config_dir(task.id)
        message = (f"merged {task.branch} into {task.base_branch} as {commit[:10]} (found "
                   f"on {task.base_branch}: that merge was concluded after it was stopped)")
        self.store.update_task(task.id, state=TaskState.MERGED, message=message,
                               worktree=None)
        return git.MergeResult(True, commit, message, None)

    @_hides_key
    def discard(self, task_id: str) -> str:
        """Throw a task's work away: worktree, branch and config dir. A task that runs or
        waits to run is killed first. Returns what was done, as one sentence."""
        task = self.get_task(task_id)
        self._check(task, Action.DISCARD)
        if task.state in ACTIVE_STATES or task.state in PENDING_STATES:
            with contextlib.suppress(FleetError):
                self.kill(task.id)
            task = self.get_task(task.id)
        message = f"discarded {task.id}; branch {task.branch} deleted"
        untrusted = sorted(set(task.row_damaged) & _GIT_COLUMNS)
        if untrusted:
            # the row does not say which repository, worktree or branch is the task's (a
            # damaged column reads as its default, e.g. the current folder): git is left
            # alone, the row is closed
            message = (f"discarded {task.id} from the list only: its stored "
                       f"{' and '.join(untrusted)} "
                       "could not be read, so no worktree or branch was removed; remove "
                       f"them by hand (`git worktree list`, branch fleet/{task.id})")
        else:
            git.discard(task.repo, task.worktree, task.branch)
        self._remove_config_dir(task.id)
        self.store.update_task(task.id, state=TaskState.DISCARDED, worktree=None,
                               message="discarded" if not untrusted else message,
                               finished_at=task.finished_at or self.clock())
        return message

    def _remove_config_dir(self, task_id: str) -> None:
        shutil.rmtree(paths.task_config_dir(task_id, self.env), ignore_errors=True)

    # --- landing many branches: update from base, push, copies, the merge queue -----------

    def _update_record(self, task: Task) -> Path:
        return paths.update_dir(task.repo, task.id)

    def _landing_worktree(self, task: Task) -> Path:
        if not task.base_branch:
            raise FleetRefused(f"task {task.id} was started from a commit, not a branch; "
                               "there is no base branch to update from")
        try:
            return self._worktree_of(task)
        except FleetError as exc:
            raise FleetRefused(str(exc)) from None

    @_hides_key
    def update(self, task_id: str) -> git.UpdateResult:
        """Bring a finished task's branch up to date with its base branch's current tip,
        in its worktree (merge or rebase per `update_strategy`; the worker's uncommitted
        work committed first). The main checkout is not touched.

        An update that stopped on conflicts is looked at again: concluded when the worker
        (or the user, in a shell) resolved and committed it, or the files are free of
        conflict markers; else still "conflicts" (the files in ``conflicts``, stored on the
        task, which then cannot merge, queue or push until it is resolved or aborted).
        "refused": nothing changed (``message`` says why)."""
        task = self.get_task(task_id)
        self._check(task, Action.UPDATE)
        return self._update(task)

    def _update(self, task: Task) -> git.UpdateResult:
        worktree = self._landing_worktree(task)
        assert task.base_branch is not None
        if task.conflicts or git.operation_in_progress(worktree) is not None:
            return self._settle(task, worktree)
        try:
            result = git.update_from_base(
                task.repo, worktree, task.branch, task.base_branch,
                record=self._update_record(task), strategy=self.settings.update_strategy,
                message=titles.commit_title(task.short_title), trailers=self._trailers(task))
        except git.GitError as exc:
            raise FleetRefused(str(exc)) from None
        self._record_update(task, worktree, result)
        return result

    def _settle(self, task: Task, worktree: Path) -> git.UpdateResult:
        assert task.base_branch is not None
        try:
            result = git.conclude_update(worktree, self._update_record(task),
                                         base_branch=task.base_branch, branch=task.branch,
                                         conflicted=task.conflicts)
        except git.GitError as exc:
            raise FleetRefused(str(exc)) from None
        self._record_update(task, worktree, result)
        return result

    def _record_update(self, task: Task, worktree: Path, result: git.UpdateResult) -> None:
        """Keep what an update did on the task: the conflicts (or none), the new base, the
        counts measured from it, and the message."""
        if result.status == "refused":
            if task.conflicts and git.operation_in_progress(worktree) is None:
                # an update abandoned in the worktree: no longer mid-merge, not up to date
                self.store.update_task(task.id, conflicts=[], message=result.message)
            return
        fields_: dict[str, Any] = {"message": result.message,
                                   "conflicts": list(result.conflicts)}
        if result.status != "conflicts":
            fields_["base_commit"] = git.fork_point(worktree, task.base_commit,
                                                    task.base_branch)
            with contextlib.suppress(git.GitError):
                fields_["added_lines"], fields_["deleted_lines"] = git.diff_stat(
                    worktree, str(fields_["base_commit"]))
        self.store.update_task(task.id, **fields_)

    def update_prompt(self, task: Task, conflicts: list[str], operation: str | None) -> str:
        """The follow-up that asks the worker to resolve an update's conflicts."""
        files = ", ".join(conflicts) or "(see `git status`)"
        base = task.base_branch or "the base branch"
        if operation == "rebase":
            how = ("then stage them (`git add`) and continue the rebase with "
                   "`git -c core.editor=true rebase --continue` (repeat if a later commit "
                   "stops on conflicts too)")
        else:
            how = ("then stage them (`git add`) and conclude the merge with "
                   "`git commit --no-edit`")
        return (f"Bringing your branch up to date with {base} stopped on conflicts in: "
                f"{files}.\n\n"
                f"Your worktree is in the middle of that {operation or 'merge'} (`git status` "
                "shows it). Resolve the conflicts in those files, keeping what both sides "
                f"meant to do; make sure the tests still pass; {how}. Do not abort it and "
                "do not start over.")

    @_hides_key
    def resolve_update(self, task_id: str, how: str) -> Task:
        """What to do with an update that stopped on conflicts: "worker" sends the worker
        a follow-up (same session) naming the conflicted files and asking it to resolve
        them, keep the tests passing and commit; "abort" puts the worktree back exactly as
        it was before the update. (The third way, a shell, is the caller's: resolve there,
        then `update` again.)"""
        task = self.get_task(task_id)
        if how not in ("worker", "abort"):
            raise FleetError(f"unknown way to resolve {how!r}: use worker or abort")
        worktree = self._landing_worktree(task)
        operation = git.operation_in_progress(worktree)
        if operation is None and not task.conflicts:
            raise FleetRefused(f"task {task.id} has no update stopped on conflicts; "
                               "nothing to resolve")
        if how == "abort":
            self._check(task, Action.UPDATE)
            try:
                done = git.abort_update(worktree, self._update_record(task))
            except git.GitError as exc:
                raise FleetRefused(str(exc)) from None
            self.store.update_task(task.id, conflicts=[],
                                   message=f"update from {task.base_branch} aborted: {done}")
            return self.get_task(task.id)
        conflicts = task.conflicts or git.unmerged_paths(worktree)
        return self.follow_up(task.id, self.update_prompt(task, conflicts, operation))

    def _settle_finished(self, changes: list[TaskChange]) -> None:
        """A worker that was resolving an update's conflicts has finished: conclude the
        update if it resolved them (and did not commit, or did), else keep the list."""
        for change in changes:
            if change.new not in FINISHED_STATES:
                continue
            try:
                task = self.get_task(change.task_id)
                if task.conflicts and task.worktree is not None \
                        and Path(task.worktree).is_dir() and task.base_branch:
                    self._settle(task, Path(task.worktree))
            except Exception as exc:  # one task's trouble: said, never the whole pass
                log.warning("looking at the update of task %s: %s", change.task_id, exc)

    @_hides_key
    def push(self, task_id: str) -> git.PushResult:
        """Push a finished task's branch (its uncommitted work committed first) to the
        repository's remote (the base branch's upstream remote, else origin, else the only
        one) as `fleet/<id>`. Then, if the `pr_command` setting names one, run it (it gets
        FLEET_TASK_ID, FLEET_REMOTE, FLEET_REMOTE_BRANCH, FLEET_BASE_BRANCH, FLEET_TITLE
        and FLEET_COMMIT): the hook for opening a pull request; none runs by default."""
        task = self.get_task(task_id)
        self._check(task, Action.PUSH)
        worktree = None if task.worktree is None else self._landing_worktree(task)
        remote = git.push_remote(task.repo, task.base_branch)
        if remote is None:
            raise FleetRefused(f"the repository {task.repo} has no remote to push to (or "
                               "several and none is origin); add one with `git remote add "
                               "origin URL`, or set the base branch's upstream")
        remote_branch = f"fleet/{task.id}"
        expect = None
        if task.pushed:
            parts = task.pushed.split()
            if len(parts) == 3 and parts[0] == remote:
                expect = parts[2]
        try:
            result = git.push_branch(task.repo, worktree, task.branch, remote_branch,
                                     remote=remote, base_branch=task.base_branch,
                                     base_commit=task.base_commit,
                                     message=titles.commit_title(task.short_title),
                                     trailers=self._trailers(task),
                                     secrets=self._secrets(fresh=True), expect_remote=expect)
        except git.GitError as exc:
            raise FleetRefused(str(exc)) from None
        fields_: dict[str, Any] = {"pushed": f"{remote} {remote_branch} {result.commit}",
                                   "message": result.message}
        if worktree is not None:
            with contextlib.suppress(git.GitError, FleetError):
                fields_["added_lines"], fields_["deleted_lines"] = self.diff_stat(task)
        self.store.update_task(task.id, **fields_)
        command = self.settings.pr_command
        if command:
            passed, output = git.run_test_command(
                command, task.repo, 300.0, self._secrets(),
                {"FLEET_TASK_ID": task.id, "FLEET_REMOTE": remote,
                 "FLEET_REMOTE_BRANCH": remote_branch,
                 "FLEET_BASE_BRANCH": task.base_branch or "",
                 "FLEET_TITLE": titles.commit_title(task.short_title),
                 "FLEET_COMMIT": result.commit})
            result.hook_output = output
            result.hook_passed = passed
        return result

    # --- best of N: copies of one prompt ---------------------------------------------------

    def copies(self, task_id: str) -> list[Task]:
        """The copies submitted together with this task (itself included), in copy
        order; [task] for a task that was not submitted as one of several copies."""
        task = self.get_task(task_id)
        if task.group_id:
            return self.store.group(task.group_id)
        return [task]

    @_hides_key
    def compare(self, task_id: str) -> list[CopyReport]:
        """Each copy of the task's group side by side: its state and verdict, turns and
        tokens, +/- and the files it touched (from where it stands against its base), the
        last test gate, and whether it would merge cleanly now (or why not)."""
        reports = []
        for task in self.copies(task_id):
            reports.append(self._report(task))
        return reports

    def _report(self, task: Task) -> CopyReport:
        report = CopyReport(task=task, added=task.added_lines, deleted=task.deleted_lines)
        if task.state in CLOSED_STATES or task.worktree is None \
                or not Path(task.worktree).is_dir():
            report.merges = f"no worktree ({task.state})"
            return report
        try:
            diff = self.diff(task.id)
        except (FleetError, git.GitError) as exc:
            report.merges = f"cannot read its changes: {exc}"
            return report
        report.added, report.deleted = diff.added, diff.deleted
        report.files = [f.path for f in diff.files]
        report.diff = diff
        if task.state not in FINISHED_STATES:
            report.merges = f"not finished ({task.state})"
            return report
        if task.conflicts:
            report.merges = "mid-update: " + ", ".join(task.conflicts)
            return report
        try:
            preview = self.conflict_preview(task.id)
        except (FleetError, git.GitError) as exc:
            report.merges = str(exc)
            return report
        report.clean = preview.clean
        report.merges = "yes" if preview.clean else (
            "conflicts: " + ", ".join(preview.conflicts) if preview.conflicts
            else preview.message)
        return report

    @_hides_key
    def pick(self, task_id: str) -> tuple[Task, list[str]]:
        """Keep this copy: its siblings are discarded (those in the merge queue are taken
        out of it first; running ones are stopped) and it joins the merge queue, which
        lands it (update, test gate, merge). Returns it and the ids discarded."""
        task = self.get_task(task_id)
        self._check(task, Action.PICK)
        self._check(task, Action.QUEUE)
        siblings = [t for t in self.copies(task.id)
                    if t.id != task.id and t.state not in CLOSED_STATES]
        discarded = []
        for sibling in siblings:
            if policy.in_queue(sibling):
                self.dequeue([sibling.id])
            self.discard(sibling.id)
            discarded.append(sibling.id)
        (queued,) = self.enqueue([task.id])
        return queued, discarded

    # --- the merge queue -------------------------------------------------------------------

    def enqueue(self, task_ids: list[str]) -> list[Task]:
        """Put finished tasks at the end of the merge queue, in this order, and make sure a
        queue runner works on it (a process of its own: the queue goes on when the panel
        or the CLI is closed). Every task is checked first: one that cannot be queued
        refuses the whole call with the policy's reason."""
        tasks = [self.get_task(t) for t in task_ids]
        for task in tasks:
            self._check(task, Action.QUEUE)
            self._landing_worktree(task)
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
        from fleet_tui.engine import landing

        repo = Path(repo).resolve()
        if not self.spawn_queue_runners or not self.store.landing_queue(repo):
            return False
        # one this engine started and that still starts up (it takes the lock only once
        # Python has loaded it) counts as running
        self._queue_procs = [p for p in self._queue_procs if p.poll() is None]
        if any(p.args[-1] == str(paths.queue_dir(repo) / "spec.json")  # type: ignore[index]
               for p in self._queue_procs) or self.queue_running(repo):
            return False
        self._queue_procs.append(landing.spawn_runner(self, repo))
        return True

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
        newline is only returned once the attempt has finished (attemptlog's rule). The
        API key, where the worker said it, reads as redaction.MARK."""
        self._secrets()
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
