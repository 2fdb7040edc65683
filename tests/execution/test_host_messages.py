"""What the hosts say on the user's terminal, and only when it matters.

- A second connection's forward of a port the host's 127.0.0.1 holds already for the same
  server here (another process of this machine forwarded it: `run` beside the engine)
  changes nothing: said in the log at INFO, not as a warning on the terminal; a port held
  there by another server is a warning (the workers would reach that server).
  The same-machine shortcut (tests/support/sshd.py as this user): a forward's port on the host is
  a port of this machine.
- Ray's client lines ("Uploading package ...") go to fleet-tui's log file, never stderr.
"""

from __future__ import annotations

import json
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

from fleet_tui import CLAUDE_CODE_VERSION
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


def _stage(host: object, tmp_path: Path, n: int, cage: str = "off") -> None:
    from fleet_tui.execution.host import Placement
    from fleet_tui.execution.worker.spec import RunSpec

    root = host.root  # type: ignore[attr-defined]
    adir = tmp_path / f"attempt-{n}"
    adir.mkdir()
    placement = Placement(host="box", worktree=Path(f"{root}/work/t{n}"), branch=f"fleet/t{n}",
                          base_commit="", base_branch=None,
                          config_dir=Path(f"{root}/config/t{n}"), attempt_dir=adir)
    spec = RunSpec(cwd=f"{root}/work/t{n}", prompt="p", config_dir=f"{root}/config/t{n}",
                   settings={"claude": "/this/machine/only/claude", "config_dir": "/here",
                             "cage": cage},
                   task_id=f"t{n}", attempt=1)
    host.stage(placement, spec).abandon()  # type: ignore[attr-defined]


def test_the_hosts_claude_missing_or_of_another_version_is_said_in_one_line(
        server: sshd.Sshd, tmp_path: Path, claude_newest_bin: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """At a start: a host without claude refuses it in one line with the fix; a host whose
    claude is another version than the tested one is said once, as a warning."""
    from fleet_tui.core.errors import FleetError

    bare = ssh_host(server, dict(os.environ))
    bare.claude = None  # the host's own: its sshd's PATH has none, nothing recorded
    try:
        with pytest.raises(FleetError) as refused:
            _stage(bare, tmp_path, 1)
        said = str(refused.value)
        assert said.startswith("host box: no claude there: not in ") and "\n" not in said
        assert "'claude' is not on PATH (" in said
        assert said.endswith("`fleet-tui host check box --yes` installs Claude Code "
                             f"{CLAUDE_CODE_VERSION} there"), said
    finally:
        bare.close()
    other = ssh_host(server, dict(os.environ))
    other.claude = claude_newest_bin  # another version, given as the host's
    try:
        with caplog.at_level(logging.WARNING, logger="fleet_tui.engine.fleet"):
            _stage(other, tmp_path, 2)
            _stage(other, tmp_path, 3)
        warned = [r.getMessage() for r in caplog.records if "fleet-tui is tested" in
                  r.getMessage()]
        assert len(warned) == 1, warned  # once, not at every start
        assert f"its claude at {claude_newest_bin} is " in warned[0]
        assert f"tested with {CLAUDE_CODE_VERSION}" in warned[0]
        spec = json.loads(server.ssh(f"cat {other.root}/attempts/t2/1/spec.json"))
        assert spec["settings"]["claude"] == claude_newest_bin
        assert "config_dir" not in spec["settings"]  # this machine's path, never sent
        # caged, on a host without srt: refused at the start in one line, with the fix
        with pytest.raises(FleetError) as uncageable:
            _stage(other, tmp_path, 4, cage="worker")
        said = str(uncageable.value)
        assert said.startswith("host box: the cage cannot run there: it lacks srt ("), said
        assert "\n" not in said and 'or set cage = "off" in [hosts.box]' in said, said
        assert server.ssh(f"ls {other.root}/attempts/t4/1/spec.json", check=False) == ""
    finally:
        other.close()
