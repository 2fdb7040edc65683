"""`fleet-tui --demo` pieces and the panel command's argument handling."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fleet_tui import CLAUDE_CODE_VERSION
from fleet_tui.commands import panel
from fleet_tui.endpoint import ScriptedEndpoint
from fleet_tui.ui import demo


def test_demo_project_is_a_committed_repo_whose_tests_pass(tmp_path: Path) -> None:
    repo = demo.create_project(tmp_path / "inventory")
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, check=True,
                            capture_output=True, text=True).stdout
    assert status == ""
    branch = subprocess.run(["git", "branch", "--show-current"], cwd=repo, check=True,
                            capture_output=True, text=True).stdout.strip()
    assert branch == "main"
    tests = subprocess.run(["python3", "-m", "unittest", "-q"], cwd=repo,
                           capture_output=True, text=True, timeout=60)
    assert tests.returncode == 0, tests.stderr


def test_demo_scripts_load_and_every_task_names_one() -> None:
    scripts = demo.demo_scripts()
    endpoint = ScriptedEndpoint(scripts)
    assert "default" in endpoint.scripts  # what a task launched from the form plays
    for _, prompt in demo.DEMO_TASKS:
        name = prompt.split("]")[0].removeprefix("[script:")
        assert name in endpoint.scripts, name
    assert endpoint.scripts["docs"].faults[0].status == 529  # one recovers from a 529
    # two tasks edit the same line, so merging both shows a conflict
    formal = scripts["greet-formal"]["turns"][1][0]["input"]
    casual = scripts["greet-casual"]["turns"][1][0]["input"]
    assert formal["old_string"] == casual["old_string"]
    assert formal["new_string"] != casual["new_string"]


def test_missing_claude_without_npm_says_how_to_install(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), "FLEET_TUI_HOME": str(tmp_path / "home")}
    said: list[str] = []
    found = demo.ensure_claude(ask=lambda _: "y", out=said.append, env=env)
    assert found is None
    text = "\n".join(said)
    assert "npm is not installed" in text
    assert f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}" in text
    assert str(tmp_path / "home" / "claude-cli") in text


def test_missing_claude_declined_installs_nothing(tmp_path: Path) -> None:
    npm = tmp_path / "npm"
    npm.write_text("#!/bin/sh\necho should-not-run > \"$0.ran\"\n")
    npm.chmod(0o755)
    env = {"PATH": str(tmp_path), "FLEET_TUI_HOME": str(tmp_path / "home")}
    said: list[str] = []
    assert demo.ensure_claude(ask=lambda _: "n", out=said.append, env=env) is None
    assert not (tmp_path / "npm.ran").exists()
    assert "To do it by hand" in "\n".join(said)


def test_claude_is_found_in_the_demo_install_dir(tmp_path: Path) -> None:
    env = {"PATH": "", "FLEET_TUI_HOME": str(tmp_path)}
    binary = tmp_path / "claude-cli" / "node_modules" / ".bin" / "claude"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    assert demo.find_claude_binary(env) == str(binary)
    assert demo.find_claude_binary({"PATH": "", "FLEET_WORKER_CLAUDE": str(binary)}) == \
        str(binary)


def test_panel_refuses_a_repo_that_is_not_one(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code = panel.main(["--repo", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "--repo" in err and "Traceback" not in err


def test_panel_help_exits_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        panel.main(["--help"])
    assert info.value.code == 0
    assert "--demo" in capsys.readouterr().out


def test_demo_gives_the_environment_back_when_it_stops(tmp_path: Path) -> None:
    """The demo points the environment at its endpoint and key; stop() restores every
    variable it set, including a token the user had exported before."""
    before = {"ANTHROPIC_AUTH_TOKEN": "users-own-token", "PATH": os.environ["PATH"]}
    environ = dict(before)
    started = demo.start_demo("/bin/true", root=tmp_path / "d", environ=environ)
    try:
        assert environ["ANTHROPIC_AUTH_TOKEN"] == demo.DEMO_KEY
        assert environ["FLEET_WORKER_BASE_URL"] == started.endpoint.url
    finally:
        started.stop()
    assert environ == before
