"""`fleet-tui --demo` pieces and the panel command's argument handling."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from endpoint_helpers import assemble, post, request_body

from fleet_tui import CLAUDE_CODE_VERSION
from fleet_tui.commands import panel
from fleet_tui.demo import session as demo
from fleet_tui.demo.endpoint import ScriptedEndpoint


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


def test_the_install_keeps_npms_warnings_off_the_screen(
        tmp_path: Path, capfd: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """npm 11 warns about install scripts (`npm warn install-scripts ...`) on a good
    install: the user sees that it is installing and where it went, not npm's chatter; a
    failed install shows what npm said. npm stands in here (the registry is off limits to
    tests): it says what the real one said, then puts a claude where npm would."""
    npm = tmp_path / "bin" / "npm"
    npm.parent.mkdir()
    npm.write_text(
        "#!/bin/sh\n"
        "echo 'npm warn install-scripts @anthropic-ai/claude-code@2.1.197 has install "
        "scripts not yet covered by allowScripts' >&2\n"
        "echo 'added 3 packages in 2s'\n"
        "[ -n \"$FAIL\" ] && { echo 'npm error code E404' >&2; exit 1; }\n"
        "bin=\"$3/node_modules/.bin\"; mkdir -p \"$bin\"\n"
        "printf '#!/bin/sh\\n' > \"$bin/claude\"; chmod +x \"$bin/claude\"\n")
    npm.chmod(0o755)
    env = {"PATH": str(npm.parent), "FLEET_TUI_HOME": str(tmp_path / "home")}
    said: list[str] = []
    found = demo.ensure_claude(ask=lambda _: "y", out=said.append, env=env)
    assert found == str(tmp_path / "home" / "claude-cli" / "node_modules" / ".bin" / "claude")
    screen = capfd.readouterr()
    text = "\n".join(said)
    assert "npm warn" not in screen.out + screen.err + text
    assert "Installing Claude Code" in text and f"Installed: {found}" in text
    # a failure: npm's words are shown, with the command to run by hand
    monkeypatch.setenv("FAIL", "1")
    said.clear()
    env["FLEET_TUI_HOME"] = str(tmp_path / "home2")
    assert demo.ensure_claude(ask=lambda _: "y", out=said.append, env=env) is None
    text = "\n".join(said)
    assert "npm error code E404" in text and "npm failed (exit 1)" in text


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
        started.endpoint.stop()
    assert environ == before


# --- the endpoint as a process of its own -------------------------------------------------


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def test_endpoint_writes_its_url_and_exits_when_nobody_is_connected(tmp_path: Path) -> None:
    """`--port-file` says where it listens; `--idle-exit` ends it once no client has been
    connected for that long, and an open connection keeps it alive."""
    (tmp_path / "s.json").write_text(json.dumps(["served"]))
    port_file = tmp_path / "url"
    proc = subprocess.Popen([sys.executable, "-m", "fleet_tui.demo.endpoint", "--script",
                             str(tmp_path / "s.json"), "--port-file", str(port_file),
                             "--idle-exit", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait(port_file.exists, 15, "the port file")
        url = port_file.read_text().strip()
        assert url.startswith("http://127.0.0.1:")
        assert assemble(post(url, request_body()).events)[0]["text"] == "served"
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)):
            time.sleep(2.5)  # more than --idle-exit, with a client connected
            assert proc.poll() is None
        _wait(lambda: proc.poll() is not None, 10, "the idle exit")
        assert proc.returncode == 0
        assert not port_file.exists()  # removed on the way out
        assert "no client for 1 s" in (proc.stderr.read() if proc.stderr else "")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_a_second_demo_reuses_the_running_endpoint(tmp_path: Path, procs_mode: str) -> None:
    environ = {"PATH": os.environ["PATH"]}
    first = demo.start_demo("/bin/true", root=tmp_path / "one", environ=environ)
    try:
        first.stop()  # the first panel quit: the endpoint stays for the next one
        assert first.endpoint.alive() and first.endpoint.answers()
        second = demo.start_demo("/bin/true", root=tmp_path / "two", environ=environ)
        second.stop()
        assert second.endpoint.reused
        assert (second.endpoint.pid, second.endpoint.url) == (first.endpoint.pid,
                                                               first.endpoint.url)
        # its own session: a terminal's hangup or Ctrl-C to the panel does not reach it
        assert os.getsid(first.endpoint.pid) == first.endpoint.pid
        assert first.endpoint.log.parent.parent == tmp_path / "endpoint"
        assert "started by pid" in first.endpoint.log.read_text()
    finally:
        first.endpoint.stop()
    assert not first.endpoint.alive()
    # gone: the next demo starts a new one
    third = demo.start_demo("/bin/true", root=tmp_path / "three", environ=environ)
    try:
        assert not third.endpoint.reused and third.endpoint.pid != first.endpoint.pid
    finally:
        third.stop()
        third.endpoint.stop()


def test_the_endpoint_process_gets_no_credential(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "users-real-token-5e1f")
    started = demo.start_demo("/bin/true", root=tmp_path / "d", environ={"PATH": "/bin"})
    try:
        env = Path(f"/proc/{started.endpoint.pid}/environ").read_bytes()
        assert b"users-real-token-5e1f" not in env and b"ANTHROPIC" not in env
    finally:
        started.stop()
        started.endpoint.stop()


@pytest.mark.real_claude
@pytest.mark.long
async def test_demo_workers_finish_after_the_panel_quits(claude_bin: str,
                                                         tmp_path: Path) -> None:
    """The panel quits while the demo's workers run: they go on talking to the endpoint
    process, finish ok, and the endpoint then stops by itself."""
    from fleet_tui.engine.fleet import Fleet
    from fleet_tui.settings.config import load_settings
    from fleet_tui.store.db import TaskState
    from fleet_tui.ui.app import FleetApp

    started = demo.start_demo(claude_bin, root=tmp_path / "demo", idle_exit=3)
    endpoint = started.endpoint
    try:
        fleet = Fleet(load_settings())
        tasks = demo.submit_demo_tasks(fleet, started.repo)
        ids = [t.id for t in tasks]
        app = FleetApp(fleet, repo=started.repo, default_base="main", bell=False,
                       scheduler_interval=0.2)
        async with app.run_test(size=(120, 36)) as pilot:
            deadline = time.monotonic() + 60

            def writing(task_id: str) -> bool:  # its worker has started writing events
                attempts = fleet.attempts(task_id)
                folder = attempts[-1].dir if attempts else None
                events = folder / "events.jsonl" if folder is not None else None
                return events is not None and events.exists() and events.stat().st_size > 0

            while not all(writing(t) for t in ids):
                assert time.monotonic() < deadline, "the workers did not start"
                await pilot.pause(0.1)
            running = [t for t in ids if fleet.get_task(t).state == TaskState.RUNNING]
            assert len(running) == len(ids)
            await pilot.press("q")
        started.stop()  # what `fleet-tui --demo` does on the way out
        runners = [fleet.attempts(t)[-1].runner_pid for t in ids]
        assert all(pid and _alive(pid) for pid in runners), "a worker died with the panel"
        assert endpoint.alive()
        # the stock task waits for a message (the README's `s`): one from here, with no
        # panel open, ends its wait
        stock = ids[[t for t, _ in demo.DEMO_TASKS].index(
            "Refuse to remove more stock than there is")]
        assert fleet.say(stock, "go on, please")
        # nothing schedules now; the runners finish by themselves, against the endpoint
        for task_id in ids:
            attempt_dir = fleet.attempts(task_id)[-1].dir
            assert attempt_dir is not None
            _wait((attempt_dir / "exit.json").exists, 240, f"{task_id} to finish")
        # the stock task works long enough to try `s` on it as the README suggests (its
        # runner's own record: load only makes it longer), and it heard the message
        stock_dir = fleet.attempts(stock)[-1].dir
        assert stock_dir is not None
        record = json.loads((stock_dir / "exit.json").read_text())
        assert record["finished_at"] - record["started_at"] >= 40, record
        said = (stock_dir / "events.jsonl").read_text()
        assert "You said: go on, please" in said
        fleet.tick()  # what the next `fleet-tui` or `fleet-tui ls` does: record them
        verdicts = {t: (fleet.get_task(t).state, fleet.get_task(t).verdict) for t in ids}
        assert all(v == (TaskState.SUCCEEDED, "ok") for v in verdicts.values()), verdicts
        # no worker and no panel left: the endpoint stops by itself
        _wait(lambda: not endpoint.alive(), 30, "the endpoint to stop by itself")
        assert "no client for 3 s" in endpoint.log.read_text()
    finally:
        started.stop()
        endpoint.stop()


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_a_second_demo_reopens_the_last_one_and_new_starts_afresh(
        tmp_path: Path, isolated_env: Path) -> None:
    """`--demo` again reopened nothing (a new project, the earlier
    tasks not shown). latest_demo finds the last demo; start_demo on it keeps its project
    as it was (reopened: the panel submits no new tasks); `--demo --new` starts afresh."""
    environ = dict(os.environ)
    assert demo.latest_demo(environ) is None
    first = demo.start_demo("/bin/true", environ=environ)
    try:
        first.stop()
        assert not first.reopened
        (first.repo / "mine.txt").write_text("left by the user\n")
        root = demo.latest_demo(environ)
        assert root == first.root
        again = demo.start_demo("/bin/true", root=root, environ=environ)
        again.stop()
        assert again.reopened and again.repo == first.repo
        assert (again.repo / "mine.txt").read_text() == "left by the user\n"
    finally:
        first.endpoint.stop()
    out = subprocess.run([sys.executable, "-m", "fleet_tui.cli", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert "--new" in out.stdout and "reopens" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "fleet_tui.cli", "--new"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--new goes with --demo" in bad.stderr
