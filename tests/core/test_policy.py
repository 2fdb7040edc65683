"""The engine's decisions as tables: no claude, no git, no disk, no clock.

Each rule of policy.py (and the verdicts the engine makes up itself, in outcome.py) is
checked here in milliseconds; tests/engine/test_fleet.py checks the same rules end to end with
the real claude. Their counterparts here:

- test_overload_backoff_then_small_model: model_for, backoff_delay, after_attempt (overload)
- test_overload_gives_up_after_max_attempts: after_attempt (give up)
- test_quota_cooldown_holds_every_task_of_the_endpoint: after_attempt (quota), cooldown_until
- test_auth_failure_fails_at_once_with_the_fix: after_attempt (auth), auth_hint
- test_no_key_fails_clearly: judge_attempt (the launcher's refusal)
- test_max_turns_and_timeout: watchdog (timeout), judge_attempt (a timed-out run)
- test_kill_queued_task_and_stall_detection: watchdog (stall, stall_kill), why_not (kill)
- test_dead_runner_without_exit_record_is_marked_crashed: judge_attempt, no_exit_record
- test_retry_refused_while_running_and_no_key_leak: refusal (retry, merge while running)
- test_resume_and_follow_up_continue_the_session: why_not_resume, why_not (follow-up)

and tests/engine/test_limits.py (the endpoint's limits):

- test_a_window_parks_the_endpoint_until_its_reset_and_the_sessions_resume:
  after_attempt (window), apply_effect (park), gate (parked, the staggered resume),
  automatic_attempt (resume)
- test_an_account_error_fails_one_task_and_holds_the_rest_once: after_attempt (account),
  apply_effect (hold), gate (held, lifted), queued_note, endpoint_note
- test_an_overload_mid_task_resumes_the_session: automatic_attempt, session_progress
- test_too_many_at_once_lowers_the_cap_and_charges_nothing: after_attempt (concurrency),
  apply_effect (cap), effective_cap
- test_a_429_waits_at_least_its_retry_after: after_attempt (retry-after)
"""

from __future__ import annotations

import dataclasses
import random
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest

from fleet_tui.core import outcome, policy, providers
from fleet_tui.core.states import Action, TaskState, Verdict
from fleet_tui.settings.config import Settings
from fleet_tui.store.db import Attempt, EndpointState, Task

NOW = 1_000_000.0
SETTINGS = Settings(model="big", small_model="small", max_attempts=4, backoff_base=5.0,
                    backoff_cap=300.0, fallback_after=2, quota_cooldown=60.0, timeout=3600.0,
                    stall_seconds=300.0, stall_kill=False, kill_grace=5.0)
EP = "https://ep.example"


class Draw:
    """Stand-in for random.Random in tables that need an exact jitter: `uniform` returns
    the point `at` (0: low end, 1: high end) of the range it is asked for."""

    def __init__(self, at: float) -> None:
        self.at = at

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self.at


def task(state: TaskState = TaskState.RUNNING, **fields: Any) -> Task:
    base: dict[str, Any] = {"id": "abc123", "prompt": "p", "repo": Path("/r"),
                            "endpoint": EP, "base_branch": "main", "branch": "fleet/abc123",
                            "worktree": Path("/r/.fleet-work/abc123"), "session_id": "s-1"}
    base.update(fields)
    return Task(state=state, **base)


def runs(*verdicts: str | None, **fields: Any) -> list[Attempt]:
    """Attempts 1..n of the task with these verdicts (None: not finished yet)."""
    return [Attempt(id=n, task_id="abc123", n=n, verdict=v, **fields)
            for n, v in enumerate(verdicts, start=1)]


def settings(**changes: Any) -> Settings:
    return dataclasses.replace(SETTINGS, **changes)


# --- the model of the next attempt -------------------------------------------------------------


@pytest.mark.parametrize(("tier", "verdicts", "fallback_after", "model"), [
    ("main", (), 2, "big"),
    ("small", (), 2, "small"),
    ("glm-x", (), 2, "glm-x"),
    ("", (), 2, "big"),  # a row with no tier: main
    ("main", ("overload",), 2, "big"),
    ("main", ("overload", "overload"), 2, "small"),  # the fallback
    ("glm-x", ("overload", "overload"), 2, "small"),
    ("main", ("overload", "overload", None), 2, "small"),  # the pending attempt is skipped
    ("main", ("overload", "ok", "overload"), 2, "big"),  # only the overloads in a row
    ("main", ("overload", "quota"), 2, "big"),  # a quota breaks the overload streak
    ("main", ("overload",), 1, "small"),
    ("main", (), 0, "small"),  # fallback_after 0: always the small model
])
def test_model_for(tier: str, verdicts: tuple[str | None, ...], fallback_after: int,
                   model: str) -> None:
    got = policy.model_for(task(model=tier), runs(*verdicts),
                           settings(fallback_after=fallback_after))
    assert got == model


@pytest.mark.parametrize(("verdicts", "wanted", "count"), [
    ((), policy.TRANSIENT, 0),
    (("overload", "quota", "overload"), policy.TRANSIENT, 3),
    (("ok", "overload", None), policy.TRANSIENT, 1),
    (("overload", "crashed"), policy.TRANSIENT, 0),
    (("quota", "overload", "overload"), (Verdict.OVERLOAD,), 2),
])
def test_streak(verdicts: tuple[str | None, ...], wanted: Any, count: int) -> None:
    assert policy.streak(runs(*verdicts), wanted) == count


# --- backoff, cooldown ---------------------------------------------------------------------------


@pytest.mark.parametrize(("overloads", "low", "high"), [
    (0, 2.5, 5.0), (1, 2.5, 5.0), (2, 5.0, 10.0), (3, 10.0, 20.0), (7, 150.0, 300.0),
    (8, 150.0, 300.0),  # capped
    (10 ** 6, 150.0, 300.0),  # a huge count neither overflows nor passes the cap
])
def test_backoff_is_exponential_capped_and_jittered(overloads: int, low: float,
                                                    high: float) -> None:
    assert policy.backoff_delay(overloads, SETTINGS, Draw(0.0)) == low
    assert policy.backoff_delay(overloads, SETTINGS, Draw(1.0)) == high
    rng = random.Random(overloads)
    draws = [policy.backoff_delay(overloads, SETTINGS, rng) for _ in range(200)]
    assert all(low <= d <= high for d in draws) and len(set(draws)) > 100


def test_cooldown_is_the_latest_quota_wait_of_the_endpoint() -> None:
    tasks = [
        task(TaskState.WAITING, id="a", verdict="quota", not_before=NOW + 30),
        task(TaskState.WAITING, id="b", verdict="quota", not_before=NOW + 50),
        task(TaskState.WAITING, id="c", verdict="overload", not_before=NOW + 90),  # backoff
        task(TaskState.WAITING, id="d", verdict="quota", not_before=NOW - 1),  # passed
        task(TaskState.WAITING, id="e", verdict="quota", not_before=NOW + 99,
             endpoint="https://other.example"),
        task(TaskState.FAILED, id="f", verdict="quota", not_before=NOW + 99),  # gave up
    ]
    assert policy.cooldown_until(EP, tasks, NOW) == NOW + 50
    assert policy.cooldown_until("https://other.example", tasks, NOW) == NOW + 99
    assert policy.cooldown_until(EP, tasks, NOW + 50) is None
    assert policy.cooldown_until("https://nobody.example", tasks, NOW) is None


# --- what a finished attempt leads to ------------------------------------------------------------


@pytest.mark.parametrize(("verdicts", "state", "in_message", "wait"), [
    (("ok",), TaskState.SUCCEEDED, None, None),
    (("killed",), TaskState.KILLED, None, None),
    (("crashed",), TaskState.FAILED, None, None),
    (("max_turns",), TaskState.FAILED, None, None),
    (("overload",), TaskState.WAITING, "retry 2/4 in 5.0 s", 5.0),
    (("overload", "overload"), TaskState.WAITING, "retry 3/4 in 10.0 s on the small model "
                                                  "small", 10.0),
    (("quota", "overload"), TaskState.WAITING, "retry 3/4 in 5.0 s", 5.0),
    (("overload",) * 4, TaskState.FAILED, "gave up after 4 attempts", None),
    (("quota", "overload", "quota", "overload"), TaskState.FAILED, "gave up after 4",
     None),
    (("ok", "overload", "overload", "overload"), TaskState.WAITING, "retry 4/4", 20.0),
    (("quota",), TaskState.WAITING, f"every task on {EP} waits 60 s (quota cooldown)",
     60.0),
    (("quota",) * 4, TaskState.FAILED, "gave up after 4 attempts", None),
])
def test_after_attempt(verdicts: tuple[str, ...], state: TaskState, in_message: str | None,
                       wait: float | None) -> None:
    nxt = policy.after_attempt(task(), runs(*verdicts), verdicts[-1], "the run's message",
                               SETTINGS, NOW, Draw(1.0))
    assert nxt.state == state
    assert nxt.message.startswith("the run's message")
    if in_message is not None:
        assert in_message in nxt.message, nxt.message
    else:
        assert nxt.message == "the run's message"
    assert nxt.not_before == (None if wait is None else NOW + wait)
    assert nxt.finished == (state != TaskState.WAITING)


def test_max_attempts_one_gives_up_at_the_first_overload() -> None:
    nxt = policy.after_attempt(task(), runs("overload"), "overload", "busy",
                               settings(max_attempts=1), NOW, Draw(0.5))
    assert nxt.state == TaskState.FAILED and nxt.message == "busy — gave up after 1 attempts"


@pytest.mark.parametrize(("message", "hinted"), [
    ("the endpoint rejected the key (401): check it", False),  # names the key already
    ("no API key found in ANTHROPIC_AUTH_TOKEN or the keyring", False),
    ("Invalid bearer token", True),
])
def test_an_auth_failure_says_how_to_fix_it(message: str, hinted: bool) -> None:
    nxt = policy.after_attempt(task(), runs("auth"), "auth", message, SETTINGS, NOW,
                               Draw(0.5))
    assert nxt.state == TaskState.FAILED and nxt.not_before is None
    if hinted:
        assert nxt.message == (f"{message} — check the API key for {EP}: `fleet-tui key "
                               "set`, or ANTHROPIC_AUTH_TOKEN")
    else:
        assert nxt.message == message
    assert policy.auth_hint(message, EP) == nxt.message


# --- the watchdogs -------------------------------------------------------------------------------


@pytest.mark.parametrize(("task_timeout", "setting", "limit"), [
    (None, 3600.0, 3600.0), (90.0, 3600.0, 90.0), (0.0, 3600.0, None), (None, 0.0, None),
    (None, -1.0, None),
])
def test_time_limit(task_timeout: float | None, setting: float, limit: float | None) -> None:
    assert policy.time_limit(task(timeout=task_timeout), settings(timeout=setting)) == limit


def attempt(started: float, last_event: float | None = None) -> Attempt:
    return Attempt(id=1, task_id="abc123", n=1, started_at=started, last_event_at=last_event)


@pytest.mark.parametrize(("case", "watch"), [
    # a stop was asked: only the SIGKILL after kill_grace + the runner's head start
    ({"asked": NOW - 5.9}, policy.Watch()),
    ({"asked": NOW - 6.0}, policy.Watch(hard_kill=True)),
    ({"asked": NOW - 6.0, "started": NOW - 99_999}, policy.Watch(hard_kill=True)),
    # the wall clock: limit + head start
    ({"started": NOW - 3601.0, "last": NOW}, policy.Watch()),
    ({"started": NOW - 3601.5},
     policy.Watch(stop=("timeout", "timed out after 3600 s (wall clock)"))),
    ({"started": NOW - 100, "timeout": 90.0},
     policy.Watch(stop=("timeout", "timed out after 90 s (wall clock)"))),
    ({"started": NOW - 99_999, "timeout": 0.0, "last": NOW}, policy.Watch()),  # no limit
    # stalls: since the last event (stored or just read), else the start
    ({"started": NOW - 301}, policy.Watch(stalled="no event for 301 s")),
    ({"started": NOW - 301, "last_event": NOW - 10}, policy.Watch()),
    ({"started": NOW - 301, "last": NOW - 10}, policy.Watch()),
    ({"started": NOW - 301, "stall_kill": True},
     policy.Watch(stop=("stall", "stalled: no event for 301 s"),
                  stalled="no event for 301 s")),
    ({"started": NOW - 301, "stall_kill": True, "state": TaskState.STALLED},
     policy.Watch(stop=("stall", "stalled: no event for 301 s"))),  # marked already
    ({"started": NOW - 301, "state": TaskState.STALLED}, policy.Watch()),
])
def test_watchdog(case: dict[str, Any], watch: policy.Watch) -> None:
    running = task(case.get("state", TaskState.RUNNING), timeout=case.get("timeout"))
    got = policy.watchdog(running, attempt(case.get("started", NOW), case.get("last_event")),
                          settings(stall_kill=case.get("stall_kill", False)), NOW,
                          stop_asked_at=case.get("asked"), last_activity=case.get("last"))
    assert got == watch


# --- what a task allows, as the engine and the CLI say it ----------------------------------------


@pytest.mark.parametrize(("state", "fields", "action", "sentence"), [
    (TaskState.RUNNING, {}, Action.RETRY, "cannot retry task abc123: it is running; wait for "
     "it to finish or kill it (`fleet-tui kill abc123`) first"),
    (TaskState.RUNNING, {}, Action.MERGE, "cannot merge task abc123: it is running; wait"),
    (TaskState.QUEUED, {}, Action.FOLLOW_UP, "cannot follow up task abc123: it is queued"),
    (TaskState.MERGED, {}, Action.MERGE, "cannot merge task abc123: it was merged already"),
    (TaskState.DISCARDED, {}, Action.DISCARD,
     "cannot discard task abc123: it was discarded already"),
    (TaskState.KILLED, {}, Action.KILL,
     "cannot kill task abc123: it is not running (it is killed)"),
    (TaskState.SUCCEEDED, {"session_id": None}, Action.FOLLOW_UP,
     "cannot follow up task abc123: it has no session to continue (its run never started "
     "one); retry it instead"),
    (TaskState.SUCCEEDED, {"base_branch": None}, Action.MERGE,
     "cannot merge task abc123: it was started from a commit, not a branch; merge its "
     "branch fleet/abc123 by hand"),
])
def test_refusals_read_as_one_sentence(state: TaskState, fields: dict[str, Any],
                                       action: Action, sentence: str) -> None:
    got = policy.refusal(task(state, **fields), action)
    assert got is not None and got.startswith(sentence), got


@pytest.mark.parametrize("state", [TaskState.QUEUED, TaskState.WAITING, TaskState.RUNNING,
                                   TaskState.STALLED, TaskState.FAILED])
def test_discard_is_allowed_until_closed_and_kill_while_pending_or_running(
        state: TaskState) -> None:
    """The panel refused to discard a running task that the engine discards (killing it
    first): both ask policy now, and the answer is yes."""
    assert policy.refusal(task(state), Action.DISCARD) is None
    killable = state in (TaskState.QUEUED, TaskState.WAITING, TaskState.RUNNING,
                         TaskState.STALLED)
    assert (policy.refusal(task(state), Action.KILL) is None) == killable


@pytest.mark.parametrize(("fields", "state", "why"), [
    ({}, TaskState.SUCCEEDED, None),
    ({"session_id": None}, TaskState.FAILED, "no session to resume"),
    ({}, TaskState.RUNNING, "kill it"),
    ({"session_id": None}, TaskState.RUNNING, "kill it"),  # the state's reason comes first
])
def test_why_not_resume(fields: dict[str, Any], state: TaskState, why: str | None) -> None:
    got = policy.why_not_resume(task(state, **fields))
    assert got is None if why is None else (got is not None and why in got)


# --- verdicts the engine gives itself (outcome.py) -----------------------------------------------

RESULT_OK = {"type": "result", "subtype": "success", "is_error": False, "result": "done",
             "num_turns": 2}
RESULT_529 = {"type": "result", "subtype": "success", "is_error": True,
              "api_error_status": 529, "result": "API Error: 529 overloaded"}


def judge(**given: Any) -> outcome.Ending:
    args: dict[str, Any] = {"exit_record": None, "exit_problem": None,
                            "exit_path": "/a/exit.json", "stop_reason": None,
                            "stop_message": None, "result": None, "stderr_tail": "",
                            "no_record": "the runner process died"}
    args.update(given)
    return outcome.judge_attempt(**args)


@pytest.mark.parametrize(("given", "verdict", "message"), [
    # the runner left its exit record
    ({"exit_record": {"exit_code": 0}, "result": RESULT_OK}, Verdict.OK, "finished in 2"),
    ({"exit_record": {"exit_code": 1}, "result": RESULT_529}, Verdict.OVERLOAD, "(529)"),
    ({"exit_record": {"exit_code": 5, "error": "no API key found; run fleet-tui key set"}},
     Verdict.AUTH, "no API key found"),
    ({"exit_record": {"exit_code": 5, "error": "claude not found on PATH"}},
     Verdict.CRASHED, "claude not found"),
    ({"exit_record": {"exit_code": None, "signal": 15}, "stop_reason": "kill",
      "result": RESULT_OK}, Verdict.KILLED, "killed on request"),
    ({"exit_record": {"exit_code": 0}, "stop_reason": "timeout", "result": RESULT_OK,
      "stop_message": "timed out after 90 s (wall clock)"},
     Verdict.TIMEOUT, "timed out after 90 s (wall clock)"),
    ({"exit_record": {"exit_code": 0}, "stop_reason": "error", "stop_message": "bad row"},
     Verdict.CRASHED, "bad row"),
    ({"exit_record": {"exit_code": 0}, "stop_reason": "error"}, Verdict.CRASHED,
     outcome.STOPPED_BY_ENGINE),
    # no exit record: a stop asked decides; else the result, else the reason there is none
    ({"stop_reason": "kill", "stop_message": outcome.KILLED_BY_USER}, Verdict.KILLED,
     outcome.KILLED_BY_USER),
    ({"stop_reason": "stall", "stop_message": "stalled: no event for 301 s"},
     Verdict.TIMEOUT, "stalled"),
    ({}, Verdict.CRASHED, "the runner process died"),
    ({"result": RESULT_OK}, Verdict.OK, "finished in 2 turns: done (the runner process died)"),
    ({"exit_problem": "it is not JSON"}, Verdict.CRASHED,
     "the exit record /a/exit.json is unreadable (it is not JSON) and the events hold no "
     "result"),
    ({"exit_problem": "it is not JSON", "result": RESULT_OK}, Verdict.OK,
     "the verdict comes from the events' result"),
])
def test_judge_attempt(given: dict[str, Any], verdict: Verdict, message: str) -> None:
    ending = judge(**given)
    assert ending.verdict == verdict
    assert message in ending.message, ending.message


@pytest.mark.parametrize(("facts", "sentence"), [
    ({}, "the runner process died without an exit record (killed from outside, or the "
         "machine went down?)"),
    ({"write_problem": "No space left on device"},
     "the runner could not write its exit record in /a: No space left on device"),
    ({"stray": ".exit.json.7.ab.tmp"},
     "the runner died while writing its exit record in /a (it left .exit.json.7.ab.tmp)"),
    ({"runner_log": "/a/runner.log", "stopped": 2},
     "the runner process died without an exit record (killed from outside, or the machine "
     "went down?); see /a/runner.log; 2 process(es) it had started were stopped"),
])
def test_no_exit_record(facts: dict[str, Any], sentence: str) -> None:
    given: dict[str, Any] = {"write_problem": None, "stray": None, "runner_log": None,
                             "stopped": 0}
    given.update(facts)
    assert outcome.no_exit_record("/a", **given) == sentence


def test_the_engines_own_messages() -> None:
    assert outcome.could_not_start("git failed") == "could not start: git failed"
    assert outcome.engine_gave_up("bad file") == ("the engine could not go on with this "
                                                  "task: bad file")
    assert outcome.KILLED_BEFORE_START == "killed before it started"


# --- the endpoint's limits (tests/engine/test_limits.py end to end)
# -----------------------------------

UTC0 = UTC
WINDOW_1308 = ("z.ai (429): Usage limit reached for 5 hour. Your limit will reset at "
               "1970-01-12 22:46:40 (5-hour window, code 1308)")  # NOW + 1 h, Beijing time
ARREARS = ("z.ai (429): Your account is in arrears, please recharge and try again "
           "(account in arrears, code 1113) — recharge the account")
CONCURRENT = ("z.ai (429): High concurrency usage of this API (too many requests at once, "
              "code 1302)")
RATE_429 = ("the endpoint's rate limit or quota was hit (429): API Error: Request rejected "
            "(429) · Number of request tokens has exceeded your per-minute rate limit")


def after(verdicts: tuple[str, ...], message: str, *, endpoint: EndpointState | None = None,
          active: int = 1, progress: bool = False, **changes: Any) -> policy.Next:
    fields: dict[str, Any] = {"session_id": "s-1", "last_tool": "Bash echo"} if progress \
        else {}
    return policy.after_attempt(task(), runs(*verdicts, **fields), verdicts[-1], message,
                                settings(park_jitter=10.0, **changes), NOW, Draw(1.0),
                                endpoint=endpoint, active=active, tz=UTC0)


def test_the_reset_of_a_window_is_beijing_time() -> None:
    # the fixture's reset: NOW + 1 h read in UTC+8 (as UTC it would be 9 h away)
    assert NOW == 1_000_000.0
    reading = providers.read_reset(
        "1970-01-12 22:46:40", 5 * 3600, NOW, zones=(8.0,), local=UTC0)
    assert reading.at == NOW + 3600


@pytest.mark.parametrize("before", [(), ("window",) * 9, ("overload",) * 3,
                                    ("concurrency", "window") * 4])
def test_a_window_parks_the_task_until_its_reset_and_is_not_counted(
        before: tuple[str, ...]) -> None:
    nxt = after((*before, "window"), WINDOW_1308, progress=True)
    assert nxt.state == TaskState.WAITING and nxt.verdict is None
    assert nxt.not_before == NOW + 3600 + 10.0  # the reset, plus the jitter (Draw(1.0))
    assert nxt.message == ("parked until 14:46 (5-hour window, code 1308), resumes then in "
                           "its session")
    assert nxt.effect == policy.Effect("park", until=NOW + 3610,
                                       reason="5-hour window, code 1308", message=WINDOW_1308)


@pytest.mark.parametrize(("reset", "why"), [
    ("1970-01-20 00:00:00", "outside the 5-hour window"),
    ("1970-01-01 00:00:00", "has passed already"),
    ("soon", "is not a time"),
])
def test_a_window_whose_reset_cannot_be_used_is_a_counted_cooldown(reset: str,
                                                                  why: str) -> None:
    message = WINDOW_1308.replace("1970-01-12 22:46:40", reset)
    nxt = after(("window",), message)
    assert nxt.state == TaskState.WAITING and nxt.verdict == Verdict.QUOTA
    assert why in nxt.message and "its reset time could not be used" in nxt.message
    assert "waits 60 s (quota cooldown)" in nxt.message and nxt.effect is None
    gave_up = after(("quota",) * 3 + ("window",), message)
    assert gave_up.state == TaskState.FAILED and "gave up after 4" in gave_up.message


@pytest.mark.parametrize(("verdicts", "wait", "label"), [
    (("quota",), 60.0, "(quota cooldown)"),
    (("quota", "quota"), 120.0, "(quota cooldown 2 in a row)"),
    (("quota", "window", "quota", "quota"), 240.0, "(quota cooldown 3 in a row)"),
    (("quota",) * 3 + ("quota",), None, "gave up after 4"),
])
def test_the_quota_cooldown_backs_off(verdicts: tuple[str, ...], wait: float | None,
                                      label: str) -> None:
    nxt = after(verdicts, RATE_429)
    assert label in nxt.message
    assert nxt.not_before == (None if wait is None else NOW + wait)


def test_no_wait_is_shorter_than_the_endpoints_retry_after() -> None:
    asked = f"{RATE_429}; the endpoint asked to wait 90 s (retry-after)"
    assert after(("quota",), asked).not_before == NOW + 90.0
    busy = "the endpoint is overloaded (529); the endpoint asked to wait 30 s (retry-after)"
    assert after(("overload",), busy).not_before == NOW + 30.0
    assert after(("overload",), "the endpoint is overloaded (529)").not_before == NOW + 5.0


@pytest.mark.parametrize(("verdict", "message", "active", "cap", "lowered"), [
    ("concurrency", CONCURRENT, 3, None, 2),  # 3 ran under a cap of 4: now 2
    ("concurrency", CONCURRENT, 4, None, 3),
    ("concurrency", CONCURRENT, 2, 2, 1),
    ("quota", RATE_429, 3, None, 2),  # a plain rate limit while several ran
])
def test_too_many_at_once_lowers_the_cap_and_is_not_counted(
        verdict: str, message: str, active: int, cap: int | None, lowered: int) -> None:
    state = EndpointState(EP, cap=cap)
    nxt = after(("overload",) * 3 + (verdict,), message, endpoint=state, active=active)
    assert nxt.state == TaskState.WAITING  # not "gave up": three counted and this one not
    assert nxt.verdict == (None if verdict == "concurrency" else Verdict.CONCURRENCY)
    assert nxt.effect is not None and nxt.effect.kind == "cap" and nxt.effect.cap == lowered
    assert f"cap {lowered}/4" in nxt.message and "not counted as an attempt" in nxt.message
    assert nxt.not_before == NOW + 5.0


def test_too_many_at_once_at_a_cap_of_one_is_a_counted_cooldown() -> None:
    nxt = after(("concurrency",), CONCURRENT, endpoint=EndpointState(EP, cap=1), active=1)
    assert nxt.verdict == Verdict.QUOTA and nxt.effect is None
    assert "(quota cooldown)" in nxt.message
    alone = after(("quota",), RATE_429, active=1)  # a rate limit with one running
    assert alone.verdict is None and "(quota cooldown)" in alone.message


@pytest.mark.parametrize(("verdict", "message", "held"), [
    ("account", ARREARS, True),
    ("auth", "the endpoint rejected the key (401): check FLEET_WORKER_BASE_URL", True),
    ("auth", "the endpoint rejected the key: z.ai (401): Authorization Token is invalid "
             "(invalid key, code 1002) — check the API key", True),
    # the launcher found no key: nothing reached the endpoint, nothing to hold
    ("auth", "no API key found in ANTHROPIC_AUTH_TOKEN or the keyring", False),
])
def test_an_account_or_key_error_fails_the_task_and_holds_the_endpoint(
        verdict: str, message: str, held: bool) -> None:
    nxt = after((verdict,), message)
    assert nxt.state == TaskState.FAILED and nxt.not_before is None
    assert nxt.message.startswith(message)
    if held:
        assert nxt.effect == policy.Effect("hold", reason=message, task="abc123",
                                           settings=policy.settings_key(SETTINGS))
    else:
        assert nxt.effect is None


def test_a_model_overload_moves_to_the_small_model_at_once() -> None:
    model_busy = ("z.ai (429): The model is currently experiencing high traffic "
                  "(model overloaded, code 1312)")
    nxt = after(("model_overload",), model_busy)
    assert nxt.state == TaskState.WAITING and "on the small model small" in nxt.message
    assert policy.model_for(task(), runs("model_overload"), SETTINGS) == "small"
    # a window between overloads neither counts nor breaks their streak
    assert policy.model_for(task(), runs("overload", "window"), SETTINGS) == "big"
    assert policy.model_for(task(), runs("overload", "window", "overload"), SETTINGS) \
        == "small"
    assert policy.streak(runs("overload", "window", "overload"), policy.COUNTED,
                         policy.UNCOUNTED) == 2


@pytest.mark.parametrize(("fields", "verdicts", "kind"), [
    ({"session_id": "s-1", "last_tool": "Bash x"}, ("overload",), "resume"),
    ({"session_id": "s-1", "turns": 2}, ("window",), "resume"),
    ({"session_id": "s-1", "turns": 1}, ("quota",), "fresh"),  # cut off at its first request
    ({"session_id": "s-0", "last_tool": "Bash x"}, ("overload",), "fresh"),  # another session
    ({"session_id": "s-1", "last_tool": "Bash x"}, ("crashed",), "fresh"),  # not the endpoint
    ({}, ("overload",), "fresh"),
])
def test_an_automatic_retry_resumes_a_session_with_progress(
        fields: dict[str, Any], verdicts: tuple[str, ...], kind: str) -> None:
    got_kind, prompt = policy.automatic_attempt(task(), runs(*verdicts, **fields))
    assert got_kind == kind
    assert prompt == (policy.AUTO_RESUME_PROMPT if kind == "resume" else "p")


def state(**fields: Any) -> EndpointState:
    return EndpointState(EP, **fields)


KEY_NOW = policy.settings_key(SETTINGS)


OVER = {"parked_until": None, "park_reason": None, "park_message": None, "next_start": None}


@pytest.mark.parametrize(("endpoint", "parked", "cap", "why", "fields", "on_claim"), [
    (None, 0, 4, None, None, None),
    (state(), 0, 4, None, None, None),
    (state(cap=2), 0, 2, None, None, None),
    (state(cap=9), 0, 4, None, None, None),  # never above the configured cap
    (state(held="z.ai: in arrears", held_settings=KEY_NOW), 0, None, "held: z.ai: in arrears",
     None, None),
    # held with other settings (a new model, base URL, key source): lifted
    (state(held="z.ai: in arrears", held_settings="older"), 0, 4, None,
     {"held": None, "held_task": None, "held_settings": None}, None),
    (state(parked_until=NOW + 60, park_reason="5-hour window, code 1308"), 2, None,
     "parked until 13:47 (5-hour window, code 1308), resumes then", None, None),
    # the reset has passed: parked sessions resume one at a time
    (state(parked_until=NOW - 1), 2, 4, None, None, {"next_start": NOW + 10.0}),
    (state(parked_until=NOW - 5, next_start=NOW + 3), 1, None,
     "resuming the parked sessions one at a time", None, None),
    (state(parked_until=NOW - 5, next_start=NOW - 1), 1, 4, None, None,
     {"next_start": NOW + 10.0}),
    # none left parked: the tasks queued during the park are staggered the same way
    (state(parked_until=NOW - 5, next_start=NOW + 3), 0, None,
     "starting the tasks queued during the park one at a time", None, None),
    (state(parked_until=NOW - 5, next_start=NOW - 1), 0, 4, None, None,
     {"next_start": NOW + 10.0}),
])
def test_gate(endpoint: EndpointState | None, parked: int, cap: int | None, why: str | None,
              fields: dict[str, Any] | None, on_claim: dict[str, Any] | None) -> None:
    got = policy.gate(endpoint, SETTINGS, NOW, parked, settings_now=KEY_NOW, tz=UTC0)
    assert (got.cap, got.why, got.fields, got.on_claim) == (cap, why, fields, on_claim)
    # after the reset (the gate open with a stagger): the park ends once nothing is left
    # to start, and the parked sessions go first while there are any
    resuming = on_claim is not None
    assert got.on_idle == (OVER if resuming else None)
    assert got.parked_first == (resuming and parked > 0)
    note = policy.queued_note(got.why)
    assert (note is None) == (why is None)
    if note is not None:
        assert note.startswith(policy.NOTE_PREFIXES)


@pytest.mark.parametrize(("before", "effect", "fields"), [
    # a park: a new event; a second task's park keeps the later reset, same event
    (state(), policy.Effect("park", until=NOW + 60, reason="w", message="m"),
     {"parked_until": NOW + 60, "park_reason": "w", "park_message": "m", "next_start": None,
      "event": "park", "event_at": NOW}),
    (state(parked_until=NOW + 90), policy.Effect("park", until=NOW + 60, reason="w"),
     {"parked_until": NOW + 90, "park_reason": "w", "park_message": None,
      "next_start": None}),
    (state(parked_until=NOW - 90), policy.Effect("park", until=NOW + 60, reason="w"),
     {"parked_until": NOW + 60, "park_reason": "w", "park_message": None,
      "next_start": None, "event": "park", "event_at": NOW}),
    # a hold: one event, however many tasks meet it
    (state(), policy.Effect("hold", reason="r", task="t1", settings="k"),
     {"held": "r", "held_task": "t1", "held_settings": "k", "event": "hold",
      "event_at": NOW}),
    # ... and it names the first task that met it (not the last of those that
    # ran beside it)
    (state(held="r", held_task="t1"), policy.Effect("hold", reason="r", task="t2",
                                                    settings="k"), None),
    # a cap: only ever lower
    (state(), policy.Effect("cap", cap=2, reason="c"),
     {"cap": 2, "cap_reason": "c", "cap_changed_at": NOW, "event": "cap", "event_at": NOW}),
    (state(cap=2), policy.Effect("cap", cap=3, reason="c"), None),
    # a success: the cap creeps up once cap_hold has passed since it last changed
    (state(cap=2, cap_changed_at=NOW - 301), policy.Effect("ok"),
     {"cap": 3, "cap_changed_at": NOW}),
    (state(cap=3, cap_changed_at=NOW - 301), policy.Effect("ok"),
     {"cap": None, "cap_reason": None, "cap_changed_at": NOW}),
    (state(cap=2, cap_changed_at=NOW - 10), policy.Effect("ok"), None),
    (state(), policy.Effect("ok"), None),
])
def test_apply_effect(before: EndpointState, effect: policy.Effect,
                      fields: dict[str, Any] | None) -> None:
    assert policy.apply_effect(before, effect, SETTINGS, NOW) == fields


def test_endpoint_note() -> None:
    assert policy.endpoint_note(None, SETTINGS, NOW) is None
    assert policy.endpoint_note(state(), SETTINGS, NOW) is None
    note = policy.endpoint_note(state(held="z.ai: in arrears", held_task="t1", cap=2,
                                      cap_reason="too many at once, code 1302",
                                      parked_until=NOW + 60, park_reason="5-hour window"),
                                SETTINGS, NOW, tz=UTC0)
    assert note == ("held: z.ai: in arrears (met by task t1: `fleet-tui retry t1` once "
                    "fixed, or change the settings); parked until 13:47 (5-hour window), "
                    "resumes then; cap 2/4 (too many at once, code 1302)")


def test_a_run_retrying_into_a_closed_endpoint_is_stopped_with_its_words() -> None:
    assert policy.stop_for_endpoint(None, NOW) is None
    assert policy.stop_for_endpoint(state(), NOW) is None
    assert policy.stop_for_endpoint(state(held=ARREARS), NOW) == ARREARS
    assert policy.stop_for_endpoint(state(parked_until=NOW + 9, park_message=WINDOW_1308),
                                    NOW) == WINDOW_1308
    assert policy.stop_for_endpoint(state(parked_until=NOW - 1, park_message=WINDOW_1308),
                                    NOW) is None  # the window has reset
    assert policy.stop_for_endpoint(state(parked_until=NOW + 9), NOW) is None


@pytest.mark.parametrize(("words", "code", "result", "verdict"), [
    (WINDOW_1308, 143, None, Verdict.WINDOW),  # stopped before any result
    (WINDOW_1308, 1, RESULT_529, Verdict.WINDOW),
    (ARREARS, 1, RESULT_529, Verdict.ACCOUNT),
    (WINDOW_1308, 0, RESULT_OK, Verdict.OK),  # it finished before the stop took
    ("no provider words", 1, RESULT_529, Verdict.CRASHED),
])
def test_judge_a_run_stopped_for_its_endpoint(words: str, code: int,
                                              result: dict[str, Any] | None,
                                              verdict: Verdict) -> None:
    ending = judge(exit_record={"exit_code": code, "signal": None}, stop_reason="endpoint",
                   stop_message=words, result=result)
    assert ending.verdict == verdict
    if verdict is not Verdict.OK:
        assert ending.message == words


# --- a task whose store row is damaged (row_error) ------------------------------------------

ROW_ERROR = ("the store row of task abc123 is unreadable: column turns holds 'abc'; discard "
             "the task, or correct the row")


@pytest.mark.parametrize("state", [TaskState.SUCCEEDED, TaskState.FAILED, TaskState.KILLED,
                                   TaskState.RUNNING, TaskState.QUEUED, TaskState.WAITING])
def test_a_damaged_row_allows_only_discard(state: TaskState) -> None:
    """Its columns cannot be trusted (a bad one reads as its default): nothing may act on
    its worktree, branch or session; discarding it (with the user's confirmation) is the
    way out, and the reason says so and how to correct the row instead. A worker that
    still runs may be stopped (a discard stops it first)."""
    bad = task(state, row_error=ROW_ERROR)
    allowed = policy.allowed_actions(bad)
    running = state in (TaskState.RUNNING, TaskState.QUEUED, TaskState.WAITING)
    assert [a for a, why in allowed.items() if why is None] == (
        [Action.DISCARD, Action.KILL] if running else [Action.DISCARD])
    for action, why in allowed.items():
        if action is Action.KILL and not running:
            assert why is not None and "not running" in why
        elif action not in (Action.DISCARD, Action.KILL):
            assert why is not None and "store row" in why and "damaged" in why, action
            assert "fleet-tui discard abc123" in why and "correct the row" in why
    refused = policy.refusal(bad, Action.RETRY)
    assert refused is not None and refused.startswith("cannot retry task abc123: its store row")
    assert policy.why_not_resume(bad) == policy.why_not(bad, Action.RETRY)
    # the same task with its row intact offers more
    assert sum(why is None for why in policy.allowed_actions(task(state)).values()) > 1


def test_a_damaged_row_of_a_closed_task_allows_nothing() -> None:
    bad = task(TaskState.MERGED, row_error=ROW_ERROR)
    assert all(why == "it was merged already"
               for why in policy.allowed_actions(bad).values())
