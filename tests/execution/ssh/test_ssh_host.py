"""The SSH host: the real claude on a real OpenSSH server on
127.0.0.1 (Debian's sshd, its own host key, key-only login, StrictHostKeyChecking yes with
a test known_hosts), started by an engine given `SshHost` directly.

The host's side lives in its own HOME (set by the server for the session): its data dir,
its mirror of the repository, its worktrees and attempt folders are there, and reach this
machine only over the connection. Covered: a task end to end (its commits fetched back as
fleet/ID), the mirror byte-identical to the host's events.jsonl, kill (0 processes left
there), `say`, the connection killed mid-run (the worker goes on, the stream catches up),
the second task sending only new objects, the key nowhere on the host, and the host's
sshd gone past the lease (the task lost with the reason, then swept when it is back).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import sshd
from ssh_support import host_pids, ssh_host, start_sshd, token_holders
from test_fleet import KEY, SCRIPTS, drive, settled

from fleet_tui.core.errors import InvalidSpec
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.execution.ssh.connection import SshError
from fleet_tui.execution.ssh.host import SshHost
from fleet_tui.execution.worker.attemptlog import AttemptLog
from fleet_tui.gateway import control
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store, TaskState
from fleet_tui.store.meter import Meter
from fleet_tui.system import paths

pytestmark = pytest.mark.xdist_group("ssh-host")

HOST_SCRIPTS: dict[str, Any] = dict(SCRIPTS)
HOST_SCRIPTS["commit"] = [
    [{"type": "tool_use", "name": "Bash",
      "input": {"command": "echo remote > remote.txt && git add remote.txt && "
                           "git commit -q -m 'made on the host'", "description": "commit"}}],
    "committed",
]
HOST_SCRIPTS["pause"] = [
    [{"type": "tool_use", "name": "Bash",
      "input": {"command": "sleep 4; echo resumed > after.txt", "description": "wait"}}],
    "finished after the pause",
]


@pytest.fixture(scope="module")
def host_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sshd.Sshd]:
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(HOST_SCRIPTS) as ep:
        yield ep


def make(endpoint: ScriptedEndpoint, claude: str, server: sshd.Sshd, *,
         lease: float = 60.0, **overrides: Any) -> tuple[Fleet, SshHost]:
    values: dict[str, Any] = {
        "base_url": endpoint.url, "claude": claude, "sandbox": os.geteuid() == 0,
        "key_sources": "env", "backoff_base": 0.2, "backoff_cap": 1.0, "kill_grace": 2.0,
        "max_workers": 4, "max_attempts": 1,
    }
    values.update(overrides)
    settings = load_settings(env=os.environ, overrides=values)
    env = dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0")
    # straight to the endpoint (the gateway off) only from a host that keeps the key
    host = ssh_host(server, env, lease=lease, key_on_host=not settings.gateway)
    return Fleet(settings, Store(paths.db_path()), env=env, host=host), host


@pytest.fixture
def box(claude_bin: str, host_sshd: sshd.Sshd,
        endpoint: ScriptedEndpoint) -> Iterator[tuple[Fleet, SshHost]]:
    """An engine whose host is the test sshd (its master closed after the test)."""
    fleet, host = make(endpoint, claude_bin, host_sshd)
    try:
        yield fleet, host
    finally:
        host.close()


SLEEPS = ("sleep 326", "sleep 327")


def test_a_task_on_the_host_end_to_end(git_repo: Path,
                                       box: tuple[Fleet, SshHost],
                                       host_sshd: sshd.Sshd) -> None:
    fleet, host = box
    (task,) = fleet.submit(TaskSpec(prompt="[script:commit] commit it", repo=git_repo))
    drive(fleet, settled(fleet, task.id), timeout=90)
    done = fleet.get_task(task.id)
    assert done.state == TaskState.SUCCEEDED, done.message
    (attempt,) = fleet.attempts(task.id)
    assert attempt.host == "box"
    # it ran there: the worktree and the attempt folder are the host's
    root = Path(host.root)
    assert root.is_relative_to(host_sshd.home)
    assert str(done.worktree).startswith(str(root / "work"))
    remote_events = root / "attempts" / task.id / "1" / "events.jsonl"
    local_events = Path(attempt.dir or "") / "events.jsonl"
    # the mirror: byte for byte what the host's runner wrote
    assert local_events.read_bytes() == remote_events.read_bytes()
    assert b'"type":"result"' in local_events.read_bytes()
    # commits out: the task's branch fetched back as fleet/ID
    branch = host.collect(done)
    assert branch == f"fleet/{task.id}"
    log = subprocess.run(["git", "-C", str(git_repo), "log", "--format=%s", "-1", branch],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert log == "made on the host"
    shown = subprocess.run(["git", "-C", str(git_repo), "show", f"{branch}:remote.txt"],
                           capture_output=True, text=True, check=True).stdout
    assert shown == "remote\n"
    # the package the host runs is this one, installed in its data dir
    assert host.install().startswith(str(root / "pkg"))


def test_the_second_task_sends_only_new_objects(git_repo: Path,
                                                box: tuple[Fleet, SshHost]) -> None:
    fleet, host = box
    (first,) = fleet.submit(TaskSpec(prompt="[script:chat] hello", repo=git_repo))
    drive(fleet, settled(fleet, first.id), timeout=90)
    (git_repo / "new.txt").write_text("one more file\n")
    subprocess.run(["git", "-C", str(git_repo), "add", "new.txt"], check=True)
    subprocess.run(["git", "-C", str(git_repo), "commit", "-q", "-m", "one more"],
                   check=True)
    (second,) = fleet.submit(TaskSpec(prompt="[script:chat] again", repo=git_repo))
    drive(fleet, settled(fleet, second.id), timeout=90)
    assert fleet.get_task(second.id).state == TaskState.SUCCEEDED
    (objects_first, bytes_first), (objects_second, bytes_second) = host.pushes
    assert objects_first >= 4  # the whole repository
    assert objects_second == 3  # a commit, its tree and the new blob
    assert bytes_second < bytes_first


def test_uncommitted_work_on_the_host_comes_back_committed(git_repo: Path,
                                                           box: tuple[Fleet, SshHost],
                                                           host_sshd: sshd.Sshd) -> None:
    fleet, host = box
    (task,) = fleet.submit(TaskSpec(prompt="write a.txt", repo=git_repo))
    drive(fleet, settled(fleet, task.id), timeout=90)
    done = fleet.get_task(task.id)
    assert done.state == TaskState.SUCCEEDED, done.message
    branch = host.collect(done)
    shown = subprocess.run(["git", "-C", str(git_repo), "show", f"{branch}:a.txt"],
                           capture_output=True, text=True, check=True).stdout
    assert shown == "worker\n"
    # the host's worktree is clean now, on the commit fetched
    there = host_sshd.ssh(f"git -C {shlex.quote(str(done.worktree))} status --porcelain")
    assert there == ""
    host.release(task.id)  # closed: its worktree and config dir go from the host
    assert not Path(str(done.worktree)).exists()
    assert not (Path(host.root) / "config" / task.id).exists()


def test_a_new_engine_adopts_the_remote_worker(git_repo: Path, claude_bin: str,
                                               host_sshd: sshd.Sshd,
                                               endpoint: ScriptedEndpoint) -> None:
    """The controller gone mid-run (its engine and its host object dropped, the master
    closed): a new engine with a new SshHost follows the same runner to its end."""
    def started() -> tuple[str, int | None]:
        """The first engine, gone once this returns (its object and host dropped)."""
        fleet, host = make(endpoint, claude_bin, host_sshd)
        (task,) = fleet.submit(TaskSpec(prompt="[script:pause] wait", repo=git_repo))
        drive(fleet, lambda: b"tool_use" in _events(fleet, task.id), timeout=60)
        runner = fleet.attempts(task.id)[-1].runner_pid
        host.close()
        return task.id, runner

    task_id, runner = started()
    again, host2 = make(endpoint, claude_bin, host_sshd)
    try:
        drive(again, settled(again, task_id), timeout=90)
        done = again.get_task(task_id)
        assert done.state == TaskState.SUCCEEDED, done.message
        (attempt,) = again.attempts(task_id)  # adopted: no second attempt
        assert attempt.runner_pid == runner
        assert b"finished after the pause" in _events(again, task_id)
    finally:
        host2.close()


def test_kill_leaves_no_process_on_the_host(git_repo: Path,
                                            box: tuple[Fleet, SshHost],
                                            host_sshd: sshd.Sshd) -> None:
    fleet = box[0]
    try:
        (task,) = fleet.submit(TaskSpec(prompt="[script:sleepy] wait", repo=git_repo))
        drive(fleet, lambda: len(host_pids(host_sshd, *SLEEPS)) == 2, timeout=60)
        token = fleet.attempts(task.id)[-1]
        assert token.dir is not None
        fleet.kill(task.id)
        done = fleet.get_task(task.id)
        assert done.state == TaskState.KILLED and done.verdict == "killed"
        deadline = time.monotonic() + 10
        while host_pids(host_sshd, *SLEEPS) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host_pids(host_sshd, *SLEEPS) == []
        assert host_pids(host_sshd, f"attempts/{task.id}/") == []  # the runner too
    finally:
        for pid in host_pids(host_sshd, *SLEEPS):
            os.kill(pid, signal.SIGKILL)


def test_say_reaches_the_worker_on_the_host(git_repo: Path,
                                            box: tuple[Fleet, SshHost]) -> None:
    fleet = box[0]
    (task,) = fleet.submit(TaskSpec(prompt="[script:pause] wait", repo=git_repo))
    drive(fleet, lambda: fleet.get_task(task.id).state == TaskState.RUNNING
          and b"tool_use" in _events(fleet, task.id), timeout=60)
    fleet.say(task.id, "also say hello")
    drive(fleet, settled(fleet, task.id), timeout=90)
    assert fleet.get_task(task.id).state == TaskState.SUCCEEDED
    assert b"also say hello" in _events(fleet, task.id)  # claude took it in (replayed)


def _events(fleet: Fleet, task_id: str) -> bytes:
    attempts = fleet.attempts(task_id)
    if not attempts or attempts[-1].dir is None:
        return b""
    path = Path(attempts[-1].dir) / "events.jsonl"
    return path.read_bytes() if path.exists() else b""


def test_a_dropped_connection_leaves_the_worker_running(git_repo: Path,
                                                        box: tuple[Fleet, SshHost]) -> None:
    fleet, host = box
    (task,) = fleet.submit(TaskSpec(prompt="[script:pause] wait", repo=git_repo))
    drive(fleet, lambda: b"tool_use" in _events(fleet, task.id), timeout=60)
    master = host.connection.master_pid()
    assert master is not None
    mirror = host.mirror(host.attach(fleet.attempts(task.id)[-1]))
    os.kill(master, signal.SIGKILL)  # the connection is gone, mid-run
    drive(fleet, settled(fleet, task.id), timeout=90)
    done = fleet.get_task(task.id)
    assert done.state == TaskState.SUCCEEDED, done.message
    attempt = fleet.attempts(task.id)[-1]
    remote = Path(host.root) / "attempts" / task.id / "1" / "events.jsonl"
    assert _events(fleet, task.id) == remote.read_bytes()  # caught up, byte for byte
    assert b"finished after the pause" in _events(fleet, task.id)
    assert host.connection.master_pid() not in (None, master)  # a new one
    assert attempt.finished_at is not None
    assert mirror.connects >= 2  # it resumed from its offset


# The key comes on stdin and reaches grep through a pipe (process substitution of a
# builtin): never an argv or a file of the host. Every process started over the test's
# login carries FLEET_TEST_HOST (authorized_keys sets it), the runner and claude included.
SCAN = r"""read -r k
n=0
for d in /proc/[0-9]*; do
  grep -qa 'FLEET_TEST_HOST=' "$d/environ" 2>/dev/null || continue
  n=$((n+1))
  if grep -qaF -f <(printf '%s\n' "$k") $(for f in $FILES; do echo "$d/$f"; done) \
      2>/dev/null; then
    echo "HIT ${d#/proc/}"
  fi
done
echo "SCANNED $n"
grep -rlaF -f <(printf '%s\n' "$k") "$HOME" 2>/dev/null | sed 's/^/FILE /'
true
"""


def secret_scan(server: sshd.Sshd, secret: str, *, argv_only: bool = False
                ) -> tuple[list[str], int]:
    """The host's processes (environ and argv, or argv only) and files under its HOME
    holding `secret`, and how many processes were read."""
    files = "cmdline" if argv_only else "environ cmdline"
    out = server.ssh(f"FILES={shlex.quote(files)} exec bash -c {shlex.quote(SCAN)}",
                     input=secret + "\n")
    hits = [line for line in out.splitlines() if line.startswith(("HIT", "FILE"))]
    scanned = [int(line.split()[1]) for line in out.splitlines() if line.startswith("SCANNED")]
    return hits, scanned[0] if scanned else 0


@pytest.fixture
def fresh_sshd(tmp_path: Path) -> Iterator[sshd.Sshd]:
    """A host of its own (the module's host keeps the key for the tests that go direct)."""
    server = start_sshd(tmp_path / "fresh-sshd", alias="fleet-fresh-host")
    try:
        yield server
    finally:
        server.stop()


def test_the_key_never_lands_on_the_host(git_repo: Path, claude_bin: str,
                                         fresh_sshd: sshd.Sshd,
                                         endpoint: ScriptedEndpoint) -> None:
    """Through this machine's gateway, reached by a port forwarded over the connection:
    the host's files, its processes' argv and environments hold the attempt's token at
    most, never the key; upstream the endpoint gets the real key."""
    host_sshd = fresh_sshd
    fleet, host = make(endpoint, claude_bin, host_sshd, gateway=True)
    before = len(endpoint.message_requests())
    try:
        (task,) = fleet.submit(TaskSpec(prompt="[script:pause] wait", repo=git_repo))
        drive(fleet, lambda: b"tool_use" in _events(fleet, task.id), timeout=60)
        hits, scanned = secret_scan(host_sshd, KEY)
        assert hits == [] and scanned >= 3  # the runner and claude among them
        info = control.read_info(fleet.env)
        assert info is not None
        remote_spec = json.loads((Path(host.root) / "attempts" / task.id / "1" /
                                  "spec.json").read_text())
        there = urlsplit(remote_spec["settings"]["base_url"])
        assert there.port == host.forwards[info.port] != info.port  # the forwarded port
        drive(fleet, settled(fleet, task.id), timeout=90)
        done = fleet.get_task(task.id)
        assert done.state == TaskState.SUCCEEDED, done.message
        served = endpoint.message_requests()[before:]
        assert served and served[-1].auth_sha256 == hashlib.sha256(KEY.encode()).hexdigest()
        # every request went through the gateway, with the attempt's token
        rows = Meter(fleet.store).rows()
        assert rows and {r.task_id for r in rows} == {task.id}
        assert len(rows) == len(served)
        hits, _ = secret_scan(host_sshd, KEY)
        assert hits == []
    finally:
        control.stop(fleet.env)
        host.close()


def test_a_host_that_keeps_its_key_goes_straight_to_the_endpoint(
        git_repo: Path, box: tuple[Fleet, SshHost], host_sshd: sshd.Sshd,
        endpoint: ScriptedEndpoint) -> None:
    """`--key-on-host` (the gateway off, as the suite's workers run): the key goes over the
    connection's stdin once into a 0600 file of the host's data dir, and each runner reads
    it there; no process argument holds it, and the endpoint gets it from the host."""
    fleet, host = box
    assert host.key_on_host and not host.reaches_gateway
    before = len(endpoint.message_requests())
    (task,) = fleet.submit(TaskSpec(prompt="[script:pause] wait", repo=git_repo))
    drive(fleet, lambda: b"tool_use" in _events(fleet, task.id), timeout=60)
    hits, scanned = secret_scan(host_sshd, KEY, argv_only=True)  # while it works
    assert hits == [] or all(h.startswith("FILE") for h in hits)
    assert scanned >= 3  # the runner and claude among them
    drive(fleet, settled(fleet, task.id), timeout=90)
    assert fleet.get_task(task.id).state == TaskState.SUCCEEDED
    files = list((Path(host.root) / "keys").glob("*.json"))
    assert len(files) == 1 and files[0].stat().st_mode & 0o777 == 0o600
    assert files[0].parent.stat().st_mode & 0o777 == 0o700
    assert json.loads(files[0].read_text()) == {"ANTHROPIC_AUTH_TOKEN": KEY}
    hits, _ = secret_scan(host_sshd, KEY)
    assert [h for h in hits if h.startswith("FILE")] == [f"FILE {files[0]}"]
    served = endpoint.message_requests()[before:]
    assert served and {r.auth_sha256 for r in served} == {
        hashlib.sha256(KEY.encode()).hexdigest()}
    # the next attempt reads the same file: nothing sent again
    (again,) = fleet.submit(TaskSpec(prompt="[script:commit] commit it", repo=git_repo))
    drive(fleet, settled(fleet, again.id), timeout=90)
    assert list((Path(host.root) / "keys").glob("*.json")) == files


def test_the_gateway_off_a_host_that_does_not_keep_the_key_is_refused(
        git_repo: Path, claude_bin: str, fresh_sshd: sshd.Sshd,
        endpoint: ScriptedEndpoint) -> None:
    """Without the gateway a worker there would need the key on the host: refused at the
    submit with both ways out, nothing created; and the key is never sent to such a host,
    whatever asks (its refusal does not hold the key either)."""
    settings = load_settings(env=os.environ, overrides={
        "base_url": endpoint.url, "claude": claude_bin, "key_sources": "env",
        "sandbox": os.geteuid() == 0, "gateway": False})
    env = dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY)
    host = ssh_host(fresh_sshd, env, key_on_host=False)
    fleet = Fleet(settings, Store(paths.db_path()), env=env, host=host)
    try:
        with pytest.raises(InvalidSpec) as refused:
            fleet.submit(TaskSpec(prompt="work", repo=git_repo))
        text = str(refused.value)
        assert "the gateway is off (gateway = false)" in text
        assert "fleet-tui host add box TARGET --key-on-host" in text
        assert fleet.list_tasks() == []
        with pytest.raises(SshError) as kept:
            host.keep_key({"ANTHROPIC_AUTH_TOKEN": KEY})
        assert "refusing to send the API key" in str(kept.value)
        assert KEY not in str(kept.value)
        hits, _ = secret_scan(fresh_sshd, KEY)
        assert not [h for h in hits if "/keys/" in h]
    finally:
        host.close()


def _sleepy_then_host_gone(fleet: Fleet, host: SshHost, server: sshd.Sshd, repo: Path
                           ) -> tuple[Any, Any, str]:
    """A sleepy worker on the host (claude and its two sleeps there, holding the attempt's
    token), then the host gone: its sshd stopped (no new connection) and the master
    killed (the one there was is cut). The task, its attempt, the token."""
    (task,) = fleet.submit(TaskSpec(prompt="[script:sleepy] wait", repo=repo))
    drive(fleet, lambda: len(host_pids(server, *SLEEPS)) == 2, timeout=60)
    attempt = fleet.attempts(task.id)[-1]
    assert attempt.dir is not None
    token = AttemptLog(attempt.dir).spec_token()
    assert token and token_holders(server, token)  # claude and the sleeps
    master = host.connection.master_pid()
    assert master is not None
    server.stop()
    os.kill(master, signal.SIGKILL)
    return task, attempt, token


@pytest.mark.parametrize("restarted", [False, True], ids=["same-engine", "restarted"])
def test_a_host_gone_past_its_lease_loses_the_task_then_sweeps_it(
        git_repo: Path, claude_bin: str, host_sshd: sshd.Sshd,
        endpoint: ScriptedEndpoint, restarted: bool) -> None:
    """The host's sshd stopped and the master killed while a worker runs: state() keeps
    answering at once ("alive", from the last known state); past the lease the task ends
    lost with the reason; sshd started again on its port, the host sweeps the attempt:
    0 of its processes are left there. `restarted`: the controller restarted while the
    host is away (a new engine and host object, which never reached it)."""
    lease = 3.0
    fleet, host = make(endpoint, claude_bin, host_sshd, lease=lease)
    hosts = [host]
    try:
        task, attempt, token = _sleepy_then_host_gone(fleet, host, host_sshd, git_repo)
        if restarted:
            host.close()
            fleet, host = make(endpoint, claude_bin, host_sshd, lease=lease)
            hosts.append(host)
        asked = time.monotonic()
        assert host.attach(attempt).state() == "alive"  # within the lease: going on there
        assert time.monotonic() - asked < 1.0  # from the mirror, never a round trip
        drive(fleet, settled(fleet, task.id), timeout=lease + 30)
        last_answer = host.connection.reached_at  # the agent's last heartbeat
        assert last_answer < asked and time.monotonic() - last_answer >= lease
        assert time.monotonic() - asked >= lease - 1.5  # 1 s: the agent's heartbeat
        done = fleet.get_task(task.id)
        assert done.state == TaskState.FAILED
        assert done.message is not None
        assert done.message.startswith("lost: host box unreachable for "), done.message
        assert f"longer than its lease of {lease:g} s" in done.message
        (closed,) = fleet.attempts(task.id)
        assert closed.finished_at is not None and closed.message == done.message
        assert host.swept_lost == []  # nothing could be swept yet
        host_sshd.start()  # back, on the same port
        drive(fleet, lambda: bool(host.swept_lost), timeout=30)
        assert [key for key, _n in host.swept_lost] == [(task.id, 1)]
        assert token_holders(host_sshd, token) == []
        assert host_pids(host_sshd, *SLEEPS) == []
        assert host_pids(host_sshd, f"attempts/{task.id}/") == []  # the runner too
    finally:
        if host_sshd.proc is None:
            host_sshd.start()
        for pid in host_pids(host_sshd, *SLEEPS):
            os.kill(pid, signal.SIGKILL)
        for each in hosts:
            each.close()


def test_a_restarted_engine_sweeps_what_was_lost_before(
        git_repo: Path, claude_bin: str, host_sshd: sshd.Sshd,
        endpoint: ScriptedEndpoint) -> None:
    """The engine lost the attempt (its host away past the lease) and was then restarted
    while the host was still away: the new engine (a new host object, the same store)
    finds the lost attempt in the store and sweeps it once the host is back."""
    lease = 3.0
    fleet, host = make(endpoint, claude_bin, host_sshd, lease=lease)
    hosts = [host]
    try:
        task, attempt, token = _sleepy_then_host_gone(fleet, host, host_sshd, git_repo)
        drive(fleet, settled(fleet, task.id), timeout=lease + 30)
        done = fleet.get_task(task.id)
        assert done.state == TaskState.FAILED and (done.message or "").startswith("lost: ")
        assert fleet.store.lost_to_sweep() == [("box", task.id, 1, done.message)]
        host.close()  # the controller restarts; the host is still away
        fleet, host = make(endpoint, claude_bin, host_sshd, lease=lease)
        hosts.append(host)
        fleet.tick()
        assert host.lost((task.id, 1)) == done.message  # known from the store
        assert host.attach(attempt).state() == "dead"  # never followed again
        host_sshd.start()
        drive(fleet, lambda: bool(host.swept_lost), timeout=30)
        assert [key for key, _n in host.swept_lost] == [(task.id, 1)]
        assert token_holders(host_sshd, token) == []
        assert host_pids(host_sshd, *SLEEPS) == []
        assert host_pids(host_sshd, f"attempts/{task.id}/") == []
        assert fleet.store.lost_to_sweep() == []  # swept: a third engine has nothing to do
    finally:
        if host_sshd.proc is None:
            host_sshd.start()
        for pid in host_pids(host_sshd, *SLEEPS):
            os.kill(pid, signal.SIGKILL)
        for each in hosts:
            each.close()


def test_a_forwarded_port_is_the_hosts_127_0_0_1_never_only_its_ipv6_loopback(
        host_sshd: sshd.Sshd) -> None:
    """Workers on the host ask 127.0.0.1:PORT. A port another server holds on the host's
    127.0.0.1 (free on ::1) is refused as a forward, not taken on ::1 alone (sshd bound
    every loopback address it could and said yes: the worker then reached that server,
    a 404 for its model in CI); a port the host picks is its 127.0.0.1's."""
    import socket

    from ssh_support import master

    connection = master(host_sshd)
    other = socket.socket()
    try:
        connection.run("true")
        other.bind(("127.0.0.1", 0))
        other.listen()
        held = other.getsockname()[1]
        with pytest.raises(SshError):
            connection.forward_remote(9, held)
        picked = connection.forward_remote(9)
        probe = socket.socket()
        try:  # bound by the host's sshd on 127.0.0.1: not free there
            with pytest.raises(OSError):
                probe.bind(("127.0.0.1", picked))
        finally:
            probe.close()
    finally:
        other.close()
        connection.close()


def test_a_listing_of_the_hosts_processes_takes_a_command_line_that_is_not_utf8(
        host_sshd: sshd.Sshd, tmp_path: Path) -> None:
    """host_pids reads every process of the machine the host is on, other tests' among
    them; one whose command line is not UTF-8 (a byte 0xc3 with no continuation) once
    failed a test that only asked for its own sleeps."""
    odd = subprocess.Popen([b"/bin/sh", b"-c", b"sleep 60", b"odd-\xc3("], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 10
        while b"odd-\xc3(" not in Path(f"/proc/{odd.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline, "the odd process never showed its argv"
            time.sleep(0.05)
        assert host_pids(host_sshd, "sleep 60") == []  # under the host's HOME: none
        listed = host_sshd.ssh(f"tr '\\0' ' ' < /proc/{odd.pid}/cmdline")
        assert listed.startswith("/bin/sh -c sleep 60 odd-\ufffd(")
    finally:
        odd.kill()
        odd.wait()
