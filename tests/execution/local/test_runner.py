"""The runner with the real claude binary against the scripted endpoint: records, signals,
process cleanup, launcher failures, and no key anywhere it writes."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from proc_helpers import commands_in

from fleet_tui.core import stream
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.execution.worker.attemptlog import (
    EVENTS_FILE,
    EXIT_FILE,
    RUNNER_FILE,
    SPEC_FILE,
    STDERR_FILE,
    AttemptLog,
    read_json,
    write_json_atomic,
)
from fleet_tui.execution.worker.runner import RUNNER_MODULE, TOKEN_ENV, RunSpec, claude_args
from fleet_tui.system import procs

KEY = "sk-runner-test-SECRET-7f3a9c"
ROOT = str(Path(__file__).resolve().parents[3])

SLEEPY = [[{"type": "tool_use", "name": "Bash",
            "input": {"command": "setsid sleep 317 </dev/null >/dev/null 2>&1 & sleep 316",
                      "description": "wait"}}],
          "never reached"]
WRITER = [[{"type": "tool_use", "name": "Bash",
            "input": {"command": "echo runner > out.txt", "description": "write"}}],
          "wrote out.txt"]


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint({"default": WRITER, "sleepy": SLEEPY}) as ep:
        yield ep


def _start(tmp_path: Path, claude: str, url: str, prompt: str, *, key: str | None = KEY,
           settings: dict[str, object] | None = None, env_extra: dict[str, str] | None = None,
           **spec_fields: object) -> tuple[subprocess.Popen[bytes], Path]:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    adir = tmp_path / "attempt"
    adir.mkdir(exist_ok=True)
    spec = RunSpec(cwd=str(work), prompt=prompt, config_dir=str(tmp_path / "cfg"),
                   settings={"base_url": url, "claude": claude,
                             "sandbox": os.geteuid() == 0, **(settings or {})},
                   **spec_fields)  # type: ignore[arg-type]
    (adir / SPEC_FILE).write_text(spec.to_json())
    env = dict(os.environ, PYTHONPATH=ROOT, CLAUDE_CODE_MAX_RETRIES="0", **(env_extra or {}))
    if key is not None:
        env["ANTHROPIC_AUTH_TOKEN"] = key
    env["FLEET_WORKER_KEY_SOURCES"] = "env"
    proc = subprocess.Popen([sys.executable, "-m", RUNNER_MODULE, str(adir)], env=env,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    return proc, adir


def _sleepers(where: Path, *names: str) -> list[int]:
    """The sleeps this test's claude started: their command line is one of names and they
    work under `where` (the test's tmp_path). Another test run on the machine runs the same
    sleeps; those are neither counted nor killed."""
    return commands_in(where, *names)


def _wait(pred, timeout: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return bool(pred())


def _no_key_in(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def test_claude_args_stream_json_max_turns_resume() -> None:
    spec = RunSpec(cwd="/w", prompt="p", config_dir="/c", max_turns=3, resume="sid-1",
                   args=["--allowedTools", "Read"])
    assert claude_args(spec) == ["--output-format", "stream-json", "--verbose",
                                 "--input-format", "stream-json", "--replay-user-messages",
                                 "--max-turns", "3", "--resume", "sid-1",
                                 "--allowedTools", "Read"]
    assert RunSpec.from_json(spec.to_json()) == spec


def test_write_json_atomic_leaves_no_temporary(tmp_path: Path) -> None:
    write_json_atomic(tmp_path / "x.json", {"a": 1})
    write_json_atomic(tmp_path / "x.json", {"a": 2})
    assert read_json(tmp_path / "x.json") == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]
    (tmp_path / "bad.json").write_text("[1")
    assert read_json(tmp_path / "bad.json") is None
    assert read_json(tmp_path / "missing.json") is None


def test_successful_run_writes_events_stderr_and_exit_record(
        tmp_path: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    proc, adir = _start(tmp_path, claude_bin, endpoint.url, "write the file")
    assert proc.wait(timeout=60) == 0
    exit_rec = read_json(adir / EXIT_FILE)
    assert exit_rec is not None
    assert exit_rec["exit_code"] == 0 and exit_rec["signal"] is None
    assert exit_rec["error"] is None and exit_rec["received_signal"] is None
    assert exit_rec["finished_at"] >= exit_rec["started_at"]
    runner = read_json(adir / RUNNER_FILE)
    assert runner is not None
    assert runner["runner_pid"] == proc.pid and runner["runner_start"]
    assert runner["claude_pid"] == exit_rec["claude_pid"] and runner["claude_start"]
    lines = (adir / EVENTS_FILE).read_bytes().splitlines()
    objs = [json.loads(line) for line in lines]
    assert objs[0]["type"] == "system" and objs[0]["subtype"] == "init"
    assert objs[-1]["type"] == "result" and objs[-1]["result"] == "wrote out.txt"
    assert (adir / STDERR_FILE).exists()
    assert (tmp_path / "work" / "out.txt").read_text() == "runner\n"
    # the key reached the endpoint (only in claude's env) and nowhere on disk
    assert endpoint.requests and all(r.has_auth for r in endpoint.requests)
    assert endpoint.requests[0].auth_sha256 == hashlib.sha256(KEY.encode()).hexdigest()
    _no_key_in(adir)
    assert KEY not in (adir / SPEC_FILE).read_text()


def test_an_uncaged_run_leaves_nothing_of_claudes_in_the_temp_folder(
        tmp_path: Path, claude_bin: str, endpoint: ScriptedEndpoint,
        request: pytest.FixtureRequest) -> None:
    """claude keeps a folder for each session under $TMPDIR/claude-UID/<its working
    directory's path> and leaves it when it ends: one more in /tmp for every run of an
    uncaged worker (a caged one's went into the cage's private /tmp). The runner gives an
    uncaged claude a temp folder of the run's own (CLAUDE_CODE_TMPDIR) and removes it; the
    folder of a runner killed outright (its lock free) goes at the next run's start, and
    no other: not one whose lock is held, not one without the lock file."""
    base = Path(tempfile.mkdtemp(prefix="rt-"))  # the runner's temp folder, this test's own
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    dead, running, other = (base / f"fleet-claude-{n}" for n in ("dead0001", "live0001", "x"))
    for folder in (dead, running, other):
        folder.mkdir()
    (dead / "held").write_text("")
    (running / "held").write_text("")
    with open(running / "held", "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a runner that runs holds it
        proc, _adir = _start(tmp_path, claude_bin, endpoint.url, "write the file",
                             settings={"cage": "off"}, env_extra={"TMPDIR": str(base)})
        assert proc.wait(timeout=60) == 0
    assert (tmp_path / "work" / "out.txt").read_text() == "runner\n"  # the Bash tool ran
    # claude makes $TMPDIR/claude-UID itself too (one a user, /tmp's shared one), empty
    shared = base / f"claude-{os.getuid()}"
    assert not shared.exists() or [*shared.iterdir()] == []
    assert sorted(p.name for p in base.iterdir() if p != shared) == sorted(
        [running.name, other.name])
    slug = re.sub(r"[^A-Za-z0-9]", "-", str(tmp_path / "work"))
    assert [*Path(tempfile.gettempdir()).glob(f"claude-{os.getuid()}/{slug}")] == []


def test_sigterm_reaches_claude_and_its_bash_children(
        tmp_path: Path, claude_bin: str, endpoint: ScriptedEndpoint, procs_mode: str) -> None:
    proc, adir = _start(tmp_path, claude_bin, endpoint.url, "[script:sleepy] wait")
    try:
        assert _wait(lambda: len(_sleepers(tmp_path, "sleep 316", "sleep 317")) == 2), \
            (adir / STDERR_FILE).read_text()
        runner = read_json(adir / RUNNER_FILE)
        assert runner is not None
        claude_pid = runner["claude_pid"]
        # claude runs in its own process group, and the runner's tree holds the sleeps
        assert procs.read_stat(claude_pid).pgid == claude_pid  # type: ignore[union-attr]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        assert procs.wait_gone([claude_pid], 5)
        assert _sleepers(tmp_path, "sleep 316", "sleep 317") == []
        exit_rec = read_json(adir / EXIT_FILE)
        assert exit_rec is not None and exit_rec["received_signal"] == "SIGTERM"
        assert exit_rec["exit_code"] != 0 or exit_rec["signal"] is not None
    finally:
        for pid in _sleepers(tmp_path, "sleep 316", "sleep 317"):
            procs.signal_pid(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_claude_dies_with_a_killed_runner(
        tmp_path: Path, claude_bin: str, endpoint: ScriptedEndpoint, procs_mode: str) -> None:
    """On Linux the parent-death signal takes claude with its runner. Off Linux claude lives
    on, carrying the attempt's token, and the sweep by it (the engine's stop_leftovers) is
    what stops it; tests/engine/test_engine_faults.py runs that sweep through the engine."""
    proc, adir = _start(tmp_path, claude_bin, endpoint.url, "[script:sleepy] wait",
                        token="tok-" + os.urandom(6).hex())
    try:
        assert _wait(lambda: len(_sleepers(tmp_path, "sleep 316")) == 1)
        runner = read_json(adir / RUNNER_FILE)
        assert runner is not None
        proc.kill()  # SIGKILL: no chance to forward anything
        proc.wait(timeout=10)
        if procs_mode == "portable":
            token = AttemptLog(adir).spec_token()
            assert token
            assert procs.is_alive(runner["claude_pid"])  # nothing took it with the runner
            found = procs.with_env(TOKEN_ENV, token)
            assert runner["claude_pid"] in found
            procs.stop(found, 2.0)
        assert procs.wait_gone([runner["claude_pid"]], 10)  # PR_SET_PDEATHSIG, or the sweep
        assert not (adir / EXIT_FILE).exists()
        if procs_mode == "linux" and (adir / "cage.json").exists():
            # caged, nothing of the attempt outlives its runner, with no engine to sweep:
            # the cage dies with its host, and so do srt's relays outside it
            token = AttemptLog(adir).spec_token()
            assert _wait(lambda: procs.with_env(TOKEN_ENV, token) == []), [
                (pid, procs.cmdline(pid)) for pid in procs.with_env(TOKEN_ENV, token)]
    finally:
        for pid in _sleepers(tmp_path, "sleep 316", "sleep 317"):
            procs.signal_pid(pid, signal.SIGKILL)


def test_srts_relay_dies_with_a_killed_runner_though_setprivs_answer_comes_late(
        tmp_path: Path, claude_bin: str, endpoint: ScriptedEndpoint, procs_mode: str) -> None:
    """The cage host starts srt's relay (a socat outside the cage) under `setpriv --pdeathsig
    KILL` once an early probe has said this setpriv takes that flag. On a loaded machine the
    probe's answer came after srt had started its relay (a warm host starts srt at once):
    the relay ran without the signal and outlived a killed runner (seen in CI). Here the
    probe answers 2 s late, every time: the relay must still die with the runner."""
    real = shutil.which("setpriv")
    if procs_mode != "linux" or real is None:
        pytest.skip("the parent-death signal and util-linux's setpriv are Linux's")
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "setpriv").write_text(
        "#!/bin/sh\n"  # the probe (`setpriv --pdeathsig KILL -- true`) answers late
        'if [ "$*" = "--pdeathsig KILL -- true" ]; then sleep 2; fi\n'
        f'exec {real} "$@"\n')
    (shims / "setpriv").chmod(0o755)
    token = "tok-" + os.urandom(6).hex()
    proc, adir = _start(tmp_path, claude_bin, endpoint.url, "[script:sleepy] wait", token=token,
                        env_extra={"PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"})
    try:
        assert _wait(lambda: len(_sleepers(tmp_path, "sleep 316")) == 1), \
            (adir / STDERR_FILE).read_text()
        assert (adir / "cage.json").exists()  # caged: the relay is there to outlive it
        relays = [pid for pid in procs.with_env(TOKEN_ENV, token)
                  if procs.cmdline(pid)[:1] == [shutil.which("socat")]]
        assert relays, [procs.cmdline(pid) for pid in procs.with_env(TOKEN_ENV, token)]
        proc.kill()
        proc.wait(timeout=10)
        assert _wait(lambda: procs.with_env(TOKEN_ENV, token) == [], 15), [
            (pid, procs.cmdline(pid)) for pid in procs.with_env(TOKEN_ENV, token)]
    finally:
        for pid in procs.with_env(TOKEN_ENV, token):
            procs.signal_pid(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_missing_key_is_recorded_not_raised(
        tmp_path: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    proc, adir = _start(tmp_path, claude_bin, endpoint.url, "hello", key=None)
    assert proc.wait(timeout=30) == 5
    exit_rec = read_json(adir / EXIT_FILE)
    assert exit_rec is not None
    assert exit_rec["exit_code"] == 5 and exit_rec["claude_pid"] is None
    assert "key" in exit_rec["error"].lower()
    assert endpoint.requests == []


def test_missing_claude_and_bad_spec(tmp_path: Path, endpoint: ScriptedEndpoint) -> None:
    proc, adir = _start(tmp_path, str(tmp_path / "no-such-claude"), endpoint.url, "hello")
    assert proc.wait(timeout=30) == 5
    exit_rec = read_json(adir / EXIT_FILE)
    assert exit_rec is not None and exit_rec["exit_code"] == 5
    assert "claude" in exit_rec["error"]
    _no_key_in(adir)

    (adir / SPEC_FILE).write_text("{not json")
    (adir / EXIT_FILE).unlink()
    out = subprocess.run([sys.executable, "-m", RUNNER_MODULE, str(adir)],
                         env=dict(os.environ, PYTHONPATH=ROOT), timeout=30)
    assert out.returncode == 2
    exit_rec = read_json(adir / EXIT_FILE)
    assert exit_rec is not None and "spec.json" in exit_rec["error"]


def test_usage_errors(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=ROOT)
    for args in ([], [str(tmp_path / "nope")]):
        out = subprocess.run([sys.executable, "-m", RUNNER_MODULE, *args], env=env,
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 2
        assert "Traceback" not in out.stderr and out.stderr.strip()


def test_a_second_runner_on_the_same_attempt_refuses(
        tmp_path: Path, claude_bin: str, endpoint: ScriptedEndpoint, procs_mode: str) -> None:
    """The attempt's lock is held for the runner's whole life: a second runner started on
    the same folder (an engine that thought the first one dead) does nothing at all."""
    first, adir = _start(tmp_path, claude_bin, endpoint.url, "[script:sleepy] wait")
    try:
        assert _wait(lambda: len(_sleepers(tmp_path, "sleep 316", "sleep 317")) == 2)
        before = {p.name: p.read_bytes() for p in adir.iterdir() if p.is_file()}
        env = dict(os.environ, PYTHONPATH=ROOT, ANTHROPIC_AUTH_TOKEN=KEY,
                   FLEET_WORKER_KEY_SOURCES="env")
        second = subprocess.run([sys.executable, "-m", RUNNER_MODULE, str(adir)],
                                env=env, capture_output=True, text=True, timeout=30)
        assert second.returncode == 75
        assert "another runner holds" in second.stderr and "Traceback" not in second.stderr
        after = {p.name: p.read_bytes() for p in adir.iterdir() if p.is_file()}
        # the first runner's claude may still add to its stream meanwhile (a line about its
        # background command came after the snapshot on a loaded machine): only appended,
        # from its one session; every other file not a byte changed, no second claude
        grown = after.pop(EVENTS_FILE, b"")
        old_events = before.pop(EVENTS_FILE, b"")
        assert grown.startswith(old_events)
        inits = [e for e in stream.decode_all(grown) if isinstance(e, stream.Init)]
        assert len(inits) == 1  # (a half-written last line is no event)
        assert after == before
        assert len([r for r in endpoint.requests if r.turn == 0
                    and not (r.prompt or "").startswith("<session>")]) == 1
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=30)
        for pid in _sleepers(tmp_path, "sleep 316", "sleep 317"):
            procs.signal_pid(pid, signal.SIGKILL)


def test_claude_gets_the_prompt_on_stdin_the_token_and_the_users_umask(
        tmp_path: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    """The prompt is not in claude's argv (no 128 KiB limit, not in `ps`); every process of
    the run carries the attempt's token; the runner's own files are private, while what
    claude writes in the worktree keeps the user's umask."""
    prompt = "write the file, please -- with a leading dash line\n-x"
    old = os.umask(0o022)
    try:
        # a token of this run alone: the runner sweeps by it at its end, and another test
        # (or this one in the other process mode, on another xdist worker) runs beside it
        proc, adir = _start(tmp_path, claude_bin, endpoint.url, prompt,
                            token="tok-" + os.urandom(6).hex())
        assert proc.wait(timeout=60) == 0
    finally:
        os.umask(old)
    sent = [r for r in endpoint.requests if r.turn == 0
            and not (r.prompt or "").startswith("<session>")]
    assert [r.prompt for r in sent] == [prompt]
    for name in (EVENTS_FILE, STDERR_FILE, EXIT_FILE, RUNNER_FILE):
        assert (adir / name).stat().st_mode & 0o777 == 0o600, name
    assert (tmp_path / "work" / "out.txt").stat().st_mode & 0o777 == 0o644
    assert list(adir.glob(".*.tmp")) == [] and not (adir / ".exit.reserve").exists()


def test_token_reaches_the_bash_tool(tmp_path: Path, claude_bin: str, procs_mode: str) -> None:
    script = [[{"type": "tool_use", "name": "Bash",
                "input": {"command": "echo \"$FLEET_ATTEMPT_TOKEN\" > token.txt",
                          "description": "token"}}], "done"]
    with ScriptedEndpoint({"default": script}) as ep:
        # a token of this run alone: the runner sweeps by it at its end, and this test in
        # the other process mode may run beside it (xdist); a shared one killed its claude
        token = "tok-" + os.urandom(6).hex()
        proc, _adir = _start(tmp_path, claude_bin, ep.url, "go", token=token)
        assert proc.wait(timeout=60) == 0
    assert (tmp_path / "work" / "token.txt").read_text() == token + "\n"
