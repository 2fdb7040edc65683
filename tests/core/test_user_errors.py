"""Every error written for the user is a FleetTuiError, so the CLI says it in one sentence
with its exit code instead of a traceback: the task-data and script errors too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fleet_tui.commands import tasks
from fleet_tui.core.errors import EXIT_FAILED, EXIT_USAGE, FleetTuiError
from fleet_tui.demo.endpoint import ScriptError
from fleet_tui.engine.follower import TaskDataError, describe_error


@pytest.mark.parametrize(("error", "code"), [
    (TaskDataError("could not read the events file /x/events.jsonl: disk I/O error"),
     EXIT_FAILED),
    (ScriptError("scripts.json: turn 2: a text block needs a string \"text\""), EXIT_USAGE),
])
def test_the_cli_says_it_in_one_line_with_its_code(
        error: FleetTuiError, code: int, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """tasks.main turns the error into `fleet-tui <cmd>: <message>` and its exit code. The
    command is a stand-in that raises it (no command raises these today: the engine
    catches them per task; this guards that one reaching the CLI stays one line)."""
    assert isinstance(error, FleetTuiError)

    def standin_ls(argv: list[str]) -> int:
        raise error

    monkeypatch.setitem(tasks.COMMANDS, "ls", standin_ls)
    assert tasks.main(["ls"]) == code
    err = capsys.readouterr().err
    assert err == f"fleet-tui ls: {error}\n"
    assert "Traceback" not in err


def test_script_error_is_still_a_value_error() -> None:
    """The endpoint's readers catch ValueError around values they parse."""
    assert issubclass(ScriptError, ValueError)
    assert describe_error(TaskDataError("x: y")) == "x: y"


def test_a_bad_script_ends_the_endpoint_with_one_line_and_exit_2(tmp_path: Path) -> None:
    script = tmp_path / "bad.json"
    script.write_text('{"turns": [[{"type": "text"}]]}', encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "fleet_tui.demo.endpoint", "--script", str(script)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == EXIT_USAGE, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("endpoint: "), out.stderr
    assert "text" in lines[0] and "Traceback" not in out.stderr
