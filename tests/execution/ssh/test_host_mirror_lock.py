"""Worktrees made on a host's mirror at once: the SSH agent's `worktree` command (what
`SshHost.make_worktree` runs on the host for each task it starts; the Ray job's
`prepare_repo` calls the same function on its node), run as the controller runs it
(`python3 -m fleet_tui.execution.worker.agent`, stdlib only) against a real bare mirror in a
host data dir. Each new worktree prunes the mirror's worktree records first; without a
lock, one task's prune removed another's `worktrees/<id>/` before its `gitdir` was
written (seen as `could not open 'worktrees/<id>/gitdir' for writing`). This is the agent
level: the whole path (an engine starting five tasks on an SSH host) costs a connection
and a runner per task, and what raced is this command.

The race's window is git's own, between two of its steps, and on two cores five agents at
once did not hit it in 300 worktrees with the lock taken out: the many-at-once test shows
the command works side by side, and the lock itself is proved by the agent waiting on it
while it is held (seen in /proc/locks), which fails at once without it.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from fleet_tui.execution.worker.worktrees import MIRROR_LOCK

AGENT = "fleet_tui.execution.worker.agent"
ROUNDS = 4
AT_ONCE = 5


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def _mirror(git_repo: Path, tmp_path: Path) -> tuple[Path, Path, str]:
    """A host data dir with a bare mirror of `git_repo`: (data dir, mirror, base commit)."""
    data = tmp_path / "host-data"
    mirror = data / "repos" / "project-0123.git"
    mirror.parent.mkdir(parents=True)
    _git(tmp_path, "clone", "-q", "--bare", str(git_repo), str(mirror))
    return data, mirror, _git(git_repo, "rev-parse", "HEAD")


def _agent_worktree(data: Path, mirror: Path, task: str, base: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", AGENT, "worktree", str(mirror), str(data / "work" / task),
         f"fleet/{task}", base, "new"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _waits_on_a_flock(pid: int) -> bool:
    """/proc/locks lists the process as blocked on a flock (a `->` line)."""
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[1] == "->" and fields[2] == "FLOCK" \
                and fields[5] == str(pid):
            return True
    return False


def test_a_worktree_waits_while_another_holds_the_mirrors_lock(
        git_repo: Path, tmp_path: Path) -> None:
    """The lock held here (as another task's agent or a Ray job holds it while it makes,
    removes or prunes a worktree): the agent blocks on it, makes nothing meanwhile, and
    makes its worktree once the lock is let go."""
    data, mirror, base = _mirror(git_repo, tmp_path)
    held = os.open(mirror / MIRROR_LOCK, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = _agent_worktree(data, mirror, "t0", base)
        deadline = time.monotonic() + 60
        while not _waits_on_a_flock(proc.pid) and proc.poll() is None:
            assert time.monotonic() < deadline, "the agent neither waited nor ended"
            time.sleep(0.02)
        assert proc.poll() is None, \
            f"the agent went on while the mirror's lock was held: {proc.communicate()}"
        assert not (data / "work" / "t0").exists()
    finally:
        os.close(held)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["head"] == base
    assert _git(data / "work" / "t0", "symbolic-ref", "--short", "HEAD") == "fleet/t0"


def test_five_worktrees_made_at_once_on_one_mirror_never_fail(
        git_repo: Path, tmp_path: Path) -> None:
    data, mirror, base = _mirror(git_repo, tmp_path)
    failures: list[str] = []
    made = 0
    for round_ in range(ROUNDS):
        procs = []
        for i in range(AT_ONCE):
            task = f"t{round_}x{i}"
            procs.append((task, _agent_worktree(data, mirror, task, base)))
        for task, proc in procs:
            out, err = proc.communicate(timeout=120)
            lines = out.strip().splitlines()
            answer = json.loads(lines[-1]) if lines else {"error": err.strip()[-300:]}
            if proc.returncode != 0 or "error" in answer:
                failures.append(f"{task}: {answer.get('error')}")
                continue
            made += 1
            assert answer["head"] == base
            assert _git(data / "work" / task, "symbolic-ref", "--short", "HEAD") \
                == f"fleet/{task}"
    assert failures == [], f"{len(failures)} of {ROUNDS * AT_ONCE} failed: {failures[:5]}"
    assert made == ROUNDS * AT_ONCE
    # every one of them is a worktree the mirror knows (none pruned under another)
    listed = _git(mirror, "worktree", "list", "--porcelain")
    assert listed.count("\nworktree ") + listed.startswith("worktree ") == made + 1
