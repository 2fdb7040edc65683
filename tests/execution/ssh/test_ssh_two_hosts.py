"""Two SSH hosts and this machine at once (the first test of several hosts): two OpenSSH servers on
127.0.0.1, each with its own host key, login key and HOME (tests/support/sshd.py), are the hosts
`a` and `b`; a task on each and one local run at the same time with the real claude
against the scripted endpoint, then land through the merge queue (its own runner process)
into the main repository here, each with the commit its worker made where it ran.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sshd
from endpoint_helpers import run_cli
from ssh_support import record_claude, start_sshd
from test_fleet import KEY, SCRIPTS, drive, settled

from fleet_tui.core.states import LandState
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store, TaskState
from fleet_tui.system import paths

pytestmark = pytest.mark.xdist_group("ssh-two-hosts")


def _script(name: str) -> list[Any]:
    """A worker that commits `<name>.txt`, then waits 3 s, so the three overlap."""
    return [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": f"echo {name} > {name}.txt && git add {name}.txt && "
                               f"git commit -q -m 'made on {name}' && sleep 3",
                    "description": "commit, then wait"}}],
        f"committed on {name}",
    ]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, sshd.Sshd]]:
    started: dict[str, sshd.Sshd] = {}
    try:
        for name in ("a", "b"):
            started[name] = start_sshd(tmp_path_factory.mktemp(f"sshd-{name}"),
                                       alias=f"fleet-host-{name}")
        yield started
    finally:
        for server in started.values():
            server.stop()


def test_a_task_on_each_host_and_one_here_land_through_the_queue(
        git_repo: Path, claude_bin: str, servers: dict[str, sshd.Sshd]) -> None:
    scripts: dict[str, Any] = dict(SCRIPTS)
    for name in ("a", "b", "local"):
        scripts[f"on-{name}"] = _script(name)
    with ScriptedEndpoint(scripts) as endpoint:
        values: dict[str, Any] = {
            "base_url": endpoint.url, "claude": claude_bin, "sandbox": os.geteuid() == 0,
            "key_sources": "env", "max_workers": 4, "max_attempts": 1, "kill_grace": 2.0}
        # as a user has them: both aliases in their ssh config (ssh reads the passwd
        # entry's ~/.ssh, not $HOME's: a wrapper on PATH names the file), the hosts in
        # config.toml (the queue's runner, a process of its own, builds its hosts there)
        bin_dir = git_repo.parent / "bin"
        bin_dir.mkdir()
        config = bin_dir / "ssh_config"
        config.write_text("".join(server.client_config.read_text()
                                  for server in servers.values()))
        (bin_dir / "ssh").write_text(f"#!/bin/sh\nexec /usr/bin/ssh -F {config} \"$@\"\n")
        (bin_dir / "ssh").chmod(0o755)
        env = dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0",
                   FLEET_WORKER_CAGE="off",  # uncaged: the caged host: test_ssh_user_path
                   PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        for name, server in servers.items():
            added = run_cli(env, git_repo, "host", "add", name, server.alias, "--key-on-host")
            assert added.returncode == 0, added.stderr
            record_claude(server, claude_bin)  # the same-machine shortcut
        settings = load_settings(env=env, overrides=values)
        fleet = Fleet(settings, Store(paths.db_path()), env=env)
        hosts = [fleet.supervisor.hosts.get(name) for name in servers]
        try:
            ids = {name: fleet.submit(TaskSpec(prompt=f"[script:on-{name}] work",
                                               repo=git_repo,
                                               host=None if name == "local" else name))[0].id
                   for name in ("a", "b", "local")}
            together: list[int] = []

            def count() -> None:
                together.append(sum(fleet.get_task(t).state == TaskState.RUNNING
                                    for t in ids.values()))

            drive(fleet, settled(fleet, *ids.values()), timeout=150, each=count)
            states = {n: fleet.get_task(t).message for n, t in ids.items()}
            assert max(together) == 3, states  # all three ran at once
            for name, task_id in ids.items():
                task = fleet.get_task(task_id)
                assert task.state == TaskState.SUCCEEDED, (name, task.message)
                (attempt,) = fleet.attempts(task_id)
                assert attempt.host == name
            # each remote worktree was on its own host, under that host's HOME
            for name in ("a", "b"):
                worktree = str(fleet.get_task(ids[name]).worktree)
                assert worktree.startswith(str(servers[name].home))
            assert str(fleet.get_task(ids["local"]).worktree).startswith(str(git_repo))

            fleet.enqueue(list(ids.values()))
            drive(fleet, lambda: all(fleet.get_task(t).land_state in (
                LandState.MERGED, LandState.STOPPED) for t in ids.values()), timeout=240)
            for name, task_id in ids.items():
                landed = fleet.get_task(task_id)
                assert landed.land_state == LandState.MERGED, (name, landed.land_note)
            for name in ("a", "b", "local"):
                shown = subprocess.run(["git", "-C", str(git_repo), "show", f"main:{name}.txt"],
                                       capture_output=True, text=True, check=True).stdout
                assert shown == f"{name}\n"
            log = subprocess.run(["git", "-C", str(git_repo), "log", "--format=%s", "main"],
                                 capture_output=True, text=True, check=True).stdout
            assert {"made on a", "made on b", "made on local"} <= set(log.splitlines())
        finally:
            for host in hosts:
                host.close()  # type: ignore[attr-defined]
