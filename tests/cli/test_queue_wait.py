"""`fleet-tui queue --wait` after the fact: with no task given it waits for everything in
the repository's merge queue, and given tasks that are queued already it waits for them
(it used to print the queue and return, or refuse them as "in the merge queue")."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from endpoint_helpers import cli_env, run_cli

from fleet_tui.demo.endpoint import ScriptedEndpoint

pytestmark = pytest.mark.real_claude

SCRIPTS: dict[str, Any] = {
    "ownfile": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "basename $PWD > \"copy-$(basename $PWD).txt\"",
                    "description": "add a file"}}],
        "Added my file.",
    ],
}


def _show(env: dict[str, str], repo: Path, task_id: str) -> dict[str, Any]:
    out = run_cli(env, repo, "show", task_id, "--json")
    assert out.returncode == 0, out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def _wait_for(predicate: Any, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_queue_wait_waits_for_what_is_queued(claude_bin: str, git_repo: Path,
                                            tmp_path: Path) -> None:
    go = tmp_path / "go"
    # the queue's test gate holds every landing until the test lets it go
    gate = f"while [ ! -e {go} ]; do sleep 0.05; done"
    with ScriptedEndpoint(SCRIPTS) as endpoint:
        env = cli_env(endpoint.url, claude_bin, "sk-queue-wait-SECRET-5c1d",
                      FLEET_WORKER_TEST_COMMAND=gate)
        out = run_cli(env, git_repo, "run", "[script:ownfile] do it", "--copies", "2",
                      "--wait")
        assert out.returncode == 0, out.stderr
        first, second = (line.split()[0] for line in out.stdout.splitlines() if line.strip())
        out = run_cli(env, git_repo, "queue", first, second)
        assert out.returncode == 0, out.stderr
        _wait_for(lambda: _show(env, git_repo, first)["land_state"] == "testing",
                  "the first task at the test gate")
        # the user comes back (another shell, after a crash): waits for all, and for one
        waiters = [subprocess.Popen([sys.executable, "-m", "fleet_tui.cli", "queue", *ids,
                                     "--wait"], cwd=git_repo, env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
                   for ids in ((), (second,))]
        try:
            # both stay while the queue is held (each has printed what it waits for)
            _wait_for(lambda: all(_show(env, git_repo, t)["land_state"] in ("testing",
                                                                           "waiting")
                                  for t in (first, second)), "the queue held")
            assert [w.poll() for w in waiters] == [None, None]
            go.touch()
            results = [w.communicate(timeout=180) for w in waiters]
        finally:
            for w in waiters:
                if w.poll() is None:
                    w.kill()
                    w.wait()
        (all_out, all_err), (one_out, one_err) = results
        assert f"{first}" in all_out  # the queue it waits for, listed first
        assert [w.returncode for w in waiters] == [0, 0], (all_err, one_err)
        assert "Traceback" not in all_err + one_err
        assert f"{second} is in the merge queue already" in one_out
        assert "cannot queue" not in one_err
        for task_id in (first, second):
            assert _show(env, git_repo, task_id)["land_state"] == "merged"
            assert f"{task_id}  merged" in all_err  # the landing's news, as queue ID --wait
        assert f"{second}  merged" in one_err
        # nothing queued: --wait says so and returns
        out = run_cli(env, git_repo, "queue", "--wait")
        assert out.returncode == 0 and "empty" in out.stdout
