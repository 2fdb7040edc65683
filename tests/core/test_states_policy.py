"""The state table and what each task allows: table tests, no claude, no disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_tui.core import policy, states
from fleet_tui.core.states import Action, TaskState
from fleet_tui.store.db import Task


def task(state: TaskState, **fields: object) -> Task:
    base: dict[str, object] = {"id": "abc123", "prompt": "p", "repo": Path("/r"),
                               "base_branch": "main", "branch": "fleet/abc123",
                               "worktree": Path("/r/.fleet-work/abc123"),
                               "session_id": "s-1"}
    base.update(fields)
    return Task(state=state, **base)  # type: ignore[arg-type]


def test_every_state_has_one_row_and_one_phase() -> None:
    assert set(states.STATES) == set(TaskState)
    phases = [states.PENDING_STATES, states.ACTIVE_STATES, states.FINISHED_STATES,
              states.CLOSED_STATES]
    assert sum(len(p) for p in phases) == len(TaskState)
    assert set().union(*phases) == set(TaskState)
    orders = [i.order for i in states.STATES.values()]
    assert len(set(orders)) == len(orders), "two states share a place in the list"


def test_attention_states_sort_before_the_others() -> None:
    first = max(states.STATES[s].order for s in states.ATTENTION_STATES)
    rest = min(i.order for s, i in states.STATES.items() if s not in states.ATTENTION_STATES)
    assert first < rest


def test_an_unknown_state_has_no_row() -> None:
    assert states.info("exploded") is None
    assert states.info("running") is states.STATES[TaskState.RUNNING]


_LANDING = {Action.UPDATE, Action.QUEUE, Action.PUSH, Action.PICK}
ALLOWED = {  # state -> actions allowed for a task with a worktree, a branch and a session
    TaskState.QUEUED: {Action.KILL, Action.DISCARD, Action.SHELL, Action.DIFF},
    TaskState.WAITING: {Action.KILL, Action.DISCARD, Action.SHELL, Action.DIFF},
    TaskState.RUNNING: {Action.KILL, Action.DISCARD, Action.SHELL, Action.DIFF, Action.SAY},
    TaskState.STALLED: {Action.KILL, Action.DISCARD, Action.SHELL, Action.DIFF, Action.SAY},
    TaskState.SUCCEEDED: {Action.MERGE, Action.DISCARD, Action.RETRY, Action.FOLLOW_UP,
                          Action.SHELL, Action.DIFF, *_LANDING},
    TaskState.FAILED: {Action.MERGE, Action.DISCARD, Action.RETRY, Action.FOLLOW_UP,
                       Action.SHELL, Action.DIFF, *_LANDING},
    TaskState.KILLED: {Action.MERGE, Action.DISCARD, Action.RETRY, Action.FOLLOW_UP,
                       Action.SHELL, Action.DIFF, *_LANDING},
    TaskState.MERGED: set(),
    TaskState.DISCARDED: set(),
}


@pytest.mark.parametrize("state", list(TaskState))
def test_allowed_actions_by_state(state: TaskState) -> None:
    answers = policy.allowed_actions(task(state))
    assert {a for a, why in answers.items() if why is None} == ALLOWED[state]
    assert all(isinstance(why, str) and why for a, why in answers.items()
               if a not in ALLOWED[state])


@pytest.mark.parametrize(("fields", "action", "reason"), [
    ({"session_id": None}, Action.FOLLOW_UP, "no session"),
    ({"base_branch": None}, Action.MERGE, "not a branch"),
    ({"worktree": None}, Action.SHELL, "no worktree"),
    ({"worktree": None}, Action.DIFF, "no worktree"),
])
def test_task_facts_refine_what_a_state_allows(fields: dict[str, object], action: Action,
                                                reason: str) -> None:
    why = policy.why_not(task(TaskState.SUCCEEDED, **fields), action)
    assert why is not None and reason in why


def test_a_message_to_a_finished_worker_points_to_follow_up() -> None:
    why = policy.refusal(task(TaskState.SUCCEEDED), Action.SAY)
    assert why is not None and why.startswith("cannot send a message to task")
    assert "follow-up" in why
    queued = policy.why_not(task(TaskState.QUEUED), Action.SAY)
    assert queued is not None and "not started" in queued


def test_a_tampered_state_allows_nothing() -> None:
    bad = task(TaskState.FAILED)
    bad.state = "exploded"  # type: ignore[assignment]
    assert all(why is not None and "unknown" in why
               for why in policy.allowed_actions(bad).values())
