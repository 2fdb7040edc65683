"""STAND-IN for the claude binary, for launcher tests (records what it was given).

The real claude is used where a test needs its behaviour (see the real_claude tests);
what the launcher tests need is to see exactly what claude *receives*, which the real
binary does not report. This stand-in writes its argv, environment, cwd, pid and stdin
as JSON to the file named by FLEET_STANDIN_RECORD, then exits with FLEET_STANDIN_EXIT
(default 0). With FLEET_STANDIN_WAIT=1 it waits (up to 30 s) after recording, so a test
can look at /proc/<pid>/cmdline or send it a signal. `--version` prints a version line.
Tests run it through a small executable wrapper script that FLEET_WORKER_CLAUDE points to.

Like the real claude (checked with 2.1.197 and 2.1.332), it runs the `apiKeyHelper` of a
`--settings` JSON argument once, with `/bin/sh -c`, and records what the helper printed as
`helper_key` (and `helper_exit`): that is the key claude would send.

A second mode stands in for claude's *output* at a fixed rate, for the ingest load test of
tests/engine/test_reliability.py (what is measured there is the engine's ingest, which no real
claude can drive at 200 events a second): with FLEET_STANDIN_STREAM=RATE:COUNT it runs the
key helper, reads its prompt, then writes COUNT stream-json lines shaped like 2.1.197's
(an init line, turns of assistant text, a Bash tool_use and its tool_result, and a success
result whose usage and num_turns add up what came before) to stdout, one write per line,
line i at i/RATE seconds after the first (late lines go at once, so the count is exact). With
FLEET_STANDIN_CAPTURE=DIR it first appends each line to DIR/<FLEET_ATTEMPT_TOKEN>.stdout, the
independent copy of what it wrote, and at the end writes DIR/<token>.timing (JSON: first
and last write, lines). `stream_wrapper` writes a `claude` that sets both.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STANDIN_VERSION = "0.0.0-standin (Claude Code stand-in)"


def install(folder: Path) -> Path:
    """Write an executable `claude` wrapper in folder that execs this stand-in (exec keeps
    the pid, so a test can compare pids); point FLEET_WORKER_CLAUDE at it."""
    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / "claude"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def stream_wrapper(folder: Path, rate: int, count: int, capture: Path) -> Path:
    """An executable `claude` in folder that runs this stand-in in its stream mode (the
    settings are in the script: the launcher passes claude only the environment it knows)."""
    import shlex

    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / "claude"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"FLEET_STANDIN_STREAM={rate}:{count} FLEET_STANDIN_CAPTURE={shlex.quote(str(capture))} "
        f"exec {shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).resolve()))} "
        '"$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def stream_lines(count: int, cwd: str, session: str) -> Iterator[bytes]:
    """`count` stream-json lines (count >= 2): init, turns, a success result."""
    model = "standin-model-1"
    yield _line({"type": "system", "subtype": "init", "cwd": cwd, "session_id": session,
                 "tools": ["Bash", "Edit", "Read", "Write"], "mcp_servers": [],
                 "model": model, "permissionMode": "bypassPermissions",
                 "apiKeySource": "none", "claude_code_version": "2.1.197",
                 "output_style": "default", "uuid": f"{session}-init"})
    turns = in_tokens = out_tokens = 0
    filler = "the steady stream of a busy worker, " * 8
    for i in range(1, count - 1):
        turn, part = divmod(i - 1, 3)
        mid = f"msg_standin_{session[:8]}_{turn:07d}"
        usage = {"input_tokens": 100 + turn % 17, "output_tokens": 1 + turn % 7,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        if part == 0:
            turns += 1
            in_tokens += usage["input_tokens"]
            out_tokens += usage["output_tokens"]
            content: list[dict[str, Any]] = [
                {"type": "text", "text": f"Step {turn}: {filler}(line {i})"}]
        elif part == 1:
            content = [{"type": "tool_use", "id": f"toolu_standin_{turn:07d}", "name": "Bash",
                        "input": {"command": f"echo step {turn}", "description": "step"}}]
        else:
            yield _line({"type": "user", "message": {"role": "user", "content": [
                {"tool_use_id": f"toolu_standin_{turn:07d}", "type": "tool_result",
                 "content": f"step {turn}"}]}, "parent_tool_use_id": None,
                "session_id": session, "uuid": f"{session}-{i}"})
            continue
        yield _line({"type": "assistant", "message": {
            "id": mid, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": None, "stop_sequence": None, "usage": usage},
            "parent_tool_use_id": None, "session_id": session, "uuid": f"{session}-{i}"})
    yield _line({"type": "result", "subtype": "success", "is_error": False,
                 "duration_ms": 1, "duration_api_ms": 1, "num_turns": turns,
                 "result": f"wrote {count} lines", "session_id": session,
                 "total_cost_usd": 0, "usage": {"input_tokens": in_tokens,
                                                "output_tokens": out_tokens}})


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _stream_main(spec: str) -> int:
    rate_text, _, count_text = spec.partition(":")
    rate, count = float(rate_text), max(2, int(count_text))
    _run_key_helper(sys.argv[1:])
    if not os.isatty(0):
        with contextlib.suppress(OSError):
            # the prompt: its first line (the runner keeps stdin open, as claude reads
            # stream-json input, until the result line)
            sys.stdin.buffer.readline()
    token = os.environ.get("FLEET_ATTEMPT_TOKEN", "")
    folder = os.environ.get("FLEET_STANDIN_CAPTURE")
    capture = None
    if folder and token:
        capture = open(os.path.join(folder, f"{token}.stdout"), "ab", buffering=0)  # noqa: SIM115
    session = str(uuid.uuid4())
    first = last = 0.0
    start = time.monotonic()
    for i, line in enumerate(stream_lines(count, os.getcwd(), session)):
        wait = start + i / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        if capture is not None:
            capture.write(line)
        view = memoryview(line)
        while view:
            view = view[os.write(1, view):]
        last = time.time()
        first = first or last
    if capture is not None:
        capture.close()
        with open(os.path.join(folder or ".", f"{token}.timing"), "w") as fh:
            json.dump({"first": first, "last": last, "lines": count}, fh)
    return 0


def read_record(path: Path, timeout: float = 10.0) -> dict[str, Any]:
    """The stand-in's record, waiting up to timeout seconds for it to appear."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the stand-in wrote no record to {path} in {timeout} s")
        time.sleep(0.01)
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _run_key_helper(argv: list[str]) -> tuple[str | None, int | None]:
    """(what the apiKeyHelper of a --settings JSON printed, its exit code), or Nones."""
    import subprocess

    for index, arg in enumerate(argv[:-1]):
        if arg == "--settings":
            try:
                helper = json.loads(argv[index + 1]).get("apiKeyHelper")
            except (ValueError, AttributeError):
                return None, None
            if not helper:
                return None, None
            out = subprocess.run(["/bin/sh", "-c", helper], capture_output=True, text=True,
                                 timeout=90, stdin=subprocess.DEVNULL)
            return out.stdout.strip(), out.returncode
    return None, None


def main() -> int:
    if "--version" in sys.argv[1:]:
        print(STANDIN_VERSION)
        return 0
    if os.environ.get("FLEET_STANDIN_STREAM"):
        return _stream_main(os.environ["FLEET_STANDIN_STREAM"])
    stdin_text: str | None
    if os.isatty(0):
        stdin_text = None
    else:
        try:
            stdin_text = sys.stdin.read()
        except OSError:
            stdin_text = None
    helper_key, helper_exit = _run_key_helper(sys.argv[1:])
    record = {
        "helper_key": helper_key,
        "helper_exit": helper_exit,
        "argv": sys.argv[1:],
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "pid": os.getpid(),
        "stdin": stdin_text,
        "stdin_is_devnull": os.path.samestat(os.fstat(0), os.stat(os.devnull)),
    }
    target = os.environ.get("FLEET_STANDIN_RECORD")
    if target:
        tmp = target + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(record, handle)
        os.replace(tmp, target)  # the test sees a whole file or none
    if os.environ.get("FLEET_STANDIN_WAIT") == "1":
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.05)
    return int(os.environ.get("FLEET_STANDIN_EXIT", "0"))


if __name__ == "__main__":
    sys.exit(main())
