"""The test sshd's sessions outlive a stopped server (as on a machine whose sshd stops)
and end with the pytest process that started them (tests/support/sshd.py)."""

from __future__ import annotations

import signal
import subprocess

import pytest
import sshd
from ssh_support import start_sshd

from fleet_tui.system import procs


def test_a_stopped_servers_session_lives_on_until_the_suite_ends_it(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    server = start_sshd(tmp_path_factory.mktemp("sessions-sshd"))
    client = subprocess.Popen(["ssh", "-F", str(server.client_config), "-o", "BatchMode=yes",
                               server.alias, "--", "echo in; exec sleep 300"],
                              stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        assert client.stdout is not None and client.stdout.readline() == "in\n"
        assert server.proc is not None
        sessions = procs.descendants(server.proc.pid)
        assert sessions  # the session's sshd (and its command)
        server.stop()
        assert all(procs.is_alive(pid) for pid in sessions)
        assert client.poll() is None  # the connection stays up: the session lives on
        ended = sshd.end_sessions()
        assert set(sessions) <= set(ended)
        assert procs.wait_gone(sessions, timeout=10)
        client.wait(timeout=10)  # the client's connection ended with its session
        assert sshd.end_sessions() == []  # each once
    finally:
        server.stop()
        sshd.end_sessions()
        if client.poll() is None:
            client.send_signal(signal.SIGKILL)
        client.wait(timeout=10)
