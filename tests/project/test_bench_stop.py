"""`python -m bench` stopped from outside stops everything it started.

A run ended by `timeout` (SIGTERM to the bench process) or by ctrl-c (SIGINT) must not
leave a benchmark's processes behind: a Ray cluster (its nodes run in sessions of their
own, so a signal to the bench's process group misses them), the gateway, the workers.
Each test starts a real benchmark (smoke sizes) with a mark in its environment, which
every process it starts inherits; once the benchmark's own processes are up it signals
the bench process alone, then waits (with a deadline) until no marked process is left.

A process can be born or orphaned while the stop is under way: the stop looks again until
none is left (`test_a_process_born_during_the_stop_is_stopped_too`, without a benchmark).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from fleet_tui.system import procs

ROOT = Path(__file__).resolve().parents[2]
MARK = "FLEET_BENCH_STOP_MARK"


class _Seen:
    """The run's processes: those with the mark in their environment, and the bench
    process's descendants (a Ray cluster's get an environment of their own), each by pid
    and start time, so that a pid reused later is not taken for one of them."""

    def __init__(self, bench: int, mark: str) -> None:
        self.bench, self.mark = bench, mark
        self.pids: dict[int, str] = {}

    def look(self) -> None:
        for pid in {*procs.with_env(MARK, self.mark), *procs.descendants(self.bench)}:
            start = procs.start_time(pid)
            if pid != self.bench and start is not None:
                self.pids.setdefault(pid, start)

    def running(self, word: str) -> bool:
        return any(word in " ".join(procs.cmdline(p)) for p in self.alive())

    def alive(self) -> list[int]:
        return sorted({*(p for p, start in self.pids.items() if procs.is_alive(p, start)),
                       *procs.with_env(MARK, self.mark)} - {self.bench})


def _stop_mid_run(tmp_path: Path, name: str, word: str, sig: signal.Signals,
                  claude: str) -> None:
    mark = uuid.uuid4().hex
    env = dict(os.environ, **{MARK: mark, "FLEET_TEST_CLAUDE": claude})
    bench = subprocess.Popen(
        [sys.executable, "-m", "bench", "--smoke", name, "--out", str(tmp_path / "R.md")],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True)
    seen = _Seen(bench.pid, mark)
    try:
        # mid-benchmark: once one of its own processes (`word` in its command line) runs
        deadline = time.monotonic() + 300
        while True:
            seen.look()
            if seen.running(word):
                break
            assert bench.poll() is None, "the benchmark ended before it was stopped"
            assert time.monotonic() < deadline, f"no {word} process after 300 s"
            time.sleep(0.1)
        seen.look()
        os.kill(bench.pid, sig)  # the bench process alone, as `timeout` signals its child
        _, err = bench.communicate(timeout=120)
        said = err.decode(errors="replace")
        deadline = time.monotonic() + 30
        while left := seen.alive():
            if time.monotonic() > deadline:
                pytest.fail("left running after the stop: " + "; ".join(
                    " ".join(procs.cmdline(p))[:160] for p in left))
            time.sleep(0.1)
        assert bench.returncode == 128 + sig, said[-2000:]
        assert f"stopped by {sig.name}" in said
        # stopped inside its first benchmark: no benchmark finished, no report
        assert not (tmp_path / "R.md").exists()
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        procs.stop(seen.alive(), 2.0)  # whatever a failing run left


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stopped_slots_run_leaves_no_worker_or_gateway(tmp_path: Path, sig: signal.Signals,
                                                       claude_bin: str) -> None:
    """The slots benchmark's workers (detached runners and the real claude) and the
    gateway they go through; before, a SIGTERM left the gateway running."""
    _stop_mid_run(tmp_path, "slots", "claude", sig, claude_bin)


@pytest.mark.xdist_group("ray-host")
@pytest.mark.timeout(420)
def test_stopped_ray_run_leaves_no_cluster(tmp_path: Path, claude_bin: str) -> None:
    """A `timeout` run cut inside the Ray benchmark left its two-node cluster running for
    over an hour: the nodes are sessions of their own."""
    from ray_cluster import ray_missing

    why = ray_missing()
    if why is not None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(why)
        pytest.skip(why)
    _stop_mid_run(tmp_path, "ray", "raylet", signal.SIGTERM, claude_bin)


# A worker as the stop finds it when its cage host has just started bubblewrap: the SIGTERM
# ends bwrap's outer process before the namespace's init (its clone, born after the bench's
# look) has armed its parent-death signal; the init lives on, deaf to a SIGTERM from outside
# its namespace, and the runner would SIGKILL it only at its kill grace, no sooner than the
# bench's SIGKILL of the runner. Here: a SIGTERM makes the worker leave such a process.
WORKER = """
import os, signal, sys, time

def on_term(signum, frame):
    if os.fork() == 0:  # born during the stop, deaf to SIGTERM, never killed by its parent
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(60)
    os._exit(0)  # as bwrap's outer process: ended by the SIGTERM, its child left behind
signal.signal(signal.SIGTERM, on_term)
print("up", flush=True)
while True:
    time.sleep(60)
"""

# `python -m bench`'s stop, as main() runs it after a SIGTERM: a child subreaper, its
# benchmark's processes up, then `_stop_leftovers` (a grace of 2 s: time enough, on a
# loaded machine, for the worker to fork before a SIGKILL would make the test moot)
STOPPER = """
import subprocess, sys
from bench.__main__ import _stop_leftovers
from fleet_tui.system import procs

procs.set_child_subreaper()
worker = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
assert worker.stdout.readline() == b"up\\n"
print(len(_stop_leftovers(grace=2.0)), flush=True)
"""


def test_a_process_born_during_the_stop_is_stopped_too() -> None:
    """A process born (or orphaned) after the stop first looked is stopped too: a single
    look left a caged worker's bubblewrap behind, adopted by the bench once its runner was
    killed, and alive after the bench ended."""
    if procs.PORTABLE:
        pytest.skip("the stop adopts orphans as a child subreaper: a Linux extra")
    mark = uuid.uuid4().hex
    try:
        stopper = subprocess.run(
            [sys.executable, "-c", STOPPER, WORKER], cwd=ROOT,
            env=dict(os.environ, **{MARK: mark}), capture_output=True, timeout=120)
        assert stopper.returncode == 0, stopper.stderr.decode(errors="replace")[-2000:]
        deadline = time.monotonic() + 10
        while left := procs.with_env(MARK, mark):
            if time.monotonic() > deadline:
                pytest.fail("left running after the stop: " + "; ".join(
                    " ".join(procs.cmdline(p))[:160] for p in left))
            time.sleep(0.05)
        assert int(stopper.stdout) == 2  # the worker, then what it left
    finally:
        for pid in procs.with_env(MARK, mark):
            procs.signal_pid(pid, signal.SIGKILL)
