"""The suite's CPU profile (tests/support/suite_cpu.py, scripts/suite_cpu.py), run as the
README gives it, on one small test file instead of the whole suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TARGET = ("tests/execution/ssh/test_host_mirror_lock.py::"
          "test_a_worktree_waits_while_another_holds_the_mirrors_lock")


@pytest.mark.long
def test_the_profile_counts_a_tests_cpu_and_the_processes_it_started(tmp_path: Path) -> None:
    out = tmp_path / "suite-cpu"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests" / "support"), SUITE_CPU_DIR=str(out))
    env.pop("PYTEST_XDIST_WORKER", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "suite_cpu", "-p",
                          "no:xdist", "-p", "no:cacheprovider", TARGET],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "main.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [TARGET]
    assert rows[0]["cpu"] > 0 and rows[0]["wall"] > 0
    if os.geteuid() == 0 and Path("/sys/fs/cgroup/cpuacct").is_dir():
        assert rows[0]["procs"].get("agent", 0) >= 1, rows[0]  # the host agent it started
    report = subprocess.run([sys.executable, "scripts/suite_cpu.py", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert report.returncode == 0, report.stderr
    assert "1 tests:" in report.stdout and TARGET in report.stdout
    assert subprocess.run([sys.executable, "scripts/suite_cpu.py", str(tmp_path / "none")],
                          cwd=ROOT, capture_output=True, text=True).returncode == 2


def test_a_fork_seen_before_its_exec_is_counted_as_what_it_execs(tmp_path: Path) -> None:
    """A child caught between its fork and its exec still shows its parent's command line
    (a host agent started by a test looked like pytest, "python"): the poller looks at it
    again until it has exec'd."""
    import threading
    import time

    import suite_cpu

    group = tmp_path / "cgroup.procs"
    group.write_text("")
    stop = threading.Event()
    threading.Thread(target=suite_cpu._poll, args=(group, stop), daemon=True).start()

    def before_exec() -> None:  # in the child, between its fork and its exec
        group.write_text(f"{os.getpid()}\n")
        time.sleep(0.5)

    child = subprocess.Popen(["sleep", "30"], preexec_fn=before_exec)
    try:
        deadline = time.monotonic() + 30
        name = suite_cpu.key(child.pid)
        while suite_cpu._seen.get(name or "") != "sleep":
            assert time.monotonic() < deadline, suite_cpu._seen.get(name or "")
            time.sleep(0.02)
    finally:
        stop.set()
        child.kill()
        child.wait()


def test_the_tests_claude_runs_with_the_jsc_tuning_and_a_bad_option_would_stop_it(
        claude_bin: str) -> None:
    """tests/conftest.py's JSC_TUNING (a cheaper VM for short claude runs) is on in every
    test once the pinned binaries take it; an option JavaScriptCore does not know stops
    claude, which is why conftest tries the options before setting them."""
    from conftest import JSC_TUNING

    assert {name: os.environ.get(name) for name in JSC_TUNING} == JSC_TUNING
    ok = subprocess.run([claude_bin, "--version"], capture_output=True, text=True, timeout=60,
                        stdin=subprocess.DEVNULL)
    assert ok.returncode == 0 and ok.stdout.strip(), ok.stderr
    bad = subprocess.run([claude_bin, "--version"], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL,
                         env=dict(os.environ, BUN_JSC_noSuchOptionHere="1"))
    assert bad.returncode != 0 and "invalid JSC environment variable" in bad.stderr, bad


def test_the_rewritten_test_modules_are_cached_once_for_every_worker(
        tmp_path: Path, pytestconfig: pytest.Config) -> None:
    """tests/support/rewrite_cache.py writes pytest's rewritten pyc of each test module (here
    with PYTHONDONTWRITEBYTECODE set, as in CI, where pytest itself writes none), skips a
    current one, and a pytest run then reads it instead of rewriting the module."""
    import rewrite_cache

    (tmp_path / "test_cached.py").write_text("def test_it():\n    assert 1 + 1 == 2\n")
    (tmp_path / "conftest.py").write_text("")
    assert rewrite_cache.fill(pytestconfig, tmp_path) == 2
    assert len(list((tmp_path / "__pycache__").glob("test_cached.*-pytest-*.pyc"))) == 1
    assert rewrite_cache.fill(pytestconfig, tmp_path) == 0  # current: left as it is
    debug = tmp_path / "debug.log"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTEST_XDIST_WORKER", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p",
                          "no:cacheprovider", f"--debug={debug}", "--rootdir", str(tmp_path),
                          str(tmp_path / "test_cached.py")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    about = [line for line in debug.read_text().splitlines() if "test_cached.py" in line]
    assert any("found cached rewritten pyc" in line for line in about), about
    assert not any("rewriting" in line for line in about), about


def test_the_test_processes_collect_cycles_less_often_than_pythons_defaults() -> None:
    """tests/conftest.py's GC_THRESHOLDS hold in the process running the tests (a full
    collection was ~30 % of a worker's CPU with Python's (700, 10, 10))."""
    import gc

    from conftest import GC_THRESHOLDS

    assert gc.get_threshold() == GC_THRESHOLDS
    assert GC_THRESHOLDS[0] > 700 and GC_THRESHOLDS[2] > 10


def test_a_pid_handed_out_again_is_a_new_process(tmp_path: Path) -> None:
    """A pid seen before, as another process (the pid space wraps in a long run), does not
    hide the process that has it now: a test's processes were missed, and a test of the
    poller read the old kind ("sh") for its child's pid."""
    import threading
    import time

    import suite_cpu

    child = subprocess.Popen(["sleep", "30"])
    try:
        suite_cpu._seen[f"{child.pid}:1"] = "sh"  # what had that pid long ago
        group = tmp_path / "cgroup.procs"
        group.write_text(f"{child.pid}\n")
        stop = threading.Event()
        threading.Thread(target=suite_cpu._poll, args=(group, stop), daemon=True).start()
        try:
            deadline = time.monotonic() + 30
            name = suite_cpu.key(child.pid)
            assert name is not None and name != f"{child.pid}:1"
            while suite_cpu._seen.get(name) != "sleep":
                assert time.monotonic() < deadline, suite_cpu._seen
                time.sleep(0.02)
        finally:
            stop.set()
    finally:
        child.kill()
        child.wait()
