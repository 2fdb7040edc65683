"""The tools a worker runs do not get the key.

By default (setting key_helper) claude reads the key once from a pipe through its
apiKeyHelper, so it is in no process's environment: not claude's, not the Bash tool's.
With scrub_tool_env (opt-in: bubblewrap and socat) claude also runs each tool without the
key and in a pid namespace of its own. Real `fleet-tui run` and `fleet-worker`, the real
claude (the pinned CLI and, when installed, the newest) against the scripted endpoint.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from endpoint_helpers import cli_env

from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.execution.worker import launch as launcher

pytestmark = pytest.mark.real_claude

ROOT = Path(__file__).resolve().parents[3]
NEWEST = ROOT / ".claude-cli-newest" / "node_modules" / ".bin" / "claude"

# The worker's Bash step: the key variable as the tool sees it, the tool's whole
# environment, and every environment of every process it can see (/proc/*/environ).
LOOK = ('echo "${ANTHROPIC_AUTH_TOKEN:-empty}" > t.txt; env > tool-env.txt; '
        'for p in /proc/[0-9]*; do tr "\\0" "\\n" < "$p/environ"; done '
        '> proc-env.txt 2>/dev/null; ls /proc | grep -c "^[0-9]" > proc-count.txt; '
        'true')
SCRIPTS: dict[str, Any] = {
    "default": [[{"type": "tool_use", "name": "Bash",
                  "input": {"command": LOOK, "description": "look for the key"}}],
                "looked"],
}


@pytest.fixture(params=["pinned", "newest"])
def claude(request: pytest.FixtureRequest, claude_bin: str) -> str:
    if request.param == "pinned":
        return claude_bin
    if not (NEWEST.is_file() and os.access(NEWEST, os.X_OK)):
        pytest.skip(f"the newest claude is not installed at {NEWEST}")
    return str(NEWEST)


@pytest.fixture
def key() -> str:
    return "sk-isolation-" + secrets.token_hex(16)


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(SCRIPTS) as ep:
        yield ep


def base_env(endpoint: ScriptedEndpoint, claude: str, key: str) -> dict[str, str]:
    """The key only in the (stand-in file) keyring: no process gets it from its parent."""
    stored = subprocess.run([sys.executable, "-m", "fleet_tui.cli", "key", "set"], input=key,
                            capture_output=True, text=True, timeout=60)
    assert stored.returncode == 0, stored.stderr
    return cli_env(endpoint.url, claude, None, FLEET_WORKER_KEY_SOURCES="keyring")


def fleet_tui(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-m", "fleet_tui.cli", *args], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert "Traceback" not in out.stderr, out.stderr
    return out


def run_task(env: dict[str, str], repo: Path) -> tuple[dict[str, Any], Path]:
    out = fleet_tui(env, repo, "run", "look around", "--wait", "--json")
    assert out.returncode == 0, out.stderr + out.stdout
    (task,) = json.loads(out.stdout)
    assert task["state"] == "succeeded" and task["verdict"] == "ok", task
    return task, Path(task["worktree"])


def assert_key_nowhere(env: dict[str, str], repo: Path, task: dict[str, Any], key: str,
                       worktree: Path) -> None:
    """Neither in what the tool saw nor in anything fleet-tui shows or keeps."""
    assert (worktree / "t.txt").read_text().strip() == "empty"
    assert key not in (worktree / "tool-env.txt").read_text()
    shown = [fleet_tui(env, repo, *args).stdout for args in (
        ("logs", task["id"], "--raw"), ("logs", task["id"]), ("diff", task["id"]),
        ("show", task["id"], "--json"))]
    for text in shown:
        assert key not in text
    config = Path(env["FLEET_TUI_HOME"]) / "config" / task["id"]
    for path in config.rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path


def test_the_tools_a_worker_runs_never_see_the_key(claude: str, key: str,
                                                  endpoint: ScriptedEndpoint,
                                                  git_repo: Path) -> None:
    env = base_env(endpoint, claude, key)
    task, worktree = run_task(env, git_repo)
    assert_key_nowhere(env, git_repo, task, key, worktree)
    # no process the tool could see had the key in its environment: not claude's either
    assert key not in (worktree / "proc-env.txt").read_text(errors="replace")
    messages = [r for r in endpoint.requests if r.path.startswith("/v1/messages")]
    assert len(messages) == 2 and all(r.has_auth for r in messages)


def test_with_key_helper_off_the_tools_see_it(claude: str, key: str,
                                             endpoint: ScriptedEndpoint,
                                             git_repo: Path, tmp_path: Path) -> None:
    """The documented trade-off of `key_helper = false` (and what the test above would see
    without the handoff): the key is in claude's environment, so in the tool's. Set in
    config.toml, it reaches the runner too."""
    config = tmp_path / "config.toml"
    config.write_text('key_helper = false\ncage = "off"\n')  # caged, the key is piped anyway
    env = dict(base_env(endpoint, claude, key), FLEET_TUI_CONFIG=str(config))
    _task, worktree = run_task(env, git_repo)
    assert (worktree / "t.txt").read_text().strip() == key


def _scrub_ready() -> None:
    missing = [name for name in ("bwrap", "socat") if shutil.which(name) is None]
    if missing:
        pytest.skip("scrub_tool_env needs bubblewrap and socat (apt-get install bubblewrap "
                    f"socat); missing here: {', '.join(missing)}")
    problem = launcher.bwrap_problem()
    if problem:
        pytest.skip(f"bubblewrap cannot make a namespace on this machine: {problem}")


@pytest.mark.parametrize("key_helper", ["1", "0"])
def test_scrub_tool_env_runs_the_tools_without_the_key_in_their_own_pid_namespace(
        claude: str, key: str, endpoint: ScriptedEndpoint, git_repo: Path,
        key_helper: str) -> None:
    _scrub_ready()
    # an uncaged worker's: the cage (the default) replaces scrub_tool_env, which a caged
    # worker ignores, so with it on this would test the cage
    env = dict(base_env(endpoint, claude, key), FLEET_WORKER_SCRUB_TOOL_ENV="1",
               FLEET_WORKER_KEY_HELPER=key_helper, FLEET_WORKER_CAGE="off")
    task, worktree = run_task(env, git_repo)  # the worker still finishes ok
    assert json.loads(fleet_tui(env, git_repo, "show", task["id"], "--json").stdout)[
        "cage"] == "off"
    assert_key_nowhere(env, git_repo, task, key, worktree)
    assert key not in (worktree / "proc-env.txt").read_text(errors="replace")
    # the tool sees only its own sandbox's processes (the worker's cage: its init, its
    # network bridges, claude and the tool's own), not the runner's or the host's
    assert int((worktree / "proc-count.txt").read_text()) < 20
    events = fleet_tui(env, git_repo, "logs", task["id"], "--raw").stdout
    assert '"permission_denials":[]' in events.replace(" ", "")


def test_fleet_worker_hands_the_real_claude_the_key_through_the_pipe(
        claude: str, key: str, endpoint: ScriptedEndpoint, tmp_path: Path) -> None:
    env = dict(base_env(endpoint, claude, key), FLEET_WORKER_CONFIG_DIR=str(tmp_path / "cfg"))
    work = tmp_path / "work" / "tree"
    work.mkdir(parents=True)
    worker = Path(sys.executable).parent / "fleet-worker"
    cmd = [str(worker)] if worker.exists() else [
        sys.executable, "-c", "import sys; from fleet_tui.cli import worker_main; "
        "sys.exit(worker_main())"]
    out = subprocess.run([*cmd, "--output-format", "json", "look around"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=180,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["result"] == "looked"
    assert (work / "t.txt").read_text().strip() == "empty"
    assert key not in (work / "proc-env.txt").read_text(errors="replace")
    assert key not in out.stdout + out.stderr
    assert not list((tmp_path / "cfg").glob(".key-*.fifo"))  # the pipe is gone
