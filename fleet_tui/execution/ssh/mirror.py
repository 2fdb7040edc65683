"""The attempt folder mirrored from the host, byte for byte, by offset.

One thread per followed run reads the host agent's `follow` stream: frames of a JSON head
line (`f` the file, `o` its offset or `whole`, `n` the length; or `state`) and the bytes.
An appended file is written at the offset it came from (never past the local end), a whole
record (runner.json, kill.json, exit.json) atomically. The stream starts from what the
local folder holds, so a connection dropped mid-run is resumed where it stopped, and
exit.json comes last, after every byte the runner wrote: once it is here, the folder is
complete, as the local host's would be.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet_tui.execution.worker.frames import APPENDED
from fleet_tui.system.files import write_json_atomic

log = logging.getLogger("fleet_tui.engine.fleet")

RECONNECT = 0.5  # seconds between two tries after the stream broke
# how long state() waits for the host's first answer: the engine's pass asks it, so a
# host that does not answer must not hold the pass (the mirror's thread goes on asking)
FIRST_STATE_WAIT = 0.25
READ_SIZE = 1 << 18  # at most this much of the stream per read (the agent's CHUNK)


def local_offsets(folder: Path) -> dict[str, int]:
    """What the local folder holds of each appended file (where the stream resumes)."""
    out = {}
    for name in APPENDED:
        try:
            out[name] = (folder / name).stat().st_size
        except FileNotFoundError:
            continue
    return out


class _Appended:
    """The appended files of one stream, each opened once: the bytes from `at` written at
    the local end (what the folder holds already is skipped, never a gap left)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.open: dict[str, tuple[int, int]] = {}  # name -> (fd, its size)

    def write(self, name: str, at: int, body: bytes) -> None:
        found = self.open.get(name)
        if found is None:
            fd = os.open(self.folder / name, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            found = fd, os.fstat(fd).st_size
            self.open[name] = found
        fd, size = found
        if at > size:
            raise ValueError(f"{name}: the host sent bytes from {at}, the mirror holds "
                             f"{size}")
        if at + len(body) > size:
            os.pwrite(fd, body[size - at:], size)
            self.open[name] = fd, at + len(body)

    def close(self) -> None:
        for fd, _ in self.open.values():
            os.close(fd)
        self.open.clear()


class Mirror:
    """Follows one attempt folder on the host into its local folder until its runner is
    gone (`state` then holds the end: dead or never)."""

    def __init__(self, folder: Path, open_stream: Callable[[dict[str, int]], Any],
                 on_end: Callable[[], None] | None = None,
                 on_frame: Callable[[], None] | None = None) -> None:
        self.folder = folder
        self.open_stream = open_stream
        self.on_end = on_end
        self.on_frame = on_frame  # each frame: the host answered (its heartbeat included)
        self.started_at = time.monotonic()
        self.state: str | None = None  # alive | dead | never, as the host last said
        self.ended = threading.Event()
        self.first = threading.Event()
        self.stopping = threading.Event()
        self.connects = 0
        self.thread = threading.Thread(target=self._loop, name=f"ssh-mirror {folder}",
                                       daemon=True)
        self._proc: Any = None

    def start(self) -> Mirror:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()

    def drop(self) -> None:
        """Cut the current stream (as a dropped connection would); it resumes."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()

    def _loop(self) -> None:
        while not self.stopping.is_set() and not self.ended.is_set():
            began = time.monotonic()
            try:
                self._follow_once()
            except Exception as exc:  # the link broke: resume from the local offsets
                log.info("mirror of %s: %s; resuming", self.folder, exc)
            # a stream that ran a while and broke (a dropped master) is made again at once:
            # its new master forwards the ports the host's workers reach this machine by,
            # and each moment without them is a request of theirs refused; one that broke
            # at once waits before the next try
            if not self.ended.is_set() and time.monotonic() - began < RECONNECT:
                self.stopping.wait(RECONNECT)
        if self.on_end is not None:
            self.on_end()

    def _follow_once(self) -> None:
        proc = self.open_stream(local_offsets(self.folder))
        self._proc = proc
        self.connects += 1
        files = _Appended(self.folder)
        try:
            stream = proc.stdout
            assert stream is not None
            # one read per wake-up of the stream, its frames cut out of the buffer here (a
            # remote worker's event costs this thread one wake-up, one pwrite: the
            # controller's CPU per followed worker is mostly that wake-up)
            buf = bytearray()
            while True:
                chunk = stream.read1(READ_SIZE)
                if not chunk:
                    raise ConnectionError("the stream ended" if not buf
                                          else "the stream ended inside a frame")
                buf += chunk
                used = 0
                while True:
                    eol = buf.find(b"\n", used)
                    if eol < 0:
                        break
                    head = json.loads(buf[used:eol])
                    end = eol + 1 + int(head.get("n", 0))
                    if end > len(buf):
                        break
                    body = bytes(buf[eol + 1:end])
                    used = end
                    if self.on_frame is not None:
                        self.on_frame()
                    if "f" in head:
                        self._write(files, str(head["f"]), head, body)
                    if "state" in head:
                        self.state = str(head["state"])
                        self.first.set()
                        if head.get("end"):
                            self.ended.set()
                            return
                if used:
                    del buf[:used]
        finally:
            files.close()
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
            if proc.stderr is not None:
                proc.stderr.close()

    def _write(self, files: _Appended, name: str, head: dict[str, Any], body: bytes) -> None:
        if "/" in name or name.startswith("."):
            raise ValueError(f"the host named a file outside the attempt folder: {name!r}")
        if head.get("whole"):
            try:
                data = json.loads(body)
            except ValueError:
                return  # a record caught mid-write on the host: the next frame has it
            if isinstance(data, dict):
                write_json_atomic(self.folder / name, data)
            return
        files.write(name, int(head["o"]), body)

    def wait_first(self, timeout: float = FIRST_STATE_WAIT) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.first.wait(0.05) or self.ended.is_set():
                return True
        return False


__all__ = ["Mirror", "local_offsets"]
