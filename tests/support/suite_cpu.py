"""What each test costs the machine: `pytest -p suite_cpu` (tests/support on PYTHONPATH).

Each pytest process (each xdist worker) moves itself into a cpuacct group of its own
(cgroup v1, as root), so the group's usage counts the test's own work and every process it
started, a detached runner or a cluster's node included, wherever the attempt's own
containment (the unified hierarchy) put them. Per test it writes one JSON line to
$SUITE_CPU_DIR/<worker>.jsonl: its id, wall seconds, CPU seconds, and the processes seen in
the group while it ran (polled every 40 ms) by kind (claude, the cage's node host, a
fleet-tui command, a runner, git ...). `python scripts/suite_cpu.py DIR` sums them.

Where no cpuacct hierarchy is mounted (a cgroup v2-only machine) or as a non-root user, it
says so once and counts CPU with getrusage instead: the pytest process and the children it
waited for, so processes that outlive their parent are missed.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import threading
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from fleet_tui.system import procs

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
POLL = 0.04
_seen: dict[str, str] = {}
_lock = threading.Lock()
_state: dict[str, Any] = {}
FLEET_COMMANDS = ("fleet-tui", "fleet-worker", "fleet-collect", "fleet-doctor")


def _kind(pid: str) -> str | None:
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    args = procs.cmdline(int(pid))
    if not args:
        return None
    exe = os.path.basename(args[0])
    if "claude" in exe or comm == "claude":
        return "claude"
    if exe == "node" or comm == "node":
        return "cage host" if any("cage_host" in a for a in args) else "node"
    if exe.startswith("python"):
        if "-m" in args[:-1]:
            module = args[args.index("-m") + 1]
            if module == "fleet_tui.cli":
                return "fleet-tui command"
            return module.rsplit(".", 1)[-1] if module.startswith("fleet_tui") else "python"
        if len(args) > 1 and os.path.basename(args[1]) in FLEET_COMMANDS:
            return f"{os.path.basename(args[1])} command"
        return "python"
    if exe in FLEET_COMMANDS:
        return f"{exe} command"
    return exe


def _forked(pid: str) -> bool:
    """The process is a fork not yet past its exec: its command line is still its
    parent's (a child of pytest looks like pytest, one of a runner like a runner)."""
    stat = procs.read_stat(int(pid))
    if stat is None:
        return False
    args = procs.cmdline(stat.pid)
    return bool(args) and args == procs.cmdline(stat.ppid)


def key(pid: int | str) -> str | None:
    """A process's key in `_seen`: its pid and start time, so that a pid the kernel hands
    out again (a long run wraps the pid space) is a new process, counted for its own test."""
    start = procs.start_time(int(pid))
    return None if start is None else f"{pid}:{start}"


def _poll(group_procs: Path, stop: threading.Event | None = None) -> None:
    """Gives each new process in the group its kind. A fork not yet past its exec is looked
    at again on each poll until it has exec'd (or ended: then it counts as what it was,
    a copy of its parent)."""
    pending: set[str] = set()
    # a pid in the group at the last look is the same process (one ended and handed out
    # again within a look, 40 ms, is not a case): its start time is read once, not at
    # every look
    known: dict[str, str] = {}
    while stop is None or not stop.is_set():
        try:
            pids = group_procs.read_text().split()
        except OSError:
            pids = []
        known = {pid: name for pid in pids
                 if (name := known.get(pid) or key(pid)) is not None}
        keys = set(known.values())
        for pid, name in known.items():
            if name in _seen and name not in pending:
                continue
            kind = _kind(pid)
            if kind is None:
                continue
            if _forked(pid):
                pending.add(name)
            else:
                pending.discard(name)
            with _lock:
                _seen[name] = kind
        pending &= keys
        time.sleep(POLL)


def _rusage() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _own_group() -> Path:
    """The cpuacct group this process is in now (where it goes back at the end)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _num, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            return CPUACCT / path.lstrip("/")
    return CPUACCT


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    out = Path(os.environ.get("SUITE_CPU_DIR", "suite-cpu"))
    out.mkdir(parents=True, exist_ok=True)
    _state["out"] = (out / f"{worker}.jsonl").open("a", buffering=1, encoding="utf-8")
    group = CPUACCT / "fleet-suite-cpu" / f"{worker}-{os.getpid()}"
    try:
        home = _own_group()
        group.mkdir(parents=True, exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
        _state["groups"] = (home, group)
    except OSError as exc:
        print(f"suite_cpu: no cpuacct group ({exc.strerror}): getrusage counts this "
              "process and the children it waited for only")
        _state["cpu"] = _rusage
        return
    usage = group / "cpuacct.usage"
    _state["cpu"] = lambda: int(usage.read_text()) / 1e9
    _seen[key(os.getpid()) or str(os.getpid())] = "pytest"
    threading.Thread(target=_poll, args=(group / "cgroup.procs",), daemon=True).start()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None
                            ) -> Generator[None, None, None]:
    with _lock:
        before = set(_seen)
    cpu, wall = _state["cpu"](), time.monotonic()
    yield
    time.sleep(POLL)  # the poller's last look at what the test started
    with _lock:
        new = [kind for pid, kind in _seen.items() if pid not in before]
    counts: dict[str, int] = {}
    for kind in new:
        counts[kind] = counts.get(kind, 0) + 1
    _state["out"].write(json.dumps({
        "id": item.nodeid, "wall": round(time.monotonic() - wall, 3),
        "cpu": round(_state["cpu"]() - cpu, 3), "procs": counts}) + "\n")


def pytest_unconfigure(config: pytest.Config) -> None:
    """Back to the group it came from, and its own group removed (left while a process
    it started still runs there: the kernel refuses, and that is fine)."""
    if "groups" not in _state:
        return
    home, group = _state.pop("groups")
    try:
        (home / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        return
    deadline = time.monotonic() + 5.0  # what a test left running (git's gc) ends soon
    while True:
        try:
            group.rmdir()
            break
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
    with contextlib.suppress(OSError):
        group.parent.rmdir()  # the last worker's removal leaves no folder behind

