"""outcome.py: one verdict per finished run, from real CLI outputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fleet_tui.core.outcome import Outcome, Verdict, classify, find_result
from fleet_tui.core.stream import Result, decode_all
from fleet_tui.execution.worker.attemptlog import STDERR_TAIL

SAMPLES = Path(__file__).resolve().parents[1] / "support" / "fixtures" / "stream-json"
CASES = sorted(p.name for p in SAMPLES.iterdir() if p.is_dir())

# Concrete verdicts per real run. The "ok" ones ran to the end with is_error false and a
# result text; root_permdefault is ok too (its result is a success), and its message
# reports the denied Write.
EXPECTED = {
    "nonroot_custom_script": Verdict.OK,
    "nonroot_stream": Verdict.OK,
    "root_401": Verdict.AUTH,
    "root_429": Verdict.QUOTA,
    "root_500": Verdict.OVERLOAD,
    "root_529_default": Verdict.OVERLOAD,
    "root_529_retries0_json": Verdict.OVERLOAD,
    "root_529_retries2": Verdict.OVERLOAD,
    "root_529_then_ok": Verdict.OK,
    "root_apikey_401": Verdict.AUTH,
    "root_apikey_ok": Verdict.OK,
    "root_bash_output": Verdict.OK,  # a Bash step failed, the run did not
    "root_json": Verdict.OK,
    "root_noflags": Verdict.OK,
    "root_only_nonessential": Verdict.OK,
    "root_permdefault": Verdict.OK,
    "root_sandbox_stream": Verdict.OK,
    "root_timeout": Verdict.TIMEOUT,
    # CLI 2.1.197 against a closed port of 127.0.0.1 (CLAUDE_CODE_MAX_RETRIES=0)
    "root_unreachable": Verdict.UNREACHABLE,
    "zai_1308_window": Verdict.WINDOW,  # z.ai's 5-hour window (429, code 1308)
}


def sample(case: str) -> tuple[bytes, int, str]:
    d = SAMPLES / case
    (out,) = [p for p in d.iterdir() if p.name.startswith("stdout.json")]
    return out.read_bytes(), json.loads((d / "exit.json").read_text())["rc"], \
        (d / "stderr").read_text()


def real_result(case: str) -> dict[str, Any]:
    found = find_result(sample(case)[0])
    assert found is not None
    return found


def test_every_sample_has_a_verdict() -> None:
    assert sorted(EXPECTED) == CASES


@pytest.mark.parametrize("case", CASES)
def test_real_sample_verdicts(case: str) -> None:
    data, rc, stderr = sample(case)
    result = find_result(data)
    assert result is not None and result["type"] == "result"
    out = classify(exit_code=rc, result=result, stderr_tail=stderr)
    assert out.verdict == EXPECTED[case]
    assert out.message and "\n" not in out.message
    assert out.session_id == result["session_id"]
    assert out.num_turns == result["num_turns"]
    assert out.api_error_status == result["api_error_status"]
    # exit code unknown (fleet-collect) gives the same verdict
    assert classify(exit_code=None, result=result).verdict == EXPECTED[case]
    # so does the parser's Result event
    final = decode_all(data)[-1]
    assert isinstance(final, Result)
    assert classify(exit_code=rc, result=final).verdict == EXPECTED[case]
    json.dumps(out.to_json())


def test_messages_say_what_to_do() -> None:
    auth = classify(exit_code=1, result=real_result("root_401"))
    assert auth.message == ("the endpoint rejected the key (401): check FLEET_WORKER_BASE_URL "
                            "and the key; run fleet-doctor --live")
    assert "FLEET_WORKER_SMALL_MODEL" in classify(exit_code=1,
                                                  result=real_result("root_529_default")).message
    assert "429" in classify(exit_code=1, result=real_result("root_429")).message
    assert "API_TIMEOUT_MS" in classify(exit_code=1, result=real_result("root_timeout")).message
    denied = classify(exit_code=0, result=real_result("root_permdefault"))
    assert "denied" in denied.message and "Write" in denied.message


# ------------------------------------------------------------ variants of real results


def variant(**changes: Any) -> dict[str, Any]:
    result = real_result("nonroot_stream")
    result.update(changes)
    return result


@pytest.mark.parametrize(("changes", "expected"), [
    # defect 3: ran out of turns (whatever is_error says), or returned nothing
    ({"subtype": "error_max_turns", "is_error": True, "result": None,
      "stop_reason": "tool_use", "terminal_reason": "max_turns"}, Verdict.MAX_TURNS),
    ({"subtype": "error_max_turns", "is_error": False}, Verdict.MAX_TURNS),
    ({"terminal_reason": "max_turns"}, Verdict.MAX_TURNS),
    ({"result": ""}, Verdict.EMPTY),
    ({"result": "  \n"}, Verdict.EMPTY),
    ({"result": None}, Verdict.EMPTY),
    # subtype is never trusted alone
    ({"is_error": True, "api_error_status": 403}, Verdict.AUTH),
    ({"is_error": True, "api_error_status": 502}, Verdict.OVERLOAD),
    ({"is_error": True, "api_error_status": 529}, Verdict.OVERLOAD),
    ({"is_error": True, "api_error_status": 429}, Verdict.QUOTA),
    ({"is_error": True, "api_error_status": 404}, Verdict.REFUSED),
    ({"is_error": True, "api_error_status": 408}, Verdict.TIMEOUT),
    ({"is_error": True, "api_error_status": None, "result": "Request timed out"},
     Verdict.TIMEOUT),
    ({"is_error": True, "api_error_status": None,
      "result": "API Error: 529 Overloaded. This is a server-side issue"}, Verdict.OVERLOAD),
    ({"is_error": True, "api_error_status": None, "result": "something broke"},
     Verdict.CRASHED),
    # CLI 2.1.197's words for a stream cut after a block of it ended (a gateway SIGKILLed):
    # transient, as a refused connection is, not a crash
    ({"is_error": True, "api_error_status": None, "result": "API Error: Connection closed "
      "mid-response. The response above may be incomplete."}, Verdict.UNREACHABLE),
    ({"subtype": "error_during_execution", "is_error": False}, Verdict.CRASHED),
    ({"is_error": False, "api_error_status": None}, Verdict.OK),
])
def test_result_variants(changes: dict[str, Any], expected: Verdict) -> None:
    assert classify(exit_code=None, result=variant(**changes)).verdict == expected


def test_exit_code_contradicting_a_success_is_not_ok() -> None:
    assert classify(exit_code=0, result=variant()).verdict == Verdict.OK
    assert classify(exit_code=1, result=variant()).verdict == Verdict.CRASHED


def test_caller_flags_and_signals() -> None:
    ok = variant()
    assert classify(exit_code=-15, killed=True).verdict == Verdict.KILLED
    assert "SIGTERM" in classify(exit_code=None, signal=15, killed=True).message
    assert classify(exit_code=None, signal=9).verdict == Verdict.KILLED
    assert classify(exit_code=-9).verdict == Verdict.KILLED
    assert classify(exit_code=-9, timed_out=True).verdict == Verdict.TIMEOUT
    assert "wall-clock" in classify(exit_code=-9, timed_out=True).message
    # a kill or a timeout decides, whatever claude printed after the
    # signal (2.1.197 answers SIGTERM with one more turn, a success result and exit 0)
    assert classify(exit_code=0, result=ok, killed=True).verdict == Verdict.KILLED
    assert classify(exit_code=0, result=ok, timed_out=True).verdict == Verdict.TIMEOUT
    # ...unless the caller knows the result was complete before it asked for the stop
    assert classify(exit_code=0, result=ok, killed=True,
                    finished_before_stop=True).verdict == Verdict.OK
    assert classify(exit_code=0, result=ok, timed_out=True,
                    finished_before_stop=True).verdict == Verdict.OK
    assert classify(exit_code=1, result=ok, killed=True,
                    finished_before_stop=True).verdict == Verdict.KILLED
    # a signal from outside (not ours) after a clean result: the result stands
    assert classify(exit_code=None, signal=15, result=ok).verdict == Verdict.OK
    assert classify(exit_code=-15, result=variant(result=""), killed=True).verdict == \
        Verdict.KILLED


@pytest.mark.parametrize("status", ["²", "429²", "١٢٣", "4" * 40, 10**40, 1e300, float("nan"),
                                    [429], {"code": 429}, True])
def test_odd_api_error_status_never_raises(status: Any) -> None:
    """`"api_error_status": "²"` raised ValueError from int("²") (and
    "²".isdigit() is true) in the CLI, the panel and fleet-collect."""
    failed = classify(exit_code=1, result=variant(is_error=True, api_error_status=status,
                                                  result="something broke"))
    assert failed.verdict == Verdict.CRASHED and failed.api_error_status is None
    assert "something broke" in failed.message
    # the status in the text is still read (ASCII digits only)
    quota = classify(exit_code=1, result=variant(is_error=True, api_error_status=status,
                                                 result="API Error: 429 rate limited"))
    assert quota.verdict == Verdict.QUOTA
    assert classify(exit_code=0, result=variant(api_error_status=status)).verdict == Verdict.OK
    json.dumps(failed.to_json(), allow_nan=False)


def test_an_exit_record_of_the_wrong_types_is_unknown_not_a_crash() -> None:
    """The engine reads exit.json back from disk: its values are untrusted too."""
    ok = variant()
    for exit_code, signal_ in [("0", None), ([0], {}), (2**80, "TERM"), (None, 10**30),
                               (float("nan"), -3), (True, 99999)]:
        out = classify(exit_code=exit_code, signal=signal_, result=ok)
        assert out.verdict == Verdict.OK, (exit_code, signal_)
        killed = classify(exit_code=exit_code, signal=signal_, result=ok, killed=True)
        assert killed.verdict == Verdict.KILLED
        assert classify(exit_code=exit_code, signal=signal_).verdict in (Verdict.CRASHED,
                                                                        Verdict.KILLED)
    assert classify(exit_code="0", result=ok).exit_code == 0


def test_outcome_holds_only_what_json_and_a_terminal_take() -> None:
    odd = variant(result="done \ud800", session_id="s\udfff",
                  usage={"input_tokens": float("nan"), "deep": [[[[[[[[1]]]]]]]],
                         "big": 10**40, 7: "int key", "cache": {"x": float("inf")}},
                  permission_denials=[{"tool_name": {"a": [1]}}, {"tool_name": "W\nrite"},
                                      "not a dict"])
    out = classify(exit_code=0, result=odd)
    assert out.verdict == Verdict.OK
    assert out.result_text == "done \ufffd" and out.session_id == "s\ufffd"
    assert "\n" not in out.message and "W rite" in out.message
    text = json.dumps(out.to_json(), allow_nan=False, ensure_ascii=False)
    text.encode("utf-8")
    assert out.usage["input_tokens"] is None and out.usage["big"] is None
    assert out.usage["cache"] == {"x": None}


def test_no_result_line_is_crashed_with_the_stderr_tail() -> None:
    out = classify(exit_code=1, stderr_tail="warming up\nTypeError: x is undefined\n\n")
    assert out.verdict == Verdict.CRASHED
    assert "code 1" in out.message and "TypeError: x is undefined" in out.message
    assert classify(exit_code=0).verdict == Verdict.CRASHED
    assert "unknown code" in classify(exit_code=None).message


def test_outcome_to_json() -> None:
    out = classify(exit_code=1, result=real_result("root_429"))
    data = json.loads(json.dumps(out.to_json()))
    assert data["verdict"] == "quota" and data["api_error_status"] == 429
    assert data["exit_code"] == 1 and data["usage"]["output_tokens"] == 0
    assert isinstance(out, Outcome) and not out.ok


# --------------------------------------------------------------------------- refused, for real


def _run_claude(claude_bin: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real claude; it refuses before any request (the base URL is never reached)."""
    cfg = tmp_path / "cfg"
    cfg.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "IS_SANDBOX"}
    env.update(CLAUDE_CONFIG_DIR=str(cfg), ANTHROPIC_BASE_URL="http://127.0.0.1:9",
               ANTHROPIC_AUTH_TOKEN="sk-test-not-a-key",
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_TELEMETRY="1")
    return subprocess.run([claude_bin, "-p", *args, "say hi"], env=env, cwd=tmp_path,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)


@pytest.mark.real_claude
@pytest.mark.skipif(os.geteuid() != 0, reason="claude refuses bypassPermissions only as root")
def test_real_root_refusal(claude_bin: str, tmp_path: Path) -> None:
    run = _run_claude(claude_bin, tmp_path, "--permission-mode", "bypassPermissions",
                      "--output-format", "stream-json", "--verbose")
    assert run.returncode == 1 and find_result(run.stdout) is None
    out = classify(exit_code=run.returncode, result=None, stderr_tail=run.stderr)
    assert out.verdict == Verdict.REFUSED
    assert "root/sudo" in out.message and "FLEET_WORKER_SANDBOX=1" in out.message


@pytest.mark.real_claude
def test_real_non_root_bypass_is_accepted(claude_bin: str) -> None:
    """The counterpart of the root refusal, run on every machine (as root, claude runs as
    nobody): with bypassPermissions and no IS_SANDBOX a normal user's claude answers."""
    from nonroot import non_root

    from fleet_tui.demo.endpoint import ScriptedEndpoint

    with ScriptedEndpoint(["Hello from the endpoint."]) as endpoint, non_root() as user:
        (user.root / "cfg").mkdir()
        env = {k: v for k, v in user.env.items() if k != "IS_SANDBOX"}
        env.update(CLAUDE_CONFIG_DIR=str(user.root / "cfg"), ANTHROPIC_BASE_URL=endpoint.url,
                   ANTHROPIC_AUTH_TOKEN="sk-test-not-a-key", CLAUDE_CODE_MAX_RETRIES="0",
                   CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_TELEMETRY="1")
        user.own()
        run = user.run([claude_bin, "-p", "--permission-mode", "bypassPermissions",
                        "--output-format", "stream-json", "--verbose", "say hi"], env=env)
    result = find_result(run.stdout)
    assert run.returncode == 0 and result is not None, run.stderr[-2000:]
    out = classify(exit_code=run.returncode, result=result, stderr_tail=run.stderr)
    assert out.verdict == Verdict.OK, out.message
    assert "Hello from the endpoint." in out.message


@pytest.mark.real_claude
@pytest.mark.parametrize("args", [("--no-such-flag",), ("--output-format", "stream-json")])
def test_real_bad_arguments_are_refused(claude_bin: str, tmp_path: Path,
                                        args: tuple[str, ...]) -> None:
    run = _run_claude(claude_bin, tmp_path, *args)
    assert run.returncode != 0 and find_result(run.stdout) is None
    out = classify(exit_code=run.returncode, result=None, stderr_tail=run.stderr)
    assert out.verdict == Verdict.REFUSED, run.stderr
    assert "refused to start" in out.message


# ------------------------------------------------------------- crashes: the line that says why
# a crashed claude's verdict quoted its last stderr line, Bun's banner
# ("Bun v1.4.0 (Linux x64 baseline)"), instead of the line saying what went wrong.


def _without(names: tuple[str, ...], where: Path) -> str:
    """A PATH of symlinks to every command on this machine's PATH except `names`."""
    where.mkdir()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for entry in os.listdir(folder):
            link = where / entry
            if entry not in names and not link.exists():
                link.symlink_to(Path(folder) / entry)
    return str(where)


@pytest.mark.real_claude
def test_real_uncaught_bun_error_quotes_the_error_not_the_banner(claude_bin: str,
                                                                 tmp_path: Path) -> None:
    """2.1.197 with CLAUDE_CODE_SUBPROCESS_ENV_SCRUB=1 and no bubblewrap dies with Bun's
    uncaught-error report: a minified source excerpt, a caret, `error: bubblewrap is
    required ...`, stack frames, a blank line, then `Bun v1.4.0 (Linux x64 baseline)`."""
    path = _without(("bwrap", "socat"), tmp_path / "bin")
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "IS_SANDBOX"}
    env.update(PATH=path, CLAUDE_CONFIG_DIR=str(cfg), ANTHROPIC_BASE_URL="http://127.0.0.1:9",
               ANTHROPIC_AUTH_TOKEN="sk-test-not-a-key", CLAUDE_CODE_SUBPROCESS_ENV_SCRUB="1",
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_TELEMETRY="1")
    run = subprocess.run([claude_bin, "-p", "--output-format", "stream-json", "--verbose",
                          "say hi"], env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and find_result(run.stdout) is None
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("Bun v"), run.stderr[-2000:]  # the shape the issue saw
    out = classify(exit_code=run.returncode, stderr_tail=run.stderr[-STDERR_TAIL:])
    assert out.verdict == Verdict.CRASHED
    assert "error: bubblewrap is required" in out.message, out.message
    assert "Bun v" not in out.message


@pytest.mark.real_claude
def test_real_bun_panic_is_a_crash_with_its_panic_line(claude_bin: str,
                                                       tmp_path: Path) -> None:
    """A segfault in claude (Bun's own crash report, provoked with SIGSEGV): crashed, with
    the panic line, not "terminated ... killed from outside?" nor the report's URL."""
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "IS_SANDBOX"}
    env.update(CLAUDE_CONFIG_DIR=str(cfg), ANTHROPIC_BASE_URL="http://127.0.0.1:9",
               ANTHROPIC_AUTH_TOKEN="sk-test-not-a-key",
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_TELEMETRY="1")
    proc = subprocess.Popen([claude_bin, "-p", "--output-format", "stream-json", "--verbose",
                             "say hi"], env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert b'"subtype":"init"' in proc.stdout.readline()  # running: its runtime is up
        proc.send_signal(signal.SIGSEGV)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    tail = stderr.decode("utf-8", "replace")[-STDERR_TAIL:]
    assert proc.returncode == -signal.SIGSEGV and "panic(main thread)" in tail
    out = classify(exit_code=proc.returncode, stderr_tail=tail)
    assert out.verdict == Verdict.CRASHED
    assert "SIGSEGV" in out.message and "panic(main thread): Segmentation fault" in out.message
    assert "bun.report" not in out.message


BUN_UNCAUGHT = """\
12 |   const fd = openSync(path, "w");
                  ^
{error}
      at writeConfig (/$bunfs/root/src/entrypoints/cli.js:477:6115)
      at <anonymous> (/$bunfs/root/src/entrypoints/cli.js:11379:4615)

Bun v1.4.0 (Linux x64 baseline)
"""


@pytest.mark.parametrize("error", [
    "ENOSPC: no space left on device, write",
    "EACCES: permission denied, open '/home/dev/.claude/settings.json'",
    "TypeError: undefined is not an object (evaluating 'e.request.subtype')",
    "error: bubblewrap is required for subprocess env scrubbing and isolation.",
    "Error: Settings file not found: /nonexistent.json",
])
def test_the_error_line_of_a_bun_uncaught_error_is_quoted(error: str) -> None:
    """The shape of Bun's uncaught-error report (as in the real test above), written out so
    that each kind of error line is tried."""
    out = classify(exit_code=1, stderr_tail="warming up\n" + BUN_UNCAUGHT.format(error=error))
    assert out.verdict == Verdict.CRASHED
    assert error[:60] in out.message and "Bun v" not in out.message
    assert "openSync" not in out.message and "cli.js" not in out.message


def test_crash_line_falls_back_to_the_last_line_that_is_not_noise() -> None:
    out = classify(exit_code=3, stderr_tail="starting\nsomething odd happened\n\n"
                                           "Bun v1.4.0 (Linux x64 baseline)\n")
    assert "something odd happened" in out.message
    only_banner = classify(exit_code=3, stderr_tail="\nBun v1.4.0 (Linux x64 baseline)\n")
    assert "Bun v1.4.0" in only_banner.message  # nothing better to say
    assert "printed nothing" in classify(exit_code=3, stderr_tail="\n \n").message


# --------------------------------------------------------------------------- find_result


def test_find_result_takes_the_last_result_line_and_skips_bad_lines() -> None:
    data, _, _ = sample("nonroot_stream")
    first = real_result("root_401")
    messy = (json.dumps(first).encode() + b"\n{broken\n\xff\xfe garbage\n" + data
             + b"\n\n[1,2]\n{\"type\": \"result\"\n")
    found = find_result(messy)
    assert found is not None and found["session_id"] == real_result("nonroot_stream")[
        "session_id"]


def test_find_result_json_forms() -> None:
    single, _, _ = sample("root_json")
    assert find_result(single) == json.loads(single)
    assert find_result(single.decode()) == json.loads(single)
    pretty = json.dumps(json.loads(single), indent=2)
    assert find_result(pretty) == json.loads(single)
    # `--output-format json --verbose` prints an array of every message
    stream_lines = [json.loads(ln) for ln in sample("nonroot_stream")[0].splitlines()]
    assert find_result(json.dumps(stream_lines)) == stream_lines[-1]


@pytest.mark.parametrize("data", [b"", b"   \n", b"not json", b"{\"type\": \"assistant\"}\n",
                                  b"\xff\xfe\xfd", b"[1, 2]", b"null", b"{" * 100_000])
def test_find_result_none(data: bytes) -> None:
    assert find_result(data) is None


def test_signal_names_in_messages() -> None:
    out = classify(exit_code=None, signal=int(signal.SIGKILL))
    assert "SIGKILL" in out.message
