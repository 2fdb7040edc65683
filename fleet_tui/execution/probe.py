"""What every host kind's `host check` is made of: the checks' results, the one probe
script that reads a host (`sh -s`, the script on its stdin: nothing to quote, one
`key=value` a line), each check's reading of it with its fix (python >= 3.10, git >= 2.38,
the pinned claude, free disk, clock skew), the pinned claude's install with npm, and the
host's record of its claude. A kind says how a shell is started on its hosts (`shell`);
this module never names a kind.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fleet_tui import CLAUDE_CODE_VERSION
from fleet_tui.execution import remote_cage
from fleet_tui.system import procs

if TYPE_CHECKING:
    from fleet_tui.settings.config import Settings
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
    warn: bool = False  # passed, but with something the user should know

    def to_json(self) -> dict[str, object]:
        return {"check": self.name, "ok": self.ok, "found": self.found, "fix": self.fix,
                "warn": self.warn}


def run_script(argv: Sequence[str], script: str, *, timeout: float = 60.0,
               env: Mapping[str, str] | None = None) -> Ran:
    """Run a shell script through `argv` (a shell reading its stdin, here or on a host).
    A timeout or a command that cannot start reads as exit 255 (ssh's own code for "could
    not connect") with the reason in stderr."""
    try:
        done = subprocess.run(list(argv), input=script.encode(), capture_output=True,
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


def install(argv: Sequence[str], where: str | None = None, *, limit: float | None = None,
            every: float | None = None, progress: Callable[[float, str], None] | None = None,
            env: Mapping[str, str] | None = None, remote: bool = False,
            script: str | None = None) -> Installed:
    """The pinned claude (or what `script` installs with npm) installed with npm on the
    host (`install_script`), stopped after `limit` seconds (there too: `timeout` around
    npm), `progress(elapsed, last line)` called every `every` seconds meanwhile."""
    limit = INSTALL_LIMIT if limit is None else limit
    every = PROGRESS_EVERY if every is None else every
    script = ('t=""; command -v timeout >/dev/null 2>&1 && '
              f't="timeout -k 10 {max(1, int(limit))}"; '
              + (script or install_script(where)).replace("npm install", "$t npm install", 1))
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
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
        why = f"no end within {minutes(limit)}: stopped"
    elif code == 255 and remote:
        why = f"{argv[0]} failed ({lines[-1] if lines else 'exit 255'})"
    else:
        why = f"npm exited with {code}"
    return Installed(False, why, tuple(_npm_errors(argv, lines, env=env)))


def minutes(seconds: float) -> str:
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


def _npm_errors(argv: Sequence[str], lines: list[str], *,
                env: Mapping[str, str] | None) -> list[str]:
    """npm's `npm error` lines; when they only name its log, the log's error lines."""
    errors = [line for line in lines if line.startswith(("npm error", "npm ERR!"))]
    told = [line for line in errors if "complete log of this run" not in line
            and "Log files were not written" not in line]
    found = next((m.group(1) for m in map(_LOG_PATH.search, lines) if m), None)
    if told or found is None:
        return errors[-20:] or lines[-5:]
    ran = run_script(argv, f"grep -E '^[0-9]+ error ' {shlex.quote(found)} | tail -n 20\n",
                     env=env, timeout=30)
    from_log = [re.sub(r"^\d+ error ", "npm error ", _plain(line))
                for line in ran.stdout.splitlines() if line.strip()]
    return (from_log + errors)[-20:]


def claude_record() -> str:
    """The file on an ssh host naming the claude `host check` found or installed there
    (the host's runners run that one: execution/worker/hostclaude.py reads it)."""
    return f"{HOST_DATA_DIR}/claude-path"


def record_script(claude: str) -> str:
    """Write the host's record of its claude (`claude`: a path on the host, `$HOME/...`
    taken as the host's HOME)."""
    return (f"mkdir -p -m 700 {_shell_path(HOST_DATA_DIR)} && printf '%s\\n' "
            f"{_shell_path(claude)} > {_shell_path(claude_record())}\n")


def probe_script(claude: tuple[str, ...] = (), python: str = "python3",
                 cage: str | None = None, srt: str | None = None) -> str:
    """What the checks read, one key=value a line (each found or empty). `claude`: where
    to look for it first (this machine: the settings' and the demo's copy), else (a
    host) the one its record names, then its data dir's copy; then `claude` on PATH:
    the order the host's runners find it in. `cage`: a host's data dir, where what its
    cage needs is looked for too (`srt`: the host's srt setting)."""
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
        # can an attempt's processes be contained there: a cgroup, else a PID namespace
        f"echo \"contain=$({_shell_path(python)} -S -c {shlex.quote(procs.CONTAIN_PROBE)} "
        '2>/dev/null | tail -n 1)"',
        remote_cage.probe_lines(cage, srt) if cage else "",  # what the cage needs there
        "",
    ])


def values_of(text: str) -> dict[str, str]:
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


def check_shell(argv: Sequence[str], *, where: str, reached: str, here: bool,
                unreachable: Callable[[str], str], env: Mapping[str, str] | None = None,
                claude: tuple[str, ...] = (), install_to: str | None = None,
                now: float | None = None, name: str = "local",
                cage: str | None = None) -> tuple[list[Check], dict[str, str]]:
    """Every check of a host reached through a shell (`argv`), in order, and the probe's
    values (`claude_path`, `npm`). An unreachable host is one failed check (its fix:
    `unreachable(why)`): the others need it. `claude`: where its claude is looked for
    first (probe_script); `reached`: what the passed check says; `here`: this machine;
    `name`, `cage`: the host's name and its `cage` setting (its workers' cage checked)."""
    started = time.time()
    script = probe_script(claude, cage=None if here else HOST_DATA_DIR)
    ran = run_script(argv, script, env=env)
    ended = time.time() if now is None else now
    values = values_of(ran.stdout)
    if values.get("reached") != "yes":
        why = (ran.stderr.strip().splitlines() or [f"exit {ran.returncode}"])[-1]
        return [Check("reachable", False, f"unreachable: {why}", unreachable(why))], values
    checks = [Check("reachable", True, reached)]
    checks.append(at_least("python", values.get("python", ""), MIN_PYTHON,
                           "install Python 3.10 or newer there as `python3` (e.g. "
                           "`apt install python3`)"))
    checks.append(at_least("git", values.get("git", ""), MIN_GIT,
                           "install git 2.38 or newer there (e.g. `apt install git`, or "
                           "the git-core PPA / backports on older systems)"))
    checks.append(claude_check(values, install_to, "here" if here else "there"))
    checks.append(_disk(values.get("disk_kb", "")))
    checks.append(_skew(values.get("time", ""), started, ended))
    checks.append(contain_check(values.get("contain", "")))
    checks.append(cage_check(name, values, setting=cage, here=here))
    return checks, values


def cage_check(name: str, values: Mapping[str, str], *, setting: str | None,
               ray: bool = False, here: bool = False) -> Check:
    """The `cage` check: can the host cage its workers (execution/remote_cage.py)."""
    return Check("cage", *remote_cage.check_host(name, dict(values), setting=setting,
                                                 ray=ray, here=here))


def srt_lacking(values: Mapping[str, str]) -> bool:
    """The probe says the host lacks srt (which `--yes` installs beside its claude)."""
    return any(m.startswith("srt ") for m in remote_cage.lacks(dict(values)))


SRT_WHAT = f"the cage's sandbox runtime ({remote_cage.SRT_PACKAGE})"


def srt_install_script() -> str:
    """The pinned srt installed with npm into a host's data dir (`host check --yes`)."""
    return remote_cage.install_script(HOST_DATA_DIR)


def srt_record_script(srt: str | None = None) -> str:
    """The host's record of its srt (`srt`: a path there; None: the one installed)."""
    return remote_cage.record_script(HOST_DATA_DIR,
                                     srt or remote_cage.installed_path(HOST_DATA_DIR))


def at_least(name: str, found: str, minimum: tuple[int, ...], fix: str) -> Check:
    version = _version(found)
    wanted = ".".join(map(str, minimum))
    if version is None:
        return Check(name, False, "not found", fix)
    shown = ".".join(map(str, version))
    if version < minimum:
        return Check(name, False, f"{shown} (older than {wanted})", fix)
    return Check(name, True, shown)


def claude_check(values: Mapping[str, str], install_to: str | None, where: str) -> Check:
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


def contain_check(found: str) -> Check:
    """How each attempt's processes are held together there (system/cgroups.py, else
    system/pidns.py): said in one line, a warning where neither can be made."""
    if found == "cgroup":
        return Check("contain", True, "a cgroup per attempt")
    if found == "namespace":
        return Check("contain", True, "a PID namespace per attempt (no cgroup for this "
                     "user): everything a worker starts ends with it")
    why = found.partition(":")[2].strip() or (found or "the probe gave no answer")
    return Check("contain", True, f"NOT contained ({why[:160]}): a process a worker "
                 "starts that leaves its session and drops FLEET_ATTEMPT_TOKEN can outlive "
                 "its attempt", "allow unprivileged user namespaces there (sysctl "
                 "user.max_user_namespaces > 0) or delegate a cgroup v2 to this user",
                 warn=True)


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


class KindChecks(Protocol):
    """What a kind's `check.py` gives `fleet-tui host check` (its `CHECKS`)."""

    #: `--probe` means something for this kind (else it is refused)
    probes: bool
    #: the claude found is written to the host's record (its runners run that one)
    records: bool

    def describe(self, host: HostConfig) -> str:
        """The host in the checks' heading ("this machine", "ssh box")."""
        ...

    def shell(self, host: HostConfig) -> list[str] | None:
        """The argv of a shell reading a script on its stdin there (None: the kind has
        none; then nothing is installed or recorded by `host check`)."""
        ...

    def claude_where(self, settings: Settings,
                     host: HostConfig) -> tuple[tuple[str, ...], str | None]:
        """Where the host's claude is looked for first, and where `--yes` installs it."""
        ...

    def run(self, host: HostConfig, *, claude: tuple[str, ...], install_to: str | None,
            probe: bool, env: Mapping[str, str] | None = None
            ) -> tuple[list[Check], dict[str, str]]:
        """Every check of the host, and what its probe read."""
        ...


__all__ = ["CLAUDE_PACKAGE", "Check", "Installed", "KindChecks", "Ran", "at_least",
           "cage_check", "check_shell", "claude_check", "claude_dir", "claude_record",
           "install", "install_script", "minutes", "probe_script", "record_script",
           "run_script", "srt_install_script", "srt_lacking", "srt_record_script",
           "values_of"]
