"""One rule, one owner, on the engine's side: the engine, the CLI and the form
apply the same rule because they call the same function. Real git repositories, a real
store and the real `fleet-tui` commands (in this process); nothing here starts claude."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fleet_tui.commands import tasks
from fleet_tui.core import durations, errors, policy, titles
from fleet_tui.core.errors import FleetTuiError
from fleet_tui.core.states import Action, TaskState
from fleet_tui.demo.session import DemoEndpointError
from fleet_tui.engine.fleet import Fleet, FleetError, FleetRefused, InvalidSpec, TaskNotFound
from fleet_tui.execution.worker import launch as launcher
from fleet_tui.execution.worker.attemptlog import EVENTS_FILE, write_json_atomic
from fleet_tui.settings import credentials
from fleet_tui.settings.config import ConfigError, load_settings
from fleet_tui.store.db import AmbiguousTaskError, StoreError, TaskSpec, UnknownTaskError
from fleet_tui.system import paths, procs
from fleet_tui.vcs import git, repolock

INIT = b'{"type":"system","subtype":"init","session_id":"s-1","cwd":"/w","tools":[]}\n'


def engine() -> Fleet:
    return Fleet(load_settings(), None)


# --- one error root ----------------------------------------------------------------------------


@pytest.mark.parametrize(("error", "code"), [
    (FleetError("x"), errors.EXIT_FAILED),
    (FleetRefused("x"), errors.EXIT_REFUSED),
    (InvalidSpec("x"), errors.EXIT_USAGE),
    (TaskNotFound("x"), errors.EXIT_NOT_FOUND),
    (TaskNotFound("x", ambiguous=True), errors.EXIT_USAGE),
    (git.GitError("x"), errors.EXIT_FAILED),
    (StoreError("x"), errors.EXIT_FAILED),
    (UnknownTaskError("x"), errors.EXIT_NOT_FOUND),
    (AmbiguousTaskError("x"), errors.EXIT_USAGE),
    (launcher.LaunchError("x"), errors.EXIT_FAILED),
    (launcher.LaunchError("x", 7), 7),
    (launcher.UsageError("x"), errors.EXIT_USAGE),
    (launcher.ConfigDirError("x"), errors.EXIT_USAGE),
    (credentials.NoCredentialError("x"), errors.EXIT_MISSING),
    (launcher.ClaudeNotFoundError("x"), errors.EXIT_MISSING),
    (ConfigError("x", path="/c.toml", line=2), errors.EXIT_USAGE),
    (repolock.LockTimeout("x"), errors.EXIT_FAILED),
    (DemoEndpointError("x"), errors.EXIT_FAILED),
])
def test_every_user_facing_error_has_the_root_and_its_exit_code(error: FleetTuiError,
                                                                 code: int) -> None:
    assert isinstance(error, FleetTuiError)
    assert error.exit_code == code and error.message == "x" and str(error) == "x"


def test_a_git_error_comes_through_the_engine_as_it_is(tmp_path: Path) -> None:
    """GitError is a FleetTuiError: the engine no longer re-wraps it as a FleetError."""
    with pytest.raises(git.GitError, match="not inside a git repository") as caught:
        engine().submit(TaskSpec(prompt="x", repo=tmp_path))
    assert not isinstance(caught.value, FleetError)


@pytest.mark.parametrize(("argv", "code", "said"), [
    (["show", "zzzzzz"], errors.EXIT_NOT_FOUND, "no task 'zzzzzz'"),
    (["show", "Z!"], errors.EXIT_NOT_FOUND, "1 to 6 characters"),
    (["ls", "--bogus"], errors.EXIT_USAGE, "unrecognized arguments"),
    (["run", "x", "--timeout", "soon"], errors.EXIT_USAGE, "expected a number of seconds"),
])
def test_the_cli_maps_every_error_to_its_message_and_code(
        argv: list[str], code: int, said: str, git_repo: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(git_repo)
    assert tasks.main(argv) == code
    err = capsys.readouterr().err
    assert err.startswith(f"fleet-tui {argv[0]}: ") and said in err and err.count("\n") == 1


def test_a_bad_setting_is_a_usage_error(git_repo: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("max_workers = 'many'\n")
    monkeypatch.setenv("FLEET_TUI_CONFIG", str(config))
    monkeypatch.chdir(git_repo)
    assert tasks.main(["ls"]) == errors.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("fleet-tui ls: ") and str(config) in err


# --- what a task allows: the engine refuses with the panel's reasons ---------------------------


def stored(fleet: Fleet, repo: Path, state: TaskState, **fields: object) -> str:
    """A task row as the engine leaves it in `state` (no worktree: nothing runs here)."""
    values: dict[str, object] = {"title": "work", "base_commit": "0" * 40,
                                 "base_branch": "main", "session_id": "s-1",
                                 "endpoint": "default"}
    values.update(fields)
    task = fleet.store.create_task(prompt="work", repo=repo, state=state, now=time.time(),
                                   **values)
    return task.id


@pytest.mark.parametrize(("state", "fields", "action"), [
    (TaskState.SUCCEEDED, {"session_id": None}, Action.FOLLOW_UP),
    (TaskState.QUEUED, {"session_id": "s-1"}, Action.FOLLOW_UP),
    (TaskState.QUEUED, {}, Action.RETRY),
    (TaskState.QUEUED, {}, Action.MERGE),
    (TaskState.SUCCEEDED, {"base_branch": None}, Action.MERGE),
    (TaskState.SUCCEEDED, {}, Action.KILL),
    (TaskState.MERGED, {}, Action.DISCARD),
    (TaskState.DISCARDED, {}, Action.KILL),
])
def test_the_engine_refuses_what_policy_refuses_in_its_words(
        state: TaskState, fields: dict[str, object], action: Action, git_repo: Path) -> None:
    fleet = engine()
    task_id = stored(fleet, git_repo, state, **fields)
    act = {Action.FOLLOW_UP: lambda: fleet.follow_up(task_id, "and then?"),
           Action.RETRY: lambda: fleet.retry(task_id),
           Action.MERGE: lambda: fleet.merge(task_id),
           Action.KILL: lambda: fleet.kill(task_id),
           Action.DISCARD: lambda: fleet.discard(task_id)}[action]
    expected = policy.refusal(fleet.get_task(task_id), action)
    assert expected is not None
    with pytest.raises(FleetError) as caught:
        act()
    assert str(caught.value) == expected
    assert fleet.get_task(task_id).state == state  # nothing changed


@pytest.mark.parametrize("state", [TaskState.QUEUED, TaskState.WAITING, TaskState.RUNNING])
def test_a_pending_or_claimed_task_is_discarded_killing_it_first(state: TaskState,
                                                                  git_repo: Path) -> None:
    """The panel refused to discard a running task the engine would discard: policy allows
    it, and the engine stops it first (here: claimed, its runner not launched yet)."""
    fleet = engine()
    task_id = stored(fleet, git_repo, state)
    assert policy.why_not(fleet.get_task(task_id), Action.DISCARD) is None
    fleet.discard(task_id)
    done = fleet.get_task(task_id)
    assert done.state == TaskState.DISCARDED and done.worktree is None


def test_a_resume_without_a_session_is_refused_with_the_policy_reason(git_repo: Path) -> None:
    fleet = engine()
    task_id = stored(fleet, git_repo, TaskState.FAILED, session_id=None)
    with pytest.raises(FleetError, match="no session to resume") as caught:
        fleet.retry(task_id, resume=True)
    why = policy.why_not_resume(fleet.get_task(task_id))
    assert str(caught.value) == f"cannot retry task {task_id}: {why}"


# --- one duration parser, one title rule, one base resolution ----------------------------------


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90), ("2.5", 2.5), ("0", 0), (" 15m ", 900), ("90s", 90), ("1h30m", 5400),
    ("1h 30m 15s", 5415), ("1.5h", 5400), (".5m", 30), ("2H", 7200), ("1e3", 1000),
])
def test_a_duration_reads_as_people_type_it(text: str, seconds: float) -> None:
    assert durations.parse_duration(text) == seconds


@pytest.mark.parametrize(("text", "said"), [
    ("", "a number of seconds"), ("soon", "a number of seconds"), ("5x", "a number of"),
    ("-3", "0 or more seconds"), ("nan", "finite"), ("inf", "finite"), ("-inf", "finite"),
    ("1e400", "finite"), ("30m1h", "largest first"), ("1h1h", "largest first"),
    ("1h-5m", "a number of seconds"),
])
def test_a_bad_duration_says_what_is_expected(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        durations.parse_duration(text)
    with pytest.raises(ValueError, match="more than 0"):
        durations.parse_duration("0", allow_zero=False)


def test_a_long_prompt_gives_one_title_everywhere(git_repo: Path) -> None:
    line = "Refactor " + "the parser " * 10
    prompt = f"\n   {line}  \nmore detail\n"
    fleet = engine()
    (task,) = fleet.submit(TaskSpec(prompt=prompt, repo=git_repo))
    expected = titles.title_from_prompt(prompt)
    assert len(expected) == titles.TITLE_MAX and expected.endswith("…")
    assert expected[:-1] == line.strip()[: titles.TITLE_MAX - 1].rstrip()
    assert task.title == expected
    untitled = fleet.store.create_task(prompt=prompt, repo=git_repo, title="")
    assert untitled.short_title == expected  # a row stored without a title
    assert titles.title_from_prompt("short one\n") == "short one"
    assert titles.title_from_prompt(" \n\t\n") == titles.UNTITLED
    two = fleet.submit(TaskSpec(prompt="copies", repo=git_repo), copies=2)
    assert [t.title for t in two] == ["copies (1/2)", "copies (2/2)"]


def test_the_form_and_the_engine_resolve_a_base_the_same_way(git_repo: Path) -> None:
    from fleet_tui.ui.screens.launch import check_base_ref, parse_duration

    fleet = engine()
    repo = git.main_worktree(git_repo)  # what the panel gives the form
    for ref in ("no-such-branch", "-x", "  "):
        with pytest.raises(git.GitError) as caught:
            fleet.submit(TaskSpec(prompt="x", repo=git_repo, base_ref=ref))
        assert check_base_ref(repo, ref.strip()) == str(caught.value)
    assert check_base_ref(repo, "main") is None
    head = git.resolve_base(git_repo)
    assert head.branch == "main" and len(head.commit) == 40
    (task,) = fleet.submit(TaskSpec(prompt="x", repo=git_repo, base_ref="main"))
    assert (task.base_commit, task.base_branch) == git.resolve_base(git_repo, "main")
    # the form's time limit is the CLI's: durations.parse_duration (0: no limit)
    assert parse_duration("1h30m") == 5400 and parse_duration("") is None
    assert parse_duration("0") == 0


# --- the attempt folder is the one source of truth ---------------------------------------------


def test_following_stores_line_ends_only_and_reads_the_folder_not_the_columns(
        git_repo: Path, tmp_path: Path, stand_in_runner: int) -> None:
    """The follower reads whole lines only (attemptlog's rule): the stored offset never
    points inside a line a running claude is writing. And the attempt's stored
    events_path is not read: the folder is (a row whose column points elsewhere)."""
    fleet = engine()
    now = time.time()
    me = stand_in_runner
    task_id = stored(fleet, git_repo, TaskState.RUNNING, started_at=now, attempt_count=1)
    adir = paths.attempt_dir(git_repo, task_id, 1)
    adir.mkdir(parents=True)
    (adir / EVENTS_FILE).write_bytes(INIT * 3 + INIT[:20])  # claude is writing line 4
    write_json_atomic(adir / "launch.json", {"runner_pid": me,
                                             "runner_start": procs.start_time(me)})
    attempt = fleet.store.add_attempt(task_id, prompt="p", now=now, runner_pid=me, dir=adir,
                                      events_path=tmp_path / "elsewhere.jsonl",
                                      started_at=now)
    fleet.tick()
    assert fleet.store.get_attempt(attempt.id).events_offset == len(INIT) * 3
    assert fleet.ingested_bytes == len(INIT) * 3 and fleet.ingested_events == 3
    events, end = fleet.read_events(fleet.store.get_attempt(attempt.id))
    assert len(events) == 3 and end == len(INIT) * 3
    with (adir / EVENTS_FILE).open("ab") as fh:
        fh.write(INIT[20:])  # the line is complete now
    fleet.tick()
    assert fleet.store.get_attempt(attempt.id).events_offset == len(INIT) * 4


@pytest.mark.parametrize("state", [TaskState.SUCCEEDED, TaskState.FAILED, TaskState.KILLED])
def test_a_message_to_a_finished_worker_is_said_as_such(state: TaskState,
                                                          git_repo: Path) -> None:
    """`say` to a finished task raises WorkerFinished (the panel sends such a message as a
    follow-up instead); any other refusal is not one (review finding: the panel turned
    every refusal, a NUL byte or "starting" too, into a wait for a follow-up)."""
    from fleet_tui.core.errors import WorkerFinished

    fleet = engine()
    done = stored(fleet, git_repo, state)
    with pytest.raises(WorkerFinished) as caught:
        fleet.say(done, "and then?")
    assert str(caught.value) == policy.refusal(fleet.get_task(done), Action.SAY)
    running = stored(fleet, git_repo, TaskState.RUNNING)
    for text in ("with a \x00 in it", "go on"):  # bad text; a worker without an attempt
        with pytest.raises(FleetError) as other:
            fleet.say(running, text)
        assert not isinstance(other.value, WorkerFinished), str(other.value)
