"""Bench 12's per-worker figures: what the controller pays for each remote worker
it follows, at 20 events a second, against the same controller following local workers.

Each measurement is a fresh process (so nothing else inflates it) holding a real `Fleet`
running its scheduler (`Fleet.run`), whose host is either an `SshHost` on Debian's sshd on
127.0.0.1 (tests/support/sshd.py) or this machine (the default local host): the baseline, the bare
thing doing the same work without the connection. Its workers are real runners whose
`claude` is the stream stand-in (tests/support/standin_claude.py): RATE stream-json lines a second,
as long as it is followed. The process measures itself in three steps: idle (no task), one
worker, then N: over WINDOW seconds of each step, its CPU time (os.times: every thread) and,
at the step's end, its RSS and USS (/proc/self/smaps_rollup); for the SSH host also its
`ssh` children (one per followed run: the mirror's stream) and the host's master
connection (shared by all). Per worker is the marginal cost, (step N - step 1) / (N - 1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import REPO_ROOT

CHILD = "from bench.sshload import child_main; child_main()"
RATE = 20  # events a second per worker (the figure)
KEY = "sk-bench-sshload-not-a-key"


def _kib(path: str, *names: str) -> int:
    """The sum of `names` (kB lines) in a /proc status-like file; 0 when it is gone."""
    total = 0
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                name, _, rest = line.partition(":")
                if name in names:
                    total += int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    return total


def _ticks(pid: int) -> float:
    """CPU seconds (user + system) of one process; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ssh_children() -> list[int]:
    from fleet_tui.system import procs

    me = os.getpid()
    return [st.pid for st in procs.all_stats() if st.ppid == me and st.state != "Z"
            and Path(procs.cmdline(st.pid)[0] if procs.cmdline(st.pid) else "").name == "ssh"]


def _uss(pid: int | str) -> int:
    return _kib(f"/proc/{pid}/smaps_rollup", "Private_Clean", "Private_Dirty")


def _window(seconds: float, master: int | None) -> dict[str, Any]:
    """CPU over `seconds` of this process, its ssh children and the master; memory at the
    end."""
    kids = _ssh_children()
    t0 = os.times()
    k0 = {pid: _ticks(pid) for pid in kids}
    m0 = _ticks(master) if master else 0.0
    w0 = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - w0
    t1 = os.times()
    k1 = {pid: _ticks(pid) for pid in kids}
    m1 = _ticks(master) if master else 0.0
    return {
        "wall": wall,
        "cpu": (t1.user + t1.system) - (t0.user + t0.system),
        "ssh_cpu": sum(max(0.0, k1[p] - k0[p]) for p in kids if k1[p] > 0),
        "master_cpu": max(0.0, m1 - m0),
        "rss_kib": _kib("/proc/self/status", "VmRSS"),
        "uss_kib": _uss("self"),
        "ssh_children": len(kids),
        "ssh_uss_kib": sum(_uss(p) for p in kids),
        "ssh_rss_kib": sum(_kib(f"/proc/{p}/status", "VmRSS") for p in kids),
        "master_uss_kib": _uss(master) if master else 0,
        "threads": threading.active_count(),
    }


def _wait(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"waited {timeout:g} s for {what}")
        time.sleep(0.1)


def child_main() -> None:
    args = json.loads(sys.argv[1])
    env = dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0")
    host = None
    if args["mode"] == "ssh":
        from fleet_tui.execution.ssh.host import SshHost

        # the host is this machine as this user: its claude (the stand-in) is the host's
        host = SshHost(name="bench", target=args["alias"], env=env, python="/usr/bin/python3",
                       ssh_config=args["ssh_config"], key_on_host=True,  # no gateway here
                       claude=args["claude"])
        host.install()  # before the idle step: the master exists in every step
    follow_steps(args, env, host,
                 master=lambda: host.connection.master_pid() if host is not None else None)


def follow_steps(args: dict[str, Any], env: dict[str, str], host: Any, *,
                 master: Any = lambda: None, stream_timeout: float = 120) -> None:
    """The controller's steps (idle, one worker, n workers) on `host` (None: here), each
    measured over `args["window"]` s once its workers stream (`master`: the pid of a
    process of the host's to count with the controller's own, or None); printed as one
    JSON line. The workers are killed at the end."""
    from fleet_tui.engine.fleet import Fleet, TaskSpec
    from fleet_tui.settings.config import load_settings
    from fleet_tui.store.db import FINISHED_STATES, Store, TaskState
    from fleet_tui.system import paths

    n, window = int(args["n"]), float(args["window"])
    settings = load_settings(env=env, overrides={
        "base_url": "http://127.0.0.1:9", "claude": args["claude"], "key_sources": "env",
        "sandbox": os.geteuid() == 0, "max_workers": n, "max_attempts": 1,
        "kill_grace": 2.0, "gateway": False,
        # uncaged: the stand-in's stream wrapper writes its capture outside any worktree,
        # and the remote workers this compares with run uncaged (the cage has its own bench)
        "cage": "off"})
    fleet = Fleet(settings, Store(paths.db_path()), env=env,
                  **({"host": host} if host is not None else {}))
    stop = threading.Event()
    loop = threading.Thread(target=fleet.run, args=(stop,), daemon=True)
    loop.start()
    repo = Path(args["repo"])
    ids: list[str] = []

    def streaming() -> bool:
        for task_id in ids:
            task = fleet.get_task(task_id)
            if task.state in FINISHED_STATES:
                raise RuntimeError(f"task {task_id} ended {task.state.value}: {task.message}")
            attempts = fleet.attempts(task_id)
            if task.state != TaskState.RUNNING or not attempts or not attempts[-1].events_offset:
                return False
        return True

    steps: dict[str, Any] = {}
    try:
        time.sleep(1.0)  # the scheduler's first passes
        steps["idle"] = _window(window, master())
        for name, more in (("one", 1), ("n", n - 1)):
            if more:
                ids += [t.id for t in fleet.submit(TaskSpec(prompt="stream", repo=repo),
                                                   copies=more)]
            _wait(streaming, stream_timeout, f"{len(ids)} workers streaming")
            time.sleep(1.0)  # past their start
            steps[name] = _window(window, master())
            steps[name]["workers"] = len(ids)
            steps[name]["ingested"] = getattr(fleet, "ingested_events", None)
    finally:
        for task_id in ids:
            try:
                fleet.kill(task_id)
            except Exception as exc:  # reported, the others are killed still
                print(f"kill {task_id}: {exc}", file=sys.stderr)
        try:
            _wait(lambda: all(fleet.get_task(i).state in FINISHED_STATES for i in ids), 60,
                  "the workers' ends")
        finally:
            stop.set()
            loop.join(timeout=30)
            if host is not None:
                host.close()
    sys.stdout.write(json.dumps(steps) + "\n")


def measure(mode: str, n: int, window: float, env: dict[str, str], repo: Path,
            claude: Path, server: Any = None) -> dict[str, Any]:
    """One child process: its steps (idle, one worker, n workers)."""
    arg = {"mode": mode, "n": n, "window": window, "repo": str(repo), "claude": str(claude)}
    if server is not None:
        arg.update(alias=server.alias, ssh_config=str(server.client_config))
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(arg)], env=env,
                          cwd=REPO_ROOT, capture_output=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"sshload child ({mode}) failed: "
                           f"{done.stderr.decode(errors='replace')[-2000:]}")
    steps: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return steps


def per_worker(steps: dict[str, Any], *, with_ssh: bool) -> dict[str, float]:
    """The marginal cost of a worker: (step n - step one) / (n - 1); with one worker only,
    the first worker's (step one - idle). MB and % of a core."""
    hi, lo = steps["n"], steps["one"]
    count = hi["workers"] - lo["workers"]
    if count <= 0:
        hi, lo, count = steps["one"], steps["idle"], 1

    def rate(step: dict[str, Any]) -> float:
        cpu = step["cpu"] + (step["ssh_cpu"] + step["master_cpu"] if with_ssh else 0.0)
        return float(cpu) / float(step["wall"])

    def mem(step: dict[str, Any], key: str) -> float:
        own = float(step[key])
        if with_ssh:
            own += step["ssh_uss_kib"] + step["master_uss_kib"]
        return own

    return {
        "rss_mb": (mem(hi, "rss_kib") - mem(lo, "rss_kib")) / 1024 / count,
        "uss_mb": (mem(hi, "uss_kib") - mem(lo, "uss_kib")) / 1024 / count,
        "cpu_pct": (rate(hi) - rate(lo)) * 100 / count,
        "ssh_uss_mb": (hi["ssh_uss_kib"] - lo["ssh_uss_kib"]) / 1024 / count,
        "ssh_rss_mb": (hi["ssh_rss_kib"] - lo["ssh_rss_kib"]) / 1024 / count,
    }


__all__ = ["RATE", "measure", "per_worker"]
