"""The cage's rules (execution/worker/cage.py), as srt settings, and the Seatbelt profile srt
generates from them for macOS (generated here on Linux by srt's own code; no Mac runs it).
The rules are proved on a real worker by tests/execution/local/test_cage.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from fleet_tui.execution.worker import cage
from fleet_tui.settings.config_core import ConfigError, load_launch_settings
from fleet_tui.settings.repo_settings import load_repo_settings

SRT = cage.find_srt(os.environ)


def _layout(tmp_path: Path) -> dict[str, str]:
    """A home with credentials and a toolchain, a repository with two worktrees, fleet-tui's
    data folder with the task's config dir."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("key")
    (home / ".cargo" / "bin").mkdir(parents=True)
    (home / ".cargo" / "credentials.toml").write_text("token")
    repo = tmp_path / "src" / "repo"
    (repo / ".git" / "worktrees" / "t1").mkdir(parents=True)
    (repo / ".git" / "worktrees" / "t2").mkdir(parents=True)
    for name in ("objects", "refs", "logs", "hooks", "info"):
        (repo / ".git" / name).mkdir()
    (repo / ".git" / "config").write_text("")
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    worktree = repo / ".fleet-work" / "t1"
    worktree.mkdir(parents=True)
    (worktree / ".git").write_text(f"gitdir: {repo / '.git' / 'worktrees' / 't1'}\n")
    (repo / ".git" / "worktrees" / "t1" / "commondir").write_text("../..\n")
    data = tmp_path / "data"
    (data / "config" / "t1").mkdir(parents=True)
    cache = data / "cache" / "abc"
    cache.mkdir(parents=True)
    return {"home": str(home), "repo": str(repo), "worktree": str(worktree),
            "data": str(data), "config": str(data / "config" / "t1"), "cache": str(cache)}


def _policy(tmp_path: Path, system: str = "linux") -> tuple[dict[str, str], dict]:  # type: ignore[type-arg]
    where = _layout(tmp_path)
    env = {"HOME": where["home"], "PATH": f"{where['home']}/.cargo/bin:/usr/bin:/bin"}
    rules = cage.policy(worktree=where["worktree"], config_dir=where["config"],
                        repo=where["repo"], env=env, base_url="http://127.0.0.1:4711/e/x",
                        allow_hosts=("pypi.org", "127.0.0.1:9000"), data_dir=where["data"],
                        cache_dir=where["cache"], srt_dir=str(tmp_path),
                        argv0="/usr/bin/true", system=system)
    return where, rules


def test_the_rules_hide_the_home_and_other_worktrees_and_open_only_the_work(
        tmp_path: Path) -> None:
    where, rules = _policy(tmp_path)
    fs = rules["srt"]["filesystem"]
    git = f"{where['repo']}/.git"
    assert where["home"] in fs["denyRead"] and "/tmp" in fs["denyRead"]
    assert where["repo"] in fs["denyRead"] and where["data"] in fs["denyRead"]
    # credentials stay hidden even inside a toolchain folder that is shown
    assert f"{where['home']}/.cargo" in fs["allowRead"]
    assert f"{where['home']}/.cargo/credentials.toml" in fs["denyRead"]
    assert f"{where['home']}/.ssh" in fs["denyRead"]
    assert not any(p.startswith(f"{where['home']}/.ssh") for p in fs["allowRead"])
    # writable: the work, and a commit's side of the git folder; no other worktree's
    assert sorted(fs["allowWrite"]) == sorted([
        where["worktree"], where["config"], where["cache"], f"{git}/objects", f"{git}/refs",
        f"{git}/logs", f"{git}/worktrees/t1"])
    assert f"{git}/hooks" in fs["allowRead"] and f"{git}/config" in fs["allowRead"]
    assert not any("worktrees/t2" in p for p in fs["allowRead"] + fs["allowWrite"])
    assert rules["srt"]["network"]["allowedDomains"] == ["127.0.0.1:4711", "pypi.org",
                                                          "127.0.0.1:9000"]
    assert rules["tmpdir"] == "/tmp"


def test_the_endpoint_is_host_and_port() -> None:
    assert cage.endpoint_host("https://api.z.ai/api/anthropic") == "api.z.ai:443"
    assert cage.endpoint_host("http://127.0.0.1:8080/e/name") == "127.0.0.1:8080"
    assert cage.endpoint_host("http://[::1]:9/x") == "[::1]:9"
    assert cage.endpoint_host("http://user@host") == "host:80"


def test_a_local_endpoint_is_bridged_into_the_cage_and_named_alone_in_no_proxy(
        tmp_path: Path) -> None:
    """The worker's endpoint on this machine (the gateway) is reached over a socket bridged
    into the cage, not srt's proxy (whose 502 for a refused connection reads as an
    overload): the rules name it, and NO_PROXY names only its host:port inside. A remote
    endpoint goes through the proxy (no bridge); on macOS there is no namespace to bridge."""
    _where, rules = _policy(tmp_path)
    assert rules["bridge"] == {"host": "127.0.0.1", "port": 4711}
    assert rules["set_env"] == {"NO_PROXY": "127.0.0.1:4711", "no_proxy": "127.0.0.1:4711"}
    assert "bridge" not in _policy(tmp_path / "mac", system="darwin")[1]
    assert cage.loopback_endpoint("http://localhost:8080/x") == ("localhost", 8080)
    assert cage.loopback_endpoint("http://127.0.0.1/") == ("127.0.0.1", 80)
    for remote in ("https://api.z.ai/api/anthropic", "http://10.0.0.2:80", "http://[::1]:9",
                   "http://127.example:1"):
        assert cage.loopback_endpoint(remote) is None, remote


def test_the_runner_starts_the_cage_host_early_when_the_worker_will_be_caged() -> None:
    """The guess the runner makes before its settings are loaded (they decide after)."""
    assert cage.wanted({}, {}, system="linux") and not cage.wanted({}, {}, system="win32")
    assert not cage.wanted({"cage": "off"}, {}, system="linux")
    assert not cage.wanted({}, {"FLEET_WORKER_CAGE": "off"}, system="linux")
    assert cage.wanted({"cage": "worker"}, {"FLEET_WORKER_CAGE": "off"}, system="linux")


def test_settings_cage_and_hosts(tmp_path: Path) -> None:
    default = load_launch_settings(env={"HOME": str(tmp_path)}, config_file=os.devnull)
    assert default.cage == "worker" and "pypi.org" in default.allow_hosts
    off = load_launch_settings(env={"FLEET_WORKER_CAGE": "off",
                                    "FLEET_WORKER_ALLOW_HOSTS": "a.example, b.example:8443"},
                               config_file=os.devnull)
    assert (off.cage, off.allow_hosts) == ("off", ("a.example", "b.example:8443"))
    with pytest.raises(ConfigError, match="cage mode"):
        load_launch_settings(env={"FLEET_WORKER_CAGE": "maybe"}, config_file=os.devnull)
    with pytest.raises(ConfigError, match="not a host name"):
        load_launch_settings(env={"FLEET_WORKER_ALLOW_HOSTS": "https://x/y"},
                             config_file=os.devnull)


def test_a_repository_names_its_hosts_but_only_the_user_turns_its_cage_off(
        tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / ".fleet-tui.toml").write_text('[sandbox]\nallow_hosts = ["npm.example"]\n')
    config = tmp_path / "config.toml"
    config.write_text("")
    got = load_repo_settings(repo, str(config))
    assert (got.cage, got.allow_hosts) == (None, ("npm.example",))
    (repo / ".fleet-tui.toml").write_text('cage = "off"\n')
    with pytest.raises(ConfigError, match="cannot set its cage"):
        load_repo_settings(repo, str(config))
    (repo / ".fleet-tui.toml").write_text("")
    config.write_text(f'[repos."{repo}"]\ncage = "off"\n')
    assert load_repo_settings(repo, str(config)).cage == "off"


MAC_SCRIPT = """
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
const [srt, rulesPath] = process.argv.slice(2);
const { wrapCommandWithSandboxMacOS } = await import(
  join(srt, 'dist', 'sandbox', 'macos-sandbox-utils.js'));
const fs = JSON.parse(readFileSync(rulesPath, 'utf8')).srt.filesystem;
process.stdout.write(wrapCommandWithSandboxMacOS({
  command: 'claude -p', needsNetworkRestriction: true, httpProxyPort: 3128,
  socksProxyPort: 1080, proxyAuthToken: 'token', binShell: 'bash',
  readConfig: { denyOnly: fs.denyRead, allowWithinDeny: fs.allowRead },
  writeConfig: { allowOnly: fs.allowWrite, denyWithinAllow: fs.denyWrite } }));
"""


@pytest.mark.skipif(SRT is None or shutil.which("node") is None,
                    reason="needs node and srt (scripts/test installs srt into .srt/)")
def test_the_seatbelt_profile_srt_makes_of_the_rules(tmp_path: Path) -> None:
    """macOS: the same rules as a Seatbelt profile, generated by srt (untested on a Mac):
    reads of the home denied with the work re-allowed, writes only to the work and the
    worker's own temp folder, the network only to srt's proxy."""
    where, rules = _policy(tmp_path, system="darwin")
    assert "/tmp" not in rules["srt"]["filesystem"]["denyRead"]
    assert rules["tmpdir"] == os.path.join(where["config"], "tmp")
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(rules))
    script = tmp_path / "mac.mjs"
    script.write_text(MAC_SCRIPT)
    out = subprocess.run(["node", str(script), str(SRT), str(path)], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert "/usr/bin/sandbox-exec -p" in out and "(deny default" in out
    profile = out.replace("'\"'\"'", "'")
    assert f'(deny file-read* (subpath "{where["home"]}")' in profile.replace("\n", " ") \
        or f'(subpath "{where["home"]}")' in profile
    for folder in (where["worktree"], where["config"], rules["tmpdir"]):
        assert f'(subpath "{folder}")' in profile
    outbound = [line.strip() for line in profile.splitlines()
                if line.strip().startswith("(allow network-outbound")]
    assert outbound  # only to srt's proxy on this machine, nowhere else
    assert all('(remote ip "localhost:3128")' in line or '(remote ip "localhost:1080")' in line
               or "(remote unix-socket" in line for line in outbound), outbound


@pytest.mark.skipif(shutil.which("npm") is None, reason="needs npm on PATH")
def test_the_demo_offers_to_install_srt_as_it_does_claude(tmp_path: Path) -> None:
    from fleet_tui.demo.session import ensure_cage

    asked: list[str] = []
    said: list[str] = []
    env = {**os.environ, "FLEET_WORKER_SRT": str(tmp_path / "none"),
           "FLEET_TUI_HOME": str(tmp_path / "data")}
    assert ensure_cage(ask=lambda q: asked.append(q) or "n", out=said.append, env=env) is False
    assert len(asked) == 1 and "@anthropic-ai/sandbox-runtime@" + cage.SRT_VERSION in asked[0]
    assert "npm install --prefix " + str(tmp_path / "data" / "srt") in said[0]
    # declined: the demo still works, its own workers uncaged, and it says so
    assert env["FLEET_WORKER_CAGE"] == "off"
    assert "run uncaged on this machine" in said[-1] and "srt" in said[-1]
    assert ensure_cage(ask=asked.append, out=said.append, env=env) is False
    assert len(asked) == 1  # uncaged: nothing to offer


def test_the_demo_runs_its_workers_uncaged_where_the_machine_cannot_cage(
        tmp_path: Path) -> None:
    """No bubblewrap (nor node) on PATH: nothing to offer; the demo says its workers run
    uncaged and why, instead of starting tasks the engine would refuse."""
    from fleet_tui.demo.session import ensure_cage

    empty = tmp_path / "bin"
    empty.mkdir()
    said: list[str] = []
    env = {"PATH": str(empty), "HOME": str(tmp_path), "FLEET_TUI_HOME": str(tmp_path / "d")}
    assert ensure_cage(ask=lambda q: pytest.fail(f"asked {q!r}"), out=said.append,
                       env=env) is False
    assert env["FLEET_WORKER_CAGE"] == "off"
    assert len(said) == 1 and "uncaged" in said[0] and "fleet-doctor" in said[0]


def test_a_blocked_line_is_an_event_shown_without_the_workers_escapes() -> None:
    """`system/fleet_blocked` (written by cage_host.mjs) is a stream event: one row of the
    panel's stream (kept in its tools-only view), one `logs` line; text from the worker
    (a path, a host) never reaches a terminal with its control characters."""
    from fleet_tui.commands.tasks import format_event
    from fleet_tui.core import stream
    from fleet_tui.ui.formatting import TOOL_KINDS, StreamFormatter

    line = json.dumps({"type": "system", "subtype": "fleet_blocked", "action": "connect",
                       "target": "evil.example:443\x1b[31m", "detail": "not allowed"})
    (event,) = stream.decode_all(line.encode() + b"\n")
    assert isinstance(event, stream.Blocked) and event.action == "connect"
    (row,) = StreamFormatter().rows([event])
    assert row.kind == "blocked" and row.kind in TOOL_KINDS
    shown = "".join(text for _style, text in row.row)
    assert shown.startswith("⊘ blocked: connect evil.example:443") and "\x1b" not in shown
    logged = format_event(event)
    assert logged is not None and logged.startswith("cage     ⊘ blocked: connect")
    assert "\x1b" not in logged


def _bare_policy(tmp_path: Path) -> Path:
    """A cage.json with no rules but writes under tmp_path, for running the cage host
    directly (skips where the cage cannot run)."""
    problems = cage.missing(os.environ, cage.default_data_dir(os.environ))
    if problems or SRT is None:
        pytest.skip("the cage cannot run here: " + "; ".join(problems))
    rules = {"srt": {"network": {"allowedDomains": [], "deniedDomains": []},
                     "filesystem": {"denyRead": [], "allowRead": [],
                                    "allowWrite": [str(tmp_path)], "denyWrite": []}},
             "hidden": [], "shown": [], "home": "", "unset_env": list(cage.UNSET_INSIDE)}
    policy = tmp_path / cage.POLICY_FILE
    policy.write_text(json.dumps(rules))
    return policy


def _host(policy: Path, *argv: str) -> list[str]:
    """`node cage_host.mjs SRT POLICY -- ARGV`."""
    return [shutil.which("node") or "node", cage.HOST_SCRIPT, str(SRT), str(policy), "--",
            *argv]


@pytest.mark.parametrize("masked", [False, True], ids=["plain-proc", "masked-proc"])
def test_the_workers_proc_is_its_own_or_it_does_not_start(tmp_path: Path, masked: bool
                                                          ) -> None:
    """Where the host's /proc has nothing mounted over it, the command sees its own PID
    namespace's /proc (one pid a process, `ps` names the shell by `$$`) and no process
    outside the cage. Where something is (a container masking parts of /proc, made here
    with a tmpfs over /proc/bus in a mount namespace of the test's own), srt's helper
    cannot mount the command's own and the host's would be left in its place: the command
    never starts, and the cage host says why."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or not Path("/proc/bus").is_dir():
        pytest.skip("needs root, unshare and a /proc/bus to mask")
    policy = _bare_policy(tmp_path)
    outside = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL)
    try:
        inside = ("echo started; grep NSpid /proc/self/status; "
                  "echo \"self=$$ ps=$(ps -o pid= -p $$ 2>&1 | tr -d ' ')\"; "
                  f"ls /proc/{outside.pid} >/dev/null 2>&1 && echo outside-seen; "
                  "echo count=$(ls -d /proc/[0-9]* | wc -l)")
        host = _host(policy, "/bin/sh", "-c", inside)
        mask = "mount -t tmpfs none /proc/bus && " if masked else ""
        out = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "/bin/sh", "-c",
             mask + 'exec "$@"', "sh", *host], cwd=tmp_path, capture_output=True, text=True,
            timeout=120, stdin=subprocess.DEVNULL)
    finally:
        outside.kill()
        outside.wait(timeout=30)
    text = out.stdout
    if masked:
        assert out.returncode == 125 and "started" not in text, out.stderr + text
        assert "the worker's /proc is not its cage's" in out.stderr, out.stderr
        return
    assert out.returncode == 0, out.stderr + text
    nspid = next(line for line in text.splitlines() if line.startswith("NSpid:")).split()[1:]
    assert len(nspid) == 1, text
    assert "outside-seen" not in text and int(text.split("count=")[1].split()[0]) < 10, text
    self_pid = text.split("self=")[1].split()[0]
    assert f"self={self_pid} ps={self_pid}\n" in text, text


def test_a_cage_host_killed_outright_leaves_its_folder_to_the_next_start(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The cage host keeps srt's sockets in a folder of its own in the temp folder and
    removes it as it exits; SIGKILL (its runner's group killed after the grace) skips that.
    The next cage host's start removes the folders of hosts that no longer run (their
    alive.sock refuses), and no other: not one whose host runs (its socket accepts), not
    one without the socket."""
    policy = _bare_policy(tmp_path)
    # a short temp folder: srt's unix sockets in it must fit sun_path's 108 bytes
    temp = Path(tempfile.mkdtemp(prefix="cg-"))
    request.addfinalizer(lambda: shutil.rmtree(temp, ignore_errors=True))
    env = dict(os.environ, TMPDIR=str(temp))

    killed = subprocess.Popen(_host(policy, "/bin/sh", "-c", "echo up; exec sleep 600"),
                              cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert killed.stdout is not None
        assert killed.stdout.readline() == b"up\n"
        (left,) = temp.glob("fleet-cage-*")
        assert (left / "alive.sock").is_socket()
    finally:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(timeout=30)
    assert left.is_dir()  # what SIGKILL leaves
    running = temp / "fleet-cage-AbC123"  # a host that runs: its socket accepts
    running.mkdir()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    request.addfinalizer(listener.close)
    listener.bind(str(running / "alive.sock"))
    listener.listen(4)
    other = temp / "fleet-cage-notes"  # no socket: not a cage host's to judge
    other.mkdir()

    nxt = subprocess.run(_host(policy, "/bin/true"), cwd=tmp_path, env=env, capture_output=True,
                         timeout=120, stdin=subprocess.DEVNULL)
    assert nxt.returncode == 0, nxt.stderr
    deadline = time.monotonic() + 10
    while left.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left.exists()
    assert sorted(p.name for p in temp.iterdir()) == sorted([running.name, other.name])
