"""Every task runs once: an engine killed while it starts a runner,
and a second engine (another terminal's `fleet-tui ls`) beside a slow first one, never
make two workers of one task. Real engine processes, real SIGKILL, real git (a real
post-checkout hook makes the checkout slow), real runners and the real claude."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_tui.core import stream
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine import supervisor as supervisor_mod
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.execution.worker.attemptlog import EVENTS_FILE
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import FINISHED_STATES, Store, TaskState
from fleet_tui.system import paths, procs

KEY = "sk-fleet-once-SECRET-0c1e"
TESTS = Path(__file__).resolve().parents[1] / "support"
ROOT = TESTS.parents[1]

SCRIPTS: dict[str, Any] = {
    # long enough that a second runner would overlap the first one
    "default": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "sleep 2; echo once >> once.txt", "description": "work"}}],
        "done once",
    ],
}


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(SCRIPTS) as ep:
        yield ep


def _overrides(endpoint: ScriptedEndpoint, claude: str, **more: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "base_url": endpoint.url, "claude": claude, "sandbox": os.geteuid() == 0,
        "key_sources": "env", "kill_grace": 2.0, "max_workers": 4,
    }
    values.update(more)
    return values


def _env() -> dict[str, str]:
    return dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0")


def make_fleet(endpoint: ScriptedEndpoint, claude: str, **more: Any) -> Fleet:
    settings = load_settings(env=os.environ, overrides=_overrides(endpoint, claude, **more))
    return Fleet(settings, Store(paths.db_path()), env=_env())


def engine_process(tmp_path: Path, endpoint: ScriptedEndpoint, claude: str, *,
                   die_at: str | None = None, until_settled: list[str] | None = None,
                   start_grace: float | None = None, **more: Any) -> subprocess.Popen[bytes]:
    """Start tests/support/engine_child.py: a real engine in its own process."""
    config = tmp_path / f"engine-{time.monotonic_ns()}.json"
    config.write_text(json.dumps({
        "settings": _overrides(endpoint, claude, **more), "env": _env(),
        "db": str(paths.db_path()), "die_at": die_at, "until_settled": until_settled,
        "start_grace": start_grace}))
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*inherited, str(ROOT), str(TESTS)]))
    return subprocess.Popen([sys.executable, str(TESTS / "engine_child.py"), str(config)],
                            env=env)


def drive(fleet: Fleet, until: Callable[[], bool], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            states = {t.id: (t.state, t.message) for t in fleet.list_tasks()}
            pytest.fail(f"timed out waiting; tasks: {states}")
        fleet.tick()
        time.sleep(0.05)


def runs_in(endpoint: ScriptedEndpoint, worktree: Path) -> int:
    """How many claude runs the endpoint saw in this worktree (first turns of the task's
    conversation; the CLI's title request is not a run)."""
    return sum(1 for r in endpoint.requests if r.turn == 0 and r.cwd == str(worktree)
               and not (r.prompt or "").startswith("<session>"))


def runner_processes(adir: Path) -> list[int]:
    return [st.pid for st in procs.all_stats() if st.state != "Z"
            and procs.cmdline(st.pid)[-1:] == [str(adir)]
            and "fleet_tui.execution.worker.runner" in procs.cmdline(st.pid)]


def assert_ran_once(fleet: Fleet, endpoint: ScriptedEndpoint, task_id: str) -> None:
    done = fleet.get_task(task_id)
    assert done.state == TaskState.SUCCEEDED, (done.state, done.message)
    attempts = fleet.attempts(task_id)
    assert len(attempts) == 1, [(a.n, a.verdict, a.message) for a in attempts]
    adir = Path(attempts[0].dir or "")
    events = stream.decode_all((adir / EVENTS_FILE).read_bytes())
    assert sum(isinstance(e, stream.Init) for e in events) == 1
    assert runs_in(endpoint, Path(done.worktree or "")) == 1
    assert (Path(done.worktree or "") / "once.txt").read_text() == "once\n"


@pytest.fixture
def no_runner_left(tmp_path: Path) -> Iterator[None]:
    """Kill the runners this test left, and only those: their attempt folder is under this
    test's tmp_path (other tests and other checkouts run runners on the same machine)."""
    yield
    mine = str(tmp_path)
    for st in procs.all_stats():
        argv = procs.cmdline(st.pid)
        if ("fleet_tui.execution.worker.runner" in argv and st.state != "Z"
                and any(arg.startswith(mine) for arg in argv)):
            procs.signal_tree(st.pid, signal.SIGKILL)


@pytest.mark.parametrize("die_at", ["after-claim", "after-worktree", "after-record-launch",
                                    "after-runner-spawn"])
def test_an_engine_killed_while_starting_a_task_never_runs_it_twice(
        die_at: str, git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_runner_left: None,
        procs_mode: str) -> None:
    fleet = make_fleet(endpoint, claude_bin)
    (task,) = fleet.submit(TaskSpec(prompt="work once", repo=git_repo))
    child = engine_process(tmp_path, endpoint, claude_bin, die_at=die_at)
    assert child.wait(timeout=60) == -signal.SIGKILL
    assert fleet.get_task(task.id).state == TaskState.RUNNING  # claimed by the dead engine
    # "any fleet-tui ls 60 s later": the start grace has passed
    monkeypatch.setattr(supervisor_mod, "START_GRACE", 0.5)
    time.sleep(0.6)
    drive(fleet, lambda: fleet.get_task(task.id).state in FINISHED_STATES)
    assert_ran_once(fleet, endpoint, task.id)


@pytest.mark.parametrize(("first_mode", "second_mode"), [
    ("linux", "linux"), ("portable", "portable"),
    # an engine recording /proc start times (as older versions did) beside one on the
    # portable path: the second must still see the first alive, by its owner's start time
    ("linux", "portable")] if sys.platform == "linux" else [("portable", "portable")])
def test_a_second_engine_beside_a_slow_start_never_runs_a_task_twice(
        first_mode: str, second_mode: str,
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, no_runner_left: None) -> None:
    monkeypatch.setattr(procs, "PORTABLE", second_mode == "portable")
    if first_mode == "portable":
        monkeypatch.setenv(procs.PORTABLE_ENV, "1")
    else:
        monkeypatch.delenv(procs.PORTABLE_ENV, raising=False)
    # a slow checkout: git runs this hook for every `git worktree add`
    hook = git_repo / ".git" / "hooks" / "post-checkout"
    hook.write_text("#!/bin/sh\nsleep 1\n")
    hook.chmod(0o755)
    # several at once (the engine's parallel start, not a lone one's), each claim held
    # through a checkout of 1 s, twice the grace the second engine is given below
    copies = 3
    fleet = make_fleet(endpoint, claude_bin, max_workers=copies)
    tasks = fleet.submit(TaskSpec(prompt="work once", repo=git_repo), copies=copies)
    ids = [t.id for t in tasks]
    first = engine_process(tmp_path, endpoint, claude_bin, until_settled=ids,
                           max_workers=copies)
    # the first engine claims all of them, then needs ~1 s per worktree
    deadline = time.monotonic() + 30
    while fleet.store.count_tasks(TaskState.RUNNING) < copies:
        assert time.monotonic() < deadline, "the first engine claimed nothing"
        time.sleep(0.02)
    # another terminal's `fleet-tui ls`, long enough after the claims (the grace shortened)
    monkeypatch.setattr(supervisor_mod, "START_GRACE", 0.5)
    try:
        drive(fleet, lambda: first.poll() is not None, timeout=180)
        assert first.returncode == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    for task_id in ids:
        assert_ran_once(fleet, endpoint, task_id)


def test_kill_during_a_slow_start_stops_it_before_any_runner(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint, tmp_path: Path,
        no_runner_left: None) -> None:
    hook = git_repo / ".git" / "hooks" / "post-checkout"
    hook.write_text("#!/bin/sh\nsleep 3\n")
    hook.chmod(0o755)
    fleet = make_fleet(endpoint, claude_bin)
    (task,) = fleet.submit(TaskSpec(prompt="work once", repo=git_repo))
    child = engine_process(tmp_path, endpoint, claude_bin)  # one pass: claim, checkout...
    try:
        deadline = time.monotonic() + 30
        while fleet.get_task(task.id).state != TaskState.RUNNING:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        fleet.kill(task.id)
        # kill did not wait for the start: the other engine is still in its checkout
        assert child.poll() is None
        killed = fleet.get_task(task.id)
        assert killed.state == TaskState.KILLED and killed.message == "killed before it started"
        assert child.wait(timeout=60) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    # its starter found it killed and spawned nothing
    done = fleet.get_task(task.id)
    assert done.state == TaskState.KILLED
    assert all(a.runner_pid is None and a.finished_at is not None for a in fleet.attempts(
        task.id))
    assert runner_processes(paths.attempt_dir(git_repo, task.id, 1)) == []
    assert endpoint.requests == []


def test_a_slow_start_keeps_its_claims_fresh(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint, tmp_path: Path,
        no_runner_left: None) -> None:
    """The heartbeat by which an engine on another host tells a slow start from a dead
    one: claimed_at moves while the claim waits for its turn."""
    hook = git_repo / ".git" / "hooks" / "post-checkout"
    hook.write_text("#!/bin/sh\nsleep 1\n")
    hook.chmod(0o755)
    # two: the claims of a start of several are the ones the heartbeat keeps fresh (a lone
    # claim is started at once); each waits through its checkout of 1 s, ten beats
    fleet = make_fleet(endpoint, claude_bin, max_workers=2)
    tasks = fleet.submit(TaskSpec(prompt="work once", repo=git_repo), copies=2)
    ids = [t.id for t in tasks]
    child = engine_process(tmp_path, endpoint, claude_bin, until_settled=ids, max_workers=2,
                           start_grace=0.4)
    seen: dict[str, set[float]] = {i: set() for i in ids}
    try:
        deadline = time.monotonic() + 60
        while not all(fleet.attempts(i) and fleet.attempts(i)[-1].dir for i in ids):
            assert time.monotonic() < deadline
            for i in ids:
                t = fleet.get_task(i)
                if t.claimed_at is not None and not (fleet.attempts(i)
                                                     and fleet.attempts(i)[-1].dir):
                    seen[i].add(t.claimed_at)
            time.sleep(0.02)
        assert child.wait(timeout=120) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert max(len(v) for v in seen.values()) >= 3, seen
    for i in ids:
        assert_ran_once(fleet, endpoint, i)


def test_a_claim_is_requeued_only_when_its_starter_is_provably_gone(git_repo: Path) -> None:
    """Claims nobody is launching, with the claimer: alive on this host, dead on this host,
    a dead engine object in this very process, and another host with and without a recent
    heartbeat. (No runner needed: what is checked is the requeue decision of one pass.)"""
    # max_workers 2: the two claims that stay fill the cap, so this pass starts nothing
    settings = load_settings(env=os.environ, overrides={
        "claude": "/nonexistent/claude", "key_sources": "env", "max_workers": 2,
        "base_url": "http://127.0.0.1:9"})
    fleet = Fleet(settings, Store(paths.db_path()))
    now = time.time()
    gone = Fleet(settings, Store(paths.db_path()))
    gone_owner = gone.owner
    del gone
    init_start = procs.start_time(1)
    claims = {
        "alive-here": (f"{supervisor_mod._HOST}:1:{init_start}:0", now - 3600),
        "dead-pid": (f"{supervisor_mod._HOST}:{2 ** 22 - 3}:12345:0", now),
        "dead-object": (gone_owner, now),
        "other-fresh": ("elsewhere.example:42:7:0", now - 5),
        "other-stale": ("elsewhere.example:42:7:0", now - supervisor_mod.START_GRACE - 5),
    }
    ids: dict[str, str] = {}
    for name, (owner, at) in claims.items():
        task = fleet.store.create_task(prompt=name, repo=git_repo, title=name,
                                       state=TaskState.RUNNING, claimed_by=owner,
                                       claimed_at=at, endpoint="http://127.0.0.1:9")
        ids[name] = task.id
    changes = fleet.tick()
    requeued = {c.task_id for c in changes if c.new == TaskState.QUEUED}
    assert requeued == {ids["dead-pid"], ids["dead-object"], ids["other-stale"]}
    for name in ("alive-here", "other-fresh"):
        kept = fleet.get_task(ids[name])
        assert kept.claimed_by == claims[name][0] and kept.state == TaskState.RUNNING


SLEEPY = [[{"type": "tool_use", "name": "Bash",
            "input": {"command": "sleep 341", "description": "wait"}}], "never reached"]


def test_a_new_attempt_waits_for_the_previous_runner_to_stop(
        git_repo: Path, claude_bin: str, tmp_path: Path, no_runner_left: None) -> None:
    """One live worker per task across attempts too: a task closed while its runner still
    lives (here set so in the store by hand, as a stand-in for any path that closes a task
    early) and resumed must not start a second runner in the same worktree."""
    with ScriptedEndpoint({"default": SLEEPY}) as ep:
        fleet = make_fleet(ep, claude_bin)
        (task,) = fleet.submit(TaskSpec(prompt="wait", repo=git_repo))

        def sleeping() -> list[int]:  # this test's sleep: it works in the repository
            found = []
            for st in procs.all_stats():
                if st.state == "Z" or procs.cmdline(st.pid) != ["sleep", "341"]:
                    continue
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{st.pid}/cwd").startswith(f"{git_repo}{os.sep}"):
                        found.append(st.pid)
            return found

        drive(fleet, lambda: bool(sleeping()) and fleet.get_task(task.id).session_id
              is not None, timeout=60)
        first = fleet.attempts(task.id)[-1]
        assert fleet.store.update_task(task.id, state=TaskState.FAILED, verdict="crashed",
                                       message="closed early (test)")
        fleet.retry(task.id, resume=True)
        for _ in range(10):
            fleet.tick()
            time.sleep(0.05)
        # still one runner: the resume waits in the queue for the first one to stop
        runners = [st.pid for st in procs.all_stats() if st.state != "Z"
                   and "fleet_tui.execution.worker.runner" in procs.cmdline(st.pid)
                   and task.id in " ".join(procs.cmdline(st.pid))]
        assert runners == [first.runner_pid]
        second = fleet.attempts(task.id)[-1]
        assert second.n == 2 and second.dir is None and second.runner_pid is None
        assert fleet.get_task(task.id).state == TaskState.QUEUED
        assert "waiting for the runner of attempt 1 to stop" in (
            fleet.get_task(task.id).message or "")
        for pid in sleeping():
            procs.signal_pid(pid, signal.SIGKILL)  # the first run ends (its step fails)
        assert procs.wait_gone([first.runner_pid or 0], 60)
        gone_at = time.time()
        drive(fleet, lambda: fleet.get_task(task.id).state in FINISHED_STATES, timeout=60)
        second = fleet.attempts(task.id)[-1]
        assert second.n == 2 and second.runner_pid is not None
        assert (second.started_at or 0) >= gone_at  # started only once the first was gone
