"""A port on 127.0.0.1 that nobody answers on, and stays so while a test relies on it (and
one that takes connections and never answers: `silent_port`).

Picking a free port and closing it (or stopping the server on it) leaves it to whoever binds
next: under xdist another test's endpoint or gateway did, and a worker meant to meet "nothing
there" got that server's 404. Here the port is held by a socket that is bound but never
listens: a connection to it is refused. Held without SO_REUSEADDR, no other bind can take
it. A port a stopped server has just served on still has its connections in TIME_WAIT, and
only SO_REUSEADDR binds it then; held so, a bind to port 0 (how every server in the tests
picks its port) still never gets it, since the kernel hands out only ports with no socket.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def hold_port(port: int = 0) -> Iterator[int]:
    """Hold `port` (0: a free one) on 127.0.0.1, refusing connections, for the block."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or port == 0:
                raise
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))  # still in use by a listener: raises
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


@contextlib.contextmanager
def silent_port() -> Iterator[int]:
    """A port of 127.0.0.1 that takes connections and never answers, for the block, as a
    hung server (or a registry behind a stuck proxy) is to its clients: each connection is
    accepted and held open, nothing is ever read or sent, and all are closed at the end."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, name="silent-port", daemon=True)
    thread.start()
    try:
        yield int(sock.getsockname()[1])
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        sock.close()

__all__ = ["hold_port", "silent_port"]
