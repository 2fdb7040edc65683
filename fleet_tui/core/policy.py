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
from typing import Any

from fleet_tui.core import providers
from fleet_tui.core.states import (
    FINISHED_STATES,
    LAND_ACTIVE,
    STATES,
    VERBS,
    Action,
    LandState,
    Phase,
    StopReason,
    TaskState,
    Verdict,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from datetime import tzinfo
    from typing import Protocol

    from fleet_tui.core.model import Attempt, EndpointState, Task

    class EndpointLimits(Protocol):
        """What policy reads of one endpoint (settings.endpoints.Endpoint has it)."""

        @property
        def max_requests(self) -> int | None: ...

    class Settings(Protocol):
        """What policy reads of the settings (settings.config.Settings has it), declared
        here so that core, the bottom layer, imports nothing of the layers above it."""

        @property
        def base_url(self) -> str: ...
        @property
        def model(self) -> str: ...
        @property
        def small_model(self) -> str: ...
        @property
        def key_sources(self) -> tuple[str, ...]: ...
        @property
        def keyring_service(self) -> str: ...
        @property
        def keyring_key(self) -> str: ...
        @property
        def max_workers(self) -> int: ...
        @property
        def max_attempts(self) -> int: ...
        @property
        def backoff_base(self) -> float: ...
        @property
        def backoff_cap(self) -> float: ...
        @property
        def fallback_after(self) -> int: ...
        @property
        def quota_cooldown(self) -> float: ...
        @property
        def park_jitter(self) -> float: ...
        @property
        def resume_stagger(self) -> float: ...
        @property
        def cap_hold(self) -> float: ...
        @property
        def timeout(self) -> float: ...
        @property
        def stall_seconds(self) -> float: ...
        @property
        def stall_kill(self) -> bool: ...
        @property
        def kill_grace(self) -> float: ...
        @property
        def queue_fix_attempts(self) -> int: ...
        @property
        def gateway(self) -> bool: ...
        def endpoint_of(self, name: str | None) -> EndpointLimits: ...

    class Random(Protocol):
        """What policy asks of a random source (random.Random has it)."""

        def uniform(self, a: float, b: float) -> float: ...


__all__ = ["AUTO_RESUME_PROMPT", "BUDGET_HOLD", "COUNTED", "NOTE_PREFIXES", "NO_CHANGE",
           "RUNNER_HEADSTART", "START_BOUND", "STOPS", "TRANSIENT", "UNCOUNTED", "Effect", "Gate",
           "LandNext", "Next", "Watch", "after_attempt", "after_fix", "allowed_actions",
           "apply_effect", "auth_hint", "automatic_attempt", "backoff_delay", "budget_held",
           "cooldown_until", "effective_cap", "endpoint_note", "gate", "held_reason", "in_queue",
           "land_failure", "model_for", "next_to_land", "no_change", "park_text", "queued_note",
           "refusal", "session_progress", "settings_key", "start_window", "state_text",
           "stop_for_endpoint", "streak", "time_limit", "verdict_text", "watchdog", "why_not",
           "why_not_resume"]

# verdicts of the moment (the endpoint's, not the task's): tried again after a wait
TRANSIENT = frozenset({Verdict.OVERLOAD, Verdict.QUOTA, Verdict.WINDOW, Verdict.CONCURRENCY,
                       Verdict.MODEL_OVERLOAD, Verdict.UNREACHABLE, Verdict.BUDGET,
                       Verdict.KEY})
# the ones whose attempts count toward max_attempts; a window the endpoint named the reset
# of, and a requeue for fewer workers at once, do not (and do not break a streak either)
COUNTED = frozenset({Verdict.OVERLOAD, Verdict.QUOTA, Verdict.MODEL_OVERLOAD,
                     Verdict.UNREACHABLE})
UNCOUNTED = frozenset({Verdict.WINDOW, Verdict.CONCURRENCY, Verdict.BUDGET, Verdict.KEY})
OVERLOADS = frozenset({Verdict.OVERLOAD, Verdict.MODEL_OVERLOAD})
# verdicts that stop the whole endpoint until the user acts (the account, the key)
STOPS = frozenset({Verdict.ACCOUNT, Verdict.AUTH})
# what a session interrupted by the endpoint is told when it is resumed automatically
AUTO_RESUME_PROMPT = ("Your previous turn was cut off by an API error. Continue the task "
                      "where you left off, then summarise what you did.")
# how the queued tasks of a parked or held endpoint are told why they do not start
NOTE_PREFIXES = ("waits: ", "held: ")
# the held_settings of an endpoint held for its day's budget: no settings'
# fingerprint lifts it; the scheduler does, at the next local day or with a higher budget
BUDGET_HOLD = "budget:"
_BUDGET_FIGURE = "spent $"
# the runner enforces the timeout and the kill grace itself; the engine's backstop waits
# this much longer, so that it acts only for a runner that did not
RUNNER_HEADSTART = 1.0
BACKOFF_JITTER = (0.5, 1.0)  # the backoff is multiplied by a uniform draw from this range
# an attempt counts as starting (start_window) from its claim until its claude's init event,
# or for this long at most: a claude that never speaks (a hung start, a long setup) holds
# the endpoint's next starts back no longer than this. A claude starts in about 2 s alone on
# a quiet 2-core machine (8-16 s when 8 start together there); on one busy with others'
# work, 10 s even alone: then the starts overlap again, a wave every START_BOUND (bench 11)
START_BOUND = 5.0
# a task the gateway paused (its endpoint's day budget, a key it lost) is not started again
# sooner than this: an engine whose settings disagree with the gateway's (a budget from its
# own environment) would otherwise start it on every pass, to be paused at once again
PAUSE_RECHECK = 5.0


# --- what a task allows ----------------------------------------------------------------------


def why_not(task: Task, action: Action) -> str | None:
    """None when `task` allows `action` now, else why not (a phrase that completes
    "cannot <action> task X: ...")."""
    info = STATES.get(task.state)
    if info is None:
        return f"its state {task.state!r} is unknown"
    if info.phase is Phase.CLOSED:
        return f"it was {task.state} already"
    if task.row_error is not None and action not in _SAFE_WHEN_DAMAGED:
        # a bad column reads as its default: nothing may act on its worktree, branch or
        # session as if the row were sound; discarding it is the way out (and stopping its
        # worker, which a discard does first)
        return (f"its store row is damaged ({_row_damage(task.row_error)}); discard it "
                f"(`fleet-tui discard {task.id}`), or correct the row in the store")
    if action not in info.actions:
        if action is Action.SAY:
            if info.phase is Phase.FINISHED:
                return (f"its worker has finished (it is {task.state}); send a follow-up "
                        f"instead (`fleet-tui follow-up {task.id} TEXT`)")
            if task.state == TaskState.WAITING and task.attempt_count > 0:
                # an attempt ran and ended; the task waits to go on (a window's reset, a
                # backoff): no worker reads messages now
                why = (task.message or "").strip() or f"verdict {task.verdict or '-'}"
                waits = ("for its endpoint's usage window to reset"
                         if task.verdict == Verdict.WINDOW else "to be tried again")
                return (f"its worker is not running: attempt {task.attempt_count} ended and "
                        f"the task waits {waits} ({why}); send the message once it runs "
                        "again")
            return f"its worker has not started yet (it is {task.state})"
        if action in (Action.MERGE, Action.RETRY, Action.FOLLOW_UP):
            return (f"it is {task.state}; wait for it to finish or kill it "
                    f"(`fleet-tui kill {task.id}`) first")
        if action is Action.KILL:
            return f"it is not running (it is {task.state})"
        return f"it is {task.state}"
    if action in _NEEDS_BASE_BRANCH and not task.base_branch:
        return (f"it was started from a commit, not a branch; merge its branch "
                f"{task.branch or 'fleet/' + task.id} by hand")
    if task.land_state in _BEING_LANDED and action is Action.FOLLOW_UP:
        return (f"the merge queue is landing it ({task.land_state}); wait a moment, or take "
                f"it out of the queue (`fleet-tui queue --remove {task.id}`)")
    if in_queue(task) and action in _NOT_WHILE_QUEUED:
        return (f"it is in the merge queue ({task.land_state}); take it out first "
                f"(`fleet-tui queue --remove {task.id}`)")
    if task.conflicts and action in _NOT_WHILE_CONFLICTED:
        shown = ", ".join(task.conflicts[:3]) + (" ..." if len(task.conflicts) > 3 else "")
        return (f"its update from {task.base_branch or 'its base'} stopped on conflicts "
                f"({shown}); resolve them (`fleet-tui update {task.id} --resolve worker` or "
                "`--resolve shell`) or abort the update (`--resolve abort`)")
    if action is Action.FOLLOW_UP and not task.session_id:
        return "it has no session to continue (its run never started one); retry it instead"
    if action in (Action.SHELL, Action.DIFF) and task.worktree is None:
        return "it has no worktree yet"
    return None


_SAFE_WHEN_DAMAGED = frozenset({Action.DISCARD, Action.KILL})


def _row_damage(row_error: str) -> str:
    """The damage a row_error names ("column turns holds 'abc'"), without its preamble
    and its advice (why_not gives its own)."""
    text = row_error.partition(" is unreadable: ")[2] or row_error
    return text.partition("; discard the task")[0]


_NEEDS_BASE_BRANCH = frozenset({Action.MERGE, Action.UPDATE, Action.QUEUE, Action.PICK})
# a task in the merge queue: its worktree and branch are the queue's
_NOT_WHILE_QUEUED = frozenset({Action.MERGE, Action.DISCARD, Action.RETRY, Action.UPDATE,
                               Action.QUEUE, Action.PICK, Action.PUSH})
# the queue works in its worktree right now
_BEING_LANDED = frozenset({LandState.UPDATING, LandState.TESTING, LandState.MERGING})
# an update stopped mid-merge: nothing lands or leaves before it is resolved or aborted
_NOT_WHILE_CONFLICTED = frozenset({Action.MERGE, Action.QUEUE, Action.PUSH, Action.PICK})


def no_change(task: Task) -> bool:
    """The task succeeded without changing anything (+0/-0 against its base): what every
    place that shows its verdict says beside it (the worker's words may say otherwise)."""
    return task.state == TaskState.SUCCEEDED and not task.added_lines \
        and not task.deleted_lines


NO_CHANGE = "no change"


def state_text(task: Task) -> str:
    """The task's state as the CLI and the panel's notifications show it: "succeeded" or
    "succeeded, no change"."""
    return f"{task.state}, {NO_CHANGE}" if no_change(task) else str(task.state)


def verdict_text(task: Task) -> str:
    """The task's verdict for a list: "ok", "ok, no change", "-" before it has one."""
    verdict = task.verdict or "-"
    return f"{verdict}, {NO_CHANGE}" if no_change(task) else verdict


def in_queue(task: Task) -> bool:
    """The task is in the merge queue (waiting, being landed, or back with its worker)."""
    return task.land_state in LAND_ACTIVE


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
    return f"cannot {VERBS[action]} task {task.id}: {why}"


# --- the next attempt ------------------------------------------------------------------------


def streak(attempts: Sequence[Attempt], verdicts: Iterable[str],
           skip: Iterable[str] = ()) -> int:
    """How many of the latest finished attempts in a row ended with one of `verdicts`
    (an attempt that has no verdict yet, the one about to run, is skipped, and so is one
    whose verdict is in `skip`: it neither counts nor breaks the streak)."""
    return _streak([a.verdict for a in attempts], frozenset(verdicts), frozenset(skip))


def _streak(verdicts: Sequence[str | None], wanted: frozenset[str],
            skip: frozenset[str] = frozenset()) -> int:
    count = 0
    for verdict in reversed(verdicts):
        if verdict is None or verdict in skip:
            continue
        if verdict not in wanted:
            break
        count += 1
    return count


def model_for(task: Task, attempts: Sequence[Attempt], settings: Settings) -> str:
    """The model of the next attempt: the task's tier (main, small or a model name), or
    the small model once `fallback_after` attempts in a row were overloaded, or at once
    after the provider said this model is overloaded (z.ai's 1312: "try another model")."""
    last = next((a.verdict for a in reversed(attempts) if a.verdict is not None), None)
    if last == Verdict.MODEL_OVERLOAD or \
            streak(attempts, OVERLOADS, UNCOUNTED) >= settings.fallback_after:
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


# --- resume, don't restart -------------------------------------------------------------------


def session_progress(task: Task, attempts: Sequence[Attempt]) -> bool:
    """The task's session has work in it worth keeping: an attempt in that session called
    a tool, got past its first turn, or finished (a run cut off at its very first request
    has nothing to resume: the CLI counts that request as one turn)."""
    if not task.session_id:
        return False
    return any(a.session_id == task.session_id
               and (a.last_tool is not None or a.turns >= 2 or a.verdict == Verdict.OK)
               for a in attempts)


def automatic_attempt(task: Task, attempts: Sequence[Attempt]) -> tuple[str, str]:
    """(kind, prompt) of the attempt the engine starts by itself after one the endpoint cut
    off (overload, quota, a window, fewer at once): "resume" with a short continuation in
    the same session, worktree and config dir when the session made progress; else
    "fresh" with the task's prompt."""
    last = next((a.verdict for a in reversed(attempts) if a.verdict is not None), None)
    if last in TRANSIENT and session_progress(task, attempts):
        return "resume", AUTO_RESUME_PROMPT
    return "fresh", task.prompt


# --- the endpoint's limits -------------------------------------------------------------------


def settings_key(settings: Settings) -> str:
    """A fingerprint of the settings an account or key problem was met with (never the key
    itself): a hold is lifted when the settings it was met with change."""
    import hashlib  # here: OpenSSL's load is a cost of each command's start otherwise

    parts = (settings.base_url, settings.model, settings.small_model,
             ",".join(settings.key_sources), settings.keyring_service, settings.keyring_key)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def effective_cap(state: EndpointState | None, settings: Settings) -> int:
    """How many tasks may run on the endpoint now: the configured cap, or the lower one a
    concurrency limit left."""
    if state is not None and state.cap is not None:
        return max(1, min(settings.max_workers, state.cap))
    return settings.max_workers


@dataclass(frozen=True, slots=True)
class Effect:
    """What a finished attempt does to its endpoint: park it until a window resets,
    hold it for an account problem, lower its cap, or (a success) let the cap creep up."""

    kind: str  # "park" | "hold" | "cap" | "ok"
    until: float | None = None  # park: no request before this
    reason: str = ""  # park: "5-hour window, code 1308"; hold: the provider's sentence
    message: str = ""  # park: the refusal in the provider's words (it names the reset)
    cap: int | None = None  # cap: the new effective cap
    task: str | None = None  # hold: the task that met it
    settings: str | None = None  # hold: settings_key() when it was met


def apply_effect(state: EndpointState, effect: Effect, settings: Settings,
                 now: float) -> dict[str, Any] | None:
    """The endpoint fields `effect` sets on `state` (as the store has it now, inside its
    transaction: two tasks that meet the same window at once park it once, the later
    reset winning), or None for no change."""
    if effect.kind == "park" and effect.until is not None:
        parked = state.parked_until is not None and state.parked_until > now
        until = max(effect.until, state.parked_until or 0.0) if parked else effect.until
        out: dict[str, Any] = {"parked_until": until, "park_reason": effect.reason,
                               "park_message": effect.message or None, "next_start": None}
        if not parked:
            out.update(event="park", event_at=now)
        return out
    if effect.kind == "hold":
        if state.held is not None:
            # held already: the task named is the first that met it (the others that ran
            # beside it met the same stop)
            return None
        return {"held": effect.reason, "held_task": effect.task,
                "held_settings": effect.settings, "event": "hold", "event_at": now}
    if effect.kind == "cap" and effect.cap is not None:
        current = effective_cap(state, settings)
        if effect.cap >= current:
            return None
        return {"cap": effect.cap, "cap_reason": effect.reason, "cap_changed_at": now,
                "event": "cap", "event_at": now}
    if effect.kind == "ok" and state.cap is not None:
        if state.cap_changed_at is not None and now - state.cap_changed_at < settings.cap_hold:
            return None
        raised = state.cap + 1
        if raised >= settings.max_workers:
            return {"cap": None, "cap_reason": None, "cap_changed_at": now}
        return {"cap": raised, "cap_changed_at": now}
    return None


@dataclass(frozen=True, slots=True)
class Gate:
    """Whether the scheduler may start a task on an endpoint now: under `cap` (None: start
    nothing, for `why`), with the endpoint fields to set now (`fields`: a park that is
    over, a hold lifted by new settings) and once a task is claimed (`on_claim`: the next
    step of the staggered resume after a park)."""

    cap: int | None
    why: str | None = None
    fields: dict[str, Any] | None = None
    on_claim: dict[str, Any] | None = None
    # after a park: the fields to set when nothing is left to start (the resume is over),
    # and whether the parked sessions go before the tasks queued meanwhile
    on_idle: dict[str, Any] | None = None
    parked_first: bool = False

    def as_tuple(self) -> tuple[int | None, dict[str, Any] | None, dict[str, Any] | None,
                                dict[str, Any] | None, bool]:
        """What store.claim_gated's `decide` returns."""
        return self.cap, self.fields, self.on_claim, self.on_idle, self.parked_first


def park_text(until: float, reason: str | None, now: float,
              tz: tzinfo | None = None) -> str:
    """"parked until 14:05 (5-hour window, code 1308), resumes then"."""
    what = f" ({reason})" if reason else ""
    return f"parked until {providers.clock_text(until, now, tz)}{what}, resumes then"


def gate(state: EndpointState | None, settings: Settings, now: float, parked: int, *,
         settings_now: str | None = None, tz: tzinfo | None = None) -> Gate:
    """The endpoint's gate for the scheduling pass. `parked`: how many of its tasks wait
    with verdict window; `settings_now`: settings_key() of the engine asking.

    Held (an account or key problem): closed until the user retries a task or the
    settings change; held for the day's budget: closed until the scheduler lifts it (the
    next local day, a higher budget). Parked: closed until the window's reset (plus its
    jitter); then one task starts per `resume_stagger`, the parked sessions first and then
    the tasks queued meanwhile, every engine sharing the store counting the same claims
    (the endpoint row's `next_start`); the park is over once nothing is left to start.
    Otherwise open, under the effective cap."""
    cap = effective_cap(state, settings)
    if state is None:
        return Gate(cap)
    fields: dict[str, Any] = {}
    if state.held is not None and budget_held(state):
        return Gate(None, why=f"held: {state.held}")
    if state.held is not None:
        if settings_now is not None and state.held_settings is not None \
                and state.held_settings != settings_now:
            fields.update(held=None, held_task=None, held_settings=None)
        else:
            return Gate(None, why=f"held: {state.held}")
    if state.parked_until is not None:
        if now < state.parked_until:
            return Gate(None, why=park_text(state.parked_until, state.park_reason, now, tz),
                        fields=fields or None)
        if state.next_start is not None and now < state.next_start:
            return Gate(None, why="resuming the parked sessions one at a time" if parked
                        else "starting the tasks queued during the park one at a time",
                        fields=fields or None)
        over = {"parked_until": None, "park_reason": None, "park_message": None,
                "next_start": None}
        return Gate(cap, fields=fields or None,
                    on_claim={"next_start": now + settings.resume_stagger},
                    on_idle=over, parked_first=parked > 0)
    return Gate(cap, fields=fields or None)


def start_window(settings: Settings, endpoint: str) -> int | None:
    """How many of the endpoint's attempts may be starting at once (claimed, their claude
    not yet printing its init event; START_BOUND at most), or None: no such limit.

    With its workers going through the gateway's request slots, its `max_requests`: its
    first that many start at once, each further one as one of the starters has begun (its
    init event comes just before its first request). More claudes starting together only
    share the machine's cores and become ready late together while the slots idle; started
    in step with the slots, the first ones' turns use them while the next ones start (bench
    11). A worker cap at or under the slots never waits for this."""
    if not settings.gateway:
        return None
    return settings.endpoint_of(endpoint).max_requests or None


def stop_for_endpoint(state: EndpointState | None, now: float) -> str | None:
    """The words to stop a running attempt with, when it retries a 429 its endpoint is
    parked or held for (the CLI retries a 429 by itself, up to CLAUDE_CODE_MAX_RETRIES
    times, before the engine hears of it: each retry is a request into a closed window),
    or None to let it run."""
    if state is None:
        return None
    if state.held is not None and not budget_held(state):  # a budget lets runs finish
        return state.held
    if state.parked_until is not None and state.parked_until > now and state.park_message:
        return state.park_message
    return None


def endpoint_note(state: EndpointState | None, settings: Settings, now: float,
                  tz: tzinfo | None = None) -> str | None:
    """What a person should know of an endpoint now (the status line, `fleet-tui ls` and
    `show`), or None: held, parked, resuming, its cap lowered."""
    if state is None:
        return None
    parts: list[str] = []
    if state.held is not None:
        who = f" (met by task {state.held_task}: `fleet-tui retry {state.held_task}` once " \
              "fixed, or change the settings)" if state.held_task else ""
        parts.append(f"held: {state.held}{who}")
    if state.parked_until is not None:
        if now < state.parked_until:
            parts.append(park_text(state.parked_until, state.park_reason, now, tz))
        else:
            parts.append("resuming the parked sessions one at a time")
    cap = effective_cap(state, settings)
    if cap < settings.max_workers:
        parts.append(f"cap {cap}/{settings.max_workers}"
                     + (f" ({state.cap_reason})" if state.cap_reason else ""))
    return "; ".join(parts) or None


def budget_held(state: EndpointState) -> bool:
    """Is the endpoint held for its day's budget (not for an account or key problem)?"""
    return state.held_settings is not None and state.held_settings.startswith(BUDGET_HOLD)


def held_reason(held: str | None) -> str | None:
    """A hold's reason in a few words ("account in arrears, code 1113", "budget met: $5.02
    of $5.00 today"), for one line."""
    if held is None:
        return None
    if _BUDGET_FIGURE in held and " budget today" in held:
        spent, _, rest = held.partition(_BUDGET_FIGURE)[2].partition(" of its ")
        return f"budget met: ${spent} of {rest.partition(' budget')[0]} today"
    signal = providers.identify(held)
    if signal is not None:
        return signal.describe()
    return held if len(held) <= 60 else held[:59] + "…"


def queued_note(why: str | None) -> str | None:
    """The message the queued tasks of a closed endpoint carry (`why`: the gate's)."""
    if why is None:
        return None
    if why.startswith(NOTE_PREFIXES[1]):
        return why
    return f"{NOTE_PREFIXES[0]}the endpoint is {why}"


# --- what a finished attempt leads to --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Next:
    """What a finished attempt leads to: the task's new state and message, for a waiting
    task when it may start again, the verdict it is recorded with when policy reads it
    otherwise (a window whose reset cannot be read is a quota cooldown), and what it does
    to the endpoint."""

    state: TaskState
    message: str
    not_before: float | None = None
    verdict: str | None = None
    effect: Effect | None = None

    @property
    def finished(self) -> bool:
        """The task is done for now (not waiting to be tried again)."""
        return self.state != TaskState.WAITING


def _quota_wait(quotas: int, settings: Settings) -> float:
    """The quota cooldown after the `quotas`-th in a row: `quota_cooldown`, doubling, at
    most the larger of it and `backoff_cap`."""
    exponent = min(max(0, quotas - 1), 64)
    return float(min(max(settings.quota_cooldown, settings.backoff_cap),
                     settings.quota_cooldown * 2 ** exponent))


def after_attempt(task: Task, attempts: Sequence[Attempt], verdict: str, message: str,
                  settings: Settings, now: float, rng: Random, *,
                  endpoint: EndpointState | None = None, active: int = 1,
                  tz: tzinfo | None = None) -> Next:
    """The task's next state once the attempt it is on ended with `verdict`. `attempts`:
    all of the task's attempts, the one that just ended included (with its verdict);
    `endpoint`: its endpoint's state; `active`: how many of the endpoint's tasks were
    running (this one included).

    ok: succeeded (and a lowered cap may creep up). killed: killed. window: waiting until
    the reset the provider named (plus jitter), every task of the endpoint with it, not
    counted as an attempt; a reset that cannot be read is a quota cooldown, said so.
    concurrency (and a rate limit while several ran): the cap is lowered and the task
    waits a moment, not counted; at a cap of 1 it is a quota cooldown. overload, model
    overload, quota and unreachable (no connection at all: the endpoint's or the
    gateway's machine away), fewer than `max_attempts` counted in a row: waiting (overload:
    jittered exponential backoff, the small model after `fallback_after` or at once for a
    model overload; quota: every task of the endpoint waits the cooldown, doubling); more:
    failed, "gave up". account, and a key the endpoint refused: failed with what to do,
    and the endpoint is held. Anything else: failed. Where the endpoint asked for a wait
    (retry-after), no wait is shorter."""
    verdicts: list[str | None] = [a.verdict for a in attempts]
    if verdicts:
        verdicts[-1] = verdict
    asked = providers.retry_after(message) or 0.0
    if verdict == Verdict.OK:
        return Next(TaskState.SUCCEEDED, message, effect=Effect("ok"))
    if verdict == Verdict.KILLED:
        return Next(TaskState.KILLED, message)
    if verdict in (Verdict.BUDGET, Verdict.KEY):
        # the endpoint's hold starts it again once lifted; a key: the next engine that can
        # start it (one with the endpoint's key_env variable: scheduling's cannot_start)
        resumes = " in its session" if session_progress(task, attempts) else ""
        what = "the budget" if verdict == Verdict.BUDGET else "a fleet-tui with its key"
        return Next(TaskState.WAITING, f"{message} — waits for {what}, then resumes"
                    f"{resumes}", now + PAUSE_RECHECK)
    # the refusal's row: read only here, past the ends that need none (a success reads no
    # provider's pattern, each compiled at its first use)
    signal = providers.identify(message)
    override: str | None = None
    if verdict == Verdict.WINDOW:
        if signal is not None:
            reading = providers.read_reset(signal.reset, signal.window, now,
                                           zones=signal.code.zones, local=tz)
        else:
            reading = providers.Reading(None, why="it names no reset time")
        if reading.at is not None and signal is not None:
            until = max(reading.at, now) + settings.park_jitter * rng.uniform(0.5, 1.0)
            what = signal.describe()
            resumes = " in its session" if session_progress(task, attempts) else ""
            return Next(TaskState.WAITING,
                        park_text(until, what, now, tz) + resumes, until,
                        effect=Effect("park", until=until, reason=what, message=message))
        message = f"{message}; its reset time could not be used ({reading.why})"
        verdict = override = Verdict.QUOTA
        verdicts[-1] = verdict
    if verdict == Verdict.QUOTA and active > 1 and signal is not None \
            and signal.kind is providers.Kind.RATE:
        verdict = override = Verdict.CONCURRENCY  # a rate limit while several ran
        verdicts[-1] = verdict
    if verdict == Verdict.CONCURRENCY:
        cap = effective_cap(endpoint, settings)
        if cap > 1:
            lower = max(1, min(cap, active) - 1)
            delay = max(asked, backoff_delay(1, settings, rng))
            reason = signal.describe() if signal is not None else "too many at once"
            return Next(TaskState.WAITING,
                        f"{message} — fewer at once on {task.endpoint}: cap {lower}/"
                        f"{settings.max_workers}; retried in {delay:.1f} s, not counted "
                        "as an attempt", now + delay, verdict=override,
                        effect=Effect("cap", cap=lower, reason=reason))
        verdict = override = Verdict.QUOTA  # one at a time already: a quota cooldown
        verdicts[-1] = verdict
    if verdict in COUNTED:
        return _counted_next(task, attempts, verdicts, verdict, message, settings, now, rng,
                             asked=asked, override=override)
    if verdict in STOPS:
        return _stopped_next(task, verdict, message, signal, settings)
    return Next(TaskState.FAILED, message)


def _counted_next(task: Task, attempts: Sequence[Attempt], verdicts: Sequence[str | None],
                  verdict: str, message: str, settings: Settings, now: float, rng: Random,
                  *, asked: float, override: str | None) -> Next:
    """after_attempt for a verdict that counts as an attempt (overload, model overload,
    quota): failed after `max_attempts` of them in a row, else waiting (overload: the
    backoff, maybe on the small model; quota: the endpoint's cooldown, doubling)."""
    in_a_row = _streak(verdicts, COUNTED, UNCOUNTED)
    if in_a_row >= settings.max_attempts:
        return Next(TaskState.FAILED, f"{message} — gave up after {in_a_row} attempts",
                    verdict=override)
    resumes = " (resumes its session)" if session_progress(task, attempts) else ""
    if verdict == Verdict.UNREACHABLE:  # the same backoff as an overload, the same model
        delay = backoff_delay(_streak(verdicts, frozenset({verdict}), UNCOUNTED), settings,
                              rng)
        return Next(TaskState.WAITING,
                    f"{message} — retry {in_a_row + 1}/{settings.max_attempts} in "
                    f"{delay:.1f} s" + resumes, now + delay, verdict=override)
    if verdict in OVERLOADS:
        overloads = _streak(verdicts, OVERLOADS, UNCOUNTED)
        delay = max(asked, backoff_delay(overloads, settings, rng))
        small = settings.small_model if (overloads >= settings.fallback_after
                                         or verdict == Verdict.MODEL_OVERLOAD) else None
        return Next(TaskState.WAITING,
                    f"{message} — retry {in_a_row + 1}/{settings.max_attempts} in "
                    f"{delay:.1f} s" + (f" on the small model {small}" if small else "")
                    + resumes, now + delay, verdict=override)
    quotas = _streak(verdicts, frozenset({Verdict.QUOTA}), UNCOUNTED)
    wait = max(asked, _quota_wait(quotas, settings))
    return Next(TaskState.WAITING,
                f"{message} — every task on {task.endpoint} waits {wait:g} s (quota "
                f"cooldown{f' {quotas} in a row' if quotas > 1 else ''}), then retries"
                + resumes, now + wait, verdict=override)


def _stopped_next(task: Task, verdict: str, message: str, signal: providers.Signal | None,
                  settings: Settings) -> Next:
    """after_attempt for a verdict that no retry can mend (account, auth, ...): failed,
    saying what to do; the endpoint is held when the account or the key is the cause."""
    said_by_endpoint = signal is not None and signal.kind in (providers.Kind.ACCOUNT,
                                                               providers.Kind.AUTH)
    text = auth_hint(message, task.endpoint) if verdict == Verdict.AUTH else message
    if verdict == Verdict.ACCOUNT or said_by_endpoint:
        return Next(TaskState.FAILED, text, effect=Effect(
            "hold", reason=message, task=task.id, settings=settings_key(settings)))
    return Next(TaskState.FAILED, text)


# --- the watchdogs ---------------------------------------------------------------------------


def time_limit(task: Task, settings: Settings) -> float | None:
    """The task's wall-clock limit in seconds (its own, else the setting), None for none."""
    limit = task.timeout if task.timeout is not None else settings.timeout
    return float(limit) if limit and limit > 0 else None


@dataclass(frozen=True, slots=True)
class Watch:
    """What the watchdogs ask for on one pass over a running attempt (all may be unset)."""

    hard_kill: bool = False  # a stop was asked kill_grace (+ headstart) ago: SIGKILL now
    stop: tuple[StopReason, str] | None = None  # (reason, message): ask the runner to stop
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
        return Watch(stop=(StopReason.TIMEOUT, f"timed out after {limit:g} s (wall clock)"))
    last = max(attempt.last_event_at or started, last_activity or 0.0)
    idle = now - last
    if idle <= settings.stall_seconds:
        return Watch()
    stalled = f"no event for {idle:.0f} s" if task.state == TaskState.RUNNING else None
    stop = ((StopReason.STALL, f"stalled: no event for {idle:.0f} s") if settings.stall_kill
            else None)
    return Watch(stop=stop, stalled=stalled)


# --- the merge queue -------------------------------------------------------------------------


def next_to_land(queue: Sequence[Task]) -> Task | None:
    """The task the merge queue lands next: the first in queue order (`land_order`) that
    is not back with its worker and whose worker is not running (a task someone followed
    up meanwhile keeps its place and is passed over until it has finished). One that was
    being landed when its queue runner died comes first: it holds the smallest order."""
    ready = [t for t in queue if t.land_state in LAND_ACTIVE
             and t.land_state != LandState.FIXING and t.state in FINISHED_STATES]
    ready.sort(key=lambda t: (t.land_order if t.land_order is not None else 0.0, t.id))
    return ready[0] if ready else None


@dataclass(frozen=True, slots=True)
class LandNext:
    """What the queue does with a task whose update conflicted or whose gate failed."""

    state: LandState  # FIXING (a follow-up goes to its worker) or STOPPED
    note: str


def land_failure(task: Task, settings: Settings, reason: str) -> LandNext:
    """A conflict or a red gate (`reason` says which, and where): back to the worker as a
    follow-up while it has had fewer than `queue_fix_attempts` of them (and has a session
    to follow up), else out of the queue with the reason."""
    if task.land_fixes < settings.queue_fix_attempts and task.session_id:
        return LandNext(LandState.FIXING,
                        f"{reason}; back with its worker "
                        f"(fix {task.land_fixes + 1} of {settings.queue_fix_attempts})")
    if not task.session_id:
        return LandNext(LandState.STOPPED, f"{reason}; stopped: no session to send a fix to")
    tried = _plural_fix(task.land_fixes)
    return LandNext(LandState.STOPPED, f"{reason}; stopped after {tried}")


def _plural_fix(n: int) -> str:
    return f"{n} fix attempt{'' if n == 1 else 's'}" if n else "no fix attempt allowed"


def after_fix(task: Task) -> LandNext | None:
    """A task back with its worker (FIXING): None while its follow-up has not ended; then
    WAITING (it rejoins the end of the queue) when the worker succeeded, else STOPPED."""
    if task.state not in FINISHED_STATES:
        return None
    if task.attempt_count < task.land_attempt:
        return None  # its follow-up is recorded but not started yet
    if task.state == TaskState.SUCCEEDED:
        return LandNext(LandState.WAITING, "fixed by its worker; back in the queue")
    detail = f": {task.message}" if task.message else ""
    return LandNext(LandState.STOPPED, f"the worker's fix ended {task.state}{detail}")
