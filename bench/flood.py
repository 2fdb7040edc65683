"""A flood of slow connections at a local port, as any process of the machine can send:
`python -m bench.flood --port P --count N --seconds S`.

Each of `count` connections sends a request head that never ends (a POST line and one
header, then a byte a second of another header: no token ever), and when the server
closes it, connects again after `pause` seconds, until `seconds` have passed. Loopback
only. A process holds at most its open-files limit (raised to the hard limit): a flood
larger than that is several processes (`flood_processes`). It prints one JSON line: the
connections opened, those the server closed, the failed connects, the most open at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HEAD = b"POST /e/default/v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nx-slow: "
_STOP: list[int] = []  # a SIGTERM ends the flood early (its figures still printed)


def flood(port: int, count: int, seconds: float, pause: float = 0.5) -> dict[str, int]:
    """`count` slow connections for `seconds` (non-blocking sockets on one epoll: a
    process holds thousands of them at little CPU)."""
    sel = selectors.DefaultSelector()
    stats = {"opened": 0, "closed_by_server": 0, "connect_failed": 0, "open": 0, "peak": 0}
    deadline = time.monotonic() + seconds
    again: list[float] = [time.monotonic()] * count  # when each slot connects (again)
    socks: dict[int, socket.socket] = {}  # slot -> its connection
    slot_of: dict[socket.socket, int] = {}
    connected: set[socket.socket] = set()

    def close(sock: socket.socket, slot: int, *, by_server: bool) -> None:
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(sock)
        sock.close()
        socks.pop(slot, None)
        slot_of.pop(sock, None)
        if sock in connected:
            connected.discard(sock)
            stats["open"] -= 1
            if by_server:
                stats["closed_by_server"] += 1
        else:
            stats["connect_failed"] += 1
        again[slot] = time.monotonic() + pause

    next_trickle = time.monotonic() + 1.0
    while (now := time.monotonic()) < deadline and not _STOP:
        for slot in range(count):
            if slot not in socks and again[slot] <= now:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setblocking(False)
                try:
                    sock.connect_ex(("127.0.0.1", port))
                except OSError:
                    sock.close()
                    stats["connect_failed"] += 1
                    again[slot] = now + pause
                    continue
                socks[slot] = sock
                slot_of[sock] = slot
                sel.register(sock, selectors.EVENT_WRITE)
        for key, _events in sel.select(timeout=0.2):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            slot = slot_of[sock]
            if sock not in connected:
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    close(sock, slot, by_server=False)
                    continue
                connected.add(sock)
                stats["opened"] += 1
                stats["open"] += 1
                stats["peak"] = max(stats["peak"], stats["open"])
                try:
                    sock.send(HEAD)
                except OSError:
                    close(sock, slot, by_server=True)
                    continue
                sel.modify(sock, selectors.EVENT_READ)
                continue
            try:
                data = sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                close(sock, slot, by_server=True)
        if time.monotonic() >= next_trickle:  # a byte a second: the head never ends
            next_trickle += 1.0
            for sock in list(connected):
                try:
                    sock.send(b"a")
                except OSError:
                    close(sock, slot_of[sock], by_server=True)
    for sock in list(socks.values()):
        sock.close()
    return {k: v for k, v in stats.items() if k != "open"}


def flood_processes(port: int, total: int, seconds: float, per_process: int = 4000
                    ) -> list[subprocess.Popen[str]]:
    """`total` connections from as many processes as the open-files limit asks."""
    root = str(Path(__file__).resolve().parent.parent)
    procs = []
    left = total
    while left > 0:
        n = min(per_process, left)
        left -= n
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "bench.flood", "--port", str(port), "--count", str(n),
             "--seconds", str(seconds)], cwd=root, stdout=subprocess.PIPE, text=True))
    return procs


def gather(procs: list[subprocess.Popen[str]], timeout: float, *, stop: bool = False
           ) -> dict[str, int]:
    """The processes' figures summed (each waited for up to `timeout`; with `stop`, asked
    to end now first)."""
    total: dict[str, int] = {}
    if stop:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
    for proc in procs:
        out, _ = proc.communicate(timeout=timeout)
        line = out.strip().splitlines()[-1] if out.strip() else "{}"
        figures: dict[str, Any] = json.loads(line)
        for key, value in figures.items():
            total[key] = total.get(key, 0) + int(value)
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.flood")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda _sig, _frame: _STOP.append(1))
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(json.dumps(flood(args.port, args.count, args.seconds)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
