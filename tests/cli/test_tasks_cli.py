"""`fleet-tui run/ls/show/logs/diff/merge/discard/retry/follow-up/kill` as real subprocesses,
with the real claude binary against the scripted endpoint."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from endpoint_helpers import cli_env, poll_pauses
from proc_helpers import commands_in

from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.system import procs

pytestmark = pytest.mark.real_claude

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-cli-test-SECRET-93be"

SCRIPTS: dict[str, Any] = {
    "default": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "echo worker > a.txt", "description": "write a.txt"}}],
        "wrote a.txt",
    ],
    "chat": ["first answer", "second answer"],
    "sleepy": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "setsid sleep 337 </dev/null >/dev/null 2>&1 & sleep 336",
                    "description": "wait"}}],
        "never reached",
    ],
    "denied": {"turns": ["never"], "faults": [{"status": 401, "times": 9}]},
}


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(SCRIPTS) as ep:
        yield ep


@pytest.fixture
def env(endpoint: ScriptedEndpoint, claude_bin: str) -> dict[str, str]:
    return cli_env(endpoint.url, claude_bin, KEY)


def cli(env: dict[str, str], cwd: Path, *args: str, stdin: str | None = None,
        timeout: float = 90) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-m", "fleet_tui.cli", *args], cwd=cwd, env=env,
                         input=stdin if stdin is not None else "", capture_output=True,
                         text=True, timeout=timeout)
    assert "Traceback" not in out.stderr, out.stderr
    return out


def ls(env: dict[str, str], cwd: Path) -> list[dict[str, Any]]:
    out = cli(env, cwd, "ls", "--json")
    assert out.returncode == 0, out.stderr
    data: list[dict[str, Any]] = json.loads(out.stdout)
    return data


def wait_state(env: dict[str, str], cwd: Path, task_id: str, states: set[str],
               timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    pauses = poll_pauses()
    while True:
        task = next(t for t in ls(env, cwd) if t["id"] == task_id)
        if task["state"] in states:
            return task
        assert time.monotonic() < deadline, task
        time.sleep(next(pauses))


def test_run_wait_ls_show_logs_diff_merge(env: dict[str, str], git_repo: Path) -> None:
    out = cli(env, git_repo, "run", "write a.txt please", "--title", "Add a.txt", "--wait",
              "--json", "--timeout", "1h30m")  # a duration as the launch form takes it
    assert out.returncode == 0, out.stderr
    (task,) = json.loads(out.stdout)
    tid = task["id"]
    assert task["state"] == "succeeded" and task["branch"] == f"fleet/{tid}"
    assert task["timeout"] == 5400

    listed = ls(env, git_repo)
    assert [t["id"] for t in listed] == [tid]
    for key in ("id", "title", "state", "branch", "verdict"):
        assert key in listed[0]
    assert listed[0]["title"] == "Add a.txt" and listed[0]["verdict"] == "ok"
    assert listed[0]["added_lines"] == 1

    table = cli(env, git_repo, "ls")
    assert tid in table.stdout and "succeeded" in table.stdout

    show = cli(env, git_repo, "show", tid[:4])  # a prefix is enough
    assert show.returncode == 0 and f"fleet/{tid}" in show.stdout
    assert "#1 fresh" in show.stdout

    logs = cli(env, git_repo, "logs", tid)
    assert logs.returncode == 0
    lines = logs.stdout.splitlines()
    assert lines[0].startswith("init")
    assert "tool     Bash echo worker > a.txt" in lines
    assert lines[-1] == "result   ok (success, 2 turns): wrote a.txt"
    raw = cli(env, git_repo, "logs", tid, "--raw")
    objs = [json.loads(line) for line in raw.stdout.splitlines()]
    assert objs[0]["type"] == "system" and objs[-1]["type"] == "result"

    diff = cli(env, git_repo, "diff", tid)
    assert diff.returncode == 0 and "+worker" in diff.stdout and "a.txt" in diff.stdout

    refused = cli(env, git_repo, "merge", tid)  # stdin is not a TTY
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert not (git_repo / "a.txt").exists()

    merged = cli(env, git_repo, "merge", tid, "--yes")
    assert merged.returncode == 0, merged.stderr
    assert (git_repo / "a.txt").read_text() == "worker\n"
    assert ls(env, git_repo)[0]["state"] == "merged"
    again = cli(env, git_repo, "merge", tid, "--yes")
    assert again.returncode == 4 and "merged already" in again.stderr
    # the key never reaches what fleet-tui prints or stores
    for text in (out.stdout, table.stdout, show.stdout, logs.stdout, raw.stdout):
        assert KEY not in text


def test_run_returns_once_started_and_ls_catches_up(env: dict[str, str],
                                                    git_repo: Path) -> None:
    # a prompt piped on stdin reaches the worker (defect 1 of the originals)
    out = cli(env, git_repo, "run", "-", "--copies", "2", stdin="[script:chat] hello\n")
    assert out.returncode == 0, out.stderr
    ids = [line.split()[0] for line in out.stdout.splitlines()]
    assert len(ids) == 2
    followed = cli(env, git_repo, "logs", ids[0], "--follow")
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout.splitlines()[-1] == "result   ok (success, 1 turns): first answer"
    assert f"{ids[0]} succeeded" in followed.stderr
    # nobody runs the scheduler now; `ls` itself records what finished meanwhile
    for tid in ids:
        done = wait_state(env, git_repo, tid, {"succeeded", "failed"})
        assert done["state"] == "succeeded", done["message"]
    discard = cli(env, git_repo, "discard", ids[0], "--yes")
    assert discard.returncode == 0, discard.stderr
    branches = subprocess.run(["git", "branch", "--list", "fleet/*"], cwd=git_repo, text=True,
                              capture_output=True).stdout
    assert f"fleet/{ids[0]}" not in branches and f"fleet/{ids[1]}" in branches
    assert {t["id"]: t["state"] for t in ls(env, git_repo)}[ids[0]] == "discarded"

    follow = cli(env, git_repo, "follow-up", ids[1], "and then?")
    assert follow.returncode == 0, follow.stderr
    wait_state(env, git_repo, ids[1], {"succeeded", "failed"})
    second = cli(env, git_repo, "logs", ids[1], "--attempt", "2")
    assert "result   ok" in second.stdout and "second answer" in second.stdout
    first = cli(env, git_repo, "logs", ids[1], "--attempt", "1")
    assert "first answer" in first.stdout


def test_prompt_sources_and_usage_errors(env: dict[str, str], git_repo: Path,
                                         tmp_path: Path) -> None:
    prompt_file = tmp_path / "prompt.md"
    prompt_file.write_text("[script:chat] from a file\n")
    out = cli(env, git_repo, "run", "--file", str(prompt_file), "--json")
    assert out.returncode == 0, out.stderr
    (task,) = json.loads(out.stdout)
    assert task["prompt"] == "[script:chat] from a file\n"

    empty = cli(env, git_repo, "run", "   ")
    assert empty.returncode == 2 and "empty" in empty.stderr
    missing = cli(env, git_repo, "run", "--file", str(tmp_path / "nope.md"))
    assert missing.returncode == 2 and "nope.md" in missing.stderr
    bad = cli(env, git_repo, "run", "x", "--copies", "many")
    assert bad.returncode == 2 and "--copies" in bad.stderr
    outside = cli(env, tmp_path, "run", "hello")
    assert outside.returncode == 2 and "git repository" in outside.stderr
    unknown = cli(env, git_repo, "show", "zzzzzz")
    assert unknown.returncode == 3 and "no task" in unknown.stderr
    for cmd in ("logs", "merge", "kill"):
        assert cli(env, git_repo, cmd, "zzzzzz", "--yes" if cmd in ("merge", "discard")
                   else "--repo=.").returncode == 3
    helped = cli(env, git_repo, "merge", "--help")
    assert helped.returncode == 0 and "exit codes" in helped.stdout and "4  refused" in \
        helped.stdout
    wait_state(env, git_repo, task["id"], {"succeeded"})


def test_missing_key_or_claude_exit_5(env: dict[str, str], git_repo: Path,
                                      tmp_path: Path) -> None:
    no_key = {k: v for k, v in env.items() if k != "ANTHROPIC_AUTH_TOKEN"}
    out = cli(no_key, git_repo, "run", "hello")
    assert out.returncode == 5 and "key" in out.stderr.lower()
    no_claude = dict(env, FLEET_WORKER_CLAUDE=str(tmp_path / "no-claude"))
    out = cli(no_claude, git_repo, "run", "hello")
    assert out.returncode == 5 and "claude" in out.stderr
    assert ls(env, git_repo) == []  # nothing was queued


def test_failed_task_exit_1_and_merge_gates(env: dict[str, str], git_repo: Path) -> None:
    failed = cli(env, git_repo, "run", "[script:denied] hi", "--wait")
    assert failed.returncode == 1
    assert "auth" in cli(env, git_repo, "show", ls(env, git_repo)[0]["id"]).stdout

    # the endpoint refused the key: it is held, so the next task waits for the user
    # instead of meeting the same refusal (--wait does not wait for what only they can do)
    held = cli(env, git_repo, "run", "write a.txt", "--wait", "--json")
    assert held.returncode == 1
    assert "not started: held: the endpoint rejected the key (401)" in held.stderr
    (queued,) = json.loads(held.stdout)
    assert queued["state"] == "queued"
    assert queued["message"].startswith("held: the endpoint rejected the key")
    # new settings (here another small model) lift the hold: the queued task runs
    changed = dict(env, FLEET_WORKER_SMALL_MODEL="another-small-model")
    tid = queued["id"]
    assert wait_state(changed, git_repo, tid, {"succeeded", "failed"})["state"] \
        == "succeeded"
    env = changed
    tests_fail = cli(env, git_repo, "merge", tid, "--yes", "--test", "echo nope; exit 1")
    assert tests_fail.returncode == 4 and "test command failed" in tests_fail.stderr
    assert "nope" in tests_fail.stdout
    (git_repo / "README.md").write_text("dirty\n")
    dirty = cli(env, git_repo, "merge", tid, "--yes")
    assert dirty.returncode == 4 and "uncommitted" in dirty.stderr
    subprocess.run(["git", "checkout", "README.md"], cwd=git_repo, check=True)
    (git_repo / "a.txt").write_text("conflicting\n")
    subprocess.run(["git", "add", "a.txt"], cwd=git_repo, check=True)
    subprocess.run(["git", "commit", "-qm", "a.txt on main"], cwd=git_repo, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=git_repo, text=True,
                          capture_output=True).stdout
    conflict = cli(env, git_repo, "merge", tid, "--yes")
    assert conflict.returncode == 4 and "a.txt" in conflict.stderr
    assert (git_repo / "a.txt").read_text() == "conflicting\n"
    assert subprocess.run(["git", "rev-parse", "HEAD"], cwd=git_repo, text=True,
                          capture_output=True).stdout == head
    retried = cli(env, git_repo, "retry", tid, "--yes")
    assert retried.returncode == 0, retried.stderr
    assert wait_state(env, git_repo, tid, {"succeeded", "failed"})["state"] == "succeeded"


def test_a_parked_endpoint_is_said_by_run_ls_and_show(env: dict[str, str],
                                                     git_repo: Path) -> None:
    with ScriptedEndpoint(SCRIPTS, faults=[{"kind": "window", "seconds": 60}]) as ep:
        env = dict(env, FLEET_WORKER_BASE_URL=ep.url, FLEET_WORKER_PARK_JITTER="0.5")
        first = cli(env, git_repo, "run", "write a.txt", "--json")
        assert first.returncode == 0, first.stderr
        tid = json.loads(first.stdout)[0]["id"]
        parked = wait_state(env, git_repo, tid, {"waiting", "failed"})
        said = r"parked until \d\d:\d\d \(5-hour window, code 1308\), resumes then"
        assert parked["verdict"] == "window" and re.match(said, parked["message"])
        table = cli(env, git_repo, "ls").stdout
        # the endpoint by its name (the top-level settings: "default")
        assert re.search(f"^endpoint default: {said}$", table, re.M), table
        show = cli(env, git_repo, "show", tid).stdout
        assert re.search(f"^message: +{said}", show, re.M), show
        assert re.search(f"^endpoint: +default: {said}", show, re.M), show
        # a new task is not sent into the closed window: run says so and returns
        second = cli(env, git_repo, "run", "write a.txt", "--json")
        assert second.returncode == 0, second.stderr
        assert re.search(f"not started: the endpoint is {said}", second.stderr)
        (queued,) = json.loads(second.stdout)
        assert queued["state"] == "queued"
        assert re.match(f"waits: the endpoint is {said}", queued["message"])
        assert len(ep.message_requests()) == 1  # the one that met the window
        for task_id in (tid, queued["id"]):
            assert cli(env, git_repo, "kill", task_id).returncode == 0


def _sleepers(where: Path) -> list[int]:
    """The sleepy script's sleeps that work under `where` (the test's repository): another
    test run's sleeps on the machine are neither counted nor killed."""
    return commands_in(where, "sleep 336", "sleep 337")


def test_kill_from_the_cli(env: dict[str, str], git_repo: Path) -> None:
    out = cli(env, git_repo, "run", "[script:sleepy] wait", "--json")
    tid = json.loads(out.stdout)[0]["id"]
    try:
        deadline = time.monotonic() + 30
        while len(_sleepers(git_repo)) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        killed = cli(env, git_repo, "kill", tid)
        assert killed.returncode == 0, killed.stderr
        assert ls(env, git_repo)[0]["state"] == "killed"
        assert _sleepers(git_repo) == []
        assert cli(env, git_repo, "kill", tid).returncode == 4
    finally:
        for pid in _sleepers(git_repo):
            procs.signal_pid(pid, signal.SIGKILL)


def _worktrees(repo: Path) -> str:
    return subprocess.run(["git", "worktree", "list"], cwd=repo, text=True,
                          capture_output=True, check=True).stdout


def _retry_on_a_terminal(env: dict[str, str], cwd: Path, task_id: str,
                         answer: bytes) -> tuple[int, bytes]:
    """`fleet-tui retry ID` with a pty as its terminal; answers the question with `answer`."""
    import pty
    import select

    pid, fd = pty.fork()
    if pid == 0:  # child: the pty is its controlling terminal
        try:
            os.chdir(cwd)
            os.execve(sys.executable, [sys.executable, "-m", "fleet_tui.cli", "retry",
                                       task_id], env)
        finally:
            os._exit(127)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while b"[y/N]" not in seen and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                seen += chunk
        if b"[y/N]" in seen:
            os.write(fd, answer + b"\n")
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                seen += chunk
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    return os.waitstatus_to_exitcode(status), seen


def test_fresh_retry_asks_before_it_throws_work_away(env: dict[str, str],
                                                     git_repo: Path) -> None:
    """Finding 5: a fresh retry of a task with changes asks like discard; --yes skips the
    question; without a terminal and --yes it refuses (exit 4) and nothing is touched."""
    out = cli(env, git_repo, "run", "write a.txt", "--wait", "--json")
    assert out.returncode == 0, out.stderr
    tid = json.loads(out.stdout)[0]["id"]
    worktree = Path(json.loads(out.stdout)[0]["worktree"])
    assert (worktree / "a.txt").read_text() == "worker\n"
    (worktree / "notes.txt").write_text("mine, untracked\n")

    refused = cli(env, git_repo, "retry", tid)  # stdin is not a terminal
    assert refused.returncode == 4, refused.stderr
    assert "--yes" in refused.stderr and "--resume" in refused.stderr
    assert "a.txt" in refused.stderr or "2 files" in refused.stderr
    assert (worktree / "a.txt").read_text() == "worker\n"
    assert (worktree / "notes.txt").exists()
    assert ls(env, git_repo)[0]["state"] == "succeeded"
    assert len(json.loads(cli(env, git_repo, "show", tid, "--json").stdout)["attempts"]) == 1

    code, screen = _retry_on_a_terminal(env, git_repo, tid, b"n")
    assert code == 2 and b"[y/N]" in screen and b"nothing was changed" in screen
    assert (worktree / "notes.txt").exists() and (worktree / "a.txt").exists()
    assert ls(env, git_repo)[0]["state"] == "succeeded"

    # commits on the branch count as work too, even with a clean worktree
    subprocess.run(["git", "add", "-A"], cwd=worktree, check=True)
    subprocess.run(["git", "commit", "-qm", "worker's work"], cwd=worktree, check=True)
    again = cli(env, git_repo, "retry", tid)
    assert again.returncode == 4 and "commit" in again.stderr, again.stderr

    yes = cli(env, git_repo, "retry", tid, "--yes")
    assert yes.returncode == 0, yes.stderr
    assert not (worktree / "notes.txt").exists()
    assert wait_state(env, git_repo, tid, {"succeeded", "failed"})["state"] == "succeeded"


def test_resume_and_a_retry_without_changes_do_not_ask(env: dict[str, str],
                                                       git_repo: Path) -> None:
    out = cli(env, git_repo, "run", "write a.txt", "--wait", "--json")
    tid = json.loads(out.stdout)[0]["id"]
    worktree = Path(json.loads(out.stdout)[0]["worktree"])
    resumed = cli(env, git_repo, "retry", tid, "--resume")  # keeps the worktree: no question
    assert resumed.returncode == 0, resumed.stderr
    assert (worktree / "a.txt").read_text() == "worker\n"
    wait_state(env, git_repo, tid, {"succeeded", "failed"})
    assert (worktree / "a.txt").read_text() == "worker\n"

    chat = cli(env, git_repo, "run", "[script:chat] hi", "--wait", "--json")
    chat_id = json.loads(chat.stdout)[0]["id"]
    fresh = cli(env, git_repo, "retry", chat_id)  # nothing to lose: no question
    assert fresh.returncode == 0, fresh.stderr
    assert wait_state(env, git_repo, chat_id, {"succeeded", "failed"})["state"] == "succeeded"
    assert f"fleet/{chat_id}" in _worktrees(git_repo)


def test_a_long_prompt_is_queued_whole(env: dict[str, str], git_repo: Path,
                                       tmp_path: Path) -> None:
    """Finding 8: a prompt of 128 KiB or more is not refused and nothing in the CLI chokes
    on it (how the runner hands it to claude is the engine's part)."""
    prompt = "[script:chat] " + "a long prompt line\n" * (200 * 1024 // 19)
    big = tmp_path / "big.md"
    big.write_text(prompt)
    assert big.stat().st_size > 128 * 1024
    out = cli(env, git_repo, "run", "--file", str(big), "--json")
    assert out.returncode == 0, out.stderr
    (task,) = json.loads(out.stdout)
    shown = json.loads(cli(env, git_repo, "show", task["id"], "--json").stdout)
    assert shown["prompt"] == prompt and shown["title"] == "[script:chat] a long prompt line"
    piped = cli(env, git_repo, "run", "-", "--json", stdin=prompt)
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)[0]["prompt"] == prompt
