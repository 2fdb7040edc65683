"""fleet-collect as a process, over the real CLI samples and over fresh real runs."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_tui.demo.endpoint import ScriptedEndpoint

SAMPLES = Path(__file__).resolve().parents[1] / "support" / "fixtures" / "stream-json"
CASES = sorted(p.name for p in SAMPLES.iterdir() if p.is_dir())
BIN = Path(sys.executable).parent
TIMEOUT = 30

OK_CASES = {"nonroot_custom_script", "nonroot_stream", "root_529_then_ok", "root_apikey_ok",
            "root_bash_output",
            "root_json", "root_noflags", "root_only_nonessential", "root_permdefault",
            "root_sandbox_stream"}
FAILED_CASES = {"root_401": "auth", "root_apikey_401": "auth", "root_429": "quota",
                "root_500": "overload", "root_529_default": "overload",
                "root_529_retries0_json": "overload", "root_529_retries2": "overload",
                "root_timeout": "timeout", "root_unreachable": "unreachable",
                "zai_1308_window": "window"}


def _cmd(name: str) -> list[str]:
    script = BIN / name
    if script.exists():
        return [str(script)]
    entry = {"fleet-collect": "collect_main", "fleet-worker": "worker_main"}[name]
    return [sys.executable, "-c", f"import sys; from fleet_tui.cli import {entry}; "
                                  f"sys.exit({entry}())"]


def collect(*args: str, input: bytes | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*_cmd("fleet-collect"), *args], input=input, capture_output=True,
                          timeout=TIMEOUT, stdin=None if input is not None else
                          subprocess.DEVNULL)
    return subprocess.CompletedProcess(proc.args, proc.returncode,
                                       proc.stdout.decode(), proc.stderr.decode())


def stdout_file(case: str) -> Path:
    (path,) = [p for p in (SAMPLES / case).iterdir() if p.name.startswith("stdout.json")]
    return path


def last_result(case: str) -> dict[str, object]:
    lines = stdout_file(case).read_bytes().strip().split(b"\n")
    result: dict[str, object] = json.loads(lines[-1])
    return result


def test_every_sample_is_covered() -> None:
    assert sorted(OK_CASES | set(FAILED_CASES)) == CASES


@pytest.mark.parametrize("case", sorted(OK_CASES))
def test_ok_samples_print_the_result(case: str) -> None:
    run = collect(str(stdout_file(case)))
    assert run.returncode == 0, run.stderr
    assert run.stdout == f"{last_result(case)['result']}\n"
    assert run.stderr == "OK\n"


@pytest.mark.parametrize("case", sorted(FAILED_CASES))
def test_failed_samples_exit_10_with_the_verdict(case: str) -> None:
    run = collect(str(stdout_file(case)))
    assert run.returncode == 10
    assert run.stdout == ""
    assert run.stderr.startswith(f"FAILED ({FAILED_CASES[case]}): ")
    assert run.stderr.count("\n") == 1


def test_defect_2_a_successful_stream_json_run_is_not_failed() -> None:
    """The original read every stream-json line as the result and reported FAILED."""
    path = stdout_file("nonroot_stream")
    assert len(path.read_bytes().strip().split(b"\n")) > 1
    run = collect("-q", input=path.read_bytes())  # from stdin, as in a pipe
    assert (run.returncode, run.stderr) == (0, "")
    assert run.stdout == "Created hello.txt and listed the directory. Done.\n"


@pytest.mark.parametrize(("changes", "verdict"), [
    ({"subtype": "error_max_turns", "is_error": False, "terminal_reason": "max_turns"},
     "max_turns"),
    ({"result": ""}, "empty"),
])
def test_defect_3_out_of_turns_or_empty_result_fails(tmp_path: Path, changes: dict[str, object],
                                                     verdict: str) -> None:
    """The original passed these because is_error was false."""
    lines = stdout_file("root_noflags").read_text().strip().split("\n")
    result = json.loads(lines[-1])
    result.update(changes)
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join([*lines[:-1], json.dumps(result)]) + "\n")
    run = collect(str(path))
    assert run.returncode == 10
    assert run.stderr.startswith(f"FAILED ({verdict}): ")
    as_json = collect("--json", str(path))
    assert as_json.returncode == 10
    assert json.loads(as_json.stdout)["verdict"] == verdict


def test_json_output() -> None:
    run = collect("--json", "-q", str(stdout_file("root_429")))
    assert run.returncode == 10
    data = json.loads(run.stdout)
    assert set(data) == {"verdict", "message", "is_error", "api_error_status", "num_turns",
                         "session_id", "usage", "provider"}
    assert data["provider"] == {"name": "anthropic", "code": "429", "what": "rate limit",
                                "reset": None}
    raw = last_result("root_429")
    assert (data["verdict"], data["is_error"], data["api_error_status"], data["num_turns"],
            data["session_id"], data["usage"]) == (
        "quota", True, 429, raw["num_turns"], raw["session_id"], raw["usage"])
    ok = collect("--json", str(stdout_file("root_json")))
    assert ok.returncode == 0 and json.loads(ok.stdout)["verdict"] == "ok"
    assert ok.stderr == "OK\n"


def test_a_providers_refusal_is_named() -> None:
    """z.ai's 5-hour window, as the real CLI printed it (the business code is not in the
    output: its words name it); the reset time is given as written."""
    run = collect(str(stdout_file("zai_1308_window")))
    assert run.returncode == 10
    assert run.stderr == ("FAILED (window): z.ai (429): Usage limit reached for 5 hour. Your "
                          "limit will reset at 2026-12-01 00:14:10 (5-hour window, code "
                          "1308)\n")
    data = json.loads(collect("--json", str(stdout_file("zai_1308_window"))).stdout)
    assert data["verdict"] == "window"
    assert data["provider"] == {"name": "z.ai", "code": "1308", "what": "5-hour window",
                                "reset": "2026-12-01 00:14:10"}


def test_usage_missing_and_malformed(tmp_path: Path) -> None:
    assert collect("--bogus").returncode == 2
    assert collect("a", "b").returncode == 2
    helped = collect("--help")
    assert helped.returncode == 0 and "usage: fleet-collect" in helped.stdout
    missing = collect(str(tmp_path / "nope.json"))
    assert missing.returncode == 3 and "no such file" in missing.stderr
    assert collect(str(tmp_path)).returncode == 3
    for bad in (b"", b"not json at all\n", b'{"type": "assistant"}\n', b"\xff\xfe\n"):
        run = collect("-", input=bad)
        assert run.returncode == 4, bad
        assert "Traceback" not in run.stderr and run.stderr.startswith("fleet-collect: ")
    # a stream cut before its result line is malformed input, not a failed run
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"\n".join(stdout_file("nonroot_stream").read_bytes().split(b"\n")[:-2]))
    assert collect(str(cut)).returncode == 4


def test_poisoned_files_get_a_verdict_not_a_traceback(tmp_path: Path) -> None:
    """A stream with a line nested 1000 deep and a result whose
    api_error_status is "²" gave a traceback; now a verdict with its reason and the
    documented exit code (0 ok, 10 not ok, 4 malformed)."""
    lines = stdout_file("nonroot_stream").read_text().strip().split("\n")
    result = json.loads(lines[-1])
    deep = "[" * 1000 + "]" * 1000
    poisoned = [lines[0], '{"type":"stream_event","event":' + deep + "}", *lines[1:-1]]

    failed = dict(result, is_error=True, api_error_status="²", result="something broke")
    path = tmp_path / "failed.jsonl"
    path.write_text("\n".join([*poisoned, json.dumps(failed)]) + "\n")
    run = collect(str(path))
    assert "Traceback" not in run.stderr
    assert run.returncode == 10
    assert run.stderr == ("FAILED (crashed): claude reported an error: something broke; see the "
                          "run's log\n")
    as_json = collect("--json", str(path))
    assert as_json.returncode == 10 and json.loads(as_json.stdout)["api_error_status"] is None

    odd = dict(result, result="done \ud800", usage={"input_tokens": float("nan"),
                                                    "output_tokens": 10**40})
    path = tmp_path / "odd.jsonl"
    path.write_text("\n".join([*poisoned, json.dumps(odd)]) + "\n")
    run = collect(str(path))
    assert (run.returncode, run.stdout, run.stderr) == (0, "done \ufffd\n", "OK\n")
    as_json = collect("--json", str(path))
    assert json.loads(as_json.stdout)["usage"] == {"input_tokens": None, "output_tokens": None}

    only_deep = tmp_path / "deep.jsonl"
    only_deep.write_text('{"type":"result","is_error":false,"x":' + deep + "}\n")
    run = collect(str(only_deep))
    assert "Traceback" not in run.stderr
    assert run.returncode == 4 and run.stderr.startswith("fleet-collect: ")


def test_a_result_the_terminal_cannot_encode_is_replaced_not_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"type": "result", "subtype": "success", "is_error": False,
                                "result": "h\u00e9llo \u2713"}))
    monkeypatch.setenv("PYTHONIOENCODING", "ascii")
    run = collect(str(path))
    assert (run.returncode, run.stdout, run.stderr) == (0, "h?llo ?\n", "OK\n")


# --------------------------------------------------------------------------- real runs


def _worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, claude_bin: str,
            script: list[object], *args: str) -> subprocess.CompletedProcess[bytes]:
    """fleet-worker -> the real claude -> the scripted endpoint; its stdout."""
    monkeypatch.setenv("FLEET_WORKER_CLAUDE", claude_bin)
    monkeypatch.setenv("FLEET_WORKER_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("ZHIPU_API_KEY", "sk-fleet-" + secrets.token_hex(16))
    work = tmp_path / "work"
    work.mkdir()
    with ScriptedEndpoint(script) as endpoint:
        monkeypatch.setenv("FLEET_WORKER_BASE_URL", endpoint.url)
        return subprocess.run([*_cmd("fleet-worker"), *args, "Do the task."], cwd=work,
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=120)


@pytest.mark.real_claude
def test_real_stream_json_run_collects_ok(claude_bin: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    script: list[object] = [
        [{"type": "tool_use", "name": "Bash", "input": {"command": "echo hi > out.txt"}}],
        "All done: out.txt written."]
    run = _worker(tmp_path, monkeypatch, claude_bin, script,
                  "--output-format", "stream-json", "--verbose")
    assert run.returncode == 0, run.stderr[-2000:]
    assert len(run.stdout.strip().split(b"\n")) > 3
    collected = collect(input=run.stdout)
    assert (collected.returncode, collected.stdout, collected.stderr) == (
        0, "All done: out.txt written.\n", "OK\n")


@pytest.mark.real_claude
def test_real_max_turns_run_fails(claude_bin: str, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    script: list[object] = [
        [{"type": "tool_use", "name": "Bash", "input": {"command": "echo one"}}],
        [{"type": "tool_use", "name": "Bash", "input": {"command": "echo two"}}],
        "Finished."]
    run = _worker(tmp_path, monkeypatch, claude_bin, script, "--max-turns", "1",
                  "--output-format", "stream-json", "--verbose")
    assert run.returncode == 1, run.stderr[-2000:]
    collected = collect("--json", input=run.stdout)
    assert collected.returncode == 10
    assert json.loads(collected.stdout)["verdict"] == "max_turns"
    assert collected.stderr.startswith("FAILED (max_turns): ")
