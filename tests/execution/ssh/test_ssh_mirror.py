"""The SSH host's mirror (execution/ssh/mirror.py) against the host agent's real `follow`
(execution/worker/agent.py) run here as a process (the stream ssh would carry, without ssh:
tests/execution/ssh/test_ssh_host.py has the whole path over a real sshd).

The folder on the "host" has a held lock (a live runner, as the agent sees it). Covered:
the mirror byte-identical, appended files bigger than one frame, a stream resumed from
what the local folder holds (the host's state still its first frame), exit.json last once
the lock is free, and frames cut at any byte by the pipe.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_tui.execution.ssh.mirror import Mirror
from fleet_tui.execution.worker.frames import CHUNK

ROOT = Path(__file__).resolve().parents[3]


def wait_for(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"waited {timeout:g} s for {what}"
        time.sleep(0.01)


def follow(remote: Path) -> Callable[[dict[str, int]], subprocess.Popen[bytes]]:
    """The agent's `follow` of `remote`, as the host would run it (its stdout the stream)."""
    def open_stream(offsets: dict[str, int]) -> subprocess.Popen[bytes]:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        return subprocess.Popen(
            [sys.executable, "-m", "fleet_tui.execution.worker.agent", "follow", str(remote),
             json.dumps(offsets)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=env)
    return open_stream


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    folder = tmp_path / "host" / "attempt"
    folder.mkdir(parents=True)
    lock = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # a live runner, as far as the agent sees
    (folder / "runner.json").write_text('{"runner_pid": 1}')
    try:
        yield folder, lock
    finally:
        os.close(lock)


def same(local: Path, remote: Path, name: str) -> bool:
    there = (remote / name).read_bytes()
    return (local / name).exists() and (local / name).read_bytes() == there


def test_the_mirror_follows_resumes_and_ends_byte_identical(remote: tuple[Path, int],
                                                             tmp_path: Path) -> None:
    folder, lock = remote
    local = tmp_path / "local"
    local.mkdir()
    events = folder / "events.jsonl"
    with open(events, "ab") as fh:
        fh.write(b'{"type":"system","n":0}\n')
    mirror = Mirror(local, follow(folder)).start()
    try:
        assert mirror.wait_first(30.0), "no first answer from the agent"
        assert mirror.state == "alive"
        wait_for(lambda: same(local, folder, "events.jsonl"), "the first line")
        big = b"".join(b'{"type":"assistant","n":%d,"pad":"%s"}\n' % (i, b"y" * 900)
                       for i in range(400))  # > the agent's CHUNK: several frames at once
        assert len(big) > CHUNK
        with open(events, "ab") as fh:
            for i in range(1, 30):
                fh.write(b'{"type":"user","n":%d}\n' % i)
                fh.flush()
            fh.write(big)
        (folder / "stderr.log").write_bytes(b"a warning\n")
        wait_for(lambda: same(local, folder, "events.jsonl")
                 and same(local, folder, "stderr.log"), "the appended bytes")
        assert json.loads((local / "runner.json").read_text()) == {"runner_pid": 1}
    finally:
        mirror.stop()
        mirror.thread.join(10)
    assert mirror.connects == 1

    # the link broke: what was written meanwhile comes when a new stream resumes from
    # what the local folder holds, and the host's state is still its first frame
    with open(events, "ab") as fh:
        fh.write(b'{"type":"user","n":"while away"}\n' * 50)
    resumed = Mirror(local, follow(folder)).start()
    try:
        assert resumed.wait_first(30.0)
        assert resumed.state == "alive"
        wait_for(lambda: same(local, folder, "events.jsonl"), "the bytes written meanwhile")
        # the runner ends: every byte, then exit.json, then the end
        with open(events, "ab") as fh:
            fh.write(b'{"type":"result","subtype":"success"}\n')
        (folder / "exit.json").write_text('{"exit_code": 0}')
        fcntl.flock(lock, fcntl.LOCK_UN)
        assert resumed.ended.wait(30.0), "the mirror did not end once the lock was free"
    finally:
        resumed.stop()
        resumed.thread.join(10)
    assert resumed.state == "dead"
    assert same(local, folder, "events.jsonl")
    assert json.loads((local / "exit.json").read_text()) == {"exit_code": 0}


SLICER = r"""
import os, sys, time
data = sys.stdin.buffer.read()
step = int(sys.argv[1])
for at in range(0, len(data), step):
    os.write(1, data[at:at + step])
    time.sleep(0.002)
"""


def frames(*items: tuple[dict[str, Any], bytes]) -> bytes:
    out = b""
    for head, body in items:
        out += json.dumps({**head, "n": len(body)}).encode() + b"\n" + body
    return out


@pytest.mark.parametrize("step", [1, 7, 100])
def test_frames_cut_anywhere_by_the_pipe(tmp_path: Path, step: int) -> None:
    """A stream that arrives a few bytes at a time: every frame whole, in order."""
    lines = [b'{"n":%d,"text":"%s"}\n' % (i, b"z" * (i * 13 % 97)) for i in range(12)]
    stream, at = [], 0
    stream.append(({"state": "alive"}, b""))
    for line in lines:
        stream.append(({"f": "events.jsonl", "o": at}, line))
        at += len(line)
    stream.append(({"f": "events.jsonl", "o": 0}, lines[0]))  # sent again: skipped
    stream.append(({"f": "runner.log", "o": 0}, b"runner says\n"))
    stream.append(({"f": "exit.json", "whole": True}, b'{"exit_code": 3}'))
    stream.append(({"state": "dead", "end": True}, b""))
    data = frames(*stream)
    (tmp_path / "stream").write_bytes(data)
    local = tmp_path / "local"
    local.mkdir()

    def open_stream(offsets: dict[str, int]) -> subprocess.Popen[bytes]:
        with open(tmp_path / "stream", "rb") as source:
            return subprocess.Popen([sys.executable, "-c", SLICER, str(step)], stdin=source,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    mirror = Mirror(local, open_stream).start()
    try:
        assert mirror.ended.wait(60.0), "the mirror did not reach the end frame"
    finally:
        mirror.stop()
        mirror.thread.join(10)
    assert mirror.connects == 1
    assert (local / "events.jsonl").read_bytes() == b"".join(lines)
    assert (local / "runner.log").read_bytes() == b"runner says\n"
    assert json.loads((local / "exit.json").read_text()) == {"exit_code": 3}
    assert mirror.state == "dead"
