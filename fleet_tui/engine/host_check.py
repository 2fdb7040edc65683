"""`fleet-tui host check NAME`: can this host run workers (issue 20)?

One probe script runs on the host (`sh -s`, the script on its stdin: nothing to quote)
and prints what it found, one `key=value` a line; each check reads it and says, when it
fails, how to fix it: reachable, python >= 3.10, git >= 2.38, the pinned claude, free
disk, clock skew. For an ssh host the probe goes through the user's own ssh (their
~/.ssh/config, agent and known-hosts checking, never switched off) with BatchMode, so a
password or a host-key question fails the check instead of waiting for an answer.

`run_on` is the one function that starts a command on a host: the lead routes it through
the ssh host's connection (execution/ssh/) once both are in one build.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fleet_tui import CLAUDE_CODE_VERSION
from fleet_tui.execution import remote_cage
from fleet_tui.settings.hosts import HostConfig

MIN_PYTHON = (3, 10)
MIN_GIT = (2, 38)
MIN_FREE_MB = 2048  # worktrees, node_modules, the claude CLI
MAX_SKEW = 30.0  # seconds: leases and the stall watchdog compare the two clocks
CONNECT_TIMEOUT = 10
# where the host keeps fleet-tui's files (the ssh host's data dir)
HOST_DATA_DIR = "$HOME/.fleet-tui-host"
CLAUDE_PACKAGE = f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}"


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Check:
    """One check's result: `ok`, what was found, and (failed) how to fix it."""

    name: str
    ok: bool
    found: str
    fix: str = ""

    def to_json(self) -> dict[str, object]:
        return {"check": self.name, "ok": self.ok, "found": self.found, "fix": self.fix}


def ssh_argv(host: HostConfig, ssh: str = "ssh") -> list[str]:
    """ssh's argv for a command on `host`, with the user's own config and BatchMode."""
    return [ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT}",
            *host.ssh_args()]


def run_on(host: HostConfig, script: str, *, timeout: float = 60.0,
           env: Mapping[str, str] | None = None, ssh: str = "ssh") -> Ran:
    """Run a shell script on the host (`sh -s`, the script on stdin): this machine for
    `local`, else through ssh. A timeout or an ssh that cannot start reads as exit 255
    (ssh's own code for "could not connect") with the reason in stderr."""
    argv = ["sh", "-s"] if host.is_local else [*ssh_argv(host, ssh), "sh -s"]
    try:
        done = subprocess.run(argv, input=script.encode(), capture_output=True,
                              timeout=timeout, check=False,
                              env=dict(env) if env is not None else None)
    except subprocess.TimeoutExpired:
        return Ran(255, "", f"no answer within {timeout:g} s")
    except OSError as exc:
        return Ran(255, "", f"{argv[0]}: {exc.strerror or exc}")
    return Ran(done.returncode, done.stdout.decode(errors="replace"),
               done.stderr.decode(errors="replace"))


def claude_dir() -> str:
    """Where `host check --yes` installs the pinned claude on an ssh host."""
    return f"{HOST_DATA_DIR}/claude-cli"


def _shell_path(path: str) -> str:
    if path.startswith("$HOME/"):
        return '"$HOME"' + shlex.quote(path[len("$HOME"):])
    return shlex.quote(path)


def install_script(where: str | None = None) -> str:
    """The pinned claude CLI installed with npm into `where` (default: the ssh host's data
    dir; this machine: the folder the demo installs it in)."""
    folder = _shell_path(where or claude_dir())
    return (f"mkdir -p {folder} && npm install --prefix {folder} --no-audit --no-fund "
            f"{shlex.quote(CLAUDE_PACKAGE)}\n")


INSTALL_LIMIT = 600.0  # seconds `host check --yes` gives npm (then it is stopped)
PROGRESS_EVERY = 15.0  # seconds between two progress lines of an install
_LOG_PATH = re.compile(r"complete log of this run can be found in:\s*(\S+)")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]|\x1b\[[0-9;?]*[A-Za-z]")


@dataclass(frozen=True)
class Installed:
    """How an install went: `why` one line when it failed, `errors` npm's own
    `npm error ...` lines (its log's, when its output named only the log)."""

    ok: bool
    why: str = ""
    errors: tuple[str, ...] = ()


def _plain(line: str) -> str:
    """A line of npm's output without escapes or control characters (for a terminal)."""
    return _CONTROL.sub("", line).strip()


def install(host: HostConfig, where: str | None = None, *, limit: float | None = None,
            every: float | None = None, progress: Callable[[float, str], None] | None = None,
            env: Mapping[str, str] | None = None, ssh: str = "ssh",
            script: str | None = None) -> Installed:
    """The pinned claude installed with npm on the host (`install_script`), stopped after
    `limit` seconds (there too: `timeout` around npm), `progress(elapsed, last line)`
    called every `every` seconds meanwhile."""
    limit = INSTALL_LIMIT if limit is None else limit
    every = PROGRESS_EVERY if every is None else every
    script = ('t=""; command -v timeout >/dev/null 2>&1 && '
              f't="timeout -k 10 {max(1, int(limit))}"; '
              + (script or install_script(where)).replace("npm install", "$t npm install", 1))
    argv = ["sh", "-s"] if host.is_local else [*ssh_argv(host, ssh), "sh -s"]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(env) if env is not None else None)
    except OSError as exc:
        return Installed(False, f"{argv[0]}: {exc.strerror or exc}")
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = _plain(raw.decode("utf-8", "replace"))
            if line:
                lines.append(line)

    reader = threading.Thread(target=read, name="fleet-npm-output", daemon=True)
    reader.start()
    assert proc.stdin is not None
    with contextlib.suppress(OSError):
        proc.stdin.write(script.encode())
        proc.stdin.close()
    started = time.monotonic()
    stopped = False
    while True:
        elapsed = time.monotonic() - started
        try:
            proc.wait(timeout=max(0.0, min(every, limit - elapsed)))
            break
        except subprocess.TimeoutExpired:
            pass
        elapsed = time.monotonic() - started
        if elapsed >= limit:
            stopped = True
            _stop_group(proc)
            break
        if progress is not None:
            progress(elapsed, lines[-1] if lines else "")
    reader.join(timeout=5)
    code = proc.returncode
    if code == 0 and not stopped:
        return Installed(True)
    if stopped or code == 124:  # 124: the host's `timeout` stopped npm
        why = f"no end within {_minutes(limit)}: stopped"
    elif code == 255 and not host.is_local:
        why = f"ssh failed ({lines[-1] if lines else 'exit 255'})"
    else:
        why = f"npm exited with {code}"
    return Installed(False, why, tuple(_npm_errors(host, lines, env=env, ssh=ssh)))


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """The install's process group (sh, npm, its children here; ssh for a host, whose
    `timeout` stops npm there) ended: SIGTERM, then SIGKILL."""
    import os
    import signal

    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _npm_errors(host: HostConfig, lines: list[str], *, env: Mapping[str, str] | None,
                ssh: str) -> list[str]:
    """npm's `npm error` lines; when they only name its log, the log's error lines."""
    errors = [line for line in lines if line.startswith(("npm error", "npm ERR!"))]
    told = [line for line in errors if "complete log of this run" not in line
            and "Log files were not written" not in line]
    found = next((m.group(1) for m in map(_LOG_PATH.search, lines) if m), None)
    if told or found is None:
        return errors[-20:] or lines[-5:]
    ran = run_on(host, f"grep -E '^[0-9]+ error ' {shlex.quote(found)} | tail -n 20\n",
                 env=env, ssh=ssh, timeout=30)
    from_log = [re.sub(r"^\d+ error ", "npm error ", _plain(line))
                for line in ran.stdout.splitlines() if line.strip()]
    return (from_log + errors)[-20:]


def srt_lacking(values: Mapping[str, str]) -> bool:
    """The probe says the host lacks srt (which `--yes` installs beside its claude)."""
    return any(m.startswith("srt ") for m in remote_cage.lacks(dict(values)))


SRT_WHAT = f"the cage's sandbox runtime ({remote_cage.SRT_PACKAGE})"


def srt_install_script() -> str:
    return remote_cage.install_script(HOST_DATA_DIR)


def srt_record_script(srt: str | None = None) -> str:
    """The ssh host's record of its srt (`srt`: a path there; None: the one installed)."""
    return remote_cage.record_script(HOST_DATA_DIR,
                                     srt or remote_cage.installed_path(HOST_DATA_DIR))


def claude_record() -> str:
    """The file on an ssh host naming the claude `host check` found or installed there
    (the host's runners run that one: execution/hostclaude.py reads it)."""
    return f"{HOST_DATA_DIR}/claude-path"


def record_script(claude: str) -> str:
    """Write the host's record of its claude (`claude`: a path on the host, `$HOME/...`
    taken as the host's HOME)."""
    return (f"mkdir -p -m 700 {_shell_path(HOST_DATA_DIR)} && printf '%s\\n' "
            f"{_shell_path(claude)} > {_shell_path(claude_record())}\n")


def probe_script(claude: tuple[str, ...] = (), python: str = "python3",
                 cage: str | None = HOST_DATA_DIR, srt: str | None = None) -> str:
    """What the checks read, one key=value a line (each found or empty). `claude`: where
    to look for it first (this machine: the settings' and the demo's copy), else (a
    host) the one its record names, then its data dir's copy; then `claude` on PATH:
    the order the host's runners find it in."""
    if claude:
        first = " ".join(_shell_path(c) for c in claude)
        record = ""
    else:
        first = '"$r" ' + _shell_path(f"{claude_dir()}/node_modules/.bin/claude")
        record = f'r=$(head -n 1 {_shell_path(claude_record())} 2>/dev/null); '
    look = (f'{record}c=""; for x in {first}; do case "$x" in "") ;; */*) [ -x "$x" ] && '
            'c="$x" ;; *) c=$(command -v "$x" 2>/dev/null) ;; esac; [ -n "$c" ] && break; '
            'done; [ -n "$c" ] || c=$(command -v claude 2>/dev/null)')
    return "\n".join([
        "export LC_ALL=C",
        'echo "reached=yes"',
        f"echo \"python=$({_shell_path(python)} -c 'import sys; "
        "print(\"%d.%d.%d\" % sys.version_info[:3])' 2>/dev/null)\"",
        'echo "git=$(git --version 2>/dev/null)"',
        look,
        'echo "claude_path=$c"',
        'echo "claude=$([ -n "$c" ] && "$c" --version 2>/dev/null | head -n 1)"',
        'echo "npm=$(command -v npm 2>/dev/null)"',
        'echo "disk_kb=$(df -Pk "$HOME" 2>/dev/null | awk \'NR==2 {print $4}\')"',
        'echo "time=$(date +%s)"',
        remote_cage.probe_lines(cage, srt) if cage else "",  # what the cage needs there
        "",
    ])


def _values(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.isidentifier():
            out[key] = value.strip()
    return out


def _version(text: str) -> tuple[int, ...] | None:
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not match:
        return None
    return tuple(int(g) for g in match.groups() if g is not None)


def unreachable_fix(host: HostConfig, why: str) -> str:
    """What to do when ssh does not get in: the sentence depends on what ssh said."""
    target = " ".join(shlex.quote(a) for a in host.ssh_args() if a != "--")
    lowered = why.lower()
    if "host key verification failed" in lowered or "no matching host key" in lowered:
        hint = ("its host key is not in your known_hosts: connect once by hand and check "
                "the fingerprint")
    elif "permission denied" in lowered:
        hint = ("your key is not accepted: load it into your agent (ssh-add) or name it with "
                "IdentityFile in ~/.ssh/config, and add it to the host's authorized_keys")
    elif "could not resolve" in lowered or "name or service not known" in lowered:
        hint = "the name does not resolve: check the host name, or add it to ~/.ssh/config"
    else:
        hint = "check that the host is up and sshd listens on that port"
    return (f"{hint}; then `ssh {target} true` must succeed without asking anything "
            "(fleet-tui runs ssh with BatchMode=yes)")


def check_host(host: HostConfig, *, env: Mapping[str, str] | None = None,
               claude: tuple[str, ...] = (), install_to: str | None = None,
               now: float | None = None, ssh: str = "ssh"
               ) -> tuple[list[Check], dict[str, str]]:
    """Every check of the host, in order, and the probe's values (`claude_path`, `npm`).
    An unreachable host is one failed check: the others need it. `claude`: where its
    claude is looked for first (probe_script)."""
    started = time.time()
    ran = run_on(host, probe_script(claude, cage=None if host.is_local else HOST_DATA_DIR),
                 env=env, ssh=ssh)
    ended = time.time() if now is None else now
    values = _values(ran.stdout)
    where = "this machine" if host.is_local else host.target
    if values.get("reached") != "yes":
        why = (ran.stderr.strip().splitlines() or [f"exit {ran.returncode}"])[-1]
        fix = unreachable_fix(host, why) if not host.is_local else "check `sh` works here"
        return [Check("reachable", False, f"unreachable: {why}", fix)], values
    checks = [Check("reachable", True, where if host.is_local else f"ssh {where}")]
    checks.append(_at_least("python", values.get("python", ""), MIN_PYTHON,
                            "install Python 3.10 or newer there as `python3` (e.g. "
                            "`apt install python3`)"))
    checks.append(_at_least("git", values.get("git", ""), MIN_GIT,
                            "install git 2.38 or newer there (e.g. `apt install git`, or "
                            "the git-core PPA / backports on older systems)"))
    checks.append(_claude(values, install_to, "here" if host.is_local else "there"))
    checks.append(_disk(values.get("disk_kb", "")))
    checks.append(_skew(values.get("time", ""), started, ended))
    checks.append(Check("cage", *remote_cage.check_host(host, values)))
    return checks, values


def _at_least(name: str, found: str, minimum: tuple[int, ...], fix: str) -> Check:
    version = _version(found)
    wanted = ".".join(map(str, minimum))
    if version is None:
        return Check(name, False, "not found", fix)
    shown = ".".join(map(str, version))
    if version < minimum:
        return Check(name, False, f"{shown} (older than {wanted})", fix)
    return Check(name, True, shown)


def _claude(values: Mapping[str, str], install_to: str | None, where: str) -> Check:
    found = values.get("claude", "")
    path = values.get("claude_path", "")
    version = _version(found)
    install = install_script(install_to).strip()
    fix = (f"install the pinned version {where}: {install}" if values.get("npm")
           else f"install Node.js (which brings npm) {where}, then: {install}")
    if version is None:
        return Check("claude", False, "not found" + (f" ({path} does not run)" if path else ""),
                     fix)
    shown = ".".join(map(str, version))
    if shown != CLAUDE_CODE_VERSION:
        return Check("claude", False, f"{shown} at {path} (fleet-tui is tested with "
                     f"{CLAUDE_CODE_VERSION})", fix)
    return Check("claude", True, f"{shown} at {path}")


def _disk(found: str) -> Check:
    if not found.isdigit():
        return Check("disk", False, "could not read the free space of $HOME",
                     "check that `df -Pk $HOME` works there")
    free_mb = int(found) // 1024
    shown = f"{free_mb / 1024:.1f} GB free in $HOME" if free_mb >= 1024 \
        else f"{free_mb} MB free in $HOME"
    if free_mb < MIN_FREE_MB:
        return Check("disk", False, shown, f"free at least {MIN_FREE_MB // 1024} GB there "
                     "(worktrees and the claude CLI live under $HOME)")
    return Check("disk", True, shown)


def _skew(found: str, started: float, ended: float) -> Check:
    if not found.isdigit():
        return Check("clock", False, "could not read the host's clock",
                     "check that `date +%s` works there")
    theirs = int(found)
    # the host read its clock between our two readings (whole seconds: 1 s of slack)
    if started - 1 <= theirs <= ended + 1:
        return Check("clock", True, "in step (within 1 s)")
    skew = theirs - (ended if theirs > ended else started)
    shown = f"{abs(skew):.0f} s {'ahead' if skew > 0 else 'behind'}"
    if abs(skew) > MAX_SKEW:
        return Check("clock", False, shown, "run NTP there (e.g. `timedatectl "
                     "set-ntp true`, or chrony): leases and stall times compare clocks")
    return Check("clock", True, shown)


__all__ = ["CLAUDE_PACKAGE", "Check", "Installed", "Ran", "check_host", "claude_record",
           "install", "install_script", "probe_script", "record_script", "run_on", "ssh_argv"]


# --- a Ray cluster (issue 21): its Jobs address, through its REST API -----------------------

RAY_TIMEOUT = 15.0


def _get_json(url: str, timeout: float) -> object:
    import json
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.load(resp)


def ray_nodes(address: str, *, timeout: float = RAY_TIMEOUT) -> list[dict[str, object]]:
    """The cluster's alive nodes (the state API), each with its resources: the Ray
    host's own reading (imported here when a Ray host is checked)."""
    from fleet_tui.execution.ray.host import ray_nodes as alive

    return alive(address, timeout=timeout)


def check_ray_host(host: HostConfig, *, timeout: float = RAY_TIMEOUT,
                   probe: bool = False, env: Mapping[str, str] | None = None) -> list[Check]:
    """A Ray host's checks: the Jobs address answers (and its Ray's version), its alive
    nodes, whether one of them has every resource the host's jobs ask for, this machine's
    Jobs client; then what a node needs (git, python, the pinned claude): said, or with
    `probe` read on a node by one short job placed as an attempt's would be."""
    assert host.ray is not None
    address = host.ray
    try:
        version = _get_json(f"{address}/api/version", timeout)
    except (OSError, ValueError) as exc:
        return [Check("reachable", False, f"{address} does not answer: {exc}",
                      "check the address (the head's dashboard, `ray start --head "
                      "--dashboard-host=...`, port 8265 by default) and that this machine "
                      "reaches it")]
    ray_version = version.get("ray_version") if isinstance(version, dict) else None
    checks = [Check("reachable", True, f"{address} (Ray {ray_version or 'unknown'})")]
    try:
        nodes = ray_nodes(address, timeout=timeout)
    except (OSError, ValueError) as exc:
        checks.append(Check("nodes", False, f"the state API did not answer: {exc}",
                            "the cluster needs ray[default] on its head (the dashboard)"))
        return checks
    shown = []
    for node in nodes:
        total = node.get("resources_total")
        total = total if isinstance(total, dict) else {}
        names = sorted(k for k in total if isinstance(k, str) and not k.startswith("node:"))
        shown.append(f"{node.get('node_ip')} ({', '.join(names)})")
    checks.append(Check("nodes", bool(nodes), f"{len(nodes)} alive: " + "; ".join(shown)
                        if nodes else "no node is alive", "start a node: `ray start "
                        "--address=HEAD:6379` on each machine"))
    wanted = host.resources or {}
    if wanted:
        def has(node: dict[str, object], name: str) -> float:
            total = node.get("resources_total")
            value = total.get(name, 0) if isinstance(total, dict) else 0
            return float(value) if isinstance(value, (int, float)) else 0.0

        fits = [n for n in nodes if all(has(n, k) >= v for k, v in wanted.items())]
        asked = ", ".join(f"{k}={v:g}" for k, v in wanted.items())
        checks.append(Check("resources", bool(fits),
                            f"{len(fits)} node(s) have {asked}" if fits else
                            f"no node has {asked}",
                            "start a node with them: `ray start ... --resources='"
                            + "{" + ", ".join(f'"{k}": {v:g}' for k, v in wanted.items())
                            + "}'`, or change resources in [hosts." + host.name + "]"))
    try:
        from importlib.metadata import version as dist_version

        client = dist_version("ray")
    except Exception:
        client = None
    if client is None:
        checks.append(Check("client", False, "this machine has no ray",
                            "pip install 'fleet-tui[ray]'"))
    else:
        same = ray_version in (None, client)
        checks.append(Check("client", same, f"ray {client} here" + (
            "" if same else f", Ray {ray_version} there"),
            f"use the cluster's version here: pip install 'ray[default]=={ray_version}'"))
    key = (f"the key from ${host.key_env} of each node's environment" if host.key_env
           else "this machine's gateway, with each attempt's token (gateway = true; "
                "the nodes must reach this machine"
                + (f" as {host.gateway_host})" if host.gateway_host else ")"))
    if probe and all(c.ok for c in checks):
        return checks + _probe_ray(host, env)
    checks.append(Check("node needs", True,
                        f"git 2.38+, {host.python or 'python3'} 3.11+ (Ray's own), "
                        f"{host.claude or 'claude'} {CLAUDE_CODE_VERSION}, "
                        f"{host.data_dir or '/var/tmp/fleet-tui-ray'} writable; the key: "
                        f"{key}" + ("" if probe else " (`--probe` reads them on a node)")))
    return checks


def _probe_ray(host: HostConfig, env: Mapping[str, str] | None) -> list[Check]:
    """git, python and claude read on a node by one short job (`probe_script`)."""
    import os

    from fleet_tui.execution.ray.host import probe_job

    assert host.ray is not None
    python = host.python or "python3"
    script = probe_script((host.claude or "claude",), python=python,
                          cage=host.data_dir or "/var/tmp/fleet-tui-ray", srt=host.srt)
    try:
        status, text, node = probe_job(host.ray, script, resources=host.resources,
                                       env=os.environ if env is None else env)
    except Exception as exc:  # the client's own errors: said in the check
        return [Check("probe", False, str(exc), "check the cluster with `ray job list`")]
    values = _values(text)
    if status != "SUCCEEDED" or values.get("reached") != "yes":
        last = (text.strip().splitlines() or [status])[-1][:300]
        return [Check("probe", False, f"the probe job ended {status}: {last}",
                      "check that a node with the host's resources is alive and runs jobs")]
    where = f"node {node[:12]}" if node else "a node"
    fix_python = (f"install Python 3.10 or newer on the nodes as `{python}`, or set python "
                  f"in [hosts.{host.name}] to its path there")
    checks = [Check("probe", True, f"one job on {where}")]
    checks.append(_at_least("python", values.get("python", ""), MIN_PYTHON, fix_python))
    checks.append(_at_least("git", values.get("git", ""), MIN_GIT,
                            "install git 2.38 or newer on the nodes"))
    found = _claude(values, None, "on the nodes")
    if not found.ok:
        found = Check("claude", False, found.found,
                      f"install Claude Code {CLAUDE_CODE_VERSION} on the nodes ({CLAUDE_PACKAGE} "
                      f"with npm) and set claude in [hosts.{host.name}] to its path there")
    checks.append(found)
    checks.append(Check("cage", *remote_cage.check_host(host, values)))
    return checks
