"""What a worker, a model or a title holds never drives the user's terminal.

A task whose title and prompt carry escapes (CSI 2J, OSC 0, OSC 52, a bidi override), run
by the real claude against the scripted endpoint, whose worker prints the same to its tool
output, writes them into a file (its content and its name) and says them in its answer:
every command that shows any of it (`show`, `logs`, `logs --full`, `diff`, `diff --stat`,
`compare`, `review`, `cost`, `queue`, `ls`, and `logs --raw` to a terminal) prints no ESC
byte and no bidi override, and shows them visibly instead (␛)."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from endpoint_helpers import cli_env

from fleet_tui.core.terminal import visible
from fleet_tui.demo.endpoint import ScriptedEndpoint

ESCAPES = "\x1b]0;PWNED-TITLE\x07\x1b[2J\x1b]52;c;cHduZWQ=\x07\u202eevil\x9b31m"
# the worker's shell writes the same bytes (printf reads the octal escapes)
SHELL_ESCAPES = r"\033]0;PWNED-TITLE\007\033[2J\033]52;c;cHduZWQ=\007\342\200\256evil"
SCRIPTS = {
    "evil": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": f"printf '{SHELL_ESCAPES}\\n'; "
                               f"printf 'line {SHELL_ESCAPES}\\n' > \"$(printf 'f\\033[2J.txt')\"; "
                               f"printf 'ok {SHELL_ESCAPES}\\n' > plain.txt",
                    "description": f"write {ESCAPES}"}}],
        f"done {ESCAPES}",
    ],
}
BAD = (b"\x1b", "\u202e".encode(), b"\xc2\x9b")


def test_visible_shows_every_control_and_keeps_lines() -> None:
    shown = visible("a\tb\nc" + ESCAPES + "\r\x7f\u2066")
    assert shown.startswith("a\tb\nc␛]0;PWNED-TITLE␇␛[2J")
    assert "<U+202E>evil<U+009B>31m␍␡<U+2066>" in shown
    assert visible("plain ascii") == "plain ascii"
    assert not any(ch in shown for ch in "\x1b\x07\u202e\x9b\r")


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(SCRIPTS) as ep:
        yield ep


def _clean_output(out: bytes, what: str) -> None:
    for bad in BAD:
        assert bad not in out, f"{what}: {bad!r} reached the terminal:\n{out!r}"


def _cli(env: dict[str, str], cwd: Path, *args: str, code: int = 0) -> bytes:
    out = subprocess.run([sys.executable, "-m", "fleet_tui.cli", *args], cwd=cwd, env=env,
                         stdin=subprocess.DEVNULL, capture_output=True, timeout=180)
    assert b"Traceback" not in out.stderr, out.stderr.decode()
    assert out.returncode == code, (args, out.stdout.decode(), out.stderr.decode())
    _clean_output(out.stdout, f"{args} stdout")
    _clean_output(out.stderr, f"{args} stderr")
    return out.stdout


def _in_terminal(env: dict[str, str], cwd: Path, *args: str) -> bytes:
    """`fleet-tui ARGS` with its stdout on a pseudo-terminal, as a user runs it."""
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "fleet_tui.cli", *args], cwd=cwd,
                            env=env, stdin=subprocess.DEVNULL, stdout=child,
                            stderr=subprocess.PIPE)
    os.close(child)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 1.0)
        if ready:
            try:
                data = os.read(main, 65536)
            except OSError:  # the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(main)
    assert proc.wait(timeout=30) == 0
    return b"".join(chunks)


@pytest.mark.real_claude
def test_no_command_prints_a_workers_escapes(endpoint: ScriptedEndpoint, claude_bin: str,
                                             git_repo: Path) -> None:
    # through the gateway: its meter gives `cost` rows, with the tasks' titles
    env = cli_env(endpoint.url, claude_bin, "sk-escape-test-SECRET-77f1",
                  FLEET_WORKER_GATEWAY="1")
    try:
        _every_command(env, git_repo)
    finally:  # the gateway this test's workers went through
        subprocess.run([sys.executable, "-m", "fleet_tui.cli", "gateway", "stop"],
                       cwd=git_repo, env=env, capture_output=True, timeout=60)


def _every_command(env: dict[str, str], git_repo: Path) -> None:
    title = f"title {ESCAPES}"
    run = _cli(env, git_repo, "run", f"[script:evil] go {ESCAPES}", "--title", title,
               "--copies", "2", "--wait", "--json")
    tasks = json.loads(run)
    assert [t["state"] for t in tasks] == ["succeeded", "succeeded"]
    first, second = (t["id"] for t in tasks)

    shown = _cli(env, git_repo, "show", first).decode()
    assert "title:     title ␛]0;PWNED-TITLE␇␛[2J" in shown  # visible, not dropped
    assert "<U+202E>evil" in shown
    _cli(env, git_repo, "ls")
    logs = _cli(env, git_repo, "logs", first).decode()
    assert "done" in logs
    full = _cli(env, git_repo, "logs", first, "--full").decode()
    assert "␛]52;c;cHduZWQ=␇" in full  # the tool's output, the clipboard escape shown
    assert "done ␛]0;PWNED-TITLE␇" in full  # the model's words
    raw = _in_terminal(env, git_repo, "logs", first, "--raw")
    _clean_output(raw, "logs --raw on a terminal")
    assert b'"type":"result"' in raw.replace(b" ", b"")
    diff = _cli(env, git_repo, "diff", first).decode()
    assert "+ok ␛]0;PWNED-TITLE␇" in diff
    stat = _cli(env, git_repo, "diff", first, "--stat").decode()
    assert "plain.txt" in stat
    _cli(env, git_repo, "compare", first)
    _cli(env, git_repo, "review", first, "--comment", "plain.txt:1", f"why {ESCAPES}?")
    review = _cli(env, git_repo, "review", first).decode()
    assert "why ␛]0;PWNED-TITLE␇" in review
    cost = _cli(env, git_repo, "cost", "--by", "task").decode()
    assert "title ␛]0;PWNED-TITLE␇" in cost, cost  # the meter's rows name their titles
    _cli(env, git_repo, "discard", second, "--yes")
    _cli(env, git_repo, "queue", first, "--yes", "--wait")
    _cli(env, git_repo, "queue")


@pytest.mark.real_claude
async def test_the_panels_toasts_show_escapes(claude_bin: str, git_repo: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The toast of a finished task carries its title: shown with ␛, never the ESC."""
    from test_ui_support import QUICK_SCRIPTS, TEST_KEY, wait_until

    from fleet_tui.engine.fleet import Fleet
    from fleet_tui.settings.config import load_settings
    from fleet_tui.store.db import TaskSpec
    from fleet_tui.ui.app import FleetApp

    with ScriptedEndpoint(QUICK_SCRIPTS) as ep:
        monkeypatch.setenv("FLEET_WORKER_BASE_URL", ep.url)
        monkeypatch.setenv("FLEET_WORKER_CLAUDE", claude_bin)
        monkeypatch.setenv("FLEET_WORKER_KEY_SOURCES", "env")
        monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", TEST_KEY)
        monkeypatch.setenv("CLAUDE_CODE_MAX_RETRIES", "0")
        fleet = Fleet(load_settings())
        app = FleetApp(fleet, repo=git_repo, default_base="main", bell=False,
                       poll_interval=0.25, scheduler_interval=0.2)
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause(0.5)  # the list seen once: the finish is news
            (task,) = fleet.submit(TaskSpec(prompt="write it", title=f"t {ESCAPES}",
                                            repo=git_repo))
            await wait_until(pilot, lambda: any(task.id in title
                                                for _, title, _ in app.toasts),
                             what="the toast of the finished task", timeout=90)
            (message,) = [m for _, title, m in app.toasts if task.id in title]
            assert "t ␛]0;PWNED-TITLE␇" in message and "<U+202E>" in message
            assert not any(bad.decode() in message for bad in BAD)
