"""The engine's rules on the in-memory host: claim, start, adopt,
requeue, kill, resume and the verdicts, through the host seam and nothing else.

No process, no claude: the host's runs are driven by the test (`MemoryRun.finish`,
`crash`), and what an ended run leaves is the attempt folder every host leaves, so the
follower judges it as it judges a real one. A real git repository and a real SQLite store
(the engine's own); each test takes milliseconds beyond its fixture.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from fleet_tui.core.states import TaskState
from fleet_tui.engine import supervisor as supervisor_mod
from fleet_tui.engine.fleet import Fleet
from fleet_tui.execution.host import Host
from fleet_tui.execution.local.host import LocalHost
from fleet_tui.execution.memory import PID_BASE, MemoryHost, MemoryRun
from fleet_tui.execution.worker.attemptlog import AttemptLog
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store, TaskSpec
from fleet_tui.system import paths

KEY = "sk-memory-host-key"


def make(tmp_path: Path, host: MemoryHost | None = None, **overrides: Any
         ) -> tuple[Fleet, MemoryHost]:
    host = host or MemoryHost(tmp_path / "memory-host")
    values: dict[str, Any] = {"key_sources": "env", "max_workers": 4, "max_attempts": 1,
                              "backoff_base": 0.01, "kill_grace": 0.5}
    values.update(overrides)
    settings = load_settings(env=os.environ, overrides=values)
    env = dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY)
    return Fleet(settings, Store(paths.db_path()), env=env, host=host), host


def one_run(host: MemoryHost, task_id: str) -> MemoryRun:
    runs = host.runs_of(task_id)
    assert len(runs) == 1, runs
    return runs[0]


def test_a_task_starts_on_the_host_with_its_placement_recorded_first(
        git_repo: Path, tmp_path: Path) -> None:
    fleet, host = make(tmp_path)
    (task,) = fleet.submit(TaskSpec(prompt="write the parser", repo=git_repo))
    fleet.tick()
    run = one_run(host, task.id)
    assert run.alive and run.spec["prompt"] == "write the parser"
    assert run.spec["task_id"] == task.id and run.spec["token"]
    assert KEY not in json.dumps(run.spec)  # the spec never holds the key
    (attempt,) = fleet.attempts(task.id)
    assert attempt.host == "memory" and attempt.runner_pid == run.pid > PID_BASE
    placement = json.loads(attempt.placement or "{}")
    assert placement["host"] == "memory"
    assert placement["attempt_dir"] == str(attempt.dir) == str(run.folder.dir)
    assert Path(placement["worktree"]) == host.root / "work" / task.id
    assert fleet.get_task(task.id).state == TaskState.RUNNING


def test_a_finished_run_is_judged_from_the_folder_it_left(git_repo: Path,
                                                           tmp_path: Path) -> None:
    fleet, host = make(tmp_path)
    (task,) = fleet.submit(TaskSpec(prompt="answer", repo=git_repo))
    fleet.tick()
    one_run(host, task.id).finish("all done", session_id="s-42", turns=3)
    fleet.tick()
    done = fleet.get_task(task.id)
    assert done.state == TaskState.SUCCEEDED, done.message
    assert done.session_id == "s-42" and done.turns == 3


def test_kill_stops_the_run_and_the_verdict_is_killed(git_repo: Path,
                                                      tmp_path: Path) -> None:
    fleet, host = make(tmp_path)
    (task,) = fleet.submit(TaskSpec(prompt="long work", repo=git_repo))
    fleet.tick()
    run = one_run(host, task.id)
    fleet.kill(task.id)
    assert not run.alive and run.stop_reason == "kill"
    done = fleet.get_task(task.id)
    assert (done.state, done.verdict) == (TaskState.KILLED, "killed"), done.message


def test_a_runner_that_died_without_its_record_fails_the_task_and_says_so(
        git_repo: Path, tmp_path: Path) -> None:
    fleet, host = make(tmp_path)
    (task,) = fleet.submit(TaskSpec(prompt="work", repo=git_repo))
    fleet.tick()
    one_run(host, task.id).crash()
    fleet.tick()
    done = fleet.get_task(task.id)
    assert (done.state, done.verdict) == (TaskState.FAILED, "crashed")
    assert "without an exit record" in (done.message or "")


def test_a_retry_after_a_crash_starts_afresh_on_the_host(git_repo: Path,
                                                         tmp_path: Path) -> None:
    """A dead runner is not retried by the engine (it may have been killed on purpose);
    the user's retry starts a fresh attempt in the same worktree."""
    fleet, host = make(tmp_path, max_attempts=3)
    (task,) = fleet.submit(TaskSpec(prompt="work", repo=git_repo))
    fleet.tick()
    one_run(host, task.id).crash()
    fleet.tick()
    assert fleet.get_task(task.id).verdict == "crashed"
    fleet.retry(task.id)
    fleet.tick()
    first, second = host.runs_of(task.id)
    assert not first.alive and second.alive
    assert second.spec["attempt"] == 2 and second.resume is None
    assert second.spec["cwd"] == first.spec["cwd"]
    second.finish()
    fleet.tick()
    assert fleet.get_task(task.id).state == TaskState.SUCCEEDED


def test_retry_with_resume_continues_the_session_on_the_host(git_repo: Path,
                                                             tmp_path: Path) -> None:
    fleet, host = make(tmp_path)
    (task,) = fleet.submit(TaskSpec(prompt="work", repo=git_repo))
    fleet.tick()
    one_run(host, task.id).finish("half done", session_id="s-resume-me", is_error=True,
                                  exit_code=1)
    fleet.tick()
    assert fleet.get_task(task.id).state == TaskState.FAILED
    fleet.retry(task.id, resume=True)
    fleet.tick()
    first, second = host.runs_of(task.id)
    assert not first.alive and second.resume == "s-resume-me" and second.alive
    assert [a.kind for a in fleet.attempts(task.id)] == ["fresh", "resume"]


def test_a_runner_whose_engine_died_before_recording_it_is_adopted(
        git_repo: Path, tmp_path: Path) -> None:
    fleet, host = make(tmp_path)
    (task,) = fleet.submit(TaskSpec(prompt="work", repo=git_repo))
    fleet.tick()
    run = one_run(host, task.id)
    (attempt,) = fleet.attempts(task.id)
    # the engine that started it died between the spawn and recording the pid
    fleet.store.update_attempt(attempt.id, runner_pid=None)
    AttemptLog(run.folder.dir).path("launch.json").unlink()
    run.folder.write_runner_record({"runner_pid": run.pid, "runner_start": "0"})
    other, _ = make(tmp_path, host=host)
    other.tick()
    assert other.attempts(task.id)[0].runner_pid == run.pid
    assert len(host.runs_of(task.id)) == 1  # adopted, not started again
    run.finish()
    other.tick()
    assert other.get_task(task.id).state == TaskState.SUCCEEDED


def test_a_claim_whose_engine_is_gone_is_requeued_and_started_once(
        git_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet, host = make(tmp_path)
    (task,) = fleet.submit(TaskSpec(prompt="work", repo=git_repo))
    # claimed by an engine on another machine that never started it
    monkeypatch.setattr(supervisor_mod, "START_GRACE", 0.0)
    fleet.store.update_task(task.id, state=TaskState.RUNNING,
                            claimed_by="elsewhere.example:42:7:0",
                            claimed_at=time.time() - 5)
    fleet.tick()  # requeued
    deadline = time.monotonic() + 10
    while not host.runs_of(task.id):
        t = fleet.get_task(task.id)
        assert time.monotonic() < deadline, (t.state, t.verdict, t.message, t.not_before)
        fleet.tick()
    one_run(host, task.id)


def test_two_engines_on_one_store_start_each_task_once(git_repo: Path,
                                                       tmp_path: Path) -> None:
    first, host = make(tmp_path, max_workers=8)
    second, _ = make(tmp_path, host=host, max_workers=8)
    tasks = first.submit(TaskSpec(prompt="work", repo=git_repo), copies=6)
    for _ in range(3):
        first.tick()
        second.tick()
    assert sorted(r.task_id for r in host.started) == sorted(t.id for t in tasks)
    assert {a.host for t in tasks for a in first.attempts(t.id)} == {"memory"}


def test_both_hosts_keep_to_the_seam() -> None:
    """What mypy checks for the package, checked here for the running objects: each host
    has every method of the seam."""
    needed = {name for name in dir(Host) if not name.startswith("_")}
    for host in (MemoryHost(Path("/nonexistent")), LocalHost(env={}, python="python3")):
        missing = {name for name in needed if not callable(getattr(host, name, None))
                   and name != "name"}
        assert not missing, (type(host).__name__, missing)
        assert isinstance(host.name, str)


def test_a_merge_asks_the_host_for_the_commits_and_a_closed_task_frees_its_placement(
        git_repo: Path, tmp_path: Path) -> None:
    """collect before the merge (a remote host brings the commits to the main repository
    then), release once the task is closed (the config dir on the host)."""
    from fleet_tui.core.errors import FleetRefused

    fleet, host = make(tmp_path)
    (task,) = fleet.submit(TaskSpec(prompt="work", repo=git_repo))
    fleet.tick()
    one_run(host, task.id).finish()
    fleet.tick()
    done = fleet.get_task(task.id)
    try:  # the memory host's worktree is no git checkout: nothing can merge
        result = fleet.branches.merge_task(done, message=None, test_command=None)
    except FleetRefused:
        pass
    else:
        assert not result.merged, result
    assert host.collected == [task.id]
    config = host.root / "config" / task.id
    assert config.is_dir()
    fleet.actions.remove_config_dir(task.id)
    assert host.released == [task.id] and not config.exists()


def test_the_local_host_collects_in_place_and_releases_the_config_dir(
        git_repo: Path, tmp_path: Path) -> None:
    from fleet_tui.store.db import Task

    host = LocalHost(env=dict(os.environ), python="python3")
    config = paths.private_dir(paths.task_config_dir("rel001", dict(os.environ)))
    (config / "settings.json").write_text("{}")
    task = Task(id="rel001", prompt="p", repo=git_repo, branch="fleet/rel001")
    assert host.collect(task) == "fleet/rel001"
    host.release("rel001")
    assert not config.exists()
    host.release("rel001")  # twice: nothing left, no error
