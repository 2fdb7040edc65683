"""The README's "Trying it on your own repository without a key", run as written: the
commands of its code blocks, in order, on a repository of the user's (not the demo's),
with the real claude. Two things differ from a user's shell, and only these: the port
(8429 in the README, a free one here, so that parallel runs do not meet) and `ID` (the
README says to use the ID that `run` printed)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet_tui.commands.scripted import NOTE, settings_text

pytestmark = pytest.mark.real_claude

ROOT = Path(__file__).resolve().parents[2]
README_PORT = "8429"


def _section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("#### Trying it on your own repository without a key")
    end = readme.index("\n#", start + 10)
    return readme[start:end]


def _blocks(section: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


def _commands(block: str) -> list[str]:
    """Each line of a bash block, its trailing comment dropped."""
    out = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(shlex.join(words))
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_readme_way_to_try_it_without_a_key(tmp_path: Path, claude_bin: str) -> None:
    section = _section()
    serve_block, *run_blocks = _blocks(section, "bash")
    (toml,) = _blocks(section, "toml")
    port = str(_free_port())
    # the user's own repository: a small project with a README, nothing of the demo's
    repo = tmp_path / "my-project"
    repo.mkdir()
    (repo / "README.md").write_text("# My project\n\nIt does things.\n")
    (repo / "main.py").write_text("print('hi')\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.name=Me", "-c", "user.email=me@example.com", "commit", "-q",
                  "-m", "start"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    config = tmp_path / "config.toml"
    env = {k: v for k, v in os.environ.items()
           if k not in ("ANTHROPIC_AUTH_TOKEN", "ZHIPU_API_KEY", "GLM_API_KEY")}
    bindir = tmp_path / "bin"  # `fleet-tui` on PATH, as an installed one is
    bindir.mkdir()
    (bindir / "fleet-tui").write_text(f"#!/bin/sh\nexec {sys.executable} -m fleet_tui.cli "
                                      '"$@"\n')
    (bindir / "fleet-tui").chmod(0o755)
    env.update(PATH=f"{bindir}{os.pathsep}{env['PATH']}", FLEET_TUI_CONFIG=str(config),
               FLEET_WORKER_CLAUDE=claude_bin, FLEET_WORKER_KEY_SOURCES="env",
               PYTHONPATH=str(ROOT))
    (serve,) = _commands(serve_block)
    server = subprocess.Popen(serve.replace(README_PORT, port), shell=True, cwd=repo,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
    try:
        assert server.stdout is not None
        printed: list[str] = []
        deadline = time.monotonic() + 60
        while not any(line.startswith("key_env") for line in printed):
            assert time.monotonic() < deadline and server.poll() is None, printed
            printed.append(server.stdout.readline())
        text = "".join(printed)
        assert f"port {port}" in text and str(config) in text
        # what it prints is the README's table, at its port
        assert settings_text(f"http://127.0.0.1:{port}") in text
        assert toml.replace(README_PORT, port) == settings_text(f"http://127.0.0.1:{port}")
        config.write_text(toml.replace(README_PORT, port))
        task_id = ""
        for command in (c for block in run_blocks for c in _commands(block)):
            if command.startswith("export "):
                name, _, value = command.removeprefix("export ").partition("=")
                env[name] = value
                continue
            command = command.replace(" ID", f" {task_id}") if task_id else command
            done = subprocess.run(command, shell=True, cwd=repo, env=env,
                                  capture_output=True, text=True, timeout=180)
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            assert "Traceback" not in done.stderr
            if " run " in command:
                task_id = done.stdout.split()[0]
                assert "succeeded" in done.stderr, done.stderr
            if " diff " in command:
                assert f"+++ b/{NOTE}" in done.stdout
                assert "start a changelog" in done.stdout  # the prompt, in the notes
        assert task_id
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)
            server.wait(timeout=30)
    assert "stopped" in server.stdout.read()
