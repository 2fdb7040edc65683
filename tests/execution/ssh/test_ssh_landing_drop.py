"""The merge queue and a host's dropped connection: a task that ran on an SSH host lands
though the ssh master was killed and the host refused connections for a moment while the
queue worked on it (its update sends the base over ssh and runs the agent there, its gate
and merge fetch the work). A connection failure is of the moment: the step is tried again
(bounded, `landing.AGAIN_WAITS`), the connection made again by the next command, and the
task stops only for a reason that stays.

Two drops: the master killed and the host away for a moment before the queue's step, and
the master killed in the middle of the step's command (the base's push held on the host
by a pre-receive hook of the host's mirror until the kill: the issue's case, a master
killed while the queue works on the task).

The host is this machine's sshd as this user (tests/support/ssh_support.py: the fast seam), named
in config.toml as a user would (`fleet-tui host add`), so that the queue's own detached
process builds the same host; the ssh client is the real one, given the test's config by
a wrapper first on PATH.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import sshd
from ssh_support import master, record_claude, start_sshd
from test_fleet import KEY, SCRIPTS

from fleet_tui.core.states import LandState
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store, TaskState
from fleet_tui.system import paths

pytestmark = pytest.mark.xdist_group("ssh-host")

ALIAS = "fleet-drop-host"


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def _drive(fleet: Fleet, until: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            states = {t.id: (t.state.value, t.land_state, t.land_note, t.message)
                      for t in fleet.list_tasks()}
            raise AssertionError(f"timed out waiting for {what}; tasks: {states}")
        fleet.tick()
        time.sleep(0.05)


def _host_env(tmp_path: Path, git_repo: Path, claude_bin: str, server: sshd.Sshd
              ) -> dict[str, str]:
    """The host named in config.toml by `host add`, the test's ssh config through a
    wrapper on PATH: the env of this test's engine and of the queue's runner."""
    # the same-machine shortcut: this machine's claude recorded as the host's (host check's
    # record); the real path is tests/journeys/test_ssh_user_path.py
    record_claude(server, claude_bin)
    wrapper = tmp_path / "bin"
    wrapper.mkdir()
    (wrapper / "ssh").write_text(
        f"#!/bin/sh\nexec /usr/bin/ssh -F {shlex.quote(str(server.client_config))} \"$@\"\n")
    (wrapper / "ssh").chmod(0o755)
    env = dict(os.environ, PATH=f"{wrapper}{os.pathsep}{os.environ['PATH']}",
               ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0",
               FLEET_WORKER_CAGE="off")  # uncaged: the caged host is test_ssh_user_path's
    added = subprocess.run([sys.executable, "-m", "fleet_tui.cli", "host", "add", "box", ALIAS,
                            "--key-on-host"], cwd=git_repo, env=env, input="",
                           capture_output=True, text=True, timeout=120, check=False)
    assert added.returncode == 0, added.stderr
    return env


def _finished_task(fleet: Fleet, git_repo: Path) -> str:
    """A task done on the host, and main moved on since (the queue's update then sends
    main's tip to the host and merges there)."""
    (task,) = fleet.submit(TaskSpec(prompt="[script:default] write it", repo=git_repo,
                                    host="box"))
    _drive(fleet, lambda: fleet.get_task(task.id).state in
           (TaskState.SUCCEEDED, TaskState.FAILED), 120, "the task to finish")
    done = fleet.get_task(task.id)
    assert done.state == TaskState.SUCCEEDED, done.message
    (git_repo / "base.txt").write_text("on main\n")
    _git(git_repo, "add", "base.txt")
    _git(git_repo, "commit", "-q", "-m", "main moved")
    return task.id


def _engine(endpoint: ScriptedEndpoint, claude_bin: str, env: dict[str, str]) -> Fleet:
    values: dict[str, Any] = {
        "base_url": endpoint.url, "claude": claude_bin,
        "sandbox": os.geteuid() == 0, "key_sources": "env", "kill_grace": 2.0,
        "max_attempts": 1, "test_command": "test -f a.txt && test -f base.txt"}
    return Fleet(load_settings(env=env, overrides=values), Store(paths.db_path()), env=env)


def _landed(fleet: Fleet, git_repo: Path, task_id: str) -> str:
    """The task merged (its work and main's both on main); the queue runner's log."""
    _drive(fleet, lambda: fleet.get_task(task_id).land_state in
           (LandState.MERGED, LandState.STOPPED), 180, "the queue to land it")
    landed = fleet.get_task(task_id)
    assert landed.land_state == LandState.MERGED, landed.land_note
    assert landed.state == TaskState.MERGED, landed.message
    assert _git(git_repo, "show", "main:a.txt") == "worker\n"
    assert _git(git_repo, "show", "main:base.txt") == "on main\n"
    return (paths.queue_dir(git_repo) / "runner.log").read_text()


def test_a_dropped_connection_while_the_queue_lands_a_host_task_is_tried_again(
        tmp_path: Path, git_repo: Path, claude_bin: str) -> None:
    server: sshd.Sshd = start_sshd(tmp_path / "sshd", alias=ALIAS)
    env = _host_env(tmp_path, git_repo, claude_bin, server)
    with ScriptedEndpoint(dict(SCRIPTS)) as endpoint:
        try:
            fleet = _engine(endpoint, claude_bin, env)
            task_id = _finished_task(fleet, git_repo)
            task = fleet.get_task(task_id)

            # queued (its worktree checked on the host), its runner not started yet
            fleet.spawn_queue_runners = False
            fleet.enqueue([task.id])
            # the connection drops: the master killed, and the host away for a moment;
            # then the queue's runner starts (the next pass), and meets it
            cut = master(server).master_pid()
            assert cut is not None
            os.kill(cut, signal.SIGKILL)
            server.stop()
            fleet.spawn_queue_runners = True
            runner_log = paths.queue_dir(git_repo) / "runner.log"

            def met_the_drop() -> bool:
                said = runner_log.read_text() if runner_log.exists() else ""
                return "failed for now" in said or fleet.get_task(task.id).land_state in (
                    LandState.MERGED, LandState.STOPPED)

            _drive(fleet, met_the_drop, 120, "the queue to meet the dropped connection")
            met = fleet.get_task(task.id)
            assert met.land_state not in (LandState.STOPPED, LandState.MERGED), \
                (met.land_state, met.land_note)
            server.start()  # the host is back: the step's next try makes a new connection
            said = _landed(fleet, git_repo, task.id)
            assert "failed for now" in said and "again in" in said
        finally:
            master(server).close()
            server.stop()


# On the host's mirror: the first push after it is put there is held inside the host's
# git-receive-pack (the step's command running over the master) until the test says go;
# the later pushes go through. It never holds for more than a minute, whatever happens.
HOLD = """#!/bin/sh
cat >/dev/null
if [ ! -e {held} ]; then
  : > {held}
  i=0
  while [ ! -e {go} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
fi
exit 0
"""


def test_the_master_killed_in_the_middle_of_the_queues_command_the_task_still_lands(
        tmp_path: Path, git_repo: Path, claude_bin: str) -> None:
    server: sshd.Sshd = start_sshd(tmp_path / "sshd", alias=ALIAS)
    env = _host_env(tmp_path, git_repo, claude_bin, server)
    held, go = tmp_path / "held", tmp_path / "go"
    with ScriptedEndpoint(dict(SCRIPTS)) as endpoint:
        try:
            fleet = _engine(endpoint, claude_bin, env)
            task_id = _finished_task(fleet, git_repo)
            fleet.spawn_queue_runners = False
            fleet.enqueue([task_id])
            (host,) = [h for h in fleet.supervisor.hosts.built()
                       if hasattr(h, "mirror_path")]
            hook = Path(host.mirror_path(git_repo)) / "hooks" / "pre-receive"
            hook.write_text(HOLD.format(held=shlex.quote(str(held)),
                                        go=shlex.quote(str(go))))
            hook.chmod(0o755)
            fleet.spawn_queue_runners = True
            # the queue's update is sending main's tip: the push is inside the host's
            # receive-pack, over the master, when the master is killed
            _drive(fleet, lambda: held.exists() or fleet.get_task(task_id).land_state in
                   (LandState.MERGED, LandState.STOPPED), 120,
                   "the queue's push to reach the host")
            assert held.exists(), fleet.get_task(task_id).land_note
            cut = master(server).master_pid()
            assert cut is not None
            os.kill(cut, signal.SIGKILL)
            go.touch()  # the host's side may go on; the client's connection is gone
            said = _landed(fleet, git_repo, task_id)
            assert "failed for now" in said and "again in" in said, said
        finally:
            go.touch()
            master(server).close()
            server.stop()
