"""`fleet-tui host check --yes`: the pinned claude installed with the real npm, against a
registry on 127.0.0.1 (the npm config's `registry`, as a mirror would be set): a failure
shows npm's own `npm error ...` lines (not only the path of its log), and an install that
does not end is stopped at its time limit, with progress lines meanwhile and nothing of
npm left running.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from ports import silent_port

from fleet_tui.commands import host as host_cli
from fleet_tui.engine import host_check

pytestmark = pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed")


class _NotFound(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"error":"Not found"}'
        self.send_response(404)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def missing_registry() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def silent_registry() -> Iterator[str]:
    """Takes connections and never answers (a registry behind a stuck proxy)."""
    with silent_port() as port:
        yield f"http://127.0.0.1:{port}/"


def _no_claude(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, registry: str) -> None:
    monkeypatch.setenv("FLEET_TUI_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.setenv("FLEET_WORKER_CLAUDE", "claude")
    monkeypatch.setenv("PATH", os.pathsep.join(
        p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "claude").exists()))
    monkeypatch.setenv("npm_config_registry", registry)
    monkeypatch.setenv("npm_config_cache", str(tmp_path / "npm-cache"))
    monkeypatch.setenv("npm_config_fetch_retries", "0")
    monkeypatch.setenv("npm_config_update_notifier", "false")


def test_a_failed_install_shows_npms_own_error_lines(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing_registry: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    _no_claude(monkeypatch, tmp_path, missing_registry)
    code = host_cli.main(["check", "local", "--yes"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "npm failed here: npm exited with" in out, out
    shown = [line.strip() for line in out.splitlines() if line.strip().startswith("npm error")]
    # the cause, not only "A complete log of this run can be found in: ..."
    assert any("E404" in line or "404 Not Found" in line for line in shown), out
    assert "Traceback" not in out


def test_an_install_that_does_not_end_is_stopped_at_its_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, silent_registry: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    _no_claude(monkeypatch, tmp_path, silent_registry)
    monkeypatch.setattr(host_check, "INSTALL_LIMIT", 6.0)
    monkeypatch.setattr(host_check, "PROGRESS_EVERY", 1.0)
    began = time.monotonic()
    code = host_cli.main(["check", "local", "--yes"])
    took = time.monotonic() - began
    out = capsys.readouterr().out
    assert code == 1, out
    assert "stopped after 6 s" in out
    assert out.count("still installing (") >= 2, out  # progress while it waited
    assert "npm failed here: no end within 6 s: stopped" in out, out
    assert took < 60, took
    # nothing of that npm left running (found by this test's npm cache in its environment)
    # (`timeout` gave npm a group of its own and passed the SIGTERM on: it ends soon)
    deadline = time.monotonic() + 15
    while _ours(tmp_path / "npm-cache") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _ours(tmp_path / "npm-cache") == []


def _ours(cache: Path) -> list[int]:
    mark = f"npm_config_cache={cache}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if mark in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found
