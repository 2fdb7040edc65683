"""One detached process per attempt: `python -m fleet_tui.runner ATTEMPT_DIR`.

Why a separate process: the panel (or CLI) that started a worker may close or crash; the
worker must go on and leave a complete record behind. The runner reads `spec.json` (no
secrets), asks the launcher for claude's env and argv (so the key is resolved here, from the
inherited environment or the keyring, and lives only in claude's environment), runs claude
in the worktree, copies its stdout byte for byte to `events.jsonl`, its stderr to
`stderr.log`, and finally writes `exit.json` atomically. `runner.json` is written as soon as
claude runs, so the engine can re-adopt the attempt by pid and /proc start time.

Process hygiene: claude gets its own process group and dies with the runner
(PR_SET_PDEATHSIG); the runner is a child subreaper, so processes that claude's Bash tool
orphans (e.g. a `sleep` in its own group) are reparented here and killed too. SIGTERM,
SIGINT and SIGHUP are passed to claude's group and every descendant.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from fleet_tui import procs

TYPE_CHECKING = False
if TYPE_CHECKING:  # a runner starts per attempt: typing would cost each one ~5 ms
    from collections.abc import Mapping, Sequence
    from types import FrameType
    from typing import Any

SPEC_FILE = "spec.json"
RUNNER_FILE = "runner.json"
EVENTS_FILE = "events.jsonl"
STDERR_FILE = "stderr.log"
EXIT_FILE = "exit.json"
RUNNER_LOG = "runner.log"
KILL_FILE = "kill.json"  # written by the engine before it signals: why (killed/timeout/stall)

# How long leftover descendants get between SIGTERM and SIGKILL once claude has exited.
LEFTOVER_GRACE = 1.0


@dataclass
class RunSpec:
    """What the engine asks one runner to do. Never holds a credential."""

    cwd: str
    prompt: str
    config_dir: str
    args: list[str] = field(default_factory=list)  # extra claude arguments
    model: str | None = None  # overrides the OPUS/SONNET mapping (small-model fallback)
    permission_mode: str | None = None
    max_turns: int | None = None
    resume: str | None = None  # session id for --resume
    settings: dict[str, Any] = field(default_factory=dict)  # load_settings overrides
    task_id: str = ""
    attempt: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("spec.json must hold a JSON object")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def claude_args(spec: RunSpec) -> list[str]:
    """The arguments the runner adds to the launcher's `claude -p` command line."""
    args = ["--output-format", "stream-json", "--verbose"]
    if spec.max_turns:
        args += ["--max-turns", str(int(spec.max_turns))]
    if spec.resume:
        args += ["--resume", spec.resume]
    args += list(spec.args)
    return args


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON to a temporary file and rename it, so readers never see half a record."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(dict(data), fh, indent=2, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from path, or None when missing or unreadable (e.g. being replaced)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class Runner:
    """Runs one claude process for one attempt directory."""

    def __init__(self, attempt_dir: Path, env: Mapping[str, str] | None = None) -> None:
        self.dir = attempt_dir
        self.env = dict(os.environ if env is None else env)
        self.child: subprocess.Popen[bytes] | None = None
        self.child_start: str | None = None
        self.received: int | None = None  # the terminating signal we got, if any
        self.started_at = time.time()
        self.pid = os.getpid()

    # --- signals ---------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        self._forward(signal.SIGTERM if signum == signal.SIGHUP else signum)

    def _forward(self, sig: int) -> None:
        """Pass sig to claude's whole group and to every descendant of the runner."""
        groups = [self.child.pid] if self.child is not None else []
        procs.signal_tree(self.pid, sig, groups=groups)

    def install_signals(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    # --- records ---------------------------------------------------------------------------

    def _write_runner_record(self) -> None:
        write_json_atomic(self.dir / RUNNER_FILE, {
            "runner_pid": self.pid,
            "runner_start": procs.start_time(self.pid),
            "claude_pid": self.child.pid if self.child else None,
            "claude_start": self.child_start,
            "started_at": self.started_at,
        })

    def _write_exit(self, *, exit_code: int | None, sig: int | None = None,
                    error: str | None = None) -> None:
        write_json_atomic(self.dir / EXIT_FILE, {
            "exit_code": exit_code,
            "signal": sig,
            "signal_name": procs.signal_name(sig),
            "received_signal": procs.signal_name(self.received),
            "error": error,
            "started_at": self.started_at,
            "finished_at": time.time(),
            "runner_pid": self.pid,
            "claude_pid": self.child.pid if self.child else None,
        })

    # --- the run ---------------------------------------------------------------------------

    def run(self) -> int:
        """Launch, copy output, clean up, record. Returns the runner's exit status."""
        self.install_signals()
        procs.set_child_subreaper()
        try:
            spec = RunSpec.from_json((self.dir / SPEC_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError, TypeError) as exc:
            self._write_runner_record()
            self._write_exit(exit_code=2, error=f"cannot read {self.dir / SPEC_FILE}: {exc}")
            return 2
        try:
            argv, env = self._plan(spec)
        except _LaunchFailure as exc:
            self._write_runner_record()
            self._write_exit(exit_code=exc.exit_code, error=exc.message)
            return exc.exit_code
        if self.received is not None:  # killed before claude even started
            self._write_runner_record()
            self._write_exit(exit_code=None, sig=self.received, error="killed before start")
            return 128 + self.received
        return self._run_claude(spec, argv, env)

    def _plan(self, spec: RunSpec) -> tuple[list[str], dict[str, str]]:
        from fleet_tui.config_core import ConfigError, load_launch_settings
        from fleet_tui.launcher import LaunchError, plan_launch

        try:
            settings = load_launch_settings(env=self.env, config_file=os.devnull,
                                            overrides=spec.settings)
            plan = plan_launch(settings, claude_args(spec), prompt=spec.prompt,
                               config_dir=Path(spec.config_dir), base_env=self.env,
                               model=spec.model, permission_mode=spec.permission_mode,
                               cwd=Path(spec.cwd), key_handoff=True)
            # The key's one-shot pipe (setting key_helper): its writer is our child, so
            # _clean_leftovers stops it (and it removes the pipe) if claude never reads it.
            plan.start_key_handoff()
        except ConfigError as exc:
            raise _LaunchFailure(str(exc), 2) from None
        except LaunchError as exc:
            raise _LaunchFailure(str(exc), int(getattr(exc, "exit_code", 1) or 1)) from None
        return list(plan.argv), dict(plan.env)

    def _run_claude(self, spec: RunSpec, argv: Sequence[str], env: Mapping[str, str]) -> int:
        parent = self.pid

        def preexec() -> None:  # runs in the child between fork and exec
            os.setpgid(0, 0)
            procs.set_parent_death_signal(signal.SIGKILL)
            if os.getppid() != parent:  # the runner died before the death signal was armed
                os._exit(1)

        events = self.dir / EVENTS_FILE
        stderr_path = self.dir / STDERR_FILE
        # The worktree guard (defect 8) is the engine's; here only refuse a missing cwd.
        if not Path(spec.cwd).is_dir():
            self._write_runner_record()
            self._write_exit(exit_code=2, error=f"the worktree {spec.cwd} does not exist")
            return 2
        procs.preload_libc()
        with open(stderr_path, "ab") as err_fh, open(events, "ab", buffering=0) as out_fh:
            try:
                self.child = subprocess.Popen(
                    list(argv), cwd=spec.cwd, env=dict(env), stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=err_fh, preexec_fn=preexec,
                    close_fds=True)
            except OSError as exc:
                self._write_runner_record()
                self._write_exit(exit_code=127,
                                 error=f"cannot start {argv[0]}: {exc.strerror or exc}")
                return 127
            self.child_start = procs.start_time(self.child.pid)
            self._write_runner_record()
            if self.received is not None:
                self._forward(self.received)
            self._copy_output(out_fh)
        returncode = self._wait_child()
        self._clean_leftovers()
        if returncode < 0:
            self._write_exit(exit_code=None, sig=-returncode)
            return 128 - returncode
        self._write_exit(exit_code=returncode)
        return returncode

    def _copy_output(self, out_fh: Any) -> None:
        """Copy claude's stdout to events.jsonl as it comes (unbuffered: each chunk lands on
        disk at once). Stops at EOF, or shortly after claude exited even if an orphan still
        holds the pipe open."""
        assert self.child is not None and self.child.stdout is not None
        fd = self.child.stdout.fileno()
        os.set_blocking(fd, False)
        exited_at: float | None = None
        while True:
            try:
                ready, _, _ = select.select([fd], [], [], 0.2)
            except InterruptedError:  # pragma: no cover (PEP 475 retries)
                continue
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    chunk = None
                if chunk == b"":
                    break
                if chunk:
                    out_fh.write(chunk)
                    continue
            if self.child.poll() is not None:
                if exited_at is None:
                    exited_at = time.monotonic()
                elif not ready and time.monotonic() - exited_at > 0.5:
                    break
        self.child.stdout.close()

    def _wait_child(self) -> int:
        assert self.child is not None
        while True:
            try:
                return self.child.wait()
            except KeyboardInterrupt:  # pragma: no cover (SIGINT has our handler)
                continue

    def _clean_leftovers(self) -> None:
        """Kill whatever claude left behind (reparented to us as subreaper) and reap it."""
        groups = [self.child.pid] if self.child is not None else []
        hit = procs.signal_tree(self.pid, signal.SIGTERM, groups=groups)
        if hit and not procs.wait_gone(hit, LEFTOVER_GRACE):
            procs.signal_tree(self.pid, signal.SIGKILL, groups=groups)
            procs.wait_gone(hit, LEFTOVER_GRACE)
        procs.reap_children()


class _LaunchFailure(Exception):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0] in ("-h", "--help"):
        sys.stderr.write("usage: python -m fleet_tui.runner ATTEMPT_DIR\n")
        return 2
    attempt_dir = Path(args[0])
    if not attempt_dir.is_dir():
        sys.stderr.write(f"fleet_tui.runner: {attempt_dir} is not a directory\n")
        return 2
    runner = Runner(attempt_dir)
    try:
        return runner.run()
    except Exception as exc:  # the exit record must exist whatever happens
        with contextlib.suppress(OSError):
            if not (attempt_dir / EXIT_FILE).exists():
                runner._write_exit(exit_code=70, error=f"runner failed: {exc!r}")
        raise


if __name__ == "__main__":
    raise SystemExit(main())
