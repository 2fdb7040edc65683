"""Bench 12's bytes figures: what reaches the host for the first and the second
task of a repository of SIZE of incompressible content.

Counted on the wire: the host's ssh connection goes through a relay (the client config's
ProxyCommand, RELAY below) that counts every byte the controller's ssh master writes to the
host's sshd (encrypted SSH packets, so git's pack plus git's protocol plus SSH's framing
and MACs), and what it reads back. The master is made (and fleet-tui's package installed)
before the count starts, so its handshake is not in it. Task 1 is `SshHost.push_base` of
the repository's commit into a host that has no mirror of it; task 2 is `push_base` of the
same repository with one small new commit (NEW_FILE bytes of random content). git's own
report ("Writing objects: ... N MiB", `SshHost.pushes`) is a context row.

Baselines, the least any git transport must send, measured in the same round: for task 1
the repository's whole pack (`git pack-objects --stdout --revs` of the commit), for task 2
the pack of what is new only (`NEW ^OLD`).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

RELAY = r'''
import os, socket, sys, threading
host, port, count = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sock = socket.create_connection((host, port))
sent = [0, 0]
fd = os.open(count, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
lock = threading.Lock()
def note(i, n):
    with lock:
        sent[i] += n
        os.pwrite(fd, ("%20d %20d\n" % (sent[0], sent[1])).encode(), 0)
def back():
    while True:
        data = sock.recv(65536)
        if not data:
            break
        note(1, len(data))
        os.write(1, data)
    os._exit(0)
threading.Thread(target=back, daemon=True).start()
while True:
    data = os.read(0, 65536)
    if not data:
        break
    sock.sendall(data)
    note(0, len(data))
sock.shutdown(socket.SHUT_WR)
threading.Event().wait()
'''
NEW_FILE = 10_000  # bytes of the second task's new commit (random, so incompressible)


def _git(cwd: Path, *args: str, input: bytes | None = None) -> bytes:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          input=input).stdout


def make_big_repo(path: Path, size: int) -> Path:
    """A repository of one commit holding `size` bytes of random content in 1 MB files."""
    from bench.common import make_repo

    make_repo(path)
    chunk = 1_000_000
    for i in range(max(1, size // chunk)):
        (path / "data" / f"{i:03d}.bin").parent.mkdir(exist_ok=True)
        (path / "data" / f"{i:03d}.bin").write_bytes(os.urandom(min(chunk, size)))
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "the data")
    return path


def add_small_commit(repo: Path, n: int) -> str:
    (repo / f"new-{n}.bin").write_bytes(os.urandom(NEW_FILE))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"one small commit {n}")
    return _git(repo, "rev-parse", "HEAD").decode().strip()


def pack_size(repo: Path, revs: str) -> int:
    """The pack git would send for `revs` (one a line, `^X` excluded)."""
    out = subprocess.run(["git", "pack-objects", "--stdout", "--revs", "-q"], cwd=repo,
                         input=revs.encode(), capture_output=True, check=True).stdout
    return len(out)


def counting_config(server: Any, relay: Path, count: Path) -> Path:
    """The test server's client config with the counting relay as its ProxyCommand."""
    text = server.client_config.read_text()
    proxy = " ".join(shlex.quote(p) for p in (sys.executable, str(relay)))
    text = text.replace("  LogLevel ERROR\n",
                        f"  LogLevel ERROR\n  ProxyCommand {proxy} %h %p {shlex.quote(str(count))}"
                        "\n", 1)
    out = server.client_config.with_name("ssh_config_counting")
    out.write_text(text)
    return out


def counted(count: Path) -> tuple[int, int]:
    try:
        sent, got = count.read_text().split()
    except (OSError, ValueError):
        return 0, 0
    return int(sent), int(got)


def one_round(server: Any, repo: Path, env: dict[str, str], root: Path, n: int
              ) -> dict[str, float]:
    """Task 1 and task 2 of `repo` to a host that holds nothing of it yet."""
    from fleet_tui.execution.ssh.host import SshHost

    relay = root / "relay.py"
    relay.write_text(RELAY)
    count = root / f"count-{n}"
    config = counting_config(server, relay, count)
    host = SshHost(name="bytes", target=server.alias, env=env, python="/usr/bin/python3",
                   ssh_config=config, data_dir=f"{server.home}/bytes-{n}")
    try:
        host.install()
        if counted(count)[0] == 0:
            raise RuntimeError("the relay counted nothing: the connection did not go "
                               "through it")
        old = _git(repo, "rev-parse", "HEAD").decode().strip()
        before = counted(count)
        host.push_base(repo, old, f"one-{n}")
        after_first = counted(count)
        new = add_small_commit(repo, n)
        host.push_base(repo, new, f"two-{n}")
        after_second = counted(count)
        (_, git1), (_, git2) = host.pushes
    finally:
        host.close()
    return {"first": after_first[0] - before[0], "second": after_second[0] - after_first[0],
            "first_back": after_first[1] - before[1],
            "second_back": after_second[1] - after_first[1],
            "git_first": git1, "git_second": git2,
            "pack_first": pack_size(repo, old + "\n"),
            "pack_second": pack_size(repo, f"{new}\n^{old}\n")}


__all__ = ["make_big_repo", "one_round"]
