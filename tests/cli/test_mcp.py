"""`fleet-tui mcp`: the fleet as an orchestrator's MCP tools, and `fleet-tui mcp install`.

The orchestrator is the real claude with its own config dir, `--mcp-config` naming
`fleet-tui mcp`, its turns scripted (the scripted endpoint's `$from_results` passes on the
ids the tools made); the workers are the real claude too. The protocol tests use the
official SDK's client over stdio, as any MCP client would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from anyio import sleep as anyio_sleep
from endpoint_helpers import cli_env, run_cli

from fleet_tui.demo.endpoint import RecordedRequest, ScriptedEndpoint

if TYPE_CHECKING:  # the SDK is imported where a session starts: ~0.35 s of each xdist
    from mcp import ClientSession  # worker's collection otherwise
    from mcp.types import CallToolResult

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-mcp-test-SECRET-5d1f"
ORCHESTRATOR_KEY = "sk-orchestrator-SECRET-77aa"
TOOLS = {"run", "list", "show", "wait", "diff", "merge", "queue", "say", "follow_up",
         "retry", "kill", "discard", "cost"}
# what `run` answers: "started 2 tasks: ID1, ID2 (...)"
STARTED = r"started \d+ tasks?: (\w+)(?:, (\w+))?"


def _call(name: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "tool_use", "name": f"mcp__fleet__{name}", "input": args}]


FIRST = {"$from_results": STARTED, "group": 1}
SECOND = {"$from_results": STARTED, "group": 2}
ORCHESTRATOR = [
    _call("run", {"prompt": "[script:worker] write a.txt with your folder's name",
                  "title": "Add a.txt", "copies": 2}),
    _call("wait", {"ids": [FIRST, SECOND], "timeout": 300}),
    _call("diff", {"id": FIRST}),
    _call("merge", {"id": FIRST}),
    _call("merge", {"id": SECOND}),  # its a.txt differs: the gate's conflict check says no
    _call("merge", {}),  # no id
    _call("show", {"id": "nosuch"}),  # no such task
    _call("wait", {"ids": "not a list"}),  # a wrong type
    _call("list", {}),  # the server still serves
    "merged one copy; the other conflicts",
]
# each worker writes its own folder's name: the two copies' a.txt differ
WORKER = [
    [{"type": "tool_use", "name": "Bash",
      "input": {"command": "pwd > a.txt", "description": "write a.txt"}}],
    "wrote a.txt",
]
SCRIPTS: dict[str, Any] = {
    "orchestrator": ORCHESTRATOR, "worker": WORKER, "chat": ["done"],
    # a number of its own: other tests look for (and kill) their `sleep N` machine-wide
    "sleepy": [[{"type": "tool_use", "name": "Bash",
                 "input": {"command": "sleep 617", "description": "wait"}}], "never"],
    **{name: [[{"type": "tool_use", "name": "Bash",
                "input": {"command": f"echo {name} > {name}.txt", "description": name}}],
              f"wrote {name}.txt"] for name in ("one", "two")},
}


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(SCRIPTS) as ep:
        yield ep


@pytest.fixture
def env(endpoint: ScriptedEndpoint, claude_bin: str) -> dict[str, str]:
    return cli_env(endpoint.url, claude_bin, KEY)


def _server_command() -> list[str]:
    """`fleet-tui mcp` of this checkout: the installed script beside this Python, else the
    module."""
    script = Path(sys.executable).parent / "fleet-tui"
    if script.is_file():
        return [str(script), "mcp"]
    return [sys.executable, "-m", "fleet_tui.cli", "mcp"]


def _orchestrator(claude: str, env: dict[str, str], repo: Path, tmp: Path,
                  endpoint: ScriptedEndpoint) -> subprocess.CompletedProcess[str]:
    """The orchestrating claude: its own config dir, only the `fleet` server, its tools
    allowed (and nothing else: a headless claude refuses what is not allowed)."""
    command = _server_command()
    config = tmp / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"fleet": {
        "command": command[0], "args": command[1:]}}}))
    own = tmp / "orchestrator-config"
    own.mkdir()
    run_env = dict(env, CLAUDE_CONFIG_DIR=str(own), ANTHROPIC_BASE_URL=endpoint.url,
                   ANTHROPIC_AUTH_TOKEN=ORCHESTRATOR_KEY,
                   CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_TELEMETRY="1",
                   MCP_TIMEOUT="120000", MCP_TOOL_TIMEOUT="600000",
                   # claude -p (2.1.197) connects its servers in the background and
                   # refuses their tools until they are up (the model is told to call
                   # WaitForMcpServers, which waits 5 s at most); told to connect first, it
                   # waits MCP_CONNECT_TIMEOUT_MS (default 5 s): on a loaded machine the
                   # server's start takes longer
                   MCP_CONNECTION_NONBLOCKING="0", MCP_CONNECT_TIMEOUT_MS="120000")
    # the workers' key is not the orchestrator's: the server (and its workers) read it
    # from ZHIPU_API_KEY, which claude passes on to the servers it starts
    run_env.update(FLEET_WORKER_KEY_SOURCES="zhipu", ZHIPU_API_KEY=KEY)
    return subprocess.run(
        [claude, "-p", "[script:orchestrator] split the change for the fleet",
         "--output-format", "stream-json", "--verbose", "--mcp-config", str(config),
         "--strict-mcp-config", "--allowedTools", "mcp__fleet", "--model", "sonnet"],
        cwd=repo, env=run_env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=300)


def _orchestrator_results(endpoint: ScriptedEndpoint) -> list[tuple[bool, str]]:
    """What each of the orchestrator's tool calls answered, in order."""
    requests: list[RecordedRequest] = [r for r in endpoint.requests
                                       if r.script == "orchestrator" and r.status == 200]
    by_turn = {r.turn: r for r in requests}
    return [(res.is_error, res.text) for turn in sorted(by_turn) if turn
            for res in by_turn[turn].tool_results]


@pytest.mark.timeout(360)  # three claude processes and two merges on a loaded CI machine
def test_orchestrator_claude_runs_waits_reads_and_merges(
        env: dict[str, str], git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint,
        tmp_path: Path) -> None:
    out = _orchestrator(claude_bin, env, git_repo, tmp_path, endpoint)
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines and lines[-1]["type"] == "result", (out.stdout[-3000:], out.stderr[-3000:])
    init = next(x for x in lines if x.get("subtype") == "init")
    assert [s["name"] for s in init["mcp_servers"]] == ["fleet"], init  # (it connects on)
    results = _orchestrator_results(endpoint)
    assert len(results) == len(ORCHESTRATOR) - 1, results
    (run_err, run_text), (wait_err, wait_text), (diff_err, diff_text), \
        (merge_err, merge_text), (gate_err, gate_text), (missing_err, missing_text), \
        (unknown_err, unknown_text), (type_err, type_text), (list_err, list_text) = results
    # an answer reaches the model as its structured content (CLI 2.1.197), the short text
    # in it as "summary"; an error as its text
    assert not run_err, run_text
    started = json.loads(run_text)
    ids = started["ids"]
    assert len(ids) == 2 and started["summary"].startswith(f"started 2 tasks: {ids[0]}, ")
    assert [t["title"] for t in started["tasks"]] == ["Add a.txt (1/2)", "Add a.txt (2/2)"]
    assert not wait_err, wait_text
    waited_for = json.loads(wait_text)
    assert waited_for["done"] is True and waited_for["summary"].startswith("all 2 ended")
    assert [(t["id"], t["state"]) for t in waited_for["tasks"]] == [
        (ids[0], "succeeded"), (ids[1], "succeeded")]
    assert not diff_err, diff_text
    diff = json.loads(diff_text)
    assert diff["id"] == ids[0] and [f["path"] for f in diff["files"]] == ["a.txt"]
    assert "+++ b/a.txt" in diff["patch"] and diff["truncated"] is False
    assert not merge_err, merge_text
    assert json.loads(merge_text)["merged"] is True
    # the gate refused the second copy, with the CLI's reason; the server kept serving
    assert gate_err and "not merged" in gate_text and "a.txt" in gate_text, gate_text
    assert missing_err and "missing argument 'id'" in missing_text, missing_text
    assert unknown_err and "no task 'nosuch'" in unknown_text, unknown_text
    assert type_err and "argument 'ids'" in type_text, type_text
    assert not list_err, list_text
    assert {t["id"] for t in json.loads(list_text)["tasks"]} == set(ids)
    assert lines[-1]["is_error"] is False, lines[-1]
    # the task is on main, and the store the panel reads shows both
    merged = (git_repo / "a.txt").read_text()
    assert diff["patch"].splitlines()[-1] == "+" + merged.rstrip("\n"), (diff, merged)
    listed = {t["id"]: t for t in json.loads(run_cli(env, git_repo, "ls", "--json").stdout)}
    assert set(listed) == set(ids)
    assert listed[ids[0]]["state"] == "merged"
    assert listed[ids[1]]["state"] == "succeeded"
    for text in (out.stdout, *(t for _, t in results)):
        assert KEY not in text and ORCHESTRATOR_KEY not in text


# --- over the protocol, with the SDK's client ------------------------------------------------


@asynccontextmanager
async def _client(env: dict[str, str], cwd: Path, errlog: Path
                  ) -> AsyncIterator[ClientSession]:
    """`fleet-tui mcp` as Claude Code starts it: a child on stdio, in the project."""
    from mcp import ClientSession, StdioServerParameters, stdio_client

    command = _server_command()
    params = StdioServerParameters(command=command[0], args=command[1:], env=env,
                                   cwd=str(cwd))
    with errlog.open("w") as log:
        async with stdio_client(params, errlog=log) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            yield session
    assert "Traceback" not in errlog.read_text(), errlog.read_text()


async def _call_tool(session: ClientSession, name: str, args: dict[str, Any]
                     ) -> tuple[bool, str, dict[str, Any] | None]:
    result: CallToolResult = await session.call_tool(name, args)
    text = "\n".join(getattr(c, "text", "") for c in result.content)
    return bool(result.is_error), text, result.structured_content


def _plain_env(tmp: Path) -> dict[str, str]:
    """The server's environment when no worker runs: this checkout, the test's homes."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["FLEET_TUI_CONFIG"] = str(tmp / "config.toml")
    return env


async def test_the_tools_are_listed_with_their_schemas(git_repo: Path, tmp_path: Path
                                                       ) -> None:
    async with _client(_plain_env(tmp_path), git_repo, tmp_path / "server.log") as session:
        listed = (await session.list_tools()).tools
    tools = {t.name: t for t in listed}
    assert set(tools) == TOOLS
    for tool in listed:
        assert tool.description and len(tool.description) > 80, tool.name
        assert tool.input_schema["type"] == "object"
    run = tools["run"].input_schema
    assert run["required"] == ["prompt"]
    assert set(run["properties"]) == {"prompt", "title", "copies", "host", "endpoint",
                                      "model", "base", "max_turns", "timeout", "repo"}
    assert run["properties"]["copies"]["minimum"] == 1
    assert run["properties"]["copies"]["maximum"] >= 2
    wait = tools["wait"].input_schema
    assert wait["required"] == ["ids"]
    assert wait["properties"]["ids"]["type"] == "array"
    assert wait["properties"]["timeout"]["maximum"] == 600
    for name in ("show", "diff", "merge", "say", "follow_up", "retry", "kill", "discard"):
        assert "id" in tools[name].input_schema["required"], name
    assert tools["queue"].input_schema["required"] == ["ids"]
    assert tools["retry"].input_schema["properties"]["mode"]["enum"] == ["fresh", "resume"]
    assert set(tools["cost"].input_schema["properties"]["by"]["enum"]) == {
        "task", "endpoint", "day"}
    # the calling rules are where the model reads them: in the descriptions
    assert "self-contained" in (tools["run"].description or "")
    assert "call again" in (tools["wait"].description or "")
    assert "max_bytes" in (tools["diff"].description or "")
    for name in ("list", "show", "wait", "diff", "cost"):
        annotations = tools[name].annotations
        assert annotations is not None and annotations.read_only_hint is True, name
    assert tools["merge"].annotations is not None
    assert tools["merge"].annotations.destructive_hint is True


async def test_malformed_calls_are_tool_errors_and_the_server_keeps_serving(
        git_repo: Path, tmp_path: Path) -> None:
    bad: list[tuple[str, dict[str, Any], str]] = [
        ("show", {}, "missing argument 'id'"),
        ("show", {"id": "zzzzzz"}, "no task 'zzzzzz'"),
        ("show", {"task_id": "zzzzzz"}, "unknown argument 'task_id'; show takes id"),
        ("merge", {"id": "zzzzzz"}, "no task 'zzzzzz'"),
        ("wait", {"ids": "abc"}, "argument 'ids'"),
        ("wait", {"ids": []}, "argument 'ids'"),
        ("wait", {"ids": ["abc"], "timeout": 5000}, "argument 'timeout'"),
        ("diff", {"id": "abc", "max_bytes": 0}, "argument 'max_bytes'"),
        ("run", {"prompt": "   "}, "the prompt is empty"),
        ("run", {"prompt": "x", "copies": 0}, "argument 'copies'"),
        ("run", {"prompt": "x", "timeout": "soon"}, "timeout 'soon'"),
        ("run", {"prompt": "x", "repo": str(tmp_path)}, "is not inside a git repository"),
        ("retry", {"id": "abc", "mode": "sideways"}, "argument 'mode'"),
        ("list", {"state": "asleep"}, "state 'asleep' is not one of"),
        ("cost", {"since": "yesterday"}, "since: 'yesterday'"),
        ("say", {"id": "abc", "text": ""}, "the message is empty"),
        ("nosuch", {}, "Unknown tool"),
    ]
    async with _client(_plain_env(tmp_path), git_repo, tmp_path / "server.log") as session:
        for name, args, words in bad:
            is_error, text, _ = await _call_tool(session, name, args)
            assert is_error, (name, args, text)
            assert words in text, (name, args, text)
            assert "\n" not in text.strip(), text  # one line
        # still serving, and nothing was created
        is_error, text, data = await _call_tool(session, "list", {})
    assert not is_error and data is not None and data["tasks"] == [], text


@pytest.mark.real_claude
async def test_the_caps_refuse_the_task_past_them(
        env: dict[str, str], git_repo: Path, tmp_path: Path) -> None:
    """[mcp] max_tasks: a run past it is refused whole (none of its copies made), with a
    reason the model can read; max_spend: no more work once the session's tasks spent it
    (the meter's row written as the gateway writes it)."""
    from fleet_tui.store.db import Store
    from fleet_tui.store.meter import Meter, Usage
    from fleet_tui.system import paths

    (tmp_path / "config.toml").write_text("[mcp]\nmax_tasks = 2\nmax_spend = 0.5\n")
    env = dict(env, FLEET_TUI_CONFIG=str(tmp_path / "config.toml"))
    async with _client(env, git_repo, tmp_path / "server.log") as session:
        is_error, text, first = await _call_tool(session, "run", {"prompt": "[script:chat] hi"})
        assert not is_error and first is not None, text
        is_error, text, _ = await _call_tool(session, "run", {"prompt": "[script:chat] two",
                                                              "copies": 2})
        assert is_error and "may start 2 tasks ([mcp] max_tasks" in text, text
        assert "has started 1" in text and "(1 left)" in text, text
        # the first task spends past max_spend: no more work of any kind
        store = Store(paths.db_path())
        try:
            Meter(store).record(Usage(time.time(), first["ids"][0], None, "default",
                                      "GLM-5.2", 200, 1000, 100, 0, 0, 0.75))
        finally:
            store.close()
        is_error, text, _ = await _call_tool(session, "run", {"prompt": "[script:chat] 3"})
        assert is_error and "spent $0.75 of the $0.50" in text and "max_spend" in text, text
        is_error, text, cost = await _call_tool(session, "cost", {"by": "task"})
        assert not is_error and cost is not None
        assert cost["session"] == {"tasks_started": 1, "max_tasks": 2, "spent": 0.75,
                                   "max_spend": 0.5, "unpriced_requests": 0}
        is_error, text, waited = await _call_tool(session, "wait",
                                                  {"ids": first["ids"], "timeout": 120})
        assert not is_error and waited is not None and waited["done"], text
        is_error, text, _ = await _call_tool(session, "follow_up",
                                             {"id": first["ids"][0], "text": "more"})
        assert is_error and "max_spend" in text, text
    listed = json.loads(run_cli(env, git_repo, "ls", "--json").stdout)
    assert [t["id"] for t in listed] == first["ids"]


# --- fleet-tui mcp install, and the README's commands --------------------------------------


def _fleet_tui(env: dict[str, str], cwd: Path, *args: str
               ) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([*_server_command()[:-1], *args], cwd=cwd, env=env, input="",
                         capture_output=True, text=True, timeout=120)
    assert "Traceback" not in out.stderr, out.stderr
    return out


def _install_env(tmp: Path) -> dict[str, str]:
    """This installation's `fleet-tui` on PATH, as a user has it."""
    env = _plain_env(tmp)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _front_matter(text: str) -> dict[str, str]:
    assert text.startswith("---\n"), text[:80]
    head = text[4:text.index("\n---\n", 4)]
    return dict((k.strip(), v.strip()) for k, _, v in
                (line.partition(":") for line in head.splitlines()))


def test_install_user_scope_registers_as_claude_mcp_add_does(tmp_path: Path,
                                                              git_repo: Path) -> None:
    env = _install_env(tmp_path)
    home = Path(env["HOME"])
    printed = _fleet_tui(env, git_repo, "mcp", "install", "--print")
    assert printed.returncode == 0, printed.stderr
    assert f"would add to {home / '.claude.json'}" in printed.stdout
    assert "name: fleet" in printed.stdout
    assert not (home / ".claude.json").exists() and not (home / ".claude").exists()
    # what Claude Code keeps there stays (another server, its own keys)
    (home / ".claude.json").write_text(json.dumps(
        {"numStartups": 3, "mcpServers": {"other": {"type": "stdio", "command": "x"}}}))
    out = _fleet_tui(env, git_repo, "mcp", "install")
    assert out.returncode == 0, out.stderr
    assert "registered: the MCP server 'fleet'" in out.stdout
    data = json.loads((home / ".claude.json").read_text())
    assert data["numStartups"] == 3 and set(data["mcpServers"]) == {"other", "fleet"}
    entry = data["mcpServers"]["fleet"]
    assert entry["type"] == "stdio" and entry["args"][-1] == "mcp" and entry["env"] == {}
    assert Path(entry["command"]).is_absolute()
    assert (home / ".claude.json").stat().st_mode & 0o777 == 0o600
    skill = (home / ".claude" / "skills" / "fleet" / "SKILL.md").read_text()
    meta = _front_matter(skill)
    assert meta["name"] == "fleet" and "mcp__fleet__" in meta["description"]
    for topic in ("## When to delegate", "self-contained", "copies", "## Waiting",
                  "critically", "mcp__fleet__queue", "## Cost"):
        assert topic in skill, topic
    again = _fleet_tui(env, git_repo, "mcp", "install")
    assert "already registered" in again.stdout and "skill unchanged" in again.stdout
    # CLAUDE_CONFIG_DIR: where Claude Code then keeps both
    own = tmp_path / "claude-config"
    moved = _fleet_tui(dict(env, CLAUDE_CONFIG_DIR=str(own)), git_repo, "mcp", "install")
    assert moved.returncode == 0, moved.stderr
    assert "fleet" in json.loads((own / ".claude.json").read_text())["mcpServers"]
    assert (own / "skills" / "fleet" / "SKILL.md").read_text() == skill


def test_install_project_scope_and_refusals(tmp_path: Path, git_repo: Path) -> None:
    env = _install_env(tmp_path)
    out = _fleet_tui(env, git_repo / "src", "mcp", "install", "--scope", "project")
    assert out.returncode == 0, out.stderr
    assert json.loads((git_repo / ".mcp.json").read_text()) == {"mcpServers": {"fleet": {
        "type": "stdio", "command": "fleet-tui", "args": ["mcp"], "env": {}}}}
    assert (git_repo / ".claude" / "skills" / "fleet" / "SKILL.md").is_file()
    # a .mcp.json that is not JSON is left alone, with a one-line reason
    (git_repo / ".mcp.json").write_text("{not json")
    bad = _fleet_tui(env, git_repo, "mcp", "install", "--scope", "project")
    assert bad.returncode == 2 and "is not valid JSON" in bad.stderr
    assert (git_repo / ".mcp.json").read_text() == "{not json"
    outside = _fleet_tui(env, tmp_path, "mcp", "install", "--scope", "project")
    assert outside.returncode == 2 and "not inside a git repository" in outside.stderr
    for args, words in ((["install", "--scope", "team"], "invalid choice"),
                        (["serve"], "unknown mcp command 'serve'")):
        wrong = _fleet_tui(env, git_repo, "mcp", *args)
        assert wrong.returncode == 2 and words in wrong.stderr, wrong.stderr


def test_a_bad_mcp_table_is_refused_before_serving(tmp_path: Path, git_repo: Path) -> None:
    env = _plain_env(tmp_path)
    for table, words in (("[mcp]\nmax_tasks = -1\n", "line 2: [mcp] max_tasks: expected"),
                         ("[mcp]\nmax_spend = \"lots\"\n", "[mcp] max_spend: expected USD"),
                         ("[mcp]\nmax_task = 3\n", "unknown key 'max_task'")):
        (tmp_path / "config.toml").write_text(table)
        out = subprocess.run([*_server_command()], cwd=git_repo, env=env,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 2 and out.stdout == "", (out.stdout, out.stderr)
        assert words in out.stderr and str(tmp_path / "config.toml") in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    # a good one does not trouble the other commands
    (tmp_path / "config.toml").write_text("[mcp]\nmax_tasks = 3\nmax_spend = 0\n")
    listed = _fleet_tui(env, git_repo, "ls")
    assert listed.returncode == 0, listed.stderr


def _readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("### Delegating from Claude Code")
    return text[start:text.index("\n### ", start + 1)]


def test_the_readme_commands_run_as_written(tmp_path: Path, git_repo: Path,
                                            claude_bin: str) -> None:
    import shlex
    import tomllib

    from fleet_tui.settings.mcp import read_mcp_settings

    section = _readme_section()
    blocks = section.split("```")
    shell = [b.removeprefix("sh\n") for b in blocks[1::2] if b.startswith("sh\n")]
    assert len(shell) == 1
    env = _install_env(tmp_path)
    env["PATH"] = os.pathsep.join([str(Path(claude_bin).parent), env["PATH"]])
    ran: list[str] = []
    for line in shell[0].splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        assert words[0] in ("fleet-tui", "claude"), line
        command = [claude_bin, *words[1:]] if words[0] == "claude" else \
            [*_server_command()[:-1], *words[1:]]
        out = subprocess.run(command, cwd=git_repo, env=env, stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "Traceback" not in out.stderr, (line, out.stderr)
        ran.append(words[0] + " " + " ".join(words[1:3]))
        if words[0] == "claude":
            assert "Connected" in out.stdout, out.stdout
    assert ran == ["fleet-tui mcp install", "fleet-tui mcp install", "fleet-tui mcp install",
                   "claude mcp get"]
    assert (Path(env["HOME"]) / ".claude" / "skills" / "fleet" / "SKILL.md").is_file()
    assert (git_repo / ".mcp.json").is_file()
    # the settings shown are the ones the server reads
    toml = [b.removeprefix("toml\n") for b in blocks[1::2] if b.startswith("toml\n")]
    assert len(toml) == 1 and "mcp" in tomllib.loads(toml[0])
    (tmp_path / "shown.toml").write_text(toml[0])
    assert read_mcp_settings(str(tmp_path / "shown.toml")).max_tasks == 20
    # and its tool table names every tool
    for tool in TOOLS:
        assert f"`{tool}`" in section, tool


def test_claude_finds_the_installed_skill(tmp_path: Path, git_repo: Path, claude_bin: str,
                                          endpoint: ScriptedEndpoint) -> None:
    """The skill is where Claude Code looks and in the form it reads: a session lists it."""
    env = _install_env(tmp_path)
    own = tmp_path / "claude-config"
    env.update(CLAUDE_CONFIG_DIR=str(own))
    assert _fleet_tui(env, git_repo, "mcp", "install").returncode == 0
    env.update(ANTHROPIC_BASE_URL=endpoint.url, ANTHROPIC_AUTH_TOKEN=ORCHESTRATOR_KEY,
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_TELEMETRY="1",
               CLAUDE_CODE_MAX_RETRIES="0")
    out = subprocess.run([claude_bin, "-p", "[script:chat] hello", "--output-format",
                          "stream-json", "--verbose", "--model", "sonnet"],
                         cwd=git_repo, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=180)
    init = next(json.loads(line) for line in out.stdout.splitlines()
                if '"subtype":"init"' in line.replace(" ", ""))
    assert "fleet" in init["skills"], init["skills"]
    assert "fleet" in [s["name"] for s in init["mcp_servers"]], init["mcp_servers"]


@pytest.mark.real_claude
@pytest.mark.timeout(360)  # two workers, then the queue's runner lands both
async def test_queue_lands_tasks_and_wait_waits_for_the_landing(
        env: dict[str, str], git_repo: Path, tmp_path: Path) -> None:
    """Several tasks land through the merge queue; `wait` on them returns once each has
    landed (the queue's runner is a process of its own)."""
    async with _client(env, git_repo, tmp_path / "server.log") as session:
        ids = []
        for name in ("one", "two"):
            is_error, text, data = await _call_tool(
                session, "run", {"prompt": f"[script:{name}] write {name}.txt",
                                 "title": f"Add {name}.txt"})
            assert not is_error and data is not None, text
            ids += data["ids"]
        is_error, text, data = await _call_tool(session, "wait", {"ids": ids,
                                                                  "timeout": 150})
        assert not is_error and data is not None and data["done"], text
        is_error, text, data = await _call_tool(session, "show", {"id": ids[0]})
        assert not is_error and data is not None, text
        assert data["result"] == "wrote one.txt" and data["files"] == [
            {"path": "one.txt", "status": "untracked", "added": 1, "deleted": 0}], data
        # a person's open review comment stops a landing: a model cannot say "land anyway"
        commented = run_cli(env, git_repo, "review", ids[0], "--comment", "one.txt:1",
                            "why one?")
        assert commented.returncode == 0, commented.stderr
        for tool, args in (("merge", {"id": ids[0]}), ("queue", {"ids": ids})):
            is_error, text, _ = await _call_tool(session, tool, args)
            assert is_error and f"1 review comment is open on {ids[0]}" in text, text
        is_error, text, data = await _call_tool(session, "list", {})
        assert data is not None and all(t["land_state"] is None for t in data["tasks"])
        dropped = run_cli(env, git_repo, "review", ids[0], "--delete", "1")
        assert dropped.returncode == 0, dropped.stderr
        is_error, text, data = await _call_tool(session, "queue", {"ids": ids})
        assert not is_error and data is not None, text
        assert "call wait" in data["summary"]
        is_error, text, data = await _call_tool(session, "wait", {"ids": ids,
                                                                  "timeout": 150})
        assert not is_error and data is not None and data["done"], text
        assert [(t["id"], t["state"]) for t in data["tasks"]] == [
            (ids[0], "merged"), (ids[1], "merged")], data
    assert (git_repo / "one.txt").read_text() == "one\n"
    assert (git_repo / "two.txt").read_text() == "two\n"


@pytest.mark.real_claude
async def test_steering_tools_on_a_running_task(env: dict[str, str], git_repo: Path,
                                                tmp_path: Path) -> None:
    """wait's time running out, say, kill, retry, discard, and a follow-up the task's
    state refuses, each as the CLI does it."""
    async with _client(env, git_repo, tmp_path / "server.log") as session:
        is_error, text, data = await _call_tool(session, "run",
                                                {"prompt": "[script:sleepy] wait"})
        assert not is_error and data is not None, text
        (tid,) = data["ids"]
        deadline = time.monotonic() + 120
        while True:  # until its worker is in its Bash step
            is_error, text, shown = await _call_tool(session, "show", {"id": tid})
            assert not is_error and shown is not None, text
            if shown["state"] == "running" and shown["turns"] >= 1:
                break
            assert time.monotonic() < deadline, shown
            await anyio_sleep(0.2)
        is_error, text, data = await _call_tool(session, "wait", {"ids": [tid],
                                                                  "timeout": 1})
        assert not is_error and data is not None, text
        assert data["done"] is False and data["timed_out"] is True, data
        assert "call wait again" in data["summary"]
        is_error, text, data = await _call_tool(session, "say",
                                                {"id": tid, "text": "hurry up"})
        assert not is_error and data is not None and data["id"] == tid, text
        is_error, text, data = await _call_tool(session, "kill", {"id": tid})
        assert not is_error and data is not None, text
        is_error, text, data = await _call_tool(session, "wait", {"ids": [tid],
                                                                  "timeout": 60})
        assert not is_error and data is not None and data["done"], text
        assert data["tasks"][0]["state"] == "killed", data
        is_error, text, _ = await _call_tool(session, "say", {"id": tid, "text": "hi"})
        assert is_error and "its worker has finished" in text, text
        is_error, text, data = await _call_tool(session, "retry",
                                                {"id": tid, "mode": "resume"})
        assert not is_error and data is not None, text
        assert "resumed attempt" in data["summary"]
        is_error, text, data = await _call_tool(session, "discard", {"id": tid})
        assert not is_error and data is not None and data["discarded"], text
        is_error, text, _ = await _call_tool(session, "follow_up",
                                             {"id": tid, "text": "more"})
        assert is_error and "discarded" in text, text
        is_error, text, _ = await _call_tool(session, "merge", {"id": tid})
        assert is_error and "discarded" in text, text
    listed = json.loads(run_cli(env, git_repo, "ls", "--json").stdout)
    assert [(t["id"], t["state"]) for t in listed] == [(tid, "discarded")]


@pytest.mark.parametrize("scope", ["user", "project"])
def test_install_writes_what_claude_mcp_add_writes(tmp_path: Path, git_repo: Path,
                                                   claude_bin: str, scope: str) -> None:
    """The same entry, in the same file, as Claude Code's own `claude mcp add`."""
    env = _install_env(tmp_path)
    theirs_dir, ours_dir = tmp_path / "theirs", tmp_path / "ours"
    theirs_repo = tmp_path / "theirs-repo"
    subprocess.run(["git", "clone", "-q", str(git_repo), str(theirs_repo)], check=True)
    ours = _fleet_tui(dict(env, CLAUDE_CONFIG_DIR=str(ours_dir)), git_repo, "mcp",
                      "install", "--scope", scope)
    assert ours.returncode == 0, ours.stderr
    config = (ours_dir / ".claude.json") if scope == "user" else git_repo / ".mcp.json"
    entry = json.loads(config.read_text())["mcpServers"]["fleet"]
    added = subprocess.run([claude_bin, "mcp", "add", "--scope", scope, "fleet", "--",
                            entry["command"], *entry["args"]], cwd=theirs_repo,
                           env=dict(env, CLAUDE_CONFIG_DIR=str(theirs_dir)),
                           stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=120)
    assert added.returncode == 0, added.stderr
    their_config = (theirs_dir / ".claude.json") if scope == "user" \
        else theirs_repo / ".mcp.json"
    theirs = json.loads(their_config.read_text())["mcpServers"]["fleet"]
    assert theirs == entry
    if scope == "project":  # byte for byte
        assert their_config.read_text() == config.read_text()
    else:
        assert their_config.stat().st_mode & 0o777 == config.stat().st_mode & 0o777


def test_a_script_takes_values_from_earlier_tool_results() -> None:
    """The endpoint's `$from_results`: what lets a scripted orchestrator pass on ids."""
    from endpoint_helpers import assemble, post, request_body

    scripts = {"pass": [
        "first",
        [{"type": "tool_use", "name": "t", "input": {
            "one": {"$from_results": r"id (\w+)"},
            "second": {"$from_results": r"id (\w+), id (\w+)", "group": 2},
            "every": {"$from_results": r"id (\w+)", "all": True},
            "none": {"$from_results": r"nothing (\d+)"},
            "kept": ["{cwd}", {"plain": 1}]}}],
    ]}
    results = [{"type": "tool_result", "tool_use_id": "toolu_prev0",
                "content": [{"type": "text", "text": '{"summary": "id ab12cd, id ef34gh"}'}]}]
    with ScriptedEndpoint(scripts) as ep:
        reply = post(ep.url, request_body(prompt="[script:pass] go", turns_done=1,
                                          tool_results=results, cwd="/w"))
    (block,) = assemble(reply.events)
    assert block["input"] == {"one": "ab12cd", "second": "ef34gh",
                              "every": ["ab12cd", "ef34gh"],
                              "none": "(no earlier tool result matches 'nothing (\\\\d+)')",
                              "kept": ["/w", {"plain": 1}]}
