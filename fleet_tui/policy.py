"""Policy: the engine's and the panel's decisions as pure functions.

What a task's state allows (`allowed_actions`) lives here so the panel's keys, the CLI's
commands and the engine's refusals cannot disagree: each asks this module, and each shows
the same reason when the answer is no. No I/O, no clock, no randomness of its own: callers
pass what a rule needs, so every rule is tested with a table in milliseconds.
"""

from __future__ import annotations

from fleet_tui.states import STATES, Action, Phase

TYPE_CHECKING = False
if TYPE_CHECKING:
    from fleet_tui.store import Task


def why_not(task: Task, action: Action) -> str | None:
    """None when `task` allows `action` now, else why not (a phrase that completes
    "cannot <action> task X: ...")."""
    info = STATES.get(task.state)
    if info is None:
        return f"its state {task.state!r} is unknown"
    if info.phase is Phase.CLOSED:
        return f"it was {task.state} already"
    if action not in info.actions:
        if action in (Action.MERGE, Action.RETRY, Action.FOLLOW_UP):
            return (f"it is {task.state}; wait for it to finish or kill it "
                    f"(`fleet-tui kill {task.id}`) first")
        if action is Action.KILL:
            return f"it is not running (it is {task.state})"
        return f"it is {task.state}"
    if action is Action.MERGE and not task.base_branch:
        return (f"it was started from a commit, not a branch; merge its branch "
                f"{task.branch or 'fleet/' + task.id} by hand")
    if action is Action.FOLLOW_UP and not task.session_id:
        return "it has no session to continue (its run never started one); retry it instead"
    if action in (Action.SHELL, Action.DIFF) and task.worktree is None:
        return "it has no worktree yet"
    return None


def allowed_actions(task: Task) -> dict[Action, str | None]:
    """Every action, with None where `task` allows it now and the reason where not."""
    return {action: why_not(task, action) for action in Action}
