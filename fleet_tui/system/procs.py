"""Process helpers: identity, descendants, group kill, environments, prctl.

The one module that knows how processes are read on this system; nothing else in the
package reads /proc or calls prctl (tests/system/test_procs.py scans the source). The engine needs
a handful of facts: is this pid still the process we started (pid + start time, so a reused
pid is never mistaken for ours), which processes descend from it (claude's Bash tool may put
a `sleep` in its own process group), which carry an attempt's token, and how to signal them.

Two ways to read them, one behaviour:
- Linux: /proc directly (cheap: the follower's liveness poll reads one small file), plus the
  Linux extras PR_SET_CHILD_SUBREAPER and PR_SET_PDEATHSIG.
- portable (macOS, or Linux with FLEET_TUI_PORTABLE_PROCS=1, which is how the suite runs
  this path on Linux): psutil, without the extras. What they do is then done otherwise:
  processes that leave claude's tree or outlive their runner are found by the attempt's
  token in their environment (the runner's and the engine's sweeps).

Start times: on Linux, /proc's clock ticks since boot ("123456", what older versions stored
as `pid_start`); on the portable path, seconds since the epoch ("1764625031.42").
`same_start` compares the two forms, so a runner recorded by either is still recognised.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterable
from pathlib import Path

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy knows it)
if TYPE_CHECKING:
    import ctypes
    from types import ModuleType

# Every runner (one per task attempt) imports this module, so it stays cheap to import:
# no ctypes until prctl is needed, no dataclasses, no pathlib.
PROC = "/proc"

PORTABLE_ENV = "FLEET_TUI_PORTABLE_PROCS"
"""Set to 1 to read processes through psutil on Linux too, without the Linux extras."""
PORTABLE = sys.platform != "linux" or os.environ.get(PORTABLE_ENV, "") not in ("", "0")
"""True: processes are read through psutil and the Linux extras are off (see above)."""

START_SLACK = 1.0
"""Seconds two start times may differ and still name one process: an epoch start time is
derived from the boot time, which the kernel reports to the second and may move by one. A
pid reused within one second of the first process's start is not a real case."""

# prctl(2) options (linux/prctl.h)
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# unshare(2) and mount(2) flags (linux/sched.h, linux/mount.h)
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18


class ProcStat:
    """The fields of /proc/PID/stat the engine uses."""

    __slots__ = ("pgid", "pid", "ppid", "sid", "start", "state")

    def __init__(self, *, pid: int, state: str, ppid: int, pgid: int, sid: int,
                 start: str) -> None:
        self.pid = pid
        self.state = state
        self.ppid = ppid
        self.pgid = pgid
        self.sid = sid
        # starttime in clock ticks since boot, as text (stable identity with the pid)
        self.start = start

    def _key(self) -> tuple[int, str, int, int, int, str]:
        return (self.pid, self.state, self.ppid, self.pgid, self.sid, self.start)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcStat) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"ProcStat(pid={self.pid}, state={self.state!r}, ppid={self.ppid}, "
                f"pgid={self.pgid}, sid={self.sid}, start={self.start!r})")


def read_stat(pid: int) -> ProcStat | None:
    """Parse /proc/PID/stat; None when the process does not exist (or vanished meanwhile)."""
    if PORTABLE:
        return _ps_stat(pid)
    try:
        with open(f"{PROC}/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            raw = fh.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return None
    except OSError:
        return None
    # comm is in parentheses and may itself contain spaces or parentheses: split at the last ')'
    close = raw.rfind(")")
    if close < 0:
        return None
    rest = raw[close + 2:].split()
    # rest[0] is field 3 (state); starttime is field 22 -> rest[19]
    if len(rest) < 20:
        return None
    try:
        return ProcStat(pid=pid, state=rest[0], ppid=int(rest[1]), pgid=int(rest[2]),
                        sid=int(rest[3]), start=rest[19])
    except ValueError:
        return None


def start_time(pid: int) -> str | None:
    """The /proc start time of pid (clock ticks since boot), or None if it is gone."""
    st = read_stat(pid)
    return None if st is None else st.start


def is_alive(pid: int | None, start: str | None = None) -> bool:
    """True when pid runs (not a zombie) and, if given, its start time still matches."""
    if not pid or pid <= 0:
        return False
    if PORTABLE:
        current = _ps_alive_start(pid)
        if current is None:
            return False
        return start is None or current == start or same_start(start, current)
    st = read_stat(pid)
    if st is None or st.state in ("Z", "X", "x"):
        return False
    return start is None or st.start == start or same_start(start, st.start)


def same_start(a: str, b: str) -> bool:
    """Whether two recorded start times name one process start, in either form (clock
    ticks since boot, from /proc and older versions; seconds since the epoch, portable)."""
    if a == b:
        return True
    if a.isdigit() and b.isdigit():
        return False  # two tick counts from /proc: exact, to the tick
    x, y = _epoch(a), _epoch(b)
    return x is not None and y is not None and abs(x - y) <= START_SLACK


def _epoch(start: str) -> float | None:
    """A start time as seconds since the epoch; None when it is neither form."""
    text = str(start).strip()
    try:
        if text.isdigit():  # clock ticks since boot
            boot = _boot_time()
            return None if boot is None else boot + int(text) / _clock_ticks()
        return float(text)
    except (ValueError, OverflowError):
        return None


def _clock_ticks() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK")) or 100
    except (ValueError, OSError, AttributeError):
        return 100


def _boot_time() -> float | None:
    """When the system booted (seconds since the epoch)."""
    if PORTABLE:
        try:
            return float(_psutil().boot_time())
        except Exception:  # psutil raises its own kinds too
            return None
    try:
        with open(f"{PROC}/stat", "rb") as fh:
            for line in fh:
                if line.startswith(b"btime"):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def all_stats() -> list[ProcStat]:
    """Every process currently visible in /proc."""
    if PORTABLE:
        return _ps_all_stats()
    out: list[ProcStat] = []
    try:
        entries = os.listdir(PROC)
    except OSError:
        return out
    for name in entries:
        if name.isdigit():
            st = read_stat(int(name))
            if st is not None:
                out.append(st)
    return out


def descendants(pid: int, stats: Iterable[ProcStat] | None = None) -> list[int]:
    """All live descendants of pid (children, grandchildren, ...), parents before children.
    None for pid 0 or 1 (an unrecorded pid read as 0): pid 1's parent is 0 and everything
    descends from it."""
    if pid <= 1:
        return []
    table = list(all_stats() if stats is None else stats)
    children: dict[int, list[int]] = {}
    for st in table:
        if st.state not in ("Z", "X", "x"):
            children.setdefault(st.ppid, []).append(st.pid)
    found: list[int] = []
    frontier = [pid]
    seen = {pid}
    while frontier:
        nxt: list[int] = []
        for parent in frontier:
            for child in children.get(parent, ()):
                if child not in seen:
                    seen.add(child)
                    found.append(child)
                    nxt.append(child)
        frontier = nxt
    return found


def group_members(pgid: int) -> list[int]:
    """Live processes whose process group is pgid."""
    return [st.pid for st in all_stats() if st.pgid == pgid and st.state not in ("Z", "X", "x")]


def cmdline(pid: int) -> list[str]:
    """argv of pid ([] when gone or a kernel thread)."""
    if PORTABLE:
        try:
            return [str(a) for a in _psutil().Process(pid).cmdline()]
        except Exception:  # gone, not ours, or a kernel process
            return []
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def cwd(pid: int) -> Path | None:
    """The working directory of pid (None when gone or not readable)."""
    if PORTABLE:
        try:
            return Path(_psutil().Process(pid).cwd())
        except Exception:  # gone, not ours, or a kernel process
            return None
    try:
        return Path(os.readlink(f"{PROC}/{pid}/cwd"))
    except OSError:
        return None


def ancestors(pid: int | None = None) -> list[int]:
    """The parent of pid (default: this process), its parent, ... up to pid 1."""
    found: list[int] = []
    current = os.getpid() if pid is None else pid
    while len(found) < 256:
        st = read_stat(current)
        if st is None or st.ppid <= 0 or st.ppid in found or st.ppid == current:
            break
        found.append(st.ppid)
        current = st.ppid
    return found


def protected() -> tuple[frozenset[int], frozenset[int]]:
    """(pids, process groups) this process never signals: itself and its ancestors (the
    shell it runs in, an engine's or a test runner's controller: pytest-xdist's workers
    share their controller's group) and their groups. What the engine signals is a runner,
    claude or what they started, found by pid and start time, descent or a token; none of
    them can be one of these, unless a recorded pid is wrong (an unrecorded 0, this very
    process recorded as a runner) or a token or group reached further than meant."""
    me = os.getpid()
    pids = {me, *ancestors(me)}
    groups = {os.getpgrp()}
    for pid in pids:
        try:
            groups.add(os.getpgid(pid))
        except OSError:
            continue
    return frozenset(pids), frozenset(g for g in groups if g > 0)


def signal_pid(pid: int, sig: int, *,
               keep: tuple[frozenset[int], frozenset[int]] | None = None) -> bool:
    """Send sig to pid; False when it no longer exists, or when it is not one to signal:
    pid 0 or less (os.kill would reach a whole group, or every process), this process or
    one of its ancestors (see `protected`; `keep` is that set when the caller has it)."""
    if pid <= 0 or pid in (keep or protected())[0]:
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def signal_group(pgid: int, sig: int) -> bool:
    """Send sig to a whole process group; False when the group is empty, and for the
    init group and the groups of this process and its ancestors (see `protected`)."""
    if pgid <= 1 or pgid in protected()[1]:
        return False
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def signal_tree(pid: int, sig: int, *, groups: Iterable[int] = ()) -> list[int]:
    """Signal pid, every descendant of it, and every member of the given groups.

    Descendants are collected before anything is signalled: once a parent dies its
    children are reparented and the tree can no longer be walked from it.
    Returns the pids that were signalled.
    """
    targets: list[int] = []
    stats = all_stats()
    keep = protected()
    if pid > 1 and is_alive(pid):
        targets.append(pid)
    targets.extend(descendants(pid, stats))
    wanted = {g for g in groups if g > 1 and g not in keep[1]}
    for st in stats:
        if st.pgid in wanted and st.pid not in targets and st.state not in ("Z", "X", "x"):
            targets.append(st.pid)
    hit: list[int] = []
    for target in targets:
        if signal_pid(target, sig, keep=keep):
            hit.append(target)
    return hit


def with_env(name: str, value: str, *, stats: Iterable[ProcStat] | None = None) -> list[int]:
    """Live processes whose environment holds exactly NAME=value (from /proc/PID/environ).

    What a process inherited is kept however it left its parent: a daemon that double-forked
    or called setsid, now under pid 1, still carries the marker its ancestor was given.
    Only processes we may read are seen (our own user's, or all of them as root)."""
    needle = f"\0{name}={value}\0".encode()
    own = os.getpid()
    found: list[int] = []
    if PORTABLE:
        ps = _psutil()
        for st in all_stats() if stats is None else stats:
            if st.pid == own or st.state in ("Z", "X", "x"):
                continue
            try:
                if ps.Process(st.pid).environ().get(name) == value:
                    found.append(st.pid)
            except Exception:  # gone, or another user's
                continue
        return found
    for st in all_stats() if stats is None else stats:
        if st.pid == own or st.state in ("Z", "X", "x"):
            continue
        try:
            with open(f"{PROC}/{st.pid}/environ", "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        if needle in b"\0" + data + b"\0":
            found.append(st.pid)
    return found


def stop(pids: Iterable[int], grace: float) -> list[int]:
    """SIGTERM pids, SIGKILL whichever still lives after grace seconds. Returns the pids
    that were signalled (those that still existed)."""
    keep = protected()
    hit = [p for p in pids if signal_pid(p, signal.SIGTERM, keep=keep)]
    if hit and not wait_gone(hit, grace):
        for p in hit:
            if is_alive(p):
                signal_pid(p, signal.SIGKILL, keep=keep)
        wait_gone(hit, max(grace, 1.0))
    return hit


def wait_gone(pids: Iterable[int], timeout: float, *, poll: float = 0.02) -> bool:
    """Wait until none of pids is alive (zombies count as gone); True when they all went."""
    pending = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        pending = [p for p in pending if is_alive(p)]
        if not pending:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)


def reap_children() -> list[tuple[int, int]]:
    """Collect every exited child of this process without blocking: (pid, status) pairs."""
    reaped: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        reaped.append((pid, status))
    return reaped


_LIBC: list[ctypes.CDLL | None] = []


def _libc() -> ctypes.CDLL | None:
    """libc, loaded once. `libc.so.6` directly: ctypes.util.find_library would spawn
    processes and import subprocess on every runner start."""
    if not _LIBC:
        import ctypes

        try:
            _LIBC.append(ctypes.CDLL("libc.so.6", use_errno=True))
        except OSError:
            try:
                _LIBC.append(ctypes.CDLL(None, use_errno=True))
            except OSError:
                _LIBC.append(None)
    return _LIBC[0]


def preload_libc() -> None:
    """Load libc now, so a preexec function after fork does not have to (no dlopen there)."""
    if not PORTABLE:
        _libc()


def _prctl(option: int, arg: int) -> bool:
    if PORTABLE:  # a Linux extra: what it does is done otherwise (see the module's doc)
        return False
    libc = _libc()
    if libc is None:
        return False
    import ctypes

    res = libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0),
                     ctypes.c_ulong(0), ctypes.c_ulong(0))
    return int(res) == 0


def set_child_subreaper(on: bool = True) -> bool:
    """Make this process adopt orphaned descendants (so they can be found and killed);
    ``on`` False: no longer."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0)


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send sig to this process when its parent dies."""
    return _prctl(PR_SET_PDEATHSIG, int(sig))


def unshare(flags: int) -> str | None:
    """unshare(2) this process (a Linux extra); None when done, else why not."""
    if PORTABLE:
        return "not on the portable path"
    libc = _libc()
    if libc is None:
        return "no libc to call"
    import ctypes

    if int(libc.unshare(ctypes.c_int(flags))) == 0:
        return None
    return os.strerror(ctypes.get_errno())


def map_own_ids(uid: int, gid: int) -> str | None:
    """In a user namespace this process just made: its own uid and gid mapped to
    themselves (nothing else is), so what runs in it sees the user it is, not root and
    not `nobody`. None when done, else why not."""
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            fd = os.open(f"{PROC}/self/{name}", os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def mount_own_proc() -> bool:
    """For a process of a PID namespace (between fork and exec): a mount namespace of its
    own with /proc showing that namespace, so its pids and /proc's agree (`kill $(pgrep
    x)` reaches x). Nothing propagates out: / is made private first. False (and /proc
    left as it is) where the kernel refuses."""
    libc = _libc()
    if PORTABLE or libc is None:
        return False
    import ctypes

    if int(libc.unshare(ctypes.c_int(CLONE_NEWNS))) != 0:
        return False
    none = ctypes.c_char_p(None)
    if int(libc.mount(none, b"/", none, ctypes.c_ulong(MS_REC | MS_PRIVATE), none)) != 0:
        return False
    return int(libc.mount(b"proc", b"/proc", b"proc",
                          ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC), none)) == 0


def user_namespaces_limit() -> int | None:
    """/proc/sys/user/max_user_namespaces (0: none may be made), None where unreadable."""
    try:
        with open(f"{PROC}/sys/user/max_user_namespaces", encoding="ascii") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


CONTAIN_PROBE = """
import ctypes, os
def cgroup():
    mount = own = None
    for line in open("/proc/self/mounts"):
        part = line.split()
        if len(part) >= 3 and part[2] == "cgroup2":
            mount = part[1]
            break
    if mount is None:
        return False
    for line in open("/proc/self/cgroup"):
        if line.startswith("0::"):
            own = line[3:].strip()
    for base in [mount + "/fleet-tui"] + ([mount + own.rstrip("/") + "/fleet-tui"]
                                          if own else []):
        path = "%s/probe-%d" % (base, os.getpid())
        try:
            os.makedirs(path)
        except OSError:
            continue
        ok = os.access(path + "/cgroup.procs", os.W_OK)
        os.rmdir(path)
        if ok:
            return True
    return False
def namespace():
    libc = ctypes.CDLL(None, use_errno=True)
    pid = os.fork()
    if pid == 0:
        flags = 0x20000000 if os.geteuid() == 0 else 0x30000000
        if libc.unshare(flags) != 0 and libc.unshare(0x30000000) != 0:
            os._exit(min(ctypes.get_errno(), 255) or 255)
        os._exit(0)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return "" if code == 0 else os.strerror(code) if code > 0 else "killed"
asked = os.environ.get("FLEET_TUI_CONTAIN", "").strip().lower()
try:
    why = "FLEET_TUI_CONTAIN=token" if asked == "token" else \
        "" if asked != "namespace" and cgroup() else namespace() or "-"
    print("cgroup" if not why else "namespace" if why == "-" else "none: " + why)
except Exception as exc:
    print("none: %s" % exc)
"""
"""What `host check` runs on a host (python3 -S -c) to learn whether an attempt's
processes can be contained there: the calls of system/cgroups.py's `make` and
system/pidns.py's `make`, on a host where nothing of fleet-tui is yet."""


def cgroup_v2() -> tuple[str, str] | None:
    """Where the cgroup v2 hierarchy is mounted and this process's cgroup in it (a path
    from that mount, "/" for its root); None where there is none, and on the portable path
    (system/cgroups.py contains an attempt's processes with it)."""
    if PORTABLE:
        return None
    mount = None
    try:
        with open(f"{PROC}/self/mounts", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == "cgroup2":
                    mount = parts[1].replace("\\040", " ")
                    break
        if mount is None:
            return None
        with open(f"{PROC}/self/cgroup", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("0::"):
                    return mount, line[3:].strip() or "/"
    except OSError:
        return None
    return mount, "/"


def signal_name(sig: int | None) -> str | None:
    """SIGTERM for 15; None for None; the number as text when unknown."""
    if sig is None:
        return None
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


# --- the portable path: psutil ------------------------------------------------------------

_PS_STATE = {"running": "R", "sleeping": "S", "disk-sleep": "D", "stopped": "T",
             "tracing-stop": "t", "zombie": "Z", "dead": "X", "idle": "I", "waking": "S",
             "parked": "S", "locked": "S", "waiting": "S"}


def _psutil() -> ModuleType:
    import psutil

    return psutil


def _start_text(created: float) -> str:
    return f"{created:.2f}"


def _pgid_sid(pid: int) -> tuple[int, int]:
    try:
        pgid = os.getpgid(pid)
    except OSError:
        pgid = -1
    try:
        sid = os.getsid(pid)
    except OSError:
        sid = -1
    return pgid, sid


def _ps_stat(pid: int) -> ProcStat | None:
    if pid <= 0:
        return None
    ps = _psutil()
    try:
        proc = ps.Process(pid)
        with proc.oneshot():
            state = _PS_STATE.get(proc.status(), "S")
            ppid = proc.ppid()
            created = proc.create_time()
    except Exception:  # gone (NoSuchProcess), not ours (AccessDenied), a zombie's fields
        return None
    pgid, sid = _pgid_sid(pid)
    return ProcStat(pid=pid, state=state, ppid=ppid, pgid=pgid, sid=sid,
                    start=_start_text(created))


def _ps_alive_start(pid: int) -> str | None:
    """The start time of pid when it runs (not a zombie), else None: the liveness poll's
    question, answered with the fewest reads (no process group or session)."""
    try:
        proc = _psutil().Process(pid)  # reads the start time, psutil's own identity
        if proc.status() in ("zombie", "dead"):
            return None
        return _start_text(proc.create_time())
    except Exception:  # gone, or not ours to read
        return None


def _ps_all_stats() -> list[ProcStat]:
    ps = _psutil()
    out: list[ProcStat] = []
    for proc in ps.process_iter(["ppid", "status", "create_time"]):
        info = proc.info
        if info.get("ppid") is None or info.get("create_time") is None:
            continue  # vanished or unreadable meanwhile
        pgid, sid = _pgid_sid(proc.pid)
        out.append(ProcStat(pid=proc.pid, state=_PS_STATE.get(str(info.get("status")), "S"),
                            ppid=int(info["ppid"]), pgid=pgid, sid=sid,
                            start=_start_text(float(info["create_time"]))))
    return out
