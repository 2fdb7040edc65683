"""The merge's test gate: run the user's test command and leave none of its processes behind.

`git.merge` starts this module as a small process of its own (``python -I -c ...``, see
``testcommand._run_test``) with stdout and stderr on a file. It

- makes itself a child subreaper (Linux), so whatever the command leaves running (`setsid
  sleep &`, a double-forked daemon) is re-parented to it instead of to init and can still
  be found; everywhere, the command and all it starts carry FLEET_TESTGATE_TOKEN, by which
  what left the tree is found too (the only way off Linux, where the gate also watches its
  parent itself instead of a parent-death signal);
- runs ``/bin/sh -c COMMAND`` in a session of its own and waits for that shell only: a
  daemon that keeps the output file open cannot hold the merge up;
- when the shell exits, or when it is told to stop (SIGTERM from the merge's timeout, or
  the death of the process that started it), stops every descendant: SIGTERM, then SIGKILL
  after a short grace, until none is left;
- exits with the shell's status (128 + n for a signal n), or 124 when it was stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import FrameType

from fleet_tui.system import procs

GRACE = 1.0  # seconds between SIGTERM and SIGKILL for what the command left behind
STOPPED = 124


class _Stop(Exception):
    """A stop signal arrived."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise _Stop(signum)


TOKEN_ENV = "FLEET_TESTGATE_TOKEN"
"""Given to the command: what leaves this process's tree (no subreaper off Linux) still
carries it, and is found by it."""


def _ours(me: int, token: str) -> list[int]:
    pids = procs.descendants(me)
    if token:
        pids += [p for p in procs.with_env(TOKEN_ENV, token) if p not in pids]
    return pids


def stop_descendants(grace: float = GRACE, token: str = "") -> int:
    """Signal every descendant of this process (and every process carrying the token)
    until none is left; the number found."""
    me = os.getpid()
    found: set[int] = set()
    for round_no in range(20):
        procs.reap_children()
        pids = _ours(me, token)
        if not pids:
            break
        found.update(pids)
        sig = signal.SIGTERM if round_no == 0 else signal.SIGKILL
        for pid in pids:
            procs.signal_pid(pid, sig)
        deadline = time.monotonic() + (grace if round_no == 0 else 0.5)
        while time.monotonic() < deadline:
            procs.reap_children()
            if not _ours(me, token):
                break
            time.sleep(0.02)
    procs.reap_children()
    return len(found)


def main(argv: list[str]) -> int:
    """argv: [parent pid, command]."""
    if len(argv) != 2 or not argv[0].isdigit():
        sys.stderr.write("usage: testgate PARENT_PID COMMAND\n")
        return 2
    parent, command = int(argv[0]), argv[1]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    procs.set_child_subreaper()
    # Off Linux there is no death signal: the wait below watches the parent itself.
    watch_parent = not procs.set_parent_death_signal(signal.SIGTERM)
    token = os.urandom(12).hex()
    status = STOPPED
    try:
        if os.getppid() != parent:  # the merge died before the death signal was set
            return STOPPED
        shell = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL,
                                 start_new_session=True,
                                 env=dict(os.environ, **{TOKEN_ENV: token}))
        while True:
            try:
                code = shell.wait(timeout=0.2 if watch_parent else None)
                break
            except subprocess.TimeoutExpired:
                if os.getppid() != parent:  # the merge died
                    raise _Stop(signal.SIGTERM) from None
        status = 128 - code if code < 0 else code
    except _Stop:
        status = STOPPED
    except OSError as exc:
        sys.stderr.write(f"cannot run the test command: {exc.strerror or exc}\n")
        status = 127
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        stop_descendants(token=token)
    return status
