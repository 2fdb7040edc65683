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
"""

from __future__ import annotations

import json
import os
import sys
import time
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
