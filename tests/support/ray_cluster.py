"""A local Ray cluster for the Ray host's tests: a head and a second node on this machine.

Both nodes share one temp dir of their own (with separate ones a job's logs came back
empty) and bind 127.0.0.1 (Ray still listens on every interface for some ports: nothing
here is reachable from elsewhere on this machine's closed network); each node has its own
`--dashboard-agent-listen-port` (the same one on both broke the logs call) and every port
is picked free. Each node runs without Ray's log monitor, which streams workers' output
to drivers (fleet-tui reads a job's log through the Jobs API, from the node's files): it
cost ~1 CPU-s of each cluster's start and ~0.01 CPU-s a second after, ~8 CPU-s of a
suite that starts four clusters. The second node carries the resource `agenthost` that
the tests pin their jobs to. Each `ray start --block` runs in a session of its own, and
the cluster is torn down by those sessions (SIGKILL: SIGTERM to the group hung for more
than 20 s), never by `ray stop`, which ends every Ray process on the machine.

The cluster's processes get a clean environment (a HOME of their own, no Anthropic
variable of the developer's), so a key found there came through fleet-tui.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

RAY = str(Path(sys.executable).parent / "ray")
NODE_RESOURCE = "agenthost"
START_TIMEOUT = 120.0
# the head's look at each node: every second instead of 3 s, so a node whose raylet dies
# reads dead after ~5 failed looks (~6 s, not ~20 s), while a live node slowed by the
# machine's load still has 5 s an answer and 5 looks in a row before it is given up
# a key the cluster holds for its workers (a host's `key_env`), in every node's environment
# as a cluster's admin provisions one: fleet-tui never sends it, the node's runner reads it
NODE_KEY_VAR = "FLEET_TEST_NODE_KEY"
NODE_KEY = "sk-test-held-by-the-nodes-5d1e"
HEALTH_CHECK = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "5000",
                "RAY_health_check_failure_threshold": "5"}


def ray_missing() -> str | None:
    """Why the cluster cannot start here (None: it can)."""
    try:
        import ray.job_submission  # noqa: F401
    except ImportError as exc:
        return f"ray is not importable ({exc}): pip install 'fleet-tui[ray]' (scripts/test does)"
    if not os.path.exists(RAY):
        return f"no ray command beside {sys.executable}"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _session_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[3])  # state ppid pgrp session


class StartExited(RuntimeError):
    """A `ray start` of the cluster's exited while the cluster started."""


# what a `ray start` that exited said, worth keeping above the rest of its log
_CAUSE_WORDS = ("error", "exception", "in use", "failed", "refused", "denied", "killed")


def _cause(text: str, tail: int = 2000) -> str:
    """A log's lines that say why, then its last `tail` characters."""
    why = [line for line in text.splitlines()
           if any(word in line.lower() for word in _CAUSE_WORDS)][-15:]
    return "\n".join(why)[-2000:] + "\n--- the log's end ---\n" + text[-tail:]


class RayCluster:
    def __init__(self) -> None:
        # short: Ray's unix sockets live under it (a socket path holds 107 bytes)
        self.root = Path(tempfile.mkdtemp(prefix="fr-", dir="/tmp"))
        self.home = self.root / "home"
        self.home.mkdir()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.tries = 0
        self._fresh()

    def _fresh(self) -> None:
        """New ports and a new temp dir (a port picked free may be taken before Ray binds
        it, by another test on this machine)."""
        self.tries += 1
        self.temp_dir = self.root / f"t{self.tries}"
        self.port = free_port()
        self.dashboard_port = free_port()
        self.address = f"http://127.0.0.1:{self.dashboard_port}"

    def env(self) -> dict[str, str]:
        keep = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR")
        env = {k: v for k, v in os.environ.items() if k in keep}
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
        env.update(HOME=str(self.home), RAY_USAGE_STATS_ENABLED="0",
                   RAY_DISABLE_DOCKER_CPU_WARNING="1", **HEALTH_CHECK,
                   **{NODE_KEY_VAR: NODE_KEY})
        return env

    def _start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        out = self.root / f"{name}.{self.tries}.out"
        self.logs.append(out)
        with open(out, "wb") as fh:
            proc = subprocess.Popen(
                [RAY, "start", "--block", "--disable-usage-stats",
                 "--node-ip-address=127.0.0.1", f"--temp-dir={self.temp_dir}",
                 "--num-cpus=1", "--object-store-memory=80000000",
                 "--include-log-monitor=false",
                 f"--dashboard-agent-listen-port={free_port()}",
                 f"--dashboard-agent-grpc-port={free_port()}",
                 f"--metrics-export-port={free_port()}",
                 f"--runtime-env-agent-port={free_port()}", *args],
                stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                env=self.env(), start_new_session=True, cwd=self.root)
        self.procs.append(proc)
        return proc

    def start(self, tries: int = 3) -> RayCluster:
        """The head and a node. A `ray start` that exits meanwhile (a port taken between
        its pick and Ray's bind, on a machine running other tests) is given up with its
        processes, and the cluster started again on other ports: `tries` times at most,
        each failure's cause on stderr."""
        while True:
            try:
                self._start("head", ["--head", f"--port={self.port}",
                                     "--dashboard-host=127.0.0.1",
                                     f"--dashboard-port={self.dashboard_port}",
                                     f"--ray-client-server-port={free_port()}",
                                     '--resources={"head": 1}'])
                self.wait_port(self.port)  # the head's GCS: a node can join (the dashboard later)
                self.start_node()
                return self
            except StartExited as exc:
                if self.tries >= tries:
                    raise
                sys.stderr.write(f"the Ray cluster did not start ({exc}); again on other "
                                 "ports\n")
                for proc in reversed(self.procs):
                    self.kill_session(proc)
                self.procs.clear()
                self.logs.clear()
                self._fresh()

    def start_node(self, tries: int = 3) -> subprocess.Popen[bytes]:
        """A node joined to the head. A node's `ray start` that exits meanwhile (Ray gives a
        node 30 s to be seen by the head, and a loaded machine's head was slower: "The
        current node timed out during startup") is given up with its processes and
        started again, `tries` times at most, each failure's cause on stderr."""
        for attempt in range(1, tries + 1):
            proc = self._start(f"node{len(self.procs)}",
                               [f"--address=127.0.0.1:{self.port}",
                                f'--resources={{"{NODE_RESOURCE}": 1}}'])
            try:
                # (a node started after one died: that one's `ray start` has exited, not
                # this one)
                self.wait_nodes(2, watch=[self.procs[0], proc])
                return proc
            except StartExited as exc:
                if attempt == tries or proc.poll() is None:  # the head's exit: not this
                    raise
                sys.stderr.write(f"a Ray node did not start ({exc}); again\n")
                self.kill_session(proc)
                index = self.procs.index(proc)
                del self.procs[index], self.logs[index]
        raise AssertionError("unreachable")

    def wait_port(self, port: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise StartExited(self._exited(proc))
            with contextlib.suppress(OSError), \
                    socket.create_connection(("127.0.0.1", port), timeout=1):
                return
            time.sleep(0.2)
        raise RuntimeError(f"nothing listens on {port} after {START_TIMEOUT:.0f} s: "
                           f"{self.output()[-3000:]}")

    def nodes(self) -> list[dict[str, object]]:
        """The alive nodes, from the state API."""
        with urllib.request.urlopen(f"{self.address}/api/v0/nodes?detail=1&limit=100",
                                    timeout=10) as resp:
            data = json.load(resp)
        result = data.get("data", {}).get("result", {}).get("result", [])
        return [n for n in result if n.get("state") == "ALIVE"]

    def wait_nodes(self, n: int,
                   watch: list[subprocess.Popen[bytes]] | None = None) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        last: object = None
        while time.monotonic() < deadline:
            for proc in self.procs if watch is None else watch:
                if proc.poll() is not None:
                    raise StartExited(self._exited(proc))
            try:
                if len(self.nodes()) >= n:
                    return
            except (OSError, ValueError) as exc:
                last = exc
            time.sleep(0.5)
        raise RuntimeError(f"the cluster has not {n} node(s) after {START_TIMEOUT:.0f} s "
                           f"({last}): {self.output()[-3000:]}")

    def _exited(self, proc: subprocess.Popen[bytes]) -> str:
        """Which `ray start` exited, and why: its own log's telling lines and end."""
        index = self.procs.index(proc)
        log = self.logs[index] if index < len(self.logs) else None
        text = log.read_text(errors="replace") if log is not None and log.exists() else ""
        name = log.stem if log is not None else "?"
        return f"ray start ({name}) exited {proc.returncode}: {_cause(text)}"

    def output(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs if p.exists())

    def session_pids(self, proc: subprocess.Popen[bytes]) -> list[int]:
        """Every process of that `ray start`'s session (what it started)."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and _session_of(int(entry.name)) == proc.pid:
                found.append(int(entry.name))
        return found

    def raylet_of(self, proc: subprocess.Popen[bytes]) -> int | None:
        for pid in self.session_pids(proc):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet":
                    return pid
        return None

    def kill_session(self, proc: subprocess.Popen[bytes]) -> None:
        for _ in range(3):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            for pid in self.session_pids(proc):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            if not self.session_pids(proc):
                return

    def stop(self) -> None:
        for proc in reversed(self.procs):
            self.kill_session(proc)
        shutil.rmtree(self.root, ignore_errors=True)


class NoAgentProxy:
    """A proxy on 127.0.0.1 in front of a real cluster's dashboard that answers the first
    `refusals` job submissions (POST /api/jobs/) as Ray's head answers one it has no job
    agent for (its agent not registered within its 10 s: a cluster just started on a loaded
    machine): 500, "No available agent to submit job, please try again later." Everything
    else, and the submissions after those, go to the dashboard and back unchanged.
    `address` is the proxy's; `submissions` counts the POSTs it saw."""

    NO_AGENT = "No available agent to submit job, please try again later."

    def __init__(self, upstream: str, refusals: int) -> None:
        import http.client
        import http.server
        import threading
        from urllib.parse import urlsplit

        target = urlsplit(upstream)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if self.command == "POST" and self.path.rstrip("/") == "/api/jobs":
                    proxy.submissions += 1
                    if proxy.submissions <= proxy.refusals:
                        self._answer(500, proxy.NO_AGENT.encode(), "text/plain")
                        return
                conn = http.client.HTTPConnection(target.hostname or "127.0.0.1",
                                                  target.port, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items()
                               if k.lower() not in ("host", "connection")}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    self._answer(resp.status, resp.read(),
                                 resp.getheader("Content-Type") or "application/json")
                finally:
                    conn.close()

            def _answer(self, status: int, data: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

            def log_message(self, *args: object) -> None:
                pass

        self.refusals = refusals
        self.submissions = 0
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> NoAgentProxy:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


__all__ = ["NODE_RESOURCE", "NoAgentProxy", "RayCluster", "free_port", "ray_missing"]
