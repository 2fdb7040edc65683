"""The SSH host: each attempt a detached runner on another machine, reached by `ssh`.

What lives where:
- On the host, under its data dir (`$HOME/.fleet-tui-host` unless told): `pkg/<version>/`
  fleet-tui's own package, copied over the connection (the same code as here: the host
  needs no package index), `repos/<name>.git` a bare mirror per repository (the base
  commit reaches it by `git push` over the connection, so a second task sends only what is
  new), `work/<id>` the task's worktree, `config/<id>` its config dir, and
  `attempts/<id>/<n>` the attempt folder the host's runner writes.
- Here: the attempt folder (`Placement.attempt_dir`), mirrored from the host's by offset,
  byte for byte (execution/ssh/mirror.py), so the follower, the panel and `logs` read it as
  a local one; the spec and the engine's own records are written here too.

Starting: `stage` writes the spec on both sides (the host refuses while a runner of the
attempt holds its lock there: NotStarted); `spawn` asks the host's agent to start the
runner detached (its own session, stdin /dev/null), the key variables through a pipe the
runner inherits there, sent over the SSH channel's stdin: never a file, an argv or an
environment on the host. The runner goes on when the connection drops; stop, kill, sweep
and `say` are separate commands, by the runner's pid and the attempt's token (signals over
an SSH channel are refused, and a channel's end reaches no detached process).
Commits out: `collect` fetches the task's branch back into the main repository as
`fleet/<id>`.

The lease: `state()` answers from the mirror (never a round trip in the engine's pass); a
host silent for longer than `lease` loses its runs ("dead", the reason in the local stop
request, so the engine records "lost: host NAME unreachable for N s ..."), and everything
a lost attempt started there is killed and swept (by its token) once the host answers
again (`sweep_lost`, from `reap` and before any `stage`).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import fleet_tui
from fleet_tui.core.errors import FleetError
from fleet_tui.core.states import StopReason
from fleet_tui.execution.host import LostLedger, NotStarted, Placement, RunnerState
from fleet_tui.execution.remote.base import (
    LOOPBACK,
    RemoteHost,
    RemoteRun,
    update_result,
)
from fleet_tui.execution.remote.forwarding import forwarded, host_settings
from fleet_tui.execution.ssh import config as kind_config
from fleet_tui.execution.ssh.connection import Connection, SshError, dropped
from fleet_tui.execution.ssh.mirror import Mirror
from fleet_tui.execution.worker.attemptlog import AttemptLog, InputClosed
from fleet_tui.execution.worker.spec import RunSpec
from fleet_tui.store.meter import TOKEN_PREFIX
from fleet_tui.system import paths
from fleet_tui.vcs import git

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from fleet_tui.core.model import Attempt, Task
    from fleet_tui.settings.config import Settings
    from fleet_tui.settings.hosts import HostConfig

log = logging.getLogger("fleet_tui.engine.fleet")

AGENT = "fleet_tui.execution.worker.agent"
DEFAULT_DATA_DIR = "$HOME/.fleet-tui-host"
WRITING = re.compile(r"Writing objects: 100% \((\d+)/\d+\), ([\d.]+) (bytes|KiB|MiB|GiB)")
UNITS = {"bytes": 1, "KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3}
# what a shell says when the host has no git (`git init` there; `git-receive-pack`, which
# a push runs there): bash's "command not found", dash's "not found"
_NO_GIT = re.compile(r"\bgit(-receive-pack|-upload-pack)?:? (?:command )?not found")


def _push_error(err: str) -> str:
    """The line of a failed push's stderr that says what went wrong: the first `fatal:` or
    `error:` line, else every line joined (the last alone can be half a sentence: "and the
    repository exists.")."""
    lines = [line.strip() for line in err.splitlines()
             if line.strip() and not line.startswith(("Enumerating", "Counting", "Writing",
                                                       "Compressing", "Delta", "Total"))]
    for line in lines:
        if line.startswith(("fatal:", "error:", "remote: error:")):
            return line
    return " ".join(lines)[:300] or "git push failed"
# a run whose host has not answered for this long (the agent's stream beats every second)
# is lost: the engine records its end, and the host sweeps it once it answers again
LEASE = 60.0
SWEEP_RETRY = 1.0  # seconds between two tries to sweep the lost attempts of a host
RECONNECT_FORWARD = 1.0  # seconds between two tries to forward an adopted run's port


def package_tar() -> tuple[str, bytes]:
    """fleet-tui's own package as a tar (sources only) and its version on the host: the
    version with a digest of the bytes, so a changed checkout is installed again."""
    root = Path(fleet_tui.__file__).resolve().parent
    files = sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                   and p.suffix in (".py", ".mjs", ".tcss", ".json", ".toml", ".txt", ".typed"))
    digest = hashlib.sha256()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in files:
            rel = path.relative_to(root.parent).as_posix()
            data = path.read_bytes()
            digest.update(rel.encode() + b"\0" + data + b"\0")
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(data), 0o600, 0
            tar.addfile(info, io.BytesIO(data))
    return f"{fleet_tui.__version__}-{digest.hexdigest()[:12]}", buf.getvalue()


def _spec_base_url(read: Callable[[], str]) -> str | None:
    """The base URL a spec's settings name (None: unreadable, or none)."""
    try:
        data = json.loads(read())
    except (OSError, ValueError):
        return None
    settings = data.get("settings") if isinstance(data, dict) else None
    url = settings.get("base_url") if isinstance(settings, dict) else None
    return url if isinstance(url, str) else None


def _loopback_port(url: str | None) -> int | None:
    """The port of a URL on the loopback (None for any other)."""
    if not url:
        return None
    parts = urlsplit(url)
    if parts.hostname not in LOOPBACK:
        return None
    try:
        return parts.port
    except ValueError:
        return None


# one request to a port of 127.0.0.1 (argv[1]) and its whole answer on stdout: run here and
# on the host, to tell whether the host's port reaches the same server as this machine's
_ASK = ("import socket,sys\n"
        "s=socket.create_connection(('127.0.0.1',int(sys.argv[1])),5)\n"
        "s.settimeout(5)\n"
        "s.sendall(b'GET /fleet/mailbox HTTP/1.0\\r\\nHost: 127.0.0.1\\r\\n\\r\\n')\n"
        "d=b''\n"
        "while len(d)<65536:\n"
        " c=s.recv(4096)\n"
        " if not c: break\n"
        " d+=c\n"
        "sys.stdout.buffer.write(d)\n")


def _plain_answer(raw: bytes) -> bytes:
    """An HTTP answer without its Date header (the one line two answers differ by)."""
    return b"\n".join(line for line in raw.splitlines() if not line.startswith(b"Date:"))


def _answer_at(port: int) -> bytes:
    done = subprocess.run([sys.executable, "-S", "-c", _ASK, str(port)], capture_output=True,
                          timeout=20, check=False)
    return _plain_answer(done.stdout) if done.returncode == 0 else b""


class SshStaged:
    """The spec written on both sides; nothing runs yet."""

    def __init__(self, host: SshHost, remote_dir: str) -> None:
        self.host = host
        self.remote_dir = remote_dir
        self.done = False

    def spawn(self, env: dict[str, str]) -> int:
        assert not self.done, "spawned or abandoned already"
        self.done = True
        rest, keys = forwarded(env)
        order: dict[str, Any] = {"env": rest}
        if any(v and not v.startswith(TOKEN_PREFIX) for v in keys.values()):
            # the real key, not the attempt's token for the gateway: only a host that keeps
            # its key gets it, into its own file once, read there by each runner
            order["key_file"] = self.host.keep_key(keys)
        else:
            order["keys"] = keys  # the attempt's token (or nothing), through the pipe
        answer = self.host.agent(["spawn", self.remote_dir], input=json.dumps(order).encode())
        return int(answer["pid"])

    def abandon(self) -> None:
        self.done = True


class SshRun(RemoteRun):
    """One attempt's runner on the host, followed through its mirror."""

    def __init__(self, host: SshHost, attempt: Attempt) -> None:
        super().__init__(attempt)
        self.host = host

    @property
    def remote_dir(self) -> str:
        """The attempt folder on the host (asked of it once per host object: so not in
        __init__, which the engine's pass reaches for a host that may be away)."""
        return self.host.remote_attempt_dir(self.attempt.task_id, self.attempt.n)

    def state(self) -> RunnerState:
        """The mirror's last word, within FIRST_STATE_WAIT (never the host's round trip:
        the engine's pass asks it); "dead" once the host has been silent past its lease
        (the reason is in the local stop request: the engine records it)."""
        if self._log.exited:  # the mirror writes exit.json last: the folder is whole
            return "dead"
        if self.host.lost(self.key) is not None:
            return "dead"
        mirror = self.host.mirror(self)
        if not mirror.ended.is_set():
            mirror.wait_first()
        state = mirror.state
        if state == "dead":
            return "dead"
        if state == "never":
            return "never"
        if self.host.lose_if_silent(self, mirror):
            return "dead"
        return "alive"  # alive, or the host not reached yet: its runner goes on there

    def request_stop(self, reason: StopReason, message: str, *, at: float, by: str) -> None:
        self._log.request_stop(reason, message, at=at, by=by)
        if self.host.lost(self.key) is not None:
            return  # swept when the host is back
        request = {"reason": str(reason), "message": message, "at": at, "by": by}
        self.host.agent(["stop", self.remote_dir], input=json.dumps(request).encode())

    def kill(self) -> None:
        if self.host.lost(self.key) is not None:
            return  # swept when the host is back
        self.host.agent(["kill", self.remote_dir])

    def sweep(self) -> int:
        if self.host.lost(self.key) is not None:
            return 0  # swept when the host is back (SshHost.sweep_lost)
        return int(self.host.agent(["sweep", self.remote_dir]).get("swept", 0))

    def send_input(self, text: str, *, by: str = "") -> str:
        answer = self.host.agent(["say", self.remote_dir, by], input=text.encode())
        if "closed" in answer:
            raise InputClosed(str(answer["closed"]))
        return str(answer["id"])


class SshHost(RemoteHost):
    """A machine reached by `ssh TARGET`. Thread-safe for the engine's start threads.

    `reaches_gateway`: a worker here reaches this machine's gateway (and any endpoint on
    this machine's loopback) through a port forwarded over the connection (-R), so the
    engine sends it through the gateway with its attempt's token: the key stays here."""

    reaches_gateway = True

    def __init__(self, *, name: str, target: str, env: Mapping[str, str],
                 python: str = "python3", data_dir: str | None = None,
                 ssh_config: str | os.PathLike[str] | None = None, port: int | None = None,
                 claude: str | None = None, ssh: str = "ssh", lease: float = LEASE,
                 key_on_host: bool = False, cage: str | None = None) -> None:
        self.name = name
        self.cage = cage  # "off": its workers run uncaged (the host's setting)
        # `--key-on-host`: the host keeps the key (a 0600 file in its data dir) and its
        # workers go to their endpoint straight from there, on when this machine is away
        self.key_on_host = key_on_host
        self.reaches_gateway = not key_on_host
        self._key_files: dict[bytes, str] = {}  # digest of the key variables -> its file
        self.lease = lease  # seconds without an answer before its runs are lost
        self.env = env
        self.python = python  # the host's python (3.10 or newer)
        # the host's claude: None finds the host's own there (execution/worker/hostclaude.py);
        # this machine's `claude` setting is never sent
        self.claude = claude
        self.connection = Connection(target, port=port, config=ssh_config, ssh=ssh,
                                     env=env)
        self._data_dir = data_dir
        self._root: str | None = None
        self._package: str | None = None
        self._lock = threading.Lock()
        self._mirrors: dict[tuple[str, int], Mirror] = {}
        self._ended = threading.Event()
        self.pushes: list[tuple[int, int]] = []  # (objects, bytes) of each push of a base
        self.forwards: dict[int, int] = {}  # a loopback port here -> its port on the host
        self._forwarded_on: int | None = None  # the master the forwards were made on
        self._lost: dict[tuple[str, int], str] = {}  # (task, attempt) -> why it was lost
        self._to_sweep: set[tuple[str, int]] = set()  # the lost, until swept
        self._sweeper: threading.Thread | None = None
        self._sweep_tried = 0.0
        self.swept_lost: list[tuple[tuple[str, int], int]] = []  # (attempt, processes)
        self._ledger: LostLedger | None = None  # the engine's store: kept over a restart
        self._versions_said: set[tuple[str, str]] = set()  # (claude, version) warned of

    # --- the connection and the agent -------------------------------------------------

    @property
    def root(self) -> str:
        """The host's data dir (absolute), made private there, with the package in it."""
        self.install()
        assert self._root is not None
        return self._root

    def install(self) -> str:
        """fleet-tui's package in the host's data dir (copied once per version); its path."""
        with self._lock:
            if self._package is not None:
                return self._package
            given = self._data_dir or DEFAULT_DATA_DIR
            where = given if given == DEFAULT_DATA_DIR else shlex.quote(given)
            done = self.connection.run(f"mkdir -p -m 700 {where} && cd {where} && pwd -P")
            root = done.stdout.decode().strip().splitlines()[-1]
            version, tar = package_tar()
            package = f"{root}/pkg/{version}"
            q = shlex.quote(package)
            self.connection.run(
                f"test -f {q}/.complete || {{ rm -rf {q}.part && mkdir -p {q}.part && "
                f"tar -x -C {q}.part && rm -rf {q} && mv {q}.part {q} && touch {q}/.complete; }}",
                input=tar, timeout=120)
            self._root, self._package = root, package
            return package

    def agent(self, args: Sequence[str], *, input: bytes | None = None,
              ok: Sequence[int] = (0,), timeout: float = 60.0) -> dict[str, Any]:
        """One command of the host's agent; its JSON answer."""
        package = self.install()
        line = (f"PYTHONPATH={shlex.quote(package)} exec {shlex.quote(self.python)} -S -m "
                f"{AGENT} {shlex.join(list(args))}")
        done = self.connection.run(line, input=input or b"", timeout=timeout, check=False)
        out = done.stdout.decode("utf-8", "replace").strip().splitlines()
        try:
            answer = json.loads(out[-1]) if out else {}
        except ValueError:
            answer = {}
        if done.returncode not in ok:
            error = answer.get("error") if isinstance(answer, dict) else None
            raise SshError(f"host {self.name}: {error or self.connection.why(done)}")
        return answer if isinstance(answer, dict) else {}

    def follow_stream(self, remote_dir: str, offsets: dict[str, int]) -> subprocess.Popen[bytes]:
        package = self.install()
        if self.forwards:  # a new master (the old one dropped) forwards nothing yet
            self.connection.run("true")
            self.ensure_forwards()
        line = (f"PYTHONPATH={shlex.quote(package)} exec {shlex.quote(self.python)} -S -m "
                f"{AGENT} follow {shlex.quote(remote_dir)} {shlex.quote(json.dumps(offsets))}")
        return self.connection.popen(line)

    def mirror(self, run: SshRun) -> Mirror:
        key = (run.attempt.task_id, run.attempt.n)
        with self._lock:
            found = self._mirrors.get(key)
            if found is not None:
                return found
            adopted = not run.log.exited and not self._forwarding(run)
            mirror = Mirror(run.log.dir,
                            lambda offsets: self.follow_stream(run.remote_dir, offsets),
                            on_end=self._ended.set, on_frame=self.connection.reached)
            self._mirrors[key] = mirror
        if adopted:  # over the connection: not in the engine's pass
            threading.Thread(target=self._restore_forward_quietly, args=(run, mirror),
                             name=f"ssh-forward {self.name}", daemon=True).start()
        return mirror.start()

    # --- the lease -----------------------------------------------------------------------

    def lost(self, key: tuple[str, int]) -> str | None:
        """Why the attempt was lost (None: it was not)."""
        with self._lock:
            return self._lost.get(key)

    def lose_if_silent(self, run: SshRun, mirror: Mirror) -> bool:
        """Past the lease without an answer (counted from the mirror's start at the
        earliest): the run is lost. Its mirror stops, the reason goes into the local stop
        request (so the engine's verdict carries it), and the host remembers to sweep
        everything the attempt started there once it answers again."""
        silent = time.monotonic() - max(self.connection.reached_at, mirror.started_at)
        if silent <= self.lease:
            return False
        since = time.strftime("%H:%M:%S UTC", time.gmtime(time.time() - silent))
        reason = (f"lost: host {self.name} unreachable for {silent:.0f} s (since {since}), "
                  f"longer than its lease of {self.lease:g} s; what the attempt started "
                  "there is stopped when the host is back")
        with self._lock:
            if run.key in self._lost:
                return True
            self._lost[run.key] = reason
            self._to_sweep.add(run.key)
            self._mirrors.pop(run.key, None)
            ledger = self._ledger
        mirror.stop()
        if ledger is not None:
            ledger.lost(self.name, run.key[0], run.key[1], reason)
        run.log.request_stop(StopReason.ERROR, reason, at=time.time(), by=f"host {self.name}")
        log.warning("task %s attempt %d: %s", run.key[0], run.key[1], reason)
        return True

    def sweep_lost(self) -> int:
        """Kill every lost attempt's runner on the host and whatever carries its token
        (SshError while the host is still unreachable: they are kept for the next try).
        How many processes were stopped."""
        with self._lock:
            pending = sorted(self._to_sweep)
        total = 0
        for key in pending:
            answer = self.agent(["kill", self.remote_attempt_dir(*key)], timeout=30)
            swept = int(answer.get("swept", 0))
            total += swept
            with self._lock:
                self._to_sweep.discard(key)
                self.swept_lost.append((key, swept))
                ledger = self._ledger
            if ledger is not None:
                ledger.swept(self.name, key[0], key[1], swept)
            log.info("host %s is back: task %s attempt %d swept (%d process(es) by its "
                     "token)", self.name, key[0], key[1], swept)
        return total

    def keep_lost_in(self, ledger: LostLedger) -> None:
        """The lost attempts recorded by an engine before this one are lost here too
        (never followed again: "dead") and swept once the host answers."""
        pending = ledger.to_sweep(self.name)
        with self._lock:
            self._ledger = ledger
            for task_id, n, reason in pending:
                self._lost.setdefault((task_id, n), reason)
                self._to_sweep.add((task_id, n))

    def _sweep_in_background(self) -> None:
        with self._lock:
            if not self._to_sweep or (self._sweeper is not None and self._sweeper.is_alive()) \
                    or time.monotonic() - self._sweep_tried < SWEEP_RETRY:
                return
            self._sweep_tried = time.monotonic()
            self._sweeper = threading.Thread(target=self._sweep_quietly,
                                             name=f"ssh-sweep {self.name}", daemon=True)
            self._sweeper.start()

    def _sweep_quietly(self) -> None:
        try:
            self.sweep_lost()
        except SshError as exc:
            log.info("host %s: lost attempts not swept yet: %s", self.name, exc)

    def _restore_forward_quietly(self, run: SshRun, mirror: Mirror) -> None:
        """Tried again each RECONNECT_FORWARD while the host does not answer, until the run
        is followed no more."""
        while not mirror.stopping.is_set() and not mirror.ended.is_set():
            try:
                self._restore_forward(run)
                return
            except SshError as exc:
                log.info("host %s: %s (tried again)", self.name, exc)
            mirror.stopping.wait(RECONNECT_FORWARD)

    def _forwarding(self, run: SshRun) -> bool:
        """The run's base URL is not on this machine's loopback, or its port is forwarded
        by this host object already."""
        port = _loopback_port(_spec_base_url(run.log.read_spec))
        return port is None or port in self.forwards

    def _restore_forward(self, run: SshRun) -> None:
        """A runner started by another engine (or before this one restarted): its worker
        asks the host's port it was given; forward that port again to this machine's."""
        local = _loopback_port(_spec_base_url(run.log.read_spec))
        done = self.connection.run(f"cat {shlex.quote(run.remote_dir + '/spec.json')}",
                                   check=False)
        there = _loopback_port(_spec_base_url(lambda: done.stdout.decode()))
        if local is None or there is None:
            return
        with self._lock:
            self.forwards[local] = there
            self._forwarded_on = None
        self.ensure_forwards()

    def forward(self, local_port: int) -> int:
        """The host's loopback port that reaches `local_port` here (made once, then kept
        the same over every master, so a running worker's base URL stays right)."""
        with self._lock:
            known = self.forwards.get(local_port)
        if known is None:
            known = self.connection.forward_remote(local_port)
            with self._lock:
                self.forwards[local_port] = known
                self._forwarded_on = self.connection.master_pid()
            return known
        self.ensure_forwards()
        return known

    def ensure_forwards(self) -> None:
        """Forward the known ports again on a master that has not got them."""
        master = self.connection.master_pid()
        with self._lock:
            if master is None or master == self._forwarded_on:
                return
            wanted = dict(self.forwards)
            self._forwarded_on = master
        for local, remote in wanted.items():
            try:
                self.connection.forward_remote(local, remote)
            except SshError as exc:
                if self._reaches(local, remote):  # held by another forward to the same
                    log.info("host %s: port %d there reaches this machine's %d already "
                             "(%s)", self.name, remote, local, exc)
                else:
                    log.warning("host %s: %s", self.name, exc)

    def _reaches(self, local: int, remote: int) -> bool:
        """Whether the host's 127.0.0.1:`remote` answers as this machine's `local` does
        (a forward of another connection of this machine holds it: nothing to say)."""
        mine = _answer_at(local)
        if not mine:
            return False
        done = self.connection.run(f"{shlex.quote(self.python)} -S -c "
                                   f"{shlex.quote(_ASK)} {remote}", check=False, timeout=20)
        return done.returncode == 0 and _plain_answer(done.stdout) == mine

    def _base_url_there(self, url: str) -> str:
        """A base URL on this machine's loopback, as the host reaches it (its port
        forwarded); any other as it is."""
        port = _loopback_port(url)
        if port is None:
            return url
        return urlunsplit(urlsplit(url)._replace(netloc=f"127.0.0.1:{self.forward(port)}"))

    def remote_root(self) -> str:
        return self.root

    def remote_attempt_dir(self, task_id: str, n: int) -> str:
        return f"{self.root}/attempts/{task_id}/{n}"

    def git_url(self, path: str) -> str:
        c = self.connection
        if c.port is not None:
            return f"ssh://{c.target}:{c.port}{path}"
        return f"{c.target}:{path}"

    def git_env(self) -> dict[str, str]:
        return dict(self.env, GIT_SSH_COMMAND=self.connection.ssh_command(),
                    GIT_TERMINAL_PROMPT="0")

    # --- placing -----------------------------------------------------------------------

    def free_port(self) -> int:
        return int(self.agent(["port"])["port"])

    def check_setup(self, settings: Settings, env: Mapping[str, str], *,
                    args: Sequence[str] = (), permission_mode: str | None = None) -> None:
        super().check_setup(settings, env, args=args, permission_mode=permission_mode)
        if not settings.gateway and not self.key_on_host:
            raise FleetError(
                f"host {self.name}: its workers reach their endpoint through this machine's "
                "gateway (the key never goes to a host), and the gateway is off (gateway = "
                "false); turn it on in config.toml, or let the host keep the key: "
                f"`fleet-tui host add {self.name} TARGET --key-on-host`")

    def keep_key(self, keys: Mapping[str, str]) -> str:
        """The host's file holding `keys` (written there once: the key goes over the
        connection's stdin, never an argument); refused unless the host keeps its key."""
        if not self.key_on_host:
            raise SshError(f"host {self.name}: refusing to send the API key to the host (it "
                           "is not one that keeps its key: `fleet-tui host add ... "
                           "--key-on-host`); its workers go through the gateway")
        data = json.dumps(dict(sorted(keys.items()))).encode()
        digest = hashlib.sha256(data).digest()
        with self._lock:
            found = self._key_files.get(digest)
        if found is not None:
            return found
        path = f"{self.root}/keys/{digest.hex()[:16]}.json"
        self.agent(["put-key", path], input=data)
        with self._lock:
            self._key_files[digest] = path
        return path

    def push_base(self, repo: Path, commit: str, task_id: str) -> str:
        """The base commit in the host's mirror of `repo` (only what it lacks is sent)."""
        mirror = self.mirror_path(repo)
        q = shlex.quote(mirror)
        # made aside and renamed: two starts at once (or one of a killed engine) never
        # run `git init` on the same folder (its config.lock: "could not set ...")
        try:
            self.connection.run(
                f"test -d {q} || {{ mkdir -p {shlex.quote(str(Path(mirror).parent))} && "
                f"t=$(mktemp -d {q}.XXXXXX) && git init -q --bare \"$t\" && "
                f"{{ {shlex.quote(self.python)} -c 'import os,sys; os.rename(*sys.argv[1:])' "
                f"\"$t\" {q} 2>/dev/null || rm -rf \"$t\"; }}; }}; test -d {q}")
        except SshError as exc:
            if _NO_GIT.search(str(exc)):
                raise SshError(self._no_git()) from None
            raise
        done = subprocess.run(
            ["git", "-C", str(repo), "push", "--progress", "--porcelain", "--no-verify",
             self.git_url(mirror), f"{commit}:refs/fleet/base/{task_id}"],
            capture_output=True, env=self.git_env(), timeout=600, check=False)
        err = done.stderr.decode("utf-8", "replace")
        if done.returncode != 0:
            if _NO_GIT.search(err):
                raise SshError(self._no_git())
            raise SshError(f"host {self.name}: could not send the repository: "
                           f"{_push_error(err)}", transient=dropped(err))
        match = next(reversed(list(WRITING.finditer(err))), None)  # the last: 'done.'
        sent = (int(match.group(1)), int(float(match.group(2)) * UNITS[match.group(3)])) \
            if match else (0, 0)
        self.pushes.append(sent)
        return mirror

    def _no_git(self) -> str:
        return (f"host {self.name} has no git on the PATH of its ssh sessions (the "
                "repository is sent to it with git): install git there")

    def make_worktree(self, task: Task, *, reattach: bool, reset: bool) -> git.WorktreeInfo:
        repo = Path(task.repo)
        if task.base_commit:
            base, base_branch = task.base_commit, task.base_branch
        else:
            found = git.resolve_base(repo, task.base_ref)
            base, base_branch = found.commit, found.branch
        mirror = self.push_base(repo, base, task.id)
        branch = task.branch or f"fleet/{task.id}"
        path = f"{self.root}/work/{task.id}"
        mode = "reattach" if reattach else "new"
        answer = self.agent(["worktree", mirror, path, branch, base, mode])
        return git.WorktreeInfo(Path(answer["path"]), branch, base, base_branch)

    def check_worktree(self, task: Task, worktree: Path) -> None:
        if str(worktree) == str(task.repo):
            raise FleetError(f"refusing to run task {task.id} in the main checkout {task.repo}")
        branch = task.branch or f"fleet/{task.id}"
        answer = self.agent(["check-worktree", str(worktree), branch], ok=(0, 1))
        if not answer.get("ok"):
            why = answer.get("error") or answer.get("branch")
            raise FleetError(f"task {task.id}: {worktree} on host {self.name} is not its "
                             f"worktree on {branch} ({why})")

    def stage(self, placement: Placement, spec: RunSpec) -> SshStaged:
        self.sweep_lost()  # a lost attempt's runner must not run beside a new one
        folder = AttemptLog(placement.attempt_dir)
        folder.clear_run_records()
        folder.write_spec(asdict(spec))
        paths.private_file(folder.events)
        remote = replace(spec, include=[], repo=spec.cwd,
                         settings=host_settings(spec.settings, self.claude))
        if isinstance(remote.settings.get("base_url"), str):
            remote.settings["base_url"] = self._base_url_there(remote.settings["base_url"])
        remote_dir = self.remote_attempt_dir(spec.task_id, spec.attempt)
        order = json.dumps({"spec": asdict(remote), "config_dir": spec.config_dir,
                            "set_up_after": not spec.setup, "data_dir": self.root}).encode()
        try:
            answer = self.agent(["stage", remote_dir],
                                input=order + b"\n" + self.included_tar(spec), ok=(0,))
        except SshError as exc:
            if "holds" in str(exc):
                raise NotStarted(str(exc)) from None
            if "the cage cannot run there" in str(exc):
                raise FleetError(f"{exc}; `fleet-tui host check {self.name} --yes` says what "
                                 "is missing there (and installs srt), or set cage = \"off\" "
                                 f"in [hosts.{self.name}] to run its workers uncaged") from None
            if "no claude there" in str(exc):
                raise FleetError(f"{exc}; `fleet-tui host check {self.name} --yes` installs "
                                 f"Claude Code {fleet_tui.CLAUDE_CODE_VERSION} there") from None
            raise
        self._said_version(answer)
        with self._lock:
            self._mirrors.pop((spec.task_id, spec.attempt), None)
        return SshStaged(self, remote_dir)

    def _said_version(self, answer: Mapping[str, Any]) -> None:
        """A host's claude of another version than the tested one: said once (one line)."""
        found = (str(answer.get("claude") or ""), str(answer.get("claude_version") or ""))
        if not found[0] or found[1] == fleet_tui.CLAUDE_CODE_VERSION:
            return
        with self._lock:
            if found in self._versions_said:
                return
            self._versions_said.add(found)
        log.warning("host %s: its claude at %s is %s, fleet-tui is tested with %s; "
                    "`fleet-tui host check %s --yes` installs that one there", self.name,
                    found[0], found[1] or "of no known version",
                    fleet_tui.CLAUDE_CODE_VERSION, self.name)

    # --- running -------------------------------------------------------------------------

    def runner_env(self) -> dict[str, str]:
        """The engine's environment; only its key variables and a few named ones reach the
        host (`forwarded`)."""
        return dict(self.env)

    def attach(self, attempt: Attempt) -> SshRun:
        return SshRun(self, attempt)

    def collect(self, task: Task) -> str:
        """The task's branch fetched from the host's mirror into the main repository (the
        worker's uncommitted work committed there first, as a merge here would)."""
        branch = task.branch or f"fleet/{task.id}"
        if task.worktree:
            name, email = self._identity(Path(task.repo))
            self.agent(["commit-work", str(task.worktree),
                        f"The worker's uncommitted work (task {task.id}, on host "
                        f"{self.name})", name, email])
        self._fetch(task, [f"+refs/heads/{branch}:refs/heads/{branch}"])
        return branch

    def _fetch(self, task: Task, refspecs: Sequence[str]) -> None:
        """Refs of the host's mirror of the task's repository into the main repository
        (only the objects it lacks come over)."""
        mirror = self.mirror_path(Path(task.repo))
        done = subprocess.run(
            ["git", "-C", str(task.repo), "fetch", "--no-tags", "--quiet", "--no-write-fetch-head",
             self.git_url(mirror), *refspecs],
            capture_output=True, env=self.git_env(), timeout=600, check=False)
        if done.returncode != 0:
            err = done.stderr.decode("utf-8", "replace")
            raise SshError(f"host {self.name}: could not fetch task {task.id}'s work: "
                           f"{err.strip()[-300:]}", transient=dropped(err))

    # --- the worktrees there (the seam's RemoteWorktrees) ------------------------------

    def remote_worktrees(self) -> SshHost:
        return self  # a task's worktree is on the host: never a folder of this machine

    def has_worktree(self, task: Task) -> bool:
        if not task.worktree:
            return False
        done = self.connection.run(f"test -d {shlex.quote(str(task.worktree))}", check=False)
        if done.returncode not in (0, 1):
            raise SshError(f"host {self.name}: {self.connection.why(done)}")
        return done.returncode == 0

    def snapshot(self, task: Task) -> str:
        """One agent command there (a commit of the worktree in a temporary index, kept
        at refs/fleet/snapshot/<id> of the mirror) and one fetch of it and the branch."""
        if not task.worktree:
            raise FleetError(f"task {task.id} has no worktree yet")
        ref = self.snapshot_ref(task)
        answer = self.agent(["snapshot", str(task.worktree), ref])
        branch = task.branch or f"fleet/{task.id}"
        self._fetch(task, [f"+{ref}:{ref}", f"+refs/heads/{branch}:refs/heads/{branch}"])
        return str(answer["commit"])

    def update_worktree(self, task: Task, *, base_commit: str, base_branch: str,
                        strategy: str, message: str) -> git.UpdateResult:
        if not task.worktree:
            raise FleetError(f"task {task.id} has no worktree yet")
        branch = task.branch or f"fleet/{task.id}"
        self.push_base(Path(task.repo), base_commit, f"update/{task.id}")
        name, email = self._identity(Path(task.repo))
        answer = self.agent(["update", str(task.worktree), base_commit, strategy, message,
                             name, email], timeout=300,
                            input=json.dumps({"conflicted": list(task.conflicts)}).encode())
        return update_result(answer, branch=branch, base_branch=base_branch,
                             base_commit=base_commit, strategy=strategy,
                             host=f"host {self.name}")

    def abort_update(self, task: Task) -> str:
        if not task.worktree:
            raise FleetError(f"task {task.id} has no worktree yet")
        answer = self.agent(["abort-update", str(task.worktree)], input=json.dumps(
            {"conflicted": list(task.conflicts)}).encode())
        if "error" in answer:
            raise FleetError(f"host {self.name}: {answer['error']}")
        what = answer.get("aborted")
        back = " (the worker's uncommitted work put back as it was)" \
            if answer.get("restored") else ""
        return (f"the {what} was aborted in its worktree on host {self.name}{back}" if what
                else f"nothing was stopped in its worktree on host {self.name}{back}")

    def _identity(self, repo: Path) -> tuple[str, str]:
        found = self.git_identity(repo)
        if found is None:
            raise FleetError(f"git has no identity in {repo} to commit the worker's work "
                             "with: set user.name and user.email")
        return found

    def release(self, task_id: str) -> None:
        # the worktree goes too (a merge or a discard here removes only this machine's),
        # and the mirrors forget it, under their lock (the agent's `release`); the attempt
        # folders stay (mirrored here already)
        try:
            self.agent(["release", self.root, task_id])
        except SshError as exc:
            log.warning("host %s: could not free task %s: %s", self.name, task_id, exc)

    def reap(self) -> None:
        with self._lock:
            for key, mirror in list(self._mirrors.items()):
                if mirror.ended.is_set() and not mirror.thread.is_alive():
                    del self._mirrors[key]
        self._sweep_in_background()  # the lost attempts, once the host answers again

    def close(self) -> None:
        """Stop following (the runners go on) and close the master connection."""
        with self._lock:
            mirrors = list(self._mirrors.values())
            self._mirrors.clear()
        for mirror in mirrors:
            mirror.stop()
        self.connection.close()


__all__ = ["SshHost", "SshRun", "SshStaged", "forwarded", "host_settings", "package_tar"]


def build(config: HostConfig, *, env: Mapping[str, str], python: str) -> SshHost:
    """The ssh kind's host of one `[hosts.NAME]` table (the kinds table's entry). The
    host's own python and claude are its own (python3 and claude on its PATH)."""
    own = kind_config.options(config)
    return SshHost(name=config.name, target=own.ssh, port=own.port, env=env,
                   key_on_host=own.key_on_host, cage=own.cage)
