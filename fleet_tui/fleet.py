"""The engine: queue, per-endpoint concurrency cap, backoff, cooldown, kill, adoption.

One API for the panel and the headless CLI (its docstrings are the contract). Everything that
survives a restart lives in the store (tasks, attempts, summaries) and in each attempt's directory
(`spec.json`, `events.jsonl`, `stderr.log`, `runner.json`, `exit.json`, `kill.json`), so
any number of fleet-tui processes can share the work: `tick()` claims queued tasks through
the store (the cap holds across processes), follows every running attempt by tailing its
files, and finishes attempts whose exit record appeared, whoever started them. A runner is
a detached process; the engine never holds a pipe to it, so closing the panel loses nothing.
Each attempt has exactly one runner: its folder is recorded and its lock (`.lock`) taken
before the runner is spawned, and the runner holds that lock until it is gone.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import logging
import math
import os
import random
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_tui import git, launcher, outcome, paths, procs, stream
from fleet_tui.attemptlog import (
    EVENTS_FILE,
    EXIT_FILE,
    KILL_FILE,
    LAUNCH_FILE,
    LOCK_FILE,
    RESERVE_FILE,
    RUNNER_FILE,
    RUNNER_LOG,
    SPEC_FILE,
    STDERR_FILE,
    STDERR_TAIL,
    acquire_lock,
    lock_held,
    read_json,
    write_json_atomic,
)
from fleet_tui.config import PERMISSION_MODES, Settings
from fleet_tui.runner import LEFTOVER_GRACE, TOKEN_ENV, RunSpec
from fleet_tui.store import (
    ACTIVE_STATES,
    CLOSED_STATES,
    FINISHED_STATES,
    MAX_COPIES,
    AmbiguousTaskError,
    Attempt,
    Store,
    StoreError,
    Task,
    TaskSpec,
    TaskState,
)

__all__ = ["Fleet", "FleetError", "FleetRefused", "FleetStatus", "InvalidSpec", "TaskChange",
           "TaskNotFound", "TaskSpec", "check_text", "work_at_stake"]

log = logging.getLogger(__name__)

RESUME_PROMPT = "Continue the task where you left off, then summarise what you did."
START_GRACE = 60.0  # a claim by another host's engine with no heartbeat for this long is dead
RUNNER_HEADSTART = 1.0  # the runner enforces timeout and kill grace; the engine's backstop waits
TRANSIENT = ("overload", "quota")
READ_CHUNK = 1 << 20  # bytes of one attempt's events.jsonl folded in per tick (GIL hold)
START_THREADS = 4  # worktrees made and runners spawned at once (git and fork wait on I/O)
CHILD_POLL = 0.01  # while our runners live, run() checks this often whether one exited


# errors of the moment (the machine, not the task's data): tried again on the next pass
_PASSING_ERRNOS = frozenset({errno.EINTR, errno.EAGAIN, errno.EMFILE, errno.ENFILE,
                             errno.ENOMEM, errno.EBUSY, errno.ENOSPC, errno.EDQUOT})
_HOST = socket.gethostname()
# the engines of this process by owner string: a claim by one of them that no longer exists
# is abandoned even though the process lives
_LIVE_OWNERS: weakref.WeakValueDictionary[str, Fleet] = weakref.WeakValueDictionary()
_ENGINE_SEQ = itertools.count(1)  # owner strings stay unique in a process (ids are reused)


class FleetError(Exception):
    """A user-facing engine error; the message says what to do."""


class TaskNotFound(FleetError):
    """No task has this id (or, with `ambiguous`, the prefix matches several)."""

    def __init__(self, message: str, *, ambiguous: bool = False) -> None:
        super().__init__(message)
        self.ambiguous = ambiguous


class FleetRefused(FleetError):
    """The engine refused an action to keep the user's work safe (dirty checkout, conflict,
    failing tests)."""


class InvalidSpec(FleetError):
    """A task cannot be queued as given (empty prompt, a NUL byte, text that is not UTF-8,
    a number out of range, a setup claude would refuse); the message says what to change.
    Nothing was stored."""


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


@dataclass
class FleetStatus:
    running: int
    queued: int
    waiting: int
    cap: int
    cooldown_until: float | None
    total_tokens: int


@dataclass
class TaskChange:
    task_id: str
    old: TaskState | None
    new: TaskState
    message: str | None = None


@dataclass
class _Follow:
    """In-memory state of one followed attempt (rebuilt from offset 0 after a restart)."""

    decoder: stream.StreamDecoder
    summary: stream.RunSummary = field(default_factory=stream.RunSummary)
    offset: int = 0
    result: stream.Result | None = None
    stored: tuple[Any, ...] = ()


class _NotStarted(Exception):
    """A start that must not happen (killed or taken over meanwhile, or a runner of the
    attempt lives already): nothing to mark, nothing spawned."""


class _TaskDataError(Exception):
    """One task's files or rows could not be used; the message names the file."""


def _describe(exc: BaseException) -> str:
    """One line naming the cause (and, for a task's data, the file)."""
    if isinstance(exc, _TaskDataError):
        return str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return stream.one_line(f"{type(exc).__name__}: {exc}", 300)


@contextlib.contextmanager
def _about(what: str) -> Iterator[None]:
    """Name the file behind an exception from reading or classifying one task's data."""
    try:
        yield
    except (_TaskDataError, sqlite3.OperationalError):
        raise
    except OSError as exc:
        if exc.errno in _PASSING_ERRNOS:
            raise
        raise _TaskDataError(f"{what}: {_describe(exc)}") from exc
    except Exception as exc:
        raise _TaskDataError(
            f"{what}: {stream.one_line(f'{type(exc).__name__}: {exc}', 200)}") from exc


def _parse_owner(owner: str | None) -> tuple[str, int, str | None] | None:
    """host, pid and start time from an engine's owner string (host:pid:start:object; an
    older one has no start time)."""
    if not owner:
        return None
    parts = owner.split(":")
    if len(parts) not in (3, 4) or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1]), parts[2] if len(parts) == 4 else None


def _write_private(path: Path, text: str) -> None:
    """Write text to path (0600) through a temporary file and a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with open(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _as_float(value: Any, default: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return float(value)


def _read_exit(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The runner's exit record, or (None, why it is unreadable); (None, None): there is
    none. Each field the engine uses is checked, so bad data is reported, never raised."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, exc.strerror or str(exc)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None, "it is not JSON"
    if not isinstance(data, dict):
        return None, f"it holds a JSON {type(data).__name__}, not an object"
    for key, kinds in (("exit_code", (int, type(None))), ("signal", (int, type(None))),
                       ("error", (str, type(None)))):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, kinds):
            return None, f"its {key} holds {stream.one_line(repr(value), 40)}"
    return data, None


def _read_kill(path: Path) -> dict[str, Any]:
    """Why an attempt was stopped ({} when it was not, or the record is unusable)."""
    rec = read_json(path)
    if not rec or rec.get("reason") not in ("kill", "timeout", "stall", "error"):
        return {}
    if not isinstance(rec.get("message"), (str, type(None))):
        rec["message"] = None
    return rec


def _write_problem(folder: Path) -> str | None:
    """Why nothing can be written in folder (e.g. "No space left on device"), or None."""
    probe = folder / f".probe.{os.getpid()}.{secrets.token_hex(3)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


def _package_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


def _git_out(repo: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                             timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _tail(path: Path | None, size: int = STDERR_TAIL) -> str:
    if path is None:
        return ""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            end = fh.tell()
            fh.seek(max(0, end - size))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _title_of(prompt: str) -> str:
    for line in prompt.splitlines():
        line = line.strip()
        if line:
            return line[:72] + ("…" if len(line) > 72 else "")
    return "untitled"


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
        # who claims tasks: host, pid and its start time (so a claim's starter can be proven
        # gone), and this object (several engines may live in one process)
        self.owner = (f"{_HOST}:{os.getpid()}:{procs.start_time(os.getpid()) or 0}:"
                      f"{next(_ENGINE_SEQ)}-{id(self):x}")
        _LIVE_OWNERS[self.owner] = self
        self._secured = False
        self.last_error: str | None = None
        self._lock = threading.RLock()
        self._follows: dict[int, _Follow] = {}
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._pool: ThreadPoolExecutor | None = None
        # What the engine has folded in from events files, for the panel and benchmarks.
        self.ingested_events = 0
        self.ingested_bytes = 0

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

    def list_tasks(self, repo: Path | None = None) -> list[Task]:
        return self.store.list_tasks(Path(repo).resolve() if repo is not None else None)

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
        cooldowns = [self._cooldown_until(ep, tasks, now) for ep in {t.endpoint for t in tasks}]
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
        return self._cooldown_until(ep, self.store.list_tasks(endpoint=ep), self.clock())

    @staticmethod
    def _cooldown_until(endpoint: str, tasks: list[Task], now: float) -> float | None:
        # Persisted in the store as the not_before of the tasks that hit the quota: every
        # fleet-tui process sees the same cooldown, and it survives a restart.
        until = [t.not_before for t in tasks
                 if t.endpoint == endpoint and t.state == TaskState.WAITING
                 and t.verdict == "quota" and t.not_before is not None and t.not_before > now]
        return max(until) if until else None

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
        try:
            repo = git.main_worktree(spec.repo if spec.repo is not None else Path.cwd())
        except git.GitError as exc:
            raise FleetError(str(exc)) from None
        base_ref = spec.base_ref.strip() if spec.base_ref else None
        if base_ref is not None and (not base_ref or base_ref.startswith("-")):
            raise FleetError(f"unknown base ref {spec.base_ref!r}: give a branch, tag or commit")
        commit = _git_out(repo, "rev-parse", "--verify", "--quiet",
                          f"{base_ref or 'HEAD'}^{{commit}}")
        if not commit:
            raise FleetError(f"unknown base ref {base_ref!r} in {repo}: give an existing "
                             "branch, tag or commit (see `git branch -a`)")
        if base_ref is None:
            base_branch = git.current_branch(repo)
        else:
            name = base_ref.removeprefix("refs/heads/")
            base_branch = name if _git_out(
                repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{name}") else None
        title = spec.title.strip() or _title_of(prompt)
        tasks: list[Task] = []
        for i in range(copies):
            tasks.append(self.store.create_task(
                prompt=spec.prompt, repo=repo, now=self.clock(),
                title=title if copies == 1 else f"{title} ({i + 1}/{copies})",
                base_ref=base_ref, base_branch=base_branch, base_commit=commit,
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
        self._reap()
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
                self._follow_task(task, attempt, now, changes)
            except Exception as exc:
                self._on_task_error(task, attempt, exc, changes)
        # forget attempts another engine finished (their tasks are no longer active)
        for attempt_id in set(self._follows) - live:
            del self._follows[attempt_id]
        self._start_ready(changes)
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
            self._wait(stop, interval)

    def _wait(self, stop: threading.Event, interval: float) -> None:
        """Sleep up to `interval`; return early when `stop` is set or one of our runners
        has exited (a waitpid(WNOHANG) per child every CHILD_POLL seconds)."""
        deadline = time.monotonic() + interval
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            children = list(self._children.values())
            if not children:
                stop.wait(left)
                return
            if stop.wait(min(left, CHILD_POLL)):
                return
            if any(proc.poll() is not None for proc in children):
                return

    def _reap(self) -> None:
        for pid, proc in list(self._children.items()):
            if proc.poll() is not None:
                del self._children[pid]

    # --- one task's trouble -------------------------------------------------------------------

    def _on_task_error(self, task: Task, attempt: Attempt | None, exc: Exception,
                       changes: list[TaskChange]) -> None:
        if isinstance(exc, sqlite3.OperationalError):
            raise exc  # the database itself (locked, full, gone): not this task's data
        if isinstance(exc, OSError) and exc.errno in _PASSING_ERRNOS:
            log.warning("following task %s: %s (tried again next pass)", task.id, exc)
            return
        log.error("task %s: %s", task.id, _describe(exc), exc_info=exc)
        try:
            self._mark_broken(task, attempt, f"the engine could not go on with this task: "
                                             f"{_describe(exc)}", changes)
        except Exception:  # marking failed too: say so in the log, go on with the others
            log.exception("could not mark task %s", task.id)

    def _mark_broken(self, task: Task, attempt: Attempt | None, message: str,
                     changes: list[TaskChange]) -> None:
        """Fail one task (verdict crashed) with `message`. A runner of it that still lives
        is stopped: a failed task must not go on working unseen (nor beside a retry)."""
        if attempt is not None and attempt.dir is not None and attempt.finished_at is None:
            try:
                if self._runner_state(attempt) == "alive":
                    # marked only once it is gone, so that no retry runs beside it
                    self._request_kill(attempt, "error", message)
                    if not self._wait_runner(attempt,
                                             self.settings.kill_grace + RUNNER_HEADSTART):
                        self._signal_attempt(attempt, signal.SIGKILL)
                        self._wait_runner(attempt, 5.0)
            except Exception:
                log.exception("could not stop the runner of task %s", task.id)
        now = self.clock()
        if attempt is not None and attempt.finished_at is None:
            self.store.update_attempt(attempt.id, finished_at=now, verdict="crashed",
                                      message=message)
            self._follows.pop(attempt.id, None)
        if self.store.update_task(task.id, expect_state=ACTIVE_STATES | {TaskState.QUEUED,
                                                                         TaskState.WAITING},
                                  state=TaskState.FAILED, verdict="crashed", message=message,
                                  finished_at=now, not_before=None):
            changes.append(TaskChange(task.id, task.state, TaskState.FAILED, message))

    # --- starting -----------------------------------------------------------------------------

    def _start_ready(self, changes: list[TaskChange]) -> None:
        ready = self.store.list_tasks(states=(TaskState.QUEUED, TaskState.WAITING))
        endpoints = sorted({t.endpoint for t in ready})
        claimed: list[tuple[Task, TaskState]] = []
        for endpoint in endpoints:
            # the cooldown comes from finished attempts, which only a tick moves on; its
            # tasks (waiting, verdict quota) are among `ready`, so no second read
            if self._cooldown_until(endpoint, ready, self.clock()) is not None:
                continue
            while True:
                task = self.store.claim_next(endpoint, self.settings.max_workers,
                                             self.clock(), owner=self.owner)
                if task is None:
                    break
                old = TaskState.WAITING if task.verdict in TRANSIENT else TaskState.QUEUED
                if task.row_error is not None:  # never run what cannot be read as it is
                    try:
                        self._mark_broken(task, None, task.row_error, changes)
                    except Exception:
                        log.exception("could not mark task %s", task.id)
                    continue
                claimed.append((task, old))
        if len(claimed) <= 1:
            for task, old in claimed:
                self._start(task, old, changes)
            return
        # Several at once (the cap just opened, or a batch was queued): their worktrees and
        # runners are made in parallel; the tick returns once every one has started or
        # failed. Meanwhile the claims not yet started are kept fresh (claimed_at), the
        # heartbeat by which an engine on another host tells a slow start from a dead one.
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=START_THREADS,
                                            thread_name_prefix="fleet-start")
        pending = {self._pool.submit(self._start, task, old, changes): task
                   for task, old in claimed}
        while pending:
            done, _ = futures_wait(pending, timeout=max(0.05, START_GRACE / 4))
            for future in done:
                del pending[future]
                future.result()
            if pending:
                try:
                    self.store.touch_claims([t.id for t in pending.values()], self.owner,
                                            self.clock())
                except sqlite3.Error as exc:
                    log.warning("could not refresh the claims: %s", exc)

    def _model_for(self, task: Task, attempts: list[Attempt]) -> str:
        """The model name for the next attempt: the task's tier, or the small model after
        `fallback_after` overloads in a row."""
        overloads = 0
        for att in reversed(attempts):
            if att.verdict == "overload":
                overloads += 1
            elif att.verdict is not None:
                break
        if overloads >= self.settings.fallback_after:
            return self.settings.small_model
        tier = task.model or "main"
        if tier == "main":
            return self.settings.model
        if tier == "small":
            return self.settings.small_model
        return tier

    def _settings_overrides(self, task: Task) -> dict[str, Any]:
        s = self.settings
        return {
            "base_url": task.endpoint or s.base_url, "model": s.model,
            "small_model": s.small_model, "permission_mode": s.permission_mode,
            "effort": task.effort or s.effort, "keyring_service": s.keyring_service,
            "keyring_key": s.keyring_key, "claude": s.claude, "sandbox": s.sandbox,
            "key_sources": list(s.key_sources), "config_dir": str(s.config_dir),
            "key_helper": s.key_helper, "scrub_tool_env": s.scrub_tool_env,
        }

    def _runner_env(self) -> dict[str, str]:
        env = dict(self.env)
        root = _package_root()
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if root not in parts:
            parts.insert(0, root)
        env["PYTHONPATH"] = os.pathsep.join(parts)
        return env

    def _start(self, task: Task, old: TaskState, changes: list[TaskChange]) -> None:
        """Worktree, config dir, spec.json, runner. A failure fails the task, clearly; never
        raises (it runs in the start threads)."""
        try:
            attempt = self._launch(task)
        except _NotStarted as exc:
            log.info("task %s not started: %s", task.id, exc)
            return
        except Exception as exc:
            if isinstance(exc, (git.GitError, FleetError, StoreError)):
                reason = str(exc)
            else:
                if not isinstance(exc, OSError):
                    log.error("starting task %s", task.id, exc_info=exc)
                reason = _describe(exc)
            message = f"could not start: {reason}"
            try:
                now = self.clock()
                if self.store.update_task(task.id, expect_state=ACTIVE_STATES,
                                          state=TaskState.FAILED, verdict="crashed",
                                          message=message, finished_at=now):
                    latest = self.store.latest_attempt(task.id)
                    if latest is not None and latest.finished_at is None:
                        self.store.update_attempt(latest.id, finished_at=now,
                                                  verdict="crashed", message=message)
                    changes.append(TaskChange(task.id, old, TaskState.FAILED, message))
            except Exception:
                log.exception("could not mark task %s as failed to start", task.id)
            return
        changes.append(TaskChange(task.id, old, TaskState.RUNNING,
                                  f"attempt {attempt.n} started ({attempt.model})"))

    def _launch(self, task: Task) -> Attempt:
        """Start one attempt. The runner is known before it can run: the attempt's folder
        is recorded in the store (only while the task is still ours and not killed) and its
        lock taken before the spawn; the runner inherits the held lock."""
        now = self.clock()
        attempts = self.store.list_attempts(task.id)
        if attempts and attempts[-1].row_error is not None:
            raise FleetError(attempts[-1].row_error)
        pending = attempts[-1] if attempts and attempts[-1].runner_pid is None \
            and attempts[-1].finished_at is None else None
        # one live worker per task: an earlier attempt's runner still stopping (a kill's
        # grace) comes first; the task goes back to the queue and is tried again
        for earlier in attempts:
            if earlier is not pending and earlier.dir is not None \
                    and lock_held(earlier.dir) is True:
                current = self.store.get_task(task.id)
                self.store.requeue_claim(task.id, self.owner, current.claimed_at, now,
                                         f"waiting for the runner of attempt {earlier.n} "
                                         "to stop")
                raise _NotStarted(f"the runner of attempt {earlier.n} still lives")
        worktree = task.worktree
        if worktree is None or not Path(worktree).is_dir():
            # A retry may find what a failed start left behind, and so may a task claimed
            # before by an engine that died while making its worktree (no runner ran: that
            # needs the attempt folder, recorded later): then start clean.
            claimed_before = (task.started_at is not None and task.claimed_at is not None
                              and task.started_at < task.claimed_at)
            info = git.create_worktree(task.repo, task.id, task.base_commit or task.base_ref,
                                       reset=worktree is not None or bool(attempts)
                                       or claimed_before)
            worktree = info.path
            self.store.update_task(task.id, worktree=info.path, branch=info.branch,
                                   base_commit=task.base_commit or info.base_commit,
                                   base_branch=task.base_branch or info.base_branch)
        # never run in the main checkout, whatever happened to the worktree
        git.verify_worktree(Path(worktree), task.branch or f"fleet/{task.id}")
        if Path(worktree).resolve() == Path(task.repo).resolve():
            raise FleetError(f"refusing to run task {task.id} in the main checkout {task.repo}")
        config_dir = paths.private_dir(paths.task_config_dir(task.id, self.env))

        model = self._model_for(task, attempts)
        if pending is None:
            attempt = self.store.add_attempt(task.id, kind="fresh", prompt=task.prompt,
                                             now=now, model=model)
        else:
            attempt = pending
            attempt.model = model
        adir = paths.attempt_dir(task.repo, task.id, attempt.n)
        for folder in (paths.logs_dir(task.repo), adir.parent, adir):
            paths.private_dir(folder)
        lock_fd = acquire_lock(adir)
        if lock_fd is None:  # a runner of this attempt lives: following adopts it
            raise _NotStarted(f"a runner holds {adir / LOCK_FILE} already")
        try:
            for stale in (EXIT_FILE, RUNNER_FILE, KILL_FILE, LAUNCH_FILE, RESERVE_FILE):
                with contextlib.suppress(FileNotFoundError):
                    (adir / stale).unlink()
            resume = task.session_id if attempt.kind in ("resume", "followup") else None
            limit = task.timeout if task.timeout is not None else self.settings.timeout
            spec = RunSpec(cwd=str(worktree), prompt=attempt.prompt or task.prompt,
                           config_dir=str(config_dir), args=list(task.extra_args),
                           model=model, permission_mode=task.permission_mode,
                           max_turns=task.max_turns, resume=resume,
                           settings=self._settings_overrides(task), task_id=task.id,
                           attempt=attempt.n, token=secrets.token_hex(16),
                           timeout=limit or None, kill_grace=self.settings.kill_grace)
            _write_private(adir / SPEC_FILE, spec.to_json())
            paths.private_file(adir / EVENTS_FILE)
            paths.private_file(adir / RUNNER_LOG)
            if not self.store.record_launch(
                    task.id, attempt.id, self.owner,
                    {"runner_pid": None, "started_at": now, "model": model, "dir": adir,
                     "events_path": adir / EVENTS_FILE, "stderr_path": adir / STDERR_FILE,
                     "exit_path": adir / EXIT_FILE, "config_dir": config_dir,
                     "events_offset": 0},
                    {"verdict": None, "message": None, "finished_at": None,
                     "last_event_at": None, "attempt_count": attempt.n}):
                current = self.store.get_task(task.id)
                if current.state not in ACTIVE_STATES:  # killed meanwhile: close the attempt
                    self.store.update_attempt(attempt.id, finished_at=now,
                                              verdict=current.verdict or "killed",
                                              message=current.message)
                raise _NotStarted("it was killed, or taken over, before its runner started")
            with open(os.devnull, "rb") as devnull, open(adir / RUNNER_LOG, "ab") as runner_log:
                proc = subprocess.Popen(
                    [self.python, "-m", "fleet_tui.runner", "--lock-fd", str(lock_fd),
                     str(adir)], cwd=str(adir), env=self._runner_env(), stdin=devnull,
                    stdout=runner_log, stderr=runner_log, start_new_session=True,
                    close_fds=True, pass_fds=(lock_fd,))
        finally:
            os.close(lock_fd)  # the runner holds it now (or nobody, if the spawn failed)
        self._children[proc.pid] = proc
        # The runner runs whatever happens below; if this bookkeeping fails, following
        # adopts the runner from its own record (runner.json).
        try:
            write_json_atomic(adir / LAUNCH_FILE, {"runner_pid": proc.pid,
                                                   "runner_start": procs.start_time(proc.pid),
                                                   "started_at": now, "owner": self.owner})
            self.store.update_attempt(attempt.id, runner_pid=proc.pid)
        except Exception:
            log.exception("recording the runner of task %s", task.id)
        attempt.runner_pid = proc.pid
        attempt.dir = adir
        attempt.started_at = now
        return attempt

    # --- claims -------------------------------------------------------------------------------

    def _claimer_gone(self, task: Task, now: float) -> str | None:
        """Why the engine that claimed `task` is provably gone, or None when it may still
        be starting it. On this host: its pid and start time (and, in this very process,
        whether that engine object still exists). Elsewhere: no heartbeat for START_GRACE."""
        owner = task.claimed_by
        claimed = task.claimed_at or task.updated_at
        parsed = _parse_owner(owner)
        if parsed is None or parsed[0] != _HOST:
            if now - claimed > START_GRACE:
                where = f" on {parsed[0]}" if parsed else ""
                return (f"its engine{where} gave no sign of life for {START_GRACE:g} s while "
                        "starting it")
            return None
        _host, pid, start = parsed
        if pid == os.getpid():
            alive = owner in _LIVE_OWNERS
        elif start is None:  # a claim from before start times were recorded
            alive = procs.is_alive(pid) and now - claimed <= START_GRACE
        else:
            alive = procs.is_alive(pid, start)
        return None if alive else f"its engine (pid {pid}) stopped while starting it"

    def _requeue_if_abandoned(self, task: Task, now: float,
                              changes: list[TaskChange]) -> None:
        if task.claimed_by == self.owner:
            return  # ours: being started (or its failure already marked)
        why = self._claimer_gone(task, now)
        if why is None:
            return
        if self.store.requeue_claim(task.id, task.claimed_by, task.claimed_at, now,
                                    f"requeued: {why}"):
            changes.append(TaskChange(task.id, task.state, TaskState.QUEUED, "requeued"))

    # --- following ----------------------------------------------------------------------------

    def _runner_identity(self, attempt: Attempt) -> tuple[int | None, str | None]:
        """The runner's pid and /proc start time: from the engine's launch.json or the
        runner's own runner.json (the runner of an engine that died before recording it)."""
        if attempt.dir is None:
            return attempt.runner_pid, None
        for name in (LAUNCH_FILE, RUNNER_FILE):
            rec = read_json(attempt.dir / name)
            pid = rec.get("runner_pid") if rec else None
            if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
                continue
            if attempt.runner_pid is not None and pid != attempt.runner_pid:
                continue
            start = rec.get("runner_start") if rec else None
            return pid, str(start) if isinstance(start, (str, int)) else None
        return attempt.runner_pid, None

    def _runner_state(self, attempt: Attempt) -> str:
        """"alive": the attempt's runner lives (its lock is held); "dead": it ran and is
        gone; "never": no runner was ever spawned for it (a start that did not happen)."""
        assert attempt.dir is not None
        held = lock_held(attempt.dir)
        if held is None:  # no lock file: an attempt from before locks, by pid and start
            if attempt.runner_pid is None and not (attempt.dir / RUNNER_FILE).exists():
                return "never" if not (attempt.dir / EXIT_FILE).exists() else "dead"
            return "alive" if procs.is_alive(*self._runner_identity(attempt)) else "dead"
        if held:
            return "alive"
        if attempt.runner_pid is not None or any(
                (attempt.dir / name).exists() for name in (EXIT_FILE, RUNNER_FILE, LAUNCH_FILE)):
            return "dead"
        return "never"

    def _runner_alive(self, attempt: Attempt) -> bool:
        return attempt.dir is not None and self._runner_state(attempt) == "alive"

    def _adopt(self, attempt: Attempt) -> None:
        """Record the runner an engine started but died before recording."""
        pid, _start = self._runner_identity(attempt)
        if pid is not None and attempt.runner_pid is None:
            self.store.update_attempt(attempt.id, runner_pid=pid)
            attempt.runner_pid = pid
            log.info("adopted the runner %s of task %s", pid, attempt.task_id)

    def _follow_task(self, task: Task, attempt: Attempt | None, now: float,
                     changes: list[TaskChange]) -> None:
        if task.row_error is not None:
            self._mark_broken(task, attempt, task.row_error, changes)
            return
        if attempt is not None and attempt.row_error is not None:
            self._mark_broken(task, attempt, attempt.row_error, changes)
            return
        if attempt is not None and attempt.finished_at is not None:
            # the attempt was closed but the task not moved on (a crash in between)
            self._apply_outcome(task, attempt, attempt.verdict or "crashed",
                                attempt.message or "", now, changes)
            return
        if attempt is None or attempt.dir is None:
            # claimed, not launched: being started, or by an engine that died doing it
            self._requeue_if_abandoned(task, now, changes)
            return
        state = self._runner_state(attempt)
        if state == "never":
            self._requeue_if_abandoned(task, now, changes)
            return
        if state == "alive" and attempt.runner_pid is None:
            self._adopt(attempt)
        fresh = self._read_new(attempt, now)
        task = self._store_summary(task, attempt, now, fresh) or task
        if fresh and task.state == TaskState.STALLED and self.store.update_task(
                task.id, expect_state=TaskState.STALLED, state=TaskState.RUNNING, message=None):
            changes.append(TaskChange(task.id, TaskState.STALLED, TaskState.RUNNING,
                                      "events resumed"))
            task.state = TaskState.RUNNING
        if state == "dead" or (attempt.dir / EXIT_FILE).exists():
            self._finish(task, attempt, changes)
            return
        self._watchdogs(task, attempt, now, changes)

    def _read_new(self, attempt: Attempt, now: float, *, final: bool = False) -> bool:
        """Fold new complete lines of events.jsonl into the attempt's summary."""
        fol = self._follows.get(attempt.id)
        if fol is None:
            fol = _Follow(decoder=stream.StreamDecoder())
            self._follows[attempt.id] = fol
        path = attempt.dir / EVENTS_FILE if attempt.dir is not None else None
        events: list[stream.Event] = []
        with _about(f"could not read the events file {path}"):
            if path is not None:
                try:
                    with open(path, "rb") as fh:
                        fh.seek(fol.offset)
                        # A big backlog is folded in over several ticks (READ_CHUNK each), so
                        # one attempt does not hold the GIL for long; finishing reads it all.
                        while True:
                            data = fh.read(READ_CHUNK)
                            if not data:
                                break
                            fol.offset += len(data)
                            self.ingested_bytes += len(data)
                            events += fol.decoder.feed(data)
                            if not final:
                                break
                except FileNotFoundError:
                    pass
            if final:
                events += fol.decoder.finish()
            self.ingested_events += len(events)
            for ev in events:
                fol.summary.update(ev, at=now)
                if isinstance(ev, stream.Result):
                    fol.result = ev
        return bool(events)

    def _store_summary(self, task: Task, attempt: Attempt, now: float,
                       fresh: bool) -> Task | None:
        fol = self._follows[attempt.id]
        s = fol.summary
        key = (fol.offset, s.turns, s.input_tokens, s.output_tokens, s.last_tool, s.session_id)
        if key == fol.stored:
            return None
        fol.stored = key
        last_event_at = now if fresh else (attempt.last_event_at or None)
        fields_: dict[str, Any] = {"turns": s.turns, "input_tokens": s.input_tokens,
                                   "output_tokens": s.output_tokens, "last_tool": s.last_tool,
                                   "events_offset": fol.offset}
        if s.session_id:
            fields_["session_id"] = s.session_id
        if last_event_at is not None:
            fields_["last_event_at"] = last_event_at
        runner = read_json(attempt.dir / RUNNER_FILE) if attempt.dir is not None else None
        claude_pid = runner.get("claude_pid") if runner else None
        if isinstance(claude_pid, int) and attempt.pid is None:
            fields_["pid"] = claude_pid
            start = runner.get("claude_start") if runner else None
            fields_["pid_start"] = start if isinstance(start, str) else None
        self.store.update_attempt(attempt.id, **fields_)
        # the task shows totals over its attempts; the session is the latest one
        others = [a for a in self.store.list_attempts(task.id) if a.id != attempt.id]
        totals: dict[str, Any] = {
            "turns": s.turns + sum(a.turns for a in others),
            "input_tokens": s.input_tokens + sum(a.input_tokens for a in others),
            "output_tokens": s.output_tokens + sum(a.output_tokens for a in others),
            "last_tool": s.last_tool or task.last_tool,
        }
        if s.session_id:
            totals["session_id"] = s.session_id
        if last_event_at is not None:
            totals["last_event_at"] = last_event_at
        self.store.update_task(task.id, **totals)
        for name, value in totals.items():
            setattr(task, name, value)
        return task

    def _watchdogs(self, task: Task, attempt: Attempt, now: float,
                   changes: list[TaskChange]) -> None:
        """Wall-clock timeout, stall detection, and the SIGKILL after a grace period. The
        runner enforces the timeout and the grace itself; these are the engine's backstop
        (a runner of an older version, or one that hangs)."""
        assert attempt.dir is not None
        kill_rec = _read_kill(attempt.dir / KILL_FILE)
        if kill_rec:
            sent = _as_float(kill_rec.get("at"), now)
            if now - sent >= self.settings.kill_grace + RUNNER_HEADSTART:
                self._signal_attempt(attempt, signal.SIGKILL)
            return
        started = attempt.started_at or now
        limit = task.timeout if task.timeout is not None else self.settings.timeout
        if limit and limit > 0 and now - started > limit + RUNNER_HEADSTART:
            self._request_kill(attempt, "timeout",
                               f"timed out after {limit:g} s (wall clock)")
            return
        last = attempt.last_event_at or started
        fol = self._follows.get(attempt.id)
        if fol is not None and fol.summary.last_activity:
            last = max(last, fol.summary.last_activity)
        idle = now - last
        if idle > self.settings.stall_seconds:
            if task.state == TaskState.RUNNING and self.store.update_task(
                    task.id, expect_state=TaskState.RUNNING, state=TaskState.STALLED,
                    message=f"no event for {idle:.0f} s"):
                changes.append(TaskChange(task.id, TaskState.RUNNING, TaskState.STALLED,
                                          f"no event for {idle:.0f} s"))
            if self.settings.stall_kill:
                self._request_kill(attempt, "stall", f"stalled: no event for {idle:.0f} s")

    # --- killing ------------------------------------------------------------------------------

    def _request_kill(self, attempt: Attempt, reason: str, message: str) -> None:
        """Record why (so any engine that finishes the attempt classifies it right), then
        SIGTERM the runner, which passes it to claude's group and every descendant and
        sends SIGKILL after the kill grace by itself."""
        assert attempt.dir is not None
        path = attempt.dir / KILL_FILE
        if not _read_kill(path):
            write_json_atomic(path, {"reason": reason, "message": message, "at": self.clock(),
                                     "by": self.owner})
        self._signal_attempt(attempt, signal.SIGTERM)

    def _signal_attempt(self, attempt: Attempt, sig: int) -> None:
        pid, start = self._runner_identity(attempt)
        claude = attempt.pid
        if claude is None and attempt.dir is not None:
            rec = read_json(attempt.dir / RUNNER_FILE)
            found = rec.get("claude_pid") if rec else None
            claude = found if isinstance(found, int) and not isinstance(found, bool) else None
        runner_ok = procs.is_alive(pid, start)
        if sig == signal.SIGTERM and runner_ok and pid:
            procs.signal_pid(pid, sig)
            return
        groups = [g for g in (pid, claude) if g]
        if runner_ok and pid:
            procs.signal_tree(pid, sig, groups=groups)
        else:
            # The runner is gone: claude dies with it (pdeathsig); what claude started is
            # found by the attempt's token, wherever it went.
            if claude:
                procs.signal_group(claude, sig)
            self._stop_leftovers(attempt)

    def _stop_leftovers(self, attempt: Attempt) -> int:
        """Stop every process the attempt started that outlived its runner (a Bash step's
        setsid/nohup/double-fork daemon now under pid 1): they carry the attempt's token in
        their environment. Returns how many there were."""
        if attempt.dir is None:
            return 0
        spec = read_json(attempt.dir / SPEC_FILE)
        token = spec.get("token") if spec else None
        if not isinstance(token, str) or not token:
            return 0  # an attempt from before tokens: only claude's group could be told
        found = procs.with_env(TOKEN_ENV, token)
        if found:
            log.warning("task %s: stopping %d process(es) left by its dead runner: %s",
                        attempt.task_id, len(found), found)
            procs.stop(found, LEFTOVER_GRACE)
        return len(found)

    def kill(self, task_id: str) -> None:
        """Stop a task now: SIGTERM to the worker's whole tree, SIGKILL after the grace."""
        task = self.get_task(task_id)
        now = self.clock()
        if task.state in (TaskState.QUEUED, TaskState.WAITING):
            if self.store.update_task(task.id, expect_state=(TaskState.QUEUED,
                                                             TaskState.WAITING),
                                      state=TaskState.KILLED, verdict="killed",
                                      message="killed before it started", finished_at=now,
                                      not_before=None):
                return
            task = self.get_task(task.id)
        if task.state not in ACTIVE_STATES:
            raise FleetError(f"task {task.id} is not running (it is {task.state})")
        # claimed, its runner not launched yet: killed in the store, so that its starter
        # spawns nothing (record_launch refuses)
        if self.store.kill_unlaunched(task.id, now, "killed before it started"):
            return
        task = self.get_task(task.id)
        if task.state not in ACTIVE_STATES:
            raise FleetError(f"task {task.id} is not running (it is {task.state})")
        attempt = self.store.latest_attempt(task.id)
        deadline = time.monotonic() + START_GRACE
        while attempt is None or attempt.dir is None or (
                self._runner_identity(attempt)[0] is None
                and self._runner_state(attempt) == "alive"):
            # being launched this very moment: wait for the runner to be known
            if time.monotonic() > deadline:
                raise FleetError(f"task {task.id} is starting; try again in a moment")
            time.sleep(0.02)
            attempt = self.store.latest_attempt(task.id)
        self._request_kill(attempt, "kill", "killed by the user")
        if not self._wait_runner(attempt, self.settings.kill_grace + RUNNER_HEADSTART):
            self._signal_attempt(attempt, signal.SIGKILL)
            self._wait_runner(attempt, 5.0)
        with self._lock:
            task = self.get_task(task.id)
            if task.state in ACTIVE_STATES:
                try:
                    self._finish(task, attempt, [])
                except Exception as exc:
                    self._on_task_error(task, attempt, exc, [])

    def _wait_runner(self, attempt: Attempt, timeout: float) -> bool:
        pid, _start = self._runner_identity(attempt)
        deadline = time.monotonic() + timeout
        while True:
            child = self._children.get(pid or -1)
            if child is not None:
                child.poll()
            if not self._runner_alive(attempt):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    # --- finishing ----------------------------------------------------------------------------

    def _finish(self, task: Task, attempt: Attempt, changes: list[TaskChange]) -> None:
        """Classify a finished (or dead) attempt and move the task on."""
        assert attempt.dir is not None
        now = self.clock()
        self._read_new(attempt, now, final=True)
        fol = self._follows[attempt.id]
        with _about(f"could not classify the run in {attempt.dir}"):
            verdict, message, exit_code, sig = self._verdict(attempt, fol)
        s = fol.summary
        self.store.update_attempt(
            attempt.id, finished_at=now, exit_code=exit_code, signal=sig, verdict=verdict,
            message=message, turns=s.turns, input_tokens=s.input_tokens,
            output_tokens=s.output_tokens, session_id=s.session_id or attempt.session_id,
            last_tool=s.last_tool, events_offset=fol.offset)
        self._store_summary(task, attempt, now, False)
        self._follows.pop(attempt.id, None)
        self._apply_outcome(task, attempt, verdict, message, now, changes)

    def _verdict(self, attempt: Attempt, fol: _Follow
                 ) -> tuple[str, str, int | None, int | None]:
        """verdict, message, exit code and signal of a finished (or dead) attempt."""
        assert attempt.dir is not None
        exit_path = attempt.dir / EXIT_FILE
        exit_rec, problem = _read_exit(exit_path)
        kill_rec = _read_kill(attempt.dir / KILL_FILE)
        reason = kill_rec.get("reason")
        kill_message = kill_rec.get("message")
        stderr_tail = _tail(attempt.dir / STDERR_FILE)
        result = fol.result.data if fol.result is not None else None
        killed, timed_out = reason in ("kill", "error"), reason in ("timeout", "stall")
        if exit_rec is None:
            # the runner died (or its record is damaged): it may not have cleaned up
            stopped = self._stop_leftovers(attempt)
            if problem is None:
                why = self._no_exit_record(attempt, stopped)
            else:
                why = (f"the exit record {exit_path} is unreadable ({problem}); the verdict "
                       "comes from the events' result")
            if reason in ("kill", "error"):
                return "killed" if reason == "kill" else "crashed", \
                    str(kill_message or "killed"), None, None
            if timed_out:
                return "timeout", str(kill_message or "timed out"), None, None
            if result is None:
                if problem is not None:
                    why = (f"the exit record {exit_path} is unreadable ({problem}) and the "
                           "events hold no result")
                return "crashed", why, None, None
            out = outcome.classify(exit_code=None, result=result, stderr_tail=stderr_tail)
            return str(out.verdict), f"{out.message} ({why})", None, None
        exit_code = exit_rec.get("exit_code")
        sig = exit_rec.get("signal")
        error = exit_rec.get("error")
        if error and reason is None:
            # the launcher refused (no key, no claude, bad settings), or the runner could
            # not record the run (a full disk): say that
            verdict = "auth" if exit_code == 5 and "key" in str(error).lower() else "crashed"
            return verdict, str(error), exit_code, sig
        if reason == "error":
            return "crashed", str(kill_message or "stopped by the engine"), exit_code, sig
        out = outcome.classify(exit_code=exit_code, signal=sig, result=result,
                               stderr_tail=stderr_tail, killed=killed, timed_out=timed_out)
        message = out.message
        if timed_out and kill_message:
            message = str(kill_message)
        return str(out.verdict), message, exit_code, sig

    def _no_exit_record(self, attempt: Attempt, stopped: int) -> str:
        """One sentence on why a dead runner left no exit record."""
        assert attempt.dir is not None
        folder = attempt.dir
        strays = sorted(folder.glob(f".{EXIT_FILE}.*.tmp"))
        for stray in strays:  # half a record helps nobody
            with contextlib.suppress(OSError):
                stray.unlink()
        problem = _write_problem(folder)
        log_path = folder / RUNNER_LOG
        try:
            logged = log_path.stat().st_size > 0
        except OSError:
            logged = False
        if problem is not None:
            message = f"the runner could not write its exit record in {folder}: {problem}"
        elif strays:
            message = (f"the runner died while writing its exit record in {folder} "
                       f"(it left {strays[0].name})")
        else:
            message = ("the runner process died without an exit record (killed from outside, "
                       "or the machine went down?)")
        if logged:
            message += f"; see {log_path}"
        if stopped:
            message += f"; {stopped} process(es) it had started were stopped"
        return message

    def _apply_outcome(self, task: Task, attempt: Attempt, verdict: str, message: str,
                       now: float, changes: list[TaskChange]) -> None:
        s = self.settings
        attempts = self.store.list_attempts(task.id)
        streak = 0
        for att in reversed(attempts):
            if att.verdict in TRANSIENT:
                streak += 1
            else:
                break
        new: TaskState
        not_before: float | None = None
        if verdict == "ok":
            new = TaskState.SUCCEEDED
        elif verdict == "killed":
            new = TaskState.KILLED
        elif verdict in TRANSIENT and streak < s.max_attempts:
            new = TaskState.WAITING
            if verdict == "overload":
                overloads = 0
                for att in reversed(attempts):
                    if att.verdict != "overload":
                        break
                    overloads += 1
                delay = min(s.backoff_cap, s.backoff_base * 2 ** max(0, overloads - 1))
                delay *= self.rng.uniform(0.5, 1.0)
                not_before = now + delay
                nxt = self.settings.small_model if overloads >= s.fallback_after else None
                message = (f"{message} — retry {streak + 1}/{s.max_attempts} in {delay:.1f} s"
                           + (f" on the small model {nxt}" if nxt else ""))
            else:
                not_before = now + s.quota_cooldown
                message = (f"{message} — every task on {task.endpoint} waits "
                           f"{s.quota_cooldown:g} s (quota cooldown), then retries")
        elif verdict in TRANSIENT:
            new = TaskState.FAILED
            message = f"{message} — gave up after {streak} attempts"
        elif verdict == "auth":
            new = TaskState.FAILED
            if "key" not in message:
                message = (f"{message} — check the API key for {task.endpoint}: "
                           "`fleet-tui key set`, or ANTHROPIC_AUTH_TOKEN")
        else:
            new = TaskState.FAILED
        fields_: dict[str, Any] = {"state": new, "verdict": verdict, "message": message,
                                   "not_before": not_before}
        if new != TaskState.WAITING:
            fields_["finished_at"] = now
        if task.worktree is not None and task.base_commit:
            with contextlib.suppress(git.GitError, OSError):
                added, deleted = git.diff_stat(Path(task.worktree), task.base_commit)
                fields_["added_lines"], fields_["deleted_lines"] = added, deleted
        applied: list[TaskState] = []

        def change(current: Task) -> dict[str, Any] | None:
            # Only the attempt the task is on may move it, and only once: another engine may
            # have finished this attempt already and even started the next one.
            if current.state not in ACTIVE_STATES or current.attempt_count != attempt.n:
                return None
            applied.append(current.state)
            return fields_

        self.store.modify_task(task.id, change)
        if applied:
            changes.append(TaskChange(task.id, applied[0], new, message))

    # --- user actions on finished tasks -------------------------------------------------------

    def _require_finished(self, task: Task, action: str) -> None:
        if task.state in CLOSED_STATES:
            raise FleetError(f"task {task.id} was {task.state} already; nothing to {action}")
        if task.state not in FINISHED_STATES:
            raise FleetError(f"task {task.id} is {task.state}; wait for it to finish or "
                             f"kill it (`fleet-tui kill {task.id}`) before you {action} it")

    def retry(self, task_id: str, *, resume: bool = False) -> Task:
        """Queue a new attempt: fresh (worktree reset to the base) or resume the session."""
        task = self.get_task(task_id)
        self._require_finished(task, "retry")
        if resume:
            if not task.session_id:
                raise FleetError(f"task {task.id} has no session to resume (its run never "
                                 "started one); retry it without --resume")
            self.store.add_attempt(task.id, kind="resume", prompt=RESUME_PROMPT,
                                   started_at=None)
        else:
            if task.worktree is not None:
                try:
                    info = git.create_worktree(task.repo, task.id, task.base_commit,
                                               reset=True)
                except git.GitError as exc:
                    raise FleetError(str(exc)) from None
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
        self._require_finished(task, "follow up")
        if not task.session_id:
            raise FleetError(f"task {task.id} has no session to continue (its run never "
                             "started one); retry it instead")
        self.store.add_attempt(task.id, kind="followup", prompt=prompt, started_at=None)
        self.store.update_task(task.id, expect_state=FINISHED_STATES, state=TaskState.QUEUED,
                               verdict=None, message=None, finished_at=None, not_before=None)
        return self.get_task(task.id)

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
        try:
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
        except git.GitError as exc:
            raise FleetError(str(exc)) from None

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
        try:
            return git.conflict_preview(task.repo, task.branch, task.base_branch,
                                        worktree=worktree, secrets=self._secrets(),
                                        strategy=self.settings.merge_strategy)
        except git.GitError as exc:
            raise FleetError(str(exc)) from None

    def merge(self, task_id: str, *, message: str | None = None,
              test_command: str | None = None) -> git.MergeResult:
        """Land a finished task into its base branch (test gate, conflict check), then
        delete its config dir. A refusal comes back as MergeResult(merged=False)."""
        task = self.get_task(task_id)
        self._require_finished(task, "merge")
        if not task.base_branch:
            raise FleetError(f"task {task.id} was started from a commit, not a branch; "
                             f"merge its branch {task.branch} by hand")
        if task.worktree is not None and not Path(task.worktree).is_dir():
            raise FleetRefused(self._missing_worktree(task))
        trailers = {"Fleet-Task": task.id}
        if task.session_id:
            trailers["Fleet-Session"] = task.session_id
        try:
            result = git.merge(task.repo, task.worktree, task.branch, task.base_branch,
                               message=message or task.title or _title_of(task.prompt),
                               trailers=trailers,
                               test_command=test_command or self.settings.test_command,
                               strategy=self.settings.merge_strategy,
                               secrets=self._secrets(fresh=True))
        except git.GitError as exc:
            raise FleetRefused(str(exc)) from None
        if result.merged:
            self._remove_config_dir(task.id)
            self.store.update_task(task.id, state=TaskState.MERGED, message=result.message,
                                   worktree=None)
        return result

    def discard(self, task_id: str) -> None:
        """Throw a task's work away: kill it if running, remove worktree, branch, config."""
        task = self.get_task(task_id)
        if task.state in CLOSED_STATES:
            raise FleetError(f"task {task.id} was {task.state} already")
        if task.state in ACTIVE_STATES or task.state in (TaskState.QUEUED, TaskState.WAITING):
            with contextlib.suppress(FleetError):
                self.kill(task.id)
            task = self.get_task(task.id)
        try:
            git.discard(task.repo, task.worktree, task.branch)
        except git.GitError as exc:
            raise FleetError(str(exc)) from None
        self._remove_config_dir(task.id)
        self.store.update_task(task.id, state=TaskState.DISCARDED, worktree=None,
                               message="discarded", finished_at=task.finished_at
                               or self.clock())

    def _remove_config_dir(self, task_id: str) -> None:
        shutil.rmtree(paths.task_config_dir(task_id, self.env), ignore_errors=True)

    # --- events -------------------------------------------------------------------------------

    def attempt_finished(self, attempt: Attempt) -> bool:
        return attempt.finished_at is not None or (
            attempt.dir is not None and (attempt.dir / EXIT_FILE).exists())

    def read_events(self, attempt: Attempt, offset: int = 0, max_bytes: int | None = None
                    ) -> tuple[list[stream.Event], int]:
        """Parsed events of events.jsonl from `offset` (a byte offset at a line start) and
        the offset to continue from. Works the same for running and finished attempts; a
        last line without newline is only returned once the attempt has finished."""
        if attempt.dir is None:
            return [], offset
        path = attempt.dir / EVENTS_FILE
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(max_bytes) if max_bytes is not None else fh.read()
                at_eof = max_bytes is None or len(data) < max_bytes
                if max_bytes is not None and not at_eof and b"\n" not in data:
                    # one line longer than max_bytes (a big Write): read on to its end, so
                    # that a caller reading chunk by chunk always makes progress
                    while b"\n" not in data[-max(1, max_bytes):]:
                        more = fh.read(max(1, max_bytes))
                        if not more:
                            at_eof = True
                            break
                        data += more
                    if not at_eof:
                        data = data[: data.index(b"\n") + 1]
        except FileNotFoundError:
            return [], offset
        cut = data.rfind(b"\n") + 1
        whole = cut == len(data)
        if not whole and not (at_eof and self.attempt_finished(attempt)):
            data = data[:cut]
        decoder = stream.StreamDecoder()
        events = decoder.feed(data)
        if data and not data.endswith(b"\n"):
            events += decoder.finish()
        return events, offset + len(data)

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
