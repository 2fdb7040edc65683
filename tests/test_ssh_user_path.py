"""An SSH host on the README's path, as a new user would set it up: a host that is another
Linux user (its own HOME under /home, made for the test with useradd) reached over a real
sshd on 127.0.0.1, with the distribution's python3 (/usr/bin/python3) and nothing of
fleet-tui or of this machine's Python environment; `fleet-tui host add` writes the host
into config.toml, the user's ssh config names it (a wrapper first on PATH hands ssh the
test's file: OpenSSH reads ~/.ssh/config from the passwd entry, never $HOME), and
`fleet-tui host check --yes` installs the pinned claude there with the host's npm, from a
registry on 127.0.0.1 that serves the pinned version packed once per run with `npm pack`
(the host's ~/.npmrc names it, as a mirror would be set).

This machine names its own claude (FLEET_WORKER_CLAUDE=~/tools/claude, a path only this
machine has): none of this machine's paths reaches the host, whose runner runs the claude
`host check` installed there. A task is launched there, steered with `say`, merged here;
another is killed, and nothing of it is left on the host.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sshd
from ssh_support import (
    host_pids,
    linux_user,
    npm_registry,
    npm_registry_files,
    start_sshd,
    token_holders,
)
from test_fleet import KEY, SCRIPTS, drive

from fleet_tui import CLAUDE_CODE_VERSION
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.gateway import control
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store, TaskState
from fleet_tui.system import paths

# the pinned claude packed (its native part: ~245 MB through gzip) and installed there
pytestmark = [pytest.mark.xdist_group("ssh-user-path"), pytest.mark.timeout(1800)]

ALIAS = "fleet-user-host"
SLEEPS = ("sleep 326", "sleep 327")
USER_SCRIPTS: dict[str, Any] = dict(SCRIPTS)
USER_SCRIPTS["commit-then-wait"] = [
    [{"type": "tool_use", "name": "Bash",
      "input": {"command": "echo there > there.txt && git add there.txt && "
                           "git commit -q -m 'made by the host user' && sleep 4",
                "description": "commit, then wait"}}],
    "committed there",
]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, claude_bin: str) -> Iterator[str]:
    """The pinned claude, packed once per run, served as an npm registry on 127.0.0.1."""
    files = npm_registry_files(claude_bin, tmp_path_factory.mktemp("npm-packed"))
    with npm_registry(files) as url:
        yield url


@pytest.fixture(scope="module")
def user_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sshd.Sshd]:
    """sshd on 127.0.0.1 whose login is a Linux user of its own."""
    start_sshd(tmp_path_factory.mktemp("probe-sshd")).stop()  # skips (or fails in CI)
    with linux_user() as name:
        server = sshd.Sshd(tmp_path_factory.mktemp("user-sshd"), alias=ALIAS,
                           user=name).start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="module")
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(USER_SCRIPTS) as ep:
        yield ep


def _cli(env: dict[str, str], cwd: Path, *args: str,
         timeout: float = 180) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-m", "fleet_tui.cli", *args], cwd=cwd, env=env,
                         input="", capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in out.stderr + out.stdout, out.stderr + out.stdout
    return out


def _events(fleet: Fleet, task_id: str) -> bytes:
    attempts = fleet.attempts(task_id)
    if not attempts or attempts[-1].dir is None:
        return b""
    path = Path(attempts[-1].dir) / "events.jsonl"
    return path.read_bytes() if path.exists() else b""


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def test_a_host_that_is_another_user_on_the_readmes_path(
        tmp_path: Path, git_repo: Path, claude_bin: str, user_host: sshd.Sshd,
        registry: str, endpoint: ScriptedEndpoint) -> None:
    home_here = Path(os.environ["HOME"])
    # this machine's own claude, at a path only this machine has
    (home_here / "tools").mkdir(exist_ok=True)
    (home_here / "tools" / "claude").unlink(missing_ok=True)
    (home_here / "tools" / "claude").symlink_to(claude_bin)
    # the host's npm goes to the registry on 127.0.0.1 (its own npm config)
    user_host.ssh("cat > \"$HOME/.npmrc\"", input=f"registry={registry}\n"
                  "fund=false\naudit=false\nupdate-notifier=false\n")
    # the user's ssh config, the user's config.toml
    wrapper = tmp_path / "bin"
    wrapper.mkdir()
    (wrapper / "ssh").write_text(f"#!/bin/sh\nexec /usr/bin/ssh -F "
                                 f"{shlex.quote(str(user_host.client_config))} \"$@\"\n")
    (wrapper / "ssh").chmod(0o755)
    config = tmp_path / "config.toml"
    config.write_text(f'base_url = "{endpoint.url}"\nkey_sources = ["env"]\n'
                      f"sandbox = true\nmax_attempts = 1\nkill_grace = 2\n")
    env = dict(os.environ, PATH=f"{wrapper}{os.pathsep}{os.environ['PATH']}",
               FLEET_TUI_CONFIG=str(config), FLEET_WORKER_CLAUDE="~/tools/claude",
               FLEET_WORKER_GATEWAY="1",  # the default (the suite's is off): the key stays
               ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0")

    added = _cli(env, git_repo, "host", "add", "box", ALIAS)
    assert added.returncode == 0, added.stderr
    assert "[hosts.box]" in config.read_text()

    # the host has no claude: host check says so, then installs the pinned one with npm
    checked = _cli(env, git_repo, "host", "check", "box", "--yes", timeout=900)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    installed = f"{user_host.home}/.fleet-tui-host/claude-cli/node_modules/.bin/claude"
    assert "FAIL  claude     not found" in checked.stdout, checked.stdout
    assert f"ok    claude     {CLAUDE_CODE_VERSION} at {installed}" in checked.stdout, \
        checked.stdout
    assert "ok    python" in checked.stdout
    assert user_host.ssh('cat "$HOME/.fleet-tui-host/claude-path"').strip() == installed

    settings = load_settings(env=env)
    assert settings.claude == "~/tools/claude" and settings.gateway  # the key stays here
    fleet = Fleet(settings, Store(paths.db_path()), env=env)
    try:
        # launched there, steered with say, then merged here
        (task,) = fleet.submit(TaskSpec(prompt="[script:commit-then-wait] work there",
                                        repo=git_repo, host="box"))
        drive(fleet, lambda: b"tool_use" in _events(fleet, task.id)
              or fleet.get_task(task.id).state == TaskState.FAILED, timeout=120)
        assert fleet.get_task(task.id).state == TaskState.RUNNING, \
            fleet.get_task(task.id).message
        remote_dir = f"{user_host.home}/.fleet-tui-host/attempts/{task.id}/1"
        spec = json.loads(user_host.ssh(f"cat {shlex.quote(remote_dir)}/spec.json"))
        assert spec["settings"]["claude"] == installed  # the host's own claude
        assert "config_dir" not in spec["settings"]
        there = user_host.ssh(f"cat {shlex.quote(remote_dir)}/spec.json "
                              f"{shlex.quote(remote_dir)}/runner.json")
        assert str(home_here) not in there and "~/tools" not in there
        assert fleet.say(task.id, "also say hello")
        drive(fleet, lambda: fleet.get_task(task.id).state in
              (TaskState.SUCCEEDED, TaskState.FAILED), timeout=120)
        done = fleet.get_task(task.id)
        assert done.state == TaskState.SUCCEEDED, done.message
        assert b"also say hello" in _events(fleet, task.id)
        merged = fleet.merge(task.id)
        assert merged.merged, merged.message
        assert _git(git_repo, "show", "main:there.txt") == "there\n"
        assert "made by the host user" in _git(git_repo, "log", "--format=%s", "main")

        # another, killed there: nothing of it left on the host
        (other,) = fleet.submit(TaskSpec(prompt="[script:sleepy] wait", repo=git_repo,
                                         host="box"))
        drive(fleet, lambda: len(host_pids(user_host, *SLEEPS)) == 2
              or fleet.get_task(other.id).state == TaskState.FAILED, timeout=120)
        assert fleet.get_task(other.id).state == TaskState.RUNNING, \
            fleet.get_task(other.id).message
        token = json.loads(user_host.ssh(
            f"cat {shlex.quote(user_host.home.as_posix())}/.fleet-tui-host/attempts/"
            f"{other.id}/1/spec.json"))["token"]
        fleet.kill(other.id)
        assert fleet.get_task(other.id).state == TaskState.KILLED
        deadline = time.monotonic() + 20
        while (host_pids(user_host, *SLEEPS) or token_holders(user_host, token)) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert host_pids(user_host, *SLEEPS) == []
        assert host_pids(user_host, f"attempts/{other.id}/") == []
        assert token_holders(user_host, token) == []
    finally:
        control.stop(fleet.env)
        for host in fleet.supervisor.hosts.built():
            close = getattr(host, "close", None)
            if close is not None:
                close()
