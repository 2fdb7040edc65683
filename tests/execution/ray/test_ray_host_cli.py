"""A Ray host in config.toml and the CLI: `host add NAME --ray ADDRESS
[--resources JSON] [--max-workers N]`, `host check` of a Ray host, the table's checks, and
the start that would send the key to the cluster refused. No cluster is needed here: a
check of an address nothing answers on says so, with the fix, and a start on a cluster that
takes the connection and never answers ends failed; tests/execution/ray/test_ray_host.py runs
the real cluster.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from endpoint_helpers import run_cli
from ports import hold_port, silent_port
from test_host_cli import env_of

from fleet_tui.core.errors import FleetError
from fleet_tui.execution.hosts import Hosts
from fleet_tui.execution.ray.config import options as ray_options
from fleet_tui.settings.config_core import ConfigError
from fleet_tui.settings.hosts import host_from_table, host_table, read_hosts


def test_host_add_ray_writes_its_table_and_check_says_unreachable(tmp_path: Path) -> None:
    env = env_of(tmp_path)
    config = tmp_path / "config.toml"
    with hold_port() as port:  # nothing answers there for the whole test
        address = f"http://127.0.0.1:{port}"
        added = run_cli(env, tmp_path, "host", "add", "gpu", "--ray", address, "--resources",
                        '{"gpu_box": 1, "mem.big": 0.5}', "--max-workers", "3")
        assert added.returncode == 0, added.stderr
        assert f"added host gpu: Ray cluster {address}, resources gpu_box=1, mem.big=0.5, " \
               "max_workers 3" in added.stdout
        text = config.read_text()
        assert text == (f'[hosts.gpu]\nray = "{address}"\n'
                        'resources = { gpu_box = 1, "mem.big" = 0.5 }\nmax_workers = 3\n')
        (host,) = read_hosts(str(config), object())
        assert host.kind == "ray" and not host.is_local
        assert ray_options(host).resources == {"gpu_box": 1.0, "mem.big": 0.5}
        listed = run_cli(env, tmp_path, "host", "ls")
        assert listed.stdout.splitlines()[2].split() == ["gpu", address, "0/3", "0", "here"]
        checked = run_cli(env, tmp_path, "host", "check", "gpu")
        assert checked.returncode == 1
        assert f"FAIL  reachable  {address} does not answer" in checked.stdout
        assert "fix: check the address" in checked.stdout
        assert "Traceback" not in checked.stdout + checked.stderr


@pytest.mark.parametrize(("args", "said"), [
    (["--ray", "ftp://head:8265"], "is not a Ray Jobs address"),
    (["--ray", "http://head:8265/x"], "is not a Ray Jobs address"),
    (["--ray", "http://head:8265", "--resources", "{nope"], "--resources: not JSON"),
    (["--ray", "http://head:8265", "--resources", '{"x": 0}'], "expected an amount > 0"),
    (["--ray", "http://head:8265", "--resources", "[1]"], "expected a table"),
    (["--ray", "http://head:8265", "--key-on-host"], "has no ssh target"),
    (["box", "--resources", '{"x": 1}'], "--resources is for a Ray host"),
    ([], "give an ssh target (user@host) or --ray ADDRESS"),
])
def test_bad_ray_hosts_are_refused_and_nothing_written(tmp_path: Path, args: list[str],
                                                        said: str) -> None:
    env = env_of(tmp_path)
    done = run_cli(env, tmp_path, "host", "add", "gpu", *args)
    assert done.returncode == 2, done.stdout
    assert said in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "config.toml").exists()


def test_the_table_reads_back_and_builds_a_ray_host(tmp_path: Path) -> None:
    table = {"ray": "https://head.example:8265", "resources": {"a": 2}, "max_workers": 5,
             "data_dir": "/srv/fleet", "python": "/usr/bin/python3.12",
             "claude": "/opt/claude", "key_env": "TEAM_KEY", "gateway_host": "10.1.2.3"}
    host = host_from_table("c", table, "t", 4)
    (tmp_path / "c.toml").write_text(host_table(host))
    (again,) = read_hosts(str(tmp_path / "c.toml"), object())
    assert again == host
    built = Hosts((host,), env={}, python="python3").get("c")
    assert type(built).__name__ == "RayHost"
    assert built.name == "c" and built.reaches_gateway is False  # the nodes hold the key
    for bad, said in ((dict(table, data_dir="rel"), "absolute path"),
                      (dict(table, key_env="A-B"), "name of an environment variable"),
                      (dict(table, port=22), "unknown setting 'port'")):
        with pytest.raises(ConfigError, match=said):
            host_from_table("c", bad, "t", 4)


def test_a_start_that_would_send_the_key_is_refused(tmp_path: Path) -> None:
    """Without the gateway (a plain key in the runner's environment) and without key_env,
    the Ray host refuses before anything reaches a cluster (none answers here)."""
    from fleet_tui.execution.ray.host import RayHost, RayStaged

    host = RayHost(name="c", address="http://127.0.0.1:9", env={})  # never reached
    staged = RayStaged(host, None, None, tmp_path, {})  # type: ignore[arg-type]
    with pytest.raises(FleetError, match="would send the key") as exc:
        staged.spawn({"ANTHROPIC_API_KEY": "sk-plain-key-1234"})
    assert "sk-plain-key-1234" not in str(exc.value)
    assert not tmp_path.exists()  # the job's folder went


def test_run_without_the_gateway_on_a_cluster_without_key_env_creates_nothing(
        tmp_path: Path, git_repo: Path, claude_bin: str) -> None:
    """The gateway off and no key_env: each start would send the key to the cluster, so
    `run --host` is refused at once, with both ways out, and no task is made (it was
    made, queued, and failed at its start)."""
    env = env_of(tmp_path, FLEET_WORKER_KEY_SOURCES="env", ANTHROPIC_AUTH_TOKEN="sk-x-key-77",
                 FLEET_WORKER_CLAUDE=claude_bin, FLEET_WORKER_GATEWAY="0")
    with silent_port() as port:  # nothing is asked of the cluster
        added = run_cli(env, tmp_path, "host", "add", "cluster", "--ray",
                        f"http://127.0.0.1:{port}")
        assert added.returncode == 0, added.stderr
        with (tmp_path / "config.toml").open("a") as fh:
            fh.write('cage = "off"\n')  # not this test's refusal
        out = run_cli(env, git_repo, "run", "do it", "--host", "cluster")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "would send the key" in out.stderr, out.stderr
    assert "gateway = true" in out.stderr and "key_env" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "sk-x-key-77" not in out.stderr + out.stdout
    assert json.loads(run_cli(env, git_repo, "ls", "--json").stdout) == []


@pytest.mark.long
def test_a_cluster_that_takes_the_connection_and_never_answers_fails_the_start(
        tmp_path: Path, git_repo: Path) -> None:
    """A dashboard that accepts and never answers (hung, or another service on that port):
    `run --host` ends with the task failed, saying which cluster and how long it was given,
    and no task is left running. Ray's Jobs client gives its requests no time limit of its
    own: this start held `run` (and the engine's pass) for ever, the task shown running."""
    pytest.importorskip("ray.job_submission")
    from fleet_tui.execution.ray.host import ANSWER_WAIT

    # the gateway on (a Ray host's workers reach the endpoint through it: the key stays here)
    env = env_of(tmp_path, ANTHROPIC_AUTH_TOKEN="sk-never-sent-1234", FLEET_WORKER_SANDBOX="1",
                 FLEET_WORKER_GATEWAY="1")
    with silent_port() as port:
        address = f"http://127.0.0.1:{port}"
        added = run_cli(env, tmp_path, "host", "add", "cluster", "--ray", address)
        assert added.returncode == 0, added.stderr
        with (tmp_path / "config.toml").open("a") as fh:
            fh.write('cage = "off"\n')  # the cage's probe would meet the same silence first
        try:
            began = time.monotonic()
            started = run_cli(env, git_repo, "run", "say hello", "--host", "cluster",
                              timeout=ANSWER_WAIT[0] + ANSWER_WAIT[1] + 90)
            took = time.monotonic() - began
            listed = run_cli(env, git_repo, "ls", "--json")
        finally:
            run_cli(env, git_repo, "gateway", "stop")
    assert started.returncode == 0, started.stderr
    said = f"the Ray cluster at {address} does not answer: connected, and no answer within " \
        f"{ANSWER_WAIT[1]:g} s"
    assert said in started.stderr
    assert "running in the background" not in started.stderr  # nothing is
    (task,) = json.loads(listed.stdout)
    assert task["state"] == "failed" and said in task["message"], task
    assert took >= ANSWER_WAIT[1]  # it waited the time it says, not less
