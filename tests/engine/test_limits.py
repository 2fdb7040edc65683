"""The endpoint's real limits, end to end: the real claude against the scripted endpoint
answering as z.ai does (HTTP 429, `{"error": {"code": "1308", "message": ...}}`) and as
Anthropic's API does (429 with retry-after, 529).

- a usage window (1308) met mid-task parks the endpoint until the reset it names: no
  request meanwhile, then the sessions resume one after another in their own sessions
  (the endpoint sees the earlier turns) and finish, the work before the limit kept;
- an account error (1113) with three tasks queued: one request, one failure with the
  provider's sentence and what to do, the other two held, no retries; a retry lifts it;
- an overload mid-task: the retry resumes the session; z.ai's 1312 moves to the small
  model at once; a window whose reset cannot be read is a counted cooldown, said so;
- too many at once (1302) with a cap of 3: the effective cap is lowered, nothing is
  charged an attempt, every task finishes;
- a 429 with retry-after: the cooldown is at least what the endpoint asked for.

CLAUDE_CODE_MAX_RETRIES=0 in the workers (make_fleet), so that each refusal ends the run
at once, except where the CLI's own retries are the point: a worker that retries a 429
into a window the endpoint is parked for is stopped and parked with it.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from test_fleet import KEY, drive, make_fleet, settled

from fleet_tui.core import policy
from fleet_tui.demo.endpoint import RecordedRequest, ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.engine.supervisor import TaskChange
from fleet_tui.store.db import Task, TaskState
from fleet_tui.system import paths

# two tool turns, then an answer; the first one sleeps so that both tasks of a test are past
# their first turn before either asks for its second
WORK: dict[str, Any] = {
    "real_turns": True,
    "turns": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "echo one > one.txt; sleep 3", "description": "one"}}],
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "echo two > two.txt", "description": "two"}}],
        "both files written",
    ],
}
QUICK: dict[str, Any] = {
    "real_turns": True,
    "turns": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "echo one > one.txt", "description": "one"}}],
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "echo two > two.txt", "description": "two"}}],
        "both files written",
    ],
}


def of_task(ep: ScriptedEndpoint, task: Task) -> list[RecordedRequest]:
    """The requests a task's sessions sent (by the worktree the CLI names)."""
    where = str(task.worktree)
    return [r for r in ep.message_requests() if r.cwd == where]


def wait_tasks(fleet: Fleet, tasks: list[Task]) -> list[Task]:
    drive(fleet, settled(fleet, *[t.id for t in tasks]), timeout=120)
    return [fleet.get_task(t.id) for t in tasks]


def test_a_window_parks_the_endpoint_until_its_reset_and_the_sessions_resume(
        git_repo: Path, claude_bin: str) -> None:
    # closes once both first turns are answered, for 6 s; its reset time is written as
    # z.ai writes it: no zone, Beijing time (this machine's zone is another one)
    window = {"kind": "window", "after_ok": 2, "seconds": 6}
    with ScriptedEndpoint({"default": WORK}, faults=[window]) as ep:
        fleet = make_fleet(ep, claude_bin, max_workers=2, park_jitter=0.5,
                           resume_stagger=1.0, max_attempts=1)
        claims = _claims_stamped(fleet)
        tasks = fleet.submit(TaskSpec(prompt="write one.txt and two.txt", repo=git_repo),
                             copies=2)
        parked: list[Task] = []

        def both_parked() -> bool:
            now = [fleet.get_task(t.id) for t in tasks]
            if all(t.state == TaskState.WAITING for t in now):
                parked[:] = now
                return True
            return False

        drive(fleet, both_parked, timeout=90)
        reset = ep.window_reset()
        assert reset is not None
        for t in parked:
            assert t.verdict == "window"
            assert t.message is not None and t.message.startswith("parked until ")
            assert "(5-hour window, code 1308), resumes then in its session" in t.message
            assert t.not_before is not None and reset <= t.not_before <= reset + 0.5
        (status,) = fleet.status().endpoints
        assert status.parked_until is not None and status.event == "park"
        assert status.note is not None and "5-hour window, code 1308" in status.note
        done = wait_tasks(fleet, tasks)
    refused = [r for r in ep.message_requests() if r.status == 429]
    assert [r.fault for r in refused] == ["window:1308"] * 2  # each session met it once
    first_refusal = min(r.time for r in refused)
    # nothing but those two reached the endpoint while the window was closed
    during = [r for r in ep.message_requests() if first_refusal <= r.time < reset]
    assert sorted(during, key=lambda r: r.time) == sorted(refused, key=lambda r: r.time)
    starts = []
    for t in done:
        assert t.state == TaskState.SUCCEEDED, t.message
        attempts = fleet.attempts(t.id)
        assert [(a.kind, a.verdict) for a in attempts] == [("fresh", "window"),
                                                           ("resume", "ok")]
        assert attempts[0].session_id == attempts[1].session_id == t.session_id
        starts.append(attempts[1].started_at or 0.0)
        after = [r for r in of_task(ep, t) if r.time >= reset]
        # the session resumed: its first request after the reset carries the turn it
        # had done before the window (a fresh session's first request has none)
        assert after and after[0].turn == 1 and after[0].status == 200
        assert after[0].prompt is not None and after[0].prompt.startswith(
            "write one.txt and two.txt")
        worktree = Path(t.worktree or "")
        assert (worktree / "one.txt").read_text() == "one\n"  # the work before the limit
        assert (worktree / "two.txt").read_text() == "two\n"
    # one after another: the second resume was claimed at least resume_stagger after the
    # first, between the times the claims were stamped with (what the stagger counts from;
    # an attempt's started_at comes a moment after its claim, and under load that moment
    # differed by 29 ms between the two: 0.971 s apart)
    resumed = sorted(at for task_id, at in claims if task_id in {t.id for t in done}
                     and at >= reset)
    assert len(resumed) == 2, claims
    assert resumed[1] - resumed[0] >= 1.0, resumed
    assert min(starts) >= reset


def _claims_stamped(fleet: Fleet) -> list[tuple[str, float]]:
    """Each claim the fleet's store makes, as (task id, the time it was stamped with), in
    the order made: the store's own claim_next, looked at as it returns."""
    made: list[tuple[str, float]] = []
    claim = fleet.store.claim_next

    def noted(*args: Any, **kwargs: Any) -> Task | None:
        task = claim(*args, **kwargs)
        if task is not None and task.claimed_at is not None:
            made.append((task.id, task.claimed_at))
        return task

    fleet.store.claim_next = noted  # type: ignore[method-assign]
    return made


def test_an_account_error_fails_one_task_and_holds_the_rest_once(
        git_repo: Path, claude_bin: str) -> None:
    arrears = {"kind": "zai", "code": "1113"}  # every request, as long as it is set
    with ScriptedEndpoint({"default": QUICK}, faults=[arrears]) as ep:
        fleet = make_fleet(ep, claude_bin, max_workers=1)
        tasks = fleet.submit(TaskSpec(prompt="write the files", repo=git_repo), copies=3)
        drive(fleet, lambda: fleet.get_task(tasks[0].id).state == TaskState.FAILED,
              timeout=60)
        deadline = time.monotonic() + 2.0  # and a while longer: nothing else starts
        drive(fleet, lambda: time.monotonic() > deadline)
        first, *rest = (fleet.get_task(t.id) for t in tasks)
        assert len(ep.message_requests()) == 1  # one request, no retry, no other task
        assert first.verdict == "account"
        message = first.message or ""
        assert "Your account is in arrears, please recharge and try again" in message
        assert "code 1113" in message and "recharge the account" in message
        assert KEY not in message
        assert len(fleet.attempts(first.id)) == 1
        for t in rest:
            assert t.state == TaskState.QUEUED and fleet.attempts(t.id) == []
            assert (t.message or "").startswith("held: z.ai (429): Your account is in arrears")
        (status,) = fleet.status().endpoints
        assert status.held is not None and status.held_task == first.id
        assert status.event == "hold"  # one event for the endpoint, not one per task
        note = fleet.endpoint_note(ep.url) or ""
        assert f"`fleet-tui retry {first.id}`" in note
        # the user recharged and retries the task that met it: the hold is lifted
        ep.clear_faults()
        fleet.retry(first.id)
        done = wait_tasks(fleet, tasks)
    assert all(t.state == TaskState.SUCCEEDED for t in done), [t.message for t in done]
    assert all(not (t.message or "").startswith("held: ") for t in done)
    assert fleet.status().endpoints == [] or fleet.status().endpoints[0].held is None


def test_an_overload_mid_task_resumes_the_session(git_repo: Path, claude_bin: str) -> None:
    overload = {"status": 529, "turn": 1, "times": 1}
    with ScriptedEndpoint({"default": QUICK}, faults=[overload]) as ep:
        fleet = make_fleet(ep, claude_bin)
        (task,) = fleet.submit(TaskSpec(prompt="write one.txt and two.txt", repo=git_repo))
        (done,) = wait_tasks(fleet, [task])
        requests = ep.message_requests()
    assert done.state == TaskState.SUCCEEDED, done.message
    attempts = fleet.attempts(task.id)
    assert [(a.kind, a.verdict) for a in attempts] == [("fresh", "overload"),
                                                       ("resume", "ok")]
    assert attempts[1].session_id == attempts[0].session_id
    assert "Continue the task where you left off" in attempts[1].prompt
    # turns as the endpoint counted them: 0, 1 (refused), then the resumed session's
    # first request still has turn 0 behind it
    assert [(r.turn, r.status) for r in requests] == [(0, 200), (1, 529), (1, 200), (2, 200)]
    worktree = Path(done.worktree or "")
    assert (worktree / "one.txt").read_text() == "one\n"
    assert (worktree / "two.txt").read_text() == "two\n"


def test_too_many_at_once_lowers_the_cap_and_charges_nothing(
        git_repo: Path, claude_bin: str) -> None:
    # three workers' first requests in flight together: the endpoint takes two at once
    # and holds their answers until it has answered a third with code 1302 (whenever
    # that worker's claude gets there, however loaded the machine)
    slow = {"real_turns": True, "delay": 0.02,
            "turns": ["a long answer, streamed slowly, so that every worker's request is "
                      "still being answered when the next one arrives at the endpoint, "
                      "which then has more of them in flight than it allows"]}
    with ScriptedEndpoint({"default": slow},
                          faults=[{"kind": "concurrency", "limit": 2, "hold": 90}]) as ep:
        fleet = make_fleet(ep, claude_bin, max_workers=3, max_attempts=1,
                           backoff_base=0.2)
        tasks = fleet.submit(TaskSpec(prompt="answer", repo=git_repo), copies=3)
        caps: list[int] = []

        def watch() -> None:
            caps.extend(e.cap for e in fleet.status().endpoints)

        drive(fleet, settled(fleet, *[t.id for t in tasks]), timeout=120, each=watch)
        refused = [r for r in ep.message_requests() if r.status == 429]
    done = [fleet.get_task(t.id) for t in tasks]
    assert refused and all(r.fault == "concurrency:1302" for r in refused)
    assert caps and min(caps) <= 2  # the effective cap went down
    assert all(t.state == TaskState.SUCCEEDED for t in done), [t.message for t in done]
    verdicts = [a.verdict for t in done for a in fleet.attempts(t.id)]
    assert verdicts.count("concurrency") == len(refused)
    assert verdicts.count("ok") == 3  # with max_attempts 1: the requeues were not charged
    (status,) = fleet.status().endpoints
    assert status.cap <= 2 and status.max_workers == 3 and status.event == "cap"
    assert status.note is not None and f"cap {status.cap}/3" in status.note


def test_a_429_waits_at_least_its_retry_after(git_repo: Path, claude_bin: str) -> None:
    # Anthropic's way: 429 rate_limit_error with retry-after; the CLI retries once itself
    # (honouring it), then gives up; the engine's cooldown is no shorter than it either
    with ScriptedEndpoint({"default": ["fine"]},
                          faults=[{"status": 429, "times": 2, "retry_after": 2}]) as ep:
        fleet = make_fleet(ep, claude_bin, max_workers=1, quota_cooldown=0.2)
        fleet.env["CLAUDE_CODE_MAX_RETRIES"] = "1"
        (task,) = fleet.submit(TaskSpec(prompt="hello", repo=git_repo))
        (done,) = wait_tasks(fleet, [task])
        requests = ep.message_requests()
    assert done.state == TaskState.SUCCEEDED, done.message
    first = fleet.attempts(task.id)[0]
    assert first.verdict == "quota"
    assert [r.status for r in requests] == [429, 429, 200]
    assert requests[1].time - requests[0].time >= 2.0 - 0.05  # the CLI waited
    assert requests[2].time - requests[1].time >= 2.0 - 0.05  # and so did the engine


def test_a_task_that_retries_into_a_parked_window_is_stopped_and_parked(
        git_repo: Path, claude_bin: str) -> None:
    """The CLI retries a 429 by itself before the engine hears of it. Once the endpoint is
    parked (another task met the window and named its reset), a task that retries a 429
    is stopped at its first retry and parked too, instead of sending its remaining
    retries into the closed window (here the CLI would retry 8 times)."""
    reset = float(int(time.time()) + 12)
    window = {"kind": "window", "after_ok": 1, "until": reset}
    with ScriptedEndpoint({"default": QUICK}, faults=[window]) as ep:
        fleet = make_fleet(ep, claude_bin, park_jitter=0.5)
        fleet.env["CLAUDE_CODE_MAX_RETRIES"] = "8"
        (task,) = fleet.submit(TaskSpec(prompt="write one.txt and two.txt", repo=git_repo))
        drive(fleet, lambda: len(ep.message_requests()) >= 1)
        # another task met the window meanwhile: the endpoint is parked, as the follower
        # parks it (the refusal's words name the reset, in Beijing time)
        beijing = datetime.fromtimestamp(reset, timezone(timedelta(hours=8)))
        words = ("z.ai (429): Usage limit reached for 5 hour. Your limit will reset at "
                 f"{beijing:%Y-%m-%d %H:%M:%S} (5-hour window, code 1308)")
        now = time.time()
        park = policy.Effect("park", until=reset + 0.5, reason="5-hour window, code 1308",
                             message=words)
        fleet.store.change_endpoint("default", lambda state: policy.apply_effect(
            state, park, fleet.settings, now), now)
        (done,) = wait_tasks(fleet, [task])
        requests = ep.message_requests()
    assert done.state == TaskState.SUCCEEDED, done.message
    refused = [r for r in requests if r.status == 429]
    assert 1 <= len(refused) <= 2  # its first refusal (and a retry already on its way)
    assert all(r.time < reset for r in refused)
    assert all(r.time >= reset for r in requests[len(refused) + 1:])  # then nothing until
    attempts = fleet.attempts(task.id)
    assert [(a.kind, a.verdict) for a in attempts] == [("fresh", "window"), ("resume", "ok")]
    assert attempts[0].message == words


def test_a_window_with_no_usable_reset_falls_back_to_the_cooldown_and_says_so(
        git_repo: Path, claude_bin: str) -> None:
    garbled = {"kind": "zai", "code": "1308", "times": 1,
               "message": "Usage limit reached for 5 hour. Your limit will reset at soon"}
    with ScriptedEndpoint({"default": ["fine"]}, faults=[garbled]) as ep:
        fleet = make_fleet(ep, claude_bin, max_workers=1, quota_cooldown=0.5)
        (task,) = fleet.submit(TaskSpec(prompt="hello", repo=git_repo))
        # what the pass said as it put the task to wait (a look between passes can miss
        # the wait: a loaded machine's pass may end the 0.5 s cooldown itself)
        changes: list[TaskChange] = []
        drive(fleet, settled(fleet, task.id), changes=changes)
        said = [c.message for c in changes
                if c.task_id == task.id and c.new == TaskState.WAITING and c.message]
        requests = ep.message_requests()
    assert fleet.get_task(task.id).state == TaskState.SUCCEEDED
    assert said and "its reset time could not be used ('soon' is not a time)" in said[0]
    assert "waits 0.5 s (quota cooldown)" in said[0]
    assert [a.verdict for a in fleet.attempts(task.id)] == ["quota", "ok"]  # counted
    assert requests[1].time - requests[0].time >= 0.5


def test_a_model_overload_moves_to_the_small_model_at_once(git_repo: Path,
                                                          claude_bin: str) -> None:
    busy = {"kind": "zai", "code": "1312", "times": 1}
    with ScriptedEndpoint({"default": ["fine"]}, faults=[busy]) as ep:
        fleet = make_fleet(ep, claude_bin, model="big-model", small_model="small-model",
                           fallback_after=3)
        (task,) = fleet.submit(TaskSpec(prompt="hello", repo=git_repo))
        (done,) = wait_tasks(fleet, [task])
        requests = ep.message_requests()
    assert done.state == TaskState.SUCCEEDED, done.message
    assert [(a.verdict, a.model) for a in fleet.attempts(task.id)] == [
        ("model_overload", "big-model"), ("ok", "small-model")]
    assert [(r.status, r.model) for r in requests] == [(429, "big-model"),
                                                       (200, "small-model")]


# --- after a reset: one start per resume_stagger, the parked sessions first -----------------

# The endpoint must hear the parked session's resume first, and claude's own start (the
# resume reads its session) takes a varying time under load: at 1.5 s, a fresh task
# claimed at least 1.5 s after the parked one reached the endpoint 95 ms before its
# resume, in a run of the whole suite on two cores. The stagger is a wait, not CPU.
STAGGER = 3.0
ONE_ANSWER: dict[str, Any] = {"real_turns": True, "turns": ["done"]}


def _engine_child(tmp_path: Path, ep: ScriptedEndpoint, claude_bin: str,
                  ids: list[str], **settings: Any) -> subprocess.Popen[bytes]:
    """tests/support/engine_child.py: a second real engine process on the test's store."""
    tests = Path(__file__).resolve().parents[1] / "support"
    config = tmp_path / "engine-child.json"
    config.write_text(json.dumps({
        "settings": {"base_url": ep.url, "claude": claude_bin, "sandbox": os.geteuid() == 0,
                     "key_sources": "env", "kill_grace": 2.0, **settings},
        "env": dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0"),
        "db": str(paths.db_path()), "until_settled": ids}))
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*inherited, str(tests.parent),
                                                       str(tests)]))
    return subprocess.Popen([sys.executable, str(tests / "engine_child.py"), str(config)],
                            env=env)


def _staggered_after_reset(git_repo: Path, claude_bin: str, tmp_path: Path,
                           engines: int) -> None:
    # the window closes after the parked task's first turn, for long enough that the fresh
    # tasks are queued while it is closed (4 s were not, once, in a run with five test
    # workers on two cores: a fresh task then started as any start does, before the parked
    # one's resume), and that a second engine process is up before it opens (8 s were
    # not, once, beside two CPU hogs, and the first engine claimed them all)
    window = {"kind": "window", "after_ok": 1, "seconds": 12 if engines == 1 else 20}
    settings: dict[str, Any] = {"max_workers": 4, "park_jitter": 1.0,
                                "resume_stagger": STAGGER, "max_attempts": 1}
    with ScriptedEndpoint({"default": WORK, "one": ONE_ANSWER}, faults=[window]) as ep:
        fleet = make_fleet(ep, claude_bin, **settings)
        (parked,) = fleet.submit(TaskSpec(prompt="write one.txt and two.txt", repo=git_repo))
        drive(fleet, lambda: fleet.get_task(parked.id).verdict == "window", timeout=90)
        # two fresh tasks: the stagger between the resume and a start, and between two
        # starts; the cap (4) is above the three, so only the stagger spaces them
        fresh = fleet.submit(TaskSpec(prompt="[script:one] answer", repo=git_repo), copies=2)
        queued = time.time()
        ids = [parked.id, *(t.id for t in fresh)]
        reset = ep.window_reset()
        assert reset is not None
        # what the order is about: the fresh tasks waited for the reset too
        assert queued < reset, f"the window reopened {queued - reset:.1f} s before the " \
            "fresh tasks were queued"
        claims: dict[str, float] = {}

        def note_claims() -> None:  # each task's claim after the reset, as the store has it
            for t in fleet.list_tasks():
                if t.claimed_at is not None and t.claimed_at >= reset:
                    claims[t.id] = min(claims.get(t.id, t.claimed_at), t.claimed_at)

        child = _engine_child(tmp_path, ep, claude_bin, ids, **settings) \
            if engines == 2 else None
        try:
            drive(fleet, settled(fleet, *ids), timeout=150, each=note_claims)
            if child is not None:
                assert child.wait(timeout=60) == 0
        finally:
            if child is not None and child.poll() is None:
                child.kill()
                child.wait()
        done = [fleet.get_task(i) for i in ids]
    for t in done:
        assert t.state == TaskState.SUCCEEDED, t.message
    assert set(claims) == set(ids)
    order = sorted(ids, key=lambda i: claims[i])
    assert order[0] == parked.id  # the parked session first
    times = [claims[i] for i in order]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap >= STAGGER - 0.01 for gap in gaps), gaps
    # and the endpoint heard the parked session's resume before any fresh task
    firsts = {t.id: min(r.time for r in of_task(ep, t) if r.time >= reset) for t in done}
    assert min(firsts, key=lambda i: firsts[i]) == parked.id, firsts
    # With two engines: both were live and competing for every slot (the child ran from
    # before the reset to the end, exit 0 above), and the stagger and the order held over
    # all the store's claims, whoever made them. Which engine wins a slot is a race the
    # faster ticker usually wins (a quiet run saw one engine claim them all), so it is not
    # asserted.


@pytest.mark.long
def test_after_a_reset_one_start_per_stagger_parked_first(
        git_repo: Path, claude_bin: str, tmp_path: Path) -> None:
    _staggered_after_reset(git_repo, claude_bin, tmp_path, engines=1)


@pytest.mark.long
def test_after_a_reset_two_engines_keep_the_stagger_parked_first(
        git_repo: Path, claude_bin: str, tmp_path: Path) -> None:
    _staggered_after_reset(git_repo, claude_bin, tmp_path, engines=2)


def test_the_stagger_is_counted_from_the_time_each_claim_is_stamped_with(
        git_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The resume's stagger holds between the claim times the store keeps, however long a
    claim waited for the store: the gate decides with the time the claim is stamped with.
    With two readings of the clock (the one stamped, taken before the claim waits for
    the store's lock, and a later one deciding), a claim that waited longer than the one
    before it started sooner than the stagger after it (1.45 s for 1.5: two engines on one
    store, under load). Here each claim waits (the clock moves on) a little longer than
    the last; the host is the in-memory one."""
    from fleet_tui.execution.memory import MemoryHost
    from fleet_tui.settings.config import load_settings
    from fleet_tui.store.db import Store

    stagger = 2.0
    clock = {"now": 1000.0, "wait": 0.0}

    def read() -> float:
        clock["now"] += 0.001
        return clock["now"]

    settings = load_settings(env=os.environ, overrides={
        "key_sources": "env", "max_workers": 4, "max_attempts": 1, "gateway": False,
        "resume_stagger": stagger, "park_jitter": 0.0})
    store = Store(paths.db_path())
    fleet = Fleet(settings, store, clock=read, env=dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY),
                  host=MemoryHost(tmp_path / "memory-host", clock=read))
    tasks = fleet.submit(TaskSpec(prompt="work", repo=git_repo), copies=4)
    store.change_endpoint(tasks[0].endpoint, lambda st: {
        "parked_until": clock["now"] + 1.0, "park_reason": "window"}, clock["now"])
    claim = store.claim_gated

    def after_a_wait(*args: Any, **kwargs: Any) -> Any:  # the store's lock, held elsewhere
        clock["wait"] += 0.01
        clock["now"] += clock["wait"]
        return claim(*args, **kwargs)

    monkeypatch.setattr(store, "claim_gated", after_a_wait)
    for _ in range(2000):
        fleet.tick()
        if all(fleet.get_task(t.id).claimed_at is not None for t in tasks):
            break
    times = sorted(fleet.get_task(t.id).claimed_at or 0.0 for t in tasks)
    assert all(times), times
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap >= stagger for gap in gaps), gaps
