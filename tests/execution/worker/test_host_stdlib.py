"""The code that runs on a host needs nothing but the host's python and its standard
library: the runner, the SSH agent and the Ray job's entrypoint each run here with the
distribution's python3 as `python3 -I -S` (no site-packages, no user site, no
PYTHONPATH) and the package copy a host gets (`package_tar`, unpacked) alone on the path,
driving the real claude against the scripted endpoint.

Also: the host's claude is the host's (execution/worker/hostclaude.py): the agent and the job
find it there, and a host without one says so in one line (never a traceback).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.execution.host import Placement
from fleet_tui.execution.ray.host import RayHost
from fleet_tui.execution.ssh.host import package_tar
from fleet_tui.execution.worker import cage, hostcage, hostclaude, job, unpack
from fleet_tui.execution.worker.attemptlog import AttemptLog
from fleet_tui.execution.worker.spec import RunSpec

HOST_PYTHON = "/usr/bin/python3"
KEY = "sk-stdlib-test-SECRET-51c2"
RUNNER = "fleet_tui.execution.worker.runner"
AGENT = "fleet_tui.execution.worker.agent"
JOB = "fleet_tui.execution.worker.job"
# `python3 -I -S -c BOOT PKG MODULE ARGS...`: the package copy alone on the path, then the
# module run as `-m` would (-I ignores PYTHONPATH, so the path is given this way)
BOOT = ("import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); m = sys.argv.pop(1); "
        "sys.argv[0] = m; runpy.run_module(m, run_name='__main__', alter_sys=True)")
WRITER = [[{"type": "tool_use", "name": "Bash",
            "input": {"command": "echo host > host.txt", "description": "write"}}],
          "wrote host.txt"]
BARE_PATH = "/usr/bin:/bin"  # the distribution's PATH: no claude in it


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package as a host gets it (what SshHost.install unpacks there)."""
    if not os.access(HOST_PYTHON, os.X_OK):
        pytest.skip(f"{HOST_PYTHON} (the distribution's python3) is not installed")
    root = tmp_path_factory.mktemp("pkg")
    with tarfile.open(fileobj=io.BytesIO(package_tar()[1])) as tar:
        unpack.extract(tar, root)
    return root


@pytest.fixture(scope="module")
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint({"default": WRITER}) as ep:
        yield ep


def isolated(package: Path, module: str, *args: str) -> list[str]:
    return [HOST_PYTHON, "-I", "-S", "-c", BOOT, str(package), module, *args]


def host_env(tmp_path: Path, path: str) -> dict[str, str]:
    """A host's environment: its own HOME and PATH, nothing of this machine's Python."""
    home = tmp_path / "host-home"
    home.mkdir(exist_ok=True)
    return {"HOME": str(home), "PATH": path, "LANG": "C.UTF-8", "CLAUDE_CODE_MAX_RETRIES": "0",
            "FLEET_WORKER_KEY_SOURCES": "env"}


def a_spec(tmp_path: Path, url: str, claude: str | None, cage_mode: str | None = None
           ) -> RunSpec:
    """An attempt's spec; `cage_mode` None: the runner's default (the cage)."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    settings: dict[str, object] = {"base_url": url, "sandbox": os.geteuid() == 0,
                                   "key_sources": ["env"]}
    if cage_mode is not None:
        settings["cage"] = cage_mode
    if claude is not None:
        settings["claude"] = claude
    return RunSpec(cwd=str(work), prompt="write it", config_dir=str(tmp_path / "cfg"),
                   # a token of its own: a runner's sweep by token must not end the run
                   # of a test beside it (under -n 2, a claude ended with 143)
                   settings=settings, task_id="t1", attempt=1,
                   token=f"tok-stdlib-{os.getpid()}-{tmp_path.name}",
                   kill_grace=2.0)


def wait_for(pred, timeout: float = 90.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return bool(pred())


def no_traceback(*texts: str) -> None:
    for text in texts:
        assert "Traceback" not in text and "ModuleNotFoundError" not in text, text[-2000:]


def test_the_runner_says_claude_is_missing_without_a_traceback(package: Path,
                                                              tmp_path: Path) -> None:
    """On a host whose PATH has no claude the runner reached fleet-tui's data folder
    through platformdirs: ModuleNotFoundError on the distribution's python3."""
    adir = tmp_path / "attempt"
    adir.mkdir()
    (adir / "spec.json").write_text(a_spec(tmp_path, "http://127.0.0.1:9", "claude",
                                           "off").to_json())
    done = subprocess.run(isolated(package, RUNNER, str(adir)), capture_output=True,
                          text=True, env=dict(host_env(tmp_path, BARE_PATH),
                                              ANTHROPIC_AUTH_TOKEN=KEY), timeout=60)
    no_traceback(done.stdout, done.stderr)
    record = json.loads((adir / "exit.json").read_text())
    assert record["exit_code"] != 0
    assert "claude not found" in record["error"] and "\n" not in record["error"].strip()


def test_the_runner_runs_claude_on_the_standard_library(package: Path, tmp_path: Path,
                                                        claude_bin: str,
                                                        endpoint: ScriptedEndpoint) -> None:
    adir = tmp_path / "attempt"
    adir.mkdir()
    (adir / "spec.json").write_text(a_spec(tmp_path, endpoint.url, claude_bin).to_json())
    # caged (the default): the cage's own code runs on the standard library too
    done = subprocess.run(isolated(package, RUNNER, str(adir)), capture_output=True,
                          text=True, env=dict(host_env(tmp_path, BARE_PATH),
                                              ANTHROPIC_AUTH_TOKEN=KEY,
                                              FLEET_WORKER_SRT=host_srt()), timeout=120)
    no_traceback(done.stdout, done.stderr)
    record = json.loads((adir / "exit.json").read_text())
    assert record["exit_code"] == 0, record
    assert (adir / "cage.json").exists()
    assert b"wrote host.txt" in (adir / "events.jsonl").read_bytes()
    assert (tmp_path / "work" / "host.txt").read_text() == "host\n"


def host_srt() -> str:
    """The srt the tests installed, as a host's (scripts/test puts it in .srt/)."""
    found = cage.find_srt(os.environ)
    if found is None:
        pytest.fail("no srt here (scripts/test installs it into .srt/)")
    return found


def agent(package: Path, env: dict[str, str], *args: str,
          stdin: bytes = b"") -> tuple[int, dict[str, object], str]:
    done = subprocess.run(isolated(package, AGENT, *args), input=stdin, capture_output=True,
                          env=env, timeout=60)
    out = done.stdout.decode().strip().splitlines()
    return done.returncode, (json.loads(out[-1]) if out else {}), done.stderr.decode()


def test_the_agent_finds_the_hosts_claude_and_runs_it(package: Path, tmp_path: Path,
                                                     claude_bin: str,
                                                     endpoint: ScriptedEndpoint) -> None:
    """The agent stages and spawns with -I -S; its runner starts without the site module
    too. The controller names no claude: the host's own is found on the host's PATH; nor
    srt: the host's own is the one `host check` recorded there, and its worker is caged."""
    data = tmp_path / "data"
    data.mkdir()
    (data / hostcage.RECORD).write_text(host_srt() + "\n")
    folder = AttemptLog(data / "attempts" / "t1" / "1")
    env = host_env(tmp_path, f"{Path(claude_bin).parent}:{BARE_PATH}")
    spec = a_spec(tmp_path, endpoint.url, None)
    order = {"spec": json.loads(spec.to_json()), "config_dir": spec.config_dir,
             "set_up_after": True, "data_dir": str(data)}
    code, answer, err = agent(package, env, "stage", str(folder.dir),
                              stdin=json.dumps(order).encode() + b"\n")
    no_traceback(err)
    assert code == 0, (answer, err)
    assert answer["claude"] == str(Path(claude_bin).parent / "claude")
    assert answer["claude_version"] == subprocess.run(
        [claude_bin, "--version"], capture_output=True, text=True).stdout.split()[0]
    code, answer, err = agent(package, env, "spawn", str(folder.dir),
                              stdin=json.dumps({"env": {}, "keys": {
                                  "ANTHROPIC_AUTH_TOKEN": KEY}}).encode())
    no_traceback(err)
    assert code == 0 and int(str(answer["pid"])) > 0, (answer, err)
    assert wait_for(lambda: folder.exited)
    record = json.loads(folder.exit_path.read_text())
    no_traceback(folder.runner_log.read_text())
    assert record["exit_code"] == 0, record
    assert b"wrote host.txt" in folder.events.read_bytes()
    assert (folder.dir / "cage.json").exists()


def test_a_host_without_claude_says_so_in_one_line(package: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    folder = AttemptLog(data / "attempts" / "t1" / "1")
    spec = a_spec(tmp_path, "http://127.0.0.1:9", None)
    order = {"spec": json.loads(spec.to_json()), "config_dir": spec.config_dir,
             "set_up_after": True, "data_dir": str(data)}
    code, answer, err = agent(package, host_env(tmp_path, BARE_PATH), "stage",
                              str(folder.dir), stdin=json.dumps(order).encode() + b"\n")
    no_traceback(err)
    assert code == 3
    error = str(answer["error"])
    assert error.startswith("no claude there:") and "\n" not in error
    assert f"not in {data}/claude-cli" in error and "'claude' is not on PATH" in error
    assert not folder.spec_path.exists()  # refused before anything of the attempt


def test_the_record_of_host_check_comes_first(tmp_path: Path, claude_bin: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / hostclaude.RECORD).write_text(claude_bin + "\n")
    assert hostclaude.find(str(data), path=BARE_PATH) == (claude_bin, [])
    Path(data / hostclaude.RECORD).write_text(str(tmp_path / "gone") + "\n")
    found, looked = hostclaude.find(str(data), path=BARE_PATH)
    assert found is None and "(recorded by `host check`) is gone" in looked[0]


def _ray_job(package: Path, tmp_path: Path, git_repo: Path, url: str,
             path: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, object]], Path]:
    """The job's entrypoint as a node runs it (the cluster left out: its working dir is
    the staging folder the controller ships), with the node's PATH `path`."""
    node = tmp_path / "node"
    host = RayHost(name="c", address="http://127.0.0.1:1", env=dict(os.environ),
                   data_dir=str(node), srt=host_srt())
    base = subprocess.run(["git", "-C", str(git_repo), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    adir = tmp_path / "here" / "attempt"
    adir.mkdir(parents=True)
    worktree = host.worktree_path("t1")
    placement = Placement(host="c", worktree=Path(worktree), branch="fleet/t1",
                          base_commit=base, base_branch="main",
                          config_dir=Path(f"{node}/config/t1"), attempt_dir=adir)
    spec = RunSpec(cwd=worktree, prompt="write it", config_dir=f"{node}/config/t1",
                   settings={"base_url": url, "sandbox": os.geteuid() == 0,
                             "key_sources": ["env"], "claude": "/nowhere/of/this/machine"},
                   task_id="t1", attempt=1, token="tok-ray-" + os.urandom(6).hex(), kill_grace=2.0,
                   repo=str(git_repo))
    staged = host.stage(placement, spec)
    try:
        order = dict(staged.order, env={}, keys={"ANTHROPIC_AUTH_TOKEN": KEY})
        assert "claude" not in order["spec"]["settings"]  # this machine's is never sent
        (staged.staging / job.ORDER_FILE).write_text(json.dumps(order))
        done = subprocess.run(isolated(package, JOB, str(staged.staging)),
                              capture_output=True, text=True, timeout=180,
                              env=host_env(tmp_path, path))
    finally:
        staged.abandon()
    no_traceback(done.stderr)
    heads = [f[0] for f in map(job.decode_frame, done.stdout.splitlines()) if f is not None]
    return done, heads, node


def test_the_ray_jobs_entrypoint_runs_on_the_standard_library(
        package: Path, tmp_path: Path, git_repo: Path, claude_bin: str,
        endpoint: ScriptedEndpoint) -> None:
    """Its claude the node's own, found on the node's PATH."""
    _done, heads, node = _ray_job(package, tmp_path, git_repo, endpoint.url,
                                  f"{Path(claude_bin).parent}:{BARE_PATH}")
    assert not any("error" in h for h in heads), heads
    assert heads and heads[-1].get("end"), heads[-3:]
    folder = AttemptLog(f"{node}/attempts/t1/1")
    assert json.loads(folder.exit_path.read_text())["exit_code"] == 0
    assert b"wrote host.txt" in folder.events.read_bytes()
    assert (folder.dir / "cage.json").exists()  # caged, with the srt the host's settings name
    no_traceback(folder.runner_log.read_text())


def test_the_data_folder_is_platformdirs_own_without_importing_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """paths.home computes what platformdirs does on Linux (so the host's runner, which
    reaches it, needs no third-party package), with and without XDG_DATA_HOME."""
    platformdirs = pytest.importorskip("platformdirs")
    from fleet_tui.system import paths

    monkeypatch.delenv("FLEET_TUI_HOME", raising=False)
    for xdg in (None, str(tmp_path / "xdg")):
        if xdg is None:
            monkeypatch.delenv("XDG_DATA_HOME", raising=False)
        else:
            monkeypatch.setenv("XDG_DATA_HOME", xdg)
        assert paths.home({}) == platformdirs.user_data_path("fleet-tui")


def test_a_node_without_claude_fails_the_job_saying_so(package: Path, tmp_path: Path,
                                                      git_repo: Path) -> None:
    done, heads, node = _ray_job(package, tmp_path, git_repo, "http://127.0.0.1:9", BARE_PATH)
    errors = [str(h["error"]) for h in heads if "error" in h]
    assert done.returncode == 1 and len(errors) == 1, (heads, done.stderr)
    assert errors[0].startswith("no claude on node ") and "\n" not in errors[0]
    assert "'claude' is not on PATH" in errors[0]
    assert "set `claude` in the host's [hosts] table" in errors[0]
    assert not (node / "attempts" / "t1" / "1" / "spec.json").exists()  # no runner started


# What the worker may load of the package besides itself: the package's and the layers'
# folders, core/ and system/, and the launch's settings (its one way up, ARCHITECTURE.md)
WORKER_MAY_LOAD = ("fleet_tui", "fleet_tui.execution", "fleet_tui.execution.worker",
                   "fleet_tui.core", "fleet_tui.system", "fleet_tui.settings",
                   "fleet_tui.settings.config_core", "fleet_tui.settings.credentials")
IMPORT_ALL = """import importlib, json, sys, sysconfig
sys.path.insert(0, sys.argv[1])
for name in sys.argv[2:]:
    importlib.import_module(name)
stdlib = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
outside = sorted(n for n, m in sys.modules.items() if getattr(m, "__file__", None)
                 and not m.__file__.startswith((sys.argv[1], *stdlib)))
ours = sorted(n for n in sys.modules if n.startswith("fleet_tui"))
print(json.dumps({"outside": outside, "ours": ours}))
"""


def test_every_module_of_the_worker_imports_on_the_standard_library(package: Path) -> None:
    """Each module under execution/worker imports with the distribution's python3 as
    `python3 -I -S` and the package copy alone on the path, loading nothing but the
    standard library and, of the package, what the worker may import."""
    folder = package / "fleet_tui" / "execution" / "worker"
    modules = sorted(f"fleet_tui.execution.worker.{p.stem}" for p in folder.glob("*.py")
                     if p.stem != "__init__")
    assert {"fleet_tui.execution.worker.runner", "fleet_tui.execution.worker.agent",
            "fleet_tui.execution.worker.job", "fleet_tui.execution.worker.launch"} <= set(modules)
    done = subprocess.run([HOST_PYTHON, "-I", "-S", "-c", IMPORT_ALL, str(package), *modules],
                          capture_output=True, text=True, timeout=60, env={"PATH": BARE_PATH})
    no_traceback(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout)
    assert loaded["outside"] == []
    assert set(modules) <= set(loaded["ours"])
    beyond = [n for n in loaded["ours"] if not (n in WORKER_MAY_LOAD or n.startswith(
        ("fleet_tui.execution.worker.", "fleet_tui.core.", "fleet_tui.system.")))]
    assert beyond == []
