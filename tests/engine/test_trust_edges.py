"""What it shows must be true: run times from the runner's own records, a run
that changed nothing says so, `logs --follow` ends on the recorded state, exit codes as the
README's table has them, messages that say what happened. Real claude against the scripted
endpoint, real git, real SQLite, the CLI as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from endpoint_helpers import cli_env, poll_pauses, run_cli, shared

from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.demo.session import demo_scripts
from fleet_tui.engine.fleet import Fleet
from fleet_tui.execution.worker.attemptlog import AttemptLog
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store
from fleet_tui.system import paths

KEY = "sk-edges-test-SECRET-5d1c"


def _scripts(go: Path) -> dict[str, Any]:
    return {
        **demo_scripts(),
        "default": [
            [{"type": "tool_use", "name": "Bash",
              "input": {"command": "echo worker > a.txt", "description": "write a.txt"}}],
            "wrote a.txt",
        ],
        "chat": ["first answer", "second answer"],
        # waits for the test's word (a file) before it ends its turn
        "gated": [
            [{"type": "tool_use", "name": "Bash",
              "input": {"command": f"while [ ! -e {go} ]; do sleep 0.05; done; echo go",
                        "description": "wait for the test"}}],
            "done waiting",
        ],
    }


@pytest.fixture
def endpoint(git_repo: Path) -> Iterator[ScriptedEndpoint]:
    # the word is a file where the worker can see it: its repository's cache folder
    with ScriptedEndpoint(_scripts(shared(git_repo, "gate") / "go")) as ep:
        yield ep


@pytest.fixture
def env(endpoint: ScriptedEndpoint, claude_bin: str) -> dict[str, str]:
    return cli_env(endpoint.url, claude_bin, KEY)


cli = run_cli  # fleet-tui ARGS in a folder (tests/support/endpoint_helpers.py)


def started(env: dict[str, str], repo: Path, prompt: str) -> str:
    out = cli(env, repo, "run", prompt)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()[0]


def attempt_dir(task_id: str) -> Path:
    attempt = Store(paths.db_path()).latest_attempt(task_id)
    assert attempt is not None and attempt.dir is not None
    return Path(attempt.dir)


def wait_for(what: str, check: Any, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    pauses = poll_pauses(0.05, 0.5)  # a check may run an `ls` process
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(next(pauses))


def in_process_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name in ("FLEET_WORKER_BASE_URL", "FLEET_WORKER_CLAUDE", "FLEET_WORKER_KEY_SOURCES",
                 "CLAUDE_CODE_MAX_RETRIES", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.setenv(name, env[name])


# --- run times --------------------------------------------------------------------------------


def test_a_run_that_ended_while_nobody_looked_keeps_the_runners_own_times(
        env: dict[str, str], git_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner ends while no engine runs; an engine looks ten minutes later (its clock
    says so: the follower records the end 600 s after the runner's own end time). `show`'s
    attempt time and the list's time are the runner's, not the wait's."""
    tid = started(env, git_repo, "[script:chat] hello")  # `run` returns once started
    folder = AttemptLog(attempt_dir(tid))
    record = wait_for("the runner's exit record", lambda: folder.exit_record()[0])
    ran = record["finished_at"] - record["started_at"]
    assert Store(paths.db_path()).get_task(tid).state.value == "running"  # nobody looked

    in_process_env(monkeypatch, env)
    later = Fleet(load_settings(), Store(paths.db_path()), clock=lambda: time.time() + 600)
    later.tick()
    task = later.get_task(tid)
    assert task.state.value == "succeeded", task.message

    show = cli(env, git_repo, "show", tid)
    line = next(x for x in show.stdout.splitlines() if x.strip().startswith("#1 "))
    import re

    shown = float(re.findall(r" (\d+\.\d)s ", line)[0])
    # from the engine's launch (a moment before the runner's own start) to the runner's end
    assert ran - 0.1 <= shown < ran + 5.0, (line, ran)
    from fleet_tui.ui.widgets.task_table import elapsed

    listed = elapsed(task, time.time() + 600)
    assert listed is not None and abs(listed - ran) < 5.0, (listed, ran)
    assert task.finished_at == pytest.approx(record["finished_at"])


# --- logs --follow ends on the recorded state -------------------------------------------------


def test_logs_follow_prints_the_recorded_end_when_the_run_ends_right_after_a_pass(
        env: dict[str, str], git_repo: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The runner writes its exit record right after `logs --follow`'s scheduling pass
    (the test lets the worker end there, and waits for the record): the loop sees the record
    and leaves; the state it prints is the recorded end, never "running"."""
    from fleet_tui.commands import tasks

    tid = started(env, git_repo, "[script:gated] wait for the word")
    folder = AttemptLog(attempt_dir(tid))
    in_process_env(monkeypatch, env)
    real_tick = Fleet.tick
    released: list[bool] = []

    def tick(self: Fleet) -> Any:
        changes = real_tick(self)
        if not released:
            released.append(True)
            (shared(git_repo, "gate") / "go").write_text("")
            wait_for("the runner's exit record", lambda: folder.exited)
        return changes

    monkeypatch.setattr(Fleet, "tick", tick)
    assert tasks.main(["logs", tid, "--follow"]) == 0
    out = capsys.readouterr()
    assert released
    assert out.out.splitlines()[-1] == "result   ok (success, 2 turns): done waiting"
    # (this worker changes no file: its state says so, as run --wait's does)
    assert out.err.splitlines()[-1].startswith(f"{tid} succeeded, no change: "), out.err


# --- one table of exit codes, as the README has it -------------------------------------------


def readme_exit_codes() -> dict[int, str]:
    """The README's "Exit codes: 0 ok, 1 a task failed, ..." sentence as {code: words}."""
    import re

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = text.index("Exit codes: 0 ok")
    sentence = " ".join(text[start:text.index(".\n", start)].split())
    sentence = re.sub(r"\([^()]*\)", "", sentence.removeprefix("Exit codes: "))
    out: dict[int, str] = {}
    for part in sentence.split(","):
        code, _, words = part.strip().partition(" ")
        out[int(code)] = words.strip()
    return out


def test_the_readme_says_what_the_one_table_of_exit_codes_says() -> None:
    from fleet_tui.core.errors import OUTCOMES

    readme = readme_exit_codes()
    assert readme and len(readme) >= 6
    for code, words in readme.items():
        assert OUTCOMES.get(words) == code, (code, words, OUTCOMES)


@pytest.mark.long
def test_every_commands_refusals_exit_with_the_code_the_readme_gives(
        env: dict[str, str], endpoint: ScriptedEndpoint, git_repo: Path,
        tmp_path: Path) -> None:
    from fleet_tui.core.errors import OUTCOMES

    readme = readme_exit_codes()

    def expect(outcome: str, *args: str, says: str | None = None) -> None:
        out = cli(env, git_repo, *args)
        code = OUTCOMES[outcome]
        assert readme[code] == outcome
        assert out.returncode == code, (args, out.returncode, out.stderr)
        assert out.stderr.startswith(f"fleet-tui {args[0]}: "), (args, out.stderr)
        if says is not None:
            assert says in out.stderr, (args, out.stderr)

    run = cli(env, git_repo, "run", "[script:chat] hi", "--copies", "3", "--wait")
    assert run.returncode == 0, run.stderr
    merged, discarded, finished = (line.split()[0] for line in run.stdout.splitlines())
    # make the first one land: it needs a change
    (Path(Store(paths.db_path()).get_task(merged).worktree or "") / "m.txt").write_text("m\n")
    assert cli(env, git_repo, "merge", merged, "--yes").returncode == 0
    assert cli(env, git_repo, "discard", discarded, "--yes").returncode == 0

    refused = "refused to keep your work safe"
    for args in (("kill", merged), ("say", merged, "more"), ("merge", merged, "--yes"),
                 ("discard", merged, "--yes"), ("retry", merged, "--yes"),
                 ("follow-up", merged, "more"), ("diff", merged), ("update", merged),
                 ("queue", discarded), ("merge", discarded, "--yes"),
                 ("pick", discarded, "--yes"), ("push", discarded),
                 ("say", finished, "more"), ("kill", finished),
                 ("archive", finished)):
        expect(refused, *args, says="task ")
    expect("no such task", "queue", "--remove", finished, says="not in the merge queue")
    for command in ("show", "kill", "say", "merge", "queue", "push", "pick", "logs"):
        extra = ("text",) if command == "say" else ()
        expect("no such task", command, "zzzzzz", *extra)

    # a task started from a detached HEAD cannot be merged by fleet-tui
    subprocess.run(["git", "checkout", "-q", "--detach"], cwd=git_repo, check=True)
    detached = cli(env, git_repo, "run", "[script:chat] hi", "--wait")
    assert detached.returncode == 0, detached.stderr
    expect(refused, "merge", detached.stdout.split()[0], "--yes",
           says="started from a commit, not a branch")
    subprocess.run(["git", "checkout", "-q", "main"], cwd=git_repo, check=True)

    # a task parked by a usage window (attempt 1 ran): it takes no message, and says why
    endpoint.set_faults([{"kind": "window", "seconds": 600}])
    parked = started(env, git_repo, "[script:chat] hi")
    wait_for("the park", lambda: Store(paths.db_path()).get_task(parked).state.value
             == "waiting" or cli(env, git_repo, "ls").returncode != 0)
    expect(refused, "say", parked, "more",
           says="attempt 1 ended and the task waits for its endpoint's usage window")
    out = cli(env, git_repo, "say", parked, "more")
    assert "has not started yet" not in out.stderr
    assert cli(env, git_repo, "kill", parked).returncode == 0


# --- a success that changed nothing says so ---------------------------------------------------


@pytest.mark.long
def test_a_run_whose_tool_calls_all_failed_and_changed_nothing_says_so_everywhere(
        env: dict[str, str], git_repo: Path) -> None:
    """No greeting.py here: the demo's greet-casual worker's Read, Edit and Bash all fail,
    and it still says "The greeting is more casual now."."""
    from fleet_tui.ui.formatting import change_label

    run = cli(env, git_repo, "run", "[script:greet-casual] make it casual", "--copies", "2",
              "--wait")
    ids = [line.split()[0] for line in run.stdout.splitlines()]
    assert len(ids) == 2
    assert run.returncode == 0, run.stderr  # succeeded: claude ended its turn as it should
    for tid in ids:
        assert f"{tid} succeeded, no change: " in run.stderr, run.stderr
    assert "[all 3 tool calls failed]" in run.stderr
    assert f"2 of 2 succeeded without changing anything (+0/-0): {', '.join(ids)}" \
        in run.stderr

    table = cli(env, git_repo, "ls").stdout
    for tid in ids:
        row = next(line for line in table.splitlines() if line.startswith(tid))
        assert "ok, no change" in row, row
    show = cli(env, git_repo, "show", ids[0]).stdout
    assert "state:     succeeded, no change" in show
    assert "changes:   +0 -0 (no change)" in show
    assert "The greeting is more casual now. [all 3 tool calls failed]" in show
    task = Store(paths.db_path()).get_task(ids[0])
    assert change_label(task) == "no change"  # the panel's list and its notification

    # a run that changed something carries no such mark
    done = cli(env, git_repo, "run", "write a.txt", "--wait")
    assert done.returncode == 0, done.stderr
    tid = done.stdout.split()[0]
    assert f"{tid} succeeded: " in done.stderr and "no change" not in done.stderr
    assert "tool call" not in done.stderr
    assert change_label(Store(paths.db_path()).get_task(tid)) is None


# --- messages that say what happened ------------------------------------------------------


def test_a_push_onto_a_remote_branch_with_someone_elses_commit_says_so(
        env: dict[str, str], git_repo: Path) -> None:
    remote = git_repo.parent / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    subprocess.run(["git", "remote", "add", "origin", str(remote)], cwd=git_repo, check=True)
    run = cli(env, git_repo, "run", "write a.txt", "--wait")
    assert run.returncode == 0, run.stderr
    tid = run.stdout.split()[0]
    # someone else's commit on the remote's fleet/ID
    other = git_repo.parent / "other"
    subprocess.run(["git", "clone", "-q", str(git_repo), str(other)], check=True)
    (other / "theirs.txt").write_text("theirs\n")
    subprocess.run(["git", "add", "-A"], cwd=other, check=True)
    subprocess.run(["git", "-c", "user.name=Someone Else", "-c",
                    "user.email=else@example.invalid", "commit", "-q", "-m", "theirs"],
                   cwd=other, check=True)
    subprocess.run(["git", "push", "-q", str(remote), f"HEAD:refs/heads/fleet/{tid}"],
                   cwd=other, check=True, capture_output=True)
    out = cli(env, git_repo, "push", tid)
    assert out.returncode == 4, out.stderr
    assert "failed to push some refs" not in out.stderr
    assert f"origin's branch fleet/{tid} has commits that are not this task's" in out.stderr
    assert f"git push origin --delete fleet/{tid}" in out.stderr


def test_doctor_says_where_each_setting_came_from(tmp_path: Path) -> None:
    env = dict(os.environ, FLEET_WORKER_BASE_URL="http://127.0.0.1:9/anthropic")
    out = subprocess.run([sys.executable, "-c", "import sys; from fleet_tui.cli import "
                          "doctor_main; sys.exit(doctor_main())", "--json"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    assert "Traceback" not in out.stderr, out.stderr
    checks = {row["check"]: row for row in json.loads(out.stdout)["data"]}
    detail = checks["settings"]["detail"]
    assert "settings defaults" not in detail and "defaults (" not in detail
    assert "no config file (" in detail
    assert "base_url http://127.0.0.1:9/anthropic (FLEET_WORKER_BASE_URL)" in detail
    assert "model GLM-5.2 (default)" in detail


def test_logs_shows_a_result_whose_turn_count_is_no_number_sanely() -> None:
    from fleet_tui.commands.tasks import format_event
    from fleet_tui.core import stream

    line = json.dumps({"type": "result", "subtype": "success", "is_error": False,
                       "num_turns": 1e308, "result": "done", "session_id": "s"})
    (event,) = stream.StreamDecoder().feed((line + "\n").encode())
    shown = format_event(event)
    assert shown == "result   ok (success, turns unknown): done"


def test_a_hold_names_the_first_task_that_met_it() -> None:
    from fleet_tui.core.policy import Effect, apply_effect
    from fleet_tui.settings.config import load_settings as settings_from
    from fleet_tui.store.db import EndpointState

    settings = settings_from(env={})
    state = EndpointState(endpoint="e")
    first = apply_effect(state, Effect("hold", reason="arrears 1113", task="first"),
                         settings, 1.0)
    assert first is not None and first["held_task"] == "first"
    held = EndpointState(endpoint="e", held="arrears 1113", held_task="first")
    for later in ("second", "third"):
        assert apply_effect(held, Effect("hold", reason="arrears 1113", task=later),
                            settings, 2.0) is None
