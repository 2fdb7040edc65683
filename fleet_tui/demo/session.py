"""`fleet-tui --demo`: a real fleet against a scripted local endpoint, no API key needed.

It builds a scratch git repository with a small project, starts the scripted endpoint on
127.0.0.1 (fleet_tui.demo.endpoint), points the workers at it with a dummy key, submits a few
tasks whose scripts do visible work at human speed (edits that make real diffs, a 529
the CLI retries through, two tasks that change the same lines), and opens the panel.
The workers are the real `claude` binary; only the model behind the endpoint is scripted.

The endpoint runs as its own detached process (`python -m fleet_tui.demo.endpoint`, in its own
session, logged in the demo folder's `endpoint/`), so that, as in a real run, workers keep
running after the panel quits. The next `fleet-tui --demo` reuses it while it is alive.
It stops by itself once no client has been connected for ENDPOINT_IDLE_EXIT seconds: no
worker talking to it and no demo panel open (each panel holds a connection to it while it
runs, which the kernel closes however the panel ends).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_tui import CLAUDE_CODE_VERSION
from fleet_tui.core.errors import FleetTuiError
from fleet_tui.core.terminal import visible
from fleet_tui.system import paths

DEMO_KEY = "demo-key"  # the scripted endpoint accepts any key; this one is not a secret
EVENT_DELAY = 0.2  # seconds between SSE events: tool calls arrive at reading speed
ENDPOINT_IDLE_EXIT = 60.0  # the endpoint exits after this long with no client connected
ENDPOINT_START = 15.0  # seconds to wait for a new endpoint process to listen
# what the endpoint process inherits: no credential, nothing of the user's settings
_ENDPOINT_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH")

# --- the scratch project -----------------------------------------------------------------

PROJECT_FILES: dict[str, str] = {
    # what running its tests leaves (a Python that writes bytecode): never part of a change
    ".gitignore": "__pycache__/\n",
    "README.md": "# inventory\n\nA tiny stock-keeping library used by the fleet-tui demo.\n",
    "inventory.py": (
        '"""Stock keeping for a small shop."""\n'
        "\n"
        "\n"
        "def add_item(stock, name, count):\n"
        '    """Add count units of name to stock."""\n'
        "    stock[name] = stock.get(name, 0) + count\n"
        "    return stock\n"
        "\n"
        "\n"
        "def remove_item(stock, name, count):\n"
        '    """Take count units of name out of stock."""\n'
        "    stock[name] = stock.get(name, 0) - count\n"
        "    return stock\n"
    ),
    "greeting.py": (
        '"""What the shop says at the door."""\n'
        "\n"
        'GREETING = "Welcome!"\n'
        "\n"
        "\n"
        "def greet(name):\n"
        '    return f"{GREETING} {name}"\n'
    ),
    "test_inventory.py": (
        "import unittest\n"
        "\n"
        "from inventory import add_item, remove_item\n"
        "\n"
        "\n"
        "class InventoryTest(unittest.TestCase):\n"
        "    def test_add(self):\n"
        '        self.assertEqual(add_item({}, "pen", 2), {"pen": 2})\n'
        "\n"
        "    def test_remove(self):\n"
        '        self.assertEqual(remove_item({"pen": 3}, "pen", 1), {"pen": 2})\n'
        "\n"
        "\n"
        'if __name__ == "__main__":\n'
        "    unittest.main()\n"
    ),
}

_REMOVE_OLD = (
    "    stock[name] = stock.get(name, 0) - count\n"
    "    return stock\n"
)
_REMOVE_NEW = (
    "    have = stock.get(name, 0)\n"
    "    if count > have:\n"
    '        raise ValueError(f"only {have} {name} in stock, cannot remove {count}")\n'
    "    stock[name] = have - count\n"
    "    return stock\n"
)
_TEST_NEW = (
    "import unittest\n"
    "\n"
    "from inventory import add_item, remove_item\n"
    "\n"
    "\n"
    "class InventoryTest(unittest.TestCase):\n"
    "    def test_add(self):\n"
    '        self.assertEqual(add_item({}, "pen", 2), {"pen": 2})\n'
    "\n"
    "    def test_remove(self):\n"
    '        self.assertEqual(remove_item({"pen": 3}, "pen", 1), {"pen": 2})\n'
    "\n"
    "    def test_remove_too_many(self):\n"
    "        with self.assertRaises(ValueError):\n"
    '            remove_item({"pen": 1}, "pen", 5)\n'
    "\n"
    "\n"
    'if __name__ == "__main__":\n'
    "    unittest.main()\n"
)
_README_USAGE = (
    "# inventory\n\nA tiny stock-keeping library used by the fleet-tui demo.\n\n"
    "## Usage\n\n"
    "```python\n"
    "from inventory import add_item, remove_item\n\n"
    "stock = add_item({}, \"pen\", 10)\n"
    "remove_item(stock, \"pen\", 3)   # {'pen': 7}\n"
    "```\n\n"
    "Run the tests with `python3 -m unittest -q`.\n"
)


def _tool(name: str, **inputs: Any) -> dict[str, Any]:
    return {"type": "tool_use", "name": name, "input": inputs}


def _say(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


# When an update from main stopped on conflicts (`u`, then "let the worker resolve it"),
# the demo's worker keeps what both sides meant to do: in each conflicted hunk, two
# versions of one `NAME = "text"` line become one line with both texts (main's first),
# anything else keeps main's lines and then the task's; it stages the files and concludes
# the merge. Otherwise it only looks at the worktree. (A scripted stand-in for a model's
# judgement: the demo's two greeting tasks change the same line, so landing the second
# shows it, and main keeps both greetings.)
_KEEP_BOTH = r"""import re, sys
HUNK = re.compile(r"<{7} [^\n]*\n(.*?)(?:[|]{7}[^\n]*\n.*?)?={7}\n(.*?)>{7} [^\n]*\n", re.S)
LINE = re.compile(r'(\s*\w+ = )"(.*)"\n')
def both(m):
    ours, theirs = LINE.fullmatch(m.group(1)), LINE.fullmatch(m.group(2))
    if ours and theirs and ours.group(1) == theirs.group(1):
        return f'{theirs.group(1)}"{theirs.group(2)} {ours.group(2)}"\n'
    return m.group(2) + m.group(1)
left = []
for path in sys.argv[1:]:
    with open(path) as fh:
        text = HUNK.sub(both, fh.read())
    with open(path, "w") as fh:
        fh.write(text)
    if re.search(r"^(<{7}|>{7})( |$)", text, re.M):
        left.append(path)
if left:
    sys.exit("conflict markers are still in: " + " ".join(left))
"""
# A review sent to a demo worker (`ctrl+r`, `fleet-tui review --send`) is answered in
# kind: each commented line (new side) gets a note appended, so the comments' lines
# change and the review shows them **addressed**. (The message is the review's own
# format, core.review.review_message: "N. FILE:START-END" then the quoted lines.)
_ADDRESS_REVIEW = r"""import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
done = []
for m in re.finditer(r"^\d+\. (\S+?):(\d+)(?:-(\d+))?( \(deleted)?", text, re.M):
    if m.group(4):
        continue  # deleted lines: nothing left to change
    path, first, last = m.group(1), int(m.group(2)), int(m.group(3) or m.group(2))
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().split("\n")
    except OSError:
        continue
    note = "  # changed after the review" if path.endswith(".py") else " (changed after the review)"
    for i in range(first - 1, min(last, len(lines))):
        if lines[i].strip() and not lines[i].endswith(note):
            lines[i] += note
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines))
    done.append(m.group(0)[m.group(0).index(" ") + 1:])
print("addressed: " + (", ".join(done) or "nothing to change"))
"""
_RESOLVE_OR_LOOK = (
    'conflicted=$(git diff --name-only --diff-filter=U)\n'
    'if [ -n "$conflicted" ]; then\n'
    "python3 - $conflicted <<'PY' &&\n" + _KEEP_BOTH + "PY\n"
    'git add -- $conflicted && git commit --no-edit -q && '
    'echo "kept both sides of: $conflicted"\n'
    'elif printf %s \'{prompt_b64}\' | base64 -d | grep -q "^Review of your changes"; then\n'
    'f=$(mktemp) && printf %s \'{prompt_b64}\' | base64 -d > "$f" && '
    "python3 - \"$f\" <<'PY'\n" + _ADDRESS_REVIEW + "PY\n"
    'rm -f "$f"\n'
    'else git status --short; fi'
)

# What every demo script plays when the user sends a follow-up (`f`, or the update's "let
# the worker resolve it"): a look at the worktree (resolving an update's conflicts), then
# an answer that quotes the follow-up's first line.
FOLLOWUP_TURNS: list[Any] = [
    [_say("Following up on: {prompt}"),
     _tool("Bash", command=_RESOLVE_OR_LOOK,
           description="resolve the update's conflicts, answer a review, or look at the "
                       "worktree")],
    "Follow-up done: {prompt}",
]


def demo_scripts() -> dict[str, Any]:
    """The scripts the endpoint plays; a task picks one with `[script:NAME]`."""
    scripts = _demo_scripts()
    for script in scripts.values():
        script.setdefault("followup", FOLLOWUP_TURNS)
    return scripts


def _demo_scripts() -> dict[str, Any]:
    return {
        # Launched from the form without a marker: a short, visible change.
        "default": {"delay": 0.35, "turns": [
            [_say("I'll look at the project first."),
             _tool("Bash", command="ls", description="list the project")],
            [_tool("Read", file_path="{cwd}/README.md")],
            [_say("Adding a changelog with this change."),
             _tool("Write", file_path="{cwd}/CHANGELOG.md",
                   content="# Changelog\n\n- Started a changelog (written by a fleet "
                           "worker).\n")],
            [_tool("Bash", command="git status --short", description="show the change")],
            "Done: CHANGELOG.md created. Review the diff and merge it when it looks right.",
        ]},
        # The worker to steer, as the README suggests first: after a look around it waits
        # for the user's message (`s`), saying so and how long, and answers it; without
        # one it goes on after 90 s (tests scale the waits with FLEET_ENDPOINT_PACE).
        "validate": {"delay": 0.6, "listen": {
            "at": 2, "times": 9, "seconds": 10,
            "wait": [_tool("Bash", command="echo 'waiting for your message (press s): "
                                   "{left} more'",
                           description="waiting for your message (press s): {left} more")],
            "heard": [[_say("You said: {message}. Noted; going on with that in mind."),
                       _tool("Bash", command="git status --short",
                             description="look at the worktree")]],
        }, "turns": [
            [_say("Let me read the inventory module."),
             _tool("Read", file_path="{cwd}/inventory.py")],
            [_say("Before I change anything: tell me what you want (press s and type it). "
                  "I wait up to 90 s."),
             _tool("Bash", command="grep -n remove_item *.py", description="find callers")],
            [_say("remove_item lets stock go negative. I'll refuse to remove more than "
                  "there is."),
             _tool("Edit", file_path="{cwd}/inventory.py", old_string=_REMOVE_OLD,
                   new_string=_REMOVE_NEW)],
            [_tool("Read", file_path="{cwd}/test_inventory.py")],
            [_tool("Write", file_path="{cwd}/test_inventory.py", content=_TEST_NEW)],
            [_tool("Bash", command="python3 -m unittest -q 2>&1 | tail -3",
                   description="run the tests")],
            "remove_item now raises ValueError instead of going negative; a test covers "
            "it and the suite passes.",
        ]},
        # The endpoint answers 529 twice; the CLI retries by itself and recovers.
        "docs": {"delay": 0.35, "faults": [{"status": 529, "times": 2}], "turns": [
            [_tool("Read", file_path="{cwd}/README.md")],
            [_tool("Read", file_path="{cwd}/inventory.py")],
            [_say("Writing a usage section."),
             _tool("Write", file_path="{cwd}/README.md", content=_README_USAGE)],
            [_tool("Bash", command="head -5 README.md", description="check the result")],
            "README.md now has a usage example.",
        ]},
        # These two change the same line: merge one, the other shows a conflict.
        "greet-formal": {"delay": 0.6, "turns": [
            [_tool("Read", file_path="{cwd}/greeting.py")],
            [_tool("Edit", file_path="{cwd}/greeting.py",
                   old_string='GREETING = "Welcome!"',
                   new_string='GREETING = "Good day, and welcome to our shop."')],
            [_tool("Bash", command="python3 -c 'import greeting; print(greeting.greet(\"Ada\"))'",
                   description="try it")],
            "The greeting is more formal now.",
        ]},
        "greet-casual": {"delay": 0.7, "turns": [
            [_tool("Read", file_path="{cwd}/greeting.py")],
            [_tool("Edit", file_path="{cwd}/greeting.py",
                   old_string='GREETING = "Welcome!"',
                   new_string='GREETING = "Hey there, come on in!"')],
            [_tool("Bash", command="python3 -c 'import greeting; print(greeting.greet(\"Bo\"))'",
                   description="try it")],
            "The greeting is more casual now.",
        ]},
    }


DEMO_TASKS: list[tuple[str, str]] = [
    ("Refuse to remove more stock than there is",
     "[script:validate] remove_item lets the stock go negative. Make it raise a ValueError "
     "instead, and add a test."),
    ("Document how to use the library",
     "[script:docs] Add a usage section to README.md."),
    ("Make the greeting formal",
     "[script:greet-formal] Make the shop's greeting more formal."),
    ("Make the greeting casual",
     "[script:greet-casual] Make the shop's greeting more casual."),
]


def create_project(repo: Path) -> Path:
    """A fresh git repository on branch main with the demo project committed."""
    repo.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GIT_AUTHOR_NAME": "fleet-tui demo",
           "GIT_AUTHOR_EMAIL": "demo@fleet-tui.invalid",
           "GIT_COMMITTER_NAME": "fleet-tui demo",
           "GIT_COMMITTER_EMAIL": "demo@fleet-tui.invalid"}

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)

    git("init", "-q", "-b", "main")
    git("config", "user.name", "fleet-tui demo")
    git("config", "user.email", "demo@fleet-tui.invalid")
    for name, text in PROJECT_FILES.items():
        (repo / name).write_text(text, encoding="utf-8")
    git("add", "-A")
    git("commit", "-q", "-m", "The inventory project")
    return repo


# --- finding or installing claude ----------------------------------------------------------

def find_claude_binary(env: Mapping[str, str] | None = None) -> str | None:
    """FLEET_WORKER_CLAUDE, then `claude` on PATH, then the CLI the demo installed: the
    launcher's own lookup, None instead of an error."""
    from fleet_tui.engine.localhost import find_claude_named

    env = os.environ if env is None else env
    return find_claude_named(env.get("FLEET_WORKER_CLAUDE") or "claude", env)


def install_command(env: Mapping[str, str] | None = None) -> list[str]:
    return ["npm", "install", "--prefix", str(paths.cli_install_dir(env)), "--no-audit",
            "--no-fund", f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}"]


def ensure_claude(ask: Callable[[str], str] = input, out: Callable[[str], None] = print,
                  env: Mapping[str, str] | None = None) -> str | None:
    """The claude binary for the demo; offers to install the pinned CLI when missing."""
    found = find_claude_binary(env)
    if found:
        return found
    command = install_command(env)
    out("fleet-tui --demo runs real Claude Code workers, but `claude` was not found "
        "(not on PATH, not in FLEET_WORKER_CLAUDE, not in "
        f"{paths.cli_install_dir(env)}).")
    npm = shutil.which("npm", path=(os.environ if env is None else env).get("PATH"))
    if npm is None:
        out("npm is not installed. Install Node.js (which brings npm), then run:\n  "
            + " ".join(command) + "\nor set FLEET_WORKER_CLAUDE to a claude binary.")
        return None
    try:
        answer = ask(f"Install Claude Code {CLAUDE_CODE_VERSION} with `{' '.join(command)}`? "
                     "[y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        out("Not installed. To do it by hand:\n  " + " ".join(command))
        return None
    out(f"Installing Claude Code {CLAUDE_CODE_VERSION} (a minute or so)...")
    # npm's own chatter (`npm warn install-scripts ...`, deprecation notices) is kept off
    # the screen: what matters is whether it worked; on a failure its output is shown
    result = subprocess.run([npm, *command[1:]], check=False, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        said = result.stdout.decode("utf-8", "replace").strip().splitlines()[-20:]
        out("\n".join(visible(line) for line in said))
        out(f"npm failed (exit {result.returncode}); run it by hand:\n  " + " ".join(command))
        return None
    found = find_claude_binary(env)
    if found:
        out(f"Installed: {found}")
    return found


def ensure_cage(ask: Callable[[str], str] = input, out: Callable[[str], None] = print,
                env: MutableMapping[str, str] | None = None) -> bool:
    """The demo's workers run caged (the default): offer to install the pinned sandbox
    runtime (srt) with npm where it is the only thing missing, as for claude. Where the
    machine still cannot cage (no bubblewrap, no node, srt declined), the demo's own
    workers run uncaged (`FLEET_WORKER_CAGE=off` in `env`, this process's environment by
    default) and it says so and how to cage them: a demo that works on a fresh machine
    matters more than a cage around a scratch repository and a scripted endpoint. Real
    tasks outside the demo are still refused where the machine cannot cage. True: caged."""
    from fleet_tui.engine.localhost import cage_problems, srt_install_command

    env = os.environ if env is None else env
    if env.get("FLEET_WORKER_CAGE", "").strip() == "off":
        return False
    problem = cage_problems(env)
    if not problem:
        return True
    command = srt_install_command(env)
    if "srt (" in problem and shutil.which("npm", path=env.get("PATH")) is not None:
        try:
            answer = ask("The demo's workers run in a cage built on Anthropic's sandbox "
                         f"runtime; install it with `{' '.join(command)}`? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() in ("y", "yes"):
            result = subprocess.run(command, check=False)
            if result.returncode == 0 and not cage_problems(env):
                return True
            out(f"npm failed (exit {result.returncode}); run it by hand:\n  "
                + " ".join(command))
        else:
            out("Not installed. To do it by hand:\n  " + " ".join(command))
        problem = cage_problems(env) or problem
    env["FLEET_WORKER_CAGE"] = "off"
    out(f"fleet-tui --demo: its workers run uncaged on this machine ({problem}); "
        "`fleet-doctor` says what the cage needs")
    return False


# --- the endpoint, a process of its own -----------------------------------------------------

class DemoEndpointError(FleetTuiError):
    """The demo's endpoint process did not start; the message says why and where the log is."""


@dataclass
class DemoEndpoint:
    """The demo's scripted endpoint, running as its own process (see the module doc)."""

    url: str
    pid: int
    folder: Path  # its scripts, port file, pid file and log
    reused: bool = False
    _hold: socket.socket | None = field(default=None, repr=False)

    @property
    def log(self) -> Path:
        return self.folder / "endpoint.log"

    def answers(self, timeout: float = 2.0) -> bool:
        """The endpoint answers its probe (`HEAD /`, as the CLI sends before its calls)."""
        parts = urllib.parse.urlsplit(self.url)
        try:
            with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80),
                                          timeout=timeout) as sock:
                sock.sendall(b"HEAD / HTTP/1.1\r\nHost: demo\r\nConnection: close\r\n\r\n")
                return sock.recv(64).startswith(b"HTTP/1.1 200")
        except OSError:
            return False

    def hold(self) -> None:
        """Keep the endpoint alive while this process runs: an open connection counts as
        a client; it closes when the process ends, however it ends."""
        if self._hold is None:
            parts = urllib.parse.urlsplit(self.url)
            self._hold = socket.create_connection(
                (parts.hostname or "127.0.0.1", parts.port or 80), timeout=5)

    def release(self) -> None:
        hold, self._hold = self._hold, None
        if hold is not None:
            with contextlib.suppress(OSError):
                hold.close()

    def alive(self) -> bool:
        return _is_endpoint_process(self.pid, self.folder)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the endpoint process now (workers still using it lose it: the tests and
        the screenshot script use it to leave nothing behind)."""
        self.release()
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _is_endpoint_process(pid: int, folder: Path) -> bool:
    """``pid`` is alive and is the endpoint serving from ``folder`` (not a reused pid)."""
    from fleet_tui.system import procs

    if not procs.is_alive(pid):
        return False  # gone, or exited and not yet reaped by its parent
    argv = procs.cmdline(pid)
    # the module's name before the layers moved it: a demo endpoint an older fleet-tui
    # started keeps serving its demo after an upgrade
    names = ("fleet_tui.demo.endpoint", "fleet_tui.endpoint")
    return any(name in argv for name in names) and str(folder / "url") in argv


def _scripts_key(scripts: Mapping[str, Any], event_delay: float) -> str:
    """Endpoints are shared only between demos that play the same scripts."""
    data = json.dumps({"scripts": scripts, "delay": event_delay}, sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()[:12]


def start_endpoint(state: Path, *, event_delay: float = EVENT_DELAY,
                   idle_exit: float = ENDPOINT_IDLE_EXIT) -> DemoEndpoint:
    """The demo endpoint serving from ``state``: the running one if it answers, else a
    new detached process. Holds a connection to it (see DemoEndpoint.hold)."""
    scripts = demo_scripts()
    folder = state / _scripts_key(scripts, event_delay)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two demos starting at once start one endpoint
        endpoint = _running_endpoint(folder)
        if endpoint is None:
            endpoint = _spawn_endpoint(folder, scripts, event_delay, idle_exit)
        endpoint.hold()
    return endpoint


def _running_endpoint(folder: Path) -> DemoEndpoint | None:
    try:
        url = (folder / "url").read_text(encoding="utf-8").strip()
        pid = int((folder / "pid").read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None
    endpoint = DemoEndpoint(url=url, pid=pid, folder=folder, reused=True)
    if endpoint.alive() and endpoint.answers():
        return endpoint
    return None


def _spawn_endpoint(folder: Path, scripts: Mapping[str, Any], event_delay: float,
                    idle_exit: float) -> DemoEndpoint:
    script_dir = folder / "scripts"
    script_dir.mkdir(exist_ok=True)
    for name, script in scripts.items():
        (script_dir / f"{name}.json").write_text(json.dumps(script, indent=1),
                                                 encoding="utf-8")
    url_file = folder / "url"
    url_file.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "fleet_tui.demo.endpoint", "--script", str(script_dir),
            "--delay", str(event_delay), "--port-file", str(url_file),
            "--idle-exit", str(idle_exit)]
    env = {name: os.environ[name] for name in _ENDPOINT_ENV if name in os.environ}
    with open(folder / "endpoint.log", "ab") as log:
        log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} started by pid "
                  f"{os.getpid()}\n".encode())
        log.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                env=env, cwd=folder, start_new_session=True,
                                close_fds=True)
    (folder / "pid").write_text(f"{proc.pid}\n", encoding="utf-8")
    deadline = time.monotonic() + ENDPOINT_START
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            url = url_file.read_text(encoding="utf-8").strip()
            if url:
                return DemoEndpoint(url=url, pid=proc.pid, folder=folder)
        if proc.poll() is not None:
            raise DemoEndpointError(f"the demo endpoint exited at start (code "
                                    f"{proc.returncode}); see {folder / 'endpoint.log'}")
        time.sleep(0.02)
    proc.kill()
    raise DemoEndpointError(f"the demo endpoint did not listen within {ENDPOINT_START:g} s; "
                            f"see {folder / 'endpoint.log'}")


# --- the whole setup -----------------------------------------------------------------------

@dataclass
class Demo:
    """A prepared demo: where things are, and the endpoint it uses."""

    root: Path
    repo: Path
    home: Path
    endpoint: DemoEndpoint
    env: dict[str, str]
    # what the variables in `env` were before the demo set them (None: unset), and where
    saved: dict[str, str | None] = field(default_factory=dict)
    environ: dict[str, str] | None = None
    reopened: bool = False  # an earlier demo's project and tasks, not a new one

    def stop(self) -> None:
        """Let go of the endpoint (it keeps serving the workers still running, and exits
        once nothing uses it) and give the environment back as it was before the demo."""
        self.endpoint.release()
        if self.environ is not None:
            for name, value in self.saved.items():
                if value is None:
                    self.environ.pop(name, None)
                else:
                    self.environ[name] = value


def demo_root(env: Mapping[str, str] | None = None) -> Path:
    return paths.home(env) / "demo" / time.strftime("%Y%m%d-%H%M%S")


def latest_demo(env: Mapping[str, str] | None = None) -> Path | None:
    """The newest earlier demo (its project still there), which `--demo` reopens; None
    when there is none (or `--demo --new` is asked for by the caller)."""
    parent = paths.home(env) / "demo"
    try:
        found = [p for p in parent.iterdir() if p.name != "endpoint"
                 and (p / "inventory" / ".git").exists() and (p / "home").is_dir()]
    except OSError:
        return None
    return max(found, key=lambda p: p.name) if found else None


def start_demo(claude: str, *, root: Path | None = None, event_delay: float = EVENT_DELAY,
               environ: dict[str, str] | None = None,
               idle_exit: float = ENDPOINT_IDLE_EXIT) -> Demo:
    """Create the project, start (or reuse) the endpoint, and point this process's
    environment at them (the engine and its runners read settings and the key from the
    environment). The endpoint lives in ``root``'s parent folder, under ``endpoint/``."""
    environ = os.environ if environ is None else environ  # type: ignore[assignment]
    assert environ is not None
    root = root or demo_root(environ)
    # a root whose project exists already is an earlier demo, reopened as it was left
    reopened = (root / "inventory" / ".git").exists()
    repo = root / "inventory" if reopened else create_project(root / "inventory")
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    endpoint = start_endpoint(root.parent / "endpoint", event_delay=event_delay,
                              idle_exit=idle_exit)
    updates = {
        "FLEET_TUI_HOME": str(home),
        "FLEET_WORKER_BASE_URL": endpoint.url,
        "FLEET_WORKER_CLAUDE": claude,
        "FLEET_WORKER_KEY_SOURCES": "env",
        "FLEET_WORKER_MODEL": "demo-main",
        "FLEET_WORKER_SMALL_MODEL": "demo-small",
        "FLEET_WORKER_MAX_WORKERS": "4",
        "ANTHROPIC_AUTH_TOKEN": DEMO_KEY,
        "CLAUDE_CODE_MAX_RETRIES": "3",
        "FLEET_WORKER_TEST_COMMAND": "python3 -m unittest -q",
        "FLEET_TUI_CONFIG": str(root / "config.toml"),  # not the user's config
    }
    if os.geteuid() == 0:
        updates["FLEET_WORKER_SANDBOX"] = "1"
    saved = {name: environ.get(name) for name in updates}
    environ.update(updates)
    return Demo(root=root, repo=repo, home=home, endpoint=endpoint, env=updates, saved=saved,
                environ=environ, reopened=reopened)


def submit_demo_tasks(fleet: Any, repo: Path) -> list[Any]:
    from fleet_tui.core.model import TaskSpec

    tasks = []
    for title, prompt in DEMO_TASKS:
        tasks.extend(fleet.submit(TaskSpec(prompt=prompt, title=title, repo=repo)))
    return tasks


