"""The engine: queue, per-endpoint concurrency cap, backoff, cooldown, kill, adoption.

One API for the panel and the headless CLI (see FLEET_API.md). Everything that survives a
restart lives in the store (tasks, attempts, summaries) and in each attempt's directory
(`spec.json`, `events.jsonl`, `stderr.log`, `runner.json`, `exit.json`, `kill.json`), so
any number of fleet-tui processes can share the work: `tick()` claims queued tasks through
the store (the cap holds across processes), follows every running attempt by tailing its
files, and finishes attempts whose exit record appeared, whoever started them. A runner is
a detached process; the engine never holds a pipe to it, so closing the panel loses nothing.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_tui import git, launcher, outcome, paths, procs, stream
from fleet_tui.config import PERMISSION_MODES, Settings
from fleet_tui.runner import (
    EVENTS_FILE,
    EXIT_FILE,
    KILL_FILE,
    RUNNER_FILE,
    RUNNER_LOG,
    SPEC_FILE,
    STDERR_FILE,
    RunSpec,
    read_json,
    write_json_atomic,
)
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

LAUNCH_FILE = "launch.json"  # the engine's record of the runner it started (pid, start time)
RESUME_PROMPT = "Continue the task where you left off, then summarise what you did."
START_GRACE = 60.0  # a claim with no runner after this long is an engine that died mid-start
STDERR_TAIL = 4000
TRANSIENT = ("overload", "quota")
READ_CHUNK = 1 << 20  # bytes of one attempt's events.jsonl folded in per tick (GIL hold)
START_THREADS = 4  # worktrees made and runners spawned at once (git and fork wait on I/O)
CHILD_POLL = 0.01  # while our runners live, run() checks this often whether one exited


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
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.last_error: str | None = None
        self._lock = threading.RLock()
        self._follows: dict[int, _Follow] = {}
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._pool: ThreadPoolExecutor | None = None
        # What the engine has folded in from events files, for the panel and benchmarks.
        self.ingested_events = 0
        self.ingested_bytes = 0

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
        what the cap allows. Safe to call from several processes at once."""
        with self._lock:
            changes: list[TaskChange] = []
            self._reap()
            now = self.clock()
            active = self.store.list_tasks(states=ACTIVE_STATES)
            for task in active:
                try:
                    self._follow_task(task, now, changes)
                except (OSError, StoreError, git.GitError) as exc:
                    log.warning("following task %s: %s", task.id, exc)
            # forget attempts another engine finished (their tasks are no longer active)
            live = {a.id for t in active if (a := self.store.latest_attempt(t.id)) is not None}
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
                claimed.append((task, old))
        if len(claimed) <= 1:
            for task, old in claimed:
                self._start(task, old, changes)
            return
        # Several at once (the cap just opened, or a batch was queued): their worktrees and
        # runners are made in parallel; the tick returns once every one has started or
        # failed, as before.
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=START_THREADS,
                                            thread_name_prefix="fleet-start")
        futures = [self._pool.submit(self._start, task, old, changes) for task, old in claimed]
        for future in futures:
            future.result()

    # --- starting an attempt ------------------------------------------------------------------

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
        """Worktree, config dir, spec.json, runner. A failure fails the task, clearly."""
        try:
            attempt = self._launch(task)
        except (git.GitError, OSError, FleetError, StoreError) as exc:
            message = f"could not start: {exc}"
            now = self.clock()
            if self.store.update_task(task.id, expect_state=ACTIVE_STATES,
                                      state=TaskState.FAILED, verdict="crashed",
                                      message=message, finished_at=now):
                latest = self.store.latest_attempt(task.id)
                if latest is not None and latest.finished_at is None:
                    self.store.update_attempt(latest.id, finished_at=now, verdict="crashed",
                                              message=message)
                changes.append(TaskChange(task.id, old, TaskState.FAILED, message))
            return
        changes.append(TaskChange(task.id, old, TaskState.RUNNING,
                                  f"attempt {attempt.n} started ({attempt.model})"))

    def _launch(self, task: Task) -> Attempt:
        now = self.clock()
        attempts = self.store.list_attempts(task.id)
        worktree = task.worktree
        if worktree is None or not Path(worktree).is_dir():
            # a retry may find what a failed start left behind: then start clean
            info = git.create_worktree(task.repo, task.id, task.base_commit or task.base_ref,
                                       reset=worktree is not None or bool(attempts))
            worktree = info.path
            self.store.update_task(task.id, worktree=info.path, branch=info.branch,
                                   base_commit=task.base_commit or info.base_commit,
                                   base_branch=task.base_branch or info.base_branch)
        # defect 8: never run in the main checkout, whatever happened to the worktree
        git.verify_worktree(Path(worktree), task.branch or f"fleet/{task.id}")
        if Path(worktree).resolve() == Path(task.repo).resolve():
            raise FleetError(f"refusing to run task {task.id} in the main checkout {task.repo}")
        config_dir = paths.task_config_dir(task.id, self.env)
        config_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(config_dir, 0o700)

        pending = attempts[-1] if attempts and attempts[-1].runner_pid is None \
            and attempts[-1].finished_at is None else None
        model = self._model_for(task, attempts)
        if pending is None:
            attempt = self.store.add_attempt(task.id, kind="fresh", prompt=task.prompt,
                                             now=now, model=model)
        else:
            attempt = pending
            attempt.model = model
        adir = paths.attempt_dir(task.repo, task.id, attempt.n)
        adir.mkdir(parents=True, exist_ok=True)
        for stale in (EXIT_FILE, RUNNER_FILE, KILL_FILE, LAUNCH_FILE):
            with contextlib.suppress(FileNotFoundError):
                (adir / stale).unlink()
        resume = task.session_id if attempt.kind in ("resume", "followup") else None
        spec = RunSpec(cwd=str(worktree), prompt=attempt.prompt or task.prompt,
                       config_dir=str(config_dir), args=list(task.extra_args), model=model,
                       permission_mode=task.permission_mode, max_turns=task.max_turns,
                       resume=resume, settings=self._settings_overrides(task),
                       task_id=task.id, attempt=attempt.n)
        tmp = adir / f".{SPEC_FILE}.tmp"
        tmp.write_text(spec.to_json(), encoding="utf-8")
        os.replace(tmp, adir / SPEC_FILE)
        (adir / EVENTS_FILE).touch()
        with open(os.devnull, "rb") as devnull, open(adir / RUNNER_LOG, "ab") as runner_log:
            proc = subprocess.Popen(
                [self.python, "-m", "fleet_tui.runner", str(adir)], cwd=str(adir),
                env=self._runner_env(), stdin=devnull, stdout=runner_log, stderr=runner_log,
                start_new_session=True, close_fds=True)
        self._children[proc.pid] = proc
        runner_start = procs.start_time(proc.pid)
        write_json_atomic(adir / LAUNCH_FILE, {"runner_pid": proc.pid,
                                               "runner_start": runner_start,
                                               "started_at": now, "owner": self.owner})
        self.store.update_attempt(
            attempt.id, runner_pid=proc.pid, started_at=now, model=model, dir=adir,
            events_path=adir / EVENTS_FILE, stderr_path=adir / STDERR_FILE,
            exit_path=adir / EXIT_FILE, config_dir=config_dir, events_offset=0)
        self.store.update_task(task.id, verdict=None, message=None, finished_at=None,
                               last_event_at=None, attempt_count=attempt.n)
        attempt.runner_pid = proc.pid
        attempt.dir = adir
        attempt.started_at = now
        return attempt

    # --- following ----------------------------------------------------------------------------

    def _runner_identity(self, attempt: Attempt) -> tuple[int | None, str | None]:
        if attempt.dir is None:
            return attempt.runner_pid, None
        for name in (LAUNCH_FILE, RUNNER_FILE):
            rec = read_json(attempt.dir / name)
            if rec and rec.get("runner_pid") == attempt.runner_pid and rec.get("runner_start"):
                return attempt.runner_pid, str(rec["runner_start"])
        return attempt.runner_pid, None

    def _runner_alive(self, attempt: Attempt) -> bool:
        pid, start = self._runner_identity(attempt)
        return procs.is_alive(pid, start)

    def _follow_task(self, task: Task, now: float, changes: list[TaskChange]) -> None:
        attempt = self.store.latest_attempt(task.id)
        if attempt is None or attempt.runner_pid is None or attempt.dir is None:
            # claimed but not (yet) started: an engine that died between claim and launch
            claimed = task.claimed_at or task.updated_at
            if (task.claimed_by != self.owner and now - claimed > START_GRACE
                    and self.store.update_task(task.id, expect_state=ACTIVE_STATES,
                                               state=TaskState.QUEUED,
                                               message="requeued: its engine stopped while "
                                                       "starting it")):
                changes.append(TaskChange(task.id, task.state, TaskState.QUEUED, "requeued"))
            return
        if attempt.finished_at is not None:
            # the attempt was closed but the task not moved on (a crash in between)
            self._apply_outcome(task, attempt, attempt.verdict or "crashed",
                                attempt.message or "", now, changes)
            return
        fresh = self._read_new(attempt, now)
        task = self._store_summary(task, attempt, now, fresh) or task
        if fresh and task.state == TaskState.STALLED and self.store.update_task(
                task.id, expect_state=TaskState.STALLED, state=TaskState.RUNNING, message=None):
            changes.append(TaskChange(task.id, TaskState.STALLED, TaskState.RUNNING,
                                      "events resumed"))
            task.state = TaskState.RUNNING
        exit_path = attempt.dir / EXIT_FILE
        if exit_path.exists() or not self._runner_alive(attempt):
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
        if runner and runner.get("claude_pid") and attempt.pid is None:
            fields_["pid"] = runner["claude_pid"]
            fields_["pid_start"] = runner.get("claude_start")
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
        """Wall-clock timeout, stall detection, and the SIGKILL after a grace period."""
        assert attempt.dir is not None
        kill_rec = read_json(attempt.dir / KILL_FILE)
        if kill_rec is not None:
            sent = float(kill_rec.get("at") or now)
            if now - sent >= self.settings.kill_grace:
                self._signal_attempt(attempt, signal.SIGKILL)
            return
        started = attempt.started_at or now
        limit = task.timeout if task.timeout is not None else self.settings.timeout
        if limit and limit > 0 and now - started > limit:
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
        SIGTERM the runner, which passes it to claude's group and every descendant."""
        assert attempt.dir is not None
        path = attempt.dir / KILL_FILE
        if read_json(path) is None:
            write_json_atomic(path, {"reason": reason, "message": message, "at": self.clock(),
                                     "by": self.owner})
        self._signal_attempt(attempt, signal.SIGTERM)

    def _signal_attempt(self, attempt: Attempt, sig: int) -> None:
        pid, start = self._runner_identity(attempt)
        claude = attempt.pid
        if claude is None and attempt.dir is not None:
            rec = read_json(attempt.dir / RUNNER_FILE)
            claude = rec.get("claude_pid") if rec else None
        runner_ok = procs.is_alive(pid, start)
        if sig == signal.SIGTERM and runner_ok and pid:
            procs.signal_pid(pid, sig)
            return
        groups = [g for g in (pid, claude) if g]
        if runner_ok and pid:
            procs.signal_tree(pid, sig, groups=groups)
        else:
            # The runner is gone: only claude's group can be left (pdeathsig kills claude).
            for g in groups:
                if g != pid or runner_ok:
                    procs.signal_group(g, sig)

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
        attempt = self.store.latest_attempt(task.id)
        deadline = time.monotonic() + START_GRACE
        while attempt is None or attempt.runner_pid is None or attempt.dir is None:
            # claimed this very moment: wait for its runner to be recorded
            if time.monotonic() > deadline:
                raise FleetError(f"task {task.id} is starting; try again in a moment")
            time.sleep(0.05)
            attempt = self.store.latest_attempt(task.id)
        self._request_kill(attempt, "kill", "killed by the user")
        if not self._wait_runner(attempt, self.settings.kill_grace):
            self._signal_attempt(attempt, signal.SIGKILL)
            self._wait_runner(attempt, 5.0)
        with self._lock:
            task = self.get_task(task.id)
            if task.state in ACTIVE_STATES:
                self._finish(task, attempt, [])

    def _wait_runner(self, attempt: Attempt, timeout: float) -> bool:
        pid, start = self._runner_identity(attempt)
        deadline = time.monotonic() + timeout
        while True:
            child = self._children.get(pid or -1)
            if child is not None:
                child.poll()
            if not procs.is_alive(pid, start):
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
        exit_rec = read_json(attempt.dir / EXIT_FILE)
        kill_rec = read_json(attempt.dir / KILL_FILE) or {}
        reason = kill_rec.get("reason")
        stderr_tail = _tail(attempt.dir / STDERR_FILE)
        result = fol.result.data if fol.result is not None else None
        exit_code: int | None = None
        sig: int | None = None
        if exit_rec is None:
            verdict, message = "crashed", ("the runner process died without an exit record "
                                           f"(see {attempt.dir / RUNNER_LOG})")
            if reason == "kill":
                verdict, message = "killed", kill_rec.get("message") or "killed"
            elif reason in ("timeout", "stall"):
                verdict, message = "timeout", kill_rec.get("message") or "timed out"
        else:
            exit_code = exit_rec.get("exit_code")
            sig = exit_rec.get("signal")
            error = exit_rec.get("error")
            if error and reason is None:
                # the launcher refused (no key, no claude, bad settings): nothing ran
                verdict = "auth" if exit_code == 5 and "key" in str(error).lower() \
                    else "crashed"
                message = str(error)
            else:
                out = outcome.classify(exit_code=exit_code, signal=sig, result=result,
                                       stderr_tail=stderr_tail, killed=reason == "kill",
                                       timed_out=reason in ("timeout", "stall"))
                verdict, message = str(out.verdict), out.message
                if reason in ("timeout", "stall") and kill_rec.get("message"):
                    message = str(kill_rec["message"])
        s = fol.summary
        self.store.update_attempt(
            attempt.id, finished_at=now, exit_code=exit_code, signal=sig, verdict=verdict,
            message=message, turns=s.turns, input_tokens=s.input_tokens,
            output_tokens=s.output_tokens, session_id=s.session_id or attempt.session_id,
            last_tool=s.last_tool, events_offset=fol.offset)
        self._store_summary(task, attempt, now, False)
        self._follows.pop(attempt.id, None)
        self._apply_outcome(task, attempt, verdict, message, now, changes)

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

    def _worktree_of(self, task: Task) -> Path:
        if task.state in CLOSED_STATES:
            raise FleetError(f"task {task.id} was {task.state}; its worktree is gone")
        if task.worktree is None or not Path(task.worktree).is_dir():
            raise FleetError(f"task {task.id} has no worktree yet (it is {task.state})")
        return Path(task.worktree)

    def diff(self, task_id: str) -> git.Diff:
        task = self.get_task(task_id)
        try:
            return git.diff(self._worktree_of(task), task.base_commit)
        except git.GitError as exc:
            raise FleetError(str(exc)) from None

    def conflict_preview(self, task_id: str) -> git.ConflictPreview:
        task = self.get_task(task_id)
        worktree = self._worktree_of(task)
        if not task.base_branch:
            raise FleetError(f"task {task.id} was started from a commit, not a branch; "
                             "merge its branch by hand")
        try:
            return git.conflict_preview(task.repo, task.branch, task.base_branch,
                                        worktree=worktree)
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
        trailers = {"Fleet-Task": task.id}
        if task.session_id:
            trailers["Fleet-Session"] = task.session_id
        try:
            result = git.merge(task.repo, task.worktree, task.branch, task.base_branch,
                               message=message or task.title or _title_of(task.prompt),
                               trailers=trailers,
                               test_command=test_command or self.settings.test_command,
                               strategy=self.settings.merge_strategy)
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
