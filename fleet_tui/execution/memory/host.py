"""The in-memory host: attempts with no process, no git and no claude behind them.

It implements the seam (`execution.host`) with runs the caller drives: a run is alive
from its spawn until the test ends it (`finish`, `crash`) or the engine stops it (a stop
request ends it at once, as the newest claude does on SIGTERM: exit 143). What an ended
run leaves is the attempt folder every host leaves (the stream lines, the runner's and the
exit records), written under a folder of the caller's, so the follower judges it exactly
as it judges a real one. The engine's rules (claim, start, adopt, requeue, kill, resume,
the verdicts) are thereby tested in milliseconds (tests/engine/test_host_seam.py).

Pids are above the kernel's largest (2**22), so that nothing is ever signalled by one.
"""

from __future__ import annotations

import json
import shutil
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet_tui.core.errors import FleetError
from fleet_tui.execution.host import Host, LostLedger, NotStarted, Placement, RunnerState
from fleet_tui.execution.worker.attemptlog import AttemptLog, InputClosed, write_json_atomic
from fleet_tui.vcs.git import WorktreeInfo

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from fleet_tui.core.model import Attempt, Task
    from fleet_tui.core.states import StopReason
    from fleet_tui.execution.worker.spec import RunSpec
    from fleet_tui.settings.config import Settings
    from fleet_tui.settings.hosts import HostConfig

PID_BASE = 1 << 22  # above /proc/sys/kernel/pid_max's ceiling: never a real process
BASE_COMMIT = "0" * 40


@dataclass
class MemoryRun:
    """One attempt's run on the in-memory host, as the test sees it."""

    host: MemoryHost
    folder: AttemptLog
    spec: dict[str, Any]
    pid: int
    alive: bool = True
    stop_reason: str | None = None
    inbox: list[str] = field(default_factory=list)
    attempt: Attempt | None = None

    # --- the seam's Run --------------------------------------------------------------------
    @property
    def log(self) -> AttemptLog:
        return self.folder

    def state(self) -> RunnerState:
        return "alive" if self.alive else "dead"

    def identity(self) -> tuple[int | None, str | None]:
        return self.pid, "0"

    def request_stop(self, reason: StopReason, message: str, *, at: float, by: str) -> None:
        self.folder.request_stop(reason, message, at=at, by=by)
        self.stop_reason = str(reason)
        if self.alive:
            self.end(exit_code=143, signal=None, result=None)

    def kill(self) -> None:
        if self.alive:
            self.end(exit_code=None, signal=9, result=None)

    def sweep(self) -> int:
        return 0

    def wait_gone(self, timeout: float) -> bool:
        return not self.alive

    def send_input(self, text: str, *, by: str = "") -> str:
        if not self.alive:
            raise InputClosed("the run has ended")
        self.inbox.append(text)
        return f"m{len(self.inbox)}"

    # --- what the test does ----------------------------------------------------------------
    @property
    def task_id(self) -> str:
        return str(self.spec.get("task_id", ""))

    @property
    def resume(self) -> str | None:
        value = self.spec.get("resume")
        return value if isinstance(value, str) else None

    def stream(self, *lines: dict[str, Any]) -> None:
        """Append stream-json lines to the attempt's events, as claude would print them."""
        with open(self.folder.events, "ab") as out:
            for line in lines:
                out.write(json.dumps(line).encode() + b"\n")

    def finish(self, text: str = "done", *, session_id: str = "s-memory", turns: int = 1,
               is_error: bool = False, exit_code: int = 0) -> None:
        """The worker answered and claude exited."""
        self.stream({"type": "system", "subtype": "init", "session_id": session_id,
                     "model": self.spec.get("model") or "memory"})
        self.end(exit_code=exit_code, signal=None, result={
            "type": "result", "subtype": "error_during_execution" if is_error else "success",
            "is_error": is_error, "num_turns": turns, "result": text,
            "session_id": session_id, "usage": {"input_tokens": 10, "output_tokens": 5}})

    def crash(self) -> None:
        """The runner died without its exit record (killed from outside)."""
        self.alive = False
        self.host.ended.set()

    def end(self, *, exit_code: int | None, signal: int | None,
            result: dict[str, Any] | None) -> None:
        if result is not None:
            self.stream(result)
        write_json_atomic(self.folder.exit_path, {
            "exit_code": exit_code, "signal": signal, "error": None,
            "started_at": self.host.clock(), "finished_at": self.host.clock(),
            "runner_pid": self.pid, "claude_pid": None})
        self.alive = False
        self.host.ended.set()


class MemoryStaged:
    def __init__(self, host: MemoryHost, placement: Placement, spec: RunSpec) -> None:
        self.host = host
        self.placement = placement
        self.spec = spec

    def spawn(self, env: dict[str, str]) -> int:
        return self.host.start_run(self.placement, self.spec)

    def abandon(self) -> None:
        self.host.staged.discard(self.placement.attempt_dir)


class MemoryHost:
    """Runs under `root`; `clock` stamps the exit records (the engine's clock, in tests)."""

    name = "memory"

    def __init__(self, root: Path, *, clock: Any = None, name: str = "memory") -> None:
        import time

        self.name = name
        self.root = Path(root)
        self.clock = clock or time.time
        self.runs: dict[Path, MemoryRun] = {}
        self.staged: set[Path] = set()
        self.ended = threading.Event()
        self.started: list[MemoryRun] = []
        self.collected: list[str] = []  # tasks whose commits were asked for (collect)
        self.released: list[str] = []  # tasks whose placements were freed (release)
        self._next_pid = PID_BASE
        self._ports = 20_000

    # --- what the test reads ---------------------------------------------------------------
    def runs_of(self, task_id: str) -> list[MemoryRun]:
        return [r for r in self.started if r.task_id == task_id]

    def live(self) -> list[MemoryRun]:
        return [r for r in self.started if r.alive]

    def run_elsewhere(self, attempt_dir: Path, spec: dict[str, Any]) -> MemoryRun:
        """A runner another engine started (and died before recording): its own record
        is in the folder, the store does not know its pid."""
        self._next_pid += 1
        folder = AttemptLog(attempt_dir)
        folder.write_runner_record({"runner_pid": self._next_pid, "runner_start": "0"})
        run = MemoryRun(self, folder, spec, self._next_pid)
        self.runs[Path(attempt_dir)] = run
        self.started.append(run)
        return run

    # --- the seam's Host -------------------------------------------------------------------
    def free_port(self) -> int:
        self._ports += 1
        return self._ports

    def check_setup(self, settings: Settings, env: Mapping[str, str], *,
                    args: Sequence[str] = (), permission_mode: str | None = None) -> None:
        """Nothing to refuse: no claude runs here."""

    def make_worktree(self, task: Task, *, reattach: bool, reset: bool) -> WorktreeInfo:
        path = self.root / "work" / task.id
        path.mkdir(parents=True, exist_ok=True)
        return WorktreeInfo(path=path, branch=f"fleet/{task.id}",
                            base_commit=task.base_commit or BASE_COMMIT,
                            base_branch=task.base_branch or "main")

    def keep_lost_in(self, ledger: LostLedger) -> None:
        pass  # its runners are this machine's: none is ever lost

    def remote_worktrees(self) -> None:
        return None  # the worktrees are folders of this machine

    def check_worktree(self, task: Task, worktree: Path) -> None:
        if worktree.resolve() == Path(task.repo).resolve():
            raise FleetError(f"refusing to run task {task.id} in the main checkout {task.repo}")

    def place(self, task: Task, worktree: Path, attempt_n: int) -> Placement:
        adir = self.root / "attempts" / task.id / str(attempt_n)
        config = self.root / "config" / task.id
        for folder in (adir, config):
            folder.mkdir(parents=True, exist_ok=True)
        return Placement(host=self.name, worktree=worktree,
                         branch=task.branch or f"fleet/{task.id}",
                         base_commit=task.base_commit or BASE_COMMIT,
                         base_branch=task.base_branch, config_dir=config, attempt_dir=adir)

    def stage(self, placement: Placement, spec: RunSpec) -> MemoryStaged:
        adir = placement.attempt_dir
        run = self.runs.get(adir)
        if (run is not None and run.alive) or adir in self.staged:
            raise NotStarted(f"a run of {adir} lives already")
        folder = AttemptLog(adir)
        folder.clear_run_records()
        folder.write_spec(asdict(spec))
        folder.events.touch()
        self.staged.add(adir)
        return MemoryStaged(self, placement, spec)

    def start_run(self, placement: Placement, spec: RunSpec) -> int:
        adir = placement.attempt_dir
        self.staged.discard(adir)
        self._next_pid += 1
        run = MemoryRun(self, AttemptLog(adir), asdict(spec), self._next_pid)
        self.runs[adir] = run
        self.started.append(run)
        return run.pid

    def attach(self, attempt: Attempt) -> MemoryRun | _Never:
        assert attempt.dir is not None
        run = self.runs.get(Path(attempt.dir))
        if run is None:
            return _Never(AttemptLog(attempt.dir))
        run.attempt = attempt
        return run

    def collect(self, task: Task) -> str:
        self.collected.append(task.id)
        return task.branch

    def release(self, task_id: str) -> None:
        shutil.rmtree(self.root / "config" / task_id, ignore_errors=True)
        self.released.append(task_id)

    def reap(self) -> None:
        pass

    def wait(self, stop: threading.Event, interval: float) -> None:
        if self.ended.is_set():
            self.ended.clear()
            return
        stop.wait(interval)

    def runner_env(self) -> dict[str, str]:
        return {}


class _Never:
    """An attempt folder no run of this host ever used (a start that did not happen)."""

    def __init__(self, folder: AttemptLog) -> None:
        self.log = folder

    def state(self) -> RunnerState:
        return "dead" if self.log.exited else "never"

    def identity(self) -> tuple[int | None, str | None]:
        return None, None

    def request_stop(self, reason: StopReason, message: str, *, at: float, by: str) -> None:
        self.log.request_stop(reason, message, at=at, by=by)

    def kill(self) -> None:
        pass

    def sweep(self) -> int:
        return 0

    def wait_gone(self, timeout: float) -> bool:
        return True

    def send_input(self, text: str, *, by: str = "") -> str:
        raise InputClosed("no run")


def _is_a_host(host: MemoryHost) -> Host:
    """mypy checks here that the in-memory host keeps to the seam."""
    return host


__all__ = ["PID_BASE", "MemoryHost", "MemoryRun"]


def build(config: HostConfig, *, env: Mapping[str, str], python: str) -> MemoryHost:
    """An in-memory host of that name, its folders under this machine's temporary dir
    (the kinds table's entry; tests give theirs to the engine instead)."""
    import tempfile

    return MemoryHost(Path(tempfile.mkdtemp(prefix=f"fleet-memory-{config.name}-")),
                      name=config.name)
