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
from typing import Any

import pytest
from endpoint_helpers import cli_env, run_cli
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.types import CallToolResult

from fleet_tui.demo.endpoint import RecordedRequest, ScriptedEndpoint

ROOT = Path(__file__).resolve().parent.parent
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
    # CLI 2.1.197 connects MCP servers in the background and tells a model that calls a
    # tool too early to call WaitForMcpServers first: what a model does
    [{"type": "tool_use", "name": "WaitForMcpServers", "input": {}}],
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
SCRIPTS: dict[str, Any] = {"orchestrator": ORCHESTRATOR, "worker": WORKER,
                           "chat": ["done"]}


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
                   MCP_TIMEOUT="120000", MCP_TOOL_TIMEOUT="600000")
    # the workers' key is not the orchestrator's: the server (and its workers) read it
    # from ZHIPU_API_KEY, which claude passes on to the servers it starts
    run_env.update(FLEET_WORKER_KEY_SOURCES="zhipu", ZHIPU_API_KEY=KEY)
    return subprocess.run(
        [claude, "-p", "[script:orchestrator] split the change for the fleet",
         "--output-format", "stream-json", "--verbose", "--mcp-config", str(config),
         "--strict-mcp-config", "--allowedTools", "mcp__fleet", "--model", "sonnet"],
        cwd=repo, env=run_env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=600)


def _orchestrator_results(endpoint: ScriptedEndpoint) -> list[tuple[bool, str]]:
    """What each of the orchestrator's tool calls answered, in order."""
    requests: list[RecordedRequest] = [r for r in endpoint.requests
                                       if r.script == "orchestrator" and r.status == 200]
    by_turn = {r.turn: r for r in requests}
    return [(res.is_error, res.text) for turn in sorted(by_turn) if turn
            for res in by_turn[turn].tool_results]


def test_orchestrator_claude_runs_waits_reads_and_merges(
        env: dict[str, str], git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint,
        tmp_path: Path) -> None:
    out = _orchestrator(claude_bin, env, git_repo, tmp_path, endpoint)
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines and lines[-1]["type"] == "result", (out.stdout[-3000:], out.stderr[-3000:])
    init = next(x for x in lines if x.get("subtype") == "init")
    assert [s["name"] for s in init["mcp_servers"]] == ["fleet"], init  # (it connects on)
    waited, *results = _orchestrator_results(endpoint)
    assert not waited[0] and "fleet" in waited[1], waited
    assert len(results) == len(ORCHESTRATOR) - 2, results
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
