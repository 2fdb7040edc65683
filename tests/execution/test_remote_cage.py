"""The cage on remote hosts, the parts that need no remote host: what `host check` reads on
a host about the cage (its probe run by this machine's real shell, with the real bubblewrap
and the srt the tests installed), the host's side that gives a caged attempt its srt, and
a caged task refused before anything exists for a host that was never checked or cannot
cage (the CLI, a real repository, nothing on any host). The caged worker on an SSH host:
tests/journeys/test_ssh_user_path.py; on a Ray node: tests/execution/ray/test_ray_host.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from test_run_refusals import assert_nothing_created, assert_one_clear_line, fleet_tui

from fleet_tui.execution import probe, remote_cage
from fleet_tui.execution.worker import cage, hostcage
from fleet_tui.settings.config import config_file_path

SRT = cage.find_srt(os.environ)


def _probe(data_dir: Path, env: dict[str, str], given: str | None = None) -> dict[str, str]:
    script = remote_cage.probe_lines(str(data_dir), given)
    done = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True,
                          env=env, timeout=60, check=True)
    return probe.values_of(done.stdout)


def _path_without_srt() -> str:
    return os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                           if not os.path.exists(os.path.join(p, "srt")))


@pytest.mark.skipif(SRT is None or cage.missing(dict(os.environ)) != [],
                    reason="the cage cannot run on this machine (scripts/test installs it)")
def test_the_hosts_probe_says_what_the_cage_lacks_and_finds_the_recorded_srt(
        tmp_path: Path) -> None:
    assert SRT is not None
    env = dict(os.environ, PATH=_path_without_srt())
    env.pop(cage.SRT_ENV, None)
    data_dir = tmp_path / "host-data"
    data_dir.mkdir()
    values = _probe(data_dir, env)
    assert values["cage_srt"] == ""
    assert values["cage_userns"] == "yes"  # bubblewrap made its user namespace
    assert values["cage_bwrap"] and values["cage_socat"] and values["cage_rg"]
    assert remote_cage.lacks(values) == [f"srt ({remote_cage.SRT_PACKAGE})"]
    ok, found, fix = remote_cage.check(values, name="box", setting=None)
    assert not ok and "it lacks srt" in found
    assert "`fleet-tui host check box --yes` installs srt there" in fix
    assert 'cage = "off" in [hosts.box]' in fix
    # the host's side agrees, and a caged spec is refused there in one line
    spec: dict[str, object] = {"settings": {"cage": "worker"}, "env": {}}
    why = hostcage.into_spec(spec, str(data_dir), env=env)
    assert why.startswith("the cage cannot run there: it lacks srt"), why
    # `--yes` records the srt it installed or found: the probe and the host's side read it
    subprocess.run(["sh", "-s"], input=remote_cage.record_script(str(data_dir), SRT).encode(),
                   env=env, check=True, timeout=30)
    values = _probe(data_dir, env)
    assert values["cage_srt"] == SRT and values["cage_srt_version"] == cage.SRT_VERSION
    assert remote_cage.lacks(values) == []
    assert remote_cage.check(values, name="box", setting=None)[0]
    assert hostcage.into_spec(spec, str(data_dir), env=env) == ""
    assert spec["env"] == {cage.SRT_ENV: SRT}
    # an uncaged spec is left as it is
    plain: dict[str, object] = {"settings": {"cage": "off"}}
    assert hostcage.into_spec(plain, str(data_dir), env=env) == "" and "env" not in plain
    # a Ray host's `srt` setting: an npm prefix holding it
    prefix = Path(SRT).parents[2]
    assert _probe(tmp_path / "elsewhere", env, str(prefix))["cage_srt"] == SRT


def test_a_probe_without_bubblewrap_or_node_says_how_to_get_them() -> None:
    values = {"cage_node": "v18.19.0", "cage_bwrap": "", "cage_socat": "/usr/bin/socat",
              "cage_rg": "", "cage_srt": "/x/srt", "cage_srt_version": "0.0.70"}
    lacking = remote_cage.lacks(values)
    assert lacking == ["node 20.0 or newer (it has 18.19.0)", "bwrap (`apt install bubblewrap`)",
                       "rg (`apt install ripgrep`)",
                       f"srt {cage.SRT_VERSION} (it has 0.0.70 at /x/srt)"]
    no_userns = dict(values, cage_node="v20.1.0", cage_bwrap="/usr/bin/bwrap", cage_rg="/r",
                     cage_srt_version=cage.SRT_VERSION,
                     cage_userns="no: bwrap: No permissions to create new namespace")
    (only,) = remote_cage.lacks(no_userns)
    assert only.startswith("user namespaces for its user (bwrap: No permissions")
    ok, found, _fix = remote_cage.check(no_userns, name="box", setting="off")
    assert ok and "uncaged" in found


def _config(text: str) -> None:
    path = config_file_path(os.environ)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_caged_task_for_a_host_unchecked_or_that_cannot_cage_is_refused_before_anything_exists(
        git_repo: Path) -> None:
    _config('[hosts.box]\nssh = "box.invalid"\n')
    env = dict(os.environ, ANTHROPIC_AUTH_TOKEN="sk-remote-cage-refusal-1",
               FLEET_WORKER_GATEWAY="1")  # the key stays here: a host needs the gateway
    out = fleet_tui(git_repo, "run", "hello", "--host", "box", env=env)
    assert_one_clear_line(out, 2, "host box has not been checked for the cage",
                          "`fleet-tui host check box --yes`", 'cage = "off" in [hosts.box]')
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert_nothing_created(git_repo)
    # its last check said it cannot cage: that is said, with the fix
    remote_cage.remember("box", False, "cannot cage its workers: it lacks bwrap (`apt "
                         "install bubblewrap`)", "install them there; or set cage = \"off\" "
                         "in [hosts.box] to run its workers uncaged")
    out = fleet_tui(git_repo, "run", "hello", "--host", "box", env=env)
    assert_one_clear_line(out, 2, "host box cannot cage its workers: it lacks bwrap",
                          "apt install bubblewrap", 'cage = "off" in [hosts.box]')
    assert_nothing_created(git_repo)
    # uncaged by the settings (the host's own, or the task's): taken (its start is
    # another matter: box.invalid is nowhere), marked uncaged
    from fleet_tui.engine.fleet import Fleet, TaskSpec
    from fleet_tui.settings.config import load_settings
    from fleet_tui.store.db import Store
    from fleet_tui.system import paths

    on = env
    for config, run_env in (('[hosts.box]\nssh = "box.invalid"\ncage = "off"\n', on),
                            ('[hosts.box]\nssh = "box.invalid"\n',
                             dict(on, FLEET_WORKER_CAGE="off"))):
        _config(config)
        fleet = Fleet(load_settings(env=run_env), Store(paths.db_path()), env=run_env)
        (task,) = fleet.submit(TaskSpec(prompt="hello", repo=git_repo, host="box"))
        assert fleet.get_task(task.id).host == "box"
