"""`fleet-tui scripted-endpoint [--port P] [--delay S] [--script FILE]`: try fleet-tui on
your own repository without a key.

It serves the project's scripted Anthropic-compatible endpoint (the demo's and the tests',
`fleet_tui.demo.endpoint`) on 127.0.0.1 until Ctrl+C, and prints the settings that make it
an endpoint of config.toml named `scripted`. Workers sent there run the real `claude` in
their own worktree of your repository; what they "say" and which tools they call is the
script's: by default they look around, read the README and write one new file, so the
whole path (the stream, the diff, a merge or a discard) can be walked through for real.
Nothing leaves the machine and no key is checked.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

NAME = "scripted"
KEY_ENV = "FLEET_SCRIPTED_KEY"
DEFAULT_PORT = 8429
NOTE = "NOTES-from-a-scripted-worker.md"


def _tool(name: str, **inputs: Any) -> dict[str, Any]:
    return {"type": "tool_use", "name": name, "input": inputs}


def own_repo_scripts() -> dict[str, Any]:
    """What a worker plays on any repository: a look around, the README, one new file (it
    changes nothing that was there), and a follow-up or a message answered in kind."""
    turns: list[Any] = [
        [{"type": "text", "text": "I'll look around the repository first."},
         _tool("Bash", command="git ls-files | head -n 20", description="list some files")],
        [_tool("Bash", command="ls README* 2>/dev/null | head -n 1 | xargs -r head -n 20",
               description="read the start of the README")],
        [{"type": "text", "text": "Writing my notes in a new file."},
         _tool("Write", file_path="{cwd}/" + NOTE,
               content="# Notes from a scripted worker\n\nThis file was written by "
                       "fleet-tui's scripted endpoint (no model, no key): review the "
                       "diff, then merge or discard it.\n\nThe prompt was: {prompt}\n")],
        [_tool("Bash", command="git status --short", description="show the change")],
        f"Done: {NOTE} written. This was a scripted worker: review the diff, then merge or "
        "discard it.",
    ]
    followup: list[Any] = [
        [{"type": "text", "text": "Following up on: {prompt}"},
         _tool("Bash", command="git status --short", description="look at the change")],
        "A scripted worker only plays its script: the notes stay as they are.",
    ]
    return {"default": {"turns": turns, "followup": followup}}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleet-tui scripted-endpoint",
        description="Serve a scripted Anthropic-compatible endpoint on 127.0.0.1 (no key, "
                    "nothing leaves this machine) and print the settings that make it the "
                    f"endpoint {NAME!r}: try fleet-tui on your own repository. Ctrl+C stops "
                    "it.")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, metavar="P",
                        help=f"the port (default {DEFAULT_PORT}; 0: any free one)")
    parser.add_argument("--delay", type=float, default=0.3, metavar="SECONDS",
                        help="a pause between the answer's pieces, to watch it (default 0.3)")
    parser.add_argument("--script", type=Path, default=None, metavar="FILE",
                        help="your own script: a JSON file or a folder of them (see "
                             "fleet_tui/demo/endpoint.py); default: look around, write one "
                             "new file")
    return parser


def settings_text(url: str) -> str:
    """The config.toml table that makes the endpoint at `url` the endpoint `scripted`."""
    return (f"[endpoints.{NAME}]\n"
            f'base_url = "{url}"\n'
            f'key_env = "{KEY_ENV}"\n')


def main(argv: list[str]) -> int:
    from fleet_tui.core.errors import FleetTuiError
    from fleet_tui.demo.endpoint import ScriptedEndpoint
    from fleet_tui.settings.config import config_file_path

    args = _parser().parse_args(argv)
    if not 0 <= args.port <= 65535:
        sys.stderr.write(f"fleet-tui scripted-endpoint: --port {args.port}: expected 0 to "
                         "65535\n")
        return 2
    try:
        endpoint = ScriptedEndpoint(args.script if args.script is not None
                                    else own_repo_scripts(),
                                    event_delay=max(0.0, args.delay), port=args.port)
        endpoint.start()
    except FleetTuiError as exc:  # a malformed script
        sys.stderr.write(f"fleet-tui scripted-endpoint: {exc.message}\n")
        return exc.exit_code
    except OSError as exc:
        sys.stderr.write(f"fleet-tui scripted-endpoint: cannot listen on 127.0.0.1:"
                         f"{args.port}: {exc.strerror or exc}; choose another --port (0: "
                         "any free one)\n")
        return 2
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    try:
        print(f"fleet-tui scripted-endpoint: serving at {endpoint.url} (port "
              f"{endpoint.port}; no key checked, nothing leaves this machine; Ctrl+C stops "
              f"it)\n\nPoint fleet-tui at it as the endpoint {NAME!r}: add this to "
              f"{config_file_path()}\n\n{settings_text(endpoint.url)}\n"
              f"then, in another shell, in your repository:\n"
              f"  export {KEY_ENV}=not-a-secret     # any value: it checks none\n"
              f"  fleet-tui run --endpoint {NAME} \"start a changelog\" --wait\n"
              f"or open the panel (`fleet-tui`), press n and choose the endpoint {NAME}.",
              flush=True)
        while not done.wait(0.5):
            pass
    finally:
        endpoint.stop()
    print("fleet-tui scripted-endpoint: stopped", flush=True)
    return 0
