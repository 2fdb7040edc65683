"""A real OpenSSH server on 127.0.0.1 for the SSH host's tests (Debian's openssh-server).

Each `Sshd` has its own host key, config, port and data dir (the host's HOME, set for the
session by `environment=` in authorized_keys): two of them are two hosts. Login is by a
generated test key only (no password, no keyboard-interactive); the client side is a test
ssh_config with an alias, `StrictHostKeyChecking yes` and a known_hosts holding the
server's key: nothing is accepted blindly.

`user=NAME`: the host is that Linux user (tests/ssh_support.linux_user makes one): login
as that user, whose own HOME (its passwd entry's) is the host's: nothing of this machine's
user, its HOME or its Python environment is there.

`private_home=True`: the server runs in a mount namespace of its own (bubblewrap) where a
private folder is mounted over its HOME, so the host's data dir (its mirror, worktrees and
attempt folders) exists for the host only: on this machine the HOME stays an empty folder,
and a controller that opened a path of the host's would find nothing there.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from fleet_tui.system import procs

SSHD = "/usr/sbin/sshd"

# The sessions of each sshd when it was stopped, (pid, start time): a session's sshd calls
# setsid and outlives the listener, as on a machine whose sshd stops, and with it the
# client's ControlPersist master (600 s). A test that stops a server mid-way wants that;
# `end_sessions` (each pytest process's end, tests/conftest.py) ends what is left.
_SESSIONS: list[tuple[int, str]] = []


def missing() -> str | None:
    """Why no test sshd can run here (None: it can)."""
    if not os.path.isfile(SSHD):
        return ("Debian's openssh-server is not installed (`apt-get install "
                "openssh-server`; scripts/test installs it as root)")
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "the ssh client is not installed (openssh-client)"
    if os.geteuid() != 0 and not os.path.isdir("/run/sshd"):
        return ("sshd needs its privilege separation folder /run/sshd, which only root "
                "can make")
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Sshd:
    """One running sshd and the client files that reach it."""

    base: Path
    alias: str
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    private_home: bool = False
    user: str | None = None  # another Linux user (its own HOME); None: this one

    @property
    def home(self) -> Path:
        """The host's HOME: its data dir lives under it, apart from every file of ours."""
        if self.user is not None:
            import pwd

            return Path(pwd.getpwnam(self.user).pw_dir)
        return self.base / "host-home"

    @property
    def client_config(self) -> Path:
        return self.base / "client" / "ssh_config"

    def start(self) -> Sshd:
        client = self.base / "client"
        server = self.base / "server"
        for folder in (client, server, *([] if self.user else [self.home])):
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(0o700)
        key, host_key = client / "id_ed25519", server / "host_ed25519"
        for path, comment in ((key, "fleet-test-client"), (host_key, "fleet-test-host")):
            if not path.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment,
                                "-f", str(path)], check=True)
        home = self.home
        # another user keeps the HOME of its passwd entry; this one gets a HOME of its own
        options = f'environment="FLEET_TEST_HOST={self.alias}" ' if self.user else \
            f'environment="HOME={home}",environment="FLEET_TEST_HOST={self.alias}" '
        keys = server / "authorized_keys"
        if self.user:  # sshd reads it as the user: in the user's own ~/.ssh
            keys = self._users_keys_file()
        keys.write_text(options + key.with_suffix(".pub").read_text())
        keys.chmod(0o600)
        if self.user:
            shutil.chown(keys, self.user, self.user)
        if not Path("/run/sshd").is_dir():  # privilege separation's chroot (root: missing())
            Path("/run/sshd").mkdir(mode=0o755)
        self.port = self.port or _free_port()
        (server / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n"
            f"PidFile {server / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {keys}\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PubkeyAuthentication yes\nPermitRootLogin prohibit-password\nUsePAM no\n"
            "PermitUserEnvironment yes\nStrictModes no\nAllowTcpForwarding yes\n"
            "MaxSessions 64\nMaxStartups 64:30:128\nLogLevel ERROR\n")
        (client / "known_hosts").write_text(
            f"[127.0.0.1]:{self.port} " + " ".join(
                host_key.with_suffix(".pub").read_text().split()[:2]) + "\n")
        self.client_config.write_text(
            f"Host {self.alias}\n  HostName 127.0.0.1\n  Port {self.port}\n"
            f"  User {self.user or os.environ.get('USER') or 'root'}\n  IdentityFile {key}\n"
            "  IdentitiesOnly yes\n  StrictHostKeyChecking yes\n"
            f"  UserKnownHostsFile {client / 'known_hosts'}\n  LogLevel ERROR\n")
        argv = [SSHD, "-D", "-e", "-f", str(server / "sshd_config")]
        if self.private_home:
            hidden = self.base / "host-only"
            hidden.mkdir(mode=0o700, exist_ok=True)
            argv = ["bwrap", "--dev-bind", "/", "/", "--bind", str(hidden), str(home),
                    "--cap-add", "ALL", "--", *argv]
        self.proc = subprocess.Popen(argv,
                                     stdout=subprocess.DEVNULL,
                                     stderr=open(server / "sshd.log", "ab"),  # noqa: SIM115
                                     start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("sshd exited: " + (server / "sshd.log").read_text()[-500:])
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.02)
        raise RuntimeError("sshd did not listen within 10 s")

    def _users_keys_file(self) -> Path:
        folder = self.home / ".ssh"
        folder.mkdir(mode=0o700, exist_ok=True)
        assert self.user is not None
        shutil.chown(folder, self.user, self.user)
        return folder / "authorized_keys"

    def ssh(self, command: str, *, check: bool = True, input: str | None = None) -> str:
        """A command on the host through a connection of its own (not the host's master).
        Its output is decoded leniently: a listing of the host's processes holds every
        process of this machine, and another test's worker may carry bytes that are not
        UTF-8 in its command line (one did: the strict decode failed a test mid-run)."""
        done = subprocess.run(["ssh", "-F", str(self.client_config), "-o", "BatchMode=yes",
                               "-o", "ControlMaster=no", "-o", "ControlPath=none", self.alias,
                               "--", command], capture_output=True, text=True, check=False,
                              input=input, errors="replace")
        if check and done.returncode != 0:
            raise RuntimeError(f"ssh {command!r}: {done.stderr.strip()}")
        return done.stdout

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            for pid in procs.descendants(self.proc.pid):
                start = procs.start_time(pid)
                if start is not None:
                    _SESSIONS.append((pid, start))
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None


def end_sessions() -> list[int]:
    """SIGTERM to what the stopped servers' sessions left running (each checked by its
    start time: never a pid handed out again): the pids signalled."""
    ended = [pid for pid, start in _SESSIONS
             if procs.is_alive(pid, start) and procs.signal_pid(pid, signal.SIGTERM)]
    _SESSIONS.clear()
    return ended
