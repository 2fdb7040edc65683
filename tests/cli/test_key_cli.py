"""fleet-tui key set|delete|status, through the keyring library (stand-in file backend;
the fail backend for "no keyring here")."""

from __future__ import annotations

import os
import pty
import secrets
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import standin_claude

TUI_SCRIPT = Path(sys.executable).parent / "fleet-tui"
TIMEOUT = 30


def tui_cmd(*args: str) -> list[str]:
    if TUI_SCRIPT.exists():
        return [str(TUI_SCRIPT), *args]
    return [sys.executable, "-m", "fleet_tui.cli", *args]


def key_cmd(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(tui_cmd("key", *args), input=input, capture_output=True, text=True,
                          timeout=TIMEOUT, stdin=subprocess.DEVNULL if input is None else None)


@pytest.fixture
def key() -> str:
    return "sk-key-" + secrets.token_hex(20)


def test_set_from_stdin_then_status_then_worker_uses_it(key: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    stored = key_cmd("set", input=f"  {key}\r\n")
    assert stored.returncode == 0, stored.stderr
    assert "fleet-worker/api-key" in stored.stdout
    status = key_cmd("status")
    assert status.returncode == 0
    assert "the key would come from keyring fleet-worker/api-key" in status.stdout
    assert "-> keyring fleet-worker/api-key: set" in status.stdout
    # The stored value (whitespace and CR/LF stripped) is what a worker receives.
    record = tmp_path / "record.json"
    monkeypatch.setenv("FLEET_WORKER_CLAUDE", str(standin_claude.install(tmp_path / "bin")))
    monkeypatch.setenv("FLEET_WORKER_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("FLEET_STANDIN_RECORD", str(record))
    worker = subprocess.run(
        [sys.executable, "-c",
         "import sys; from fleet_tui.cli import worker_main; sys.exit(worker_main())", "hi"],
        capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert worker.returncode == 0, worker.stderr
    assert standin_claude.read_record(record)["helper_key"] == key
    for result in (stored, status, worker):
        assert key not in result.stdout + result.stderr


def test_status_names_the_winning_source_never_the_value(key: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLM_API_KEY", key)
    status = key_cmd("status")
    assert status.returncode == 0 and "the key would come from GLM_API_KEY" in status.stdout
    assert "keyring fleet-worker/api-key: no entry" in status.stdout
    assert key not in status.stdout + status.stderr
    monkeypatch.delenv("GLM_API_KEY")
    missing = key_cmd("status")
    assert missing.returncode == 5 and "fleet-tui key set" in missing.stdout


def test_set_warns_when_an_exported_token_wins(key: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "other-token-123")
    stored = key_cmd("set", input=key)
    assert stored.returncode == 0 and "ANTHROPIC_AUTH_TOKEN is set" in stored.stdout


def test_delete_and_delete_again(key: str) -> None:
    assert key_cmd("set", input=key).returncode == 0
    deleted = key_cmd("delete")
    assert deleted.returncode == 0 and "deleted" in deleted.stdout
    again = key_cmd("delete")
    assert again.returncode == 0 and "nothing to delete" in again.stdout
    assert key_cmd("status").returncode == 5


def test_custom_service_and_name(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert key_cmd("--service", "team", "--name", "glm", "set", input=key).returncode == 0
    monkeypatch.setenv("FLEET_WORKER_KEYRING_SERVICE", "team")
    monkeypatch.setenv("FLEET_WORKER_KEYRING_KEY", "glm")
    assert "would come from keyring team/glm" in key_cmd("status").stdout


def test_bad_input_is_refused(key: str) -> None:
    empty = key_cmd("set", input="\n")
    assert empty.returncode == 2 and "nothing stored" in empty.stderr
    spaced = key_cmd("set", input="two words\n")
    assert spaced.returncode == 2 and "whitespace" in spaced.stderr
    assert key_cmd("status").returncode == 5  # nothing was stored
    assert key_cmd().returncode == 2
    assert key_cmd("rotate").returncode == 2


def test_no_keyring_backend_says_so_and_points_to_env(key: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")
    for args, stdin in ((("set",), key), (("delete",), None)):
        result = key_cmd(*args, input=stdin)
        assert result.returncode == 6
        assert "no usable OS keyring backend" in result.stderr
        assert "ZHIPU_API_KEY" in result.stderr and "Traceback" not in result.stderr
        assert key not in result.stdout + result.stderr
    status = key_cmd("status")
    assert status.returncode == 5
    assert "keyring fleet-worker/api-key: no usable OS keyring backend" in status.stdout
    assert "export ZHIPU_API_KEY" in status.stdout


def _read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 1024)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    return seen


def _wait_or_kill(pid: int, timeout: float) -> int | None:
    """The child's exit code, or None (and the child killed) if it is still waiting."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


def test_set_from_a_terminal_does_not_echo(key: str) -> None:
    pid, fd = pty.fork()
    if pid == 0:  # child: runs with the pty as its controlling terminal
        cmd = tui_cmd("key", "set")
        try:
            os.execv(cmd[0], cmd)
        finally:
            os._exit(127)  # never return into pytest in the child
    try:
        prompt = _read_until(fd, b"input hidden", TIMEOUT)
        assert b"API key (input hidden):" in prompt
        os.write(fd, key.encode() + b"\n")
        rest = _read_until(fd, b"stored the key", TIMEOUT)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    assert b"stored the key" in rest
    assert key.encode() not in prompt + rest  # not echoed back to the terminal
    assert "the key would come from keyring" in key_cmd("status").stdout


def test_set_without_a_backend_refuses_before_asking_for_the_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 8: it asked for the secret first and only then said no backend is usable.
    Now the backend is checked first: no prompt on the terminal, exit 6, and what to do
    instead (environment variable, a Secret Service, or keyrings.alt at one's own risk)."""
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")
    pid, fd = pty.fork()
    if pid == 0:  # child: the pty is its controlling terminal
        cmd = tui_cmd("key", "set")
        try:
            os.execv(cmd[0], cmd)
        finally:
            os._exit(127)
    try:
        screen = _read_until(fd, b"keyrings.alt", TIMEOUT)
        status = _wait_or_kill(pid, TIMEOUT)
    finally:
        os.close(fd)
    assert status == 6, screen
    text = screen.decode(errors="replace")
    assert "input hidden" not in text and "API key" not in text.split("keyring")[0]
    for advice in ("no usable OS keyring backend", "nothing was asked or stored",
                   "export ANTHROPIC_AUTH_TOKEN=", "ZHIPU_API_KEY", "gnome-keyring",
                   "keyrings.alt", "own risk"):
        assert advice in text, text
    assert "Traceback" not in text
