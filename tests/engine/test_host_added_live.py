"""A host added to config.toml while an engine runs (`fleet-tui host add` from another
shell, then `fleet-tui run ... --host NEW --wait`): the running engine reads config.toml's
[hosts] again once the file changed, follows the new host's task like its own, and never
marks it failed while its worker runs. Before, it took the task's host for one removed
from config.toml: the task was marked failed 0.5 s after it started (`crashed: its host
'box' is not in config.toml any more`) while its worker ran on unsupervised.

The host is this machine's sshd as this user (tests/support/ssh_support.py: the fast seam), the
ssh client the real one, given the test's config by a wrapper first on PATH.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import sshd
from ssh_support import master, record_claude, start_sshd
from test_fleet import KEY, SCRIPTS

from fleet_tui.core.errors import FleetError
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store, TaskState
from fleet_tui.system import paths

ALIAS = "fleet-late-host"


def test_a_host_added_while_an_engine_runs_is_followed_never_failed(
        tmp_path: Path, git_repo: Path, claude_bin: str) -> None:
    server: sshd.Sshd = start_sshd(tmp_path / "sshd", alias=ALIAS)
    # the same-machine shortcut: this machine's claude recorded as the host's (host check's
    # record); the real path is tests/journeys/test_ssh_user_path.py
    record_claude(server, claude_bin)
    flag = tmp_path / "go"
    scripts: dict[str, Any] = dict(SCRIPTS)
    scripts["hold"] = [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": f"echo held > held.txt; while [ ! -e {shlex.quote(str(flag))} ]; "
                               "do sleep 0.2; done", "description": "wait"}}],
        "went on",
    ]
    wrapper = tmp_path / "bin"
    wrapper.mkdir()
    (wrapper / "ssh").write_text(
        f"#!/bin/sh\nexec /usr/bin/ssh -F {shlex.quote(str(server.client_config))} \"$@\"\n")
    (wrapper / "ssh").chmod(0o755)
    with ScriptedEndpoint(scripts) as endpoint:
        env = dict(os.environ, PATH=f"{wrapper}{os.pathsep}{os.environ['PATH']}",
                   ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0",
                   FLEET_WORKER_BASE_URL=endpoint.url, FLEET_WORKER_CLAUDE=claude_bin,
                   FLEET_WORKER_KEY_SOURCES="env",
                   FLEET_WORKER_CAGE="off",  # uncaged: the caged host is test_ssh_user_path's
                   FLEET_WORKER_SANDBOX="1" if os.geteuid() == 0 else "0")
        # engine A: running before the host exists (its settings read without it)
        engine_a = Fleet(load_settings(env=env), Store(paths.db_path(env)), env=env)
        engine_a.tick()
        assert not engine_a.supervisor.hosts.knows("box")
        runner: subprocess.Popen[str] | None = None
        try:
            added = subprocess.run(
                [sys.executable, "-m", "fleet_tui.cli", "host", "add", "box", ALIAS,
                 "--key-on-host"], cwd=git_repo, env=env, input="", capture_output=True,
                text=True, timeout=120, check=False)
            assert added.returncode == 0, added.stderr
            # from another shell: a task on the new host, waited for
            runner = subprocess.Popen(
                [sys.executable, "-m", "fleet_tui.cli", "run", "[script:hold] hold",
                 "--host", "box", "--wait"], cwd=git_repo, env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True)
            seen: list[tuple[str, str | None]] = []
            deadline = time.monotonic() + 180

            def look() -> tuple[TaskState | None, bool]:
                engine_a.tick()
                tasks = engine_a.list_tasks()
                if not tasks:
                    return None, False
                (task,) = tasks
                seen.append((task.state.value, task.message))
                attempts = engine_a.attempts(task.id)
                try:
                    followed = bool(attempts) and attempts[-1].dir is not None and \
                        engine_a.supervisor.runner_state(attempts[-1]) == "alive"
                except FleetError:  # its host not known to engine A (yet)
                    followed = False
                return task.state, followed

            # the worker runs on the host; engine A, ticking all along, reads the host
            # and follows its runner (alive), and never marks the task failed
            while True:
                state, followed = look()
                assert state not in (TaskState.FAILED, TaskState.KILLED), seen[-1]
                if state == TaskState.RUNNING and followed \
                        and (Path(server.home) / ".fleet-tui-host").exists():
                    break
                assert runner.poll() is None, runner.communicate()
                assert time.monotonic() < deadline, f"never followed by engine A: {seen[-5:]}"
                time.sleep(0.1)
            assert engine_a.supervisor.hosts.knows("box")
            flag.touch()
            while runner.poll() is None:
                state, _followed = look()
                assert state != TaskState.FAILED, seen[-1]
                assert time.monotonic() < deadline, f"the task did not end: {seen[-5:]}"
                time.sleep(0.1)
            _out, err = runner.communicate()
            assert runner.returncode == 0, err
            assert "Traceback" not in err
            (done,) = engine_a.list_tasks()
            assert done.state == TaskState.SUCCEEDED, done.message
            assert not [s for s in seen if s[0] == TaskState.FAILED.value], seen
        finally:
            flag.touch()
            if runner is not None and runner.poll() is None:
                runner.kill()
                runner.communicate()
            master(server).close()
            server.stop()
