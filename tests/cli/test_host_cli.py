"""`fleet-tui host add|ls|rm|check` and `run --host`, as a user types them: the
real CLI in a subprocess, the real config.toml, the real store, ssh and sh.

`host check local` runs every check on this machine for real (with the pinned claude the
tests use); `host check` of an ssh target on a closed port of 127.0.0.1 goes through the
system's ssh and says it is unreachable, with the fix, and no traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from endpoint_helpers import run_cli
from ports import hold_port

from fleet_tui.core.errors import EXIT_REFUSED
from fleet_tui.store.db import Store
from fleet_tui.system import paths


def env_of(tmp_path: Path, **extra: str) -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, FLEET_TUI_CONFIG=str(tmp_path / "config.toml"),
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def test_add_ls_rm_keep_the_users_config(tmp_path: Path) -> None:
    env = env_of(tmp_path)
    config = tmp_path / "config.toml"
    original = "# my fleet\nmax_workers = 3  # enough\n"
    config.write_text(original, encoding="utf-8")
    added = run_cli(env, tmp_path, "host", "add", "box", "me@box.example:2222",
                    "--max-workers", "2")
    assert added.returncode == 0, added.stderr
    assert "added host box: ssh me@box.example:2222, max_workers 2" in added.stdout
    assert "fleet-tui host check box" in added.stdout
    run_cli(env, tmp_path, "host", "add", "lab", "lab", "-p", "2201", "--key-on-host")
    text = config.read_text()
    assert text.startswith(original)
    assert '[hosts.lab]\nssh = "lab:2201"\nmax_workers = 3\nkey_on_host = true\n' in text
    listed = run_cli(env, tmp_path, "host", "ls")
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["NAME", "TARGET", "WORKERS", "TASKS", "KEY"]
    assert lines[1].split() == ["local", "local", "0/3", "0", "-"]
    assert lines[2].split() == ["box", "me@box.example:2222", "0/2", "0", "here"]
    assert lines[3].split() == ["lab", "lab:2201", "0/3", "0", "on", "host"]
    data = json.loads(run_cli(env, tmp_path, "host", "ls", "--json").stdout)
    assert [(h["name"], h["ssh"], h["port"], h["max_workers"], h["key_on_host"])
            for h in data] == [("local", None, None, 3, False),
                               ("box", "me@box.example", 2222, 2, False),
                               ("lab", "lab", 2201, 3, True)]
    again = run_cli(env, tmp_path, "host", "add", "box", "other")
    assert again.returncode == 2 and "the host 'box' is there already" in again.stderr
    for name in ("box", "lab"):
        removed = run_cli(env, tmp_path, "host", "rm", name)
        assert removed.returncode == 0, removed.stderr
    assert config.read_text() == original


@pytest.mark.parametrize(("args", "message"), [
    (("add", "local", "box"), "'local' is this machine, always a host"),
    (("add", "any", "box"), "'any' is not a host"),
    (("add", "b", "a b"), "is not an ssh target"),
    (("add", "b", "box", "--max-workers", "0"), "max_workers: expected a whole number >= 1"),
    (("add", "b", "box:22", "-p", "23"), "says port 22 and port says 23"),
    (("rm", "nope"), "unknown host 'nope'; the hosts are: local"),
    (("check", "nope"), "unknown host 'nope'"),
])
def test_refusals_say_why_and_write_nothing(tmp_path: Path, args: tuple[str, ...],
                                            message: str) -> None:
    env = env_of(tmp_path)
    out = run_cli(env, tmp_path, "host", *args)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert message in out.stderr
    assert not (tmp_path / "config.toml").exists()


def test_rm_is_refused_while_tasks_live_on_the_host(tmp_path: Path) -> None:
    env = env_of(tmp_path)
    run_cli(env, tmp_path, "host", "add", "box", "box")
    with Store(paths.db_path()) as store:
        task = store.create_task(prompt="work", repo=tmp_path, host="box")
        done = store.create_task(prompt="old", repo=tmp_path, host="box", state="merged")
    refused = run_cli(env, tmp_path, "host", "rm", "box")
    assert refused.returncode == EXIT_REFUSED, refused.stderr
    assert f"1 task live on the host box ({task.id})" in refused.stderr
    assert "merge or discard them first" in refused.stderr and done.id not in refused.stderr
    assert "[hosts.box]" in (tmp_path / "config.toml").read_text()
    listed = run_cli(env, tmp_path, "host", "ls", "--json")
    assert [h["tasks"] for h in json.loads(listed.stdout)] == [0, 1]


def test_check_local_runs_every_check_here(tmp_path: Path, claude_bin: str) -> None:
    env = env_of(tmp_path, FLEET_WORKER_CLAUDE=claude_bin)
    out = run_cli(env, tmp_path, "host", "check", "local", "--json")
    data = json.loads(out.stdout)
    checks = {c["check"]: c for c in data["checks"]}
    assert list(checks) == ["reachable", "python", "git", "claude", "disk", "clock",
                            "contain", "cage"]
    for name in ("reachable", "python", "git", "claude", "clock", "contain"):
        assert checks[name]["ok"], checks[name]
    from fleet_tui import CLAUDE_CODE_VERSION

    assert checks["claude"]["found"] == f"{CLAUDE_CODE_VERSION} at {claude_bin}"
    assert out.returncode == (0 if data["ok"] else 1)
    shown = run_cli(env, tmp_path, "host", "check")
    assert "host local (this machine):" in shown.stdout
    assert "ok    python" in shown.stdout


def test_check_says_in_one_line_how_an_attempts_processes_are_contained(
        tmp_path: Path, claude_bin: str) -> None:
    """A cgroup where one can be made, else a PID namespace; where neither can, a warning
    (the host still works: the check passes) saying what may then outlive an attempt.
    FLEET_TUI_CONTAIN asks for less than the machine offers, as a machine without
    them would be."""
    said = {}
    for asked in ("auto", "namespace", "token"):
        env = env_of(tmp_path, FLEET_WORKER_CLAUDE=claude_bin, FLEET_TUI_CONTAIN=asked)
        out = run_cli(env, tmp_path, "host", "check", "local")
        (line,) = [x for x in out.stdout.splitlines() if " contain " in x]
        said[asked] = line.strip()
    assert said["auto"] in ("ok    contain    a cgroup per attempt",
                            "ok    contain    a PID namespace per attempt (no cgroup for "
                            "this user): everything a worker starts ends with it")
    assert said["namespace"].startswith("ok    contain    a PID namespace per attempt")
    assert said["token"] == (
        "warn  contain    NOT contained (FLEET_TUI_CONTAIN=token): a process a worker starts "
        "that leaves its session and drops FLEET_ATTEMPT_TOKEN can outlive its attempt")
    env = env_of(tmp_path, FLEET_WORKER_CLAUDE=claude_bin, FLEET_TUI_CONTAIN="token")
    out = run_cli(env, tmp_path, "host", "check", "local", "--json")
    (check,) = [c for c in json.loads(out.stdout)["checks"] if c["check"] == "contain"]
    assert check["ok"] and check["warn"] and "user.max_user_namespaces" in check["fix"]


def test_check_of_a_missing_claude_says_how_to_install_it(tmp_path: Path) -> None:
    env = env_of(tmp_path, FLEET_WORKER_CLAUDE=str(tmp_path / "no-claude"),
                 PATH=os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                      if not (Path(p) / "claude").exists()))
    out = run_cli(env, tmp_path, "host", "check", "local")
    assert out.returncode == 1
    assert "FAIL  claude     not found" in out.stdout
    assert "@anthropic-ai/claude-code@" in out.stdout and "npm install --prefix" in out.stdout
    if shutil.which("npm", path=env["PATH"]):  # the offer: no terminal, so not installed
        assert "fleet-tui host check local --yes" in out.stdout


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client")
def test_check_of_an_unreachable_ssh_host_says_so_with_the_fix(tmp_path: Path) -> None:
    home = Path(os.environ["HOME"])
    (home / ".ssh").mkdir(mode=0o700, exist_ok=True)
    env = env_of(tmp_path)
    with hold_port() as port:  # refused, and no other test's server takes it meanwhile
        run_cli(env, tmp_path, "host", "add", "gone", f"127.0.0.1:{port}")
        out = run_cli(env, tmp_path, "host", "check", "gone", timeout=60)
        assert out.returncode == 1, out.stdout + out.stderr
        assert "FAIL  reachable  unreachable: " in out.stdout
        assert "Connection refused" in out.stdout
        assert "fix: check that the host is up and sshd listens on that port" in out.stdout
        assert f"`ssh -p {port} 127.0.0.1 true` must succeed without asking" in out.stdout
        assert "python" not in out.stdout  # the other checks need the host


def test_run_on_an_unknown_host_creates_nothing(git_repo: Path, tmp_path: Path) -> None:
    env = env_of(tmp_path, FLEET_WORKER_KEY_SOURCES="env", ANTHROPIC_AUTH_TOKEN="sk-x")
    run_cli(env, tmp_path, "host", "add", "box", "box")
    out = run_cli(env, git_repo, "run", "do it", "--host", "nope")
    assert out.returncode == 2, out.stderr
    assert "unknown host 'nope'; the hosts are: local, box" in out.stderr
    assert json.loads(run_cli(env, git_repo, "ls", "--json").stdout) == []
    branches = subprocess.run(["git", "branch", "--list", "fleet/*"], cwd=git_repo,
                              capture_output=True, text=True, check=True)
    assert branches.stdout == ""


def test_run_without_the_gateway_on_a_host_that_does_not_keep_the_key_is_refused(
        git_repo: Path, tmp_path: Path, claude_bin: str) -> None:
    """The gateway off (the suite's default), a worker on `box` would need the key there:
    refused before anything is made, with both ways out."""
    env = env_of(tmp_path, FLEET_WORKER_KEY_SOURCES="env", ANTHROPIC_AUTH_TOKEN="sk-x-key",
                 FLEET_WORKER_CLAUDE=claude_bin, FLEET_WORKER_GATEWAY="0")
    run_cli(env, tmp_path, "host", "add", "box", "box")
    out = run_cli(env, git_repo, "run", "do it", "--host", "box")
    assert out.returncode == 2, out.stderr
    assert "the gateway is off (gateway = false)" in out.stderr
    assert "--key-on-host" in out.stderr and "Traceback" not in out.stderr
    assert "sk-x-key" not in out.stderr + out.stdout
    assert json.loads(run_cli(env, git_repo, "ls", "--json").stdout) == []


def test_ls_and_show_carry_the_host(git_repo: Path, tmp_path: Path) -> None:
    env = env_of(tmp_path)
    run_cli(env, tmp_path, "host", "add", "box", "box")
    with Store(paths.db_path()) as store:
        here = store.create_task(prompt="here", repo=git_repo)
    one = run_cli(env, git_repo, "ls")
    assert "HOST" not in one.stdout.splitlines()[0]  # one host in use: no column
    with Store(paths.db_path()) as store:
        there = store.create_task(prompt="there", repo=git_repo, host="box")
    two = run_cli(env, git_repo, "ls").stdout.splitlines()
    assert "HOST" in two[0].split()
    column = two[0].index("HOST")
    rows = {line.split()[0]: line for line in two[1:]}
    assert rows[there.id][column:].startswith("box ")
    assert rows[here.id][column:].startswith("local ")
    listed = {t["id"]: t["host"] for t in json.loads(run_cli(env, git_repo, "ls",
                                                             "--json").stdout)}
    assert listed == {here.id: "local", there.id: "box"}
    shown = run_cli(env, git_repo, "show", there.id)
    assert any(line.split() == ["host:", "box"] for line in shown.stdout.splitlines())
    assert json.loads(run_cli(env, git_repo, "show", there.id, "--json").stdout)["host"] == "box"
