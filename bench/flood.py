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
import asyncio
import contextlib
import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

HEAD = b"POST /e/default/v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nx-slow: "


async def flood(port: int, count: int, seconds: float, pause: float = 0.5) -> dict[str, int]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    stats = {"opened": 0, "closed_by_server": 0, "connect_failed": 0, "open": 0, "peak": 0}

    async def one() -> None:
        while loop.time() < deadline:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", port), 5.0)
            except (OSError, TimeoutError):
                stats["connect_failed"] += 1
                await asyncio.sleep(pause)
                continue
            stats["opened"] += 1
            stats["open"] += 1
            stats["peak"] = max(stats["peak"], stats["open"])
            try:
                writer.write(HEAD)
                while loop.time() < deadline:
                    try:
                        data = await asyncio.wait_for(reader.read(4096), 1.0)
                    except TimeoutError:
                        writer.write(b"a")  # a byte a second: the head never ends
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        stats["closed_by_server"] += 1
                        break
            finally:
                stats["open"] -= 1
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
            await asyncio.sleep(pause)

    await asyncio.gather(*(one() for _ in range(count)))
    return stats


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


def gather(procs: list[subprocess.Popen[str]], timeout: float) -> dict[str, int]:
    """The processes' figures summed (each waited for up to `timeout`)."""
    total: dict[str, int] = {}
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
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(json.dumps(asyncio.run(flood(args.port, args.count, args.seconds))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
