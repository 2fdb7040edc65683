"""A running task's route through the gateway is its own: fixed when its attempt
starts, by the fleet-tui process that starts it; a `fleet-tui ls` from a shell with another
key and base URL changes neither. And a token dies with its attempt, with no engine
running: the gateway itself sees the runner end (or die) and refuses the token within 2 s.

Real claude, real `fleet-tui` processes (the CLI as a user runs it), the scripted endpoint."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from endpoint_helpers import cli_env, post, request_body, run_cli, shared

from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import TaskSpec
from fleet_tui.gateway import control
from fleet_tui.store.db import Store
from fleet_tui.system import paths, procs

KEY_ONE = f"sk-route-one-{os.getpid()}"
KEY_OTHER = f"sk-route-other-{os.getpid()}"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def wait_for(check: Any, timeout: float, what: str, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(every)


def gate_step(gate: Path) -> dict[str, Any]:
    """A Bash step that waits until the test says go (so that the worker's next request
    comes after what the test does meanwhile). It first marks that it runs (`at_gate`):
    the answer that asked for it has then reached the worker whole."""
    return {"type": "tool_use", "name": "Bash", "input": {
        "command": f"touch {at_gate(gate)}; while [ ! -e {gate} ]; do sleep 0.1; done; "
                   "echo went",
        "description": "wait for the test"}}


def at_gate(gate: Path) -> Path:
    return gate.with_name(gate.name + ".at")


def test_an_ls_from_another_shell_changes_neither_the_key_nor_the_endpoint_of_a_task(
        git_repo: Path, claude_bin: str, tmp_path: Path) -> None:
    """A task started from a shell with key sk-1 and base URL A; while it runs, `fleet-tui
    ls` from a shell with another key and base URL B, then from one with no key at all:
    every request of the task reaches A with sk-1 (one key hash), none reaches B, and the
    task ends ok."""
    gate = shared(git_repo, "gate") / "go"
    script = {"real_turns": True, "turns": [[gate_step(gate)], [gate_step(gate)], "done"]}
    with ScriptedEndpoint({"default": script}) as a, \
            ScriptedEndpoint({"default": script}) as b:
        env = cli_env(a.url, claude_bin, KEY_ONE, FLEET_WORKER_GATEWAY="1")
        other = cli_env(b.url, claude_bin, KEY_OTHER, FLEET_WORKER_GATEWAY="1")
        keyless = cli_env(b.url, claude_bin, None, FLEET_WORKER_GATEWAY="1")
        run = subprocess.Popen(
            [sys.executable, "-m", "fleet_tui.cli", "run", "answer", "--wait", "--json"],
            cwd=git_repo, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: a.message_requests(), 120, "the task's first request")
            for shell in (other, keyless, other):
                listed = run_cli(shell, git_repo, "ls")
                assert listed.returncode == 0, listed.stderr
            before = len(a.message_requests())
            gate.touch()
            out, err = run.communicate(timeout=180)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
            control.stop()
        assert run.returncode == 0, err
        assert json.loads(out)[0]["state"] == "succeeded", out
    served = a.message_requests()
    assert len(served) > before >= 1  # requests came after the other shells' commands
    assert {r.auth_sha256 for r in served} == {sha(KEY_ONE)}
    assert b.requests == []


def _runner_of(store: Store, task_id: str) -> tuple[int, str | None]:
    """The task's attempt's runner pid and start time, once recorded."""
    def found() -> tuple[int, str | None] | None:
        rows = store._connect().execute(
            "SELECT runner_pid FROM attempts WHERE runner_pid IS NOT NULL AND task_id = ?",
            (task_id,)).fetchall()
        if not rows:
            return None
        pid = int(rows[0][0])
        return pid, procs.start_time(pid)
    result: tuple[int, str | None] = wait_for(found, 60, "the runner's pid")
    return result


def _saved(folder: Path) -> tuple[str, str]:
    token = wait_for(lambda: (folder / "token").is_file()
                     and (folder / "token").read_text(), 120, "the saved token")
    url = (folder / "url").read_text().strip()
    return token, url


def _answer(url: str, token: str) -> int:
    from urllib.parse import urlsplit

    path = urlsplit(url).path.rstrip("/") + "/v1/messages"
    return post(url, request_body(stream=False), headers={"x-api-key": token},
                path=path, timeout=30).status


def _refused_within(url: str, token: str, ended: float, limit: float) -> float:
    """Seconds from `ended` until the gateway refuses the token (401); fails past limit."""
    while True:
        status = _answer(url, token)
        now = time.monotonic()
        if status == 401:
            return now - ended
        assert now - ended < limit, f"the token still served {now - ended:.1f} s after"
        time.sleep(0.05)


def test_a_saved_token_is_refused_within_2_s_of_its_attempts_end_with_no_engine(
        git_repo: Path, claude_bin: str, tmp_path: Path) -> None:
    """A worker's Bash step saves its token (FLEET_WORKER_KEY_HELPER=0); `fleet-tui run`
    without --wait, so no fleet-tui process follows the task: once the runner has ended
    (claude done), the token is refused within 2 s; the same after a SIGKILL of a runner
    in the middle of its run."""
    saved = shared(git_repo, "saved")
    keep = {"type": "tool_use", "name": "Bash", "input": {
        "command": f'printf %s "$ANTHROPIC_AUTH_TOKEN" > {saved}/token.tmp; '
                   f'printf %s "$ANTHROPIC_BASE_URL" > {saved}/url; '
                   f"mv {saved}/token.tmp {saved}/token",
        "description": "save the token"}}
    gate = shared(git_repo, "gate") / "gate"
    scripts = {"default": {"real_turns": True, "turns": [[keep], "done"]},
               # a worker that waits in a Bash step until the test lets it go
               "kill": {"real_turns": True, "turns": [[keep], [gate_step(gate)], "done"]}}
    with ScriptedEndpoint(scripts) as ep:
        # uncaged: the worker must hold its token in its environment (key_helper off); a
        # caged worker always reads it through the one-shot pipe, so its tools never see it
        env = cli_env(ep.url, claude_bin, KEY_ONE, FLEET_WORKER_GATEWAY="1",
                      FLEET_WORKER_KEY_HELPER="0", FLEET_WORKER_CAGE="off")
        store = Store(paths.db_path())
        try:
            started = run_cli(env, git_repo, "run", "answer", "--json")
            assert started.returncode == 0, started.stderr
            pid, start = _runner_of(store, json.loads(started.stdout)[0]["id"])
            token, url = _saved(saved)
            assert _answer(url, token) == 200  # while its attempt runs, it serves
            wait_for(lambda: not procs.is_alive(pid, start), 120, "the runner's end",
                     every=0.01)
            ended = time.monotonic()
            after = _refused_within(url, token, ended, 2.0)
            served = len(ep.message_requests())
            assert control.read_info() is not None  # no engine ran: the gateway did it
            assert after < 2.0

            # SIGKILL of a runner mid-run: its worker waits in a Bash step meanwhile
            (saved / "token").unlink()
            started = run_cli(env, git_repo, "run", "answer [script:kill]", "--json")
            assert started.returncode == 0, started.stderr
            pid, start = _runner_of(store, json.loads(started.stdout)[0]["id"])
            token, url = _saved(saved)
            wait_for(lambda: len(ep.message_requests()) >= served + 2, 60,
                     "the worker in its waiting step")
            assert _answer(url, token) == 200
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not procs.is_alive(pid, start), 10, "the runner's death",
                     every=0.01)
            killed = _refused_within(url, token, time.monotonic(), 2.0)
            assert killed < 2.0
            # the figure of README's reliability table (run with -s to see it)
            print(f"token refused {after:.2f} s after its runner's exit, {killed:.2f} s "
                  "after its SIGKILL")
        finally:
            gate.touch()  # a Bash step left waiting ends
            control.stop()
            store.close()


def test_a_key_env_endpoints_tasks_wait_for_a_fleet_tui_that_has_the_key(
        git_repo: Path, claude_bin: str) -> None:
    """A task on an endpoint whose key is `key_env = "KA_KEY"`, submitted from a shell that
    has it while the endpoint is parked (a window); once the park is over, `fleet-tui show`
    from a shell without KA_KEY does not start it with no key (nor with its own): it waits,
    saying why; the next fleet-tui where KA_KEY is set starts it, and it ends ok. The
    endpoint saw the one key only."""
    from fleet_tui.settings.config import config_file_path

    script = {"real_turns": True, "turns": ["done"]}
    with ScriptedEndpoint({"default": script}) as ep:
        config = config_file_path()
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(f'[endpoints.ka]\nbase_url = "{ep.url}"\nkey_env = "KA_KEY"\n')
        env = cli_env(ep.url, claude_bin, None, FLEET_WORKER_GATEWAY="1", KA_KEY=KEY_ONE)
        keyless = {k: v for k, v in env.items() if k != "KA_KEY"}
        with Store(paths.db_path()) as store:
            store.change_endpoint("ka", lambda _s: {
                "parked_until": time.time() + 3600, "park_reason": "5-hour window, code 1308"})
        try:
            started = run_cli(env, git_repo, "run", "--endpoint", "ka", "answer", "--json")
            assert started.returncode == 0, started.stderr
            (task,) = json.loads(started.stdout)
            assert task["state"] == "queued", task

            def shown(shell: dict[str, str]) -> dict[str, Any]:
                out = run_cli(shell, git_repo, "show", task["id"], "--json")
                assert out.returncode == 0, out.stderr
                found: dict[str, Any] = json.loads(out.stdout)
                return found

            with Store(paths.db_path()) as store:  # the window's reset has come
                store.change_endpoint("ka", lambda _s: {"parked_until": time.time() - 1})
            for _ in range(3):  # passes of the keyless shell: it never starts the task
                waiting = shown(keyless)
                assert waiting["state"] == "queued", waiting
            assert waiting["message"] == ("waits: the key of endpoint ka is $KA_KEY, which "
                                          "is not set where this fleet-tui runs; a fleet-tui "
                                          "started where it is set starts it")
            assert ep.message_requests() == []
            done = wait_for(lambda: (found := shown(env))["state"]
                            not in ("queued", "running", "waiting", "stalled") and found,
                            180, "the task's end", every=0.3)
            assert done["state"] == "succeeded", done
        finally:
            control.stop()
    assert {r.auth_sha256 for r in ep.message_requests()} == {sha(KEY_ONE)}


def test_a_task_whose_key_the_gateway_lost_waits_and_resumes_in_its_session(
        git_repo: Path, claude_bin: str, tmp_path: Path) -> None:
    """`fleet-tui run` (no --wait) from a shell whose environment holds the key, then that
    process gone; the gateway SIGKILLed and started again by a `fleet-tui ls` (which hands
    it no key: the task is not its own). The worker's next request: the gateway does not
    hold its key and the process that owned it has ended, so the attempt stops saying so
    (verdict key, not an overload, no endpoint held) and the task waits; the next pass of
    a fleet-tui with a key resumes it in its session, and it ends ok."""
    gate = shared(git_repo, "gate") / "go"
    script = {"real_turns": True, "turns": [[gate_step(gate)], "done"]}
    with ScriptedEndpoint({"default": script}) as ep:
        env = cli_env(ep.url, claude_bin, KEY_ONE, FLEET_WORKER_GATEWAY="1")
        try:
            started = run_cli(env, git_repo, "run", "answer", "--json")
            assert started.returncode == 0, started.stderr
            (task,) = json.loads(started.stdout)
            # the worker in its Bash step, not still reading the answer that asked for it
            # (a stream the SIGKILL cuts ends the attempt unreachable: seen, 2 runs in 6)
            wait_for(at_gate(gate).exists, 120, "the worker at its gate")
            first = control.read_info()
            assert first is not None
            os.kill(first.pid, signal.SIGKILL)
            wait_for(lambda: control.read_info() is None, 10, "the gateway's death")
            listed = run_cli(env, git_repo, "ls")
            assert listed.returncode == 0, listed.stderr
            again = control.read_info()
            assert again is not None and again.pid != first.pid
            gate.touch()

            def shown() -> dict[str, Any]:
                out = run_cli(env, git_repo, "show", task["id"], "--json")
                assert out.returncode == 0, out.stderr
                found: dict[str, Any] = json.loads(out.stdout)
                return found

            done = wait_for(lambda: (found := shown())["state"] == "succeeded" and found,
                            180, "the task's end", every=0.3)
        finally:
            control.stop()
    attempts = done["attempts"]
    assert [a["verdict"] for a in attempts] == ["key", "ok"], attempts
    assert attempts[1]["kind"] == "resume", attempts
    assert "which has ended" in attempts[0]["message"], attempts[0]
    assert {r.auth_sha256 for r in ep.message_requests()} == {sha(KEY_ONE)}
    with Store(paths.db_path()) as store:
        state = store.get_endpoint("default")
    assert state is None or state.held is None, state


def test_an_engines_route_used_again_after_its_key_was_forgotten_is_handed_again(
        git_repo: Path, claude_bin: str) -> None:
    """The gateway forgets a route's key once no live token maps to it; the same engine's
    next attempt on that route (the same key variable, URL and engine) hands it again at
    its start, so that attempt is served at once, not after a wait for the key."""
    from test_fleet import KEY, drive, make_fleet, settled

    from fleet_tui.gateway.server import KEY_WAIT
    from fleet_tui.store.db import TaskState

    quick = {"real_turns": True, "turns": ["done"]}
    with ScriptedEndpoint({"default": quick}) as ep:
        fleet = make_fleet(ep, claude_bin, gateway=True, max_attempts=1)
        try:
            for n in range(2):
                (task,) = fleet.submit(TaskSpec(prompt="answer", repo=git_repo))
                began = time.monotonic()
                drive(fleet, settled(fleet, task.id), timeout=120)
                took = time.monotonic() - began
                assert fleet.get_task(task.id).state == TaskState.SUCCEEDED
                if n == 1:
                    assert took < KEY_WAIT, took
                # its token revoked: the gateway's next look forgets the route's key
                time.sleep(1.5)
        finally:
            control.stop(fleet.env)
    assert {r.auth_sha256 for r in ep.message_requests()} == {sha(KEY)}
