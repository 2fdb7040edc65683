"""Best of N, ranked by evidence: `fleet-tui compare`, `pick --best` and auto_pick as real
subprocesses, with the real claude against the scripted endpoint, real git and the
repository's real test command.

Three copies of one prompt: each worker takes a slot (an atomic `mkdir` in a folder of the
test) and writes notes.txt by it: slot 1 breaks the repository's tests (its test command
fails on BROKEN), slot 2 passes with a larger change (5 lines), slot 3 passes with a
smaller one (1 line). Which copy got which slot is read back from its worktree. Where two
copies show the rule (none passes; a tie), two run.
"""

from __future__ import annotations

import json
import os
import pty
import select
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from endpoint_helpers import cli_env, run_cli
from landing_support import checkout_state, commit_all, git

from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.store.db import Store
from fleet_tui.store.evidence import EvidenceStore
from fleet_tui.system import paths

pytestmark = pytest.mark.real_claude

KEY = "sk-best-of-n-SECRET-4c1d"
TEST_COMMAND = "! grep -q BROKEN notes.txt"
# what each slot writes to notes.txt
WRITES = {"three": ("BROKEN\\n", "a\\nb\\nc\\nd\\ne\\n", "a\\n"),
          # the smallest passing copy also trips the named check (a "lint" word)
          "linted": ("BROKEN\\n", "a\\nb\\nc\\nd\\ne\\n", "lint\\n"),
          "allbad": ("BROKEN\\n", "BROKEN\\nx\\n", "BROKEN\\ny\\nz\\n"),
          # equal evidence: one line each
          "tie": ("one\\n", "two\\n", "six\\n")}


def _script(slots: Path, writes: tuple[str, str, str]) -> list[Any]:
    case = " ".join(f"{n}) printf '{w}' > notes.txt;;" for n, w in enumerate(writes, 1))
    # the slots live where the copies may all write: a caged worker writes only its
    # worktree and its repository's cache (XDG_CACHE_HOME, shared by the repository's
    # workers); an uncaged one the test's folder
    where = f'"${{XDG_CACHE_HOME:-{slots.parent}}}/{slots.name}"'
    command = (f"n=0; mkdir -p {where}; for i in 1 2 3; do if mkdir {where}/$i 2>/dev/null; "
               "then n=$i; "
               f"break; fi; done; case $n in {case} esac")
    return [[{"type": "tool_use", "name": "Bash",
              "input": {"command": command, "description": "write my notes"}}],
            "Wrote my notes."]


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[ScriptedEndpoint]:
    scripts = {}
    for name, writes in WRITES.items():
        slots = tmp_path / f"slots-{name}"
        scripts[name] = _script(slots, writes)
    with ScriptedEndpoint(scripts) as ep:
        yield ep


@pytest.fixture
def env(endpoint: ScriptedEndpoint, claude_bin: str) -> dict[str, str]:
    return cli_env(endpoint.url, claude_bin, KEY)


def _settings(repo: Path, text: str) -> None:
    (repo / ".fleet-tui.toml").write_text(text)
    commit_all(repo, "the repository's settings")


def run_copies(env: dict[str, str], repo: Path, script: str, copies: int = 3) -> list[str]:
    out = run_cli(env, repo, "run", f"[script:{script}] write notes", "--title",
                  "Write notes", "--copies", str(copies), "--wait")
    assert out.returncode == 0, out.stderr
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def slots_of(env: dict[str, str], repo: Path, ids: list[str]) -> dict[str, str]:
    """Which copy wrote what: "broken", "large" or "small" (from its worktree)."""
    out = {}
    listed = {t["id"]: t for t in json.loads(run_cli(env, repo, "ls", "--json").stdout)}
    for task_id in ids:
        notes = (Path(listed[task_id]["worktree"]) / "notes.txt").read_text()
        out["broken" if "BROKEN" in notes else "large" if notes.count("\n") == 5
            else "small"] = task_id
    return out


def states(env: dict[str, str], repo: Path, ids: list[str]) -> list[str]:
    """The tasks' states, in the order given (one `ls --json`)."""
    listed = {t["id"]: t["state"] for t in json.loads(
        run_cli(env, repo, "ls", "--json").stdout)}
    return [listed[i] for i in ids]


def show(env: dict[str, str], repo: Path, task_id: str) -> dict[str, Any]:
    out = run_cli(env, repo, "show", task_id, "--json")
    assert out.returncode == 0, out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def test_compare_ranks_and_pick_best_lands_the_smallest_passing_copy(
        env: dict[str, str], git_repo: Path) -> None:
    _settings(git_repo, f'test_command = "{TEST_COMMAND}"\n')
    ids = run_copies(env, git_repo, "three")
    who = slots_of(env, git_repo, ids)
    assert set(who) == {"broken", "large", "small"}, who

    out = run_cli(env, git_repo, "compare", ids[0])
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line[:6].strip() in ids]
    assert [r.split()[0] for r in rows] == [who["small"], who["large"], who["broken"]]
    assert rows[0].split()[1] == "★1" and rows[1].split()[1] == "2"
    why = [line.strip() for line in out.stdout.splitlines() if line.strip().startswith("why:")]
    assert why[0].startswith("why: passes the tests") and "+1/-0" in why[0], why
    assert "smallest passing change" in why[0]
    assert "larger change" in why[1] and "+5/-0" in why[1], why
    assert why[2] == f"why: fails the test command ({TEST_COMMAND})", why
    assert "FAILED" in rows[2] and "passed" in rows[0]

    data = json.loads(run_cli(env, git_repo, "compare", ids[2], "--json").stdout)
    assert [d["id"] for d in data] == [who["small"], who["large"], who["broken"]]
    assert [d["rank"]["best"] for d in data] == [True, False, False]
    small = data[0]["rank"]["evidence"]
    assert small["test"]["passed"] is True and small["test"]["seconds"] >= 0
    assert (small["added"], small["deleted"], small["files"]) == (1, 0, ["notes.txt"])
    assert small["clean"] is True and small["outside"] == []
    # ls --json and show --json carry each copy's place
    listed = {t["id"]: t["rank"] for t in json.loads(
        run_cli(env, git_repo, "ls", "--json").stdout)}
    assert [listed[who[k]]["place"] for k in ("small", "large", "broken")] == [1, 2, 3]
    assert show(env, git_repo, who["broken"])["rank"]["passes"] is False

    before = checkout_state(git_repo)
    out = run_cli(env, git_repo, "pick", who["broken"], "--best", "--wait", timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"best: {who['small']}: passes the tests"), out.stdout
    assert f"discarded {who['large']}" in out.stdout
    assert f"discarded {who['broken']}" in out.stdout
    assert states(env, git_repo, [who["small"], who["large"], who["broken"]]) == [
        "merged", "discarded", "discarded"]
    assert show(env, git_repo, who["small"])["gate"] == "passed"  # the queue's gate again
    assert (git_repo / "notes.txt").read_text() == "a\n"
    assert checkout_state(git_repo) != before
    trailers = git(git_repo, "log", "-1", "--format=%(trailers:key=Fleet-Task,valueonly)")
    assert trailers.strip() == who["small"]


def test_pick_best_refuses_when_no_copy_passes_and_lands_nothing(
        env: dict[str, str], git_repo: Path) -> None:
    _settings(git_repo, f'test_command = "{TEST_COMMAND}"\n')
    # two copies, both failing: each is named, and the one asked about is not taken
    ids = run_copies(env, git_repo, "allbad", copies=2)
    before = checkout_state(git_repo)
    out = run_cli(env, git_repo, "pick", ids[1], "--best", "--wait", "--yes")
    assert out.returncode == 4, (out.stdout, out.stderr)
    assert "no copy passes" in out.stderr and "nothing was landed" in out.stderr
    assert out.stderr.count("fails the test command") == 2
    assert checkout_state(git_repo) == before
    listed = {t["id"]: t for t in json.loads(run_cli(env, git_repo, "ls", "--json").stdout)}
    assert [listed[i]["state"] for i in ids] == ["succeeded"] * 2
    assert all(listed[i]["land_state"] is None for i in ids)
    out = run_cli(env, git_repo, "compare", ids[0])
    assert "no copy passes" in out.stdout


def test_a_failing_named_check_moves_the_otherwise_best_copy_down(
        env: dict[str, str], git_repo: Path) -> None:
    _settings(git_repo, f'test_command = "{TEST_COMMAND}"\n\n'
                        '[rank]\nchecks = ["! grep -q lint notes.txt", "true"]\n')
    ids = run_copies(env, git_repo, "linted")
    data = json.loads(run_cli(env, git_repo, "compare", ids[0], "--json").stdout)
    order = [d["id"] for d in data]
    listed = {t["id"]: t for t in json.loads(run_cli(env, git_repo, "ls", "--json").stdout)}
    files = {d["id"]: (Path(listed[d["id"]]["worktree"]) / "notes.txt").read_text()
             for d in data}
    assert [files[i] for i in order] == ["a\nb\nc\nd\ne\n", "lint\n", "BROKEN\n"]
    large, small = data[0]["rank"], data[1]["rank"]
    assert large["best"] and not small["best"] and small["passes"]
    assert [c["passed"] for c in small["evidence"]["checks"]] == [False, True]
    assert "fails 1 check (! grep -q lint notes.txt)" in small["reason"]
    assert "passes 2 checks" in large["reason"]
    shown = run_cli(env, git_repo, "show", order[1]).stdout
    assert "rank:      2 of 3: passes the tests; fails 1 check (! grep -q lint notes.txt)" \
        in shown, shown


def test_auto_pick_lands_the_winner_without_a_command(env: dict[str, str],
                                                      git_repo: Path) -> None:
    _settings(git_repo, f'test_command = "{TEST_COMMAND}"\nauto_pick = true\n')
    ids = run_copies(env, git_repo, "three")  # nothing else is asked of fleet-tui
    deadline = time.monotonic() + 240  # a rank runner, then a queue runner: under load
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        # read the store directly: no command of fleet-tui's runs meanwhile
        states = _states(git_repo, ids)
        if sorted(states.values()) == ["discarded", "discarded", "merged"]:
            break
        time.sleep(0.2)
    assert sorted(states.values()) == ["discarded", "discarded", "merged"], states
    winner = next(i for i, s in states.items() if s == "merged")
    assert (git_repo / "notes.txt").read_text() == "a\n"
    shown = show(env, git_repo, winner)
    assert shown["rank"]["best"] is True and shown["gate"] == "passed"
    with Store(paths.db_path()) as store:  # the one decision, with its reason
        pick = EvidenceStore(store).pick_of(shown["group_id"])
    assert pick is not None and pick.how == "auto" and pick.task_id == winner
    assert pick.reason.startswith("best of 3: passes the tests; +1/-0 in 1 file"), pick


def _states(repo: Path, ids: list[str]) -> dict[str, str]:
    conn = sqlite3.connect(f"file:{paths.db_path()}?mode=ro", uri=True)
    try:
        rows = conn.execute(f"SELECT id, state FROM tasks WHERE id IN "
                            f"({', '.join('?' * len(ids))})", ids).fetchall()
    finally:
        conn.close()
    return {str(r[0]): str(r[1]) for r in rows}


def test_tied_copies_are_all_best_and_pick_best_asks_or_takes_the_first_with_yes(
        env: dict[str, str], git_repo: Path) -> None:
    _settings(git_repo, f'test_command = "{TEST_COMMAND}"\n')
    # two tied copies: the answer (the second) is taken, not the first
    ids = run_copies(env, git_repo, "tie", copies=2)
    out = run_cli(env, git_repo, "compare", ids[0])
    rows = [line for line in out.stdout.splitlines() if line[:6].strip() in ids]
    assert [r.split()[:2] for r in rows] == [[i, "★1"] for i in ids]
    assert f"tied for best: {', '.join(ids)} (equal evidence)" in out.stdout
    before = checkout_state(git_repo)
    # no terminal to ask in, no --yes: refused, nothing queued or discarded
    out = run_cli(env, git_repo, "pick", ids[1], "--best")
    assert out.returncode == 2 and "tied for best" in out.stderr, out.stderr
    assert f"pass --yes to take {ids[0]}" in out.stderr
    assert states(env, git_repo, ids) == ["succeeded"] * 2
    assert checkout_state(git_repo) == before
    # in a terminal it asks which one
    answer = _in_a_terminal(env, git_repo, ["pick", ids[0], "--best", "--wait"],
                            "which one to land?", ids[1], timeout=300)
    assert answer.returncode == 0, answer.output
    assert f"best: {ids[1]}: passes the tests" in answer.output
    assert states(env, git_repo, ids) == ["discarded", "merged"]


def test_pick_best_yes_takes_the_first_of_tied_copies(env: dict[str, str],
                                                       git_repo: Path) -> None:
    _settings(git_repo, f'test_command = "{TEST_COMMAND}"\n')
    # two tied copies, the second named: the first is taken, the other discarded
    ids = run_copies(env, git_repo, "tie", copies=2)
    out = run_cli(env, git_repo, "pick", ids[1], "--best", "--yes", "--wait", timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"best: {ids[0]}: ")
    assert states(env, git_repo, ids) == ["merged", "discarded"]


@dataclass
class _Ran:
    returncode: int
    output: str


def _in_a_terminal(env: dict[str, str], cwd: Path, args: list[str], prompt: str,
                   answer: str, timeout: float = 120) -> _Ran:
    """`fleet-tui ARGS` with a terminal for stdin and stdout: wait for ``prompt``, type
    ``answer``; its exit status and everything it printed."""
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "fleet_tui.cli", *args], cwd=cwd, env=env,
                            stdin=child, stdout=child, stderr=child, start_new_session=True)
    os.close(child)
    output = b""
    answered = False
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(main, 4096)
                except OSError:  # the child side closed: it exited
                    chunk = b""
                if not chunk and proc.poll() is not None:
                    break
                output += chunk
            if not answered and prompt.encode() in output:
                os.write(main, answer.encode() + b"\n")
                answered = True
            if proc.poll() is not None and not ready:
                break
        else:
            proc.kill()
            raise AssertionError(f"timed out; printed: {output.decode(errors='replace')}")
        return _Ran(proc.wait(timeout=30), output.decode("utf-8", "replace"))
    finally:
        os.close(main)
