"""`fleet-tui update|queue|compare|pick|push` as real subprocesses, with the real claude
against the scripted endpoint. The main checkout is checked byte for byte
before and after every refused or aborted command."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from endpoint_helpers import cli_env, run_cli
from landing_support import checkout_state, commit_all, git

from fleet_tui.demo.endpoint import ScriptedEndpoint, resolve_conflict_turns

pytestmark = pytest.mark.real_claude

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-landing-cli-SECRET-2b7e"
RESOLVED = "def main():\n    return 'resolved'\n"

SCRIPTS: dict[str, Any] = {
    "sameline": {
        "turns": [
            [{"type": "tool_use", "name": "Bash",
              "input": {"command": "sed -i 's|return 1|return \"{cwd}\"|' src/app.py",
                        "description": "edit the return line"}}],
            "Changed what main() returns.",
        ],
        "followup": resolve_conflict_turns("src/app.py", RESOLVED),
    },
    "ownfile": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "basename $PWD > \"copy-$(basename $PWD).txt\"",
                    "description": "add a file"}}],
        "Added my file.",
    ],
}


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(SCRIPTS) as ep:
        yield ep


@pytest.fixture
def env(endpoint: ScriptedEndpoint, claude_bin: str) -> dict[str, str]:
    return cli_env(endpoint.url, claude_bin, KEY)


cli = run_cli  # fleet-tui ARGS in a folder (tests/support/endpoint_helpers.py)


def run_copies(env: dict[str, str], repo: Path, script: str, copies: int) -> list[str]:
    out = cli(env, repo, "run", f"[script:{script}] do it", "--title", "Do it",
              "--copies", str(copies), "--wait")
    assert out.returncode == 0, out.stderr
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def show(env: dict[str, str], repo: Path, task_id: str) -> dict[str, Any]:
    out = cli(env, repo, "show", task_id, "--json")
    assert out.returncode == 0, out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def test_update_conflict_then_the_worker_resolves_it_and_it_merges(
        env: dict[str, str], git_repo: Path) -> None:
    first, second = run_copies(env, git_repo, "sameline", 2)
    assert cli(env, git_repo, "merge", first, "--yes").returncode == 0
    before = checkout_state(git_repo)
    merged = cli(env, git_repo, "merge", second, "--yes")
    assert merged.returncode == 4 and "conflicts" in merged.stderr
    assert checkout_state(git_repo) == before
    # no --resolve: the conflict list and the choices, exit 4, the worktree mid-merge
    out = cli(env, git_repo, "update", second)
    assert out.returncode == 4, out.stderr
    assert "conflict: src/app.py" in out.stderr and "--resolve worker|shell|abort" in out.stderr
    assert show(env, git_repo, second)["conflicts"] == ["src/app.py"]
    assert checkout_state(git_repo) == before
    # the CLI names its own commands, not the panel's keys
    out = cli(env, git_repo, "merge", second, "--yes")
    assert out.returncode == 4 and f"`fleet-tui update {second} --resolve worker`" \
        in out.stderr and "u: the worker" not in out.stderr, out.stderr
    # a shell needs a terminal: refused, nothing changed
    out = cli(env, git_repo, "update", second, "--resolve", "shell")
    assert out.returncode == 2 and "needs a terminal" in out.stderr
    assert checkout_state(git_repo) == before
    out = cli(env, git_repo, "update", second, "--resolve", "worker", "--wait")
    assert out.returncode == 0, out.stderr
    assert "queued for a follow-up" in out.stdout and "up to date" in out.stdout
    # the choice made is done, not offered again
    assert "let the worker resolve it" not in out.stderr, out.stderr
    assert "main does not merge cleanly" in out.stderr and "src/app.py" in out.stderr
    # it says the worker resolved it, not that the branch was up to date "already"
    assert f"the worker resolved the conflicts; {second} is now up to date with main" \
        in out.stdout and "already" not in out.stdout, out.stdout
    task = show(env, git_repo, second)
    assert task["conflicts"] == [] and task["state"] == "succeeded"
    assert [a["kind"] for a in task["attempts"]] == ["fresh", "followup"]
    out = cli(env, git_repo, "merge", second, "--yes")
    assert out.returncode == 0, out.stderr
    assert (git_repo / "src" / "app.py").read_text() == RESOLVED
    subjects = git(git_repo, "log", "--first-parent", "--format=%s", "-2")
    assert "(2/2)" not in subjects and "(1/2)" not in subjects


def test_update_abort_and_refusals_leave_main_as_it_was(env: dict[str, str],
                                                       git_repo: Path) -> None:
    (second,) = run_copies(env, git_repo, "sameline", 1)
    # main changes the line the worker changed (a landed copy's merge, as in the test
    # above, would do the same; the abort and the refusals are this test's subject)
    (git_repo / "src" / "app.py").write_text("def main():\n    return 'main'\n")
    commit_all(git_repo, "main changes the same line")
    worktree = Path(show(env, git_repo, second)["worktree"])
    worktree_before = checkout_state(worktree)
    before = checkout_state(git_repo)
    out = cli(env, git_repo, "update", second, "--resolve", "abort")
    assert out.returncode == 0 and "aborted" in out.stdout, out.stderr
    assert checkout_state(worktree) == worktree_before
    assert checkout_state(git_repo) == before
    for args, code, words in (
            (["update", "zzzzzz"], 3, "no task"),
            (["push", second], 4, "no remote"),
            (["queue", "--remove", second], 3, "not in the merge queue"),
            (["compare", "zzzzzz"], 3, "no task")):
        out = cli(env, git_repo, *args)
        assert out.returncode == code and words in out.stderr, (args, out.stderr)
        assert checkout_state(git_repo) == before


def test_compare_pick_and_queue(env: dict[str, str], git_repo: Path) -> None:
    ids = run_copies(env, git_repo, "ownfile", 3)
    out = cli(env, git_repo, "compare", ids[0])
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line[:6].strip() in ids]
    assert [r.split()[0] for r in rows] == ids
    assert all("+1/-0" in r and "yes" in r for r in rows)
    data = json.loads(cli(env, git_repo, "compare", ids[2], "--json").stdout)
    assert [d["files"] for d in data] == [[f"copy-{i}.txt"] for i in ids]
    out = cli(env, git_repo, "pick", ids[2], "--yes", "--wait")
    assert out.returncode == 0, out.stderr
    assert f"discarded {ids[0]}" in out.stdout and f"discarded {ids[1]}" in out.stdout
    assert [show(env, git_repo, i)["state"] for i in ids] == ["discarded", "discarded",
                                                               "merged"]
    assert sorted(p.name for p in git_repo.glob("copy-*.txt")) == [f"copy-{ids[2]}.txt"]
    # the queue: two more tasks, queued in the order given
    a, b = run_copies(env, git_repo, "ownfile", 2)
    out = cli(env, git_repo, "queue", b, a, "--wait")
    assert out.returncode == 0, out.stderr
    trailers = git(git_repo, "log", "--first-parent", "--reverse",
                   "--format=%(trailers:key=Fleet-Task,valueonly,separator=)").split()
    assert trailers[-2:] == [b, a]
    assert "empty" in cli(env, git_repo, "queue").stdout


def test_push_to_a_local_bare_remote(env: dict[str, str], git_repo: Path) -> None:
    remote = git_repo.parent / "origin.git"
    git(git_repo.parent, "init", "-q", "--bare", str(remote))
    git(git_repo, "remote", "add", "origin", str(remote))
    (task_id,) = run_copies(env, git_repo, "ownfile", 1)
    before = checkout_state(git_repo)
    hook = git_repo.parent / "hook.txt"
    out = cli({**env, "FLEET_WORKER_PR_COMMAND":
               f'echo "$FLEET_REMOTE_BRANCH on $FLEET_REMOTE: $FLEET_TITLE" > {hook}'},
              git_repo, "push", task_id)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == f"origin/fleet/{task_id}"
    assert checkout_state(git_repo) == before  # the main checkout is not touched
    pushed = git(remote, "rev-parse", f"refs/heads/fleet/{task_id}").strip()
    assert git(remote, "show", f"{pushed}:copy-{task_id}.txt").strip() == task_id
    assert hook.read_text() == f"fleet/{task_id} on origin: Do it\n"
    task = show(env, git_repo, task_id)
    assert task["pushed"] == f"origin fleet/{task_id} {pushed}"
    shown = cli(env, git_repo, "show", task_id).stdout
    assert f"pushed:    origin/fleet/{task_id} @ {pushed}" in shown
    # pushed again after more work: the remote branch follows
    worktree = Path(task["worktree"])
    (worktree / "more.txt").write_text("more\n")
    commit_all(worktree, "more")
    assert cli(env, git_repo, "push", task_id).returncode == 0
    assert git(remote, "rev-parse", f"refs/heads/fleet/{task_id}").strip() == \
        git(worktree, "rev-parse", "HEAD").strip()
