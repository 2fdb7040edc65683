"""The landing rules as tables: what a queued or conflicted task refuses, which
task the merge queue lands next, what a conflict or a red gate leads to, and a fix's end.
No claude, no disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_tui.core import policy
from fleet_tui.core.states import Action, LandState, TaskState
from fleet_tui.core.titles import commit_title, copy_title
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Task


def task(state: TaskState = TaskState.SUCCEEDED, **fields: object) -> Task:
    base: dict[str, object] = {"id": "abc123", "prompt": "p", "repo": Path("/r"),
                               "base_branch": "main", "branch": "fleet/abc123",
                               "worktree": Path("/r/.fleet-work/abc123"),
                               "session_id": "s-1"}
    base.update(fields)
    return Task(state=state, **base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("fields", "action", "reason"), [
    # in the merge queue: its worktree and branch are the queue's
    ({"land_state": "waiting"}, Action.DISCARD, "in the merge queue (waiting)"),
    ({"land_state": "fixing"}, Action.RETRY, "queue --remove abc123"),
    ({"land_state": "testing"}, Action.MERGE, "in the merge queue"),
    ({"land_state": "waiting"}, Action.UPDATE, "in the merge queue"),
    ({"land_state": "waiting"}, Action.QUEUE, "in the merge queue"),
    ({"land_state": "waiting"}, Action.PICK, "in the merge queue"),
    ({"land_state": "updating"}, Action.FOLLOW_UP, "the merge queue is landing it"),
    # an update stopped mid-merge
    ({"conflicts": ["a.py"]}, Action.MERGE, "stopped on conflicts (a.py)"),
    ({"conflicts": ["a.py"]}, Action.QUEUE, "resolve them"),
    ({"conflicts": ["a.py"]}, Action.PUSH, "abort the update"),
    # no base branch: nothing to update from or land in
    ({"base_branch": None}, Action.UPDATE, "not a branch"),
    ({"base_branch": None}, Action.QUEUE, "not a branch"),
])
def test_what_landing_refuses(fields: dict[str, object], action: Action, reason: str) -> None:
    why = policy.why_not(task(**fields), action)
    assert why is not None and reason in why


@pytest.mark.parametrize(("fields", "action"), [
    ({"land_state": "waiting"}, Action.FOLLOW_UP),  # the queue passes it over meanwhile
    ({"land_state": "waiting"}, Action.SHELL),
    ({"land_state": "stopped"}, Action.DISCARD),  # out of the queue: the user's again
    ({"land_state": "merged"}, Action.DISCARD),
    ({"conflicts": ["a.py"]}, Action.UPDATE),  # the way to resolve or abort it
    ({"conflicts": ["a.py"]}, Action.FOLLOW_UP),
    ({"conflicts": ["a.py"]}, Action.DISCARD),
])
def test_what_landing_allows(fields: dict[str, object], action: Action) -> None:
    assert policy.why_not(task(**fields), action) is None


def test_next_to_land_in_order_passing_over_busy_and_fixing_tasks() -> None:
    queue = [task(id="c", land_state="waiting", land_order=3.0),
             task(TaskState.RUNNING, id="a", land_state="waiting", land_order=1.0),
             task(TaskState.RUNNING, id="f", land_state="fixing", land_order=0.5),
             task(id="b", land_state="testing", land_order=2.0),
             task(id="m", land_state="merged", land_order=0.1)]
    assert (chosen := policy.next_to_land(queue)) is not None and chosen.id == "b"
    assert policy.next_to_land([queue[1], queue[2]]) is None


@pytest.mark.parametrize(("fixes", "attempts", "session", "state", "words"), [
    (0, 1, "s-1", LandState.FIXING, "fix 1 of 1"),
    (1, 1, "s-1", LandState.STOPPED, "stopped after 1 fix attempt"),
    (0, 0, "s-1", LandState.STOPPED, "no fix attempt allowed"),
    (1, 3, "s-1", LandState.FIXING, "fix 2 of 3"),
    (0, 1, None, LandState.STOPPED, "no session"),
])
def test_land_failure(fixes: int, attempts: int, session: str | None, state: LandState,
                      words: str) -> None:
    settings = load_settings(env={}, config_file="/nonexistent",
                             overrides={"queue_fix_attempts": attempts})
    nxt = policy.land_failure(task(land_fixes=fixes, session_id=session), settings,
                              "the test gate failed on 1a2b")
    assert nxt.state == state and words in nxt.note
    assert nxt.note.startswith("the test gate failed on 1a2b")


@pytest.mark.parametrize(("state", "count", "land_attempt", "expected"), [
    (TaskState.QUEUED, 2, 2, None),  # the follow-up has not run yet
    (TaskState.RUNNING, 2, 2, None),
    (TaskState.SUCCEEDED, 1, 2, None),  # recorded, not started
    (TaskState.SUCCEEDED, 2, 2, LandState.WAITING),
    (TaskState.FAILED, 2, 2, LandState.STOPPED),
    (TaskState.KILLED, 2, 2, LandState.STOPPED),
])
def test_after_fix(state: TaskState, count: int, land_attempt: int,
                   expected: LandState | None) -> None:
    nxt = policy.after_fix(task(state, land_state="fixing", attempt_count=count,
                                land_attempt=land_attempt, message="it broke"))
    assert (nxt.state if nxt else None) == expected
    if expected == LandState.STOPPED:
        assert nxt is not None and "it broke" in nxt.note


@pytest.mark.parametrize(("title", "expected"), [
    ("Add a flag (1/2)", "Add a flag"),
    ("Add a flag (12/50)", "Add a flag"),
    ("Add a flag", "Add a flag"),
    ("Fix (a/b) parsing", "Fix (a/b) parsing"),
    ("Use ratio (1/2)  ", "Use ratio"),
    ("(1/2)", "(1/2)"),  # nothing would be left: kept
])
def test_commit_title_drops_a_copys_suffix(title: str, expected: str) -> None:
    assert commit_title(title) == expected


def test_copy_title() -> None:
    assert copy_title("T", 1, 1) == "T"
    assert copy_title("T", 2, 3) == "T (2/3)"
    assert commit_title(copy_title("T", 2, 3)) == "T"


def test_landing_label_in_the_list() -> None:
    from fleet_tui.ui.formatting import landing_label, pushed_label

    assert landing_label(task()) is None
    assert landing_label(task(land_state="testing")) == ("⇡testing", "running")
    assert landing_label(task(land_state="stopped")) == ("⇡stopped", "failed")
    assert landing_label(task(TaskState.DISCARDED, land_state="stopped")) is None
    assert landing_label(task(land_state="merged")) is None
    assert landing_label(task(conflicts=["a"], land_state="fixing")) == ("⚠conflicts",
                                                                          "failed")
    pushed = task(pushed="origin fleet/abc123 " + "1a2b3c4d5e6f" * 3)
    assert landing_label(pushed) == ("↑pushed", "muted")
    assert pushed_label(pushed) == "origin/fleet/abc123 @ 1a2b3c4d5e"
