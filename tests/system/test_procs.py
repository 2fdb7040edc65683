"""fleet_tui.system.procs against real processes: identity, descendants, group kill, prctl."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet_tui.system import procs

# Every test runs over both paths: Linux's /proc with its extras, and the portable one.
pytestmark = pytest.mark.usefixtures("procs_mode")


def _other_start(start: str) -> str:
    """A start time 10 s away from `start`, in its form: a reused pid looks like this."""
    return str(int(start) + 1000) if start.isdigit() else f"{float(start) + 10:.2f}"


def _linux_extras(procs_mode: str) -> None:
    if procs_mode != "linux":
        pytest.skip("a Linux extra: off on the portable path (see test_the_portable_path_...)")


def _wait_for(predicate, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def test_own_stat_matches_os() -> None:
    st = procs.read_stat(os.getpid())
    assert st is not None
    assert st.ppid == os.getppid()
    assert st.pgid == os.getpgid(0)
    assert st.sid == os.getsid(0)
    assert procs.start_time(os.getpid()) == st.start
    assert procs.is_alive(os.getpid(), st.start)


@pytest.mark.skipif(sys.platform != "linux", reason="start times of older versions: Linux's")
def test_a_start_time_recorded_in_either_form_names_the_same_process() -> None:
    """Older versions (and the Linux path) record /proc's clock ticks since boot; the
    portable path records seconds since the epoch. A runner recorded in one form is adopted
    by an engine reading the other, and a reused pid is still told apart in both."""
    proc = subprocess.Popen(["sleep", "30"])
    try:
        procs.PORTABLE = False
        ticks = procs.start_time(proc.pid)
        procs.PORTABLE = True
        epoch = procs.start_time(proc.pid)
        assert ticks is not None and ticks.isdigit()
        assert epoch is not None and "." in epoch
        for mode in (False, True):
            procs.PORTABLE = mode
            assert procs.is_alive(proc.pid, ticks), mode  # an older runner's record
            assert procs.is_alive(proc.pid, epoch), mode
            assert not procs.is_alive(proc.pid, _other_start(ticks)), mode
            assert not procs.is_alive(proc.pid, _other_start(epoch)), mode
            assert not procs.is_alive(proc.pid, "garbage"), mode
        assert not procs.same_start(ticks, str(int(ticks) + 1))  # ticks to the tick
    finally:
        proc.kill()
        proc.wait()


def test_the_portable_path_has_no_linux_extras(procs_mode: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Off Linux there is no subreaper and no parent-death signal: the calls say so (False)
    and do nothing, and the runner's and the engine's sweeps by token take their place.
    From a process that has not loaded libc yet: an earlier test of the same pytest
    worker on the Linux path (bench 9's or 13's smoke adopts its processes) loads it."""
    if procs_mode != "portable":
        pytest.skip("the Linux path has them")
    monkeypatch.setattr(procs, "_LIBC", [])
    assert procs.set_child_subreaper() is False
    assert procs.set_parent_death_signal(signal.SIGKILL) is False
    procs.preload_libc()
    assert procs._LIBC == []  # not even libc was loaded for them


SOURCE = Path(procs.__file__).resolve().parent


def test_nothing_outside_procs_reads_proc_or_calls_prctl() -> None:
    """The one portable layer: no other module of the package opens /proc or calls prctl
    (a mention in prose is fine; code that builds a /proc path or calls prctl is not)."""
    import re

    code = re.compile(r"""["'f]/proc/|\bprctl\s*\(|PR_SET_|ctypes""")
    offenders = []
    for path in sorted(SOURCE.rglob("*.py")):
        if path.name == "procs.py" and path.parent == SOURCE:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            stripped = line.strip()
            if stripped.startswith("#"):
                continue
            if code.search(line):
                offenders.append(f"{path.relative_to(SOURCE)}:{n}: {stripped}")
    assert offenders == [], "\n".join(offenders)


def test_the_source_scan_can_fail(tmp_path: Path) -> None:
    """The scan above sees what it is meant to see."""
    import re

    code = re.compile(r"""["'f]/proc/|\bprctl\s*\(|PR_SET_|ctypes""")
    assert code.search('Path(f"/proc/{pid}/cmdline")')
    assert code.search("libc.prctl(1, 2)")
    assert not code.search("reads /proc for the start time")


def test_comm_with_spaces_and_parens(tmp_path: Path) -> None:
    odd = tmp_path / "we ird) (x"
    shutil.copy("/bin/sleep", odd)
    proc = subprocess.Popen([str(odd), "30"])
    try:
        st = procs.read_stat(proc.pid)
        assert st is not None
        assert st.ppid == os.getpid()
        assert st.state in ("R", "S")
    finally:
        proc.kill()
        proc.wait()


def test_is_alive_checks_start_time_and_zombies() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    start = procs.start_time(proc.pid)
    assert start is not None
    assert procs.is_alive(proc.pid, start)
    assert not procs.is_alive(proc.pid, _other_start(start))  # a reused pid looks like this
    proc.kill()
    assert _wait_for(lambda: not procs.is_alive(proc.pid))  # a zombie counts as gone
    proc.wait()
    assert procs.read_stat(proc.pid) is None
    assert not procs.is_alive(None)
    assert not procs.is_alive(0)


def test_descendants_and_signal_tree_reach_other_groups() -> None:
    # The shell starts one sleep in its own session (like claude's Bash tool may) and one
    # plain; both must be found through the tree and killed.
    # sleeps of lengths no other run of this test uses at once (xdist runs the two process
    # modes side by side): the machine-wide check at the end counts only this run's
    a = 30_000 + (os.getpid() % 5_000) * 2
    mine = (f"sleep {a}", f"sleep {a + 1}")
    proc = subprocess.Popen(["bash", "-c", f"setsid {mine[0]} & {mine[1]} & wait"],
                            start_new_session=True)
    kids: list[int] = []

    def sleeping() -> bool:  # both forks have exec'd sleep (under load that takes a while)
        kids[:] = procs.descendants(proc.pid)
        return {" ".join(procs.cmdline(k)) for k in kids} >= set(mine)

    try:
        assert _wait_for(sleeping)
        other_groups = {procs.read_stat(k).pgid for k in kids if procs.read_stat(k)}  # type: ignore[union-attr]
        assert len(other_groups | {proc.pid}) >= 2
        hit = procs.signal_tree(proc.pid, signal.SIGKILL)
        assert proc.pid in hit and set(kids) <= set(hit)
        assert procs.wait_gone([proc.pid, *kids], 5)
    finally:
        for pid in kids:  # a failed check must not leave its sleeps to the next run
            procs.signal_pid(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
    for st in procs.all_stats():
        assert " ".join(procs.cmdline(st.pid)) not in mine


def test_group_members_and_signal_group() -> None:
    proc = subprocess.Popen(["bash", "-c", "sleep 303 & sleep 303 & wait"],
                            start_new_session=True)
    try:
        assert _wait_for(lambda: len(procs.group_members(proc.pid)) == 3)
        assert procs.signal_group(proc.pid, signal.SIGTERM)
        assert _wait_for(lambda: not procs.group_members(proc.pid))
    finally:
        proc.kill()
        proc.wait()
    assert not procs.signal_group(1, signal.SIGTERM)  # never the init group


_SUBREAPER = r"""
import os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from fleet_tui.system import procs
assert procs.set_child_subreaper()
# the shell exits at once; its background sleep is orphaned and must come to us
subprocess.run(["sh", "-c", "sleep 304 &"], check=True)
# The orphan can be seen while it is still the shell's fork, before it execs sleep:
# wait for the exec as well.
seen = ""
for _ in range(250):
    kids = [s for s in procs.all_stats() if s.ppid == os.getpid() and s.state != "Z"]
    seen = " ".join(procs.cmdline(kids[0].pid)) if kids else ""
    if seen == "sleep 304":
        break
    time.sleep(0.02)
print(seen, flush=True)
procs.signal_tree(os.getpid(), 9)
time.sleep(0.1)
procs.reap_children()
"""


def test_child_subreaper_adopts_orphans(procs_mode: str) -> None:
    _linux_extras(procs_mode)
    root = str(Path(procs.__file__).resolve().parent.parent)
    out = subprocess.run([sys.executable, "-c", _SUBREAPER, root], capture_output=True,
                         text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "sleep 304"


_DEATHSIG = r"""
import os, signal, subprocess, sys
sys.path.insert(0, sys.argv[1])
from fleet_tui.system import procs
procs.preload_libc()
arm = lambda: procs.set_parent_death_signal(signal.SIGKILL)
child = subprocess.Popen(["sleep", "305"], preexec_fn=arm)
print(child.pid, flush=True)
signal.pause()
"""


def test_parent_death_signal_kills_the_child(procs_mode: str) -> None:
    _linux_extras(procs_mode)
    root = str(Path(procs.__file__).resolve().parent.parent)
    parent = subprocess.Popen([sys.executable, "-c", _DEATHSIG, root], stdout=subprocess.PIPE,
                              text=True)
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    assert procs.is_alive(child_pid)
    parent.kill()
    parent.wait(timeout=5)
    assert procs.wait_gone([child_pid], 5)


def test_signal_name() -> None:
    assert procs.signal_name(15) == "SIGTERM"
    assert procs.signal_name(None) is None
    assert procs.signal_name(250) == "250"


def test_with_env_finds_daemons_that_left_the_tree() -> None:
    """A double fork and a setsid daemon end up under pid 1 (or a subreaper), out of any
    tree walk from their starter; the variable they inherited still names them."""
    token = "tok-" + os.urandom(6).hex()
    env = dict(os.environ, FLEET_ATTEMPT_TOKEN=token)
    starter = subprocess.run(
        ["bash", "-c", "setsid nohup sleep 331 >/dev/null 2>&1 & "
                       "( (sleep 332 >/dev/null 2>&1 &) & ) ; exit 0"],
        env=env, start_new_session=True, timeout=10)
    assert starter.returncode == 0
    try:
        assert _wait_for(lambda: {" ".join(procs.cmdline(p))
                                  for p in procs.with_env("FLEET_ATTEMPT_TOKEN", token)}
                         == {"sleep 331", "sleep 332"})
        found = procs.with_env("FLEET_ATTEMPT_TOKEN", token)
        for pid in found:
            st = procs.read_stat(pid)
            assert st is not None and st.ppid != os.getpid()  # not our children any more
        assert procs.with_env("FLEET_ATTEMPT_TOKEN", token[:-1]) == []  # the exact value
        assert procs.with_env("FLEET_ATTEMPT_TOKE", token) == []  # the exact name
        hit = procs.stop(found, 2.0)
        assert sorted(hit) == sorted(found)
        assert procs.with_env("FLEET_ATTEMPT_TOKEN", token) == []
    finally:
        for pid in procs.with_env("FLEET_ATTEMPT_TOKEN", token):
            procs.signal_pid(pid, signal.SIGKILL)


def test_stop_escalates_to_sigkill() -> None:
    proc = subprocess.Popen(["bash", "-c", "trap '' TERM; sleep 333 & wait"],
                            start_new_session=True)
    kids: list[int] = []
    try:
        assert _wait_for(lambda: len(procs.descendants(proc.pid)) == 1)
        kids = procs.descendants(proc.pid)
        assert procs.stop([proc.pid], 0.3) == [proc.pid]
        assert proc.wait(timeout=5) == -signal.SIGKILL  # the trap ignored the SIGTERM
    finally:
        for pid in kids:
            procs.signal_pid(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_nothing_signals_this_process_its_ancestors_their_groups_or_everyone(
        procs_mode: str) -> None:
    """An attempt recorded with the wrong runner pid (this very process, an unrecorded 0)
    once SIGTERMed the xdist worker running the test: the process layer refuses those."""
    import signal as signals

    me = os.getpid()
    assert me in procs.protected()[0] and os.getppid() in procs.protected()[0]
    assert procs.signal_pid(me, signals.SIGTERM) is False
    assert procs.signal_pid(os.getppid(), signals.SIGTERM) is False
    assert procs.signal_pid(0, signals.SIGTERM) is False
    assert procs.signal_pid(-1, signals.SIGTERM) is False
    assert procs.signal_group(os.getpgrp(), signals.SIGTERM) is False
    assert procs.descendants(0) == [] and procs.descendants(1) == []
