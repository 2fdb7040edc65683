"""The user's test command, run through the test gate (``testgate``, a small process of
its own): the merge's last check, the merge queue's and the pull-request hook's. The key
is kept out of its environment; nothing it starts outlives it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from fleet_tui.system import paths, procs
from fleet_tui.vcs.keyscan import _needles

# Variables that could carry a credential into a user's test command.
_SECRET_ENV = ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY", "ZHIPU_API_KEY", "GLM_API_KEY")
_TEST_OUTPUT_LIMIT = 64_000
# `python -I` leaves PYTHONPATH and the current folder out of sys.path: the gate is told
# the folder that holds the fleet_tui package (paths.package_root).
_GATE_BOOT = ("import sys; sys.path.insert(0, {root!r}); "
              "from fleet_tui.vcs.testgate import main; raise SystemExit(main(sys.argv[1:]))")


def _read_tail(fh: IO[bytes], limit: int) -> str:
    fh.seek(0, os.SEEK_END)
    size = fh.tell()
    fh.seek(max(0, size - limit))
    text = fh.read().decode("utf-8", "replace")
    return ("[... output cut ...]\n" + text) if size > limit else text


def _stop_gate(proc: subprocess.Popen[bytes]) -> None:
    """Stop the test gate (it stops what the command started), SIGKILL as a last resort."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        procs.signal_tree(proc.pid, signal.SIGKILL, groups=[proc.pid])
        proc.wait()


def _run_test(command: str, cwd: Path, timeout: float,
              secrets: Sequence[str] = (),
              extra_env: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """Run the user's test command in a shell in cwd; (passed, combined output tail).

    Through fleet_tui.vcs.testgate: the command gets a session of its own, its output goes to a
    file (a daemon that inherits it cannot hold the merge up), the merge waits for the
    shell only, and whatever the command leaves running is stopped when it exits or times
    out. The key is kept out of its environment.
    """
    needles = _needles(secrets)
    env = {k: v for k, v in os.environ.items()
           if k not in _SECRET_ENV and not any(n in v for n in needles)}
    env.update(extra_env or {})
    boot = _GATE_BOOT.format(root=str(paths.package_root()))
    with tempfile.TemporaryFile(prefix="fleet-test-") as out:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", boot, str(os.getpid()), command], cwd=cwd,
                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        except OSError as exc:
            return False, f"cannot run the test command: {exc.strerror or exc}"
        timed_out = False
        try:
            code = proc.wait(timeout=timeout if timeout > 0 else None)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop_gate(proc)
            code = proc.returncode
        except BaseException:
            _stop_gate(proc)  # Ctrl-C: nothing of the test may outlive the merge
            raise
        text = _read_tail(out, _TEST_OUTPUT_LIMIT)
    if timed_out:
        return False, text + f"\n[test command timed out after {timeout:g} s]\n"
    if code != 0:
        return False, text + f"\n[test command exited with status {code}]\n"
    return True, text


def run_test_command(command: str, cwd: Path, timeout: float = 600.0,
                     secrets: Sequence[str] = (),
                     extra_env: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """The merge's test gate on its own (the merge queue, the pull-request hook): run
    ``command`` in a shell in ``cwd``; (passed, the tail of its output)."""
    return _run_test(command, Path(cwd), timeout, secrets, extra_env)

