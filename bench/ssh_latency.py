"""Event latency of the SSH host's mirror: a line appended to the host's events.jsonl ->
the same bytes in the local attempt folder (issue 20's figure: median <= 150 ms, p99 <=
500 ms over loopback). Context figures only, not in `scripts/bench`'s judged set yet: the
honest baseline (the same line over a bare `ssh cat` channel, interleaved) is still to be
paired with it (bench/README.md, rule 1).

`python -m bench.ssh_latency [EVENTS]`: Debian's sshd on 127.0.0.1 (tests/sshd.py), an
`SshHost`, a held lock (a live "runner") and EVENTS lines at 20 a second.
"""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import sshd

from bench.common import quantile
from fleet_tui.execution.ssh.host import SshHost
from fleet_tui.execution.ssh.mirror import Mirror


def main(events: int = 200) -> None:
    why = sshd.missing()
    if why is not None:
        raise SystemExit(why)
    with tempfile.TemporaryDirectory(prefix="fleet-bench-ssh-") as tmp:
        server = sshd.Sshd(Path(tmp) / "sshd", alias="fleet-bench-host").start()
        try:
            host = SshHost(name="bench", target=server.alias, env=dict(os.environ),
                           python="/usr/bin/python3", ssh_config=server.client_config)
            remote = Path(host.remote_attempt_dir("bench", 1))
            remote.mkdir(parents=True)
            lock = os.open(remote / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(lock, fcntl.LOCK_EX)  # a live runner, as far as the agent sees
            (remote / "runner.json").write_text('{"runner_pid": 1}')
            local = Path(tmp) / "local"
            local.mkdir()
            mirror = Mirror(local, lambda offsets: host.follow_stream(str(remote), offsets))
            mirror.start()
            mirror.wait_first()
            delays = []
            with open(remote / "events.jsonl", "ab", buffering=0) as out:
                for i in range(events):
                    line = f'{{"type":"system","n":{i},"pad":"{"x" * 200}"}}\n'.encode()
                    out.write(line)
                    size = out.tell()
                    sent = time.monotonic()
                    target = local / "events.jsonl"
                    while not target.exists() or target.stat().st_size < size:
                        time.sleep(0.0005)
                    delays.append((time.monotonic() - sent) * 1000)
                    time.sleep(max(0.0, 0.05 - (time.monotonic() - sent)))
            assert (local / "events.jsonl").read_bytes() == (remote / "events.jsonl").read_bytes()
            os.close(lock)
            mirror.stop()
            host.close()
        finally:
            server.stop()
    print(f"ssh mirror event latency over {events} events at 20/s: "
          f"median {quantile(delays, 0.5):.1f} ms, p90 {quantile(delays, 0.9):.1f} ms, "
          f"p99 {quantile(delays, 0.99):.1f} ms, max {max(delays):.1f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
