"""The real, pinned `claude` binary driven through our launcher against the scripted endpoint.

Every run goes through `plan_launch` (or the installed `fleet-worker` console script), in a
real git repository, with a random key, so these tests check what a user would get: the
events our parser reads, the verdict our classifier gives, and what reached the endpoint.
`CLAUDE_CODE_MAX_RETRIES` is kept small wherever faults are injected so the CLI's own
backoff does not make the suite slow.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleet_tui.core.stream import (
    ApiRetry,
    Event,
    Init,
    Result,
    StreamDecoder,
    Text,
    ToolResult,
    ToolUse,
)
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.execution.worker.launch import LaunchPlan, plan_launch
from fleet_tui.settings.config import load_settings

pytestmark = pytest.mark.real_claude

MODEL = "fleet-test-model-7"
SMALL_MODEL = "fleet-test-small-1"
STREAM_ARGS = ("--output-format", "stream-json", "--verbose")

TOOL_LOOP = [
    [{"type": "text", "text": "I'll add the notes file."},
     {"type": "tool_use", "name": "Write",
      "input": {"file_path": "{cwd}/notes/hello.txt",
                "content": "hello from the scripted endpoint\n"}}],
    [{"type": "tool_use", "name": "Bash",
      "input": {"command": "cat notes/hello.txt && git status --short",
                "description": "Show the new file and the git status"}}],
    "Wrote notes/hello.txt and checked git status.",
]


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def decode(stdout: bytes) -> list[Event]:
    decoder = StreamDecoder()
    return [*decoder.feed(stdout), *decoder.finish()]


def verdict_of(exit_code: int, events: Sequence[Event], stderr: bytes) -> str:
    from fleet_tui.core.outcome import classify

    result = next((e.data for e in reversed(events) if isinstance(e, Result)), None)
    outcome = classify(exit_code=exit_code, result=result,
                       stderr_tail=stderr.decode(errors="replace")[-2000:])
    return str(outcome.verdict)


def console_script(name: str) -> str:
    """An installed console script of this package, next to the running interpreter."""
    candidate = Path(sys.executable).parent / name
    found = str(candidate) if candidate.is_file() else shutil.which(name)
    if found is None:
        msg = f"{name} is not installed; run `bash scripts/test` (it pip-installs the package)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg)
        pytest.skip(msg)
    return found


@dataclass
class Run:
    """One finished worker run."""

    plan: LaunchPlan
    exit_code: int
    stdout: bytes
    stderr: bytes
    seconds: float

    @property
    def events(self) -> list[Event]:
        return decode(self.stdout)

    @property
    def result(self) -> Result:
        found = [e for e in self.events if isinstance(e, Result)]
        assert found, f"no result line; stderr: {self.stderr[-500:]!r}"
        return found[-1]

    @property
    def verdict(self) -> str:
        return verdict_of(self.exit_code, self.events, self.stderr)


class Worker:
    """Launches claude through our launcher, as fleet-worker / the runner would."""

    def __init__(self, claude_bin: str, repo: Path, tmp_path: Path) -> None:
        self.claude_bin = claude_bin
        self.repo = repo
        self.config_dir = tmp_path / "worker-config"
        self.key = "sk-fleet-test-" + secrets.token_hex(16)

    def base_env(self, endpoint_url: str, *, key_var: str = "ANTHROPIC_AUTH_TOKEN",
                 config_dir: Path | None = None,
                 extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)  # conftest made HOME private and scrubbed credentials
        env.update({
            "FLEET_WORKER_CLAUDE": self.claude_bin,
            "FLEET_WORKER_BASE_URL": endpoint_url,
            "FLEET_WORKER_CONFIG_DIR": str(config_dir or self.config_dir),
            "FLEET_WORKER_MODEL": MODEL,
            "FLEET_WORKER_SMALL_MODEL": SMALL_MODEL,
            key_var: self.key,
        })
        env.update(extra or {})
        return env

    def plan(self, endpoint_url: str, prompt: str, args: Sequence[str] = STREAM_ARGS, *,
             cwd: Path | None = None, **kwargs: Any) -> LaunchPlan:
        base = self.base_env(endpoint_url, **kwargs)
        return plan_launch(load_settings(env=base), list(args), prompt=prompt, base_env=base,
                           cwd=cwd or self.repo)

    def run(self, endpoint_url: str, prompt: str, args: Sequence[str] = STREAM_ARGS, *,
            timeout: float = 60, **kwargs: Any) -> Run:
        plan = self.plan(endpoint_url, prompt, args, **kwargs)
        started = time.monotonic()
        proc = subprocess.run(plan.argv, env=plan.env, cwd=plan.cwd, stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=timeout)
        return Run(plan, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)


@pytest.fixture
def worker(claude_bin: str, git_repo: Path, tmp_path: Path) -> Worker:
    return Worker(claude_bin, git_repo, tmp_path)


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(TOOL_LOOP) as ep:
        yield ep


def _interesting(events: Sequence[Event]) -> list[str]:
    out = []
    for e in events:
        if isinstance(e, ToolUse):
            out.append(f"tool_use:{e.name}")
        elif isinstance(e, ToolResult):
            out.append(f"tool_result:{'error' if e.is_error else 'ok'}")
        elif isinstance(e, Init | Text | Result):
            out.append(e.kind)
    return out


# ------------------------------------------------------------------------ 1. tool loop


def test_three_turn_tool_loop(worker: Worker, endpoint: ScriptedEndpoint) -> None:
    run = worker.run(endpoint.url, "Add notes/hello.txt and show git status.")

    assert run.exit_code == 0, run.stderr
    assert (worker.repo / "notes" / "hello.txt").read_text() == \
        "hello from the scripted endpoint\n"
    events = run.events
    assert _interesting(events) == [
        "init", "text", "tool_use:Write", "tool_result:ok", "tool_use:Bash", "tool_result:ok",
        "text", "result"]
    init = next(e for e in events if isinstance(e, Init))
    assert init.cwd == str(worker.repo)
    assert init.model == MODEL
    uses = [e for e in events if isinstance(e, ToolUse)]
    results = [e for e in events if isinstance(e, ToolResult)]
    assert [r.tool_use_id for r in results] == [u.id for u in uses]
    assert uses[0].input["file_path"] == f"{worker.repo}/notes/hello.txt"
    assert results[1].first_line == "hello from the scripted endpoint"
    assert run.result.is_error is False and run.result.num_turns == 3
    assert run.result.result == "Wrote notes/hello.txt and checked git status."
    assert run.verdict == "ok"

    requests = endpoint.message_requests()
    assert [r.turn for r in requests] == [0, 1, 2]
    assert {r.model for r in requests} == {MODEL}
    assert {(r.auth_kind, r.auth_sha256) for r in requests} == {("bearer", sha(worker.key))}
    assert {r.cwd for r in requests} == {str(worker.repo)}
    # what the tools did came back to the endpoint, paired with our tool_use ids
    assert requests[1].tool_results[0].tool_use_id == requests[0].tool_use_ids[0]
    assert "?? notes/" in requests[2].tool_results[0].text
    # the worker ran in its isolated config dir, not the host's
    assert (worker.config_dir / "settings.json").is_file()
    assert any((worker.config_dir / "projects").iterdir())
    assert not (Path.home() / ".claude").exists()
    assert not (Path.home() / ".claude.json").exists()


# -------------------------------------------------------------------- 2-4. API errors


def test_overload_is_retried_then_classified(worker: Worker) -> None:
    with ScriptedEndpoint(TOOL_LOOP, faults=[{"status": 529, "times": None}]) as ep:
        run = worker.run(ep.url, "anything", extra={"CLAUDE_CODE_MAX_RETRIES": "1"})
    retries = [e for e in run.events if isinstance(e, ApiRetry)]
    assert [(r.attempt, r.error_status) for r in retries] == [(1, 529)]
    assert run.exit_code == 1
    assert run.result.is_error and run.result.api_error_status == 529
    assert run.verdict == "overload"
    assert len(ep.message_requests()) == 2


def test_bad_key_fails_as_auth_after_one_request(worker: Worker) -> None:
    with ScriptedEndpoint(TOOL_LOOP, faults=[{"status": 401, "times": None}]) as ep:
        run = worker.run(ep.url, "anything", extra={"CLAUDE_CODE_MAX_RETRIES": "1"})
    assert run.exit_code == 1
    assert run.result.api_error_status == 401
    assert run.verdict == "auth"
    assert len(ep.message_requests()) == 1


def test_rate_limit_is_classified_as_quota(worker: Worker) -> None:
    faults = [{"status": 429, "times": None, "retry_after": 0}]
    with ScriptedEndpoint(TOOL_LOOP, faults=faults) as ep:
        run = worker.run(ep.url, "anything", extra={"CLAUDE_CODE_MAX_RETRIES": "1"})
    assert run.exit_code == 1
    assert run.result.api_error_status == 429
    assert [e.error_status for e in run.events if isinstance(e, ApiRetry)] == [429]
    assert run.verdict == "quota"
    assert len(ep.message_requests()) == 2


def test_dropped_stream_falls_back_to_a_non_streaming_request(worker: Worker) -> None:
    """Observed CLI behaviour the endpoint must support: a stream cut mid-way is retried
    once as a plain JSON request, and the run still succeeds."""
    with ScriptedEndpoint(TOOL_LOOP, faults=[{"kind": "drop", "after_events": 3}]) as ep:
        run = worker.run(ep.url, "notes please", extra={"CLAUDE_CODE_MAX_RETRIES": "1"})
    assert run.exit_code == 0, run.stderr
    assert run.verdict == "ok"
    first, fallback = ep.message_requests()[:2]
    assert (first.fault, first.stream) == ("drop", True)
    assert (fallback.turn, fallback.stream, fallback.fault) == (0, False, None)


def test_hung_endpoint_times_out(worker: Worker) -> None:
    with ScriptedEndpoint(TOOL_LOOP, faults=[{"kind": "hang", "times": None}]) as ep:
        run = worker.run(ep.url, "anything", extra={"CLAUDE_CODE_MAX_RETRIES": "0",
                                                    "API_TIMEOUT_MS": "1000"})
    assert run.exit_code == 1
    assert run.result.is_error and run.result.api_error_status is None
    assert "timed out" in (run.result.result or "").lower()
    assert [r.fault for r in ep.message_requests()] == ["hang"]


# ---------------------------------------------------------- 5-6. permissions, max turns


def test_permission_denial_in_default_mode(worker: Worker) -> None:
    script = [[{"type": "tool_use", "name": "Write",
                "input": {"file_path": "{cwd}/denied.txt", "content": "no\n"}}],
              "Could not write the file."]
    with ScriptedEndpoint(script) as ep:
        run = worker.run(ep.url, "write denied.txt",
                         [*STREAM_ARGS, "--permission-mode", "default"])
    assert run.plan.permission_mode == "default"
    assert run.exit_code == 0, run.stderr
    assert not (worker.repo / "denied.txt").exists()
    denied = [e for e in run.events if isinstance(e, ToolResult)]
    assert len(denied) == 1 and denied[0].is_error and denied[0].tool_name == "Write"
    denials = run.result.permission_denials
    assert [d["tool_name"] for d in denials] == ["Write"]
    assert denials[0]["tool_input"]["file_path"] == f"{worker.repo}/denied.txt"
    (answer,) = ep.message_requests()[1].tool_results
    assert answer.is_error and "permission" in answer.text.lower()


def test_max_turns_is_classified(worker: Worker, endpoint: ScriptedEndpoint) -> None:
    run = worker.run(endpoint.url, "three turns please", [*STREAM_ARGS, "--max-turns", "1"])
    assert run.exit_code == 1
    assert run.result.subtype == "error_max_turns"
    assert run.verdict == "max_turns"
    assert len(endpoint.message_requests()) == 1


# ------------------------------------------------------------------------- 7. secrets


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def _proc_file(pid: int, name: str) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:  # gone meanwhile (e.g. the key pipe's writer, its work done)
        return None


def _files_containing(root: Path, needle: bytes) -> list[Path]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
            hits.append(path)
    return hits


def test_key_never_in_cmdline_nor_in_files(worker: Worker, tmp_path: Path) -> None:
    fleet_worker = console_script("fleet-worker")
    events_file = tmp_path / "logs" / "events.jsonl"
    stderr_file = tmp_path / "logs" / "stderr.log"
    events_file.parent.mkdir()
    # slow enough to look at the running process, fast enough for the suite
    with ScriptedEndpoint(TOOL_LOOP, event_delay=0.05) as ep:
        env = worker.base_env(ep.url)
        with events_file.open("wb") as out, stderr_file.open("wb") as err:
            proc = subprocess.Popen([fleet_worker, *STREAM_ARGS, "Add the notes file."],
                                    cwd=worker.repo, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err)
            try:
                ep.wait_for(1, timeout=30)
                pids = _descendants(proc.pid)
                cmdlines = {p: line for p in pids
                            if (line := _proc_file(p, "cmdline")) is not None}
                environs = {p: env for p in pids
                            if (env := _proc_file(p, "environ")) is not None}
                assert proc.wait(timeout=60) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            requests = ep.message_requests()
    key = worker.key.encode()
    # fleet-worker became claude (exec: same pid); claude read the key from its one-shot
    # pipe (key_helper), so neither its environment nor its children's holds it ...
    assert b"claude" in cmdlines[proc.pid] and proc.pid in environs
    assert [p for p, env in environs.items() if key in env] == []
    # ... and yet the key is what it sent (control: the key did reach claude)
    assert requests and {r.auth_sha256 for r in requests} == {
        hashlib.sha256(key).hexdigest()}
    assert [p for p, line in cmdlines.items() if key in line] == []
    assert b"Add the notes file." in cmdlines[proc.pid]
    # nothing written anywhere (events, stderr, config dir, the repo, HOME) holds the key
    for root in (tmp_path, Path.home()):
        assert _files_containing(root, key) == []
        assert _files_containing(root, key[-16:]) == []
    assert decode(events_file.read_bytes())[-1].kind == "result"
    assert {r.auth_sha256 for r in ep.message_requests()} == {sha(worker.key)}


# ------------------------------------------------------------------------ 8. proxy trap


def test_proxy_trap_records_nothing(worker: Worker, endpoint: ScriptedEndpoint) -> None:
    with ScriptedEndpoint(["trap"]) as trap:
        proxy = {"HTTPS_PROXY": trap.url, "HTTP_PROXY": trap.url, "https_proxy": trap.url,
                 "http_proxy": trap.url, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
        run = worker.run(endpoint.url, "notes please", extra=proxy)
    assert run.exit_code == 0, run.stderr
    assert len(endpoint.message_requests()) == 3
    assert trap.connects == [] and trap.requests == []


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_proxy_trap_control_the_cli_honours_proxy_variables(
        worker: Worker, endpoint: ScriptedEndpoint, scheme: str) -> None:
    """Control for the test above: without NO_PROXY the trap catches the CLI's traffic
    (an absolute-form request for http, a CONNECT for https), so an empty trap means
    nothing tried to leave."""
    with ScriptedEndpoint(["trap"]) as trap:
        proxy = {"HTTPS_PROXY": trap.url, "HTTP_PROXY": trap.url}
        run = worker.run(f"{scheme}://127.0.0.1:{endpoint.port}", "notes please",
                         extra={**proxy, "CLAUDE_CODE_MAX_RETRIES": "0"})
    assert run.exit_code == 1
    assert endpoint.requests == []
    if scheme == "http":
        (caught,) = trap.requests
        assert caught.proxied and caught.path.startswith(endpoint.url + "/v1/messages")
        assert caught.auth_sha256 == sha(worker.key)
    else:
        assert trap.connects == [f"127.0.0.1:{endpoint.port}"]


# ------------------------------------------------------------------------- 9. isolation


def _host_config(home: Path, marker: Path) -> None:
    """A host login with hooks and a settings env token, as on a subscribed machine."""
    hook = {"hooks": [{"type": "command", "command": f"echo hook >> {marker}"}]}
    settings = {
        "hooks": {"SessionStart": [hook], "UserPromptSubmit": [hook],
                  "PreToolUse": [{"matcher": "*", **hook}]},
        "env": {"ANTHROPIC_AUTH_TOKEN": "host-settings-token"},
        "forceLoginMethod": "claudeai",
    }
    (home / ".claude").mkdir(exist_ok=True)
    (home / ".claude" / "settings.json").write_text(json.dumps(settings))
    (home / ".claude.json").write_text(json.dumps({
        "oauthAccount": {"accountUuid": "host-account", "emailAddress": "host@example.invalid",
                         "organizationUuid": "host-org"},
        "hasCompletedOnboarding": True}))


def test_host_config_does_not_leak_into_the_worker(worker: Worker, tmp_path: Path) -> None:
    home = Path.home()
    marker = tmp_path / "hook-ran"
    _host_config(home, marker)
    with ScriptedEndpoint(TOOL_LOOP) as ep:
        run = worker.run(ep.url, "notes please", key_var="GLM_API_KEY")
    assert run.exit_code == 0, run.stderr
    assert run.plan.credential_source == "GLM_API_KEY"
    assert not marker.exists()
    assert {r.auth_sha256 for r in ep.message_requests()} == {sha(worker.key)}


def test_host_config_control_without_isolation_it_would_leak(
        worker: Worker, tmp_path: Path) -> None:
    """Control for the test above: the same host config, read by claude when no
    CLAUDE_CONFIG_DIR isolates it, runs the hooks and sends the host's token."""
    home = Path.home()
    marker = tmp_path / "hook-ran"
    _host_config(home, marker)
    with ScriptedEndpoint(TOOL_LOOP) as ep:
        plan = worker.plan(ep.url, "notes please", ["--output-format", "json"],
                           extra={"CLAUDE_CODE_MAX_RETRIES": "0"})
        env = dict(plan.env)
        del env["CLAUDE_CONFIG_DIR"]  # the naive launcher
        subprocess.run(plan.argv, env=env, cwd=plan.cwd, stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=60)
    assert marker.exists()
    assert sha("host-settings-token") in {r.auth_sha256 for r in ep.message_requests()}


# ------------------------------------------------------------- 10. the original recipe


def test_worker_json_then_collect(worker: Worker, tmp_path: Path) -> None:
    fleet_worker = console_script("fleet-worker")
    fleet_collect = console_script("fleet-collect")
    result_file = tmp_path / "result.json"
    with ScriptedEndpoint(TOOL_LOOP) as ep:
        env = worker.base_env(ep.url)
        with result_file.open("wb") as out:
            done = subprocess.run([fleet_worker, "--output-format", "json", "Add the notes."],
                                  cwd=worker.repo, env=env, stdin=subprocess.DEVNULL,
                                  stdout=out, stderr=subprocess.PIPE, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(result_file.read_text())["is_error"] is False
    collected = subprocess.run([fleet_collect, str(result_file)], capture_output=True,
                               text=True, timeout=30, env=env)
    assert collected.returncode == 0, collected.stderr
    assert collected.stdout.strip() == "Wrote notes/hello.txt and checked git status."
    assert (worker.repo / "notes" / "hello.txt").exists()


def test_worker_json_then_collect_reports_a_failure(worker: Worker, tmp_path: Path) -> None:
    fleet_worker = console_script("fleet-worker")
    fleet_collect = console_script("fleet-collect")
    result_file = tmp_path / "result.json"
    with ScriptedEndpoint(TOOL_LOOP, faults=[{"status": 529, "times": None}]) as ep:
        env = worker.base_env(ep.url, extra={"CLAUDE_CODE_MAX_RETRIES": "0"})
        with result_file.open("wb") as out:
            done = subprocess.run([fleet_worker, "--output-format", "json", "Add the notes."],
                                  cwd=worker.repo, env=env, stdin=subprocess.DEVNULL,
                                  stdout=out, stderr=subprocess.PIPE, timeout=60)
    assert done.returncode == 1
    collected = subprocess.run([fleet_collect, str(result_file)], capture_output=True,
                               text=True, timeout=30, env=env)
    assert collected.returncode != 0
    assert "529" in collected.stdout + collected.stderr


# ------------------------------------------------- parallel workers, different scripts


def test_parallel_workers_play_their_own_scripts(worker: Worker, tmp_path: Path) -> None:
    names = ["alpha", "beta", "gamma"]
    scripts = {name: [[{"type": "tool_use", "name": "Write",
                        "input": {"file_path": f"{{cwd}}/{name}.txt", "content": name}}],
                      f"{name} done"] for name in names}
    procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    with ScriptedEndpoint(scripts) as ep:
        for name in names:
            tree = tmp_path / f"tree-{name}"
            subprocess.run(["git", "worktree", "add", "-q", "-b", f"fleet/{name}", str(tree)],
                           cwd=worker.repo, check=True, capture_output=True)
            plan = worker.plan(ep.url, f"[script:{name}] do your part",
                               ["--output-format", "json"], cwd=tree,
                               config_dir=tmp_path / f"cfg-{name}")
            proc = subprocess.Popen(plan.argv, env=plan.env, cwd=plan.cwd,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
            procs[name] = (proc, tree)
        outputs = {name: p.communicate(timeout=60) for name, (p, _) in procs.items()}
    for name, (proc, tree) in procs.items():
        assert proc.returncode == 0, outputs[name][1]
        assert json.loads(outputs[name][0])["result"] == f"{name} done"
        assert (tree / f"{name}.txt").read_text() == name
        others = [n for n in names if n != name]
        assert not any((tree / f"{o}.txt").exists() for o in others)
        played = ep.message_requests(script=name)
        assert [r.turn for r in played] == [0, 1] and {r.cwd for r in played} == {str(tree)}


# ------------------------------------------------ the endpoint's command line, for real


def test_endpoint_command_serves_a_script_claude_plays_to_the_end(
        worker: Worker, tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": TOOL_LOOP, "delay": 0.001}))
    server = subprocess.Popen([sys.executable, "-m", "fleet_tui.demo.endpoint", "--script",
                               str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        run = worker.run(url, "notes please")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)
    assert server.returncode == 0
    assert run.exit_code == 0, run.stderr
    assert run.result.result == "Wrote notes/hello.txt and checked git status."
    assert (worker.repo / "notes" / "hello.txt").exists()
