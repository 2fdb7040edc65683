"""What the hosts say on the user's terminal, and only when it matters.

- A second connection's forward of a port the host's 127.0.0.1 holds already for the same
  server here (another process of this machine forwarded it: `run` beside the engine)
  changes nothing: said in the log at INFO, not as a warning on the terminal; a port held
  there by another server is a warning (the workers would reach that server).
  The same-machine shortcut (tests/sshd.py as this user): a forward's port on the host is
  a port of this machine.
- Ray's client lines ("Uploading package ...") go to fleet-tui's log file, never stderr.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import sshd
from ssh_support import ssh_host, start_sshd

from fleet_tui.system import paths

pytestmark = pytest.mark.xdist_group("ssh-host")


def _server(body: bytes) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(401)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[sshd.Sshd]:
    running = start_sshd(tmp_path / "sshd", alias="fleet-msg-host")
    try:
        yield running
    finally:
        running.stop()


def test_a_forward_held_for_the_same_server_is_not_a_warning(
        server: sshd.Sshd, caplog: pytest.LogCaptureFixture) -> None:
    gateway = _server(b'{"error": "the gateway here"}')
    other = _server(b'{"error": "somebody else"}')
    first = ssh_host(server, dict(os.environ))
    second = ssh_host(server, dict(os.environ))
    try:
        local = int(gateway.server_address[1])
        first.connection.run("true")  # the master (the engine's first command makes it)
        there = first.forward(local)
        # another host object (another process of this machine) on the same master
        second.forwards[local] = there
        with caplog.at_level(logging.INFO, logger="fleet_tui.engine.fleet"):
            second.ensure_forwards()
        said = [r for r in caplog.records if "cannot forward" in r.getMessage()]
        assert said, caplog.text  # the forward was refused ...
        assert all(r.levelno == logging.INFO for r in said), caplog.text  # ... harmlessly
        # a port held there by another server: the workers would reach it, so it is said
        caplog.clear()
        third = ssh_host(server, dict(os.environ))
        third.forwards[local] = int(other.server_address[1])
        with caplog.at_level(logging.INFO, logger="fleet_tui.engine.fleet"):
            third.ensure_forwards()
        warned = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert warned and "cannot forward a port" in warned[0].getMessage(), caplog.text
    finally:
        for host in (first, second):
            host.close()
        gateway.shutdown()
        other.shutdown()


RAY_LOGS = """
import logging, os, sys
from ray.job_submission import JobSubmissionClient  # noqa: F401 (ray's handler, as used)
if sys.argv[1] == "routed":
    from fleet_tui.execution.ray.host import ray_logs_to_file
    ray_logs_to_file(os.environ)
logging.getLogger("ray.dashboard.modules.dashboard_sdk").info(
    "Uploading package gcs://_ray_pkg_test.zip")
logging.getLogger("ray._private.runtime_env.packaging").info("Creating a file package")
"""


def test_rays_client_lines_go_to_the_log_file_not_the_terminal() -> None:
    pytest.importorskip("ray.job_submission")
    env = dict(os.environ)
    before = subprocess.run([sys.executable, "-c", RAY_LOGS, "as-ray-has-it"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert "Uploading package" in before.stderr  # what the user saw on `run --wait`
    after = subprocess.run([sys.executable, "-c", RAY_LOGS, "routed"], capture_output=True,
                           text=True, env=env, timeout=120)
    assert after.returncode == 0, after.stderr
    assert "Uploading package" not in after.stderr + after.stdout
    assert "Creating a file package" not in after.stderr + after.stdout
    written = paths.log_file().read_text()
    assert "Uploading package gcs://_ray_pkg_test.zip" in written
    assert "Creating a file package" in written
    assert oct(paths.log_file().stat().st_mode & 0o777) == "0o600"
