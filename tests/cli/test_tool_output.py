"""Whole tool output: a tool result's whole text and a Bash step's exit
status from a real recording (tests/support/fixtures/stream-json/root_bash_output: CLI 2.1.197, a
failing Bash step with output on stdout and stderr, then a passing one that prints 41
lines), a tool call found by its id in a large events file, and `fleet-tui logs --full`
with the real claude."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from endpoint_helpers import cli_env

from fleet_tui.commands.tasks import format_event, format_event_full
from fleet_tui.core import stream
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.execution.worker.attemptlog import AttemptLog

FIXTURE = (Path(__file__).resolve().parents[1] / "support" / "fixtures" / "stream-json"
           / "root_bash_output")
ROOT = Path(__file__).resolve().parents[2]


def _events() -> list[stream.Event]:
    return stream.decode_all((FIXTURE / "stdout.jsonl").read_bytes())


def test_a_result_keeps_its_whole_text_and_a_bash_step_its_exit_status() -> None:
    results = [e for e in _events() if isinstance(e, stream.ToolResult)]
    failed, passed = results
    assert failed.tool_name == "Bash" and failed.is_error and failed.exit_code == 3
    assert failed.first_line == "Exit code 3"
    assert failed.content.splitlines() == ["Exit code 3", "collecting...",
                                           "tests/test_app.py::test_main FAILED",
                                           "E   assert 2 == 1"]
    assert not passed.is_error and passed.exit_code == 0
    lines = passed.content.splitlines()
    assert len(lines) == 41 and lines[0].endswith("test_case_00 PASSED")
    assert "40 passed" in lines[-1]  # the line a first-line view hid
    assert stream.bash_exit_code("Exit code 12\nboom", True) == 12
    assert stream.bash_exit_code("Permission denied", True) is None
    assert stream.result_text([{"type": "text", "text": "a"}, {"type": "image"},
                               {"type": "text", "text": "b"}]) == "a\n[image]\nb"


def test_a_tool_call_is_found_by_its_id_in_a_large_file(tmp_path: Path) -> None:
    data = (FIXTURE / "stdout.jsonl").read_bytes()
    filler = b'{"type":"system","subtype":"status","status":"' + b"x" * 1000 + b'"}\n'
    (tmp_path / "events.jsonl").write_bytes(filler * 5000 + data + filler * 5000)
    log = AttemptLog(tmp_path)
    calls = [e for e in _events() if isinstance(e, stream.ToolUse)]
    use, result = log.tool_call(calls[1].id)
    assert use is not None and result is not None
    assert use.name == "Bash" and "40 passed" in use.input["command"]
    assert result.tool_name == "Bash" and result.exit_code == 0
    assert len(result.content.splitlines()) == 41
    use, result = log.tool_call(calls[0].id)
    assert result is not None and result.exit_code == 3 and "assert 2 == 1" in result.content
    assert log.tool_call("toolu_nope") == (None, None)
    assert AttemptLog(tmp_path / "missing").tool_call(calls[0].id) == (None, None)


def test_logs_full_prints_inputs_outputs_and_exit_status() -> None:
    lines = [line for ev in _events() for line in format_event_full(ev)]
    text = "\n".join(lines)
    assert "         $ printf 'collecting...\\n'" in text
    assert "  error, exit 3 Bash" in lines and "  exit 0 Bash" in lines
    assert "         E   assert 2 == 1" in lines
    assert any("40 passed in 0.12s" in line for line in lines)
    short = [format_event(ev) for ev in _events()]
    assert any(line and line.endswith("(+40 lines: --full)") for line in short)


def test_fleet_tui_logs_full_with_the_real_claude(git_repo: Path, claude_bin: str) -> None:
    script = [[{"type": "tool_use", "name": "Bash",
                "input": {"command": "for i in 1 2 3 4 5; do echo line $i; done; exit 4",
                          "description": "five lines"}}], "done"]
    with ScriptedEndpoint({"default": script}) as ep:
        env = cli_env(ep.url, claude_bin, "sk-logs-full")
        cli = [sys.executable, "-m", "fleet_tui.cli"]
        run = subprocess.run([*cli, "run", "--wait", "--json", "print five lines"], env=env,
                             cwd=git_repo, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        task_id = run.stdout.split('"id": "')[1].split('"')[0]
        short = subprocess.run([*cli, "logs", task_id], env=env, cwd=git_repo,
                               capture_output=True, text=True, timeout=60)
        full = subprocess.run([*cli, "logs", task_id, "--full"], env=env, cwd=git_repo,
                              capture_output=True, text=True, timeout=60)
    assert short.returncode == full.returncode == 0, full.stderr
    assert "line 5" not in short.stdout and "(+5 lines: --full)" in short.stdout
    assert "  error, exit 4 Bash" in full.stdout
    assert all(f"         line {i}" in full.stdout for i in range(1, 6))
    assert "you\n         print five lines\n" in full.stdout  # the prompt, as claude took it
    assert "you      print five lines" in short.stdout


def test_the_setup_step_in_logs() -> None:
    data = (b'{"type":"system","subtype":"fleet_setup","phase":"start","command":"npm ci"}\n'
            b'{"type":"system","subtype":"fleet_setup","phase":"end","command":"npm ci",'
            b'"exit_code":7,"output":"fetching\\nno network\\n","copied":[".env"],'
            b'"skipped":[],"seconds":2.5}\n')
    events = stream.decode_all(data)
    assert [format_event(e) for e in events] == [
        "setup    $ npm ci", "  error  setup exit 7 in 2.5s; copied .env"]
    assert format_event_full(events[1])[1:] == ["         fetching", "         no network"]
