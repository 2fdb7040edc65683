"""One detached process per attempt:
`python -m fleet_tui.execution.worker.runner [--lock-fd N] ATTEMPT_DIR`.

Why a separate process: the panel (or CLI) that started a worker may close or crash; the
worker must go on and leave a complete record behind. The runner reads `spec.json` (no
secrets), asks the launcher for claude's env and argv (so the key is resolved here, from the
inherited environment or the keyring, and lives only in claude's environment), runs claude
in the worktree with the prompt on its stdin (an argv is limited to 128 KiB a string),
copies its stdout byte for byte to `events.jsonl`, its stderr to `stderr.log`, and finally
writes `exit.json` atomically.

Steering: claude reads stream-json user messages on its stdin (`--input-format
stream-json`), the prompt first. The runner holds that stdin open and feeds it what senders
leave in the attempt folder's input channel (`AttemptLog.send_input`), so a message reaches
a worker whatever process sends it, and whether or not the panel that started it lives. It
closes the channel and claude's stdin at the end of a turn (a result line) when no message
waits, and at once on a stop; see "claude's stdin and the input channel" below.

One runner per attempt, known before it runs: the attempt folder's `.lock` is flock'ed for
the runner's whole life. The engine takes that lock before it spawns the runner and hands
it over (`--lock-fd`), so from before the spawn until the runner is gone the lock says "a
runner lives here"; a runner that finds the lock held by another refuses to start. The
runner writes `runner.json` (its pid and /proc start time) before anything else, so an
engine that died mid-start is replaced by one that adopts the runner from its record.

Process hygiene: claude gets its own process group and, on Linux, dies with the runner
(the parent-death signal); there the runner is also a child subreaper, so processes that
claude's Bash tool orphans (e.g. a `sleep` in its own group) are reparented here and killed
too. Every process claude starts inherits FLEET_ATTEMPT_TOKEN: the runner's own sweep by it
catches what left claude's tree (everywhere, and the only way off Linux), and the engine's
finds what is left when the runner itself was killed (claude included, off Linux).
SIGTERM, SIGINT and SIGHUP are passed to claude's group and every descendant, and SIGKILL
follows after the kill grace. The runner enforces the wall-clock timeout itself (records
`kill.json` with reason timeout, then stops claude's tree): a run ends on time with no
engine watching.

Files: the runner's own are private (umask 077); claude keeps the user's umask, since it
writes the user's worktree. A full disk does not lose the ending: a small reserve file is
written at the start and the exit record goes into it when no new file can be made.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # the cage host first: node and srt load while the rest loads
    from fleet_tui.execution.worker import cageearly

    cageearly.start(sys.argv[1:])

import contextlib
import fcntl
import json
import select
import signal
import subprocess
import time
from pathlib import Path

from fleet_tui.core.states import StopReason
from fleet_tui.execution.worker import cageearly
from fleet_tui.execution.worker.attemptlog import (
    INPUT_LOCK_WAIT,
    AttemptLog,
    InputClosed,
    write_json_atomic,
)
from fleet_tui.execution.worker.spec import LEFTOVER_GRACE, TOKEN_ENV, RunSpec
from fleet_tui.system import cgroups, pidns, procs
from fleet_tui.system.files import read_and_close

TYPE_CHECKING = False
if TYPE_CHECKING:  # a runner starts per attempt: typing would cost each one ~5 ms
    from collections.abc import Callable, Mapping, Sequence
    from types import FrameType
    from typing import Any

    from fleet_tui.execution.worker.cagehost import WarmCageHost

RESERVE_SIZE = 8192
INPUT_RECHECK = 1.0  # seconds between looks at the inbox when no wake-up byte came
RESULT_LINE_CAP = 16 * 1024 * 1024  # a longer stdout line is never taken for a result line
EX_LOCKED = 75  # another runner holds this attempt: nothing was done (EX_TEMPFAIL)
EX_NO_RECORD = 74  # not even the exit record could be written (EX_IOERR)
CLAUDE_TMP_ENV = "CLAUDE_CODE_TMPDIR"  # where claude keeps its temp files (else $TMPDIR)
TEMP_PREFIX, HELD = "fleet-claude-", "held"  # an uncaged claude's temp folder (own_temp)
_HELD: list[int] = []


# claude reads user messages as stream-json lines on its stdin for as long as it is open, and
# echoes each one on its stdout when it takes it in (checked with 2.1.197 and 2.1.332): the
# first prompt and every steering message go that way, and the stream shows them in place.
INPUT_ARGS = ("--input-format", "stream-json", "--replay-user-messages")


def claude_args(spec: RunSpec) -> list[str]:
    """The arguments the runner adds to the launcher's `claude -p` command line (the prompt
    itself goes to claude's stdin, as the first stream-json user message)."""
    args = ["--output-format", "stream-json", "--verbose", *INPUT_ARGS]
    if spec.max_turns:
        args += ["--max-turns", str(int(spec.max_turns))]
    if spec.resume:
        args += ["--resume", spec.resume]
    args += list(spec.args)
    return args


def user_message(text: str) -> bytes:
    """One stream-json user message for claude's stdin."""
    line = json.dumps({"type": "user", "message": {"role": "user", "content": text}})
    return (line + "\n").encode("utf-8", "replace")


def is_result_line(line: bytes) -> bool:
    """A stdout line is the main agent's `result` line (one per turn; key order is not
    relied on: 2.1.332 writes `type` late). A cheap look first, JSON only to confirm."""
    if b'"result"' not in line or len(line) > RESULT_LINE_CAP:
        return False
    if b'"type":"result"' not in line and b'"type": "result"' not in line:
        return False
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("type") == "result" \
        and not data.get("parent_tool_use_id")


def _strerror(exc: OSError) -> str:
    return exc.strerror or str(exc)


def child_preexec(parent: int, user_umask: int, cgroup: str | None, *,
                  in_namespace: bool) -> Callable[[], None]:
    """A child's step between fork and exec: its own process group, the user's umask, the
    attempt's cgroup or PID namespace, and death with the runner (`parent`)."""

    def preexec() -> None:
        os.setpgid(0, 0)
        os.umask(user_umask)
        if cgroup is not None:
            cgroups.join(cgroup)
        if in_namespace:
            pidns.child_setup()
        procs.set_parent_death_signal(signal.SIGKILL)
        # the runner died before the death signal was armed (in the namespace the
        # runner reads as parent 0; were it gone, the namespace would be too)
        if os.getppid() != (0 if in_namespace else parent):
            os._exit(1)

    return preexec


class Runner:
    """Runs one claude process for one attempt directory."""

    def __init__(self, attempt_dir: Path, env: Mapping[str, str] | None = None, *,
                 lock_fd: int | None = None) -> None:
        self.dir = attempt_dir
        self.log = AttemptLog(attempt_dir)  # every file of the folder, by its owner
        self.env = dict(os.environ if env is None else env)
        self.child: subprocess.Popen[bytes] | None = None
        self.cgroup: str | None = None  # the attempt's cgroup (system/cgroups.py), if any
        self.ns_init: int | None = None  # else its PID namespace's init (system/pidns.py)
        self.contained = ""  # runner.json's word on it (pidns.described reads it)
        self.afresh: str | None = None  # runner.json: why a resume started afresh
        self.child_start: str | None = None
        self.received: int | None = None  # the terminating signal we got, if any
        self.started_at = time.time()
        self.started_mono = time.monotonic()
        self.pid = os.getpid()
        self.lock_fd = lock_fd
        self.reserve_fd: int | None = None
        self.write_error: str | None = None  # why our output could not be written
        self.term_at: float | None = None  # monotonic time SIGTERM went to claude's tree
        self.killed_hard = False
        self.kill_grace = 5.0
        self.timeout: float | None = None
        self.user_umask = 0o022
        # claude's stdin: what is still to be written, and when it is to be closed
        self.stdin_fd: int | None = None
        self.pending = bytearray()
        self.stdin_ending = False  # close it once `pending` is written
        # the input channel (messages from senders): the wake-up fd while it is open
        self.wake_fd: int | None = None
        self.input_closed = False
        self.input_checked = 0.0
        self.results = 0  # result lines seen (one per turn)
        self._line = bytearray()  # the stdout line being written, for the result check
        self._line_over = False  # ... too long to be a result line
        self.setup_proc: subprocess.Popen[bytes] | None = None  # the setup command, running
        self.settings: Any = None  # the launch settings (_plan), for the cage
        # the cage host started before the run is known (node and srt load meanwhile): the
        # child that becomes claude's, its pipe for the order and "go", its output files
        self.warm: WarmCageHost | None = None
        self.warm_files: tuple[int, Any, Any] | None = None
        self.temp_dir: str | None = None  # an uncaged claude's temp folder (own_temp)

    # --- signals ---------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        if self.term_at is None:
            self.term_at = time.monotonic()
        self._forward(signal.SIGTERM if signum == signal.SIGHUP else signum)

    def _forward(self, sig: int) -> None:
        """Pass sig to claude's whole group (or the setup command's) and to every
        descendant of the runner."""
        groups = [p.pid for p in (self.child, self.setup_proc) if p is not None]
        procs.signal_tree(self.pid, sig, groups=groups)

    def install_signals(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _terminate(self) -> None:
        """SIGTERM claude's tree now; `_watch` sends SIGKILL after the kill grace."""
        if self.term_at is None:
            self.term_at = time.monotonic()
        self._forward(signal.SIGTERM)

    def _watch(self) -> None:
        """The wall-clock timeout and the SIGKILL after the grace, checked while copying."""
        now = time.monotonic()
        if self.term_at is None:
            if self.timeout and now - self.started_mono >= self.timeout:
                self._record_kill(StopReason.TIMEOUT,
                                  f"timed out after {self.timeout:g} s (wall clock)")
                self._terminate()
        elif not self.killed_hard and now - self.term_at >= self.kill_grace:
            self.killed_hard = True
            self._forward(signal.SIGKILL)

    def _record_kill(self, reason: StopReason, message: str) -> None:
        """The stop request, unless one is there already (the engine's reason comes first)."""
        try:
            self.log.request_stop(reason, message, at=time.time(), by=f"runner {self.pid}")
        except OSError as exc:
            self._log(f"could not record why the run is stopped in {self.dir}: "
                      f"{_strerror(exc)}")

    # --- records ---------------------------------------------------------------------------

    def _log(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"fleet_tui.execution.worker.runner: {line}\n")
            sys.stderr.flush()

    def _take_lock(self) -> bool:
        """Hold the attempt's lock for our whole life; False: another runner holds it."""
        if self.lock_fd is not None:
            # handed over by the engine, already locked; check it is this attempt's lock
            try:
                mine = os.fstat(self.lock_fd)
                ref = os.stat(self.log.lock_path)
                os.set_inheritable(self.lock_fd, False)
                fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if (mine.st_dev, mine.st_ino) == (ref.st_dev, ref.st_ino):
                    return True
            except BlockingIOError:
                pass
            except OSError as exc:
                self._log(f"the lock fd {self.lock_fd} is unusable: {_strerror(exc)}")
            with contextlib.suppress(OSError):
                os.close(self.lock_fd)
            self.lock_fd = None
        fd = self.log.acquire_lock()
        if fd is None:
            self._log(f"another runner holds {self.log.lock_path}; not starting a second "
                      "one on the same attempt")
            return False
        self.lock_fd = fd
        return True

    def _reserve(self) -> None:
        """Write RESERVE_SIZE bytes now, to be overwritten in place by the exit record when
        the disk is full at the end (overwriting needs no new space)."""
        path = self.log.reserve_path
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            self._log(f"could not make {path}: {_strerror(exc)}")
            return
        try:
            os.pwrite(fd, b" " * RESERVE_SIZE, 0)
            os.fsync(fd)
        except OSError as exc:
            self._log(f"could not fill {path}: {_strerror(exc)}")
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            return
        self.reserve_fd = fd

    def _drop_reserve(self) -> None:
        if self.reserve_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.reserve_fd)
            self.reserve_fd = None
            with contextlib.suppress(OSError):
                os.unlink(self.log.reserve_path)

    def _write_runner_record(self) -> bool:
        try:
            self.log.write_runner_record({
                "runner_pid": self.pid,
                "runner_start": procs.start_time(self.pid),
                "claude_pid": self.child.pid if self.child else None,
                "claude_start": self.child_start,
                "started_at": self.started_at,
                "cgroup": self.cgroup,
                "contained": self.contained,
                "afresh": self.afresh,
            })
        except OSError as exc:
            where = self.log.runner_record_path
            self._log(f"could not write {where}: {_strerror(exc)}")
            if self.child is None:  # before the run: do not start one nobody can follow
                self.write_error = f"could not write {where}: {_strerror(exc)}"
            return False
        return True

    def _write_exit(self, *, exit_code: int | None, sig: int | None = None,
                    error: str | None = None) -> bool:
        record = {
            "exit_code": exit_code,
            "signal": sig,
            "signal_name": procs.signal_name(sig),
            "received_signal": procs.signal_name(self.received),
            "error": error,
            "started_at": self.started_at,
            "finished_at": time.time(),
            "runner_pid": self.pid,
            "claude_pid": self.child.pid if self.child else None,
        }
        path = self.log.exit_path
        try:
            write_json_atomic(path, record)
        except OSError as exc:
            first = exc
        else:
            self._drop_reserve()
            return True
        # No room for a new file: the reserve written at the start takes the record.
        if self.reserve_fd is not None:
            record["record_note"] = (f"written into the reserved space: {path.name} could "
                                     f"not be written ({_strerror(first)})")
            blob = (json.dumps(record, sort_keys=True) + "\n").encode()
            if len(blob) <= RESERVE_SIZE:
                try:
                    os.pwrite(self.reserve_fd, blob + b" " * (RESERVE_SIZE - len(blob)), 0)
                    os.fsync(self.reserve_fd)
                    os.replace(self.log.reserve_path, path)
                except OSError as exc:
                    self._log(f"could not use the reserve for {path}: {_strerror(exc)}")
                else:
                    with contextlib.suppress(OSError):
                        os.close(self.reserve_fd)
                    self.reserve_fd = None
                    return True
        self._log(f"could not write its exit record {path}: {_strerror(first)}")
        return False

    def _end(self, returncode: int, *, exit_code: int | None, sig: int | None = None,
             error: str | None = None) -> int:
        if self.wake_fd is not None:  # whatever ended the run, no message is taken now
            self._close_input()
        if self.cgroup is not None:  # nothing of the attempt outlives its exit record
            cgroups.end(self.cgroup, LEFTOVER_GRACE)
            procs.reap_children()
        if self.ns_init is not None:
            pidns.end(self.ns_init)
        if self.temp_dir is not None:  # claude and all it started have ended
            import shutil

            shutil.rmtree(self.temp_dir, ignore_errors=True)
        if error is None:
            error = self.write_error
        if not self._write_exit(exit_code=exit_code, sig=sig, error=error):
            return EX_NO_RECORD
        return returncode

    # --- the run ---------------------------------------------------------------------------

    def run(self) -> int:
        """Launch, copy output, clean up, record. Returns the runner's exit status."""
        self.user_umask = os.umask(0o077)  # our files are private; claude gets it back
        self.install_signals()
        procs.set_child_subreaper()
        if not self._take_lock():
            return EX_LOCKED
        self._reserve()
        # the attempt's processes all in one cgroup where the machine offers one: found
        # and ended with the attempt, whatever they dropped (group, parent, token)
        contain = pidns.mode(self.env)
        if contain == "auto":
            self.cgroup = cgroups.make(cageearly.cgroup_name(str(self.dir)))
        if self.cgroup is not None:
            self.contained = pidns.CONTAINED_CGROUP
        elif contain == "token":
            self.contained = f"{pidns.NOT_CONTAINED}: {pidns.MODE_ENV}=token"
        self._write_runner_record()  # known before anything runs
        try:
            spec = RunSpec.from_json(self.log.read_spec())
        except (OSError, ValueError, TypeError, RecursionError) as exc:
            return self._end(2, exit_code=2, error=f"cannot read {self.log.spec_path}: {exc}")
        self.kill_grace = _number(spec.kill_grace, 5.0)
        self.afresh = spec.afresh()  # a resume of a session never saved: started afresh
        self.timeout = _number(spec.timeout, 0.0) or None
        if self.write_error is not None:
            return self._end(EX_NO_RECORD, exit_code=None)
        if self.cgroup is None and not self.contained:
            # else a PID namespace: from here on every child of the runner is in it (the
            # warm cage host too, which becomes claude: so it is made before that host)
            made = pidns.make()
            if isinstance(made, int):
                self.ns_init, self.contained = made, pidns.CONTAINED_NAMESPACE
            else:
                self.contained = f"{pidns.NOT_CONTAINED}: no cgroup, and {made}"
            self._write_runner_record()
        self._warm_cage(spec)  # node and srt load while the run is planned and prepared
        try:
            plan = self._plan(spec)
        except _LaunchFailure as exc:
            self._drop_warm()
            return self._end(exc.exit_code, exit_code=exc.exit_code, error=exc.message)
        if self.received is not None:  # killed before claude even started
            self._drop_warm()
            return self._end(128 + self.received, exit_code=None, sig=self.received,
                             error="killed before start")
        argv, env = list(plan.argv), dict(plan.env)
        env.update({k: v for k, v in (spec.env or {}).items()
                    if isinstance(k, str) and isinstance(v, str)})
        if spec.token:
            env[TOKEN_ENV] = spec.token
        # messages sent while the worktree is made ready wait in the inbox
        self._open_input()
        if (spec.include or spec.setup) and Path(spec.cwd).is_dir():
            from fleet_tui.execution.worker import prepare
            from fleet_tui.execution.worker.worktreesetup import WorktreeSetup

            if not prepare.is_set_up(spec.cwd):
                handoff = plan.key_handoff
                secret = handoff.value if handoff is not None else \
                    plan.env.get("ANTHROPIC_AUTH_TOKEN", "")
                failed = WorktreeSetup(self).run(spec, env, [secret] if secret else [])
                if failed is not None:
                    self._drop_warm()
                    self._close_input()
                    self._clean_leftovers(spec.token)
                    return failed
        if self.warm is not None:
            # the order now, after the setup command: srt decides the cage's mount points
            # by what the worktree holds, and a caged setup's own are there while it runs
            try:
                if not self.warm.order(self.settings, spec, argv, env,
                                       attempt_dir=str(self.dir)):
                    self._drop_warm()  # the settings say this worker is not caged after all
            except (RuntimeError, OSError) as exc:
                self._drop_warm()
                self._close_input()
                return self._end(2, exit_code=2, error=str(exc))
        try:
            # The key's one-shot pipe (setting key_helper), started right before claude:
            # its writer is our child, so _clean_leftovers stops it (and it removes the
            # pipe) if claude never reads it.
            plan.start_key_handoff()
        except Exception as exc:  # LaunchError: the pipe or its writer could not be made
            self._drop_warm()
            self._close_input()
            code = int(getattr(exc, "exit_code", 1) or 1)
            return self._end(code, exit_code=code, error=str(exc))
        if self.warm is not None:
            return self._run_claude(spec, argv, env)
        try:  # claude in the worker's cage (setting cage = "worker"), else as it is
            from fleet_tui.execution.worker import cagehost

            if not cagehost.caged(self.settings) and (own := own_temp(env)) is not None:
                self.temp_dir, env = own, {**env, CLAUDE_TMP_ENV: own}
            argv, env = cagehost.wrap(self.settings, spec, argv, env, attempt_dir=str(self.dir))
        except (RuntimeError, OSError) as exc:  # no cage can be built here: claude does not start
            self._close_input()
            if plan.key_handoff is not None:
                plan.key_handoff.cancel()
            return self._end(2, exit_code=2, error=str(exc))
        return self._run_claude(spec, argv, env)

    def _warm_cage(self, spec: RunSpec) -> None:
        """Start the cage host now, before the run is planned, when the worker will most
        likely be caged (cagehost.py): node and srt load meanwhile."""
        from fleet_tui.execution.worker.cagehost import WarmCageHost

        def spawn(argv: Sequence[str], env: Mapping[str, str], go_fd: int
                  ) -> subprocess.Popen[bytes] | None:
            failed = self._spawn(spec, argv, env, go_fd)
            child, self.child = self.child, None  # claude's child only once it is told go
            return child if failed is None else None

        early = cageearly.take()
        if early is not None:
            adopted = WarmCageHost.adopt(early, spec, self.cgroup, self.ns_init is not None,
                                         self.log.events)
            if adopted is not None:
                self.warm, self.warm_files = adopted
                return
            cageearly.drop(early)
        # the attempt's token in its environment from the start, as claude's process has
        # it: what finds the run's processes where no parent-death signal takes them along
        env = dict(self.env, **({TOKEN_ENV: spec.token} if spec.token else {}))
        self.warm = WarmCageHost.start(spec, env, spawn)

    def _drop_warm(self) -> None:
        """End a warm cage host that will not run claude, and close what was opened for it."""
        warm, self.warm = self.warm, None
        if warm is not None:
            warm.drop()
        files, self.warm_files = self.warm_files, None
        if files is not None:
            os.close(files[0])
            files[1].close()
            files[2].close()

    def _plan(self, spec: RunSpec) -> Any:
        from fleet_tui.execution.worker.launch import LaunchError, plan_launch
        from fleet_tui.settings.config_core import ConfigError, load_launch_settings

        try:
            settings = load_launch_settings(env=self.env, config_file=os.devnull,
                                            overrides=spec.settings)
            self.settings = settings
            return plan_launch(settings, claude_args(spec), prompt=None,
                               config_dir=Path(spec.config_dir), base_env=self.env,
                               model=spec.model, permission_mode=spec.permission_mode,
                               cwd=Path(spec.cwd), key_handoff=True)
        except ConfigError as exc:
            raise _LaunchFailure(str(exc), 2) from None
        except LaunchError as exc:
            raise _LaunchFailure(str(exc), int(getattr(exc, "exit_code", 1) or 1)) from None

    def child_preexec(self, *, join_cgroup: bool = True) -> Callable[[], None]:
        """What runs in a child of the runner (claude's, the setup command's) between fork
        and exec (see `child_preexec` below). `join_cgroup=False`: the caller moves the
        child into the cgroup itself, after its exec and before it starts anything."""
        return child_preexec(self.pid, self.user_umask, self.cgroup if join_cgroup else None,
                             in_namespace=self.ns_init is not None)

    def _spawn(self, spec: RunSpec, argv: Sequence[str], env: Mapping[str, str],
               go_fd: int | None = None) -> int | None:
        """Start claude's process (or the warm cage host that becomes it) as the runner's
        child, its stdin a pipe and its output the attempt's files (kept in warm_files).
        None when started, else the runner's exit status (recorded)."""
        # The warm cage host joins the attempt's cgroup after its exec: the first move into
        # a cgroup after a quiet spell waits for the kernel's RCU grace period (~20 ms here),
        # which would delay node's start by as much. It starts nothing before its order
        # comes, and the order is sent after the move.
        late_cgroup = go_fd is not None and self.cgroup is not None
        preexec = self.child_preexec(join_cgroup=not late_cgroup)
        # The guard against running in the main checkout is the engine's; here only refuse
        # a missing cwd.
        if not Path(spec.cwd).is_dir():
            return self._end(2, exit_code=2, error=f"the worktree {spec.cwd} does not exist")
        procs.preload_libc()
        try:
            stdin_r, stdin_w = os.pipe()
            err_fh = open(self.log.stderr, "ab")  # noqa: SIM115 (closed by _run_claude)
            out_fh = open(self.log.events, "ab", buffering=0)  # noqa: SIM115
        except OSError as exc:
            return self._end(EX_NO_RECORD, exit_code=None,
                             error=f"could not prepare the run in {self.dir}: {_strerror(exc)}")
        if go_fd is None and self.wake_fd is None and not self.input_closed:
            self._open_input()
        try:
            # the cage host's order pipe (`--go N`: pass_fds keeps the descriptor's number)
            fds = (go_fd,) if go_fd is not None else ()
            child_argv = [*argv, str(go_fd)] if go_fd is not None else list(argv)
            self.child = subprocess.Popen(
                child_argv, cwd=spec.cwd, env=dict(env), stdin=stdin_r,
                stdout=subprocess.PIPE, stderr=err_fh, preexec_fn=preexec,
                close_fds=True, pass_fds=fds)
        except OSError as exc:
            os.close(stdin_w)
            err_fh.close()
            out_fh.close()
            if go_fd is not None:  # no warm cage host: the run goes on without one
                return 127
            self._close_input()
            return self._end(127, exit_code=127,
                             error=f"cannot start {argv[0]}: {exc.strerror or exc}")
        finally:
            os.close(stdin_r)
        if late_cgroup:
            assert self.cgroup is not None
            cgroups.add(self.cgroup, self.child.pid)
        self.warm_files = (stdin_w, err_fh, out_fh)
        return None

    def _run_claude(self, spec: RunSpec, argv: Sequence[str], env: Mapping[str, str]) -> int:
        if self.warm is None:
            failed = self._spawn(spec, argv, env)
            if failed is not None:
                return failed
        else:  # the warm cage host: its order is in, now it starts claude
            self.child, self.warm = self.warm.go(), None
            if self.wake_fd is None and not self.input_closed:
                self._open_input()
        assert self.child is not None and self.warm_files is not None
        stdin_w, err_fh, out_fh = self.warm_files
        self.warm_files = None
        with err_fh, out_fh:
            os.set_blocking(stdin_w, False)
            self.stdin_fd = stdin_w
            # the prompt is the first user message (no argv limit: a pipe takes any length)
            self.pending += user_message(spec.prompt)
            self.child_start = procs.start_time(self.child.pid)
            self._write_runner_record()
            if self.received is not None:
                self._forward(self.received)
            self._copy_output(out_fh)
        self._close_input()
        self._close_stdin()
        returncode = self._wait_child()
        self._clean_leftovers(spec.token)
        if returncode < 0:
            return self._end(128 - returncode, exit_code=None, sig=-returncode)
        return self._end(returncode, exit_code=returncode)

    # --- claude's stdin and the input channel ----------------------------------------------
    # When claude's stdin closes: at a result line (the end of a turn) with no message
    # waiting in the inbox, the runner closes the channel (a later sender is told the
    # worker finished) and ends claude's stdin once what it holds is written; claude
    # answers everything it read before the end of its input, then exits (checked with
    # 2.1.197 and 2.1.332: a message written right after a result still gets its turn).
    # With messages waiting, they are given to claude and start the next turn, whose own
    # result closes it. A stop (kill, timeout, SIGTERM, a full disk) and claude's exit
    # close both at once, whatever is waiting.

    def _open_input(self) -> None:
        try:
            self.wake_fd = self.log.open_input()
        except OSError as exc:  # no FIFO on this file system: the run goes on, unsteerable
            self._log(f"could not open the input channel in {self.dir}: {_strerror(exc)}; "
                      "the worker takes no messages")
            self.input_closed = True
        self.input_checked = time.monotonic()

    def _take_input(self, *, close: bool = False, close_if_empty: bool = False,
                    look: bool = False) -> bool:
        """Give claude what waits in the inbox; close the channel as asked. True when it
        is closed now. `look`: a periodic look, skipped while a sender holds the lock."""
        if self.input_closed:
            return True
        self.input_checked = time.monotonic()
        try:
            texts, closed = self.log.take_input(close=close, close_if_empty=close_if_empty,
                                                wait=0.0 if look else INPUT_LOCK_WAIT)
        except (OSError, InputClosed) as exc:
            if look and isinstance(exc, InputClosed):
                return False  # the lock was busy: a sender is at it, and wakes us next
            self._log(f"could not read the input channel in {self.dir}: {exc}")
            texts, closed = [], close or close_if_empty
            if closed:
                with contextlib.suppress(OSError):
                    self.log.input_fifo.unlink()
        if self.stdin_fd is not None and not self.stdin_ending:
            for text in texts:
                self.pending += user_message(text)
        if closed:
            self._input_done()
        return closed

    def _close_input(self) -> None:
        """Close the channel (what waits is given to claude while its stdin is open)."""
        if not self.input_closed:
            self._take_input(close=True)
        self._input_done()

    def _input_done(self) -> None:
        self.input_closed = True
        if self.wake_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.wake_fd)
            self.wake_fd = None

    def _drain_wake(self) -> None:
        assert self.wake_fd is not None
        with contextlib.suppress(OSError):
            while os.read(self.wake_fd, 4096):
                pass

    def _end_stdin(self) -> None:
        """Close claude's stdin once what it holds is written."""
        self.stdin_ending = True
        if not self.pending:
            self._close_stdin()

    def _close_stdin(self) -> None:
        self.pending.clear()
        self.stdin_ending = True
        if self.stdin_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.stdin_fd)
            self.stdin_fd = None

    def _flush_stdin(self) -> None:
        if self.stdin_fd is None:
            self.pending.clear()
            return
        try:
            while self.pending:
                written = os.write(self.stdin_fd, self.pending[:65536])
                del self.pending[:written]
        except BlockingIOError:
            return  # the pipe is full: claude reads on, select says when
        except OSError:  # claude is gone (EPIPE) or closed its stdin
            self._close_stdin()
            return
        if self.stdin_ending:
            self._close_stdin()

    def _scan(self, chunk: bytes) -> None:
        """Find the result lines in claude's stdout (whole lines, across chunks)."""
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            if newline < 0:
                piece = chunk[start:]
                if not self._line_over:
                    if len(self._line) + len(piece) > RESULT_LINE_CAP:
                        self._line.clear()
                        self._line_over = True
                    else:
                        self._line += piece
                return
            if self._line or self._line_over:
                line = b"" if self._line_over else bytes(self._line) + chunk[start:newline]
                self._line.clear()
                self._line_over = False
            else:
                line = chunk[start:newline]
            if is_result_line(line):
                self._at_result()
            start = newline + 1

    def _at_result(self) -> None:
        self.results += 1
        if self.stdin_ending:
            return
        if self._take_input(close_if_empty=True):
            self._end_stdin()

    def _stop_input(self) -> None:
        """A stop was asked (kill, timeout, signal, full disk): take no more messages and
        end claude's stdin now."""
        if not self.input_closed:
            self._take_input(close=True)
        if self.stdin_fd is not None:
            self._close_stdin()

    def _copy_output(self, out_fh: Any) -> None:
        """Copy claude's stdout to events.jsonl as it comes (unbuffered: each chunk lands on
        disk at once), feed its stdin (the prompt, then the messages senders leave) and
        watch for the end of a turn. Stops at EOF, or shortly after claude exited even if an
        orphan still holds the pipe open. When events.jsonl cannot be written (a full disk),
        the run is stopped: it would go on unrecorded."""
        assert self.child is not None and self.child.stdout is not None
        fd = self.child.stdout.fileno()
        os.set_blocking(fd, False)
        exited_at: float | None = None
        while True:
            self._watch()
            if self.term_at is not None or self.received is not None:
                self._stop_input()
            readers = [fd] if self.wake_fd is None else [fd, self.wake_fd]
            writers = [self.stdin_fd] if self.stdin_fd is not None and self.pending else []
            try:
                ready, writable, _ = select.select(readers, writers, [], 0.2)
            except InterruptedError:  # pragma: no cover (PEP 475 retries)
                continue
            if writable:
                self._flush_stdin()
            if self.wake_fd is not None and self.wake_fd in ready:
                self._drain_wake()
                self._take_input()
            elif not self.input_closed and \
                    time.monotonic() - self.input_checked > INPUT_RECHECK:
                self._take_input(look=True)
            if self.pending and self.stdin_fd is not None and not writable:
                self._flush_stdin()
            out_ready = fd in ready
            if out_ready:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    chunk = None
                if chunk == b"":
                    break
                if chunk:
                    self._save(out_fh, chunk)
                    self._scan(chunk)
                    continue
            if self.child.poll() is not None:
                if exited_at is None:
                    exited_at = time.monotonic()
                    self._stop_input()
                elif not out_ready and time.monotonic() - exited_at > 0.5:
                    break
        self.child.stdout.close()

    def _save(self, out_fh: Any, chunk: bytes) -> None:
        if self.write_error is not None:
            return  # the run is being stopped; what it prints now has nowhere to go
        view = memoryview(chunk)
        try:
            while view:
                view = view[out_fh.write(view):]
        except OSError as exc:
            self.write_error = (f"could not write {self.log.events}: "
                                f"{_strerror(exc)}; the run was stopped")
            self._log(self.write_error)
            self._terminate()

    def _wait_child(self) -> int:
        assert self.child is not None
        while True:
            try:
                return self.child.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                self._watch()
            except KeyboardInterrupt:  # pragma: no cover (SIGINT has our handler)
                continue

    def _clean_leftovers(self, token: str = "") -> None:
        """Kill whatever claude left behind (reparented to us as subreaper, or carrying the
        attempt's token) and reap it."""
        groups = [self.child.pid] if self.child is not None else []
        # the namespace's init takes no SIGTERM: not waited for here, ended in _end
        hit = [p for p in procs.signal_tree(self.pid, signal.SIGTERM, groups=groups)
               if p != self.ns_init]
        if token:
            marked = [p for p in procs.with_env(TOKEN_ENV, token) if p not in hit]
            hit += [p for p in marked if procs.signal_pid(p, signal.SIGTERM)]
        if hit and not procs.wait_gone(hit, LEFTOVER_GRACE):
            procs.signal_tree(self.pid, signal.SIGKILL, groups=groups)
            for p in hit:
                if procs.is_alive(p):
                    procs.signal_pid(p, signal.SIGKILL)
            procs.wait_gone(hit, LEFTOVER_GRACE)
        if self.cgroup is not None:  # what left the tree and dropped the token too
            cgroups.end(self.cgroup, LEFTOVER_GRACE)
        procs.reap_children()


def own_temp(env: Mapping[str, str]) -> str | None:
    """A temp folder of the run's own for an uncaged claude (CLAUDE_CODE_TMPDIR): claude
    keeps a folder for each session under $TMPDIR/claude-UID/<its working directory> and
    removes none, one more in /tmp for every run; in this one, which the runner removes as
    the run ends, they go with it (a caged claude's go with the cage's private /tmp). None
    where the environment names one already, or none can be made.

    The runner holds a lock on the folder's HELD file for life; a runner killed outright
    cannot remove its folder, so each new one first removes this user's folders whose lock
    is free (flock: released with the process, whatever PID namespace it ran in)."""
    if env.get(CLAUDE_TMP_ENV):
        return None
    import shutil
    import tempfile

    base = tempfile.gettempdir()
    _sweep_temps(base)
    try:  # a short path: claude puts sockets in it
        path = tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=base)
    except OSError:
        return None
    fd = -1
    try:  # locked before it has its name, so a sweep never finds it free
        fd = os.open(os.path.join(path, HELD + ".new"), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(os.path.join(path, HELD + ".new"), os.path.join(path, HELD))
    except OSError:
        if fd >= 0:
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        return None
    _HELD.append(fd)  # open (not inherited) until the runner exits
    return path


def _sweep_temps(base: str) -> None:
    import shutil

    try:
        names = [n for n in os.listdir(base) if n.startswith(TEMP_PREFIX)]
    except OSError:
        return
    for name in names:
        path = os.path.join(base, name)
        try:
            fd = os.open(os.path.join(path, HELD), os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            continue  # not a run's folder, or not this user's
        try:
            if os.fstat(fd).st_uid != os.getuid():
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held: its runner runs
        finally:
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)


def _number(value: Any, default: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    number = float(value)
    return number if number == number and number >= 0 else default  # NaN, negative: default


class _LaunchFailure(Exception):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


# `python -m` this (fleet_tui.runner is the old name, kept for older runners)
RUNNER_MODULE = "fleet_tui.execution.worker.runner"
USAGE = f"usage: python -m {RUNNER_MODULE} [--lock-fd N] [--env-fd N] ATTEMPT_DIR\n"


def _read_handover(fd: int) -> dict[str, str]:
    """The variables the engine handed over through a pipe (the key's variables: kept out
    of this process's environment, which its worker could read in /proc/PID/environ)."""
    data = json.loads(read_and_close(fd) or b"{}")
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    fds: dict[str, int] = {}
    while len(args) >= 3 and args[0] in ("--lock-fd", "--env-fd") and args[1].isdigit():
        fds[args[0]] = int(args[1])
        args = args[2:]
    if len(args) != 1 or args[0] in ("-h", "--help"):
        sys.stderr.write(USAGE)
        return 2
    attempt_dir = Path(args[0])
    if not attempt_dir.is_dir():
        sys.stderr.write(f"fleet_tui.execution.worker.runner: {attempt_dir} is not a directory\n")
        return 2
    env = dict(os.environ)
    if "--env-fd" in fds:
        try:
            env.update(_read_handover(fds["--env-fd"]))
        except (OSError, ValueError) as exc:  # the run goes on: the launcher says "no key"
            sys.stderr.write(f"{RUNNER_MODULE}: cannot read the handed-over environment: "
                             f"{exc}\n")
    runner = Runner(attempt_dir, env, lock_fd=fds.get("--lock-fd"))
    try:
        return runner.run()
    except Exception as exc:  # the exit record must exist whatever happens
        if runner.lock_fd is not None and not runner.log.exited:
            runner._write_exit(exit_code=70, error=f"runner failed: {exc!r}")
        raise
    finally:
        cageearly.drop()  # started first thing, never taken: the run ended before


if __name__ == "__main__":
    raise SystemExit(main())
