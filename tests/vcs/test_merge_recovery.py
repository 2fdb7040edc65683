"""A merge killed midway never leaves main between states.

A `prepare-commit-msg` hook that waits while git commits a merge (`$1` is .git/MERGE_MSG;
commitizen, husky and Gerrit's Change-Id hooks run there too) widens the window; the
process that merges (the queue runner, `fleet-tui merge`, the panel's merge) is SIGKILLed
while the hook runs. The next merge of any fleet-tui process finds the intent record the
killed one wrote before it started (git.MERGE_INTENT_FILE), and puts main back as it was
before that merge; the task lands again from there. A half-done merge that is not
fleet-tui's own is refused with a clear message and left alone.

The hook writes a marker file when it starts: the tests wait for that file (with a
deadline), never for a fixed time.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from landing_support import checkout_state, commit_all, finished_task, git
from soak_report import knob, record

from fleet_tui.core.states import LandState, TaskState
from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store
from fleet_tui.system import paths, procs
from fleet_tui.vcs import git as fgit

ROOT = Path(__file__).resolve().parents[2]
# rounds of the killed-merge check (~2.5 s each on a busy 2-core machine)
ROUNDS = knob("FLEET_SOAK_MERGE_KILL_ROUNDS", 4, 40)

HOOK = """#!/bin/sh
# waits while git commits a merge, once (the marker says it has begun)
case "$1" in
  *MERGE_MSG|*COMMIT_EDITMSG)
    if [ ! -e "{marker}" ]; then
      echo $$ > "{marker}.tmp" && mv "{marker}.tmp" "{marker}"
      sleep {wait}
    fi ;;
esac
exit 0
"""


def install_hook(repo: Path, marker: Path, wait: float = 60) -> None:
    hook = repo / ".git" / "hooks" / "prepare-commit-msg"
    hook.parent.mkdir(parents=True, exist_ok=True)
    hook.write_text(HOOK.format(marker=marker, wait=wait))
    hook.chmod(0o755)


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def stop_hook(marker: Path) -> None:
    """The hook's shell outlives the git it ran for (it is the hook's, not ours): stop it."""
    try:
        pid = int(marker.read_text().strip())
    except (OSError, ValueError):
        return
    for child in [*procs.descendants(pid), pid]:
        procs.signal_pid(child, signal.SIGKILL)


def a_fleet(**overrides: object) -> Fleet:
    settings = load_settings(env=os.environ, overrides={
        "base_url": "http://127.0.0.1:9", "key_sources": "env", **overrides})
    return Fleet(settings, Store(paths.db_path()))


def two_tasks(fleet: Fleet, repo: Path) -> list[str]:
    ids = []
    for name in ("k4", "k5"):
        task = finished_task(fleet.store, repo, name, title=name.upper())
        assert task.worktree is not None
        (task.worktree / f"{name.upper()}.txt").write_text(f"{name}\n")
        commit_all(task.worktree, name.upper())
        ids.append(task.id)
    return ids


def main_is_whole(repo: Path, before: str, tested: str) -> str:
    """main is exactly as before (HEAD `before`) or merged (a commit holding `tested`),
    never between: no merge state left, the index and the tracked files as HEAD says.
    Returns "before" or "merged"."""
    no_merge_state(repo)
    head = git(repo, "rev-parse", "HEAD").strip()
    if head == before:
        return "before"
    assert git(repo, "rev-parse", f"{head}^1").strip() == before, "main moved elsewhere"
    holds = subprocess.run(["git", "merge-base", "--is-ancestor", tested, head], cwd=repo)
    if holds.returncode != 0:  # a squash: main's tree is the merge's
        merged_tree = git(repo, "merge-tree", "--write-tree", before, tested).split()[0]
        assert git(repo, "rev-parse", f"{head}^{{tree}}").strip() == merged_tree, \
            f"main moved to {head[:10]}, which lacks {tested[:10]}"
    return "merged"


def no_merge_state(repo: Path) -> None:
    gd = repo / ".git"
    left = [n for n in ("MERGE_HEAD", "MERGE_MSG", "MERGE_MODE", "SQUASH_MSG", "AUTO_MERGE")
            if (gd / n).exists()]
    assert not left, f"main is left mid-merge: {left}"
    locks = [p.name for p in [gd / "index.lock", gd / "HEAD.lock",
                              gd / "refs" / "heads" / "main.lock"] if p.exists()]
    assert not locks, f"git's lock files are left: {locks}"
    status = git(repo, "status", "--porcelain", "--untracked-files=no")
    assert status == "", f"main's index or files are not HEAD's: {status!r}"


def _queue_runners(repo: Path) -> list[int]:
    spec = str(repo / ".fleet-work" / ".logs" / ".queue" / "spec.json")
    return [st.pid for st in procs.all_stats()
            if st.state != "Z" and procs.cmdline(st.pid)[-1:] == [spec]
            and "fleet_tui.engine.queue_runner" in procs.cmdline(st.pid)]


# --- the queue runner ------------------------------------------------------------------------


def test_queue_runner_killed_in_the_merge_hook_is_recovered_by_the_next_runner(
        git_repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "hook-started"
    fleet = a_fleet()
    fleet.queue.QUEUE_CHECK = 0.2
    ids = two_tasks(fleet, git_repo)
    install_hook(git_repo, marker)
    before = git(git_repo, "rev-parse", "HEAD").strip()
    tested = git(git_repo, "rev-parse", "fleet/k4").strip()
    fleet.enqueue(ids)
    try:
        wait_for("the merge's hook to run", marker.exists)
        (runner,) = _queue_runners(git_repo)
        os.kill(runner, signal.SIGKILL)
        wait_for("the runner to be gone", lambda: runner not in _queue_runners(git_repo))
    finally:
        stop_hook(marker)
    # any engine's pass starts the next runner; it finds its own half-done merge
    deadline = time.monotonic() + 120
    while not all(fleet.get_task(t).land_state == LandState.MERGED for t in ids):
        fleet.resume_queues()
        assert time.monotonic() < deadline, {
            t.id: (t.land_state, t.land_note) for t in fleet.list_tasks()}
        time.sleep(0.1)
    for task_id in ids:
        task = fleet.get_task(task_id)
        assert task.state == TaskState.MERGED, (task.state, task.message)
    no_merge_state(git_repo)
    assert subprocess.run(["git", "merge-base", "--is-ancestor", tested, "main"],
                          cwd=git_repo).returncode == 0
    assert before in git(git_repo, "rev-list", "main").split()
    log = git(git_repo, "log", "--first-parent", "--format=%s", "main")
    assert log.splitlines()[:2] == ["Merge fleet/k5: K5", "Merge fleet/k4: K4"]
    assert not fgit.merge_intent_file(git_repo).exists()


# --- `fleet-tui merge` (and the panel, which calls the same Fleet.merge) ----------------------


_MERGER = """import sys
sys.path.insert(0, {root!r})
from fleet_tui.settings.config import load_settings
from fleet_tui.engine.fleet import Fleet
from fleet_tui.store.db import Store
from fleet_tui.system import paths
import os
fleet = Fleet(load_settings(env=os.environ, overrides={{"base_url": "http://127.0.0.1:9",
              "key_sources": "env"}}), Store(paths.db_path()))
print(fleet.merge(sys.argv[1]).message, flush=True)
"""


def _merge_in_a_process(task_id: str, cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", _MERGER.format(root=str(ROOT)), task_id],
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _cli(*args: str, cwd: Path) -> subprocess.Popen[str]:
    """The real `fleet-tui` CLI."""
    env = dict(os.environ, FLEET_WORKER_BASE_URL="http://127.0.0.1:9",
               FLEET_WORKER_KEY_SOURCES="env")
    return subprocess.Popen([sys.executable, "-m", "fleet_tui.cli", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_fleet_tui_merge_killed_in_the_hook_then_fleet_tui_merge_again(
        git_repo: Path, tmp_path: Path) -> None:
    """The CLI end to end: `fleet-tui merge ID --yes` SIGKILLed inside the hook; the next
    `fleet-tui merge ID --yes` (its preview first, then the merge) puts main right and
    lands the task."""
    marker = tmp_path / "hook-started"
    fleet = a_fleet()
    k4, _ = two_tasks(fleet, git_repo)
    install_hook(git_repo, marker)
    before = git(git_repo, "rev-parse", "HEAD").strip()
    tested = git(git_repo, "rev-parse", "fleet/k4").strip()
    proc = _cli("merge", k4, "--yes", cwd=git_repo)
    try:
        wait_for("the merge's hook", lambda: marker.exists() or proc.poll() is not None)
        assert proc.poll() is None, proc.communicate()
        assert (git_repo / ".git" / "MERGE_HEAD").exists()
        proc.kill()
        proc.wait(timeout=30)
    finally:
        stop_hook(marker)
    again = _cli("merge", k4, "--yes", cwd=git_repo)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, (out, err)
    assert "merged fleet/k4 into main" in out
    assert main_is_whole(git_repo, before, tested) == "merged"
    assert fleet.get_task(k4).state == TaskState.MERGED


def _kill_in_hook(git_repo: Path, marker: Path, task_id: str) -> None:
    proc = _merge_in_a_process(task_id, git_repo)
    try:
        wait_for("the merge's hook to run", lambda: marker.exists() or proc.poll() is not None)
        assert proc.poll() is None, proc.communicate()
        proc.kill()
        proc.wait(timeout=30)
    finally:
        stop_hook(marker)


@pytest.mark.parametrize("strategy", ["merge", "squash"])
def test_merge_killed_in_the_hook_is_put_back_then_lands(git_repo: Path, tmp_path: Path,
                                                         strategy: str) -> None:
    marker = tmp_path / "hook-started"
    fleet = a_fleet(merge_strategy=strategy)
    k4, _ = two_tasks(fleet, git_repo)
    install_hook(git_repo, marker)
    before_state = checkout_state(git_repo)
    before = before_state["HEAD"]
    assert before is not None
    tested = git(git_repo, "rev-parse", "fleet/k4").strip()
    os.environ["FLEET_WORKER_MERGE_STRATEGY"] = strategy
    try:
        _kill_in_hook(git_repo, marker, k4)
    finally:
        del os.environ["FLEET_WORKER_MERGE_STRATEGY"]
    assert fgit.merge_intent_file(git_repo).exists()  # the killed merge's own record
    # the next merge (any process) finds it: main back as it was, then the task lands
    result = fleet.merge(k4)
    assert result.merged, result.message
    assert main_is_whole(git_repo, before, tested) == "merged"
    assert fleet.get_task(k4).state == TaskState.MERGED
    assert not fgit.merge_intent_file(git_repo).exists()


def test_recovery_alone_puts_main_back_exactly(git_repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "hook-started"
    fleet = a_fleet()
    k4, _ = two_tasks(fleet, git_repo)
    install_hook(git_repo, marker)
    (git_repo / "notes.txt").write_text("the user's own untracked notes\n")
    before = checkout_state(git_repo)
    _kill_in_hook(git_repo, marker, k4)
    assert (git_repo / ".git" / "MERGE_HEAD").exists()  # the window was hit
    assert fgit.recover_merge(git_repo) is not None
    after = checkout_state(git_repo)
    assert {k: (v, after.get(k)) for k, v in before.items() if after.get(k) != v} == {}
    assert after == before


def test_a_merge_in_progress_that_is_not_ours_is_refused_and_left_alone(
        git_repo: Path) -> None:
    fleet = a_fleet()
    k4, _ = two_tasks(fleet, git_repo)
    git(git_repo, "switch", "-q", "-c", "side")
    (git_repo / "side.txt").write_text("side\n")
    commit_all(git_repo, "side")
    git(git_repo, "switch", "-q", "main")
    git(git_repo, "merge", "--no-ff", "--no-commit", "side")
    before = checkout_state(git_repo)
    result = fleet.merge(k4)
    assert not result.merged and result.reason == "checkout"
    assert "in the middle of a merge" in result.message
    assert "git merge --abort" in result.message
    assert checkout_state(git_repo) == before


def test_the_users_change_after_the_kill_is_never_touched(git_repo: Path,
                                                          tmp_path: Path) -> None:
    marker = tmp_path / "hook-started"
    fleet = a_fleet()
    k4, _ = two_tasks(fleet, git_repo)
    install_hook(git_repo, marker)
    _kill_in_hook(git_repo, marker, k4)
    (git_repo / "README.md").write_text("# the user's edit, made after the kill\n")
    git(git_repo, "add", "README.md")
    before = checkout_state(git_repo)
    result = fleet.merge(k4)
    assert not result.merged and result.reason == "checkout"
    assert "README.md" in result.message
    assert checkout_state(git_repo) == before


# --- the reliability row: SIGKILL at random points of the merge ------------------------------


@pytest.mark.timeout(120 + 10 * ROUNDS)
def test_merge_killed_at_random_points_never_leaves_main_between(
        git_repo: Path, tmp_path: Path) -> None:
    """N rounds: a merge (in a process of its own) SIGKILLed at a seeded random moment,
    in the hook or anywhere else; then the next merge lands it. Main is checked after
    the recovery: no merge state left, the index clean, HEAD the old commit or a merge
    holding the tested commit."""
    rng = random.Random(1700)
    fleet = a_fleet()
    outcomes = {"before": 0, "merged": 0}
    in_hook = 0
    started = time.monotonic()
    for n in range(ROUNDS):
        marker = tmp_path / f"hook-{n}"
        hook_round = n % 2 == 0
        (git_repo / ".git" / "hooks" / "prepare-commit-msg").unlink(missing_ok=True)
        task = finished_task(fleet.store, git_repo, f"r{n}", title=f"R{n}")
        assert task.worktree is not None
        (task.worktree / f"r{n}.txt").write_text(f"{n}\n")
        commit_all(task.worktree, f"R{n}")
        install_hook(git_repo, marker, wait=60 if hook_round else 0)
        before = git(git_repo, "rev-parse", "HEAD").strip()
        tested = git(git_repo, "rev-parse", f"fleet/r{n}").strip()
        proc = _merge_in_a_process(task.id, git_repo)
        try:
            started_at: Path = marker if hook_round else fgit.merge_intent_file(git_repo)
            wait_for("the merge to begin",
                     lambda p=proc, m=started_at: m.exists() or p.poll() is not None)
            # a random point inside the hook, or of the merge from its intent record on
            time.sleep(rng.uniform(0, 0.2) if hook_round else rng.uniform(0, 0.08))
            in_hook += hook_round and proc.poll() is None
            proc.kill()
            proc.wait(timeout=30)
        finally:
            stop_hook(marker)
        fgit.recover_merge(git_repo)
        outcomes[main_is_whole(git_repo, before, tested)] += 1
        if fleet.get_task(task.id).state != TaskState.MERGED:
            result = fleet.merge(task.id)
            if not result.merged:  # a merge that landed before its bookkeeping
                assert result.reason == "gone" or "nothing" in result.message, result.message
        assert main_is_whole(git_repo, before, tested) == "merged"
    record("Merge killed mid-merge", "rounds / main left between states", ROUNDS,
           note=f"{in_hook} in the hook; after recovery {outcomes['before']} as before, "
                f"{outcomes['merged']} merged; {time.monotonic() - started:.0f} s")
    record("Merge killed mid-merge", "main left between states", 0)
