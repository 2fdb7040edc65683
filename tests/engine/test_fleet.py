"""The engine with real git repositories, real runner processes and the real claude binary
against the scripted endpoint: cap, backoff and fallback, quota cooldown, kill, adoption,
merge gates, two engines on one store, retry, resume and follow-up."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from proc_helpers import commands_in

from fleet_tui.core import stream
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, FleetError, TaskSpec
from fleet_tui.engine.supervisor import TaskChange
from fleet_tui.execution.worker.attemptlog import EVENTS_FILE, read_json
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import ACTIVE_STATES, Store, Task, TaskState
from fleet_tui.system import paths, procs
from fleet_tui.vcs.git import GitError

KEY = "sk-fleet-test-SECRET-41d8"
TICK = 0.05

SCRIPTS: dict[str, Any] = {
    # writes a file in two turns, then answers
    "default": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "echo worker > a.txt", "description": "write a.txt"}}],
        "wrote a.txt",
    ],
    # keeps its slot for a moment so that the cap is visible
    "slow": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "sleep 0.5; echo slow > slow.txt", "description": "slow"}}],
        "slow done",
    ],
    "sleepy": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "setsid sleep 327 </dev/null >/dev/null 2>&1 & sleep 326",
                    "description": "wait"}}],
        "never reached",
    ],
    "chat": ["first answer", "second answer", "third answer"],
    "three": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "echo one > one.txt", "description": "one"}}],
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "echo two > two.txt", "description": "two"}}],
        "three turns done",
    ],
}


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(SCRIPTS) as ep:
        yield ep


def make_fleet(endpoint: ScriptedEndpoint, claude: str, db: Path | None = None,
               **overrides: Any) -> Fleet:
    values: dict[str, Any] = {
        "base_url": endpoint.url, "claude": claude, "sandbox": os.geteuid() == 0,
        "key_sources": "env", "backoff_base": 0.2, "backoff_cap": 1.0, "kill_grace": 2.0,
        "max_workers": 4,
    }
    values.update(overrides)
    settings = load_settings(env=os.environ, overrides=values)
    env = dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0")
    store = Store(db if db is not None else paths.db_path())
    return Fleet(settings, store, env=env)


def drive(fleet: Fleet, until: Callable[[], bool], timeout: float = 60.0,
          each: Callable[[], None] | None = None,
          changes: list[TaskChange] | None = None) -> None:
    """Tick until `until()` holds (fail after timeout); what each pass changed is added
    to `changes` when given."""
    deadline = time.monotonic() + timeout
    while True:
        passed = fleet.tick()
        if changes is not None:
            changes.extend(passed)
        if each is not None:
            each()
        if until():
            return
        if time.monotonic() > deadline:
            states = {t.id: (t.state, t.message) for t in fleet.list_tasks()}
            pytest.fail(f"timed out waiting; tasks: {states}")
        time.sleep(TICK)


def settled(fleet: Fleet, *ids: str) -> Callable[[], bool]:
    done = {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.KILLED}
    return lambda: all(fleet.get_task(i).state in done for i in ids)


def sleepers(where: Path) -> list[int]:
    """The sleeps of the sleepy script that work under `where` (the test's repository, whose
    worktrees are in it): another test run's sleeps on the machine are neither counted
    nor killed."""
    return commands_in(where, "sleep 326", "sleep 327")


def snapshot(repo: Path) -> dict[str, str]:
    """Every file of the main checkout (outside .git and .fleet-work) with its hash, plus
    HEAD and the index: byte-identical means equal snapshots."""
    out: dict[str, str] = {}
    for path in sorted(repo.rglob("*")):
        rel = path.relative_to(repo)
        if rel.parts[0] in (".fleet-work",) or not path.is_file():
            continue
        if rel.parts[0] == ".git" and rel.as_posix() not in (".git/HEAD", ".git/index"):
            continue
        out[rel.as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    out["refs/heads/main"] = subprocess.run(["git", "rev-parse", "main"], cwd=repo, text=True,
                                            capture_output=True).stdout
    return out


def run_one(fleet: Fleet, repo: Path, prompt: str, **spec: Any) -> Task:
    (task,) = fleet.submit(TaskSpec(prompt=prompt, repo=repo, **spec))
    drive(fleet, settled(fleet, task.id))
    return fleet.get_task(task.id)


# --- scheduling -------------------------------------------------------------------------------


def test_three_tasks_under_a_cap_of_two(git_repo: Path, claude_bin: str,
                                         endpoint: ScriptedEndpoint) -> None:
    fleet = make_fleet(endpoint, claude_bin, max_workers=2)
    tasks = fleet.submit(TaskSpec(prompt="[script:slow] go", repo=git_repo, title="slow"),
                         copies=3)
    assert [t.state for t in tasks] == [TaskState.QUEUED] * 3
    assert len({t.branch for t in tasks}) == 3
    peak = {"store": 0, "claude": 0}

    def sample() -> None:
        running = fleet.store.count_tasks(ACTIVE_STATES, endpoint="default")  # its name
        worktrees = {str(paths.worktree_path(git_repo, t.id)) for t in tasks}
        # claude processes in the worktrees (a fork of claude, before it execs a tool,
        # shows the same argv, but its parent is claude; claude's own parent is its runner,
        # or in the worker's cage the sandbox's init)
        live = [st for st in procs.all_stats() if st.state != "Z"
                and procs.cmdline(st.pid)[:2] == [claude_bin, "-p"]
                and procs.cmdline(st.ppid)[:2] != [claude_bin, "-p"]
                and str(procs.cwd(st.pid)) in worktrees]  # None: it ended meanwhile
        peak["store"] = max(peak["store"], running)
        peak["claude"] = max(peak["claude"], len(live))
        assert running <= 2 and len(live) <= 2

    drive(fleet, settled(fleet, *[t.id for t in tasks]), each=sample)
    assert peak["store"] == 2  # the cap was used, never exceeded
    assert peak["claude"] >= 1
    for t in tasks:
        done = fleet.get_task(t.id)
        assert done.state == TaskState.SUCCEEDED, done.message
        assert done.verdict == "ok" and done.turns == 2 and done.session_id
        assert done.added_lines == 1 and done.deleted_lines == 0
        assert (Path(done.worktree or "") / "slow.txt").read_text() == "slow\n"
        assert done.input_tokens > 0 and done.output_tokens > 0
    status = fleet.status()
    assert status.running == 0 and status.queued == 0 and status.cap == 2
    assert status.total_tokens > 0


def test_overload_backoff_then_small_model(git_repo: Path, claude_bin: str) -> None:
    with ScriptedEndpoint({"default": ["fine"]}, faults=["529x2"]) as ep:
        fleet = make_fleet(ep, claude_bin, fallback_after=2, backoff_base=0.3,
                           model="big-model", small_model="small-model")
        (task,) = fleet.submit(TaskSpec(prompt="hello", repo=git_repo))
        # what the passes changed, not what a look between passes saw: on a loaded machine
        # one pass can follow an overload and start the next attempt, its backoff (0.3 s)
        # over before the pass came to its starts
        changes: list[TaskChange] = []
        drive(fleet, settled(fleet, task.id), changes=changes)
        done = fleet.get_task(task.id)
        assert done.state == TaskState.SUCCEEDED, done.message
        attempts = fleet.attempts(task.id)
        assert [a.verdict for a in attempts] == ["overload", "overload", "ok"]
        assert [a.model for a in attempts] == ["big-model", "big-model", "small-model"]
        assert [r.model for r in ep.requests] == ["big-model", "big-model", "small-model"]
        assert [r.status for r in ep.requests] == [529, 529, 200]
        # each overload put the task to wait before its next attempt
        moves = [(c.old, c.new) for c in changes if c.task_id == task.id]
        assert moves.count((TaskState.RUNNING, TaskState.WAITING)) == 2, moves
        # jittered exponential backoff: the second gap is at least base*2*0.5
        t0, t1, t2 = (r.time for r in ep.requests)
        assert t1 - t0 >= 0.3 * 0.5
        assert t2 - t1 >= 0.6 * 0.5


def test_overload_gives_up_after_max_attempts(git_repo: Path, claude_bin: str) -> None:
    with ScriptedEndpoint({"default": ["fine"]}, faults=["529x9"]) as ep:
        fleet = make_fleet(ep, claude_bin, max_attempts=2, backoff_base=0.1)
        (task,) = fleet.submit(TaskSpec(prompt="hello", repo=git_repo))
        drive(fleet, settled(fleet, task.id))
        done = fleet.get_task(task.id)
        assert done.state == TaskState.FAILED and done.verdict == "overload"
        assert "gave up after 2 attempts" in (done.message or "")
        assert len(ep.requests) == 2


def test_quota_cooldown_holds_every_task_of_the_endpoint(git_repo: Path,
                                                          claude_bin: str) -> None:
    with ScriptedEndpoint({"default": ["fine"]}, faults=["429x1"]) as ep:
        fleet = make_fleet(ep, claude_bin, max_workers=1, quota_cooldown=1.0)
        first, second = (fleet.submit(TaskSpec(prompt=f"task {i}", repo=git_repo))[0]
                         for i in range(2))
        drive(fleet, lambda: fleet.get_task(first.id).state == TaskState.WAITING)
        until = fleet.cooldown_until(ep.url)
        assert until is not None and fleet.status().cooldown_until == until
        # the slot is free, yet the other task must not start during the cooldown
        t_429 = ep.requests[0].time
        assert ep.requests[0].status == 429
        drive(fleet, settled(fleet, first.id, second.id))
        for t in (first, second):
            assert fleet.get_task(t.id).state == TaskState.SUCCEEDED
        later = ep.requests[1:]
        assert len(later) == 2
        assert all(r.time >= t_429 + 1.0 - 0.05 for r in later), \
            [r.time - t_429 for r in later]
        assert [a.verdict for a in fleet.attempts(first.id)] == ["quota", "ok"]


def test_auth_failure_fails_at_once_with_the_fix(git_repo: Path, claude_bin: str) -> None:
    with ScriptedEndpoint({"default": ["fine"]}, faults=["401x5"]) as ep:
        fleet = make_fleet(ep, claude_bin)
        done = run_one(fleet, git_repo, "hello")
        assert done.state == TaskState.FAILED and done.verdict == "auth"
        assert "key" in (done.message or "")
        assert len(fleet.attempts(done.id)) == 1  # no retry
        assert KEY not in (done.message or "")


def test_no_key_fails_clearly(git_repo: Path, claude_bin: str,
                              endpoint: ScriptedEndpoint) -> None:
    fleet = make_fleet(endpoint, claude_bin)
    fleet.env.pop("ANTHROPIC_AUTH_TOKEN")
    done = run_one(fleet, git_repo, "hello")
    assert done.state == TaskState.FAILED
    assert "key" in (done.message or "").lower()
    assert endpoint.requests == []


def test_max_turns_and_timeout(git_repo: Path, claude_bin: str,
                               endpoint: ScriptedEndpoint) -> None:
    fleet = make_fleet(endpoint, claude_bin)
    done = run_one(fleet, git_repo, "[script:three] go", max_turns=1)
    assert done.state == TaskState.FAILED and done.verdict == "max_turns"
    slow = run_one(fleet, git_repo, "[script:sleepy] wait", timeout=1.5)
    assert slow.state == TaskState.FAILED and slow.verdict == "timeout"
    assert sleepers(git_repo) == []


def test_submit_validation(git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint,
                           tmp_path: Path) -> None:
    fleet = make_fleet(endpoint, claude_bin)
    with pytest.raises(FleetError, match="prompt is empty"):
        fleet.submit(TaskSpec(prompt="  ", repo=git_repo))
    with pytest.raises(GitError, match="unknown ref"):
        fleet.submit(TaskSpec(prompt="x", repo=git_repo, base_ref="no-such-branch"))
    with pytest.raises(FleetError, match="copies"):
        fleet.submit(TaskSpec(prompt="x", repo=git_repo), copies=0)
    with pytest.raises(GitError, match="not inside a git repository"):
        fleet.submit(TaskSpec(prompt="x", repo=tmp_path))
    with pytest.raises(FleetError, match="permission mode"):
        fleet.submit(TaskSpec(prompt="x", repo=git_repo, permission_mode="yolo"))
    with pytest.raises(FleetError, match="no task"):
        fleet.get_task("zzzzzz")
    assert fleet.list_tasks() == []


# --- kill, stall, adoption --------------------------------------------------------------------


def test_kill_leaves_no_process_behind(git_repo: Path, claude_bin: str,
                                       endpoint: ScriptedEndpoint) -> None:
    fleet = make_fleet(endpoint, claude_bin)
    (task,) = fleet.submit(TaskSpec(prompt="[script:sleepy] wait", repo=git_repo))
    try:
        drive(fleet, lambda: len(sleepers(git_repo)) == 2, timeout=30)
        attempt = fleet.attempts(task.id)[-1]
        runner = read_json(Path(attempt.dir or "") / "runner.json")
        assert runner is not None
        fleet.kill(task.id)
        done = fleet.get_task(task.id)
        assert done.state == TaskState.KILLED and done.verdict == "killed"
        assert procs.wait_gone([runner["runner_pid"], runner["claude_pid"]], 5)
        assert sleepers(git_repo) == []
        assert procs.group_members(runner["claude_pid"]) == []
        with pytest.raises(FleetError, match="not running"):
            fleet.kill(task.id)
    finally:
        for pid in sleepers(git_repo):
            procs.signal_pid(pid, signal.SIGKILL)


def test_kill_queued_task_and_stall_detection(git_repo: Path, claude_bin: str,
                                              endpoint: ScriptedEndpoint) -> None:
    fleet = make_fleet(endpoint, claude_bin, stall_seconds=0.5, stall_kill=True)
    (queued,) = fleet.submit(TaskSpec(prompt="hello", repo=git_repo))
    fleet.kill(queued.id)
    assert fleet.get_task(queued.id).state == TaskState.KILLED
    (task,) = fleet.submit(TaskSpec(prompt="[script:sleepy] wait", repo=git_repo))
    changes: list[TaskChange] = []
    try:
        drive(fleet, settled(fleet, task.id), changes=changes)
        assert TaskState.STALLED in {c.new for c in changes if c.task_id == task.id}
        done = fleet.get_task(task.id)
        assert done.verdict == "timeout" and "stalled" in (done.message or "")
        assert sleepers(git_repo) == []
    finally:
        for pid in sleepers(git_repo):
            procs.signal_pid(pid, signal.SIGKILL)


def test_adoption_after_the_engine_is_rebuilt(git_repo: Path, claude_bin: str) -> None:
    with ScriptedEndpoint(SCRIPTS, event_delay=0.05) as ep:
        first = make_fleet(ep, claude_bin)
        (task,) = first.submit(TaskSpec(prompt="[script:three] go", repo=git_repo))
        store = first.store
        drive(first, lambda: store.get_task(task.id).turns >= 1)
        runner_pid = first.attempts(task.id)[0].runner_pid
        first.store.close()
        del first  # the panel closed mid-run; the runner goes on by itself
        second = make_fleet(ep, claude_bin)
        drive(second, settled(second, task.id))
        done = second.get_task(task.id)
        assert done.state == TaskState.SUCCEEDED, done.message
        attempts = second.attempts(task.id)
        assert len(attempts) == 1 and attempts[0].runner_pid == runner_pid  # not restarted
        turns = [r.turn for r in ep.requests]
        assert sorted(turns) == [0, 1, 2]  # each turn seen once
        events, offset = second.read_events(attempts[0])
        assert isinstance(events[0], stream.Init) and isinstance(events[-1], stream.Result)
        assert offset == (Path(attempts[0].dir or "") / EVENTS_FILE).stat().st_size
        assert attempts[0].events_offset == offset and done.turns == 3
        # read from the middle, as the panel does when it tails
        tail, end = second.read_events(attempts[0], offset=_line_start(attempts[0]))
        assert len(tail) == len(events) - 1 and end == offset
        assert isinstance(tail[-1], stream.Result)


def _line_start(attempt: Any) -> int:
    data = (Path(attempt.dir) / EVENTS_FILE).read_bytes()
    return data.index(b"\n") + 1


def test_dead_runner_without_exit_record_is_marked_crashed(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    first = make_fleet(endpoint, claude_bin)
    (task,) = first.submit(TaskSpec(prompt="[script:sleepy] wait", repo=git_repo))
    try:
        drive(first, lambda: len(sleepers(git_repo)) == 2, timeout=30)
        attempt = first.attempts(task.id)[0]
        first.store.close()
        del first
        # the machine "lost" the runner: kill its tree the hard way, no exit record
        assert attempt.runner_pid is not None
        procs.signal_tree(attempt.runner_pid, signal.SIGKILL)
        assert procs.wait_gone([attempt.runner_pid], 5)
        second = make_fleet(endpoint, claude_bin)
        drive(second, settled(second, task.id))
        done = second.get_task(task.id)
        assert done.state == TaskState.FAILED and done.verdict == "crashed"
        assert "without an exit record" in (done.message or "")
    finally:
        for pid in sleepers(git_repo):
            procs.signal_pid(pid, signal.SIGKILL)


def test_two_engines_on_one_store_never_exceed_the_cap(git_repo: Path, claude_bin: str,
                                                        endpoint: ScriptedEndpoint) -> None:
    db = paths.db_path()
    engines = [make_fleet(endpoint, claude_bin, db=db, max_workers=2) for _ in range(2)]
    # one more than the cap: each engine alone would let 2 run, so 3 at once if the cap
    # were per engine
    tasks = engines[0].submit(TaskSpec(prompt="[script:slow] go", repo=git_repo), copies=3)
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop(fleet: Fleet) -> None:
        try:
            fleet.run(stop, interval=TICK)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(e,)) for e in engines]
    for th in threads:
        th.start()
    watcher = Store(db)
    peak = 0
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            running = watcher.count_tasks(ACTIVE_STATES)
            peak = max(peak, running)
            assert running <= 2
            if all(watcher.get_task(t.id).state == TaskState.SUCCEEDED for t in tasks):
                break
            time.sleep(0.02)
    finally:
        stop.set()
        for th in threads:
            th.join(timeout=10)
    assert not errors
    assert peak == 2
    for t in tasks:
        assert watcher.get_task(t.id).state == TaskState.SUCCEEDED
        assert len(watcher.list_attempts(t.id)) == 1  # nothing ran twice
    owners = {watcher.get_task(t.id).claimed_by for t in tasks}
    assert owners <= {e.owner for e in engines}
    assert all(e.last_error is None for e in engines)


# --- merge, discard ---------------------------------------------------------------------------


@pytest.fixture
def finished(git_repo: Path, claude_bin: str,
             endpoint: ScriptedEndpoint) -> tuple[Fleet, Task]:
    fleet = make_fleet(endpoint, claude_bin)
    task = run_one(fleet, git_repo, "write a.txt", title="Add a.txt")
    assert task.state == TaskState.SUCCEEDED, task.message
    return fleet, task


def test_diff_and_clean_merge(finished: tuple[Fleet, Task], git_repo: Path) -> None:
    fleet, task = finished
    diff = fleet.diff(task.id)
    assert [(f.path, f.status, f.added) for f in diff.files] == [("a.txt", "untracked", 1)]
    assert fleet.conflict_preview(task.id).clean
    config_dir = paths.task_config_dir(task.id)
    assert config_dir.is_dir() and (config_dir.stat().st_mode & 0o777) == 0o700
    result = fleet.merge(task.id)
    assert result.merged, result.message
    assert (git_repo / "a.txt").read_text() == "worker\n"
    log = subprocess.run(["git", "log", "-2", "--format=%B"], cwd=git_repo, text=True,
                         capture_output=True).stdout
    assert "Add a.txt" in log and f"Fleet-Task: {task.id}" in log
    assert f"Fleet-Session: {task.session_id}" in log
    merged = fleet.get_task(task.id)
    assert merged.state == TaskState.MERGED
    assert not config_dir.exists()
    with pytest.raises(FleetError, match="merged"):
        fleet.merge(task.id)


def test_merge_conflict_leaves_main_checkout_byte_identical(
        finished: tuple[Fleet, Task], git_repo: Path) -> None:
    fleet, task = finished
    (git_repo / "a.txt").write_text("main's own a.txt\n")
    subprocess.run(["git", "add", "a.txt"], cwd=git_repo, check=True)
    subprocess.run(["git", "commit", "-qm", "main a.txt"], cwd=git_repo, check=True)
    before = snapshot(git_repo)
    preview = fleet.conflict_preview(task.id)
    assert not preview.clean and "a.txt" in preview.conflicts
    result = fleet.merge(task.id)
    assert not result.merged and "a.txt" in result.message
    assert snapshot(git_repo) == before
    assert fleet.get_task(task.id).state == TaskState.SUCCEEDED  # still there to fix


def test_merge_refused_on_dirty_checkout_and_failing_tests(
        finished: tuple[Fleet, Task], git_repo: Path) -> None:
    fleet, task = finished
    (git_repo / "README.md").write_text("# edited by hand\n")
    before = snapshot(git_repo)
    result = fleet.merge(task.id)
    assert not result.merged and "uncommitted" in result.message
    assert snapshot(git_repo) == before
    subprocess.run(["git", "checkout", "README.md"], cwd=git_repo, check=True)
    before = snapshot(git_repo)
    result = fleet.merge(task.id, test_command="test -f b.txt || { echo missing b; exit 3; }")
    assert not result.merged and "test command failed" in result.message
    assert "missing b" in (result.test_output or "")
    assert snapshot(git_repo) == before
    assert fleet.get_task(task.id).state == TaskState.SUCCEEDED
    assert fleet.merge(task.id, test_command="test -f a.txt").merged


def test_discard_removes_worktree_branch_and_config(finished: tuple[Fleet, Task],
                                                    git_repo: Path) -> None:
    fleet, task = finished
    worktree = Path(task.worktree or "")
    fleet.discard(task.id)
    assert not worktree.exists()
    assert not paths.task_config_dir(task.id).exists()
    branches = subprocess.run(["git", "branch", "--list", task.branch], cwd=git_repo,
                              text=True, capture_output=True).stdout
    assert branches.strip() == ""
    assert fleet.get_task(task.id).state == TaskState.DISCARDED
    with pytest.raises(FleetError):
        fleet.diff(task.id)


# --- retry, resume, follow-up -----------------------------------------------------------------


def test_retry_fresh_resets_the_worktree(finished: tuple[Fleet, Task],
                                         endpoint: ScriptedEndpoint) -> None:
    fleet, task = finished
    worktree = Path(task.worktree or "")
    (worktree / "junk.txt").write_text("left over\n")
    queued = fleet.retry(task.id)
    assert queued.state == TaskState.QUEUED
    assert not (worktree / "junk.txt").exists() and not (worktree / "a.txt").exists()
    drive(fleet, settled(fleet, task.id))
    done = fleet.get_task(task.id)
    assert done.state == TaskState.SUCCEEDED
    attempts = fleet.attempts(task.id)
    assert [a.kind for a in attempts] == ["fresh", "fresh"]
    assert attempts[0].session_id != attempts[1].session_id
    assert [r.turn for r in endpoint.requests] == [0, 1, 0, 1]


def test_resume_and_follow_up_continue_the_session(git_repo: Path, claude_bin: str,
                                                   endpoint: ScriptedEndpoint) -> None:
    fleet = make_fleet(endpoint, claude_bin)
    task = run_one(fleet, git_repo, "[script:chat] talk to me")
    assert task.state == TaskState.SUCCEEDED
    session = task.session_id
    assert session
    with pytest.raises(FleetError, match="empty"):
        fleet.follow_up(task.id, "  ")
    fleet.follow_up(task.id, "and then?")
    drive(fleet, settled(fleet, task.id))
    fleet.retry(task.id, resume=True)
    drive(fleet, settled(fleet, task.id))
    done = fleet.get_task(task.id)
    assert done.state == TaskState.SUCCEEDED and done.session_id == session
    attempts = fleet.attempts(task.id)
    assert [a.kind for a in attempts] == ["fresh", "followup", "resume"]
    assert all(a.session_id == session for a in attempts)
    # the endpoint saw the earlier turns each time: turn = assistant messages so far
    assert [r.turn for r in endpoint.requests] == [0, 1, 2]
    assert all(r.script == "chat" for r in endpoint.requests)
    last, _ = fleet.read_events(attempts[-1])
    results = [e for e in last if isinstance(e, stream.Result)]
    assert results and results[-1].result == "third answer"


def test_retry_refused_while_running_and_no_key_leak(git_repo: Path, claude_bin: str,
                                                     endpoint: ScriptedEndpoint) -> None:
    fleet = make_fleet(endpoint, claude_bin)
    (task,) = fleet.submit(TaskSpec(prompt="[script:slow] go", repo=git_repo))
    drive(fleet, lambda: fleet.get_task(task.id).state == TaskState.RUNNING)
    with pytest.raises(FleetError, match="kill it"):
        fleet.retry(task.id)
    with pytest.raises(FleetError, match="kill it"):
        fleet.merge(task.id)
    drive(fleet, settled(fleet, task.id))
    # the key lives only in claude's environment: not in the store, logs or spec
    assert KEY.encode() not in paths.db_path().read_bytes()
    for path in (git_repo / ".fleet-work" / ".logs").rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


async def test_follow_events_tails_a_running_attempt(git_repo: Path, claude_bin: str) -> None:
    with ScriptedEndpoint(SCRIPTS, event_delay=0.01) as ep:
        fleet = make_fleet(ep, claude_bin)
        (task,) = fleet.submit(TaskSpec(prompt="[script:three] go", repo=git_repo))
        stop = threading.Event()
        loop = threading.Thread(target=fleet.run, args=(stop,), kwargs={"interval": TICK})
        loop.start()
        try:
            deadline = time.monotonic() + 30
            while not (fleet.attempts(task.id) and fleet.attempts(task.id)[0].dir):
                assert time.monotonic() < deadline
                time.sleep(TICK)
            attempt = fleet.attempts(task.id)[0]
            got = [ev async for ev in fleet.follow_events(attempt, poll=0.05)]
        finally:
            stop.set()
            loop.join(timeout=10)
        assert isinstance(got[0], stream.Init) and isinstance(got[-1], stream.Result)
        events, _ = fleet.read_events(fleet.attempts(task.id)[0])
        assert [type(e) for e in got] == [type(e) for e in events]


def test_read_events_in_small_chunks_matches_one_read(tmp_path: Path,
                                                      reference_samples: Path) -> None:
    """The panel reads in chunks; lines longer than a chunk must still come through."""
    from fleet_tui.store.db import Attempt

    adir = tmp_path / "attempt"
    adir.mkdir()
    data = (reference_samples / "nonroot_stream" / "stdout.jsonl").read_bytes()
    (adir / EVENTS_FILE).write_bytes(data + data[: data.index(b"\n")])  # + a partial line
    fleet = Fleet(load_settings(), Store(tmp_path / "db.sqlite"))
    attempt = Attempt(id=1, task_id="abc123", n=1, dir=adir)
    whole, end = fleet.read_events(attempt)
    assert end == len(data)  # the unfinished last line waits until the attempt finishes
    got: list[stream.Event] = []
    offset = 0
    for _ in range(10_000):
        events, new = fleet.read_events(attempt, offset, max_bytes=100)
        got += events
        if new == offset:
            break
        offset = new
    assert offset == end
    assert [type(e) for e in got] == [type(e) for e in whole] and len(whole) > 3
    (adir / "exit.json").write_text("{}")  # finished: the partial line is returned now
    final, end2 = fleet.read_events(attempt)
    assert end2 == (adir / EVENTS_FILE).stat().st_size and len(final) == len(whole) + 1


def test_a_big_backlog_is_read_in_bounded_chunks_and_counted(
        tmp_path: Path, reference_samples: Path, monkeypatch: pytest.MonkeyPatch,
        stand_in_runner: int) -> None:
    """Following reads at most READ_CHUNK per attempt per tick (the GIL is not held for a
    whole backlog); finishing reads the rest before it classifies; the counters match."""
    from fleet_tui.engine import follower
    from fleet_tui.execution.worker.attemptlog import EXIT_FILE, write_json_atomic

    monkeypatch.setattr(follower, "READ_CHUNK", 4096)
    sample = (reference_samples / "nonroot_stream" / "stdout.jsonl").read_bytes()
    data = sample * 40
    assert len(data) > 4 * 4096
    store = Store(tmp_path / "db.sqlite")
    fleet = Fleet(load_settings(), store)
    now = time.time()
    me = stand_in_runner
    task = store.create_task(prompt="p", repo=tmp_path, task_id="big001",
                             state=TaskState.RUNNING, base_commit="0" * 40, started_at=now,
                             endpoint="default", attempt_count=1)
    adir = tmp_path / "attempt"
    adir.mkdir()
    (adir / EVENTS_FILE).write_bytes(data)
    write_json_atomic(adir / "launch.json", {"runner_pid": me,
                                             "runner_start": procs.start_time(me)})
    attempt = store.add_attempt(task.id, prompt="p", now=now, runner_pid=me, dir=adir,
                                events_path=adir / EVENTS_FILE, started_at=now)
    fleet.tick()
    # whole lines only (attemptlog's rule), at most a chunk of them: the offset is a line end
    first = fleet.ingested_bytes
    assert 0 < first <= 4096 and data[first - 1:first] == b"\n"
    assert store.get_attempt(attempt.id).events_offset == first
    assert fleet.get_task(task.id).state == TaskState.RUNNING
    fleet.tick()
    second = fleet.ingested_bytes - first
    assert 0 < second <= 4096 and data[first + second - 1:first + second] == b"\n"
    write_json_atomic(adir / EXIT_FILE, {"exit_code": 0})
    fleet.tick()
    done = fleet.get_task(task.id)
    assert done.state == TaskState.SUCCEEDED, done.message
    assert fleet.ingested_bytes == len(data)
    assert store.get_attempt(attempt.id).events_offset == len(data)
    whole, _ = fleet.read_events(store.get_attempt(attempt.id))
    assert fleet.ingested_events == len(whole)
    summary = stream.RunSummary()
    for ev in whole:
        summary.update(ev)
    assert (done.turns, done.output_tokens) == (summary.turns, summary.output_tokens)


# --- long prompts, private files --------------------------------------------------------------


def test_a_200_kib_prompt_reaches_the_endpoint(git_repo: Path, claude_bin: str) -> None:
    """An argv string is limited to 128 KiB; the prompt goes on claude's stdin, a
    follow-up's too (with --resume)."""
    prompt = "".join(f"line {i:06d} " + "y" * 90 + "\n" for i in range(2000))
    assert len(prompt.encode()) >= 200 * 1024
    follow = "and then? " + "z" * 140_000
    with ScriptedEndpoint({"default": {"turns": ["first answer"],
                                       "followup": ["got: {prompt}"]}}) as ep:
        fleet = make_fleet(ep, claude_bin)
        done = run_one(fleet, git_repo, prompt)
        assert done.state == TaskState.SUCCEEDED, done.message
        sent = [r.prompt for r in ep.requests if r.turn == 0
                and not (r.prompt or "").startswith("<session>")]
        assert sent == [prompt.strip()]  # the CLI trims a prompt, whichever way it came
        fleet.follow_up(done.id, follow)
        drive(fleet, settled(fleet, done.id))
        again = fleet.get_task(done.id)
        assert again.state == TaskState.SUCCEEDED, again.message
        assert again.session_id == done.session_id and ep.requests[-1].turn == 1
        last, _ = fleet.read_events(fleet.attempts(done.id)[-1])
        results = [e for e in last if isinstance(e, stream.Result)]
        assert results and results[-1].result == f"got: {follow}"


def _mode(path: Path) -> int:
    return path.lstat().st_mode & 0o777


def test_attempt_folders_are_private_older_ones_included(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    # what an older fleet-tui left in this repository: world-readable logs
    old = git_repo / ".fleet-work" / ".logs" / "old001" / "1"
    old.mkdir(parents=True)
    (old / "events.jsonl").write_text('{"type": "system"}\n')
    for path in (old.parent.parent, old.parent, old):
        os.chmod(path, 0o755)
    os.chmod(old / "events.jsonl", 0o644)
    umask = os.umask(0o022)
    try:
        fleet = make_fleet(endpoint, claude_bin)
        task = run_one(fleet, git_repo, "write a.txt")
    finally:
        os.umask(umask)
    assert task.state == TaskState.SUCCEEDED, task.message
    adir = Path(fleet.attempts(task.id)[-1].dir or "")
    logs = git_repo / ".fleet-work" / ".logs"
    for folder in (logs, adir.parent, adir, old.parent, old):
        assert _mode(folder) == 0o700, folder
    names = {p.name for p in adir.iterdir()}
    assert {"spec.json", "events.jsonl", "stderr.log", "runner.log", "runner.json",
            "launch.json", "exit.json"} <= names
    for path in [*adir.iterdir(), old / "events.jsonl"]:
        if path.is_file():
            assert _mode(path) == 0o600, path
    # claude's own work keeps the user's umask: the worktree is the user's
    assert _mode(Path(task.worktree or "") / "a.txt") == 0o644
    assert _mode(paths.task_config_dir(task.id)) == 0o700
    assert _mode(paths.home()) == 0o700 and _mode(paths.db_path()) == 0o600
