"""Each attempt's processes in a cgroup of their own, where the machine offers one.

A worker's process can leave everything else that marks it as the attempt's: its process
group and session (`setsid`), its parent (a double fork: pid 1 once the runner, its
subreaper, is gone) and its environment (`env -u FLEET_ATTEMPT_TOKEN`). It cannot leave
its cgroup without write access to another one. So the runner makes one cgroup (v2) per
attempt, `<cgroup2 mount>/fleet-tui/<name>` (or under the runner's own cgroup when only
that one is delegated to this user), puts the setup command and claude in it between
fork and exec, and names it in runner.json; whoever ends the attempt (the runner at its
end, the engine's or the host's sweep after the runner died) stops every process in it
and removes it. Where no cgroup can be made (no cgroup2, nothing delegated to this user)
the attempt's token in the environment is the mark, as before.

Standard library only: the runner and the SSH agent import this on hosts.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from pathlib import Path

from fleet_tui.system import procs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

FOLDER = "fleet-tui"  # the attempts' cgroups are in a folder of this name


def _mount() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (None: nowhere, or the portable path)."""
    found = procs.cgroup_v2()
    return Path(found[0]) if found else None


def _own(mount: Path) -> Path | None:
    """This process's cgroup (v2) as a folder."""
    found = procs.cgroup_v2()
    return mount / found[1].lstrip("/") if found else None


def make(name: str) -> str | None:
    """A new cgroup for one attempt (its path), or None when this machine offers none to
    this user."""
    mount = _mount()
    if mount is None:
        return None
    own = _own(mount)
    for base in (mount / FOLDER, *((own / FOLDER,) if own is not None else ())):
        path = base / name
        try:
            base.mkdir(exist_ok=True)
            path.mkdir(exist_ok=True)
        except OSError:
            continue
        if os.access(path / "cgroup.procs", os.W_OK):
            return str(path)
        with contextlib.suppress(OSError):
            path.rmdir()
    return None


def join(path: str) -> None:
    """This process into the cgroup (between fork and exec: everything it starts is in it
    too). Nothing when it cannot: the token stays the mark."""
    add(path, 0)  # pid 0 in cgroup.procs: the process that writes it


def add(path: str, pid: int) -> None:
    """A process into the cgroup (one that has started nothing yet). Nothing when it
    cannot: the token stays the mark."""
    try:
        fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.write(fd, str(pid).encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def members(path: str) -> list[int]:
    """The processes in the cgroup (none when it is gone)."""
    try:
        with open(os.path.join(path, "cgroup.procs"), encoding="ascii") as fh:
            return [int(p) for p in fh.read().split()]
    except (OSError, ValueError):
        return []


def holds(path: str, pid: int) -> bool:
    return pid in members(path)


def recorded(record: Mapping[str, Any] | None) -> str | None:
    """The attempt's cgroup as its runner recorded it, if it is one of ours: an existing
    folder under the cgroup2 mount, in a `fleet-tui` folder (never a cgroup of the
    machine's, whatever a damaged record says)."""
    path = record.get("cgroup") if record else None
    if not isinstance(path, str) or not path:
        return None
    mount = _mount()
    found = Path(path)
    if mount is None or not found.is_absolute() or ".." in found.parts \
            or found.parent.name != FOLDER or mount not in found.parents:
        return None
    return path if found.is_dir() else None


def end(path: str, grace: float) -> list[int]:
    """Every process in the cgroup stopped (SIGTERM, SIGKILL after `grace`; what forks
    meanwhile killed as well), then the cgroup removed. The pids it stopped."""
    hit = procs.stop(members(path), grace)
    deadline = time.monotonic() + max(grace, 2.0)
    while True:
        left = members(path)
        if not left or time.monotonic() >= deadline:
            break
        killer = os.path.join(path, "cgroup.kill")
        try:
            with open(killer, "w", encoding="ascii") as fh:
                fh.write("1")
        except OSError:  # a kernel without cgroup.kill
            keep = procs.protected()
            for pid in left:
                procs.signal_pid(pid, signal.SIGKILL, keep=keep)
        hit += [p for p in left if p not in hit]
        time.sleep(0.02)
    # a process still exiting (killed a moment ago, by us or by its parent-death signal) is
    # no longer listed but keeps the cgroup busy until it is gone: removed once it is
    while True:
        try:
            os.rmdir(path)
        except OSError as exc:
            if exc.errno == errno.EBUSY and time.monotonic() < deadline:
                time.sleep(0.02)
                continue
        return hit


__all__ = ["FOLDER", "end", "holds", "join", "make", "members", "recorded"]
