"""An attempt's processes in a PID namespace of their own, where no cgroup can be made.

The cgroup (system/cgroups.py) needs a delegated cgroup v2, which a user reached by ssh
usually does not have. A PID namespace needs nothing but the kernel's leave to make a user
namespace (/proc/sys/user/max_user_namespaces above 0, no distribution switch against it),
and it gives the one guarantee that matters after the runner's SIGKILL: when a PID
namespace's first process (its init) dies, the kernel kills every process in it, and no
process can leave its PID namespace, whatever it drops (session, parent, token variable).

So, where the runner has no cgroup: the runner unshares a user namespace (this user's own
uid and gid mapped to themselves: a worker sees the user it is, never root) and a PID
namespace for its children; its first child is the namespace's init, a small process that
dies with the runner (the parent-death signal, and the end of a pipe only the runner holds,
for a runner killed before that signal was armed). Every later child of the runner (the
setup command, the key's pipe writer, claude, and all they start) is in the namespace.
Root needs no user namespace: the PID namespace alone.

How the worker's world stays the same: claude runs as pid 2 under an init that reaps what
is orphaned (pid 1's job); the init ignores the SIGTERM/SIGINT the runner passes to the
whole tree (a namespace's init only takes signals it handles, and SIGKILL from outside), so
a kill still gives claude its grace; claude and its tools get /proc of their namespace (a
mount namespace of their own, made private first so nothing leaks out), so `$$`, `ps` and
`kill $(pgrep x)` agree. Where that /proc cannot be mounted, it is left as it is.

Standard library only: the runner imports this on hosts.
"""

from __future__ import annotations

import contextlib
import os
import signal

from fleet_tui.system import procs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

MODE_ENV = "FLEET_TUI_CONTAIN"
"""How an attempt's processes are contained: `auto` (the default: a cgroup where one can be
made, else a PID namespace), `namespace` (never a cgroup), `token` (neither: the attempt's
token in the environment is the only mark)."""
MODES = ("auto", "namespace", "token")

CONTAINED_CGROUP = "cgroup"
CONTAINED_NAMESPACE = "pid namespace"
NOT_CONTAINED = "no"  # runner.json's `contained`: "no: <why>"


def mode(env: Mapping[str, str]) -> str:
    """The containment asked for in `env` (an unknown value: the default)."""
    value = env.get(MODE_ENV, "").strip().lower()
    return value if value in MODES else "auto"


def make() -> int | str:
    """A PID namespace for this process's children from now on, its init started: the
    init's pid; or, where the kernel refuses, why (nothing changed then)."""
    if procs.PORTABLE:
        return "not on the portable path (no Linux extras)"
    uid, gid = os.geteuid(), os.getegid()
    tries = [procs.CLONE_NEWPID] if uid == 0 else []
    tries.append(procs.CLONE_NEWUSER | procs.CLONE_NEWPID)
    why = ""
    for flags in tries:
        failed = procs.unshare(flags)
        if failed is None:
            if flags & procs.CLONE_NEWUSER:
                failed = procs.map_own_ids(uid, gid)
                if failed is not None:  # in a namespace where we cannot even be ourselves
                    return f"cannot map this user in a user namespace: {failed}"
            return _start_init()
        why = failed
    limit = procs.user_namespaces_limit()
    if limit == 0:
        why += " (/proc/sys/user/max_user_namespaces is 0)"
    return f"cannot make a user and PID namespace: {why}"


def _start_init() -> int:
    procs.preload_libc()  # the init arms its parent-death signal without loading libc
    alive_r, alive_w = os.pipe()  # only the runner holds the write end: EOF = it is gone
    pid = os.fork()
    if pid == 0:  # pid 1 of the new namespace
        code = 0
        try:
            _init(alive_r)
        except BaseException:
            code = 1
        os._exit(code)
    os.close(alive_r)
    _KEEP.append(alive_w)
    return pid


_KEEP: list[int] = []  # the runner's end of each init's pipe, open for its whole life


def _init(alive: int) -> None:
    """The namespace's init: reap (SIGCHLD ignored: the kernel reaps its children), take
    no signal but SIGKILL, hold nothing of the runner's (its lock, its pipes), and end
    when the runner does, which ends the namespace."""
    os.closerange(0, alive)
    os.closerange(alive + 1, 1 << 20)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                signal.SIGUSR1, signal.SIGUSR2, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    procs.set_parent_death_signal(signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.chdir("/")
    while os.read(alive, 1):  # blocks until the runner's end closes: the runner is gone
        pass


def child_setup() -> None:
    """In a child of the runner between fork and exec (the setup command, claude): /proc of
    the namespace (see the module's doc)."""
    procs.mount_own_proc()


def end(init: int) -> None:
    """The namespace ended (its init killed: the kernel kills the rest) and reaped. Only
    while it is still this process's unreaped child: its pid cannot have been reused."""
    try:
        if os.waitpid(init, os.WNOHANG)[0] != 0:
            return  # it had died already (a SIGKILL to the runner's tree): reaped now
    except ChildProcessError:
        return  # reaped already (the runner's reap of its children)
    with contextlib.suppress(OSError):
        os.kill(init, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.waitpid(init, 0)


def described(record: Mapping[str, object] | None) -> str | None:
    """One line on how an attempt's processes were contained, from its runner.json (None:
    a runner that did not say)."""
    said = record.get("contained") if record else None
    if not isinstance(said, str) or not said:
        return None
    if said == CONTAINED_CGROUP:
        return "in a cgroup of its own (everything it started ends with it)"
    if said == CONTAINED_NAMESPACE:
        return ("in a PID namespace of its own (everything it started ends with it, even "
                "after its runner's SIGKILL)")
    why = said.partition(":")[2].strip() or "not asked for"
    return (f"NOT contained ({why[:200]}): a process that leaves its session and drops "
            "FLEET_ATTEMPT_TOKEN can outlive the attempt")


__all__ = ["CONTAINED_CGROUP", "CONTAINED_NAMESPACE", "MODES", "MODE_ENV", "NOT_CONTAINED",
           "child_setup", "described", "end", "make", "mode"]
