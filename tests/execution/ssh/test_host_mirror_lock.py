"""Worktrees made on a host's mirror at once: the SSH agent's `worktree` command (what
`SshHost.make_worktree` runs on the host for each task it starts; the Ray job's
`prepare_repo` calls the same function on its node), run as the controller runs it
(`python3 -m fleet_tui.execution.worker.agent`, stdlib only) against a real bare mirror in a
host data dir. Each new worktree prunes the mirror's worktree records first; without a
lock, one task's prune removed another's `worktrees/<id>/` before its `gitdir` was
written (seen as `could not open 'worktrees/<id>/gitdir' for writing`). This is the agent
level: the whole path (an engine starting five tasks on an SSH host) costs a connection
and a runner per task, and what raced is this command.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

AGENT = "fleet_tui.execution.worker.agent"
ROUNDS = 20
AT_ONCE = 5


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_five_worktrees_made_at_once_on_one_mirror_never_fail(
        git_repo: Path, tmp_path: Path) -> None:
    data = tmp_path / "host-data"
    mirror = data / "repos" / "project-0123.git"
    mirror.parent.mkdir(parents=True)
    _git(tmp_path, "clone", "-q", "--bare", str(git_repo), str(mirror))
    base = _git(git_repo, "rev-parse", "HEAD")
    failures: list[str] = []
    made = 0
    for round_ in range(ROUNDS):
        procs = []
        for i in range(AT_ONCE):
            task = f"t{round_}x{i}"
            procs.append((task, subprocess.Popen(
                [sys.executable, "-m", AGENT, "worktree", str(mirror),
                 str(data / "work" / task), f"fleet/{task}", base, "new"],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True)))
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
