"""Everything a worker started ends with its attempt, even what left every other mark: a
daemon that a Bash step starts with `env -u FLEET_ATTEMPT_TOKEN setsid ...` (its own
session, no token, reparented to pid 1 once the runner is gone), then the runner
SIGKILLed. The attempt's processes are in a cgroup of their own (system/cgroups.py) named
in runner.json, and the sweep after the runner's death stops every process in it: 0 left,
on this machine and on an SSH host (this machine's sshd as this user: the fast seam,
tests/support/ssh_support.py). Before, the daemon outlived the attempt (the token sweep cannot
see it). Where the machine offers no cgroup the test is skipped, saying so.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sshd
from endpoint_helpers import run_cli
from proc_helpers import commands_in
from ssh_support import host_pids, master, ssh_host, start_sshd
from test_fleet import KEY, SCRIPTS, drive, make_fleet, settled

from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store, TaskState
from fleet_tui.system import cgroups, paths, pidns

DAEMON, STEP = "sleep 471", "sleep 470"
SCRIPT = dict(SCRIPTS, tokenless=[
    [{"type": "tool_use", "name": "Bash",
      "input": {"command": f"env -u FLEET_ATTEMPT_TOKEN setsid {DAEMON} </dev/null "
                           f">/dev/null 2>&1 & {STEP}", "description": "a daemon"}}],
    "never reached",
], world=[
    # what a worker sees of its processes: pids and /proc agree, orphans are reaped (a
    # zombie whose parent is outside, ppid 0, is the runner's to reap, as without it)
    [{"type": "tool_use", "name": "Bash",
      # (pgrep is asked until the job has exec'd sleep: a fork not yet past its exec has
      # its parent's name, under load for a while)
      "input": {"command": "(sleep 472 & p=$!; for i in $(seq 100); do "
                           "pgrep -x sleep | grep -qx \"$p\" && { echo pgrep-agrees; break; }; "
                           "sleep 0.1; done; kill $p; wait $p; "
                           "(sh -c 'sleep 0.2 & exit 0'); sleep 1; "
                           "echo zombies=$(ps -eo ppid=,stat= | "
                           "awk '$1 != 0 && $2 ~ /^Z/' | wc -l); "
                           "echo uid=$(id -u)) > world.txt 2>&1",
                "description": "look around"}}],
    "looked",
])


@pytest.fixture
def _a_cgroup_here() -> None:
    probe = cgroups.make("a-probe-containment")
    if probe is None:
        pytest.skip("this machine offers no cgroup v2 this user can make: the attempt's "
                    "token is the only mark here")
    os.rmdir(probe)


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(SCRIPT) as ep:
        yield ep


def _runner_record(fleet: Fleet, task_id: str) -> dict[str, Any]:
    attempt = fleet.attempts(task_id)[-1]
    assert attempt.dir is not None
    path = Path(attempt.dir) / "runner.json"
    return json.loads(path.read_text()) if path.exists() else {}


@pytest.mark.usefixtures("_a_cgroup_here")
def test_a_tokenless_daemon_ends_with_its_attempt_after_the_runners_sigkill(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    fleet = make_fleet(endpoint, claude_bin, max_attempts=1)
    try:
        (task,) = fleet.submit(TaskSpec(prompt="[script:tokenless] go", repo=git_repo))
        drive(fleet, lambda: len(commands_in(git_repo, DAEMON, STEP)) == 2, timeout=90)
        record = _runner_record(fleet, task.id)
        assert record.get("cgroup"), record  # contained: named where the sweep finds it
        (daemon,) = commands_in(git_repo, DAEMON)
        assert b"FLEET_ATTEMPT_TOKEN" not in Path(f"/proc/{daemon}/environ").read_bytes()
        os.kill(int(record["runner_pid"]), signal.SIGKILL)
        drive(fleet, settled(fleet, task.id), timeout=90)
        done = fleet.get_task(task.id)
        assert done.state == TaskState.FAILED, done.message
        deadline = time.monotonic() + 10
        while commands_in(git_repo, DAEMON, STEP) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert commands_in(git_repo, DAEMON, STEP) == []
        # removed with the attempt (once the last of its processes has finished exiting)
        deadline = time.monotonic() + 15
        while Path(record["cgroup"]).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(record["cgroup"]).exists()
    finally:
        for pid in commands_in(git_repo, DAEMON, STEP):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.usefixtures("_a_cgroup_here")
def test_a_tokenless_daemon_on_the_ssh_host_ends_after_the_runners_sigkill(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint,
        tmp_path: Path) -> None:
    server: sshd.Sshd = start_sshd(tmp_path / "sshd", alias="fleet-contain-host")
    values: dict[str, Any] = {
        "base_url": endpoint.url, "claude": claude_bin, "sandbox": os.geteuid() == 0,
        "key_sources": "env", "kill_grace": 2.0, "max_attempts": 1}
    env = dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0")
    host = ssh_host(server, env)
    fleet = Fleet(load_settings(env=os.environ, overrides=values), Store(paths.db_path()),
                  env=env, host=host)
    try:
        (task,) = fleet.submit(TaskSpec(prompt="[script:tokenless] go", repo=git_repo))
        drive(fleet, lambda: len(host_pids(server, DAEMON, STEP)) == 2, timeout=90)
        drive(fleet, lambda: bool(_runner_record(fleet, task.id).get("claude_pid")),
              timeout=30)
        record = _runner_record(fleet, task.id)
        if not record.get("cgroup"):  # a host whose user may make none: the token only
            pytest.skip("the SSH host's user can make no cgroup v2 there")
        killed = master(server).run(f"kill -KILL {int(record['runner_pid'])} && echo killed",
                                    timeout=30)
        assert killed.stdout.decode().strip() == "killed"
        drive(fleet, settled(fleet, task.id), timeout=90)
        done = fleet.get_task(task.id)
        assert done.state == TaskState.FAILED, done.message
        deadline = time.monotonic() + 10
        while host_pids(server, DAEMON, STEP) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host_pids(server, DAEMON, STEP) == []
    finally:
        for pid in host_pids(server, DAEMON, STEP):
            os.kill(pid, signal.SIGKILL)
        host.close()
        server.stop()


def test_without_a_cgroup_a_tokenless_daemon_ends_with_the_pid_namespace(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No cgroup (the setting that skips it, as on a host whose user has none delegated):
    the attempt's processes are in a PID namespace whose init dies with the runner, so
    the kernel ends the daemon when the runner is SIGKILLed (nothing sweeps it)."""
    monkeypatch.setenv(pidns.MODE_ENV, "namespace")
    fleet = make_fleet(endpoint, claude_bin, max_attempts=1)
    try:
        (task,) = fleet.submit(TaskSpec(prompt="[script:tokenless] go", repo=git_repo))
        drive(fleet, lambda: len(commands_in(git_repo, DAEMON, STEP)) == 2, timeout=90)
        drive(fleet, lambda: bool(_runner_record(fleet, task.id).get("claude_pid")),
              timeout=30)
        record = _runner_record(fleet, task.id)
        assert record.get("contained") == pidns.CONTAINED_NAMESPACE, record
        assert not record.get("cgroup"), record
        (daemon,) = commands_in(git_repo, DAEMON)
        assert b"FLEET_ATTEMPT_TOKEN" not in Path(f"/proc/{daemon}/environ").read_bytes()
        assert os.getsid(daemon) == daemon  # it left claude's session
        assert os.readlink(f"/proc/{daemon}/ns/pid") != os.readlink("/proc/self/ns/pid")
        # claude's own process (caged: the cage host that becomes it, started early) is in
        # the attempt's namespace too, not only what the cage's sandbox holds
        assert os.readlink(f"/proc/{int(record['claude_pid'])}/ns/pid") \
            != os.readlink("/proc/self/ns/pid"), record
        os.kill(int(record["runner_pid"]), signal.SIGKILL)
        deadline = time.monotonic() + 10  # the kernel's work, not a sweep's: no engine tick
        while commands_in(git_repo, DAEMON, STEP) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert commands_in(git_repo, DAEMON, STEP) == []
        drive(fleet, settled(fleet, task.id), timeout=90)
        done = fleet.get_task(task.id)
        assert done.state == TaskState.FAILED, done.message
        shown = run_cli(dict(os.environ), git_repo, "show", task.id)
        assert "processes: in a PID namespace of its own" in shown.stdout, shown.stdout
    finally:
        for pid in commands_in(git_repo, DAEMON, STEP):
            os.kill(pid, signal.SIGKILL)


def test_where_nothing_contains_an_attempt_show_says_so(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither a cgroup nor a namespace (asked for here; a kernel that allows neither reads
    the same): the attempt runs, its token the only mark, and `show` says what that
    means, in one line."""
    monkeypatch.setenv(pidns.MODE_ENV, "token")
    fleet = make_fleet(endpoint, claude_bin, max_attempts=1)
    (task,) = fleet.submit(TaskSpec(prompt="[script:default] go", repo=git_repo))
    drive(fleet, settled(fleet, task.id), timeout=90)
    assert fleet.get_task(task.id).state == TaskState.SUCCEEDED
    assert _runner_record(fleet, task.id)["contained"] == "no: FLEET_TUI_CONTAIN=token"
    shown = run_cli(dict(os.environ), git_repo, "show", task.id)
    (line,) = [x for x in shown.stdout.splitlines() if "processes:" in x]
    assert line.strip() == (
        "processes: NOT contained (FLEET_TUI_CONTAIN=token): a process that leaves its "
        "session and drops FLEET_ATTEMPT_TOKEN can outlive the attempt")


def test_the_containment_line_of_each_record() -> None:
    assert pidns.described(None) is None and pidns.described({"cgroup": None}) is None
    assert pidns.described({"contained": "cgroup"}) == \
        "in a cgroup of its own (everything it started ends with it)"
    assert pidns.described({"contained": "no: no cgroup, and cannot make a user and PID "
                            "namespace: Operation not permitted"}) == (
        "NOT contained (no cgroup, and cannot make a user and PID namespace: Operation not "
        "permitted): a process that leaves its session and drops FLEET_ATTEMPT_TOKEN can "
        "outlive the attempt")


def test_a_worker_sees_the_same_world_in_the_pid_namespace(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """In the namespace as without it: a background job's pid is the one pgrep (/proc)
    finds, so `kill` reaches it; an orphan is reaped (the namespace's init); the user is
    the one the worker runs as (ps sees the namespace's processes only). Caged (the
    default), the worker's world is its cage's own PID namespace, where the same holds."""
    monkeypatch.setenv(pidns.MODE_ENV, "namespace")
    fleet = make_fleet(endpoint, claude_bin, max_attempts=1)
    (task,) = fleet.submit(TaskSpec(prompt="[script:world] look", repo=git_repo))
    drive(fleet, settled(fleet, task.id), timeout=90)
    done = fleet.get_task(task.id)
    assert done.state == TaskState.SUCCEEDED, done.message
    assert done.worktree is not None
    text = (Path(done.worktree) / "world.txt").read_text()
    assert text.split() == ["pgrep-agrees", "zombies=0", f"uid={os.geteuid()}"], text
