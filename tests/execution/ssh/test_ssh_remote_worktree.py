"""A task on an SSH host whose files this machine cannot see (the engine's side).

The host's sshd runs in a mount namespace of its own (tests/support/sshd.py, `private_home`): its
HOME, where the host keeps its mirror, the task's worktree and the attempt folders, is a
private folder for the host and an empty one here. So every engine path that read
`task.worktree` on this machine would find nothing: the diff (of the running task, and in
`fleet-tui diff` / `show`), the counts at the attempt's end, the update from main, the
merge queue's test gate and its merge must all go through the host (a snapshot fetched
into the main repository, the update run in the host's worktree) and land here the
worker's own commit.

The host is configured as a user would (`fleet-tui host add`); the ssh client is the real
one, given the test's ssh_config by a wrapper first on PATH (OpenSSH reads ~/.ssh/config
from the passwd entry, never $HOME, so a test cannot point it elsewhere any other way).
"""

from __future__ import annotations

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
from ssh_support import record_claude
from test_fleet import KEY, SCRIPTS

from fleet_tui.core.states import LandState
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store, TaskState
from fleet_tui.system import paths

pytestmark = pytest.mark.xdist_group("ssh-host")

_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
ALIAS = "fleet-iso-host"


def _bash(command: str) -> list[dict[str, Any]]:
    return [{"type": "tool_use", "name": "Bash",
             "input": {"command": command, "description": command[:40]}}]


@pytest.fixture(scope="module")
def iso_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sshd.Sshd]:
    why = sshd.missing()
    if why is None and subprocess.run(["sh", "-c", "command -v bwrap"],
                                      capture_output=True, check=False).returncode != 0:
        why = "bubblewrap is not installed (scripts/test installs it as root)"
    if why is not None:
        if _CI:
            pytest.fail(why)
        pytest.skip(why)
    server = sshd.Sshd(tmp_path_factory.mktemp("iso-sshd"), alias=ALIAS,
                       private_home=True).start()
    try:
        yield server
    finally:
        server.stop()


def _flag(server: sshd.Sshd, name: str) -> str:
    """A file on the host (under its HOME, so only the host sees it)."""
    return f"{server.home}/{name}"


@pytest.fixture(scope="module")
def endpoint(iso_sshd: sshd.Sshd) -> Iterator[ScriptedEndpoint]:
    scripts: dict[str, Any] = dict(SCRIPTS)
    # a commit, a file left uncommitted, then it waits (on the host) until told to go on
    scripts["remote-work"] = [
        _bash("echo remote > remote.txt && git add remote.txt && "
              "git commit -q -m 'made on the host' && echo loose > loose.txt && "
              f"while [ ! -e {shlex.quote(_flag(iso_sshd, 'go'))} ]; do sleep 0.2; done"),
        "done on the host",
    ]
    with ScriptedEndpoint(scripts) as ep:
        yield ep


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def _cli(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-m", "fleet_tui.cli", *args], cwd=cwd, env=env,
                         input="", capture_output=True, text=True, timeout=180)
    assert "Traceback" not in out.stderr, out.stderr
    return out


def _drive(fleet: Fleet, until: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            states = {t.id: (t.state.value, t.land_state, t.message)
                      for t in fleet.list_tasks()}
            raise AssertionError(f"timed out waiting for {what}; tasks: {states}")
        fleet.tick()
        time.sleep(0.05)


def _setup(tmp_path: Path, server: sshd.Sshd, endpoint: ScriptedEndpoint,
           claude: str, git_repo: Path) -> tuple[dict[str, str], dict[str, Any]]:
    wrapper = tmp_path / "bin"
    wrapper.mkdir()
    (wrapper / "ssh").write_text(
        f"#!/bin/sh\nexec /usr/bin/ssh -F {shlex.quote(str(server.client_config))} \"$@\"\n")
    (wrapper / "ssh").chmod(0o755)
    env = dict(os.environ, PATH=f"{wrapper}{os.pathsep}{os.environ['PATH']}",
               ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0",
               FLEET_WORKER_CAGE="off")  # uncaged: the caged host is test_ssh_user_path's
    values: dict[str, Any] = {
        "base_url": endpoint.url, "claude": claude, "sandbox": os.geteuid() == 0,
        "key_sources": "env", "backoff_base": 0.2, "backoff_cap": 1.0, "kill_grace": 2.0,
        "max_workers": 4, "max_attempts": 1,
        "test_command": "test -f remote.txt && test -f loose.txt && test -f base.txt",
    }
    # the suite's workers go straight to the endpoint: from a host that keeps the key
    added = _cli(env, git_repo, "host", "add", "box", ALIAS, "--max-workers", "2",
                 "--key-on-host")
    assert added.returncode == 0, added.stderr
    record_claude(server, claude)  # the same-machine shortcut: this machine's claude
    return env, values


def test_a_task_on_a_host_that_shares_nothing_lands_here(
        tmp_path: Path, git_repo: Path, claude_bin: str, iso_sshd: sshd.Sshd,
        endpoint: ScriptedEndpoint) -> None:
    env, values = _setup(tmp_path, iso_sshd, endpoint, claude_bin, git_repo)
    fleet = Fleet(load_settings(env=env, overrides=values), Store(paths.db_path()), env=env)
    (task,) = fleet.submit(TaskSpec(prompt="[script:remote-work] work there", repo=git_repo,
                                    host="box"))
    try:
        # the worker committed remote.txt, left loose.txt, and waits there
        _drive(fleet, lambda: "loose.txt" in iso_sshd.ssh(
            f"ls {shlex.quote(_flag(iso_sshd, '.fleet-tui-host/work/' + task.id))} "
            "2>/dev/null || true"), 90, "the worker's files on the host")
        running = fleet.get_task(task.id)
        assert running.state == TaskState.RUNNING, running.message
        worktree = str(running.worktree)
        assert worktree.startswith(f"{iso_sshd.home}/")
        # nothing of the host's is here: its HOME is an empty folder on this machine
        assert not Path(worktree).exists()
        assert list(iso_sshd.home.iterdir()) == []
        status_before = iso_sshd.ssh(f"git -C {shlex.quote(worktree)} status --porcelain")
        head_before = iso_sshd.ssh(f"git -C {shlex.quote(worktree)} rev-parse HEAD")

        # the diff of the RUNNING task: fetched from the host, its uncommitted file too
        asked = time.monotonic()
        diff = fleet.diff(task.id)
        took = time.monotonic() - asked
        print(f"\ndiff of a running remote task: {took:.2f} s")
        assert {f.path for f in diff.files} == {"remote.txt", "loose.txt"}
        assert "+remote" in diff.patch and "+loose" in diff.patch
        assert fleet.get_task(task.id).state == TaskState.RUNNING  # still waiting there
        # ...and the worker's worktree exactly as it was: no commit, no staged file
        assert iso_sshd.ssh(f"git -C {shlex.quote(worktree)} status --porcelain") \
            == status_before
        assert iso_sshd.ssh(f"git -C {shlex.quote(worktree)} rev-parse HEAD") == head_before
        assert list(iso_sshd.home.iterdir()) == []

        iso_sshd.ssh(f"touch {shlex.quote(_flag(iso_sshd, 'go'))}")
        _drive(fleet, lambda: fleet.get_task(task.id).state in
               (TaskState.SUCCEEDED, TaskState.FAILED), 90, "the task to finish")
        done = fleet.get_task(task.id)
        assert done.state == TaskState.SUCCEEDED, done.message
        # counted at the attempt's end from what was fetched (2 files, one line each)
        assert (done.added_lines, done.deleted_lines) == (2, 0)
        worker_commit = _git(git_repo, "rev-parse", f"refs/heads/{done.branch}").strip()
        assert _git(git_repo, "log", "-1", "--format=%s", worker_commit).strip() \
            == "made on the host"

        # what a fresh retry would throw away, read from the host too
        at_stake = fleet.work_at_stake(done) or ""
        assert "2 changed files (loose.txt, remote.txt" in at_stake, at_stake
        assert f"1 commit on {done.branch}" in at_stake, at_stake

        # the command line, another process with its own connection to the host
        shown = _cli(env, git_repo, "diff", task.id)
        assert shown.returncode == 0, shown.stderr
        assert "remote.txt" in shown.stdout and "loose.txt" in shown.stdout
        show = _cli(env, git_repo, "show", task.id)
        assert show.returncode == 0, show.stderr
        assert task.id in show.stdout

        # main adds its own remote.txt: the update, on the host, stops on the conflict
        # there (for its worker); aborted, the host's worktree is back as it was: its
        # commit, and the worker's uncommitted loose.txt uncommitted again
        head_then = iso_sshd.ssh(f"git -C {shlex.quote(worktree)} rev-parse HEAD")
        status_then = iso_sshd.ssh(f"git -C {shlex.quote(worktree)} status --porcelain")
        assert "loose.txt" in status_then
        (git_repo / "remote.txt").write_text("main's\n")
        _git(git_repo, "add", "remote.txt")
        _git(git_repo, "commit", "-q", "-m", "main's remote.txt")
        conflicted = fleet.update(task.id)
        assert conflicted.status == "conflicts", conflicted.message
        assert conflicted.conflicts == ["remote.txt"]
        assert fleet.get_task(task.id).conflicts == ["remote.txt"]
        assert iso_sshd.ssh(f"git -C {shlex.quote(worktree)} rev-parse -q --verify "
                            "MERGE_HEAD", check=False).strip()  # mid-merge, there
        # staged with its markers still in, the file is not resolved: still mid-merge there
        iso_sshd.ssh(f"git -C {shlex.quote(worktree)} add remote.txt")
        again = fleet.update(task.id)
        assert again.status == "conflicts" and again.conflicts == ["remote.txt"], again.message
        assert iso_sshd.ssh(f"git -C {shlex.quote(worktree)} rev-parse -q --verify "
                            "MERGE_HEAD", check=False).strip()
        aborted = fleet.resolve_update(task.id, "abort")
        assert aborted.conflicts == [] and "aborted" in (aborted.message or "")
        assert "uncommitted work put back" in (aborted.message or ""), aborted.message
        assert iso_sshd.ssh(f"git -C {shlex.quote(worktree)} rev-parse HEAD") == head_then
        assert iso_sshd.ssh(f"git -C {shlex.quote(worktree)} status --porcelain") \
            == status_then
        _git(git_repo, "rm", "-q", "remote.txt")
        _git(git_repo, "commit", "-q", "-m", "main drops its remote.txt")

        # main moves on; the update runs in the host's worktree (merged there, then fetched)
        (git_repo / "base.txt").write_text("on main\n")
        _git(git_repo, "add", "base.txt")
        _git(git_repo, "commit", "-q", "-m", "main moved")
        main_tip = _git(git_repo, "rev-parse", "main").strip()
        updated = fleet.update(task.id)
        assert updated.status == "updated", updated.message
        assert "host box" in updated.message
        there = iso_sshd.ssh(f"git -C {shlex.quote(worktree)} merge-base --is-ancestor "
                             f"{main_tip} HEAD && echo contained", check=False)
        assert there.strip() == "contained"
        assert iso_sshd.ssh(f"git -C {shlex.quote(worktree)} status --porcelain") == ""
        after = fleet.diff(task.id)  # measured from main's tip now: base.txt is not its
        assert {f.path for f in after.files} == {"remote.txt", "loose.txt"}
        assert list(iso_sshd.home.iterdir()) == []

        # through the merge queue: its own runner process, the gate in a checkout here
        fleet.enqueue([task.id])
        _drive(fleet, lambda: fleet.get_task(task.id).land_state in
               (LandState.MERGED, LandState.STOPPED), 180, "the queue to land it")
        landed = fleet.get_task(task.id)
        assert landed.land_state == LandState.MERGED, landed.land_note
        assert landed.state == TaskState.MERGED, landed.message
        assert landed.gate == "passed"
        main_log = _git(git_repo, "log", "--format=%H %s", "main")
        assert worker_commit in main_log  # the worker's own commit, carried by the merge
        assert _git(git_repo, "show", "main:remote.txt") == "remote\n"
        assert _git(git_repo, "show", "main:loose.txt") == "loose\n"
        assert _git(git_repo, "status", "--porcelain") == ""
        # closed: the host's worktree went with it, the scratch refs here too
        assert iso_sshd.ssh(f"test -e {shlex.quote(worktree)} && echo left || echo gone"
                            ).strip() == "gone"
        assert _git(git_repo, "for-each-ref", "refs/fleet/", "refs/heads/fleet-preview/") \
            == ""
        assert list(iso_sshd.home.iterdir()) == []
    finally:
        iso_sshd.ssh(f"touch {shlex.quote(_flag(iso_sshd, 'go'))}", check=False)
