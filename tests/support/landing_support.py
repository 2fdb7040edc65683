"""Shared pieces of the landing tests: byte-for-byte snapshots of the main
checkout and of a worktree, and a task stored as a finished worker would leave it.

Imported by the landing tests (test_landing_*.py) and tests/ui/test_ui_landing.py.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store, Task, TaskState
from fleet_tui.system import paths
from fleet_tui.vcs import git as fgit

STATE_FILES = ("MERGE_HEAD", "ORIG_HEAD", "MERGE_MSG", "MERGE_MODE", "SQUASH_MSG",
               "AUTO_MERGE", "REBASE_HEAD")


def git(cwd: Path, *args: str) -> str:
    """The git CLI itself (independent of the code under test); stdout."""
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def commit_all(cwd: Path, message: str) -> str:
    git(cwd, "add", "-A")
    git(cwd, "commit", "-q", "-m", message)
    return git(cwd, "rev-parse", "HEAD").strip()


def _git_dir(checkout: Path) -> Path:
    out = git(checkout, "rev-parse", "--path-format=absolute", "--git-dir").strip()
    return Path(out)


def checkout_state(checkout: Path) -> dict[str, str | None]:
    """A checkout byte for byte: every file outside .git and .fleet-work (ignored ones
    included) by its hash, the index file's bytes, HEAD (the file and the commit), the
    user's branch refs, the merge and rebase state files, and `git status` (read without taking
    the index lock, so the snapshot itself changes nothing)."""
    state: dict[str, str | None] = {}
    for path in sorted(checkout.rglob("*")):
        rel = path.relative_to(checkout)
        if rel.parts[0] in (".git", ".fleet-work") or path.is_dir():
            continue
        data = path.read_bytes() if not path.is_symlink() else str(path.readlink()).encode()
        state[f"file:{rel.as_posix()}"] = hashlib.sha256(data).hexdigest()
    gd = _git_dir(checkout)
    index = gd / "index"
    state["index"] = hashlib.sha256(index.read_bytes()).hexdigest() if index.exists() \
        else None
    state["HEAD file"] = (gd / "HEAD").read_text()
    state["HEAD"] = git(checkout, "rev-parse", "HEAD").strip()
    # the user's branches (a task's own fleet/<id> branch is its worktree's HEAD)
    state["refs"] = "".join(
        line for line in git(checkout, "for-each-ref", "--format=%(refname) %(objectname)",
                             "refs/heads").splitlines(keepends=True)
        if not line.startswith("refs/heads/fleet/"))
    for name in STATE_FILES:
        state[f"state:{name}"] = (gd / name).read_text() if (gd / name).exists() else None
    state["rebase"] = str((gd / "rebase-merge").exists() or (gd / "rebase-apply").exists())
    state["status"] = "".join(
        line for line in git(checkout, "--no-optional-locks", "status", "--porcelain=v2",
                             "--untracked-files=all", "--ignored").splitlines(keepends=True)
        if ".fleet-work/" not in line)  # fleet-tui's own folder (logs, worktrees)
    return state


def finished_task(store: Store, repo: Path, task_id: str, *, title: str = "",
                  base: str = "main", group_id: str | None = None,
                  session_id: str | None = None) -> Task:
    """A task as a finished worker leaves it: its worktree on fleet/<id> from the base
    branch's tip, state succeeded. (A stand-in for a worker run, for the git-level tests:
    the real claude runs in tests/engine/test_landing_real.py.)"""
    info = fgit.create_worktree(repo, task_id, base)
    return store.create_task(task_id=task_id, prompt=f"task {task_id}", repo=repo,
                             title=title or f"task {task_id}", base_branch=info.base_branch,
                             base_commit=info.base_commit, branch=info.branch,
                             worktree=info.path, state=TaskState.SUCCEEDED, verdict="ok",
                             group_id=group_id, session_id=session_id)


# --- the real engine, with the real claude against the scripted endpoint --------------------

KEY = "sk-landing-test-SECRET-7d2c"
TICK = 0.05


def make_fleet(endpoint: Any, claude: str, **overrides: Any) -> Fleet:
    """An engine whose workers run the real claude against ``endpoint``."""
    values: dict[str, Any] = {
        "base_url": endpoint.url, "claude": claude, "sandbox": os.geteuid() == 0,
        "key_sources": "env", "backoff_base": 0.2, "backoff_cap": 1.0, "kill_grace": 2.0,
        "max_workers": 4,
    }
    values.update(overrides)
    settings = load_settings(env=os.environ, overrides=values)
    env = dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0")
    return Fleet(settings, Store(paths.db_path()), env=env)


def drive(fleet: Fleet, until: Callable[[], bool], timeout: float = 90.0,
          what: str = "the tasks") -> None:
    """Tick until ``until()`` holds (fails after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        fleet.tick()
        if until():
            return
        if time.monotonic() > deadline:
            states = {t.id: (t.state.value, t.land_state, t.message)
                      for t in fleet.list_tasks()}
            raise AssertionError(f"timed out waiting for {what}; tasks: {states}")
        time.sleep(TICK)


def settled(fleet: Fleet, *ids: str) -> Callable[[], bool]:
    done = {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.KILLED}
    return lambda: all(fleet.get_task(i).state in done for i in ids)
