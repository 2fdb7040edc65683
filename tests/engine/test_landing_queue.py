"""The merge queue with the real claude against the scripted endpoint.

Four tasks queued at once: one conflicts with what landed before it and one fails the test
gate; both go back to their workers once (the conflict list, the failing output) and land
after; the other two (one committed, one left uncommitted) land in order; main never holds
a commit that fails the gate; no worktree of a task still in the queue is ever removed.
Then the queue runner is SIGKILLed in the middle of a test gate and the queue resumes where
it was, landing every task once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from landing_support import (
    checkout_state,
    commit_all,
    drive,
    finished_task,
    git,
    make_fleet,
    settled,
)

from fleet_tui.core.states import LAND_ACTIVE, LandState, TaskState
from fleet_tui.demo.endpoint import ScriptedEndpoint, edit_and_commit_turns, resolve_conflict_turns
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.engine.landing import LandingQueue
from fleet_tui.system import procs

GATE = "python3 check.py"
CHECK = """import pathlib, sys
bad = [str(p) for p in pathlib.Path('.').rglob('*.txt') if 'BROKEN' in p.read_text()]
if bad:
    print('BROKEN found in', ', '.join(sorted(bad)))
    sys.exit(1)
print('all good')
"""
RESOLVED = "def main():\n    return 'a and b'\n"


def _bash(command: str) -> list[dict[str, Any]]:
    return [{"type": "tool_use", "name": "Bash",
             "input": {"command": command, "description": command[:40]}}]


SCRIPTS: dict[str, Any] = {
    "edit-a": [_bash("sed -i \"s/return 1/return 'a'/\" src/app.py && git commit -qam 'a'"),
               "main returns a"],
    "edit-b": {"turns": [_bash("sed -i \"s/return 1/return 'b'/\" src/app.py && "
                               "git commit -qam 'b'"), "main returns b"],
               "followup": resolve_conflict_turns("src/app.py", RESOLVED)},
    "red": {"turns": [_bash("echo BROKEN > gate.txt && git add gate.txt && "
                            "git commit -qm 'gate.txt'"), "added gate.txt"],
            "followup": edit_and_commit_turns("gate.txt", "fixed\n",
                                              "git commit -qam 'fix gate.txt'")},
    "add-d": [_bash("echo d > d.txt && git add d.txt && git commit -qm d"), "added d.txt"],
    "add-e": [_bash("echo e > e.txt"), "added e.txt (not committed)"],
}


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(SCRIPTS) as ep:
        yield ep


@pytest.fixture
def repo(git_repo: Path) -> Path:
    (git_repo / "check.py").write_text(CHECK)
    commit_all(git_repo, "the test gate")
    return git_repo


def _run_tasks(fleet: Fleet, repo: Path, scripts: list[str]) -> list[str]:
    ids = []
    for name in scripts:
        (task,) = fleet.submit(TaskSpec(prompt=f"[script:{name}] do {name}", title=name,
                                        repo=repo))
        ids.append(task.id)
    drive(fleet, settled(fleet, *ids), what="the workers")
    for task_id in ids:
        assert fleet.get_task(task_id).state == TaskState.SUCCEEDED
    return ids


def _landed_order(repo: Path) -> list[str]:
    """The tasks whose merge commits are on main's first-parent line, oldest first."""
    out = git(repo, "log", "--first-parent", "--reverse", "--format=%(trailers:key=Fleet-Task,"
              "valueonly,separator=)", "main")
    return [line.strip() for line in out.splitlines() if line.strip()]


def _every_main_commit_passes(repo: Path, tmp: Path) -> int:
    """Run the gate on each commit of main's first-parent line, in a detached worktree."""
    commits = git(repo, "rev-list", "--first-parent", "main").split()
    for n, commit in enumerate(commits):
        where = tmp / f"check-{n}"
        git(repo, "worktree", "add", "-q", "--detach", str(where), commit)
        try:
            if (where / "check.py").exists():
                result = os.system(f"cd {where} && {GATE} >/dev/null")
                assert result == 0, f"main holds {commit[:10]}, which fails the gate"
        finally:
            git(repo, "worktree", "remove", "--force", str(where))
    return len(commits)


class Watch:
    """Samples the queue while it runs: a worktree of a task still in the queue must
    exist at every sample. (The one being merged loses its worktree with the merge: once
    its tested commit is on main, it has landed.)"""

    def __init__(self, fleet: Fleet, repo: Path) -> None:
        self.fleet = fleet
        self.repo = repo
        self.missing: list[tuple[str, str | None]] = []
        self.samples = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            for task in self.fleet.store.landing_queue():
                if task.land_state in LAND_ACTIVE and (
                        task.worktree is None or not Path(task.worktree).is_dir()):
                    again = self.fleet.get_task(task.id)  # landed since the first read?
                    if again.land_state in LAND_ACTIVE and not self._landed(again):
                        self.missing.append((task.id, task.land_state))
            self.samples += 1
            time.sleep(0.05)

    def _landed(self, task: Any) -> bool:
        if task.land_state != LandState.MERGING or not task.land_commit:
            return False
        return subprocess.run(["git", "merge-base", "--is-ancestor", task.land_commit,
                               "main"], cwd=self.repo).returncode == 0

    def __enter__(self) -> Watch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


def test_queue_of_four_lands_in_order_and_sends_two_back_once(
        repo: Path, claude_bin: str, endpoint: ScriptedEndpoint, tmp_path: Path) -> None:
    # the two clean tasks, queued first and last around the two that go back: their
    # order on main is the queue's (a swap of the two fails the order below)
    fleet = make_fleet(endpoint, claude_bin, test_command=GATE, queue_fix_attempts=1)
    a, b, red, e = _run_tasks(fleet, repo, ["edit-a", "edit-b", "red", "add-e"])
    main_before = checkout_state(repo)
    with Watch(fleet, repo) as watch:
        queued = fleet.enqueue([a, b, red, e])
        assert [t.land_state for t in queued] == [LandState.WAITING] * 4
        assert checkout_state(repo) == main_before  # queuing alone changes nothing
        drive(fleet, lambda: all(fleet.get_task(t).land_state in (LandState.MERGED,
                                                                  LandState.STOPPED)
                                 for t in (a, b, red, e)),
              timeout=180, what="the queue to land everything")
    assert watch.samples > 10 and watch.missing == []
    tasks = {t: fleet.get_task(t) for t in (a, b, red, e)}
    assert {t: x.land_state for t, x in tasks.items()} == dict.fromkeys(tasks,
                                                                         LandState.MERGED)
    order = _landed_order(repo)
    assert order[:2] == [a, e]  # the clean ones, in queue order
    assert sorted(order[2:]) == sorted([b, red])  # the fixed ones, after they rejoined
    assert [tasks[t].land_fixes for t in (a, b, red, e)] == [0, 1, 1, 0]
    # each went back once, with what was wrong
    conflict_prompt = fleet.attempts(b)[-1]
    assert conflict_prompt.kind == "followup" and "src/app.py" in conflict_prompt.prompt
    gate_prompt = fleet.attempts(red)[-1]
    assert gate_prompt.kind == "followup" and "BROKEN found in gate.txt" in gate_prompt.prompt
    assert [len(fleet.attempts(t)) for t in (a, e)] == [1, 1]
    assert (repo / "src" / "app.py").read_text() == RESOLVED
    assert (repo / "gate.txt").read_text() == "fixed\n"
    assert (repo / "e.txt").read_text() == "e\n"  # uncommitted work was committed first
    assert _every_main_commit_passes(repo, tmp_path) >= 5
    assert all(x.gate == "passed" for x in tasks.values())
    for task in tasks.values():
        assert task.state == TaskState.MERGED and not Path(task.worktree or "/nope").exists()


def _queue_runners(repo: Path) -> list[int]:
    """Live merge queue runners of this repository (by their spec's path)."""
    spec = str(repo / ".fleet-work" / ".logs" / ".queue" / "spec.json")
    return [st.pid for st in procs.all_stats()
            if st.state != "Z" and procs.cmdline(st.pid)[-1:] == [spec]
            and "fleet_tui.engine.queue_runner" in procs.cmdline(st.pid)]


def test_queue_resumes_where_it_was_after_its_runner_is_killed(
        repo: Path, claude_bin: str, endpoint: ScriptedEndpoint, tmp_path: Path) -> None:
    # The first gate leaves a record and holds (sleep 600) until its runner's death stops
    # it; the later ones pass at once. (A `sleep 1.5` gate could pass before a poll saw
    # the task testing, under load.)
    started = tmp_path / "gates-started"
    gate = f"echo gate >> {started}; [ $(wc -l < {started}) -gt 1 ] || sleep 600; {GATE}"
    fleet = make_fleet(endpoint, claude_bin, test_command=gate)
    fleet.queue.QUEUE_CHECK = 0.2
    # two tasks: the one whose gate was cut off lands first, then the next, each once
    ids = _run_tasks(fleet, repo, ["add-d", "add-e"])
    fleet.enqueue(ids)
    drive(fleet, started.exists, what="the first task's gate")
    assert fleet.get_task(ids[0]).land_state == LandState.TESTING
    (runner,) = _queue_runners(repo)
    os.kill(runner, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while runner in _queue_runners(repo) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert runner not in _queue_runners(repo)
    assert fleet.get_task(ids[0]).land_state == LandState.TESTING  # left where it was
    # any engine's pass finds the queue without a runner and starts one
    drive(fleet, lambda: all(fleet.get_task(t).land_state == LandState.MERGED for t in ids),
          timeout=120, what="the resumed queue")
    assert _landed_order(repo) == ids  # in order, each once
    assert runner not in _queue_runners(repo)
    assert not any(procs.cmdline(st.pid)[:2] == ["sleep", "600"] for st in procs.all_stats()
                   if st.state != "Z" and str(repo) in _cwd(st.pid))


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def test_one_process_runs_the_queue(repo: Path, endpoint: ScriptedEndpoint) -> None:
    """A second runner (another process, or this one) finds the queue's lock held and
    does nothing; the queue is landed once. The lock is the queue's own rule: the task is
    one as a finished worker leaves it, with its commit (the real claude's tasks go
    through the queue in the tests above); no worker runs here."""
    fleet = make_fleet(endpoint, "claude")
    task = finished_task(fleet.store, repo, "d00001", title="add d")
    assert task.worktree is not None
    (task.worktree / "d.txt").write_text("d\n")
    commit_all(task.worktree, "d")
    ids = [task.id]
    fleet.store.enqueue_landing(ids)  # no runner started
    first = LandingQueue(fleet, repo)
    started = threading.Event()
    original = first.land

    def slow_land(task: Any) -> None:
        started.set()
        time.sleep(1.0)
        original(task)

    first.land = slow_land  # type: ignore[method-assign]
    thread = threading.Thread(target=first.run)
    thread.start()
    assert started.wait(30)
    assert fleet.queue_running(repo)
    assert fleet.ensure_queue_runner(repo) is False  # nothing spawned
    other = make_fleet(endpoint, "claude")
    assert LandingQueue(other, repo).run() is False  # the lock is held: it did nothing
    thread.join(timeout=60)
    assert fleet.get_task(ids[0]).land_state == LandState.MERGED
    assert _landed_order(repo) == ids
    assert not fleet.queue_running(repo)


def test_queue_started_from_a_panel_survives_its_sigkill_and_resumes(
        repo: Path, claude_bin: str, endpoint: ScriptedEndpoint, tmp_path: Path) -> None:
    """The real panel in a pseudo-terminal: mark all, m, y. SIGKILL the panel and the queue
    runner in the middle of the first gate; a new panel resumes the queue where it was."""
    from test_reliability import Panel

    # The gate leaves a record when it starts and holds until the test releases it: the
    # kill lands in the first gate however slow the machine (a fixed `sleep 2` gate could
    # pass before a poll saw it testing). The test's engine has the same gate: its passes
    # may start the runner before the panel does (with no gate, it landed everything).
    started, release = tmp_path / "gates-started", tmp_path / "gates-released"
    gate = (f"echo gate >> {started}; while [ ! -e {release} ]; do sleep 0.05; done; "
            f"{GATE}")
    fleet = make_fleet(endpoint, claude_bin, test_command=gate)
    ids = _run_tasks(fleet, repo, ["add-d", "add-e"])
    env = dict(os.environ, FLEET_WORKER_BASE_URL=endpoint.url, FLEET_WORKER_CLAUDE=claude_bin,
               FLEET_WORKER_KEY_SOURCES="env", FLEET_WORKER_TEST_COMMAND=gate,
               ANTHROPIC_AUTH_TOKEN="sk-landing-panel-SECRET-4a1f", TERM="xterm-256color")
    screen = tmp_path / "panel1.screen"
    panel = Panel(env, repo, screen)

    def shows(*words: str) -> None:
        deadline = time.monotonic() + 60
        while not all(w.encode() in (screen.read_bytes() if screen.exists() else b"")
                      for w in words):
            assert panel.alive() and time.monotonic() < deadline, f"no {words} on screen"
            time.sleep(0.1)

    try:
        shows(*ids)  # the list is read
        os.write(panel.fd, b"\x01")  # ctrl+a: mark every task listed
        shows("2 marked")
        os.write(panel.fd, b"m")
        shows("through the merge queue?")
        os.write(panel.fd, b"y")
        drive(fleet, lambda: all(fleet.get_task(t).land_state for t in ids), what="queued")
        order = [t.id for t in sorted((fleet.get_task(t) for t in ids),
                                      key=lambda t: t.land_order or 0)]
        drive(fleet, started.exists, what="the first gate")
        assert fleet.get_task(order[0]).land_state == LandState.TESTING
        panel.kill()
        for pid in _queue_runners(repo):
            os.kill(pid, signal.SIGKILL)
    finally:
        panel.close()
    deadline = time.monotonic() + 10
    while _queue_runners(repo) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _queue_runners(repo) == []
    assert fleet.get_task(order[0]).land_state == LandState.TESTING
    assert git(repo, "log", "-1", "--format=%s").strip() == "the test gate"  # nothing landed
    assert started.read_text() == "gate\n"  # one gate ran, the first
    release.touch()  # the gates from now on pass
    again = Panel(env, repo, tmp_path / "panel2.screen")
    try:
        deadline = time.monotonic() + 120
        while not all(fleet.get_task(t).land_state == LandState.MERGED for t in ids):
            assert time.monotonic() < deadline, [fleet.get_task(t).land_state for t in ids]
            assert again.alive()
            time.sleep(0.2)
    finally:
        again.close()
    assert _landed_order(repo) == order
