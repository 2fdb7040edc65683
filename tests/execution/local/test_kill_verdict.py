"""A task the user killed is `killed`, a task that hit its timeout is
`timeout`, whatever claude prints after the signal.

Measured with the real binaries through the engine against the scripted endpoint (a Bash
step that sleeps 300 s, then a turn that answers text): CLI 2.1.197 answers a SIGTERM that
lands 3 s or more into the Bash step with one more API turn, a clean `success` result and
exit 0 (kills 4 s in: 11 of 12; 3 s in: 6 of 6; wall-clock timeouts of 6 s: 13 of 15), so
all of these ended `succeeded/ok` before the fix; a SIGTERM within 2.5 s of the step's start
ends it with exit 143 and no result (0 of 36 kills; 0 of 3 timeouts of 3 s). CLI 2.1.332
exits 143 without a result every time (kills: 6 of 6; timeouts: 4 of 4). The verdict must
be the same for both, and what 2.1.197 printed after the signal stays in the run's events.

2.1.332 refuses `sleep 300 && ...` by itself ("Blocked: sleep 300 followed by: echo
finished ... use run_in_background"), so its long step sleeps in python instead.
"""

from __future__ import annotations

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
from endpoint_helpers import cli_env

from fleet_tui.core import stream
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.execution.worker.attemptlog import EVENTS_FILE, EXIT_FILE, read_json
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store, Task, TaskState
from fleet_tui.system import paths, procs

# the module's tests run on one xdist worker, one at a time
pytestmark = [pytest.mark.real_claude, pytest.mark.xdist_group("kill_verdict")]

ROOT = Path(__file__).resolve().parents[3]
KEY = "sk-kill-verdict-SECRET-7c2e"
TICK = 0.05

# 2.1.197 answers a SIGTERM with an extra turn only once the Bash step has run ~3 s
# (measured: 2.5 s after the step started, 0 of 12; 3 s, 6 of 6): signal later than that.
STEP_RUNNING = 4.0
# A wall-clock timeout that lands well into the step (the step starts ~1-2 s after launch).
TIMEOUT = 6.0
# 2.1.197's extra turn does not come on every try (the issue saw it in 9 of 12 kills):
# rounds tried until it did, so that the test always covers it.
ROUNDS = 3

PYTHON_SLEEP = "import time; time.sleep(300)"
LONG_STEP = {
    "pinned": "sleep 300 && echo finished",
    "newest": f'python3 -c "{PYTHON_SLEEP}" && echo finished',
}


def _script(command: str) -> list[Any]:
    return [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": command, "description": "wait for the build"}}],
        "the command was interrupted, stopping here",
        "stopped",
    ]


SCRIPTS: dict[str, Any] = {f"long-{name}": _script(cmd) for name, cmd in LONG_STEP.items()}


@pytest.fixture(params=["pinned", "newest"])
def cli_version(request: pytest.FixtureRequest, claude_bin: str) -> tuple[str, str]:
    """(which, path): the pinned claude (2.1.197) and the newest one (2.1.332). It asks
    for `claude_bin` by name so that the real_claude mark guard sees a claude test."""
    which: str = request.param
    if which == "pinned":
        return which, claude_bin
    path: str = request.getfixturevalue("claude_newest_bin")
    return which, path


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(SCRIPTS) as ep:
        yield ep


def long_steps(repo: Path) -> list[int]:
    """Pids of the long Bash step's sleeping process (either version's) of this test's
    workers: those running in a worktree of `repo` (another process's `sleep 300` on the
    machine is none of ours, and is never signalled)."""
    out = []
    for st in procs.all_stats():
        if st.state == "Z":
            continue
        argv = procs.cmdline(st.pid)
        if argv == ["sleep", "300"] or argv[-2:] == ["-c", PYTHON_SLEEP]:
            where = procs.cwd(st.pid)
            if where is not None and where.is_relative_to(repo):
                out.append(st.pid)
    return out


@pytest.fixture(autouse=True)
def no_leftovers(git_repo: Path) -> Iterator[None]:
    yield
    for pid in long_steps(git_repo):
        procs.signal_pid(pid, signal.SIGKILL)


def make_fleet(endpoint: ScriptedEndpoint, claude: str) -> Fleet:
    settings = load_settings(env=os.environ, overrides={
        "base_url": endpoint.url, "claude": claude, "sandbox": os.geteuid() == 0,
        "key_sources": "env", "kill_grace": 5.0, "max_workers": 2})
    env = dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0")
    return Fleet(settings, Store(paths.db_path()), env=env)


def drive(fleet: Fleet, until: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            states = {t.id: (t.state, t.message) for t in fleet.list_tasks()}
            pytest.fail(f"timed out waiting; tasks: {states}")
        fleet.tick()
        time.sleep(TICK)


def finished(fleet: Fleet, task_id: str) -> Callable[[], bool]:
    done = {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.KILLED}
    return lambda: fleet.get_task(task_id).state in done


def printed_after_signal(fleet: Fleet, task: Task) -> tuple[stream.Result | None, Any]:
    """The result line claude printed (None if it printed none) and its exit record."""
    attempt = fleet.attempts(task.id)[-1]
    assert attempt.dir is not None
    events = stream.decode_all((Path(attempt.dir) / EVENTS_FILE).read_bytes())
    results = [e for e in events if isinstance(e, stream.Result)]
    return (results[-1] if results else None), read_json(Path(attempt.dir) / EXIT_FILE)


def clean_success(res: stream.Result | None, rec: Any) -> bool:
    """What 2.1.197 prints after a SIGTERM most of the time: its extra turn's success
    result, and exit 0."""
    return (res is not None and not res.is_error and res.subtype == "success"
            and bool(rec) and rec.get("exit_code") == 0)


def check_printed(which: str, seen: list[tuple[stream.Result | None, Any]]) -> None:
    """The test covers what each version really does after a SIGTERM."""
    if which == "pinned":
        # 2.1.197 answers the SIGTERM with one more turn, a clean success result and exit
        # 0 (the finding) most of the time; on a loaded machine the signal can land before
        # its turn starts and it exits 143 with no result, or its extra turn finds the
        # cage's bridge to the endpoint already gone with the signal: an error result
        # ("Unable to connect to API (ConnectionRefused)") and exit 143 (seen once in a
        # whole-suite run). Each round must be one of the three; the verdict above held
        # for each. The success-after-the-signal case is also pinned without timing in
        # tests/core/test_policy.py (the stop request decides).
        for res, rec in seen:
            signalled = rec and rec.get("exit_code") == 143 and (
                res is None or (res.is_error and "Unable to connect" in (res.result or "")))
            assert clean_success(res, rec) or signalled, seen
    else:
        # 2.1.332: exits 143 on the SIGTERM, no result line
        assert all(res is None and rec and rec.get("exit_code") == 143 for res, rec in seen), seen


def test_killed_task_is_killed_whatever_claude_printed(
        cli_version: tuple[str, str], git_repo: Path, endpoint: ScriptedEndpoint) -> None:
    which, claude = cli_version
    fleet = make_fleet(endpoint, claude)
    seen = []
    for _ in range(ROUNDS if which == "pinned" else 1):
        (task,) = fleet.submit(TaskSpec(prompt=f"[script:long-{which}] build it",
                                        repo=git_repo))
        drive(fleet, lambda: bool(long_steps(git_repo)), timeout=60)
        until = time.monotonic() + STEP_RUNNING
        drive(fleet, lambda: time.monotonic() >= until)  # noqa: B023 (used at once)
        fleet.kill(task.id)
        done = fleet.get_task(task.id)
        assert (done.state, done.verdict) == (TaskState.KILLED, "killed"), done.message
        assert "killed" in (done.message or "")
        attempt = fleet.attempts(task.id)[-1]
        assert attempt.verdict == "killed"
        seen.append(printed_after_signal(fleet, task))
        if clean_success(*seen[-1]):  # the finding is covered
            break
    check_printed(which, seen)


def test_timed_out_task_is_timeout_whatever_claude_printed(
        cli_version: tuple[str, str], git_repo: Path, endpoint: ScriptedEndpoint) -> None:
    which, claude = cli_version
    fleet = make_fleet(endpoint, claude)
    seen = []
    for _ in range(ROUNDS if which == "pinned" else 1):
        (task,) = fleet.submit(TaskSpec(prompt=f"[script:long-{which}] build it",
                                        repo=git_repo, timeout=TIMEOUT))
        drive(fleet, finished(fleet, task.id), timeout=TIMEOUT + 60)
        done = fleet.get_task(task.id)
        assert (done.state, done.verdict) == (TaskState.FAILED, "timeout"), done.message
        assert "timed out" in (done.message or "")
        seen.append(printed_after_signal(fleet, task))
        if clean_success(*seen[-1]):  # the finding is covered
            break
    check_printed(which, seen)


def test_run_wait_with_timeout_exits_1(cli_version: tuple[str, str], git_repo: Path,
                                       endpoint: ScriptedEndpoint) -> None:
    """`fleet-tui run --timeout N --wait` on a step longer than N: exit 1 (a task failed)."""
    which, claude = cli_version
    env = cli_env(endpoint.url, claude, KEY)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([sys.executable, "-m", "fleet_tui.cli", *args], cwd=git_repo,
                             env=env, input="", capture_output=True, text=True, timeout=120)
        assert "Traceback" not in out.stderr, out.stderr
        return out

    run = cli("run", f"[script:long-{which}] build it", "--timeout", f"{TIMEOUT:g}", "--wait")
    assert run.returncode == 1, (run.stdout, run.stderr)
    listed = cli("ls", "--json")
    (task,) = json.loads(listed.stdout)
    assert (task["state"], task["verdict"]) == ("failed", "timeout"), task["message"]
