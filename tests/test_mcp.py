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
