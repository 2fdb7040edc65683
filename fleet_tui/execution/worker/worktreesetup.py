"""The worktree made ready before claude starts in it: the files the repository's settings
include copied in, then its setup command run (its own process group, the worker's
environment without any credential, the worker's cage when the worker is caged, the
runner's wall-clock timeout and signals), each step a `system/fleet_setup` line in the
stream. A failed step fails the attempt before claude starts, so before any token is spent.

Standard library only, as the runner that uses it (it runs on every host).
"""

from __future__ import annotations

import json
import os
import subprocess
import time

from fleet_tui.core import redaction
from fleet_tui.execution.worker import cage, cagehost, prepare

TYPE_CHECKING = False
if TYPE_CHECKING:  # a runner starts per attempt: typing would cost each one ~5 ms
    from collections.abc import Mapping
    from pathlib import Path
    from typing import Any

    from fleet_tui.execution.worker.runner import Runner
    from fleet_tui.execution.worker.spec import RunSpec

SETUP_TAIL = 64 * 1024  # characters of the setup's output in the stream (setup.log: all)
SETUP_READ = 4 * SETUP_TAIL  # bytes of setup.log read back for it


def strerror(exc: OSError) -> str:
    return exc.strerror or str(exc)


class WorktreeSetup:
    """One attempt's preparation of its worktree, on the runner's records and signals."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def _line(self, record: dict[str, Any]) -> None:
        """One `system/fleet_setup` line in events.jsonl (before claude writes there)."""
        line = json.dumps({"type": "system", "subtype": "fleet_setup", **record},
                          sort_keys=True) + "\n"
        try:
            with open(self.runner.log.events, "ab") as fh:
                fh.write(line.encode("utf-8", "replace"))
        except OSError as exc:
            self.runner._log(f"could not write the setup step to {self.runner.log.events}: "
                             f"{strerror(exc)}")

    def run(self, spec: RunSpec, env: Mapping[str, str], secrets: list[str]) -> int | None:
        """Copy the included files and run the setup command in a new worktree; None when
        it is ready, else the runner's exit status (the exit record says what failed:
        the attempt fails before claude starts, so before any token is spent)."""
        started = time.monotonic()
        self._line({"phase": "start", "command": spec.setup, "include": list(spec.include)})
        copied: list[str] = []
        skipped: list[str] = []
        problem: str | None = None
        if spec.include:
            try:
                files = prepare.included_files(spec.repo or spec.cwd, spec.include)
                copied, missed = prepare.copy_included(spec.repo or spec.cwd, spec.cwd,
                                                       files, secrets)
                skipped = [f"{path}: {why}" for path, why in missed]
            except (OSError, subprocess.SubprocessError) as exc:
                problem = f"could not copy the included files: {exc}"
        code: int | None = 0
        output = ""
        if problem is None and spec.setup:
            code, output = self._run_setup(spec, env, secrets)
        seconds = round(time.monotonic() - started, 3)
        tail = output[-SETUP_TAIL:]
        self._line({"phase": "end", "command": spec.setup, "exit_code": code,
                    "output": tail, "truncated": len(output) > len(tail),
                    "copied": copied, "skipped": skipped, "seconds": seconds,
                    "error": problem})
        if self.runner.received is not None or self.runner.term_at is not None:
            sig = self.runner.received
            return self.runner._end(128 + sig if sig else 1,
                                    exit_code=code if code else None, sig=sig, error=None)
        if problem is not None:
            return self.runner._end(1, exit_code=1, error=f"setup: {problem}")
        if code != 0:
            lines = [line for line in output.splitlines() if line.strip()]
            last = f": {lines[-1].strip()[:300]}" if lines else ""
            status = f"exit {code}" if code is not None and code >= 0 else \
                f"killed by signal {-(code or 0)}"
            return self.runner._end(1, exit_code=code if code and code > 0 else 1, error=(
                f"the setup command `{spec.setup}` failed ({status}){last} (its whole "
                "output is in the stream; claude did not start)"))
        try:
            prepare.mark_set_up(spec.cwd, {"at": time.time(), "attempt": spec.attempt,
                                           "setup": spec.setup, "copied": copied})
        except OSError as exc:
            self.runner._log(f"could not mark {spec.cwd} as set up: {strerror(exc)}")
        return None

    def _run_setup(self, spec: RunSpec, env: Mapping[str, str], secrets: list[str]
                   ) -> tuple[int | None, str]:
        """Run the setup command (its own process group, the worker's environment
        without any credential, our wall-clock timeout and signals); (exit status, its
        output with the key redacted). A negative status is the signal that ended it."""
        preexec = self.runner.child_preexec()
        clean_env = {k: v for k, v in env.items()
                     if k not in ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY")
                     and not any(s and s in v for s in secrets)}
        argv = ["/bin/sh", "-c", spec.setup or ""]
        settings = self.runner.settings
        if cagehost.caged(settings):
            # the command is the repository's: it runs under the worker's cage rules
            try:
                argv, clean_env = cage.wrap_setup(
                    spec.setup or "", clean_env, attempt_dir=str(self.runner.dir),
                    worktree=spec.cwd, config_dir=spec.config_dir, repo=spec.repo,
                    base_url=settings.base_url, allow_hosts=settings.allow_hosts,
                    events=str(self.runner.log.events))
            except (RuntimeError, OSError) as exc:
                return 1, f"cannot run the setup command in the cage: {exc}"
        try:
            out = open(self.runner.log.setup_log, "wb")  # noqa: SIM115 (closed below)
        except OSError as exc:
            return 1, f"could not write {self.runner.log.setup_log}: {strerror(exc)}"
        with out:
            try:
                self.runner.setup_proc = subprocess.Popen(
                    argv, cwd=spec.cwd, env=clean_env,
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    preexec_fn=preexec, close_fds=True)
            except OSError as exc:
                return 127, f"cannot run the setup command: {strerror(exc)}"
            if self.runner.received is not None:
                self.runner._forward(self.runner.received)
            while True:
                try:
                    code: int | None = self.runner.setup_proc.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    self.runner._watch()
        self.runner.setup_proc = None
        self._redact_file(self.runner.log.setup_log, secrets)
        try:
            with open(self.runner.log.setup_log, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                fh.seek(max(0, size - SETUP_READ))
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            text = ""
        return code, prepare.redact(text, secrets)

    def _redact_file(self, path: Path, secrets: list[str]) -> None:
        """The key never stays in a file of ours: a setup that printed it (it was not in
        its environment, but a file it read may hold it) has it replaced."""
        try:
            data = path.read_bytes()
            hidden = redaction.redact_bytes(data, secrets)
            if hidden != data:
                data = hidden
                write_bytes = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
                with open(write_bytes, "wb") as fh:
                    fh.write(data)
        except OSError as exc:
            self.runner._log(f"could not check {path} for the key: {strerror(exc)}")
