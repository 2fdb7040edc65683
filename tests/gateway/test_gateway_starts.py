"""An endpoint's attempts start in step with its request slots (bench 11): with
`max_requests = 2` through the gateway, the first 2 start at once and each further one
once a starter's claude has begun (its init event); a start that never begins holds the
next ones back for policy.START_BOUND at most; a worker cap at the slots, an endpoint
without slots, or the gateway off start as many as the cap allows.

The real claude through the gateway against the scripted endpoint. Each task's start is
held by the repository's setup command (the runner runs it before claude), which waits
for a file of the task's id that the test writes: the test decides when each claude
begins, and no assertion hangs on the machine's speed."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from endpoint_helpers import shared
from test_fleet import drive, make_fleet, settled
from test_gateway_real import gateway_fleet

from fleet_tui.core import policy
from fleet_tui.core.states import ACTIVE_STATES, PENDING_STATES
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.gateway import control
from fleet_tui.store.db import TaskState

QUICK = {"real_turns": True, "turns": ["done"]}


def gated_repo(repo: Path, gates: Path) -> None:
    """The repository's setup waits for gates/<task id> (a setup line carries no session:
    the attempt is starting until the file comes and claude prints its init event). The
    gates are in the repository's cache folder: the setup runs in the worker's cage, where
    the test's own folder is not there."""
    gates.mkdir(exist_ok=True)
    (repo / ".fleet-tui.toml").write_text(
        f'setup = "while [ ! -e {gates}/$FLEET_TASK_ID ]; do sleep 0.05; done"\n')
    subprocess.run(["git", "add", ".fleet-tui.toml"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "setup waits for its gate"], cwd=repo, check=True)


def open_gate(gates: Path, task_id: str) -> None:
    (gates / task_id).write_text("go\n")


def active(fleet: Fleet, ids: list[str]) -> list[str]:
    """The tasks claimed so far (running or done), in the order they were claimed."""
    tasks = [fleet.get_task(i) for i in ids]
    started = [t for t in tasks if t.state not in PENDING_STATES]
    return [t.id for t in sorted(started, key=lambda t: (t.started_at or 0.0, t.id))]


def ticks(fleet: Fleet, n: int) -> None:
    for _ in range(n):
        fleet.tick()


def finish(fleet: Fleet, gates: Path, ids: list[str]) -> None:
    for task_id in ids:
        open_gate(gates, task_id)
    drive(fleet, settled(fleet, *ids), timeout=180)
    done = [fleet.get_task(i) for i in ids]
    assert all(t.state == TaskState.SUCCEEDED for t in done), \
        [(t.state, t.message) for t in done]


@contextlib.contextmanager
def first_pass(repo: Path, claude: str, gates: Path, copies: int,
               **overrides: Any) -> Iterator[tuple[Fleet, list[str], list[str]]]:
    """`copies` tasks held at their gates, after the engine's first pass: the fleet, the
    tasks' ids, and those it started. With 2 request slots the endpoint answers 1302
    beyond 2 requests in flight (none may reach it); without, any number."""
    gated_repo(repo, gates)
    slots = overrides.get("gateway", True) and overrides.get("max_requests") == 2
    faults = [{"kind": "concurrency", "limit": 2}] if slots else []
    with ScriptedEndpoint({"default": QUICK}, faults=faults) as ep:
        if overrides.pop("gateway", True):
            fleet = gateway_fleet(ep, claude, max_attempts=1, **overrides)
        else:
            fleet = make_fleet(ep, claude, max_attempts=1, **overrides)
        try:
            ids = [t.id for t in fleet.submit(TaskSpec(prompt="go", repo=repo),
                                              copies=copies)]
            fleet.tick()
            yield fleet, ids, active(fleet, ids)
            finish(fleet, gates, ids)
            assert [r for r in ep.message_requests() if r.status != 200] == []
        finally:
            control.stop(fleet.env, db=fleet.store.path)
            fleet.store.close()


def test_attempts_start_in_step_with_the_slots(git_repo: Path, claude_bin: str,
                                               tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # no start is let go by the bound here: only a starter's init event lets the next go
    monkeypatch.setattr(policy, "START_BOUND", 3600.0)
    gates = shared(git_repo, "gates")
    with first_pass(git_repo, claude_bin, gates, 4, max_workers=4,
                    max_requests=2) as (fleet, ids, first):
        assert len(first) == 2  # the slots' number at once, not the cap's 4
        ticks(fleet, 10)  # neither starter has begun: the others wait
        assert active(fleet, ids) == first
        assert fleet.store.starting_count("default", 0.0) == 2
        # one starter's claude begins: one more starts, and only one
        open_gate(gates, first[0])
        drive(fleet, lambda: len(active(fleet, ids)) == 3, timeout=90)
        (third,) = set(active(fleet, ids)) - set(first)
        assert fleet.attempts(first[0])[-1].session_id is not None
        ticks(fleet, 10)
        assert len(active(fleet, ids)) == 3
        assert [fleet.get_task(i).state for i in ids].count(TaskState.QUEUED) == 1
        open_gate(gates, third)
        drive(fleet, lambda: len(active(fleet, ids)) == 4, timeout=90)


def test_a_start_that_never_begins_holds_the_next_ones_back_for_a_bound(
        git_repo: Path, claude_bin: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy, "START_BOUND", 1.0)
    gates = shared(git_repo, "gates")
    # one task beyond the 2 slots, and a cap that would start it at once without them
    with first_pass(git_repo, claude_bin, gates, 3, max_workers=3,
                    max_requests=2) as (fleet, ids, first):
        assert len(first) == 2
        # the first two never begin (their setup waits): past the bound the next goes on
        drive(fleet, lambda: len(active(fleet, ids)) == 3, timeout=90)
        assert all(fleet.attempts(i)[-1].session_id is None for i in first)


# 3 workers are one more than 2 slots would let start at once
@pytest.mark.parametrize("overrides", [
    {"max_workers": 2, "max_requests": 2},  # the cap at the slots: the 2 workers' case
    {"max_workers": 3, "max_requests": 0},  # no slots: any number in flight
    {"max_workers": 3, "max_requests": 2, "gateway": False},  # direct: no slots at all
], ids=["cap-at-slots", "no-slots", "direct"])
def test_without_more_workers_than_slots_all_start_at_once(
        git_repo: Path, claude_bin: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        overrides: dict[str, Any]) -> None:
    monkeypatch.setattr(policy, "START_BOUND", 3600.0)
    n = overrides["max_workers"]
    with first_pass(git_repo, claude_bin, shared(git_repo, "gates"), n,
                    **overrides) as (fleet, ids, first):
        # none of them has begun, and every one started in this pass
        assert len(first) == n
        assert all(fleet.get_task(i).state in ACTIVE_STATES for i in ids)
