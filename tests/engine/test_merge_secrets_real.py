"""End to end: the real claude runs a Bash step that copies
the API key into the worktree; the diff marks the file and never shows the key, and the
merge (engine and CLI) refuses it, naming the file, with the main checkout untouched."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store, TaskState
from fleet_tui.system import paths

pytestmark = pytest.mark.real_claude

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-leak-test-SECRET-7f3a0c"
# The step of the finding, then (should the key no longer be in the tool's own environment)
# the same key read from the environment of an ancestor process, as a determined worker
# would: the scan must catch the copy either way.
LEAK = ('echo $ANTHROPIC_AUTH_TOKEN > token-copy.txt; '
        'v=$(cat token-copy.txt); p=$$; '
        'while [ -z "$v" ] && [ "$p" -gt 1 ]; do '
        'v=$(tr "\\0" "\\n" < /proc/$p/environ 2>/dev/null '
        '| sed -n "s/^ANTHROPIC_AUTH_TOKEN=//p"); '
        'p=$(cut -d" " -f4 /proc/$p/stat); done; '
        'echo "$v" > token-copy.txt; echo fine > feature.txt')
SCRIPTS: dict[str, Any] = {
    "leak": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": LEAK, "description": "copy the token"}}],
        "done",
    ],
}


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(SCRIPTS) as ep:
        yield ep


def snapshot(repo: Path) -> dict[str, str | None]:
    """Every file of the main checkout (outside .git and .fleet-work) with its hash, plus
    `git status`, HEAD, the index and the merge-state files of the git dir."""
    out: dict[str, str | None] = {}
    for path in sorted(repo.rglob("*")):
        rel = path.relative_to(repo)
        if rel.parts[0] in (".git", ".fleet-work") or not path.is_file():
            continue
        out[rel.as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    for args in (["status", "--porcelain", "--untracked-files=all"], ["rev-parse", "HEAD"],
                 ["ls-files", "--stage"]):
        out[" ".join(args)] = subprocess.run(["git", *args], cwd=repo, text=True,
                                             capture_output=True, check=True).stdout
    for name in ("MERGE_HEAD", "ORIG_HEAD", "MERGE_MSG", "SQUASH_MSG"):
        state = repo / ".git" / name
        out[name] = state.read_text() if state.exists() else None
    return out


def test_the_key_copied_by_a_worker_is_marked_and_never_merged(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    settings = load_settings(env=os.environ, overrides={
        "base_url": endpoint.url, "claude": claude_bin, "sandbox": os.geteuid() == 0,
        "key_sources": "env",
        # a worker that has the key: with key_helper on, neither claude's environment nor
        # its runner's holds it any more (the runner gets it through --env-fd), and the
        # engine here has none in its own; key_helper off puts it in claude's environment,
        # as in the finding; uncaged, since a caged worker always gets it through the pipe
        "key_helper": False, "cage": "off"})
    env = dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0")
    fleet = Fleet(settings, Store(paths.db_path()), env=env)
    (task,) = fleet.submit(TaskSpec(prompt="[script:leak] copy it", repo=git_repo))
    deadline = time.monotonic() + 90
    while fleet.get_task(task.id).state not in (TaskState.SUCCEEDED, TaskState.FAILED):
        assert time.monotonic() < deadline, fleet.get_task(task.id)
        fleet.tick()
        time.sleep(0.05)
    task = fleet.get_task(task.id)
    assert task.state == TaskState.SUCCEEDED, task.message
    assert task.worktree is not None
    copy = (task.worktree / "token-copy.txt").read_text()
    assert copy == KEY + "\n", "the worker could not read the key: nothing to test"

    diff = fleet.diff(task.id)
    assert diff.secret_paths == ["token-copy.txt"]
    assert KEY not in diff.patch and all(KEY not in f.patch for f in diff.files)
    preview = fleet.conflict_preview(task.id)
    assert not preview.clean and preview.reason == "secret"
    assert preview.secret_paths == ["token-copy.txt"] and KEY not in preview.message

    before = snapshot(git_repo)
    result = fleet.merge(task.id, test_command="echo the tests ran")
    assert not result.merged and result.test_output is None
    assert result.message == (f"the changes of fleet/{task.id} contain the API key in: "
                              "token-copy.txt; remove it before merging")
    assert snapshot(git_repo) == before
    assert fleet.get_task(task.id).state == TaskState.SUCCEEDED

    # the CLI, as a user runs it
    cli_env = dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY, FLEET_WORKER_KEY_SOURCES="env",
                   FLEET_WORKER_CLAUDE=claude_bin, FLEET_WORKER_BASE_URL=endpoint.url,
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fleet_tui.cli", *args], cwd=git_repo,
                              env=cli_env, capture_output=True, text=True, timeout=90,
                              stdin=subprocess.DEVNULL)

    shown = cli("diff", task.id)
    assert shown.returncode == 0 and "token-copy.txt" in shown.stdout
    assert "contain the API key" in shown.stderr and "token-copy.txt" in shown.stderr
    stat = cli("diff", task.id, "--stat")
    assert "token-copy.txt  (contains the API key)" in stat.stdout
    merged = cli("merge", task.id, "--yes")
    assert merged.returncode == 4
    assert "contain the API key in: token-copy.txt; remove it before merging" in merged.stderr
    listed = cli("ls", "--json")
    assert json.loads(listed.stdout)[0]["state"] == "succeeded"
    for out in (shown, stat, merged, listed):
        assert KEY not in out.stdout + out.stderr
    assert snapshot(git_repo) == before
