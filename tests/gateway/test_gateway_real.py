"""The real claude through the gateway, started by the engine as every worker's
default: 8 workers share 2 request slots without a 1302; the gateway SIGKILLed mid-stream
costs a retry, not the task; the tokens end with their attempts; the key stays out of the
worker's reach and out of the gateway's files."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from test_fleet import KEY, drive, make_fleet, settled

from fleet_tui.core import policy
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.gateway import control
from fleet_tui.store.db import TaskState
from fleet_tui.store.meter import TOKEN_PREFIX, Meter

SLOW = {"real_turns": True, "delay": 0.02,
        "turns": ["a long answer, streamed slowly, so that the workers' requests are in "
                  "flight together and more of them want the endpoint than it allows"]}


def gateway_fleet(ep: ScriptedEndpoint, claude: str, **overrides: Any) -> Fleet:
    # the CLI's own retries stay on (a stream cut by the gateway's death is retried)
    fleet = make_fleet(ep, claude, gateway=True, **overrides)
    fleet.env.pop("CLAUDE_CODE_MAX_RETRIES", None)
    fleet.supervisor.env = fleet.env
    fleet.supervisor.gateway.env = fleet.env
    return fleet


def test_five_workers_share_two_slots_without_a_1302(git_repo: Path, claude_bin: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # all 5 start at once, so that their requests all want the 2 slots together (the starts
    # in step with the slots have tests of their own: test_gateway_starts.py); five are
    # more than twice the slots: a gateway that let a third request through would meet
    # the endpoint's 1302 (the slots benchmark times eight)
    monkeypatch.setattr(policy, "START_BOUND", 0.0)
    with ScriptedEndpoint({"default": SLOW},
                          faults=[{"kind": "concurrency", "limit": 2}]) as ep:
        fleet = gateway_fleet(ep, claude_bin, max_workers=5, max_requests=2, max_attempts=1)
        try:
            tasks = fleet.submit(TaskSpec(prompt="answer", repo=git_repo), copies=5)
            peak = 0

            def watch() -> None:
                nonlocal peak
                status = control.read_status() or {}
                flight = status.get("endpoints", {}).get("default", {}).get("in_flight", 0)
                peak = max(peak, flight)

            drive(fleet, settled(fleet, *[t.id for t in tasks]), timeout=150, each=watch)
            done = [fleet.get_task(t.id) for t in tasks]
            assert all(t.state == TaskState.SUCCEEDED for t in done), \
                [(t.state, t.message) for t in done]
            served = ep.message_requests()
            assert [r for r in served if r.status != 200] == []  # 0 refusals (1302)
            # the slots were used and never exceeded (2 in flight at the peak on a quiet
            # machine; on a loaded one the starts may leave only one at a time)
            assert 1 <= peak <= 2
            # upstream: the real key, never a token
            assert {r.auth_sha256 for r in served} == {hashlib.sha256(KEY.encode()).hexdigest()}
            meter = Meter(fleet.store)
            rows = meter.rows()
            assert len(rows) == len(served)
            assert sorted({r.task_id for r in rows}) == sorted(t.id for t in tasks)
            assert all(r.input_tokens > 0 and r.output_tokens > 0 for r in rows)
            # every attempt's token ended with it
            conn = fleet.store._connect()
            left = conn.execute("SELECT COUNT(*) FROM gateway_tokens WHERE revoked_at IS NULL"
                                ).fetchone()[0]
            assert left == 0
            # the worker never held the key: its runner got the token
            for task in done:
                (attempt,) = fleet.attempts(task.id)
                assert attempt.dir is not None
                runner_log = (Path(attempt.dir) / "runner.log").read_bytes()
                assert KEY.encode() not in runner_log
            for path in control.folder().iterdir():
                if not path.is_file():  # control.sock
                    continue
                data = path.read_bytes()
                assert KEY.encode() not in data and TOKEN_PREFIX.encode() not in data, path
        finally:
            control.stop(fleet.env)


def test_a_sigkilled_gateway_costs_a_retry_not_the_task(git_repo: Path,
                                                        claude_bin: str) -> None:
    slow = {"real_turns": True, "delay": 0.5,
            "turns": ["an answer streamed slowly enough for the gateway to die in the "
                      "middle of it, and the worker to ask again once it is back"]}
    with ScriptedEndpoint({"default": slow}) as ep:
        fleet = gateway_fleet(ep, claude_bin, max_attempts=1)
        try:
            (task,) = fleet.submit(TaskSpec(prompt="answer", repo=git_repo))

            # the first request has reached the endpoint: its answer streams for seconds
            drive(fleet, lambda: bool(ep.message_requests()), timeout=60)
            first = control.read_info(fleet.env)
            assert first is not None
            os.kill(first.pid, signal.SIGKILL)
            drive(fleet, settled(fleet, task.id), timeout=150)
            done = fleet.get_task(task.id)
            assert done.state == TaskState.SUCCEEDED, done.message
            assert len(fleet.attempts(task.id)) == 1  # the CLI's retry, not the engine's
            again = control.read_info(fleet.env)
            assert again is not None and again.pid != first.pid
            assert again.port == first.port  # the workers' base URL still reaches it
            assert len(ep.message_requests()) >= 2
        finally:
            control.stop(fleet.env)


def test_a_parked_endpoint_gets_no_request_while_workers_ask(git_repo: Path,
                                                            claude_bin: str) -> None:
    quick = {"real_turns": True, "turns": ["done"]}
    with ScriptedEndpoint({"default": quick}) as ep:
        fleet = gateway_fleet(ep, claude_bin, max_attempts=1)
        words = "Usage limit reached for 5 hour. Your limit will reset at 2026-12-01 00:14:10"
        park = {"parked_until": time.time() + 3600, "park_reason": "5-hour window, code 1308",
                "park_message": words}
        through = fleet.supervisor.gateway.through

        def parked_at_launch(*args: Any, **kwargs: Any) -> str | None:
            # the endpoint is parked right after the attempt got its token, before its
            # runner starts: every request its worker makes meets the closed window
            token = through(*args, **kwargs)
            fleet.store.change_endpoint("default", lambda _s: park)
            return token

        fleet.supervisor.gateway.through = parked_at_launch  # type: ignore[method-assign]
        try:
            (task,) = fleet.submit(TaskSpec(prompt="answer", repo=git_repo))
            drive(fleet, lambda: bool(fleet.attempts(task.id))
                  and fleet.attempts(task.id)[-1].finished_at is not None, timeout=120)

            def gated_count() -> int:
                status = control.read_status(fleet.env) or {}
                return int(status.get("endpoints", {}).get("default", {}).get("gated", 0))

            deadline = time.monotonic() + 10  # status.json is written every 0.2 s
            while gated_count() == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            gated = gated_count()
        finally:
            control.stop(fleet.env)
        # nothing reached the endpoint (the first request came after the park), and the
        # task ends as a 1308 direct would have
        assert ep.message_requests() == []
        assert gated == 1  # x-should-retry false: the CLI did not retry into the window
        done = fleet.get_task(task.id)
        # read as the provider's own 1308 is read direct: the window, its code, its words
        assert "code 1308" in (done.message or "") and words in (done.message or ""), \
            done.message
        assert done.message.startswith("z.ai (429): ")


@pytest.mark.caged  # a caged worker (the default) through the gateway (the default)
def test_a_worker_finds_the_key_in_no_process_of_the_machine(git_repo: Path,
                                                             claude_bin: str) -> None:
    # a key of this test only (test_fleet's KEY may be in a direct worker of another test)
    key = f"sk-gateway-scan-{os.getpid()}-{time.monotonic_ns()}"
    half = len(key) // 2
    # the pattern is put together in a file, so no command line of the worker holds the key
    scan = {"real_turns": True, "turns": [
        [{"type": "tool_use", "name": "Bash", "input": {
            "command": f"printf '%s%s' '{key[:half]}' '{key[half:]}' > pattern; "
                       "grep -l -a -F -f pattern /proc/[0-9]*/environ /proc/[0-9]*/cmdline "
                       "2>/dev/null > found.txt; ls /proc | grep -c '^[0-9]' > seen.txt;"
                       " true",
            "description": "look for the key in every process"}}],
        "done"]}
    with ScriptedEndpoint({"default": scan}) as ep:
        fleet = gateway_fleet(ep, claude_bin)
        fleet.env["ANTHROPIC_AUTH_TOKEN"] = key
        try:
            (task,) = fleet.submit(TaskSpec(prompt="look", repo=git_repo))
            drive(fleet, settled(fleet, task.id), timeout=120)
            done = fleet.get_task(task.id)
            assert done.state == TaskState.SUCCEEDED, done.message
            info = control.read_info(fleet.env)
            assert info is not None  # the gateway, holding the key, ran meanwhile
            assert {r.auth_sha256 for r in ep.message_requests()} \
                == {hashlib.sha256(key.encode()).hexdigest()}
        finally:
            control.stop(fleet.env)
    assert done.worktree is not None
    # (in the worktree: the cage lets a worker write nowhere else of the host's)
    assert int((done.worktree / "seen.txt").read_text()) > 2  # it could look
    assert (done.worktree / "found.txt").read_text() == ""


def test_a_key_set_between_two_tasks_reaches_the_endpoint_without_a_stop(
        git_repo: Path, claude_bin: str) -> None:
    """`fleet-tui key set` while the gateway runs (holding the old key): the engine hands
    the new one over at the next attempt's start, and that attempt's requests reach the
    endpoint with it; the same gateway process, no `gateway stop`."""
    import subprocess
    import sys

    def key_set(value: str) -> None:
        done = subprocess.run([sys.executable, "-m", "fleet_tui.cli", "key", "set"],
                              input=value + "\n", capture_output=True, text=True,
                              env=os.environ, timeout=60)
        assert done.returncode == 0, done.stderr
        assert value not in done.stdout + done.stderr

    old, new = (f"sk-gateway-{which}-{os.getpid()}-{time.monotonic_ns()}"
                for which in ("old", "new"))
    quick = {"real_turns": True, "turns": ["done"]}
    with ScriptedEndpoint({"default": quick}) as ep:
        key_set(old)
        fleet = gateway_fleet(ep, claude_bin, key_sources="keyring", max_attempts=1)
        fleet.env.pop("ANTHROPIC_AUTH_TOKEN", None)
        try:
            (first,) = fleet.submit(TaskSpec(prompt="answer", repo=git_repo))
            drive(fleet, settled(fleet, first.id), timeout=120)
            assert fleet.get_task(first.id).state == TaskState.SUCCEEDED
            before = control.read_info(fleet.env)
            assert before is not None
            served = len(ep.message_requests())
            key_set(new)
            (second,) = fleet.submit(TaskSpec(prompt="answer", repo=git_repo))
            drive(fleet, settled(fleet, second.id), timeout=120)
            done = fleet.get_task(second.id)
            assert done.state == TaskState.SUCCEEDED, done.message
            assert control.read_info(fleet.env) == before  # handed over, not restarted
        finally:
            control.stop(fleet.env)
    digest = {k: hashlib.sha256(k.encode()).hexdigest() for k in (old, new)}
    requests = ep.message_requests()
    assert served >= 1 and len(requests) > served
    assert {r.auth_sha256 for r in requests[:served]} == {digest[old]}
    assert {r.auth_sha256 for r in requests[served:]} == {digest[new]}
    for path in control.folder().iterdir():
        if path.is_file():
            data = path.read_bytes()
            assert old.encode() not in data and new.encode() not in data, path


def test_a_gateway_killed_while_no_engine_runs_is_started_by_the_next_fleet_tui(
        git_repo: Path, claude_bin: str) -> None:
    """The gateway SIGKILLed while a worker streams and no engine runs (the panel closed):
    the next fleet-tui process (here `fleet-tui ls`) starts it again on its port, and the
    worker's own retry finishes the task with nothing else running; killed again with
    nothing running at all, `fleet-tui run` starts a new one for its worker. The key is
    the keyring's (the fleet's own, which the new gateway reads itself): a key of the
    starting shell's environment is that shell's alone, never taken from `ls`'s."""
    import subprocess
    import sys

    from endpoint_helpers import cli_env, run_cli

    slow = {"real_turns": True, "delay": 0.5,
            "turns": ["an answer streamed slowly enough for the gateway to die in the "
                      "middle of it while no engine looks"]}
    with ScriptedEndpoint({"default": slow}) as ep:
        env = cli_env(ep.url, claude_bin, None, FLEET_WORKER_GATEWAY="1",
                      FLEET_WORKER_KEY_SOURCES="keyring")
        env.pop("CLAUDE_CODE_MAX_RETRIES")
        stored = subprocess.run([sys.executable, "-m", "fleet_tui.cli", "key", "set"],
                                input=KEY + "\n", capture_output=True, text=True, env=env,
                                timeout=60)
        assert stored.returncode == 0, stored.stderr
        fleet = gateway_fleet(ep, claude_bin, max_attempts=1, key_sources="keyring")
        fleet.env.pop("ANTHROPIC_AUTH_TOKEN", None)
        try:
            (task,) = fleet.submit(TaskSpec(prompt="answer", repo=git_repo))
            drive(fleet, lambda: bool(ep.message_requests()), timeout=60)
            del fleet  # no engine from here: only the detached runner and the gateway
            first = control.read_info()
            assert first is not None
            os.kill(first.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while control.read_info() is not None:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            listed = run_cli(env, git_repo, "ls")
            assert listed.returncode == 0, listed.stderr
            again = control.read_info()
            assert again is not None and again.pid != first.pid
            assert again.port == first.port  # the worker's base URL reaches it
            # the worker's retry, with no engine: the answer comes through the new one
            deadline = time.monotonic() + 120
            while not ep.message_requests() or len(ep.message_requests()) < 2 \
                    or (control.read_status() or {}).get("endpoints", {}) \
                    .get("default", {}).get("served", 0) < 1:
                assert time.monotonic() < deadline, "the worker never came back"
                time.sleep(0.1)
            deadline = time.monotonic() + 120
            while True:  # `show` is a pass of its own: it finishes the attempt that ended
                shown = json.loads(run_cli(env, git_repo, "show", task.id, "--json").stdout)
                if shown["state"] not in ("running", "queued", "stalled", "waiting"):
                    break
                assert time.monotonic() < deadline, shown
                time.sleep(0.5)
            assert shown["state"] == "succeeded", shown
            assert len(shown["attempts"]) == 1  # the CLI's retry, not the engine's
            # killed again with nothing running: the next run starts one for its worker
            os.kill(again.pid, signal.SIGKILL)
            quick = run_cli(env, git_repo, "run", "answer", "--wait", "--json", timeout=180)
            assert quick.returncode == 0, quick.stderr
            assert json.loads(quick.stdout)[0]["state"] == "succeeded"
            third = control.read_info()
            assert third is not None and third.pid not in (first.pid, again.pid)
        finally:
            control.stop()
