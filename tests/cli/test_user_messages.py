"""What a newcomer met as a raw traceback or half a sentence, now one line that says what
is wrong and what to do: a task database that cannot be written or is damaged, a host
without git; and the README states the prompt's size limit the CLI enforces."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from endpoint_helpers import cli_env

from fleet_tui.commands.tasks import PROMPT_LIMIT
from fleet_tui.demo.endpoint import ScriptedEndpoint

ROOT = Path(__file__).resolve().parents[2]


def _cli(env: dict[str, str], cwd: Path, *args: str, prefix: tuple[str, ...] = (),
         stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*prefix, sys.executable, "-m", "fleet_tui.cli", *args], cwd=cwd,
                          env=env, input=stdin, capture_output=True, timeout=120)
    return subprocess.CompletedProcess(done.args, done.returncode,
                                       done.stdout.decode(errors="replace"),
                                       done.stderr.decode(errors="replace"))


def _one_line(out: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in out.stderr and "sqlite3." not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


@pytest.fixture
def store_env(claude_bin: str) -> Iterator[dict[str, str]]:
    with ScriptedEndpoint({"default": ["done"]}) as ep:
        yield cli_env(ep.url, claude_bin, "sk-messages-test-SECRET-11aa",
                      FLEET_WORKER_SANDBOX="1")


def _read_only_prefix(db: Path) -> tuple[str, ...]:
    """How to run a command with the store read-only for it: root writes through a file's
    mode, so a read-only bind mount of the file (bubblewrap) stands for `chattr +i` or a
    read-only file system; anyone else: the file's mode."""
    if os.geteuid() != 0:
        db.chmod(0o444)
        return ()
    if shutil.which("bwrap") is None:
        pytest.skip("root without bubblewrap: no way to make the store read-only here")
    return ("bwrap", "--dev-bind", "/", "/", "--ro-bind", str(db), str(db), "--")


@pytest.mark.real_claude
def test_a_read_only_store_is_one_line(store_env: dict[str, str], git_repo: Path) -> None:
    assert _cli(store_env, git_repo, "ls").returncode == 0  # the store made, empty
    db = Path(os.environ["FLEET_TUI_HOME"]) / "fleet.db"
    assert db.exists()
    prefix = _read_only_prefix(db)
    try:
        out = _cli(store_env, git_repo, "run", "write it", prefix=prefix)
        line = _one_line(out)
        assert out.returncode == 2, out.stderr
        assert line.startswith(f"fleet-tui run: the task database {db} cannot be written")
        assert "FLEET_TUI_HOME" in line and "make it writable" in line
    finally:
        db.chmod(0o600)
    assert _cli(store_env, git_repo, "ls").stdout.startswith("no tasks")  # nothing created


@pytest.mark.real_claude
def test_a_damaged_store_is_one_line(store_env: dict[str, str], git_repo: Path) -> None:
    out = _cli(store_env, git_repo, "run", "write it", "--wait")
    assert out.returncode == 0, out.stderr
    db = Path(os.environ["FLEET_TUI_HOME"]) / "fleet.db"
    for name in ("-wal", "-shm"):  # checkpointed: every page is in the file
        assert not Path(f"{db}{name}").exists() or _checkpoint(db)
    with db.open("r+b") as fh:  # pages past the header overwritten, as a bad disk does
        fh.seek(4096 * 2)
        fh.write(b"\xa5" * 4096 * 4)
    for command in (("ls",), ("run", "another"), ("show", "abc")):
        out = _cli(store_env, git_repo, *command)
        line = _one_line(out)
        assert out.returncode == 2, out.stderr
        assert f"the task database {db} is damaged" in line, line
        assert f"mv {db} {db}.damaged" in line and ".recover" in line


def _checkpoint(db: Path) -> bool:
    import sqlite3

    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return True


def test_a_host_without_git_says_so(tmp_path: Path, git_repo: Path) -> None:
    """A real sshd whose sessions have no git on their PATH (everything else is there):
    sending the repository says that git is missing there, not half of git's last line."""
    from ssh_support import ssh_host, start_sshd

    from fleet_tui.execution.ssh.connection import SshError

    server = start_sshd(tmp_path / "sshd", alias="fleet-nogit-host")
    try:
        bindir = tmp_path / "host-bin"
        bindir.mkdir()
        for folder in ("/usr/local/bin", "/usr/bin", "/bin"):
            if not os.path.isdir(folder):
                continue
            for name in os.listdir(folder):
                if not name.startswith("git") and not (bindir / name).exists():
                    (bindir / name).symlink_to(Path(folder) / name)
        keys = tmp_path / "sshd" / "server" / "authorized_keys"
        keys.write_text(f'environment="PATH={bindir}",' + keys.read_text())
        assert server.ssh("command -v git || echo none").strip() == "none"
        commit = subprocess.run(["git", "-C", str(git_repo), "rev-parse", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        host = ssh_host(server, dict(os.environ))
        try:
            # a first time, and a time when its mirror is there already (the push itself
            # then fails: git-receive-pack is not found)
            for _ in range(2):
                with pytest.raises(SshError) as caught:
                    host.push_base(git_repo, commit, "t1")
                assert str(caught.value) == (
                    "host box has no git on the PATH of its ssh sessions (the repository "
                    "is sent to it with git): install git there")
                server.ssh(f"mkdir -p {host.mirror_path(git_repo)}")
        finally:
            host.close()
    finally:
        server.stop()


def test_the_readme_states_the_prompt_limit(git_repo: Path, tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    assert "any length" not in readme
    assert re.search(r"up to 1 MiB \(1,048,576 bytes", readme)
    assert PROMPT_LIMIT == 1_048_576
    big = tmp_path / "prompt.txt"
    big.write_bytes(b"x" * (PROMPT_LIMIT + 1))
    out = _cli(dict(os.environ), git_repo, "run", "--file", str(big))
    assert out.returncode == 2 and "over 1 MiB" in _one_line(out)
