"""Policy: the engine's and the panel's decisions as pure functions.

What a task's state allows (`allowed_actions`) lives here so the panel's keys, the CLI's
commands and the engine's refusals cannot disagree: each asks this module, and each shows
the same reason when the answer is no. So do the engine's decisions about a run: which
model the next attempt uses (`model_for`), what a finished attempt leads to (`after_attempt`:
success, backoff with jitter, the endpoint's quota cooldown, giving up, the hint that comes
with an auth failure), when an endpoint may start work again (`cooldown_until`), and what
the watchdogs do (`watchdog`).

No I/O, no clock, no randomness of its own: callers pass the tasks, attempts and settings a
rule needs, the time (`now`) and a random source (`rng`), so every rule is tested with a
table in milliseconds. Cheap to import (the panel asks `allowed_actions` at start-up): no
store, no outcome, no stream parser.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet_tui.states import STATES, Action, Phase, TaskState, Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Protocol

    from fleet_tui.config import Settings
    from fleet_tui.store import Attempt, Task

    class Random(Protocol):
        """What policy asks of a random source (random.Random has it)."""

        def uniform(self, a: float, b: float) -> float: ...


__all__ = ["RUNNER_HEADSTART", "TRANSIENT", "Next", "Watch", "after_attempt",
           "allowed_actions", "auth_hint", "backoff_delay", "cooldown_until", "model_for",
           "refusal", "streak", "time_limit", "watchdog", "why_not", "why_not_resume"]

# verdicts of the moment (the endpoint's, not the task's): tried again after a wait
TRANSIENT = frozenset({Verdict.OVERLOAD, Verdict.QUOTA})
# the runner enforces the timeout and the kill grace itself; the engine's backstop waits
# this much longer, so that it acts only for a runner that did not
RUNNER_HEADSTART = 1.0
BACKOFF_JITTER = (0.5, 1.0)  # the backoff is multiplied by a uniform draw from this range
_VERBS = {Action.FOLLOW_UP: "follow up", Action.SAY: "send a message to"}


# --- what a task allows ----------------------------------------------------------------------


def why_not(task: Task, action: Action) -> str | None:
    """None when `task` allows `action` now, else why not (a phrase that completes
    "cannot <action> task X: ...")."""
    info = STATES.get(task.state)
    if info is None:
        return f"its state {task.state!r} is unknown"
    if info.phase is Phase.CLOSED:
        return f"it was {task.state} already"
    if action not in info.actions:
        if action is Action.SAY:
            if info.phase is Phase.FINISHED:
                return (f"its worker has finished (it is {task.state}); send a follow-up "
                        f"instead (`fleet-tui follow-up {task.id} TEXT`)")
            return f"its worker has not started yet (it is {task.state})"
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


def why_not_resume(task: Task) -> str | None:
    """Why `task` cannot be retried in its own session (`retry --resume`), or None."""
    why = why_not(task, Action.RETRY)
    if why is None and not task.session_id:
        return ("it has no session to resume (its run never started one); retry it "
                "without --resume")
    return why


def allowed_actions(task: Task) -> dict[Action, str | None]:
    """Every action, with None where `task` allows it now and the reason where not."""
    return {action: why_not(task, action) for action in Action}


def refusal(task: Task, action: Action, why: str | None = None) -> str | None:
    """The sentence the engine and the CLI refuse `action` with ("cannot merge task abc:
    it is running; ..."), or None when `task` allows it. `why`: a reason found already."""
    why = why if why is not None else why_not(task, action)
    if why is None:
        return None
    return f"cannot {_VERBS.get(action, action.value)} task {task.id}: {why}"


# --- the next attempt ------------------------------------------------------------------------


def streak(attempts: Sequence[Attempt], verdicts: Iterable[str]) -> int:
    """How many of the latest finished attempts in a row ended with one of `verdicts`
    (an attempt that has no verdict yet, the one about to run, is skipped)."""
    wanted = frozenset(verdicts)
    count = 0
    for attempt in reversed(attempts):
        if attempt.verdict is None:
            continue
        if attempt.verdict not in wanted:
            break
        count += 1
    return count


def model_for(task: Task, attempts: Sequence[Attempt], settings: Settings) -> str:
    """The model of the next attempt: the task's tier (main, small or a model name), or
    the small model once `fallback_after` attempts in a row were overloaded."""
    if streak(attempts, (Verdict.OVERLOAD,)) >= settings.fallback_after:
        return settings.small_model
    tier = task.model or "main"
    if tier == "main":
        return settings.model
    if tier == "small":
        return settings.small_model
    return tier


def backoff_delay(overloads: int, settings: Settings, rng: Random) -> float:
    """Seconds to wait after the `overloads`-th overload in a row: exponential from
    `backoff_base`, at most `backoff_cap`, times a jitter drawn from BACKOFF_JITTER (so
    that workers that failed together do not come back together)."""
    exponent = min(max(0, overloads - 1), 64)
    delay = min(settings.backoff_cap, settings.backoff_base * 2 ** exponent)
    return float(delay * rng.uniform(*BACKOFF_JITTER))


def cooldown_until(endpoint: str, tasks: Iterable[Task], now: float) -> float | None:
    """When `endpoint`'s quota cooldown ends (None: none now). It is the `not_before` of
    the tasks waiting after a 429: kept in the store, so every fleet-tui process sees the
    same cooldown and it survives a restart."""
    until = [t.not_before for t in tasks
             if t.endpoint == endpoint and t.state == TaskState.WAITING
             and t.verdict == Verdict.QUOTA and t.not_before is not None
             and t.not_before > now]
    return max(until) if until else None


def auth_hint(message: str, endpoint: str) -> str:
    """An auth failure's message with the way to fix it, unless it names the key already."""
    if "key" in message:
        return message
    return (f"{message} — check the API key for {endpoint}: `fleet-tui key set`, or "
            "ANTHROPIC_AUTH_TOKEN")


@dataclass(frozen=True, slots=True)
class Next:
    """What a finished attempt leads to: the task's new state and message, and for a
    waiting task when it may start again."""

    state: TaskState
    message: str
    not_before: float | None = None

    @property
    def finished(self) -> bool:
        """The task is done for now (not waiting to be tried again)."""
        return self.state != TaskState.WAITING


def after_attempt(task: Task, attempts: Sequence[Attempt], verdict: str, message: str,
                  settings: Settings, now: float, rng: Random) -> Next:
    """The task's next state once the attempt it is on ended with `verdict`. `attempts`:
    all of the task's attempts, the one that just ended included (with its verdict).

    ok: succeeded. killed: killed. overload or quota, fewer than `max_attempts` in a row:
    waiting (overload: jittered exponential backoff, the small model after
    `fallback_after`; quota: every task of the endpoint waits `quota_cooldown`); more: failed,
    "gave up". auth: failed, with the fix (`auth_hint`). Anything else: failed."""
    if verdict == Verdict.OK:
        return Next(TaskState.SUCCEEDED, message)
    if verdict == Verdict.KILLED:
        return Next(TaskState.KILLED, message)
    if verdict in TRANSIENT:
        in_a_row = streak(attempts, TRANSIENT)
        if in_a_row >= settings.max_attempts:
            return Next(TaskState.FAILED, f"{message} — gave up after {in_a_row} attempts")
        if verdict == Verdict.OVERLOAD:
            overloads = streak(attempts, (Verdict.OVERLOAD,))
            delay = backoff_delay(overloads, settings, rng)
            small = settings.small_model if overloads >= settings.fallback_after else None
            return Next(TaskState.WAITING,
                        f"{message} — retry {in_a_row + 1}/{settings.max_attempts} in "
                        f"{delay:.1f} s" + (f" on the small model {small}" if small else ""),
                        now + delay)
        return Next(TaskState.WAITING,
                    f"{message} — every task on {task.endpoint} waits "
                    f"{settings.quota_cooldown:g} s (quota cooldown), then retries",
                    now + settings.quota_cooldown)
    if verdict == Verdict.AUTH:
        return Next(TaskState.FAILED, auth_hint(message, task.endpoint))
    return Next(TaskState.FAILED, message)


# --- the watchdogs ---------------------------------------------------------------------------


def time_limit(task: Task, settings: Settings) -> float | None:
    """The task's wall-clock limit in seconds (its own, else the setting), None for none."""
    limit = task.timeout if task.timeout is not None else settings.timeout
    return float(limit) if limit and limit > 0 else None


@dataclass(frozen=True, slots=True)
class Watch:
    """What the watchdogs ask for on one pass over a running attempt (all may be unset)."""

    hard_kill: bool = False  # a stop was asked kill_grace (+ headstart) ago: SIGKILL now
    stop: tuple[str, str] | None = None  # (reason, message): ask the runner to stop
    stalled: str | None = None  # mark the task stalled, with this message


def watchdog(task: Task, attempt: Attempt, settings: Settings, now: float, *,
             stop_asked_at: float | None, last_activity: float | None) -> Watch:
    """The engine's backstop for a running attempt (the runner enforces the timeout and
    the kill grace itself): a SIGKILL once a stop asked at `stop_asked_at` has had its
    grace; a stop once the wall-clock limit has passed; "stalled" (and, with `stall_kill`,
    a stop) after `stall_seconds` without an event since `last_activity` (or the start)."""
    if stop_asked_at is not None:
        return Watch(hard_kill=now - stop_asked_at >= settings.kill_grace + RUNNER_HEADSTART)
    started = attempt.started_at or now
    limit = time_limit(task, settings)
    if limit is not None and now - started > limit + RUNNER_HEADSTART:
        return Watch(stop=("timeout", f"timed out after {limit:g} s (wall clock)"))
    last = max(attempt.last_event_at or started, last_activity or 0.0)
    idle = now - last
    if idle <= settings.stall_seconds:
        return Watch()
    stalled = f"no event for {idle:.0f} s" if task.state == TaskState.RUNNING else None
    stop = ("stall", f"stalled: no event for {idle:.0f} s") if settings.stall_kill else None
    return Watch(stop=stop, stalled=stalled)
