"""The repository lock is fair between processes: a process that releases the lock and
takes it again at once (an engine merging task after task) cannot keep a waiting process
out. The waiter gets the lock after at most a round or two of the looper, not when the
looper stops.

Two real processes on a real lock file: the looper (tests/support/lock_looper.py) logs each time it
holds the lock; this test process asks for the lock several times while it loops and logs
when it asked and when it got it. The figures are counts of the looper's rounds (behaviour),
not durations."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet_tui.vcs import repolock

# rounds of a 20 ms hold against a waiter: other tests' load would change the figures
pytestmark = pytest.mark.serial

LOOPER = Path(__file__).resolve().parents[1] / "support" / "lock_looper.py"
HOLD = 0.02  # the looper's hold per round (s)
MOST_ROUNDS = 400  # the looper stops by itself after this many (8 s), so an unfair lock ends
WAITS = 5  # how many times this process asks for the lock while the looper loops


def rounds_waited(log: list[tuple[str, float]]) -> list[int]:
    """For each of B's waits: how many times A took the lock between B's ask and B's get."""
    counts = []
    asked: float | None = None
    for who, at in log:
        if who == "want":
            asked = at
        elif who == "got" and asked is not None:
            counts.append(sum(1 for w, t in log if w == "A" and asked < t < at))
            asked = None
    return counts


def test_a_waiter_is_not_starved_by_a_process_that_takes_the_lock_again(
        tmp_path: Path) -> None:
    lock, log_file, stop = tmp_path / "repo.lock", tmp_path / "log", tmp_path / "stop"
    looper = subprocess.Popen([sys.executable, str(LOOPER), str(lock), str(log_file),
                               str(stop), str(HOLD), str(MOST_ROUNDS)])
    mine: list[tuple[str, float]] = []
    try:
        deadline = time.monotonic() + 30
        while not log_file.exists() or not log_file.read_text():  # the looper holds it
            assert time.monotonic() < deadline and looper.poll() is None
            time.sleep(0.01)
        for _ in range(WAITS):
            mine.append(("want", time.monotonic()))
            with repolock.hold(lock, "waiting", timeout=60):
                mine.append(("got", time.monotonic()))
                time.sleep(HOLD)
            time.sleep(3 * HOLD)  # let the looper run a few rounds on its own
    finally:
        stop.touch()
        looper.wait(timeout=60)
    assert looper.returncode == 0
    theirs = [("A", float(line.split()[1]))
              for line in log_file.read_text().splitlines()]
    log = sorted(mine + theirs, key=lambda e: e[1])
    counts = rounds_waited(log)
    assert len(counts) == WAITS
    assert sum(1 for w, _ in theirs if w == "A") < MOST_ROUNDS  # stopped by us, not by itself
    assert max(counts) <= 2, f"the looper took the lock {counts} times while we waited"


def test_rounds_waited_counts_the_loopers_turns() -> None:
    log = [("A", 1.0), ("want", 1.5), ("A", 2.0), ("A", 3.0), ("got", 3.5), ("A", 4.0),
           ("want", 4.5), ("got", 4.6)]
    assert rounds_waited(log) == [2, 0]


def test_a_waiter_that_dies_in_the_queue_blocks_no_one(tmp_path: Path) -> None:
    """A process killed while it waits (holding the turnstile) releases it with its life:
    the next process gets the lock once the holder is done."""
    lock = tmp_path / "repo.lock"
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys, time; from fleet_tui.vcs import repolock\n"
                               "with repolock.hold(sys.argv[1], 'holding'):\n"
                               "    print('held', flush=True); time.sleep(1.0)", str(lock)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    waiter = subprocess.Popen([sys.executable, "-c",
                               "import sys; from fleet_tui.vcs import repolock\n"
                               "with repolock.hold(sys.argv[1], 'waiting', timeout=60):\n"
                               "    pass", str(lock)])
    assert _turnstile_taken(str(lock) + repolock.TURNSTILE)  # the waiter is in the queue
    waiter.kill()
    waiter.wait(timeout=30)
    with repolock.hold(lock, "next", timeout=30):
        assert holder.wait(timeout=30) == 0  # we got it after the holder, not before


def _turnstile_taken(path: str) -> bool:
    """Wait (up to 30 s) until another process holds the flock on ``path``."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            time.sleep(0.01)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        time.sleep(0.01)
    return False
