"""The API key never reaches what fleet-tui writes or prints (review finding): a worker
(the real claude against the scripted endpoint) runs a Bash step whose command and output
hold the key, writes a file NAMED after the key and ends with a result text holding it.
Then the store's file, `fleet-tui logs` (plain and --full), `show`, `diff`, the merge's
refusal and the panel's stream lines carry `[API key hidden]` where the key was, never the
key. events.jsonl is claude's stdout byte for byte (ARCHITECTURE.md): it is the worker's
own record and is left as claude wrote it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_fleet import drive, make_fleet, settled

from fleet_tui.core import stream
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import TaskSpec
from fleet_tui.execution.worker.runner import RUNNER_MODULE
from fleet_tui.store.db import TaskState
from fleet_tui.system import paths
from fleet_tui.vcs import git as fgit

KEY = "sk-fleet-test-SECRET-41d8"  # what test_fleet.make_fleet gives workers
ROOT = Path(__file__).resolve().parents[2]
SCRIPTS: dict[str, Any] = {
    "leak": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": f"echo {KEY}", "description": f"print {KEY}"}}],
        [{"type": "tool_use", "name": "Write",
          "input": {"file_path": f"{{cwd}}/{KEY}.txt", "content": "harmless\n"}}],
        f"The key is {KEY}, and I wrote {KEY}.txt",
    ],
    # every ancestor's environment, as a determined worker would read it. The walk starts
    # from /proc/self's parent, not $$: in the cage, srt's seccomp helper puts the tools in a
    # PID namespace of their own under a /proc of the cage's, so $$ names another process
    # there (a thread of claude's or nothing, by chance)
    "ancestors": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": 'p=$(cut -d" " -f4 /proc/self/stat); while [ "$p" -gt 1 ]; do '
                               'echo "$p $(tr "\\0" " " < /proc/$p/cmdline 2>/dev/null | '
                               'cut -c1-80)" >> ancestors.txt; '
                               'tr "\\0" "\\n" < /proc/$p/environ 2>/dev/null '
                               '| grep -a "^ANTHROPIC_AUTH_TOKEN=" >> found.txt; '
                               'p=$(cut -d" " -f4 /proc/$p/stat); done; true',
                    "description": "read the ancestors' environments"}}],
        "done",
    ],
}


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(SCRIPTS) as ep:
        yield ep


@pytest.mark.real_claude
def test_the_key_a_worker_prints_writes_and_names_goes_nowhere(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    fleet = make_fleet(endpoint, claude_bin)
    (task,) = fleet.submit(TaskSpec(prompt="[script:leak] go", repo=git_repo))
    drive(fleet, settled(fleet, task.id))
    done = fleet.get_task(task.id)
    assert done.state == TaskState.SUCCEEDED, done.message
    assert done.worktree is not None and (done.worktree / f"{KEY}.txt").is_file()
    attempt = fleet.attempts(task.id)[-1]
    assert attempt.dir is not None
    # the worker did see and say the key: its own record holds it, as claude wrote it
    events_bytes = (attempt.dir / "events.jsonl").read_bytes()
    assert KEY.encode() in events_bytes

    # the store: every byte of the database file (and its WAL)
    for db in paths.db_path().parent.glob(paths.db_path().name + "*"):
        assert KEY.encode() not in db.read_bytes(), db
    assert fgit.REDACTED in (done.message or "") and fgit.REDACTED in (done.last_tool or "")
    assert fgit.REDACTED in (attempt.message or "") + (attempt.last_tool or "")

    # the panel's stream lines, built from the events as the stream pane reads them
    from fleet_tui.execution.worker.attemptlog import AttemptLog
    from fleet_tui.ui import formatting
    events, _ = AttemptLog(attempt.dir).read_events(0, finished=True)
    rows = formatting.StreamFormatter().rows(events)
    assert rows and KEY not in repr(rows) and fgit.REDACTED in repr(rows)
    for ev in events:
        if isinstance(ev, stream.ToolUse):
            use, result = AttemptLog(attempt.dir).tool_call(ev.id)
            assert use is not None and result is not None
            detail = formatting.tool_call_detail(use, result)
            assert KEY not in repr(detail) and fgit.REDACTED in repr(detail)

    # diff: the file NAMED after the key is named with the key hidden, and marked
    diff = fleet.diff(task.id)
    assert [f.path for f in diff.files] == [f"{fgit.REDACTED}.txt"]
    assert diff.secret_paths == [f"{fgit.REDACTED}.txt"]
    assert KEY not in diff.patch
    result = fleet.merge(task.id)
    assert not result.merged and result.reason == "secret"
    assert result.message == (f"the changes of fleet/{task.id} contain the API key in: "
                              f"{fgit.REDACTED}.txt; remove it before merging")

    env = dict(fleet.env, FLEET_WORKER_KEY_SOURCES="env", FLEET_WORKER_CLAUDE=claude_bin,
               FLEET_WORKER_BASE_URL=endpoint.url,
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))

    origin = git_repo.parent / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True)
    subprocess.run(["git", "remote", "add", "origin", str(origin)], cwd=git_repo, check=True)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fleet_tui.cli", *args], cwd=git_repo,
                              env=env, capture_output=True, text=True, timeout=90,
                              stdin=subprocess.DEVNULL)

    outputs = {name: cli(*args) for name, args in {
        "logs": ("logs", task.id), "logs --full": ("logs", task.id, "--full"),
        "logs --raw": ("logs", task.id, "--raw"),
        "show": ("show", task.id), "diff": ("diff", task.id),
        "diff --stat": ("diff", task.id, "--stat"), "merge": ("merge", task.id, "--yes"),
        "update": ("update", task.id), "push": ("push", task.id),
        "show --json": ("show", task.id, "--json"), "ls --json": ("ls", "--json"),
    }.items()}
    for name, out in outputs.items():
        assert "Traceback" not in out.stderr, (name, out.stderr)
        assert KEY not in out.stdout + out.stderr, (name, out.stdout, out.stderr)
    assert outputs["merge"].returncode == 4
    assert outputs["update"].returncode == 0  # it committed the worker's work: named hidden
    assert outputs["push"].returncode == 4
    assert f"contain the API key ({fgit.REDACTED}.txt); not pushed" in outputs["push"].stderr
    assert fgit.REDACTED in outputs["logs --full"].stdout
    assert fgit.REDACTED in outputs["logs --raw"].stdout
    assert (attempt.dir / "events.jsonl").read_bytes() == events_bytes  # left as it was


@pytest.mark.caged  # the default cage: the key's boundaries as a user's workers have them
@pytest.mark.real_claude
def test_the_runner_does_not_carry_the_key_in_its_environment(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    """With key_helper (the default) claude gets the key through a one-shot pipe; the
    runner, its parent, gets it from the engine through an inherited pipe too, not its
    environment, so no ancestor below the engine shows it in /proc/PID/environ. (The engine
    here has no key in its own environment; a user who exports the key gives it to the
    engine's process and their shell, which fleet-tui cannot take back.)"""
    fleet = make_fleet(endpoint, claude_bin)
    assert fleet.settings.key_helper
    assert "ANTHROPIC_AUTH_TOKEN" not in os.environ and fleet.env["ANTHROPIC_AUTH_TOKEN"] == KEY
    (task,) = fleet.submit(TaskSpec(prompt="[script:ancestors] go", repo=git_repo))
    drive(fleet, settled(fleet, task.id))
    done = fleet.get_task(task.id)
    assert done.state == TaskState.SUCCEEDED, done.message
    assert done.worktree is not None
    chain = (done.worktree / "ancestors.txt").read_text()
    assert "claude" in chain  # the walk went past claude
    attempt = fleet.attempts(task.id)[-1]
    assert attempt.dir is not None
    # uncaged the walk goes on to the runner; caged the runner is outside the cage's pid
    # namespace (not there to read at all), and the walk ends at the cage's own init
    caged = (attempt.dir / "cage.json").is_file()
    assert (RUNNER_MODULE not in chain) if caged else (RUNNER_MODULE in chain), chain
    found = done.worktree / "found.txt"
    assert not found.exists() or found.read_text() == "", found.read_text()
    assert endpoint.requests and all(r.has_auth for r in endpoint.requests)
