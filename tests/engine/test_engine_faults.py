"""The engine when things go wrong: orphans of a runner killed with SIGKILL,
the timeout with no engine watching, a full disk, a garbage exit record, and one task's
bad data beside healthy tasks. Real claude against the
scripted endpoint, real runners, real processes, a real full file system (tmpfs)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from proc_helpers import working_in

from fleet_tui.core import stream
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.execution.worker.attemptlog import (
    EVENTS_FILE,
    EXIT_FILE,
    KILL_FILE,
    RUNNER_FILE,
    SPEC_FILE,
    AttemptLog,
    read_json,
    write_json_atomic,
)
from fleet_tui.execution.worker.runner import RUNNER_MODULE
from fleet_tui.execution.worker.spec import TOKEN_ENV
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import FINISHED_STATES, Store, Task, TaskState
from fleet_tui.system import cgroups, paths, procs

KEY = "sk-fleet-faults-SECRET-77ab"

SCRIPTS: dict[str, Any] = {
    "default": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "echo worker > a.txt", "description": "write a.txt"}}],
        "wrote a.txt",
    ],
    # a Bash step that leaves daemons behind: setsid+nohup, and a double fork that keeps
    # writing into the worktree; then it waits
    "daemons": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "setsid nohup sleep 901 >/dev/null 2>&1 & "
                               "( ( while :; do echo tick >> ticks.txt; sleep 0.2; done ) "
                               ">/dev/null 2>&1 & ) ; sleep 903",
                    "description": "start daemons"}}],
        "never reached",
    ],
    "sleepy": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "setsid sleep 911 </dev/null >/dev/null 2>&1 & sleep 912",
                    "description": "wait"}}],
        "never reached",
    ],
    # a first turn that takes a moment, then more output (written after the disk is full)
    "pause": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "sleep 3", "description": "pause"}}],
        "after the pause " + "x" * 2000,
    ],
}

SLEEPS = ("sleep 901", "sleep 903", "sleep 911", "sleep 912")


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(SCRIPTS) as ep:
        yield ep


def make_fleet(endpoint: ScriptedEndpoint, claude: str, **overrides: Any) -> Fleet:
    values: dict[str, Any] = {
        "base_url": endpoint.url, "claude": claude, "sandbox": os.geteuid() == 0,
        "key_sources": "env", "kill_grace": 2.0, "max_workers": 4,
    }
    values.update(overrides)
    settings = load_settings(env=os.environ, overrides=values)
    env = dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0")
    return Fleet(settings, Store(paths.db_path()), env=env)


def drive(fleet: Fleet, until: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        fleet.tick()
        if until():
            return
        if time.monotonic() > deadline:
            states = {t.id: (t.state, t.message) for t in fleet.list_tasks()}
            pytest.fail(f"timed out waiting; tasks: {states}")
        time.sleep(0.05)


def settled(fleet: Fleet, *ids: str) -> Callable[[], bool]:
    return lambda: all(fleet.get_task(i).state in FINISHED_STATES for i in ids)


def wait_for(pred: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def sleepers(where: Path) -> list[int]:
    """The scripts' sleeps that work under `where` (the test's repository or folder): another
    test run's sleeps on the machine are neither counted nor killed."""
    return [pid for pid in in_folder(where) if " ".join(procs.cmdline(pid)) in SLEEPS]


def in_folder(folder: Path) -> list[int]:
    """Live processes whose working directory is inside folder (read from /proc)."""
    return working_in(folder)


@pytest.fixture
def reap(tmp_path: Path) -> Iterator[list[Path]]:
    """Kill whatever a test leaves behind (sleeps, or anything working in its folders)."""
    folders: list[Path] = []
    yield folders
    for pid in sleepers(tmp_path) + [p for f in folders for p in in_folder(f)]:
        procs.signal_pid(pid, signal.SIGKILL)
    for st in procs.all_stats():
        if "fleet_tui.execution.worker.runner" in procs.cmdline(st.pid) and st.state != "Z" and any(
                str(f) in " ".join(procs.cmdline(st.pid)) for f in folders):
            procs.signal_tree(st.pid, signal.SIGKILL)


def started(fleet: Fleet, task: Task) -> Callable[[], bool]:
    def check() -> bool:
        attempts = fleet.attempts(task.id)
        if not attempts or attempts[-1].dir is None:
            return False
        rec = read_json(Path(attempts[-1].dir) / RUNNER_FILE)
        return bool(rec and rec.get("claude_pid"))
    return check


# --- orphans after a dead runner ----------------------------------------------------------


@pytest.mark.caged  # caged (the default), nothing outlives the runner even before the sweep
@pytest.mark.real_claude
def test_a_killed_runner_leaves_no_process_behind(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint,
        reap: list[Path], procs_mode: str) -> None:
    fleet = make_fleet(endpoint, claude_bin)
    (task,) = fleet.submit(TaskSpec(prompt="[script:daemons] go", repo=git_repo))
    drive(fleet, lambda: fleet.get_task(task.id).worktree is not None)
    worktree = Path(fleet.get_task(task.id).worktree or "")
    reap.append(worktree)
    drive(fleet, lambda: {"sleep 901", "sleep 903"} <= {
        " ".join(procs.cmdline(p)) for p in sleepers(git_repo)}
        and (worktree / "ticks.txt").exists(), timeout=60)
    attempt = fleet.attempts(task.id)[-1]
    rec = read_json(Path(attempt.dir or "") / RUNNER_FILE)
    assert rec is not None
    # the daemons really escaped: one is in its own session, all live in the worktree
    assert len(in_folder(worktree)) >= 3
    os.kill(rec["runner_pid"], signal.SIGKILL)
    if procs_mode == "linux":  # claude dies with its runner (the parent-death signal)
        assert procs.wait_gone([rec["runner_pid"], rec["claude_pid"]], 10)
    else:  # no such signal: claude lives on until the engine's sweep by token
        assert procs.wait_gone([rec["runner_pid"]], 10)
    caged = procs_mode == "linux" and (Path(attempt.dir or "") / "cage.json").exists()
    if caged:
        # Caged, nothing outlives the runner even before the engine's sweep: the cage host
        # dies with the runner, and bubblewrap (exec'd by its shell, --die-with-parent)
        # with it, ending the cage's PID namespace and the daemons in it; srt's relay
        # outside the cage dies with the host too: no process carries the attempt's token
        assert wait_for(lambda: sleepers(git_repo) == [], 15), sleepers(git_repo)
        token = AttemptLog(attempt.dir or "").spec_token() or ""
        assert token and wait_for(lambda: procs.with_env(TOKEN_ENV, token) == [], 15), [
            procs.cmdline(pid) for pid in procs.with_env(TOKEN_ENV, token)]
        cgroup = cgroups.recorded(rec)  # and nothing in its cgroup (what dropped the token)
        assert cgroup is None or wait_for(lambda: cgroups.members(cgroup) == [], 15), [
            procs.cmdline(pid) for pid in cgroups.members(cgroup)]
    else:
        # Nothing stopped them yet: claude's Bash children live on.
        assert sleepers(git_repo) and in_folder(worktree)
    drive(fleet, settled(fleet, task.id))
    done = fleet.get_task(task.id)
    assert done.state == TaskState.FAILED and done.verdict == "crashed"
    # the engine's sweep says how many leftovers it stopped: none were left when caged
    assert ("stopped" in (done.message or "")) != caged, done.message
    assert procs.wait_gone([rec["claude_pid"]], 10)
    assert sleepers(git_repo) == []
    # what is still in the folder is on its way out (a leftover SIGKILLed a moment ago, a
    # git of the engine's own): gone within the deadline, unlike an escaped daemon
    assert wait_for(lambda: in_folder(worktree) == [], 15), \
        [(p, procs.cmdline(p)) for p in in_folder(worktree)]
    size = (worktree / "ticks.txt").stat().st_size
    time.sleep(0.6)
    assert (worktree / "ticks.txt").stat().st_size == size  # nobody writes there any more


# --- the timeout needs no engine ----------------------------------------------------------


@pytest.mark.real_claude
def test_the_runner_enforces_the_timeout_with_no_engine_watching(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint,
        reap: list[Path], procs_mode: str) -> None:
    fleet = make_fleet(endpoint, claude_bin, kill_grace=1.0)
    (task,) = fleet.submit(TaskSpec(prompt="[script:sleepy] wait", repo=git_repo, timeout=12))

    def runner_record() -> dict[str, object] | None:
        attempts = fleet.attempts(task.id)
        folder = attempts[-1].dir if attempts else None
        return read_json(Path(folder) / RUNNER_FILE) if folder else None

    # ticks only until the runner has started: from then on nobody ticks, as after
    # `run --timeout 12` without --wait and no other command (waiting for the sleeps here,
    # under load, could outlast the timeout while the engine still ticked)
    drive(fleet, lambda: runner_record() is not None, timeout=60)
    rec = runner_record()
    assert rec is not None
    adir = Path(fleet.attempts(task.id)[-1].dir or "")
    runner_pid = int(str(rec["runner_pid"]))
    deadline = time.monotonic() + 60
    while len(sleepers(git_repo)) < 2 and procs.is_alive(runner_pid):
        assert time.monotonic() < deadline, "the worker's sleeps never started"
        time.sleep(0.05)
    assert procs.wait_gone([runner_pid], 12 + 1.0 + 30)
    assert sleepers(git_repo) == []
    kill = read_json(adir / KILL_FILE)
    assert kill is not None and kill["reason"] == "timeout", kill
    assert kill["by"].startswith("runner")
    exit_rec = read_json(adir / EXIT_FILE)
    assert exit_rec is not None
    # the next command that looks sees why
    fleet.tick()
    done = fleet.get_task(task.id)
    assert done.state == TaskState.FAILED and done.verdict == "timeout", done.message
    assert "timed out after 12 s" in (done.message or "")


# --- a full disk ----------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB tmpfs (root only): what a full disk does, for real."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs to fill needs root; the full-disk behaviour is then "
                    "untested here (run the suite as root, as CI does)")
    mount = tmp_path / "disk"
    mount.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs",
                          str(mount)], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({out.stderr.strip()}); the full-disk "
                    "behaviour is untested on this machine")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(folder: Path) -> None:
    """Write until the file system says no."""
    with open(folder / "filler", "ab", buffering=0) as fh:
        block = b"\0" * 4096
        try:
            while True:
                fh.write(block)
        except OSError as exc:
            assert exc.strerror == "No space left on device"
    with open(folder / "filler2", "ab", buffering=0) as fh, \
            pytest.raises(OSError, match="No space left"):
        fh.write(b"x")


def _repo_in(folder: Path) -> Path:
    repo = folder / "repo"
    repo.mkdir()
    for args in (["init", "-q", "-b", "main", "--template="], ["add", "-A"]):
        if args[0] == "add":
            (repo / "README.md").write_text("# demo\n")
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    subprocess.run(["git", "commit", "-qm", "initial"], cwd=repo, check=True,
                   capture_output=True)
    return repo


@pytest.mark.real_claude
def test_a_full_disk_is_said_in_one_sentence(small_disk: Path, claude_bin: str,
                                             endpoint: ScriptedEndpoint,
                                             reap: list[Path]) -> None:
    repo = _repo_in(small_disk)
    reap.append(repo)
    fleet = make_fleet(endpoint, claude_bin)
    (task,) = fleet.submit(TaskSpec(prompt="[script:pause] wait", repo=repo))
    drive(fleet, lambda: started(fleet, task)() and b'"init"' in (
        Path(fleet.attempts(task.id)[-1].dir or "") / EVENTS_FILE).read_bytes(), timeout=60)
    adir = Path(fleet.attempts(task.id)[-1].dir or "")
    fill(small_disk)
    drive(fleet, settled(fleet, task.id), timeout=90)
    done = fleet.get_task(task.id)
    assert done.state == TaskState.FAILED and done.verdict == "crashed"
    assert "No space left on device" in (done.message or ""), done.message
    assert str(adir) in (done.message or "") and EVENTS_FILE in (done.message or "")
    assert list(adir.glob(".*.tmp")) == []  # no stray half-written record
    assert read_json(adir / EXIT_FILE) is not None  # the record made it, into the reserve


def test_a_runner_that_cannot_write_anything_is_explained(
        small_disk: Path, tmp_path: Path) -> None:
    """The disk is full before the runner starts: no record can be made at all. The runner
    leaves no temporary file; the engine says what happened in one sentence."""
    repo = small_disk / "repo"
    adir = repo / ".fleet-work" / ".logs" / "full01" / "1"
    adir.mkdir(parents=True)
    (adir / SPEC_FILE).write_text(json.dumps({"cwd": str(tmp_path), "prompt": "p",
                                              "config_dir": str(tmp_path / "cfg")}))
    (adir / EVENTS_FILE).touch()
    fill(small_disk)
    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-m", RUNNER_MODULE, str(adir)], capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=root), timeout=60)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    assert "No space left on device" in out.stderr
    assert [p.name for p in adir.iterdir() if p.name.endswith(".tmp")] == []
    assert not (adir / EXIT_FILE).exists()
    # the engine finds a dead runner with no exit record in that folder
    store = Store(paths.db_path())
    fleet = Fleet(load_settings(), store)
    now = time.time()
    task = store.create_task(prompt="p", repo=repo, task_id="full01", state=TaskState.RUNNING,
                             base_commit="0" * 40, started_at=now, attempt_count=1,
                             endpoint="default")
    store.add_attempt(task.id, prompt="p", now=now, runner_pid=2 ** 22 + 7, dir=adir,
                      started_at=now)
    fleet.tick()
    done = fleet.get_task(task.id)
    assert done.state == TaskState.FAILED
    assert done.message == (f"the runner could not write its exit record in {adir}: "
                            "No space left on device")


# --- a garbage exit record ------------------------------------------------------------------


@pytest.mark.real_claude
@pytest.mark.parametrize("garbage", [b"{not json", b"[1, 2]", b'{"exit_code": "zero"}'])
def test_a_garbage_exit_record_does_not_hide_a_success(
        garbage: bytes, git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    fleet = make_fleet(endpoint, claude_bin)
    (task,) = fleet.submit(TaskSpec(prompt="write a.txt", repo=git_repo))
    fleet.tick()  # starts it; nobody ticks until the runner is done
    attempt = fleet.attempts(task.id)[-1]
    adir = Path(attempt.dir or "")
    assert wait_for(lambda: (adir / EXIT_FILE).exists(), 60)
    rec = read_json(adir / RUNNER_FILE)
    assert rec is not None and procs.wait_gone([rec["runner_pid"]], 10)
    (adir / EXIT_FILE).write_bytes(garbage)
    fleet.tick()
    done = fleet.get_task(task.id)
    assert done.state == TaskState.SUCCEEDED and done.verdict == "ok", done.message
    assert f"the exit record {adir / EXIT_FILE} is unreadable" in (done.message or "")
    assert "the verdict comes from the events' result" in (done.message or "")


# --- one task's bad data stops nothing else -----------------------------------------------


@pytest.mark.real_claude
def test_a_poisoned_exit_record_jams_nothing(git_repo: Path, claude_bin: str,
                                            endpoint: ScriptedEndpoint,
                                            reap: list[Path]) -> None:
    """Real poison: an exit record whose fields have the wrong types, and no result in the
    events, beside a healthy task that must still finish."""
    fleet = make_fleet(endpoint, claude_bin)
    (bad,) = fleet.submit(TaskSpec(prompt="[script:sleepy] wait", repo=git_repo))
    drive(fleet, lambda: len(sleepers(git_repo)) == 2, timeout=60)
    badt = fleet.attempts(bad.id)[-1]
    bdir = Path(badt.dir or "")
    rec = read_json(bdir / RUNNER_FILE)
    assert rec is not None
    os.kill(rec["runner_pid"], signal.SIGKILL)
    assert procs.wait_gone([rec["runner_pid"]], 10)
    (bdir / EXIT_FILE).write_text(json.dumps({"exit_code": "x", "signal": []}))
    (good,) = fleet.submit(TaskSpec(prompt="write a.txt", repo=git_repo))
    drive(fleet, settled(fleet, bad.id, good.id))
    assert fleet.get_task(good.id).state == TaskState.SUCCEEDED
    broken = fleet.get_task(bad.id)
    assert broken.state == TaskState.FAILED and broken.verdict == "crashed"
    assert str(bdir / EXIT_FILE) in (broken.message or "")
    assert "exit_code holds 'x'" in (broken.message or "")
    assert sleepers(git_repo) == []


class _RaisingDecoder(stream.StreamDecoder):
    """STAND-IN for a stream parser that raises (a real stream once raised RecursionError from
    a line nested ~1000 deep): once the parser is total, no real line raises any more, yet
    the engine must still survive a bug of that kind. Raises on any chunk holding POISON."""

    POISON = b"fleet-test-poison"

    def feed(self, chunk: bytes) -> list[stream.Event]:
        if self.POISON in chunk:
            raise RecursionError("maximum recursion depth exceeded (stand-in)")
        return super().feed(chunk)


@pytest.mark.real_claude
def test_an_exception_for_one_task_marks_it_and_the_others_go_on(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        reap: list[Path]) -> None:
    monkeypatch.setattr(stream, "StreamDecoder", _RaisingDecoder)
    fleet = make_fleet(endpoint, claude_bin)
    (bad,) = fleet.submit(TaskSpec(prompt="[script:sleepy] wait", repo=git_repo))
    drive(fleet, lambda: len(sleepers(git_repo)) == 2, timeout=60)
    badt = fleet.attempts(bad.id)[-1]
    events = Path(badt.dir or "") / EVENTS_FILE
    with open(events, "ab") as fh:  # a line that makes the (stand-in) parser raise
        fh.write(b'{"type": "' + _RaisingDecoder.POISON + b'"}\n')
    (good,) = fleet.submit(TaskSpec(prompt="write a.txt", repo=git_repo))
    with caplog.at_level(logging.ERROR, logger="fleet_tui.engine.fleet"):
        changes = fleet.tick()
    broken = fleet.get_task(bad.id)
    assert broken.state == TaskState.FAILED and broken.verdict == "crashed"
    assert str(events) in (broken.message or "") and "RecursionError" in (broken.message or "")
    assert any(c.task_id == bad.id and c.new == TaskState.FAILED for c in changes)
    assert any(bad.id in r.getMessage() for r in caplog.records)
    # its runner was stopped before the task was marked: nothing works for a failed task
    assert sleepers(git_repo) == []
    assert not procs.is_alive(fleet.attempts(bad.id)[-1].runner_pid)
    drive(fleet, settled(fleet, good.id))
    assert fleet.get_task(good.id).state == TaskState.SUCCEEDED


def _tamper(db: Path, sql: str, *args: Any) -> None:
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(sql, args)
    conn.close()


@pytest.mark.real_claude
def test_a_tampered_row_of_a_running_task_is_marked_and_its_runner_stopped(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint,
        reap: list[Path]) -> None:
    fleet = make_fleet(endpoint, claude_bin)
    (bad,) = fleet.submit(TaskSpec(prompt="[script:sleepy] wait", repo=git_repo))
    (queued_bad,) = fleet.submit(TaskSpec(prompt="write a.txt", repo=git_repo))
    fleet.kill(queued_bad.id)
    drive(fleet, lambda: len(sleepers(git_repo)) == 2, timeout=60)
    _tamper(paths.db_path(), "UPDATE attempts SET turns = 'many' WHERE task_id = ?", bad.id)
    # and a queued task whose extra arguments are junk: never run with other arguments
    (junk,) = fleet.submit(TaskSpec(prompt="write a.txt", repo=git_repo))
    _tamper(paths.db_path(), "UPDATE tasks SET extra_args = '{junk' WHERE id = ?", junk.id)
    (good,) = fleet.submit(TaskSpec(prompt="write a.txt", repo=git_repo))
    drive(fleet, settled(fleet, bad.id, junk.id, good.id))
    assert fleet.get_task(good.id).state == TaskState.SUCCEEDED
    broken = fleet.get_task(bad.id)
    assert broken.state == TaskState.FAILED
    assert broken.message == (f"the store row of attempt 1 of task {bad.id} is unreadable: "
                              "column turns holds 'many'")
    assert sleepers(git_repo) == []
    never = fleet.get_task(junk.id)
    assert never.state == TaskState.FAILED and never.attempt_count == 0
    assert "column extra_args holds '{junk'" in (never.message or "")
    assert never.worktree is None  # nothing was made for it


def test_cli_lists_and_shows_a_tampered_store(git_repo: Path, tmp_path: Path) -> None:
    store = Store(paths.db_path())
    tasks = [store.create_task(prompt=f"task {i}", repo=git_repo, title=f"task {i}")
             for i in range(4)]
    db = paths.db_path()
    _tamper(db, "UPDATE tasks SET state = 'zzz' WHERE id = ?", tasks[0].id)
    _tamper(db, "UPDATE tasks SET turns = 'abc' WHERE id = ?", tasks[1].id)
    _tamper(db, "UPDATE tasks SET repo = X'00ff' WHERE id = ?", tasks[2].id)
    fleet_tui = shutil.which("fleet-tui", path=str(Path(sys.executable).parent))
    assert fleet_tui is not None
    out = subprocess.run([fleet_tui, "ls", "--all-repos"], cwd=git_repo, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    for t in tasks:
        assert t.id in out.stdout
    show = subprocess.run([fleet_tui, "show", tasks[0].id], cwd=git_repo,
                          capture_output=True, text=True, timeout=60)
    assert "Traceback" not in show.stderr + show.stdout
    assert show.returncode == 0, show.stderr
    assert (f"the store row of task {tasks[0].id} is unreadable: column state holds 'zzz'"
            in show.stdout + show.stderr)


def test_write_json_atomic_leaves_nothing_behind_when_the_write_fails(
        small_disk: Path) -> None:
    fill(small_disk)
    with pytest.raises(OSError, match="No space left"):
        write_json_atomic(small_disk / "x.json", {"big": "y" * 10_000})
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "filler2"]


def test_a_full_database_disk_is_a_store_error_not_a_crash(small_disk: Path,
                                                           git_repo: Path) -> None:
    """The database itself failing is every task's problem, not one task's: the pass fails
    with one StoreError naming the database (the CLI prints it; the panel shows it)."""
    from fleet_tui.store.db import StoreError

    store = Store(small_disk / "fleet.db")
    fleet = Fleet(load_settings(overrides={"claude": "/nonexistent/claude"}), store)
    for i in range(3):
        store.create_task(prompt=f"p{i}", repo=git_repo, endpoint="default")
    fill(small_disk)
    with pytest.raises(StoreError, match=r"the task database .*fleet\.db could not be used: "
                                         r"database or disk is full"):
        for _ in range(20):  # the WAL may still have room for a write or two
            fleet.tick()
