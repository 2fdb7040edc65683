"""Helpers for talking to the scripted endpoint from tests, as a client would."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from collections.abc import Iterator


@dataclass
class Reply:
    """One HTTP answer: status, headers (lower-case) and either SSE events or JSON."""

    status: int
    headers: dict[str, str]
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    json: Any = None

    def names(self) -> list[str]:
        return [name for name, _ in self.events]


def request_body(*, turns_done: int = 0, prompt: str = "do it", stream: bool = True,
                 model: str = "fake-model-1", cwd: str | None = "/work/somewhere",
                 tool_results: list[dict[str, Any]] | None = None,
                 system_in_middle: bool = False) -> dict[str, Any]:
    """A request shaped like the CLI's (system prompt naming the cwd, a reminder, history)."""
    system = [{"type": "text", "text": "You are a Claude agent."}]
    if cwd is not None:
        system.append({"type": "text", "text": "# Environment\n - Primary working directory: "
                                               f"{cwd}\n - Is a git repository: true\n"})
    first: dict[str, Any] = {"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>\nToday is a day.\n</system-reminder>\n"},
        {"type": "text", "text": prompt}]}
    messages: list[dict[str, Any]] = [first]
    if system_in_middle:
        messages.append({"role": "system", "content": "Available agent types: ..."})
    for i in range(turns_done):
        messages.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_prev{i}", "name": "Bash", "input": {}}]})
        results = tool_results if (tool_results and i == turns_done - 1) else [
            {"type": "tool_result", "tool_use_id": f"toolu_prev{i}", "content": "ok"}]
        messages.append({"role": "user", "content": results})
    return {"model": model, "max_tokens": 100, "system": system, "messages": messages,
            "stream": stream}


def parse_sse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """`event:`/`data:` frames -> [(event name, data)]; strict about the framing."""
    events: list[tuple[str, dict[str, Any]]] = []
    for frame in raw.decode().split("\n\n"):
        if not frame.strip():
            continue
        name, data = "", ""
        for line in frame.split("\n"):
            key, _, value = line.partition(": ")
            if key == "event":
                name = value
            elif key == "data":
                data += value
        payload = json.loads(data)
        assert payload["type"] == name, f"event name {name!r} != data type {payload['type']!r}"
        events.append((name, payload))
    return events


def post(url: str, body: Any, *, headers: dict[str, str] | None = None,
         path: str = "/v1/messages?beta=true", timeout: float = 10.0,
         conn: http.client.HTTPConnection | None = None) -> Reply:
    """POST a body (dict -> JSON) and read the whole answer."""
    own = conn is None
    if conn is None:
        parts = urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port,
                                          timeout=timeout)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
    hdrs.update(headers or {})
    try:
        conn.request("POST", path, body=data, headers=hdrs)
        resp = conn.getresponse()
        raw = resp.read()
        reply = Reply(status=resp.status,
                      headers={k.lower(): v for k, v in resp.getheaders()})
        if reply.headers.get("content-type", "").startswith("text/event-stream"):
            reply.events = parse_sse(raw)
        elif raw:
            reply.json = json.loads(raw)
        return reply
    finally:
        if own:
            conn.close()


def assemble(events: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rebuild the content blocks from an SSE stream, as an SDK client does."""
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, str] = {}
    for name, data in events:
        if name == "content_block_start":
            blocks[data["index"]] = dict(data["content_block"])
            partial[data["index"]] = ""
        elif name == "content_block_delta":
            idx, delta = data["index"], data["delta"]
            if delta["type"] == "text_delta":
                blocks[idx]["text"] += delta["text"]
            elif delta["type"] == "input_json_delta":
                partial[idx] += delta["partial_json"]
            elif delta["type"] == "thinking_delta":
                blocks[idx]["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                blocks[idx]["signature"] = delta["signature"]
        elif name == "content_block_stop":
            idx = data["index"]
            if blocks[idx]["type"] == "tool_use":
                blocks[idx]["input"] = json.loads(partial[idx] or "{}")
    return [blocks[i] for i in sorted(blocks)]


def cli_env(url: str, claude: str, key: str | None, **extra: str) -> dict[str, str]:
    """The environment a test gives `fleet-tui` (a subprocess of this checkout) to run real
    workers against the scripted endpoint at `url`: the key from the environment only (None:
    no key there), no CLI retries, a fast engine tick. `extra` adds or overrides."""
    import os
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_AUTH_TOKEN"}
    env.update(FLEET_WORKER_BASE_URL=url, FLEET_WORKER_CLAUDE=claude,
               FLEET_WORKER_KEY_SOURCES="env", CLAUDE_CODE_MAX_RETRIES="0",
               FLEET_TUI_TICK="0.05",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    if key is not None:
        env["ANTHROPIC_AUTH_TOKEN"] = key
    env.update(extra)
    return env


def run_cli(env: dict[str, str], cwd: Path, *args: str, timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
    """`fleet-tui ARGS` in cwd with env and no input; a traceback fails the test."""
    out = subprocess.run([sys.executable, "-m", "fleet_tui.cli", *args], cwd=cwd, env=env,
                         input="", capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in out.stderr, out.stderr
    return out


def poll_pauses(first: float = 0.2, most: float = 1.0) -> Iterator[float]:
    """The pauses between two looks of a loop that polls a `fleet-tui` command (each look a
    process that loads the engine, ~0.15 CPU-s): short at first, then growing to `most`, so
    that a wait on a worker of several seconds costs a few looks, not dozens."""
    pause = first
    while True:
        yield pause
        pause = min(most, pause * 1.5)


def shared(repo: Path, name: str) -> Path:
    """A folder a worker's Bash step and the test both reach: the repository's cache
    folder (its workers' caches, which a caged worker may write; the test's own folder is
    outside the cage)."""
    from fleet_tui.execution.worker import cage

    folder = Path(cage.repo_cache_dir(cage.default_data_dir(os.environ), str(repo))) / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder
