"""A ready worktree: `.fleet-tui.toml` (setup, include, test_command),
`.worktreeinclude`, FLEET_TASK_ID and a FLEET_PORT of its own for each worker, and the key
never copied. Real git repositories, the real runner and the real claude against the
scripted endpoint."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_fleet import drive, make_fleet, settled

from fleet_tui.core import stream
from fleet_tui.core.errors import InvalidSpec
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import TaskSpec
from fleet_tui.execution.worker import prepare
from fleet_tui.execution.worker.attemptlog import AttemptLog
from fleet_tui.settings.config import ConfigError
from fleet_tui.settings.repo_settings import (
    RepoSettings,
    RepoSettingsCache,
    load_repo_settings,
    worktree_include,
)
from fleet_tui.store.db import TaskState
from fleet_tui.system import paths

KEY = "sk-fleet-test-SECRET-41d8"  # test_fleet.make_fleet's key

SCRIPTS: dict[str, Any] = {
    # the worker writes down what it was given, then answers
    "env": {"turns": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": 'echo "$FLEET_TASK_ID $FLEET_PORT" > worker-env.txt; '
                               "cat .env 2>/dev/null > seen-env.txt; true",
                    "description": "look around"}}],
        "ready",
    ], "followup": ["again: {prompt}"]},
    # three of these at once: each holds its port a moment
    "port": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": 'echo "$FLEET_PORT" > port.txt; sleep 3',
                    "description": "hold the port"}}],
        "held",
    ],
}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout


def commit(repo: Path, files: dict[str, str], message: str = "settings") -> None:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", *files)
    git(repo, "commit", "-q", "-m", message)


def setup_events(events: list[stream.Event]) -> list[stream.Setup]:
    return [e for e in events if isinstance(e, stream.Setup)]


@pytest.fixture
def endpoint() -> Any:
    with ScriptedEndpoint(SCRIPTS) as ep:
        yield ep


# --- the settings files ---------------------------------------------------------------------


def test_repo_file_user_override_and_worktreeinclude(git_repo: Path, tmp_path: Path) -> None:
    user = tmp_path / "config.toml"
    (git_repo / ".fleet-tui.toml").write_text(
        'setup = "make deps"\ninclude = [".env", "config/*.local"]\ntest_command = "make test"\n')
    (git_repo / ".worktreeinclude").write_text("# secrets\n.env\n\n*.pem\n")
    assert worktree_include(git_repo) == (".env", "*.pem")
    got = load_repo_settings(git_repo, str(user))
    assert got == RepoSettings(setup="make deps", include=(".env", "config/*.local", "*.pem"),
                               test_command="make test")
    # config.toml overrides per repository; its other keys are the usual settings
    user.write_text(f'max_workers = 3\n[repos."{git_repo}"]\ntest_command = "make check"\n'
                    'setup = ""\n')
    got = load_repo_settings(git_repo, str(user))
    assert (got.setup, got.test_command) == (None, "make check")
    from fleet_tui.settings.config import load_settings
    assert load_settings(config_file=user).max_workers == 3  # the table is not a setting
    assert load_repo_settings(tmp_path, str(user)) == RepoSettings()  # no file: nothing


@pytest.mark.parametrize(("text", "words"), [
    ('setup = 3\n', ["line 1", "setup: expected a command"]),
    ('include = [1]\n', ["line 1", "include: expected a list"]),
    ('\n\nsetpu = "x"\n', ["line 3", "unknown setting 'setpu'", "setup, include"]),
    ('setup = "x\n', ["not valid TOML"]),
])
def test_a_bad_repo_file_names_the_file_and_the_line(git_repo: Path, tmp_path: Path,
                                                      text: str, words: list[str]) -> None:
    (git_repo / ".fleet-tui.toml").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_repo_settings(git_repo, str(tmp_path / "none.toml"))
    assert str(git_repo / ".fleet-tui.toml") in str(err.value)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_the_cache_reads_a_change_and_keeps_the_old_settings_on_a_bad_edit(
        git_repo: Path, tmp_path: Path) -> None:
    cache = RepoSettingsCache(config_file=str(tmp_path / "config.toml"))
    repo_file = git_repo / ".fleet-tui.toml"
    repo_file.write_text('test_command = "pytest -q"\n')
    assert cache.get(git_repo).test_command == "pytest -q"
    repo_file.write_text('test_command = "pytest -x -q"\n')
    assert cache.get(git_repo).test_command == "pytest -x -q"  # no restart needed
    repo_file.write_text('test_command = ["oops"]\n')
    assert cache.get(git_repo).test_command == "pytest -x -q"  # the old ones stay
    assert "expected a command" in cache.problems()[str(git_repo)]
    repo_file.write_text('test_command = "pytest"\n')
    assert cache.get(git_repo).test_command == "pytest" and cache.problems() == {}
    fresh = RepoSettingsCache(config_file=str(tmp_path / "config.toml"))
    repo_file.write_text("test_command = \n")
    with pytest.raises(ConfigError):  # never read well: said, not guessed
        fresh.get(git_repo)


def test_only_ignored_untracked_files_are_included(git_repo: Path) -> None:
    commit(git_repo, {".gitignore": ".env\n*.local\nbuild/\n"})
    (git_repo / ".env").write_text("A=1\n")
    (git_repo / "settings.local").write_text("x\n")
    (git_repo / "notes.local.txt").write_text("untracked, not ignored\n")
    (git_repo / "build").mkdir()
    (git_repo / "build" / "out.bin").write_text("b\n")
    (git_repo / ".fleet-work" / "abc").mkdir(parents=True)
    (git_repo / ".fleet-work" / "abc" / ".env").write_text("a worktree's\n")
    git(git_repo, "config", "core.excludesFile", "/dev/null")
    (git_repo / ".git" / "info" / "exclude").write_text(".fleet-work/\n")
    files = prepare.included_files(str(git_repo), [".env", "*.local", "README.md", "build/",
                                                   "notes*", "*"])
    # README.md is tracked (in the worktree already); notes.local.txt is not ignored
    assert files == [".env", "build/out.bin", "settings.local"]


# --- the runner makes the worktree ready ------------------------------------------------------


def test_setup_include_and_the_workers_environment(git_repo: Path, claude_bin: str,
                                                    endpoint: ScriptedEndpoint) -> None:
    commit(git_repo, {
        ".gitignore": ".env\n",
        ".fleet-tui.toml": 'setup = "echo installing deps; echo $FLEET_TASK_ID > '
                           'setup-task.txt; ls .env"\ninclude = [".env"]\n'})
    (git_repo / ".env").write_text("DATABASE_URL=postgres://localhost/dev\n")
    fleet = make_fleet(endpoint, claude_bin)
    (task,) = fleet.submit(TaskSpec(prompt="[script:env] look", repo=git_repo))
    drive(fleet, settled(fleet, task.id))
    done = fleet.get_task(task.id)
    assert done.state == TaskState.SUCCEEDED, done.message
    worktree = Path(done.worktree or "")
    attempt = fleet.attempts(task.id)[-1]
    # the included file, byte for byte; the setup ran in the worktree with the task's id
    assert (worktree / ".env").read_text() == "DATABASE_URL=postgres://localhost/dev\n"
    assert (worktree / "setup-task.txt").read_text() == f"{task.id}\n"
    assert (worktree / "seen-env.txt").read_text() == "DATABASE_URL=postgres://localhost/dev\n"
    task_id, port = (worktree / "worker-env.txt").read_text().split()
    assert task_id == task.id and 1024 <= int(port) <= 65535 and attempt.port == int(port)
    # the stream: the setup step first (start, end with its output), then claude
    events, _ = fleet.read_events(attempt)
    start, end = setup_events(events)
    assert (start.phase, end.phase) == ("start", "end") and events[0] is start
    assert end.exit_code == 0 and end.copied == [".env"] and end.skipped == []
    assert end.output.splitlines() == ["installing deps", ".env"]
    assert events.index(end) < next(i for i, e in enumerate(events)
                                    if isinstance(e, stream.Init))
    assert AttemptLog(attempt.dir or "").setup_log.read_text() == "installing deps\n.env\n"
    assert prepare.is_set_up(str(worktree))
    # a follow-up continues in the ready worktree: no second setup
    fleet.follow_up(task.id, "and again")
    drive(fleet, settled(fleet, task.id))
    second = fleet.attempts(task.id)[-1]
    events, _ = fleet.read_events(second)
    assert fleet.get_task(task.id).state == TaskState.SUCCEEDED
    assert setup_events(events) == [] and not AttemptLog(second.dir or "").setup_log.exists()


def test_a_failing_setup_fails_the_attempt_before_any_token(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    commit(git_repo, {".fleet-tui.toml": 'setup = "echo fetching; echo no network >&2; '
                                         'exit 7"\n'})
    fleet = make_fleet(endpoint, claude_bin)
    (task,) = fleet.submit(TaskSpec(prompt="[script:env] look", repo=git_repo))
    drive(fleet, settled(fleet, task.id))
    done = fleet.get_task(task.id)
    assert done.state == TaskState.FAILED and done.verdict == "crashed"
    assert done.message is not None and done.message.startswith(
        "the setup command `echo fetching; echo no network >&2; exit 7` failed (exit 7): "
        "no network")
    assert endpoint.requests == []  # claude never started: no token spent
    events, _ = fleet.read_events(fleet.attempts(task.id)[-1])
    end = setup_events(events)[-1]
    assert end.exit_code == 7 and end.output == "fetching\nno network\n"
    assert not any(isinstance(e, stream.Init) for e in events)
    assert not prepare.is_set_up(str(done.worktree))
    # fixed and retried fresh: the new worktree is set up, and the task runs
    commit(git_repo, {".fleet-tui.toml": 'setup = "echo fixed"\n'}, "fix the setup")
    fleet.retry(task.id)
    drive(fleet, settled(fleet, task.id))
    assert fleet.get_task(task.id).state == TaskState.SUCCEEDED


def test_include_and_setup_never_copy_the_key(git_repo: Path, claude_bin: str,
                                              endpoint: ScriptedEndpoint) -> None:
    commit(git_repo, {".gitignore": "*.env\n", ".worktreeinclude": "*.env\n",
                      ".fleet-tui.toml": 'setup = "env > setup-env.txt; cat ../../.env.key '
                                         '2>/dev/null; cat key.env 2>/dev/null; true"\n'})
    (git_repo / "key.env").write_text(f"ANTHROPIC_AUTH_TOKEN={KEY}\n")
    (git_repo / "app.env").write_text("PORT=3000\n")
    fleet = make_fleet(endpoint, claude_bin)
    (task,) = fleet.submit(TaskSpec(prompt="[script:env] look", repo=git_repo))
    drive(fleet, settled(fleet, task.id))
    done = fleet.get_task(task.id)
    assert done.state == TaskState.SUCCEEDED, done.message
    worktree = Path(done.worktree or "")
    assert (worktree / "app.env").read_text() == "PORT=3000\n"
    assert not (worktree / "key.env").exists()
    end = setup_events(fleet.read_events(fleet.attempts(task.id)[-1])[0])[-1]
    assert end.copied == ["app.env"] and end.skipped == ["key.env: it holds the API key"]
    setup_env = (worktree / "setup-env.txt").read_text()
    assert KEY not in setup_env and f"FLEET_TASK_ID={task.id}" in setup_env
    assert "FLEET_PORT=" in setup_env
    for folder in (worktree, Path(fleet.attempts(task.id)[-1].dir or "")):
        for path in folder.rglob("*"):
            if path.is_file() and ".git" not in path.parts:
                assert KEY.encode() not in path.read_bytes(), path


def test_a_bad_repo_file_fails_the_start_with_the_file_and_line(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    commit(git_repo, {".fleet-tui.toml": 'include = ".env"\nsetup = 3\n'})
    fleet = make_fleet(endpoint, claude_bin)
    # refused before anything is created, naming the file and line
    with pytest.raises(InvalidSpec) as refused:
        fleet.submit(TaskSpec(prompt="[script:env] look", repo=git_repo))
    assert f"{git_repo / '.fleet-tui.toml'}, line 2: setup: expected a command" in str(
        refused.value)
    assert fleet.list_tasks() == [] and endpoint.requests == []


def test_fleet_port_is_unique_across_three_concurrent_workers(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    # three at once: every sample compares each running attempt's port with the others'
    # (two suffice for a clash; the store's refusal of a held port has its own test below)
    fleet = make_fleet(endpoint, claude_bin, max_workers=3)
    tasks = fleet.submit(TaskSpec(prompt="[script:port] hold", repo=git_repo), copies=3)
    peak = {"running": 0}

    def sample() -> None:
        ports = [a.port for a in fleet.store.unfinished_attempts() if a.port is not None]
        assert len(ports) == len(set(ports)), ports  # never two at once
        peak["running"] = max(peak["running"], len(ports))

    drive(fleet, settled(fleet, *[t.id for t in tasks]), timeout=240, each=sample)
    ports = []
    for t in tasks:
        done = fleet.get_task(t.id)
        assert done.state == TaskState.SUCCEEDED, done.message
        ports.append(int((Path(done.worktree or "") / "port.txt").read_text()))
        assert fleet.attempts(t.id)[-1].port == ports[-1]
    assert len(set(ports)) == 3
    assert peak["running"] == 3  # they did run side by side, all three
    assert paths.db_path().exists()


def test_setup_does_not_outlive_a_kill(git_repo: Path, claude_bin: str,
                                       endpoint: ScriptedEndpoint) -> None:
    commit(git_repo, {".fleet-tui.toml": 'setup = "echo started; sleep 338"\n'})
    fleet = make_fleet(endpoint, claude_bin)
    (task,) = fleet.submit(TaskSpec(prompt="[script:env] look", repo=git_repo))

    def setting_up() -> bool:
        attempts = fleet.attempts(task.id)
        return bool(attempts) and attempts[-1].dir is not None and \
            AttemptLog(attempts[-1].dir).setup_log.exists() and \
            "started" in AttemptLog(attempts[-1].dir).setup_log.read_text()

    drive(fleet, setting_up, timeout=60)
    fleet.kill(task.id)
    done = fleet.get_task(task.id)
    assert done.state == TaskState.KILLED and done.verdict == "killed"
    assert endpoint.requests == []
    out = subprocess.run(["pgrep", "-f", "sleep 338"], capture_output=True, text=True)
    assert out.stdout.strip() == ""
    assert os.path.exists(git_repo)


def test_the_store_never_hands_out_a_port_a_running_attempt_holds(tmp_path: Path) -> None:
    from fleet_tui.store.db import Store, StoreError

    store = Store(tmp_path / "fleet.db")
    for tid in ("aaa001", "aaa002", "aaa003"):
        store.create_task(task_id=tid, prompt="p", repo=tmp_path)
    first, second, third = (store.add_attempt(t) for t in ("aaa001", "aaa002", "aaa003"))
    proposals = iter([5000, 5000, 5000, 5001])
    assert store.assign_port(first.id, lambda: next(proposals)) == 5000
    assert store.assign_port(second.id, lambda: next(proposals)) == 5001  # 5000 is held
    store.update_attempt(first.id, finished_at=1.0)  # its worker ended: the port is free
    assert store.assign_port(third.id, lambda: 5000) == 5000
    with pytest.raises(StoreError, match="no free port"):
        store.assign_port(first.id, lambda: 5001, tries=3)
