"""Task states: the one table of what each state is, looks like and lets the user do.

The store, the engine, the CLI and the panel all read this table; a state's badge, its place
in the list, its style, whether it needs the user and which actions it can allow are written
here once. Adding a state means adding one row (and its enum member).

Nothing here imports the engine or Textual: `style` is a name the panel maps to a theme
colour, `alert` a word and a severity the panel's notifications use.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class TaskState(StrEnum):
    """Where a task is in its life."""

    QUEUED = "queued"
    RUNNING = "running"
    STALLED = "stalled"
    WAITING = "waiting"  # backoff or endpoint cooldown before the next attempt
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    MERGED = "merged"
    DISCARDED = "discarded"


class Phase(StrEnum):
    """The four phases a state belongs to; the sets below are derived from them."""

    PENDING = "pending"  # no worker yet: waits for a slot (queued) or a time (waiting)
    ACTIVE = "active"  # a worker runs
    FINISHED = "finished"  # the worker ended; the work waits for the user
    CLOSED = "closed"  # merged or discarded: history


class Action(StrEnum):
    """What a user can do to a task (the panel's keys, the CLI's commands)."""

    MERGE = "merge"
    DISCARD = "discard"
    RETRY = "retry"
    KILL = "kill"
    FOLLOW_UP = "follow_up"
    SHELL = "shell"
    DIFF = "diff"
    # landing many branches
    UPDATE = "update"  # bring the branch up to date with its base branch
    QUEUE = "queue"  # land through the merge queue
    PUSH = "push"  # push the branch to the remote instead of merging
    PICK = "pick"  # land this copy, discard its siblings
    SAY = "say"  # a message to the running worker (its next user turn)


# the words of each action in a sentence ("cannot <verb> task X: ...", the panel's "Cannot
# <verb> X: ..."): policy's refusals and the panel's dimmed keys say the same thing
VERBS: dict[Action, str] = {
    Action.MERGE: "merge",
    Action.DISCARD: "discard",
    Action.RETRY: "retry",
    Action.KILL: "kill",
    Action.FOLLOW_UP: "follow up",
    Action.SHELL: "open a shell in",
    Action.DIFF: "edit the files of",
    Action.UPDATE: "update",
    Action.QUEUE: "queue",
    Action.PUSH: "push",
    Action.PICK: "pick",
    Action.SAY: "send a message to",
}
assert set(VERBS) == set(Action), "every Action needs its words in VERBS"


class StopReason(StrEnum):
    """Why a stop of a running attempt was asked (the attempt's stop file says it; the
    runner, the supervisor and the follower write it, outcome reads it into a verdict)."""

    KILL = "kill"  # the user stopped it
    TIMEOUT = "timeout"  # its wall-clock limit passed
    STALL = "stall"  # no event for stall_seconds, with stall_kill
    ERROR = "error"  # the engine gave up on the task (its data could not be used)
    ENDPOINT = "endpoint"  # its endpoint refuses what it retries (parked window, held account)
    BUDGET = "budget"  # the task spent its budget_per_task (killed, the figure its message)
    # its endpoint's budget_per_day is met (the gateway answered its request itself): it
    # waits for the budget to lift, then resumes in its session
    BUDGET_DAY = "budget_day"
    # the gateway lacks the key of its route (a variable of the environment of the process
    # that started it, which has ended): it waits for a fleet-tui that can start it again
    NO_KEY = "no_key"


class LandState(StrEnum):
    """Where a task is in the merge queue (`Task.land_state`; None: not queued)."""

    WAITING = "waiting"  # its turn has not come (or it rejoined the end after a fix)
    UPDATING = "updating"  # its branch is brought up to date with the base branch
    TESTING = "testing"  # the test gate runs in its worktree
    MERGING = "merging"  # the tested commit lands in the base branch
    FIXING = "fixing"  # back with its worker (a conflict or a red gate)
    MERGED = "merged"  # landed
    STOPPED = "stopped"  # out of the queue, with the reason in land_note


# in the queue: its worktree and branch are the queue's (never discarded or reset)
LAND_ACTIVE = frozenset({LandState.WAITING, LandState.UPDATING, LandState.TESTING,
                         LandState.MERGING, LandState.FIXING})


class Verdict(StrEnum):
    """What became of a run (`outcome.classify` decides it; whether to retry is policy's
    decision). Here, not in outcome, so that policy and the store can name verdicts
    without importing the classifier and its stream parser."""

    OK = "ok"
    AUTH = "auth"
    OVERLOAD = "overload"
    QUOTA = "quota"
    # the provider's limits (providers.py reads them; policy decides what they lead to)
    WINDOW = "window"  # a usage window closed: the endpoint is parked until it resets
    CONCURRENCY = "concurrency"  # too many requests at once: fewer workers on the endpoint
    ACCOUNT = "account"  # the account, plan or model cannot be used: the endpoint stops
    MODEL_OVERLOAD = "model_overload"  # this model is overloaded: the small model next
    TIMEOUT = "timeout"
    # the endpoint (or the gateway a remote worker reaches it by) could not be reached: its
    # machine away, the network down; retried later, in the session when it has progress
    UNREACHABLE = "unreachable"
    # the endpoint's day budget was met mid-run: waits for it to lift (local midnight, a
    # raised budget_per_day), then resumes in its session; not counted as an attempt
    BUDGET = "budget"
    # the gateway no longer held the key of its route (it was started again after the
    # process whose environment held the key ended): waits for a fleet-tui that can start
    # it (with its own key), then resumes in its session; not counted as an attempt
    KEY = "key"
    MAX_TURNS = "max_turns"
    EMPTY = "empty"
    REFUSED = "refused"
    KILLED = "killed"
    CRASHED = "crashed"


@dataclass(frozen=True, slots=True)
class StateInfo:
    state: TaskState
    phase: Phase
    badge: str  # icon and word in the task list (single-cell icons keep columns aligned)
    order: int  # place in the list: needs-you first, then running, then waiting, history
    style: str  # style name the panel maps to a theme colour
    attention: bool  # the task needs the user (sorted first, bold, counted in the header)
    alert: tuple[str, str] | None  # (word, severity) of the notification on entering it
    actions: frozenset[Action]  # what this state can allow (policy.allowed_actions refines)


_FINISHED_ACTIONS = frozenset({Action.MERGE, Action.DISCARD, Action.RETRY, Action.FOLLOW_UP,
                               Action.SHELL, Action.DIFF, Action.UPDATE, Action.QUEUE,
                               Action.PUSH, Action.PICK})
_ACTIVE_ACTIONS = frozenset({Action.KILL, Action.DISCARD, Action.SHELL, Action.DIFF,
                             Action.SAY})
_PENDING_ACTIONS = frozenset({Action.KILL, Action.DISCARD, Action.SHELL, Action.DIFF})

STATES: dict[TaskState, StateInfo] = {info.state: info for info in (
    StateInfo(TaskState.STALLED, Phase.ACTIVE, "‼ stalled", 0, "stalled", True,
              ("stalled", "warning"), _ACTIVE_ACTIONS),
    StateInfo(TaskState.FAILED, Phase.FINISHED, "✗ failed", 1, "failed", True,
              ("failed", "error"), _FINISHED_ACTIONS),
    StateInfo(TaskState.SUCCEEDED, Phase.FINISHED, "✔ done", 2, "succeeded", True,
              ("finished", "information"), _FINISHED_ACTIONS),
    StateInfo(TaskState.KILLED, Phase.FINISHED, "■ killed", 3, "stalled", True, None,
              _FINISHED_ACTIONS),
    StateInfo(TaskState.RUNNING, Phase.ACTIVE, "▶ running", 4, "running", False, None,
              _ACTIVE_ACTIONS),
    StateInfo(TaskState.WAITING, Phase.PENDING, "… waiting", 5, "waiting", False, None,
              _PENDING_ACTIONS),
    StateInfo(TaskState.QUEUED, Phase.PENDING, "· queued", 6, "muted", False, None,
              _PENDING_ACTIONS),
    StateInfo(TaskState.MERGED, Phase.CLOSED, "⇢ merged", 7, "muted", False, None,
              frozenset()),
    StateInfo(TaskState.DISCARDED, Phase.CLOSED, "⌫ discarded", 8, "muted", False, None,
              frozenset()),
)}
assert set(STATES) == set(TaskState), "every TaskState needs its row in STATES"


def info(state: TaskState | str) -> StateInfo | None:
    """The row of a state (None for a value that is not a state, e.g. a tampered row)."""
    try:
        return STATES[TaskState(state)]
    except ValueError:
        return None


def _phase(phase: Phase) -> frozenset[TaskState]:
    return frozenset(s for s, i in STATES.items() if i.phase is phase)


PENDING_STATES = _phase(Phase.PENDING)
ACTIVE_STATES = _phase(Phase.ACTIVE)
FINISHED_STATES = _phase(Phase.FINISHED)
CLOSED_STATES = _phase(Phase.CLOSED)
ATTENTION_STATES = frozenset(s for s, i in STATES.items() if i.attention)
