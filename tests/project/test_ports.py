"""The test helper that holds a port with nothing on it: connections are refused, and no other
server can bind it while held (fresh); a port a stopped server just served on is held too, and
refuses; a port with a live listener is not held."""

from __future__ import annotations

import http.server
import socket
import threading
import urllib.request

import pytest
from ports import hold_port


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_held_port_refuses_and_cannot_be_taken() -> None:
    with hold_port() as port:
        assert refused(port)
        with pytest.raises(OSError, match="in use"):
            http.server.HTTPServer(("127.0.0.1", port), http.server.BaseHTTPRequestHandler)
    http.server.HTTPServer(("127.0.0.1", port), http.server.BaseHTTPRequestHandler).server_close()


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_the_port_of_a_server_just_stopped_is_held_and_refuses() -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Ok)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with hold_port() as other:
            assert other != port
        with pytest.raises(OSError, match="in use"), hold_port(port):
            pass  # a listener is there
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).status == 200
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    with hold_port(port) as held:  # its served connection may be in TIME_WAIT
        assert held == port and refused(port)
