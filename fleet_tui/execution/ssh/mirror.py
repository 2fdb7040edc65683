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
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from fleet_tui.execution.remote import write_at
from fleet_tui.execution.ssh.agent import APPENDED
from fleet_tui.system.files import write_json_atomic

log = logging.getLogger("fleet_tui.engine.fleet")

RECONNECT = 0.5  # seconds between two tries after the stream broke
# how long state() waits for the host's first answer: the engine's pass asks it, so a
# host that does not answer must not hold the pass (the mirror's thread goes on asking)
FIRST_STATE_WAIT = 0.25


def local_offsets(folder: Path) -> dict[str, int]:
    """What the local folder holds of each appended file (where the stream resumes)."""
    out = {}
    for name in APPENDED:
        try:
            out[name] = (folder / name).stat().st_size
        except FileNotFoundError:
            continue
    return out


def _read_exact(stream: IO[bytes], n: int) -> bytes | None:
    data = bytearray()
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


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
            try:
                self._follow_once()
            except Exception as exc:  # the link broke: resume from the local offsets
                log.info("mirror of %s: %s; resuming", self.folder, exc)
            if not self.ended.is_set():
                self.stopping.wait(RECONNECT)
        if self.on_end is not None:
            self.on_end()

    def _follow_once(self) -> None:
        proc = self.open_stream(local_offsets(self.folder))
        self._proc = proc
        self.connects += 1
        try:
            stream = proc.stdout
            assert stream is not None
            while True:
                head_line = stream.readline()
                if not head_line:
                    raise ConnectionError("the stream ended")
                head = json.loads(head_line)
                body = _read_exact(stream, int(head.get("n", 0)))
                if body is None:
                    raise ConnectionError("the stream ended inside a frame")
                if self.on_frame is not None:
                    self.on_frame()
                if "f" in head:
                    self._write(str(head["f"]), head, body)
                if "state" in head:
                    self.state = str(head["state"])
                    self.first.set()
                    if head.get("end"):
                        self.ended.set()
                        return
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
            if proc.stderr is not None:
                proc.stderr.close()

    def _write(self, name: str, head: dict[str, Any], body: bytes) -> None:
        if "/" in name or name.startswith("."):
            raise ValueError(f"the host named a file outside the attempt folder: {name!r}")
        path = self.folder / name
        if head.get("whole"):
            try:
                data = json.loads(body)
            except ValueError:
                return  # a record caught mid-write on the host: the next frame has it
            if isinstance(data, dict):
                write_json_atomic(path, data)
            return
        write_at(path, int(head["o"]), body, sender="the host")

    def wait_first(self, timeout: float = FIRST_STATE_WAIT) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.first.wait(0.05) or self.ended.is_set():
                return True
        return False


__all__ = ["Mirror", "local_offsets"]
