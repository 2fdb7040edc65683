"""The cage host a runner starts before its own imports (cageearly.py): started only for a
run that will be caged and held by a cgroup, in its own process group, with the attempt's
token and a private stderr.log; let go, it ends at once (its order pipe closed: exit 3)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_tui.execution.worker import cage, cageearly
from fleet_tui.system import cgroups


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
        assert os.getpgid(early.proc.pid) == early.proc.pid  # its own group, as claude's
        spec = json.loads((adir / "spec.json").read_text())
        environ = Path(f"/proc/{early.proc.pid}/environ").read_bytes().split(b"\0")
        assert f"FLEET_ATTEMPT_TOKEN={spec['token']}".encode() in environ
        assert (adir / "stderr.log").stat().st_mode & 0o777 == 0o600
    finally:
        cageearly.drop(early)
    assert early.proc.returncode == 3  # no order came: nothing started, nothing left


@pytest.mark.parametrize("case", ["cage off", "token containment", "no spec", "no worktree"])
def test_nothing_starts_early_for_a_run_that_will_not_be_caged_in_a_cgroup(
        tmp_path: Path, cgroup_here: None, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    adir = _attempt(tmp_path, {"cage": "off" if case == "cage off" else "worker"})
    if case == "token containment":
        monkeypatch.setenv("FLEET_TUI_CONTAIN", "token")
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
