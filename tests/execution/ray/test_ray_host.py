"""The Ray host: the real claude in Ray jobs on a local cluster (a head and a
second node on this machine, tests/support/ray_cluster.py), against the scripted endpoint, through
this machine's gateway (the cluster gets the attempt's token, never the key).

The host is configured as a user would (`[hosts.cluster]` in config.toml, `ray =` the
Jobs address, `resources` pinning every job to the second node), so that the merge queue's
own detached process builds the same host. Covered: two tasks pinned to the second node
(the second waits for the first: one `agenthost`), both landed through the queue (the
second's base moved: an update job on its node merges it there first); the attempt folder
byte-identical to the node's; kill with a double-forked daemon in the worker's Bash step
(0 processes left); a controller of its own SIGKILLed mid-job and a new one reattached by
the submission id (one job, never a second); `say` through the gateway's mailbox and a
follow-up pinned to the node that holds the session; the key in `ray job list`, the Jobs
REST API, the state API, every file under the cluster's temp dir and the cluster's
processes (0 hits); the update job's bundle holding only what the node lacked (the first
jobs' the whole history), a merged task's worktree and config dir removed by the next job
on its node, an update stopped on conflicts there aborted by a short job, a node that
lacks what its bundle was cut against sent the job again whole; last, the second node's
raylet SIGKILLed (the task lost, its processes gone) and a task that ended there followed
up on a new node, its worktree and claude's session restored (refused at once without
the transcripts).
The figures they see go to the test's output (`-s`) and FLEET_RAY_FIGURES.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from proc_helpers import working_in
from ray_cluster import (
    NODE_KEY,
    NODE_KEY_VAR,
    NODE_RESOURCE,
    NoAgentProxy,
    RayCluster,
    ray_missing,
)
from test_fleet import KEY, SCRIPTS, drive, settled

from fleet_tui import CLAUDE_CODE_VERSION
from fleet_tui.core.errors import FleetRefused, WorkerFinished
from fleet_tui.core.states import LandState
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine import host_check
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.execution import probe
from fleet_tui.execution.ray.config import ray_host as ray_host_config
from fleet_tui.execution.worker import cage
from fleet_tui.execution.worker.attemptlog import AttemptLog
from fleet_tui.gateway import control
from fleet_tui.settings.config import config_file_path, load_settings
from fleet_tui.store.db import Store, Task, TaskState
from fleet_tui.system import paths, procs

pytestmark = pytest.mark.xdist_group("ray-host")

_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

RAY_SCRIPTS: dict[str, Any] = dict(SCRIPTS)
for _name in ("one", "two"):
    RAY_SCRIPTS[f"commit-{_name}"] = [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": f"echo {_name} > {_name}.txt && git add {_name}.txt && "
                               f"git commit -q -m 'made on the node: {_name}'",
                    "description": "commit"}}],
        "committed",
    ]
RAY_SCRIPTS["brief"] = {
    "turns": [[{"type": "tool_use", "name": "Bash",
                "input": {"command": "echo brief > brief.txt && git add brief.txt && "
                                     "git commit -q -m 'brief, on the node'",
                          "description": "commit"}}],
              "committed briefly"],
    "followup": ["followed up on another node"],
}
RAY_SCRIPTS["pause"] = [
    [{"type": "tool_use", "name": "Bash",
      "input": {"command": "sleep 6; echo resumed > after.txt", "description": "wait"}}],
    "finished after the pause",
]
RAY_SCRIPTS["long"] = [
    [{"type": "tool_use", "name": "Bash",
      "input": {"command": "sleep 12; echo done > after.txt", "description": "wait"}}],
    "finished after the long pause",
]
RAY_SCRIPTS["steer"] = {
    "turns": [[{"type": "tool_use", "name": "Bash",
                "input": {"command": "sleep 8; echo steered > after.txt",
                          "description": "wait"}}],
              "finished after the pause"],
    "followup": ["followed up on the node"],
}
# a daemon that double-forks out of the Bash step (reparented to the runner, its
# subreaper, or to pid 1 without one): Ray's own stop_job leaves such a process
SLEEPS = ("sleep 912", "sleep 913")
RAY_SCRIPTS["daemon"] = [
    [{"type": "tool_use", "name": "Bash",
      "input": {"command": "(setsid sleep 913 </dev/null >/dev/null 2>&1 &); sleep 912",
                "description": "a daemon"}}],
    "never reached",
]

RAY_SCRIPTS["caged-node"] = [
    [{"type": "tool_use", "name": "Bash",
      "input": {"command": "curl -sS -m 20 https://example.com/ || echo refused",
                "description": "reach a host its settings do not allow"}}],
    [{"type": "tool_use", "name": "Bash",
      "input": {"command": "echo caged > caged.txt && git add caged.txt && "
                           "git commit -q -m 'made in the cage on the node'",
                "description": "commit"}}],
    "done in the cage",
]
# the nodes' srt: the one the tests installed (the host's `srt` setting names it there)
SRT = cage.find_srt(os.environ)
FIGURES: dict[str, Any] = {}


# module scope: the cluster ends with this file's tests. Session scope kept it running, idle,
# until the xdist worker's last test: 0.069 CPU-s a second for two nodes, 28 CPU-s of a
# whole run (the ray-host group ran first, 407 s before its worker's end).
@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    why = ray_missing()
    if why is not None:
        if _CI:
            pytest.fail(why)
        pytest.skip(why)
    started = time.monotonic()
    cluster = RayCluster()
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    FIGURES["cluster_start_s"] = round(time.monotonic() - started, 1)
    try:
        yield cluster
    finally:
        cluster.stop()
        out = os.environ.get("FLEET_RAY_FIGURES")
        if out:
            Path(out).write_text(json.dumps(FIGURES, indent=2) + "\n")


@pytest.fixture(scope="module")
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(RAY_SCRIPTS) as ep:
        yield ep


def make(endpoint: Any, claude: str, cluster: Any, node_dir: Path, *, host_lines: str = "",
         caged: bool = False, **overrides: Any) -> Fleet:
    """An engine whose config.toml names the cluster as the host `cluster` (its jobs
    pinned to the second node); the gateway on: the cluster gets tokens, never the key.
    `host_lines`: more of the host's table. Its workers run uncaged (the host's cage =
    "off") unless `caged`."""
    config = config_file_path(os.environ)
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        f'[hosts.cluster]\nray = "{cluster.address}"\n'
        f"resources = {{ {NODE_RESOURCE} = 1 }}\nmax_workers = 2\n"
        f'data_dir = "{node_dir}"\npython = "{sys.executable}"\nclaude = "{claude}"\n'
        + ("" if caged else 'cage = "off"\n') + host_lines)
    values: dict[str, Any] = {
        "base_url": endpoint.url, "claude": claude, "sandbox": os.geteuid() == 0,
        "key_sources": "env", "backoff_base": 0.2, "backoff_cap": 1.0, "kill_grace": 2.0,
        "max_workers": 4, "max_attempts": 1, "gateway": True,
    }
    values.update(overrides)
    settings = load_settings(env=os.environ, overrides=values)
    env = dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0")
    return Fleet(settings, Store(paths.db_path()), env=env)


def ray_host(fleet: Fleet) -> Any:
    return fleet.supervisor.host_of_name("cluster")


def jobs(cluster: RayCluster) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{cluster.address}/api/jobs/", timeout=20) as resp:
        data = json.load(resp)
    return list(data)


def jobs_of(cluster: RayCluster, task_id: str) -> list[dict[str, Any]]:
    return [j for j in jobs(cluster) if (j.get("metadata") or {}).get("fleet-tui-task")
            == task_id]


def _bytes(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


def _events(fleet: Fleet, task_id: str) -> bytes:
    attempts = fleet.attempts(task_id)
    if not attempts or attempts[-1].dir is None:
        return b""
    path = Path(attempts[-1].dir) / "events.jsonl"
    return path.read_bytes() if path.exists() else b""


def node_pids(node_dir: Path, *markers: str) -> list[int]:
    """Processes on the node working under its data dir whose command line is one of
    `markers` (or holds one ending in "/")."""
    def marked(argv: list[str]) -> bool:
        args = " ".join(argv).strip()
        return any(m == args or (m.endswith("/") and m in args) for m in markers)

    return working_in(node_dir, marked)


def node_of(cluster: RayCluster, resource: str) -> str:
    (node,) = [n for n in cluster.nodes() if resource in (n.get("resources_total") or {})]
    return str(node["node_id"])


def add_history(repo: Path, commits: int = 30) -> None:
    """Commits of incompressible text on main (a repository with some history)."""
    for i in range(commits):
        (repo / f"history-{i % 7}.txt").write_text(os.urandom(6000).hex())
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", f"history {i}"],
                       check=True)


def job_bundle(cluster: RayCluster, job: dict[str, Any]) -> bytes:
    """The bundle a job was sent, as Ray unpacked its working_dir (on this machine)."""
    uri = str((job.get("runtime_env") or {}).get("working_dir") or "")
    name = uri.rsplit("/", 1)[-1].removesuffix(".zip")
    found = list(cluster.temp_dir.glob(
        f"session_*/runtime_resources/working_dir_files/{name}/base.bundle"))
    assert name and found, f"the bundle of {job['submission_id']} ({uri})"
    return found[0].read_bytes()


def bundle_objects(bundle: bytes) -> tuple[list[str], list[str], int]:
    """A bundle's prerequisites, the commits of its refs and the number of objects in its
    pack."""
    header, _, pack = bundle.partition(b"\n\n")
    assert pack[:4] == b"PACK"
    lines = header.split(b"\n")[1:]
    prerequisites = [line[1:].split()[0].decode() for line in lines if line.startswith(b"-")]
    refs = [line.split()[0].decode() for line in lines if line and not line.startswith(b"-")]
    return prerequisites, refs, int.from_bytes(pack[8:12], "big")


def objects(repo: Path, *revs: str) -> set[str]:
    out = subprocess.run(["git", "-C", str(repo), "rev-list", "--objects", *revs],
                         capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_two_tasks_pinned_to_the_second_node_land(
        git_repo: Path, claude_bin: str, ray_cluster: RayCluster,
        endpoint: ScriptedEndpoint, tmp_path: Path) -> None:
    node_dir = tmp_path / "node"
    add_history(git_repo)
    base = subprocess.run(["git", "-C", str(git_repo), "rev-parse", "main"],
                          capture_output=True, text=True, check=True).stdout.strip()
    fleet = make(endpoint, claude_bin, ray_cluster, node_dir)
    try:
        submitted = time.monotonic()
        one, two = (fleet.submit(TaskSpec(prompt=f"[script:commit-{n}] commit it",
                                          repo=git_repo, host="cluster"))[0]
                    for n in ("one", "two"))
        first_event: dict[str, float] = {}
        # the node's events.jsonl (this machine's file system: seen as it is written)
        # against the local one, every 20 ms: when each size the node reached arrived here
        lags: list[float] = []
        rss: list[int] = []
        stop_sampling = threading.Event()

        def sample() -> None:
            seen_there: dict[tuple[str, int], float] = {}
            measured: set[tuple[str, int]] = set()
            while not stop_sampling.wait(0.02):
                now = time.monotonic()
                for task in (one, two):
                    local = len(_bytes(paths.attempt_dir(git_repo, task.id, 1) /
                                       "events.jsonl"))
                    if task.id not in first_event and local:
                        first_event[task.id] = now
                    size = len(_bytes(node_dir / "attempts" / task.id / "1" / "events.jsonl"))
                    if size and (task.id, size) not in measured:
                        seen_there.setdefault((task.id, size), now)
                    for (tid, at_size), at in list(seen_there.items()):
                        if tid == task.id and local >= at_size:
                            lags.append(now - at)
                            del seen_there[(tid, at_size)]
                            measured.add((tid, at_size))
                rss.append(int(Path("/proc/self/statm").read_text().split()[1]) * 4096)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            drive(fleet, settled(fleet, one.id, two.id), timeout=150)
        finally:
            stop_sampling.set()
            sampler.join(timeout=5)
        for task in (one, two):
            done = fleet.get_task(task.id)
            assert done.state == TaskState.SUCCEEDED, done.message
        FIGURES["submit_to_first_event_s"] = round(
            min(first_event.values()) - submitted, 2)
        lags.sort()
        if lags:
            FIGURES["node_write_to_local_s"] = {
                "n": len(lags), "median": round(lags[len(lags) // 2], 2),
                "p90": round(lags[int(len(lags) * 0.9)], 2), "max": round(lags[-1], 2)}
        FIGURES["controller_rss_mib"] = {"min": rss and round(min(rss) / 2 ** 20, 1),
                                         "max": rss and round(max(rss) / 2 ** 20, 1)}
        print("figures:", FIGURES)
        # both ran on the second node, one job each, the second after the first
        second = node_of(ray_cluster, NODE_RESOURCE)
        tips = []  # the branches as the node left them
        for task in (one, two):
            (job,) = jobs_of(ray_cluster, task.id)
            assert job["status"] == "SUCCEEDED"
            assert job["driver_node_id"] == second
            (attempt,) = fleet.attempts(task.id)
            assert attempt.host == "cluster"
            tips.append(json.loads(Path(attempt.dir or "", "branch.json").read_text())["tip"])
            local = Path(attempt.dir or "") / "events.jsonl"
            there = node_dir / "attempts" / task.id / "1" / "events.jsonl"
            # the mirror: byte for byte what the node's runner wrote
            assert local.read_bytes() == there.read_bytes()
            assert b'"type":"result"' in local.read_bytes()
            for name in ("stderr.log", "runner.log", "exit.json", "runner.json"):
                # (a file the node left empty is not made here)
                assert _bytes(Path(attempt.dir or "") / name) == \
                    _bytes(node_dir / "attempts" / task.id / "1" / name), name
        # the first lands through the queue (its own process builds the Ray host from
        # config.toml: the commits come from the bundle the node sent back)
        fleet.enqueue([one.id])
        drive(fleet, lambda: fleet.get_task(one.id).land_state in (
            LandState.MERGED, LandState.STOPPED), timeout=120)
        landed = fleet.get_task(one.id)
        assert landed.land_state == LandState.MERGED, landed.land_note
        # the second after it: main moved, so the queue first updates the branch in its
        # worktree, which is on the node: a short update job pinned to that node merges
        # main there and sends the branch back, and the queue lands it
        fleet.enqueue([two.id])
        drive(fleet, lambda: fleet.get_task(two.id).land_state in (
            LandState.MERGED, LandState.STOPPED), timeout=150)
        landed = fleet.get_task(two.id)
        assert landed.land_state == LandState.MERGED, landed.land_note
        updates = [j for j in jobs_of(ray_cluster, two.id)
                   if (j.get("metadata") or {}).get("fleet-tui-update")]
        assert [(j["status"], j["driver_node_id"]) for j in updates] == [
            ("SUCCEEDED", second)]
        # the first jobs (staged together, before the node said what it holds) carried
        # the base's whole history; the update job only what the node lacked: cut against
        # the tips its mirror reported (the base, each task's branch as the job left it)
        whole = job_bundle(ray_cluster, jobs_of(ray_cluster, one.id)[0])
        thin = job_bundle(ray_cluster, updates[0])
        prerequisites, (one_landed,), count = bundle_objects(thin)
        assert bundle_objects(whole)[0] == [] and prerequisites
        assert one_landed == _git_out(git_repo, "rev-parse", "main^1")  # main, one merged
        # what the node lacked: the objects of main's tip not in what it held; the pack
        # holds as many objects as that (it must hold those for the fetch there to work),
        # so none of what the node had
        lacked = objects(git_repo, one_landed) - objects(git_repo, base, *tips)
        assert lacked and count == len(lacked)
        assert len(thin) * 50 < len(whole)
        FIGURES["bundle_bytes"] = {"first": len(whole), "second": len(thin),
                                   "second_objects": count}
        # one was merged: released, its worktree and config dir removed from the node by
        # the next job there (two's update); two's wait for the next one
        assert not (node_dir / "work" / one.id).exists()
        assert not (node_dir / "config" / one.id).exists()
        assert (node_dir / "work" / two.id).is_dir()
        book = json.loads((paths.home() / "ray" / "cluster.json").read_text())
        assert sorted(book["released"]) == [two.id]
        # the node's worktree holds the merge too (a follow-up goes on from it)
        there = subprocess.run(["git", "-C", str(node_dir / "work" / two.id), "show",
                                "HEAD:one.txt"], capture_output=True, text=True,
                               check=False).stdout
        assert there == "one\n"
        for name in ("one", "two"):
            shown = subprocess.run(["git", "-C", str(git_repo), "show", f"main:{name}.txt"],
                                   capture_output=True, text=True, check=True).stdout
            assert shown == f"{name}\n"
    finally:
        control.stop(fleet.env)
        ray_host(fleet).close()


def _daemon_running(fleet: Fleet, git_repo: Path, node_dir: Path) -> tuple[Task, str]:
    """A task on the node whose worker's Bash step left two sleeps running, one of them a
    double-forked daemon; its attempt's token (the sweep's mark)."""
    (task,) = fleet.submit(TaskSpec(prompt="[script:daemon] wait", repo=git_repo,
                                    host="cluster"))
    drive(fleet, lambda: len(node_pids(node_dir, *SLEEPS)) == 2, timeout=120)
    attempt = fleet.attempts(task.id)[-1]
    assert attempt.dir is not None
    token = AttemptLog(attempt.dir).spec_token()
    assert token
    return task, token


def test_kill_leaves_no_process_of_the_job(git_repo: Path, claude_bin: str,
                                           ray_cluster: RayCluster,
                                           endpoint: ScriptedEndpoint, tmp_path: Path) -> None:
    node_dir = tmp_path / "node"
    fleet = make(endpoint, claude_bin, ray_cluster, node_dir)
    try:
        task, token = _daemon_running(fleet, git_repo, node_dir)
        fleet.kill(task.id)
        done = fleet.get_task(task.id)
        assert done.state == TaskState.KILLED and done.verdict == "killed"
        deadline = time.monotonic() + 20
        while node_pids(node_dir, *SLEEPS) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert node_pids(node_dir, *SLEEPS) == []  # the double-forked one too
        assert node_pids(node_dir, f"attempts/{task.id}/") == []  # the runner
        assert _token_holders(token) == []
        (job,) = jobs_of(ray_cluster, task.id)
        drive(fleet, lambda: jobs_of(ray_cluster, task.id)[0]["status"] == "STOPPED",
              timeout=30)
        assert job["submission_id"] == json.loads(
            (Path(fleet.attempts(task.id)[-1].dir or "") / "ray.json").read_text()
        )["submission_id"]
    finally:
        for pid in node_pids(node_dir, *SLEEPS):
            os.kill(pid, signal.SIGKILL)
        control.stop(fleet.env)
        ray_host(fleet).close()


def _token_holders(token: str) -> list[int]:
    needle = f"FLEET_ATTEMPT_TOKEN={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


CONTROLLER = """
import sys, time, types
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import folders
folders.on_path()
from test_fleet import drive
from test_ray_host import _events, make
from fleet_tui.engine.fleet import TaskSpec
url, claude, address, node_dir, repo = sys.argv[2:7]
fleet = make(types.SimpleNamespace(url=url), claude, types.SimpleNamespace(address=address),
             Path(node_dir))
(task,) = fleet.submit(TaskSpec(prompt="[script:pause] wait", repo=Path(repo), host="cluster"))
drive(fleet, lambda: b"tool_use" in _events(fleet, task.id), timeout=120)
print(task.id, flush=True)
while True:  # following, until SIGKILLed
    fleet.tick()
    time.sleep(0.2)
"""


def test_a_sigkilled_controller_is_reattached_by_the_submission_id(
        git_repo: Path, claude_bin: str, ray_cluster: RayCluster,
        endpoint: ScriptedEndpoint, tmp_path: Path) -> None:
    """A controller of its own (a separate process) submits the job and follows it, and is
    SIGKILLed mid-job; a new engine here finds the job by the submission id recorded
    before it was submitted and follows it to its end: one job for the attempt, never a
    second submit."""
    node_dir = tmp_path / "node"
    child = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, str(Path(__file__).parents[2] / "support"), endpoint.url,
         claude_bin, ray_cluster.address, str(node_dir), str(git_repo)],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ), start_new_session=True)
    try:
        assert child.stdout is not None
        task_id = child.stdout.readline().strip()
        assert task_id, f"the controller exited {child.wait(timeout=30)}"
        assert [j["status"] for j in jobs_of(ray_cluster, task_id)] == ["RUNNING"]
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=30)
    again = make(endpoint, claude_bin, ray_cluster, node_dir)
    try:
        drive(again, settled(again, task_id), timeout=120)
        done = again.get_task(task_id)
        assert done.state == TaskState.SUCCEEDED, done.message
        assert len(again.attempts(task_id)) == 1  # adopted: no second attempt
        assert b"finished after the pause" in _events(again, task_id)
        assert ray_host(again).submitted == []  # followed, never submitted again
        assert [j["status"] for j in jobs_of(ray_cluster, task_id)] == ["SUCCEEDED"]
        there = node_dir / "attempts" / task_id / "1" / "events.jsonl"
        assert _events(again, task_id) == there.read_bytes()  # replayed: byte for byte
    finally:
        control.stop(again.env)
        ray_host(again).close()


def test_say_reaches_the_worker_and_its_follow_up_stays_on_its_node(
        git_repo: Path, claude_bin: str, ray_cluster: RayCluster,
        endpoint: ScriptedEndpoint, tmp_path: Path) -> None:
    """`say` to a running Ray worker: the message left in the attempt's mailbox here, the
    job fetches it through the gateway with its token and hands it to its runner's own
    input channel (taken, logged in input.jsonl on the node and mirrored here), never in
    the job's metadata; refused once the task has finished. The follow-up is pinned to the
    node that holds the worktree and claude's session (its ray.io/node-id label)."""
    node_dir = tmp_path / "node"
    fleet = make(endpoint, claude_bin, ray_cluster, node_dir)
    text = "also say hello from the mailbox"
    try:
        (task,) = fleet.submit(TaskSpec(prompt="[script:steer] wait", repo=git_repo,
                                        host="cluster"))
        drive(fleet, lambda: fleet.get_task(task.id).state == TaskState.RUNNING
              and b"tool_use" in _events(fleet, task.id), timeout=120)
        said = time.monotonic()
        assert fleet.say(task.id, text, wait=20) is True  # taken by the node's runner
        FIGURES["say_to_taken_s"] = round(time.monotonic() - said, 2)
        drive(fleet, settled(fleet, task.id), timeout=120)
        assert fleet.get_task(task.id).state == TaskState.SUCCEEDED
        first = fleet.attempts(task.id)[-1]
        folder = AttemptLog(first.dir or "")
        assert text.encode() in _events(fleet, task.id)  # claude took it in
        assert [m["text"] for m in folder.input_messages()] == [text]  # mirrored
        assert (folder.dir / "input.jsonl").read_bytes() == \
            (node_dir / "attempts" / task.id / "1" / "input.jsonl").read_bytes()
        assert not any((folder.dir / "input").glob("*"))  # the mailbox is empty
        (job,) = jobs_of(ray_cluster, task.id)
        assert text not in json.dumps(job)  # never in the job's metadata or entrypoint
        with pytest.raises(WorkerFinished):
            fleet.say(task.id, "too late")
        node = json.loads((folder.dir / "ray.json").read_text())["node_id"]
        assert node == job["driver_node_id"]
        fleet.follow_up(task.id, "[script:steer] and then?")
        drive(fleet, settled(fleet, task.id), timeout=120)
        again = fleet.get_task(task.id)
        assert again.state == TaskState.SUCCEEDED, again.message
        second = fleet.attempts(task.id)[-1]
        assert second.n == 2 and second.host == "cluster"
        assert b"followed up on the node" in _events(fleet, task.id)  # the session resumed
        record = json.loads((Path(second.dir or "") / "ray.json").read_text())
        assert record["pinned"] == node and record["node_id"] == node
        jobs2 = [j for j in jobs_of(ray_cluster, task.id) if j["submission_id"]
                 == record["submission_id"]]
        assert [j["driver_node_id"] for j in jobs2] == [node]
        # the node's mirror holds the base (its first job said so): no bundle at all
        assert record["bundle"] == {"bytes": 0, "held": True}
        # main moves in a way that conflicts: the update job on the node stops mid-merge
        # there; the abort, a short job pinned to that node, puts the worktree back at the
        # task's tip, clean
        worktree = node_dir / "work" / task.id
        tip = _git_out(worktree, "rev-parse", "HEAD")
        (git_repo / "after.txt").write_text("main's own\n")
        subprocess.run(["git", "-C", str(git_repo), "add", "after.txt"], check=True)
        subprocess.run(["git", "-C", str(git_repo), "commit", "-q", "-m", "main's after"],
                       check=True)
        result = fleet.update(task.id)
        assert result.status == "conflicts", result.message
        assert fleet.get_task(task.id).conflicts == ["after.txt"]
        assert _git_out(worktree, "rev-parse", "-q", "--verify", "MERGE_HEAD")
        fleet.resolve_update(task.id, "abort")
        assert fleet.get_task(task.id).conflicts == []
        assert _git_out(worktree, "rev-parse", "HEAD") == tip
        assert _git_out(worktree, "status", "--porcelain") == ""
        assert not _git_out(worktree, "rev-parse", "-q", "--verify", "MERGE_HEAD")
        aborts = [j for j in jobs_of(ray_cluster, task.id)
                  if (j.get("metadata") or {}).get("fleet-tui-abort")]
        assert [(j["status"], j["driver_node_id"]) for j in aborts] == [("SUCCEEDED", node)]
    finally:
        control.stop(fleet.env)
        ray_host(fleet).close()


def _git_out(where: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True,
                          check=False).stdout.strip()


def test_a_node_that_lacks_what_its_bundle_needs_gets_it_whole(
        git_repo: Path, claude_bin: str, ray_cluster: RayCluster,
        endpoint: ScriptedEndpoint, tmp_path: Path) -> None:
    """What this machine knows of the node's mirror is wrong (it says the mirror holds
    main's parent; the mirror is new: wiped, as it were): the job's bundle, cut against
    it, does not verify there; the job says so before anything of the attempt ran, and it
    is sent again whole under a new id. One attempt; it succeeds; the node's real tips
    are known afterwards."""
    node_dir = tmp_path / "node"
    add_history(git_repo, 2)
    fleet = make(endpoint, claude_bin, ray_cluster, node_dir)
    host = ray_host(fleet)
    node = node_of(ray_cluster, NODE_RESOURCE)
    mirror = host.mirror_path(git_repo)
    parent = _git_out(git_repo, "rev-parse", "main~1")
    host.book.set_tips(node, mirror, [parent])
    try:
        (task,) = fleet.submit(TaskSpec(prompt="hello", repo=git_repo, host="cluster"))
        drive(fleet, settled(fleet, task.id), timeout=120)
        done = fleet.get_task(task.id)
        assert done.state == TaskState.SUCCEEDED, done.message
        (attempt,) = fleet.attempts(task.id)
        record = json.loads((Path(attempt.dir or "") / "ray.json").read_text())
        (first,) = record["lacked"]
        assert record["submission_id"] == f"{first}-whole"
        # the attempt ended when its exit record came back; Ray says its job ended once the
        # job's process has exited too, a moment later on a busy machine
        deadline = time.monotonic() + 60
        while True:
            statuses = {j["submission_id"]: j["status"] for j in jobs_of(ray_cluster, task.id)}
            if statuses.get(f"{first}-whole") not in ("PENDING", "RUNNING") \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert statuses == {first: "FAILED", f"{first}-whole": "SUCCEEDED"}
        assert record["bundle"]["prerequisites"] == []
        assert _git_out(git_repo, "rev-parse", "main") in host.book.tips(node, mirror)
        assert b'"type":"result"' in _events(fleet, task.id)
    finally:
        control.stop(fleet.env)
        host.close()


def test_a_key_the_cluster_holds_is_the_one_its_workers_use(
        git_repo: Path, claude_bin: str, ray_cluster: RayCluster,
        endpoint: ScriptedEndpoint, tmp_path: Path) -> None:
    """`key_env` in config.toml: the nodes hold the key (an admin's secret in their
    environment); the worker goes straight to its endpoint with that key, and nothing of
    this machine's key goes with the job."""
    node_dir = tmp_path / "node"
    fleet = make(endpoint, claude_bin, ray_cluster, node_dir,
                 host_lines=f'key_env = "{NODE_KEY_VAR}"\n')
    try:
        before = len(endpoint.requests)
        (task,) = fleet.submit(TaskSpec(prompt="hello", repo=git_repo, host="cluster"))
        drive(fleet, settled(fleet, task.id), timeout=120)
        done = fleet.get_task(task.id)
        assert done.state == TaskState.SUCCEEDED, done.message
        mine = [r for r in endpoint.requests[before:] if r.path.startswith("/v1/messages")]
        # the node's key on every request: not this machine's (which the gateway would put)
        held = hashlib.sha256(NODE_KEY.encode()).hexdigest()
        assert mine and {r.auth_sha256 for r in mine} == {held}
        (job,) = jobs_of(ray_cluster, task.id)
        assert KEY not in json.dumps(job) and NODE_KEY not in json.dumps(job)
    finally:
        control.stop(fleet.env)
        ray_host(fleet).close()


def test_the_key_never_reaches_the_cluster(git_repo: Path, claude_bin: str,
                                           ray_cluster: RayCluster,
                                           endpoint: ScriptedEndpoint,
                                           tmp_path: Path) -> None:
    node_dir = tmp_path / "node"
    fleet = make(endpoint, claude_bin, ray_cluster, node_dir)
    try:
        (task,) = fleet.submit(TaskSpec(prompt="[script:long] wait", repo=git_repo,
                                        host="cluster"))
        drive(fleet, lambda: b"tool_use" in _events(fleet, task.id), timeout=120)

        def holders() -> list[list[str]]:
            pids = _processes_holding(ray_cluster, "FLEET_ATTEMPT_TOKEN=", node_dir)
            return [procs.cmdline(pid) for pid in pids]
        # claude and its Bash step hold the attempt's token, never the key. The step's
        # process starts a moment after its tool_use is in the stream (later on a busy
        # machine): wait for it
        drive(fleet, lambda: ["sleep", "12"] in holders(), timeout=60)
        assert any(args and args[0] == claude_bin for args in holders())
        assert _processes_holding(ray_cluster, KEY, node_dir) == []
        running = _cluster_texts(ray_cluster, task.id)
        drive(fleet, settled(fleet, task.id), timeout=120)
        assert fleet.get_task(task.id).state == TaskState.SUCCEEDED
        ended = _cluster_texts(ray_cluster, task.id)
        sid = jobs_of(ray_cluster, task.id)[0]["submission_id"]
        for where, text in {**running, **{f"{k} (ended)": v for k, v in ended.items()}}.items():
            assert KEY not in text, where
        # the scan sees what the cluster shows: the job's id is in its listings
        assert sid in running["ray job list"] and sid in running["/api/jobs/"]
        files = _files_holding(ray_cluster.temp_dir, KEY) + _files_holding(node_dir, KEY)
        assert files == []
        assert _files_holding(ray_cluster.temp_dir, sid)  # the logs were read
    finally:
        control.stop(fleet.env)
        ray_host(fleet).close()


def test_host_check_probe_reads_git_python_and_claude_on_a_node(
        ray_cluster: RayCluster, claude_bin: str) -> None:
    """`host check NAME --probe`: one short job, placed by the host's resources as an
    attempt's job is, reads git, python and claude on its node (the host's settings
    name them there); a claude the node does not have is said, with the fix."""
    good = ray_host_config("cluster", 2, ray_cluster.address, resources={NODE_RESOURCE: 1.0},
                           python=sys.executable, claude=claude_bin, srt=SRT)
    before = len(jobs(ray_cluster))
    checks = {c.name: c for c in host_check.check_host(good, probe=True)[0]}
    assert all(c.ok for c in checks.values()), checks
    assert checks["claude"].found == f"{CLAUDE_CODE_VERSION} at {claude_bin}"
    assert node_of(ray_cluster, NODE_RESOURCE)[:12] in checks["probe"].found
    assert checks["python"].found == ".".join(map(str, sys.version_info[:3]))
    assert checks["cage"].found.startswith(f"can cage its workers (srt {cage.SRT_VERSION} "
                                           f"at {SRT}"), checks["cage"]
    missing = replace(good, options=replace(good.options, claude="/nowhere/on/the/nodes/claude"))
    said = {c.name: c for c in host_check.check_host(missing, probe=True)[0]}
    assert not said["claude"].ok and said["claude"].found == "not found", said
    assert "set claude in [hosts.cluster] to its path there" in said["claude"].fix
    assert len(jobs(ray_cluster)) == before + 2  # one job each, nothing else


def test_a_submit_the_head_has_no_job_agent_for_yet_is_asked_again(
        ray_cluster: RayCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's head answers a job it has no job agent for yet (a cluster just started, on a
    loaded machine) with 500 "No available agent to submit job, please try again later.":
    a benchmark's engine task failed at its start on that answer ("could not start ... the
    Ray cluster did not take the job"). The submit is asked again, every AGENT_RETRY
    seconds for AGENT_WAIT at most: two such answers, then the cluster takes the job and it
    runs; answered so for longer than AGENT_WAIT, the start fails saying Ray's words."""
    from fleet_tui.execution.ray import host as ray_host

    monkeypatch.setattr(ray_host, "AGENT_RETRY", 0.2)
    with NoAgentProxy(ray_cluster.address, refusals=2) as proxy:
        status, text, _node = ray_host.probe_job(
            proxy.address, "echo taken-after-two-refusals", resources={NODE_RESOURCE: 1.0},
            env=os.environ, timeout=120)
    assert proxy.submissions == 3
    assert status == "SUCCEEDED" and "taken-after-two-refusals" in text, (status, text)
    monkeypatch.setattr(ray_host, "AGENT_WAIT", 1.0)
    before = len(jobs(ray_cluster))
    with NoAgentProxy(ray_cluster.address, refusals=1000) as proxy, \
            pytest.raises(ray_host.RayError) as refused:
        ray_host.probe_job(proxy.address, "echo never", resources={NODE_RESOURCE: 1.0},
                           env=os.environ, timeout=60)
    assert 2 <= proxy.submissions <= 7, proxy.submissions  # every 0.2 s for 1 s
    assert "did not take the probe job" in str(refused.value)
    assert "No available agent to submit job" in str(refused.value)
    assert "(asked for 1 s)" in str(refused.value)
    assert len(jobs(ray_cluster)) == before  # nothing reached the cluster


def test_host_check_probe_says_how_a_nodes_workers_are_contained(
        ray_cluster: RayCluster, claude_bin: str) -> None:
    """`host check NAME --probe` of a Ray host has the `contain` line the local and SSH
    checks have: how an attempt's processes would be held on the node (a cgroup, a PID
    namespace, else a warning), read there by the probe job with the node's python. The
    test cluster's node is this machine, so it says what the same probe says here."""
    host = ray_host_config("cluster", 2, ray_cluster.address, resources={NODE_RESOURCE: 1.0},
                           python=sys.executable, claude=claude_bin, srt=SRT)
    checks = host_check.check_host(host, probe=True)[0]
    named = {c.name: c for c in checks}
    assert "contain" in named, [c.name for c in checks]
    here = subprocess.run([sys.executable, "-S", "-c", procs.CONTAIN_PROBE],
                          capture_output=True, text=True, timeout=60, check=False)
    expected = probe.contain_check(here.stdout.strip().splitlines()[-1])
    assert named["contain"] == expected, (named["contain"], here.stdout, here.stderr)


def test_a_caged_worker_on_a_node(git_repo: Path, claude_bin: str, ray_cluster: RayCluster,
                                  endpoint: ScriptedEndpoint, tmp_path: Path) -> None:
    """The Ray host's workers are caged as this machine's are, with the srt its settings
    name on the nodes, once `host check --probe` read that a node can cage (before, a
    caged task is refused in one line): a connection to a host the settings do not allow
    is refused and shown as blocked; the worker's commit comes back."""
    if SRT is None:
        pytest.fail("no srt here (scripts/test installs it into .srt/)")
    fleet = make(endpoint, claude_bin, ray_cluster, tmp_path / "node", caged=True,
                 host_lines=f'srt = "{SRT}"\n')
    try:
        with pytest.raises(Exception, match="host cluster has not been checked for the cage"):
            fleet.submit(TaskSpec(prompt="[script:caged-node] x", repo=git_repo,
                                  host="cluster"))
        assert fleet.store.list_tasks() == []
        checked = {c.name: c for c in host_check.check_host(
            fleet.settings.host("cluster"), probe=True)[0]}
        assert checked["cage"].ok, checked
        (task,) = fleet.submit(TaskSpec(prompt="[script:caged-node] reach out",
                                        repo=git_repo, host="cluster"))
        drive(fleet, settled(fleet, task.id), timeout=240)
        done = fleet.get_task(task.id)
        assert done.state == TaskState.SUCCEEDED, done.message
        (attempt,) = fleet.attempts(task.id)
        log = fleet.attempt_log(attempt)
        assert log is not None and log.cage_policy.exists()  # it ran caged on the node
        blocked = [(b.action, b.target) for b in log.blocked()]
        assert ("connect", "example.com:443") in blocked, blocked
        spec = json.loads((tmp_path / "node" / "attempts" / task.id / "1" /
                           "spec.json").read_text())
        assert spec["settings"]["cage"] == "worker" and spec["env"][cage.SRT_ENV] == SRT
        tip = json.loads(Path(attempt.dir or "", "branch.json").read_text())["tip"]
        assert tip and tip != task.base_commit
    finally:
        control.stop(fleet.env)
        ray_host(fleet).close()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return str(resp.read().decode("utf-8", "replace"))


def _cluster_texts(cluster: RayCluster, task_id: str) -> dict[str, str]:
    sid = jobs_of(cluster, task_id)[0]["submission_id"]
    listed = subprocess.run([str(Path(sys.executable).parent / "ray"), "job", "list",
                             "--address", cluster.address], capture_output=True, text=True,
                            env=cluster.env(), timeout=120, check=False)
    out = {"ray job list": listed.stdout + listed.stderr}
    for path in ("/api/jobs/", f"/api/jobs/{sid}", f"/api/jobs/{sid}/logs",
                 "/api/v0/actors?detail=1&limit=1000", "/api/v0/jobs?limit=1000",
                 "/api/v0/tasks?detail=1&limit=1000", "/api/v0/workers?detail=1&limit=1000",
                 "/api/v0/nodes?detail=1", "/api/v0/runtime_envs?detail=1"):
        try:
            out[path] = _get(cluster.address + path)
        except OSError as exc:
            out[path] = f"({exc})"
    return out


def _files_holding(root: Path, needle: str) -> list[str]:
    hits = []
    data = needle.encode()
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and data in path.read_bytes():
                hits.append(str(path))
        except OSError:
            continue
    return hits


def _processes_holding(cluster: RayCluster, needle: str, *roots: Path) -> list[int]:
    """The cluster's processes (its sessions, and whatever works under its folders or
    `roots`: the runners and claude have sessions of their own) whose environment or
    argv holds `needle`."""
    data = needle.encode()
    pids = {pid for proc in cluster.procs for pid in cluster.session_pids(proc)}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if any(cwd.startswith(str(r)) for r in (cluster.root, *roots)):
                pids.add(int(entry.name))
    hits = []
    for pid in sorted(pids):
        try:
            if data in Path(f"/proc/{pid}/environ").read_bytes() \
                    or data in Path(f"/proc/{pid}/cmdline").read_bytes():
                hits.append(pid)
        except OSError:
            continue
    return hits


# Tasks, each started by a `run` process of its own. Eight, not twenty: with the race back
# (a follower that takes a job Ray does not know yet for never submitted) 5 or 6 of the 8
# ran twice in each of 4 runs, so the test fails as surely as it did with 20 (5 of 20),
# and the serial pass, where this test is most of the wall time, is ~15 s shorter.
RACE_TASKS = 8
# four at a time (it was two): as many tasks and races, and the serial pass ~9 s shorter
RACE_CAP = 4  # the host's max_workers
RACE_RUNS = 4  # `run` processes at once


def _ray_intervals(cluster: RayCluster) -> dict[str, list[tuple[float, float]]]:
    """Each task's attempt jobs (update jobs left out) as (start, end) in seconds; a job
    not ended yet ends now."""
    now = time.time()
    found: dict[str, list[tuple[float, float]]] = {}
    for job in jobs(cluster):
        meta = job.get("metadata") or {}
        if "fleet-tui-attempt" not in meta or not job.get("start_time"):
            continue
        end = job.get("end_time")
        found.setdefault(str(meta["fleet-tui-task"]), []).append(
            (job["start_time"] / 1000, end / 1000 if end else now))
    return found


# alone (the serial pass): twenty `run` processes and a poller beside a two-node cluster
# are many processes for two cores while another test also runs
@pytest.mark.serial
@pytest.mark.timeout(900)
def test_tasks_started_by_short_lived_processes_are_submitted_once(
        git_repo: Path, claude_bin: str, ray_cluster: RayCluster,
        endpoint: ScriptedEndpoint, tmp_path: Path) -> None:
    """RACE_TASKS tasks, each queued and started by a `run` process that exits once its
    task started, while an engine here follows them all and `ls` processes poll (each a
    pass that follows, and starts what is queued): every attempt is submitted once (one
    job per task, one attempt per task), no two jobs of a task ever run at once, and the
    host's cap holds on the cluster (jobs at once, as Ray timed them). A process that
    asked for a job while its submit was under way (Ray: 404) once took it for never
    submitted, and requeued the task when the `run` that was submitting it exited."""
    node_dir = tmp_path / "node"
    config = config_file_path(os.environ)
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        f'base_url = "{endpoint.url}"\nclaude = "{claude_bin}"\n'
        f'sandbox = {"true" if os.geteuid() == 0 else "false"}\nkey_sources = ["env"]\n'
        "max_workers = 8\nmax_attempts = 1\ngateway = true\nkill_grace = 2.0\n"
        f'[hosts.cluster]\nray = "{ray_cluster.address}"\nmax_workers = {RACE_CAP}\n'
        f'data_dir = "{node_dir}"\npython = "{sys.executable}"\nclaude = "{claude_bin}"\n'
        'cage = "off"\n')
    root = str(Path(__file__).resolve().parents[3])
    # (PYTHONFAULTHANDLER: a process that dies of a fatal signal says where, on its stderr)
    env = dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0",
               FLEET_WORKER_GATEWAY="1", PYTHONFAULTHANDLER="1",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    fleet = Fleet(load_settings(env=env), Store(paths.db_path()), env=env)
    started: list[subprocess.Popen[str]] = []
    failures: list[str] = []
    stop = threading.Event()

    def launch() -> None:  # RACE_RUNS `run`s at a time, each exiting once its task started
        for n in range(RACE_TASKS):
            while sum(p.poll() is None for p in started) >= RACE_RUNS \
                    and not stop.is_set():
                time.sleep(0.05)
            if stop.is_set():
                return
            started.append(subprocess.Popen(
                [sys.executable, "-m", "fleet_tui.cli", "run", f"[script:chat] task {n}",
                 "--host", "cluster"], cwd=git_repo, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))

    def poll() -> None:  # short-lived passes: `ls`, one after another
        while not stop.is_set():
            done = subprocess.run([sys.executable, "-m", "fleet_tui.cli", "ls"], cwd=git_repo,
                                  env=env, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, check=False)
            if done.returncode != 0 or "Traceback" in done.stderr:
                failures.append(f"exit {done.returncode}: {done.stderr[-2000:]}"
                                f"\nstdout: {done.stdout[-1000:]}")

    threads = [threading.Thread(target=launch, daemon=True),
               threading.Thread(target=poll, daemon=True)]
    for thread in threads:
        thread.start()
    most = 0
    try:
        def all_settled() -> bool:
            tasks = fleet.list_tasks()
            return (len(started) == RACE_TASKS and all(p.poll() is not None for p in started)
                    and len(tasks) == RACE_TASKS and all(t.state in (
                        TaskState.SUCCEEDED, TaskState.FAILED, TaskState.KILLED)
                        for t in tasks))

        def watch() -> None:
            nonlocal most
            now = time.time()
            running = sum(1 for spans in _ray_intervals(ray_cluster).values()
                          for a, b in spans if a <= now < b)
            most = max(most, running)

        drive(fleet, all_settled, timeout=540, each=watch)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
        control.stop(fleet.env)
        ray_host(fleet).close()
    for proc in started:
        assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    assert failures == []
    spans = _ray_intervals(ray_cluster)
    tasks = fleet.list_tasks()
    for task in tasks:
        assert task.state == TaskState.SUCCEEDED, (task.id, task.message)
    twice = {t.id: len(fleet.attempts(t.id)) for t in tasks if len(fleet.attempts(t.id)) != 1}
    assert twice == {}, f"tasks with more than one attempt: {twice}"
    jobs_twice = {t.id: spans.get(t.id) for t in tasks if len(spans.get(t.id) or []) != 1}
    assert jobs_twice == {}, f"tasks with other than one job: {jobs_twice}"
    # the cap on the cluster: a job starts once a slot is free, and Ray times a job's end
    # after its end came back here (its supervisor's exit): SLACK seconds of overlap allowed
    slack = 2.0
    all_spans = [span for each in spans.values() for span in each]
    edges = sorted([(a, 1) for a, _b in all_spans] + [(b - slack, -1) for _a, b in all_spans])
    at_once = peak = 0
    for _t, step in edges:
        at_once += step
        peak = max(peak, at_once)
    FIGURES["race_jobs_at_once"] = {"peak": peak, "seen": most}
    print("jobs at once:", peak, "seen while running:", most)
    assert peak <= RACE_CAP


@pytest.mark.timeout(420)  # Ray's health check takes its time to give a node up
def test_a_lost_node_loses_the_task_and_its_processes_end(
        git_repo: Path, claude_bin: str, ray_cluster: RayCluster,
        endpoint: ScriptedEndpoint, tmp_path: Path) -> None:
    """The second node's raylet SIGKILLed mid-job (the last test here): Ray reads the job
    FAILED after its health check, and the task ends lost with the reason; the job's
    entrypoint, orphaned on its node, ends what the attempt started (the daemon
    included): 0 of its processes are left. A task that ended on that node before is
    followed up once another node (a new machine: the data dir empty) has joined: its
    worktree is made there from the branch that came back, claude's session from the
    transcripts its job sent at its end, and the session goes on; without those
    transcripts the start refuses at once, saying why and what to do."""
    node_dir = tmp_path / "node"
    fleet = make(endpoint, claude_bin, ray_cluster, node_dir)
    try:
        (ended,) = fleet.submit(TaskSpec(prompt="[script:brief] commit it", repo=git_repo,
                                         host="cluster"))
        drive(fleet, settled(fleet, ended.id), timeout=120)
        assert fleet.get_task(ended.id).state == TaskState.SUCCEEDED
        first = fleet.attempts(ended.id)[-1]
        assert (Path(first.dir or "") / "session.tar").is_file()  # the transcripts came back
        task, token = _daemon_running(fleet, git_repo, node_dir)
        assert _token_holders(token)
        old_node = node_of(ray_cluster, NODE_RESOURCE)
        raylet = ray_cluster.raylet_of(ray_cluster.procs[1])
        assert raylet is not None
        os.kill(raylet, signal.SIGKILL)
        killed = time.monotonic()
        drive(fleet, settled(fleet, task.id), timeout=240)
        FIGURES["node_loss_to_lost_s"] = round(time.monotonic() - killed, 1)
        done = fleet.get_task(task.id)
        assert done.state == TaskState.FAILED
        assert done.message is not None and done.message.startswith("lost: the Ray job "), \
            done.message
        # what happened, not Ray's word for the job alone ("ended SUCCEEDED" was seen)
        assert f"its node {old_node[:12]} is gone before its runner's end came back" \
            in done.message, done.message
        deadline = time.monotonic() + 30
        while (node_pids(node_dir, *SLEEPS) or _token_holders(token)) \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        assert node_pids(node_dir, *SLEEPS) == []
        assert _token_holders(token) == []
        assert node_pids(node_dir, f"attempts/{task.id}/") == []  # the runner too
        # the node's disk went with it; without the transcripts here nothing can go on:
        # the follow-up is refused when asked, nothing queued (no job, no traceback)
        shutil.rmtree(node_dir)
        session = Path(first.dir or "") / "session.tar"
        session.rename(session.with_suffix(".away"))
        asked = time.monotonic()
        with pytest.raises(FleetRefused) as refused:
            fleet.follow_up(ended.id, "[script:brief] go on")
        FIGURES["follow_up_refused_s"] = round(time.monotonic() - asked, 2)
        said = str(refused.value)
        assert "is gone from host cluster's cluster" in said, said
        assert f"fleet-tui retry {ended.id}" in said, said
        kept = fleet.get_task(ended.id)
        assert kept.state == TaskState.SUCCEEDED  # as it was: nothing queued
        assert len(fleet.attempts(ended.id)) == 1
        assert len(jobs_of(ray_cluster, ended.id)) == 1  # nothing was submitted for it
        with pytest.raises(FleetRefused):
            fleet.retry(ended.id, resume=True)  # a resume likewise
        # with them (and a new node that can run its jobs): the session goes on there
        session.with_suffix(".away").rename(session)
        ray_cluster.start_node()
        new_node = node_of(ray_cluster, NODE_RESOURCE)
        assert new_node != old_node
        fleet.follow_up(ended.id, "[script:brief] go on")
        drive(fleet, settled(fleet, ended.id), timeout=120)
        again = fleet.get_task(ended.id)
        assert again.state == TaskState.SUCCEEDED, again.message
        assert b"followed up on another node" in _events(fleet, ended.id)
        last = fleet.attempts(ended.id)[-1]
        record = json.loads((Path(last.dir or "") / "ray.json").read_text())
        assert record["restored"] is True and record["node_id"] == new_node
        assert _git_out(node_dir / "work" / ended.id, "show", "HEAD:brief.txt") == "brief"
    finally:
        for pid in node_pids(node_dir, *SLEEPS):
            os.kill(pid, signal.SIGKILL)
        control.stop(fleet.env)
        ray_host(fleet).close()
