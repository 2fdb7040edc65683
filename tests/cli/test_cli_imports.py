"""Each `fleet-tui` command is a process of its own: what it imports, it pays for at every
call (the test suite starts a great many; a user, at every command). These tests run
the real entry point in a fresh interpreter and look at `sys.modules` once it returns:
`--help`, a bad option or a refusal loads neither the engine nor the store nor git, and a
command that reads the store (`ls`) loads no Textual, no GitPython, no aiohttp and no
gateway server. Module names, not timings: the figures are in the notes of the change.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PANEL = ("textual", "rich", "fleet_tui.ui")
"""The panel: no headless command draws anything."""

SERVERS = ("aiohttp", "fleet_tui.gateway.server", "fleet_tui.gateway.guard",
           "fleet_tui.commands.serve")
"""The gateway's and the browser panel's HTTP servers: a command talks to them at most."""

GITPYTHON = ("git", "gitdb")
"""GitPython: finding the repository is one `git rev-parse`."""

ENGINE = ("fleet_tui.engine", "fleet_tui.store", "fleet_tui.vcs", "fleet_tui.execution",
          "fleet_tui.gateway", "msgspec", "keyring")
"""The engine and what it stands on: a command imports them once its arguments are read."""

PROBE = """\
import json, sys
from fleet_tui import cli
try:
    code = cli.main(sys.argv[1:]) if ENTRY == "main" else getattr(cli, ENTRY)()
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
print("\\nloaded:" + json.dumps([h for h in HEAVY
                                 if any(m == h or m.startswith(h + ".") for m in sys.modules)]))
print("exit:" + json.dumps(code))
"""


def loaded(cwd: Path, *args: str, heavy: tuple[str, ...],
           entry: str = "main") -> tuple[list[str], object]:
    """The names of `heavy` loaded (a package counts with any of its modules) after
    `fleet-tui ARGS` (or another console script's `entry` in cli.py) ran in cwd, in a fresh
    interpreter, and the exit code it returned."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]), "FLEET_WORKER_KEY_SOURCES": "env"}
    env.pop("ANTHROPIC_AUTH_TOKEN", None)
    env.pop("ANTHROPIC_API_KEY", None)
    probe = f"HEAVY = {heavy!r}\nENTRY = {entry!r}\n{PROBE}"
    out = subprocess.run([sys.executable, "-c", probe, *args],
                         cwd=cwd, env=env, input="", capture_output=True, text=True,
                         timeout=60, check=False)
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stdout.splitlines()
    found = [ln for ln in lines if ln.startswith("loaded:")]
    code = [ln for ln in lines if ln.startswith("exit:")]
    assert found and code, out.stdout + out.stderr
    return (json.loads(found[-1].removeprefix("loaded:")),
            json.loads(code[-1].removeprefix("exit:")))


EVERYTHING = PANEL + SERVERS + GITPYTHON + ENGINE

CHEAP = [
    (("--help",), 0),
    (("version",), 0),
    (("bogus",), 2),
    (("run", "--help"), 0),
    (("run", "--copies", "0", "do it"), 2),  # a bad option: one line, exit 2
    (("ls", "--no-such-option"), 2),
    (("show",), 2),  # no ID
    (("merge", "--help"), 0),
]


@pytest.mark.parametrize(("args", "exit_code"), CHEAP, ids=[" ".join(a) for a, _ in CHEAP])
def test_help_and_bad_arguments_load_nothing_of_the_engine(
        git_repo: Path, args: tuple[str, ...], exit_code: int) -> None:
    modules, code = loaded(git_repo, *args, heavy=EVERYTHING)
    assert code == exit_code
    assert modules == [], f"`fleet-tui {' '.join(args)}` loaded {modules}"


def test_a_run_outside_a_repository_is_refused_without_gitpython(tmp_path: Path) -> None:
    """`fleet-tui run` in a folder of no repository: refused (exit 2) by one `git
    rev-parse`, before the engine is built and without GitPython or the panel."""
    folder = tmp_path / "not-a-repo"
    folder.mkdir()
    heavy = (*PANEL, *SERVERS, *GITPYTHON, "fleet_tui.engine.fleet", "keyring")
    modules, code = loaded(folder, "run", "do it", heavy=heavy)
    assert code == 2
    assert modules == [], f"a refused `fleet-tui run` loaded {modules}"


@pytest.mark.parametrize("args", [("ls",), ("ls", "--json"), ("ls", "--all-repos"),
                                  ("show", "nosuch")])
def test_reading_the_store_loads_no_panel_gitpython_or_server(
        git_repo: Path, args: tuple[str, ...]) -> None:
    """`ls` builds the engine and runs a scheduling pass (what finished while no process
    watched is recorded first), and needs none of these; `show` of an unknown id, less."""
    modules, code = loaded(git_repo, *args, heavy=PANEL + SERVERS + GITPYTHON)
    assert code == (3 if args[0] == "show" else 0)
    assert modules == [], f"`fleet-tui {' '.join(args)}` loaded {modules}"


MISSES = [("show", "nosuch"), ("show", "--json", "nosuch"), ("logs", "nosuch"),
          ("diff", "nosuch"), ("merge", "--yes", "nosuch"), ("kill", "nosuch")]


@pytest.mark.parametrize("args", MISSES, ids=[" ".join(a) for a in MISSES])
def test_an_id_that_names_no_task_is_refused_without_the_engine(
        git_repo: Path, args: tuple[str, ...]) -> None:
    """An id that names no task: `no task 'nosuch'` (exit 3) from the store alone, the
    engine's front never built (only a new task makes an id known, not the pass a found
    task gets first)."""
    heavy = (*PANEL, *SERVERS, *GITPYTHON, "fleet_tui.engine.fleet", "fleet_tui.vcs.git",
             "fleet_tui.commands.best")
    modules, code = loaded(git_repo, *args, heavy=heavy)
    assert code == 3
    assert modules == [], f"`fleet-tui {' '.join(args)}` loaded {modules}"


@pytest.mark.parametrize("args", [("host", "ls"), ("host", "ls", "--json")])
def test_host_ls_reads_the_store_without_the_engine(
        git_repo: Path, args: tuple[str, ...]) -> None:
    """`host ls` counts each host's tasks (as `host rm` looks for tasks living on the
    host): a read of the store, no engine front."""
    heavy = (*PANEL, *SERVERS, *GITPYTHON, "fleet_tui.engine.fleet", "msgspec")
    modules, code = loaded(git_repo, *args, heavy=heavy)
    assert code == 0
    assert modules == [], f"`fleet-tui {' '.join(args)}` loaded {modules}"


def test_fleet_doctor_finds_the_repository_without_gitpython(git_repo: Path) -> None:
    """`fleet-doctor` checks this machine (claude, the key, git, the repository it is run
    in): no engine front, store, git's front, GitPython, panel or server."""
    heavy = (*PANEL, *SERVERS, *GITPYTHON, "fleet_tui.engine.fleet", "fleet_tui.store",
             "fleet_tui.vcs.git", "msgspec")
    modules, code = loaded(git_repo, heavy=heavy, entry="doctor_main")
    assert isinstance(code, int)
    assert modules == [], f"fleet-doctor loaded {modules}"


def test_the_probe_sees_what_is_loaded(git_repo: Path) -> None:
    """The checks above can fail: the probe reports the engine, GitPython and the panel
    where a command does load them (a merge refused for want of a task needs the engine;
    finding a repository with no commit asks GitPython why)."""
    modules, code = loaded(git_repo, "ls", "--json", heavy=("fleet_tui.engine.fleet",))
    assert (modules, code) == (["fleet_tui.engine.fleet"], 0)
    empty = git_repo.parent / "empty"
    empty.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=empty, check=True)
    modules, code = loaded(empty, "ls", heavy=("git",))
    assert (modules, code) == (["git"], 2)


def test_an_unknown_malformed_or_ambiguous_id_reads_as_before(git_repo: Path) -> None:
    """What the store's lookup says is what the engine said: the same line, the same exit
    code (3 for no such task, 2 for a prefix of several), with tasks in the store."""
    from fleet_tui.core.states import TaskState
    from fleet_tui.store.db import Store
    from fleet_tui.system import paths

    store = Store(paths.db_path())
    for tid in ("ab0001", "ab0002"):
        store.create_task(task_id=tid, prompt="p", repo=git_repo, state=TaskState.DISCARDED)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")])}
    cases = [(("show", "zzzzzz"), 3, "fleet-tui show: no task 'zzzzzz' (see `fleet-tui ls`)"),
             (("logs", "NO-SUCH!"), 3, "fleet-tui logs: no task 'NO-SUCH!': a task id is 1 "
              "to 6 characters from 0-9 and a-z (see `fleet-tui ls`)"),
             (("diff", "ab"), 2, "fleet-tui diff: task id 'ab' is ambiguous: it matches "
              "ab0001, ab0002; type more characters")]
    for args, code, line in cases:
        out = subprocess.run([sys.executable, "-m", "fleet_tui.cli", *args], cwd=git_repo,
                             env=env, input="", capture_output=True, text=True, timeout=60,
                             check=False)
        assert (out.returncode, out.stderr, out.stdout) == (code, line + "\n", ""), args
    assert sorted(t.id for t in store.list_tasks(archived=None)) == ["ab0001", "ab0002"]
