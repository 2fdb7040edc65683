"""The frames of an attempt folder followed on a host: a JSON head and a body, each
appended file sent from the offset already mirrored, the whole files when they change,
exit.json last; heartbeats between. The SSH agent's `follow` writes them to its stdout,
the Ray job to a file; the controller's mirror reads them. Standard library only."""

from __future__ import annotations

import contextlib
import json
import os
import select
import sys
import time
from pathlib import Path

from fleet_tui.execution.worker.attemptlog import AttemptLog
from fleet_tui.execution.worker.runs import runner_state

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO

APPENDED = ("events.jsonl", "stderr.log", "runner.log", "setup.log", "input.jsonl")
WHOLE = ("runner.json", "kill.json", "cage.json")  # cage.json: the attempt ran caged
EXIT = "exit.json"  # sent last, once the runner is gone and every appended byte is out
FOLLOW_POLL = 0.02  # seconds between two looks at the folder without inotify
INOTIFY_IDLE = 0.1  # with inotify: a look this often even when nothing changed (the lock)
HEARTBEAT = 1.0  # a frame at least this often (the controller knows the link lives)
CHUNK = 256 * 1024
def frame(out: BinaryIO, head: dict[str, Any], body: bytes = b"") -> None:
    head["n"] = len(body)
    out.write(json.dumps(head).encode() + b"\n" + body)


def send_new(folder: AttemptLog, out: BinaryIO, offsets: dict[str, int],
              stamps: dict[str, Any]) -> bool:
    """What was appended since `offsets`, and the whole records that changed; True when
    anything was sent."""
    sent = False
    for name in APPENDED:
        path = folder.dir / name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            continue
        at = offsets.get(name, 0)
        if size <= at:
            continue
        with open(path, "rb") as fh:
            fh.seek(at)
            while at < size:
                body = fh.read(min(CHUNK, size - at))
                if not body:
                    break
                frame(out, {"f": name, "o": at}, body)
                at += len(body)
                sent = True
        offsets[name] = at
    for name in WHOLE:
        path = folder.dir / name
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamps.get(name) == stamp:
            continue
        body = path.read_bytes()
        stamps[name] = stamp
        frame(out, {"f": name, "whole": True}, body)
        sent = True
    return sent


class Changes:
    """Wakes the follower when a file of the folder changes (Linux's inotify, through
    libc); elsewhere a plain poll every FOLLOW_POLL seconds."""

    # modify, moved_to, create, delete (not close_write: our own look at the lock opens it
    # for writing, and would wake us at once)
    MASK = 0x2 | 0x80 | 0x100 | 0x200

    def __init__(self, folder: Path) -> None:
        self.fd: int | None = None
        try:
            import ctypes
            import ctypes.util

            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd >= 0 and libc.inotify_add_watch(fd, os.fsencode(folder), self.MASK) >= 0:
                self.fd = fd
            elif fd >= 0:
                os.close(fd)
        except (OSError, AttributeError):
            self.fd = None

    def wait(self) -> None:
        if self.fd is None:
            time.sleep(FOLLOW_POLL)
            return
        ready, _, _ = select.select([self.fd], [], [], INOTIFY_IDLE)
        if ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(self.fd, 65536):
                    pass


def cmd_follow(folder: AttemptLog, given: str) -> int:
    """Stream the folder from the offsets given (JSON: file name -> bytes mirrored) until
    the runner is gone: frames of a JSON head line and its bytes; a state frame first and
    whenever HEARTBEAT passed without a frame (a controller gone ends it: the write
    fails); exit.json last."""
    offsets = {k: int(v) for k, v in (json.loads(given) or {}).items()}
    stamps: dict[str, Any] = {}
    out = sys.stdout.buffer
    beat_at: float | None = None
    changes = Changes(folder.dir)
    while True:
        state = runner_state(folder)  # first: once it is gone, what follows is complete
        sent = send_new(folder, out, offsets, stamps)
        now = time.monotonic()
        if state != "alive":
            exit_rec = folder.dir / EXIT
            if exit_rec.exists():
                frame(out, {"f": EXIT, "whole": True}, exit_rec.read_bytes())
            frame(out, {"state": state, "end": True})
            out.flush()
            return 0
        # the state first, then only when HEARTBEAT passed without a frame: a data frame
        # is the beat (no state frame beside each event: the controller's CPU per worker)
        if beat_at is None or (not sent and now - beat_at >= HEARTBEAT):
            frame(out, {"state": state})
            beat_at = now
        elif sent:
            beat_at = now
        out.flush()
        changes.wait()
