"""The cage host a runner starts before its own imports (cageearly.py): started only for a
run that will be caged (on Linux, containment "auto"), in its own process group, with the
attempt's token, a private stderr.log and a parent-death signal; let go, it is killed
before it did anything."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_tui.execution.worker import attemptlog, cage, cageearly, spec
from fleet_tui.system import cgroups, pidns, procs


def _attempt(tmp_path: Path, settings: dict[str, object]) -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    adir = tmp_path / "attempt"
    adir.mkdir(exist_ok=True)
    (adir / "spec.json").write_text(json.dumps(
        {"cwd": str(work), "settings": settings, "token": "tok-early-" + os.urandom(4).hex()}))
    return adir


@pytest.fixture
def cgroup_here(tmp_path: Path) -> Iterator[None]:
    """Skips where this user can make no cgroup (the runner then uses a PID namespace and
    nothing starts early); the attempt's cgroup is removed afterwards."""
    name = cageearly.cgroup_name(str(tmp_path / "attempt"))
    path = cgroups.make(name)
    if path is None:
        pytest.skip("no cgroup v2 this user can make here: nothing starts early")
    problems = cage.missing(os.environ, cage.default_data_dir(os.environ))
    if problems:
        if os.environ.get("CI"):
            pytest.fail("the cage cannot run here: " + "; ".join(problems))
        pytest.skip("the cage cannot run here: " + "; ".join(problems))
    yield
    deadline = time.monotonic() + 10
    while True:
        try:
            os.rmdir(path)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_a_caged_run_starts_its_host_first_and_a_drop_ends_it(
        tmp_path: Path, cgroup_here: None) -> None:
    adir = _attempt(tmp_path, {"cage": "worker"})
    cageearly.start(["--lock-fd", "7", "--env-fd", "8", str(adir)])
    early = cageearly.take()
    assert early is not None
    try:
        assert cageearly.take() is None  # taken once
        assert early.proc.poll() is None
        # setpriv execs node in its place (until then, a vfork's child shows its parent's
        # environment)
        assert _became_node(early.proc.pid)
        assert os.getpgid(early.proc.pid) == early.proc.pid  # its own group, as claude's
        written = json.loads((adir / "spec.json").read_text())
        environ = _environ(early.proc.pid)
        assert f"FLEET_ATTEMPT_TOKEN={written['token']}".encode() in environ
        assert (adir / "stderr.log").stat().st_mode & 0o777 == 0o600
    finally:
        cageearly.drop(early)
    assert early.proc.returncode is not None  # killed and reaped: it had started nothing
    assert not procs.is_alive(early.proc.pid)


def _became_node(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/exe").resolve().name == "node":
                return True
        time.sleep(0.02)
    return False


def _environ(pid: int) -> list[bytes]:
    """The process's environment once its exec has set it up. /proc/PID/exe names the new
    program a moment before the kernel has put the new environment on its stack: read in
    between, /proc/PID/environ is empty (a parallel pass once read b'' there)."""
    deadline = time.monotonic() + 10
    while True:
        with contextlib.suppress(OSError):
            data = Path(f"/proc/{pid}/environ").read_bytes()
            if data:
                return data.split(b"\0")
        assert time.monotonic() < deadline, f"no environment for {pid} after 10 s"
        time.sleep(0.02)


def test_the_early_host_dies_with_its_runner(tmp_path: Path, cgroup_here: None) -> None:
    """A runner killed before it adopted the host leaves nothing behind (the host's order
    pipe closes, and setpriv gave it a parent-death signal)."""
    adir = _attempt(tmp_path, {"cage": "worker"})
    runner = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from fleet_tui.execution.worker import cageearly\n"
         "cageearly.start([sys.argv[1]])\n"
         "print(cageearly.started.proc.pid if cageearly.started else 0, flush=True)\n"
         "time.sleep(120)\n", str(adir)], stdout=subprocess.PIPE, text=True)
    try:
        assert runner.stdout is not None
        pid = int(runner.stdout.readline())
        assert pid and _became_node(pid)
    finally:
        runner.kill()
        runner.wait()
    assert procs.wait_gone([pid], 10)


@pytest.mark.parametrize("case", ["cage off", "token containment", "portable", "no spec",
                                  "no worktree"])
def test_nothing_starts_early_for_a_run_that_will_not_be_caged_in_a_cgroup(
        tmp_path: Path, cgroup_here: None, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    adir = _attempt(tmp_path, {"cage": "off" if case == "cage off" else "worker"})
    if case == "token containment":
        monkeypatch.setenv(pidns.MODE_ENV, "token")
    elif case == "portable":
        monkeypatch.setenv(procs.PORTABLE_ENV, "1")
    elif case == "no spec":
        (adir / "spec.json").unlink()
    elif case == "no worktree":
        (tmp_path / "work").rmdir()
    cageearly.start([str(adir)])
    early = cageearly.take()
    if early is not None:
        cageearly.drop(early)
    assert early is None
    assert not (adir / "stderr.log").exists()


def test_its_names_are_those_of_the_modules_it_does_not_import() -> None:
    assert cageearly.SPEC_FILE == attemptlog.SPEC_FILE
    assert cageearly.STDERR_FILE == attemptlog.STDERR_FILE
    assert cageearly.TOKEN_ENV == spec.TOKEN_ENV
    assert cageearly.PORTABLE_ENV == procs.PORTABLE_ENV
    assert cageearly.CONTAIN_ENV == pidns.MODE_ENV
