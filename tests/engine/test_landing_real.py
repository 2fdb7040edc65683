"""Landing with the real claude against the scripted endpoint: the finding's
two copies that edit the same line, landed end to end through an update from base, the
worker resolving the conflict in a follow-up, and a merge; an abort that puts everything
back; best of N (compare, pick); the diff of a task against where it really stands.

The main checkout is checked byte for byte before and after every refused or aborted step.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from landing_support import checkout_state, commit_all, drive, git, make_fleet, settled

from fleet_tui.core.states import LandState, TaskState
from fleet_tui.demo.endpoint import ScriptedEndpoint, resolve_conflict_turns
from fleet_tui.engine.fleet import FleetError, FleetRefused, TaskSpec
from fleet_tui.system import paths
from fleet_tui.vcs import git as fgit

RESOLVED = "def main():\n    return 'both copies, resolved'\n"

SCRIPTS: dict[str, Any] = {
    # each copy puts its own worktree's path on the same line of src/app.py (uncommitted)
    "sameline": {
        "turns": [
            [{"type": "tool_use", "name": "Bash",
              "input": {"command": "sed -i 's|return 1|return \"{cwd}\"|' src/app.py",
                        "description": "edit the return line"}}],
            "Changed what main() returns.",
        ],
        "followup": resolve_conflict_turns("src/app.py", RESOLVED),
    },
    # copies that each add a file of their own (a copy per worktree), committed
    "ownfile": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": "basename $PWD > \"copy-$(basename $PWD).txt\" && "
                               "git add -A && git commit -qm 'add my file'",
                    "description": "add a file"}}],
        "Added my file.",
    ],
}


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(SCRIPTS) as ep:
        yield ep


def _copies(fleet: Any, repo: Path, script: str, n: int, title: str) -> list[str]:
    tasks = fleet.submit(TaskSpec(prompt=f"[script:{script}] {title}", title=title,
                                  repo=repo), copies=n)
    ids = [t.id for t in tasks]
    drive(fleet, settled(fleet, *ids), what="the copies to finish")
    for task_id in ids:
        assert fleet.get_task(task_id).state == TaskState.SUCCEEDED
    return ids


def test_two_copies_on_one_line_land_through_update_worker_and_merge(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    fleet = make_fleet(endpoint, claude_bin)
    first, second = _copies(fleet, git_repo, "sameline", 2, "Make main return its place")
    assert fleet.get_task(first).group_id == fleet.get_task(second).group_id is not None
    assert fleet.merge(first).merged
    log = git(git_repo, "log", "-2", "--format=%s")
    assert "Make main return its place (1/2)" not in log  # a copy's suffix is dropped
    assert "Make main return its place" in log

    # the second copy conflicts with what landed: the merge refuses, main untouched
    before = checkout_state(git_repo)
    preview = fleet.conflict_preview(second)
    assert not preview.clean and preview.conflicts == ["src/app.py"]
    assert not fleet.merge(second).merged
    assert checkout_state(git_repo) == before

    # update from base: the worktree is left mid-merge with the conflict named
    result = fleet.update(second)
    assert result.status == "conflicts" and result.conflicts == ["src/app.py"]
    task = fleet.get_task(second)
    assert task.conflicts == ["src/app.py"] and "conflicts" in (task.message or "")
    assert fgit.operation_in_progress(Path(task.worktree or "")) == "merge"
    assert checkout_state(git_repo) == before
    with pytest.raises(FleetError, match="stopped on conflicts"):
        fleet.merge(second)  # refused while mid-update
    assert checkout_state(git_repo) == before

    # the worker resolves it: a follow-up to its own session, naming the file
    session = task.session_id
    assert session
    fleet.resolve_update(second, "worker")
    attempts = fleet.attempts(second)
    assert attempts[-1].kind == "followup" and "src/app.py" in attempts[-1].prompt
    drive(fleet, settled(fleet, second), what="the worker's resolution")
    task = fleet.get_task(second)
    assert task.state == TaskState.SUCCEEDED, task.message
    assert task.conflicts == [] and task.session_id == session
    assert [a.session_id for a in fleet.attempts(second)] == [session, session]
    worktree = Path(task.worktree or "")
    assert fgit.operation_in_progress(worktree) is None
    assert (worktree / "src" / "app.py").read_text() == RESOLVED
    assert git(worktree, "status", "--porcelain") == ""  # the worker committed the merge
    assert len(git(worktree, "log", "-1", "--format=%P").split()) == 2
    # the diff now shows only this copy's change against what main holds
    diff = fleet.diff(second)
    assert [f.path for f in diff.files] == ["src/app.py"]
    assert task.base_commit == git(git_repo, "rev-parse", "main").strip()

    landed = fleet.merge(second)
    assert landed.merged, landed.message
    assert (git_repo / "src" / "app.py").read_text() == RESOLVED
    assert fleet.get_task(second).state == TaskState.MERGED


def test_update_aborted_puts_the_worktree_back_and_never_touches_main(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    fleet = make_fleet(endpoint, claude_bin)
    (second,) = _copies(fleet, git_repo, "sameline", 1, "Return the place")
    # main changes the line the worker changed (a landed copy's merge, as in the test
    # above, would do the same; the abort is this test's subject)
    (git_repo / "src" / "app.py").write_text("def main():\n    return 'main'\n")
    commit_all(git_repo, "main changes the same line")
    worktree = Path(fleet.get_task(second).worktree or "")
    worktree_before = checkout_state(worktree)
    before = checkout_state(git_repo)
    assert fleet.update(second).status == "conflicts"
    task = fleet.resolve_update(second, "abort")
    assert task.conflicts == [] and "aborted" in (task.message or "")
    assert checkout_state(worktree) == worktree_before
    assert checkout_state(git_repo) == before
    with pytest.raises(FleetRefused, match="no update stopped on conflicts"):
        fleet.resolve_update(second, "abort")
    assert checkout_state(git_repo) == before


def test_compare_and_pick_three_copies(git_repo: Path, claude_bin: str,
                                       endpoint: ScriptedEndpoint) -> None:
    fleet = make_fleet(endpoint, claude_bin, test_command="ls copy-*.txt")
    ids = _copies(fleet, git_repo, "ownfile", 3, "Add a file of mine")
    report = fleet.compare(ids[1])
    assert [r.task.id for r in report] == ids  # in copy order, whichever was asked
    for row, task_id in zip(report, ids, strict=True):
        assert row.files == [f"copy-{task_id}.txt"]
        assert (row.added, row.deleted) == (1, 0)
        assert row.clean is True and row.merges == "yes"
        assert row.gate == "-" and row.task.turns >= 2
    chosen = ids[1]
    worktrees = {t: Path(fleet.get_task(t).worktree or "") for t in ids}
    queued, discarded = fleet.pick(chosen)
    assert sorted(discarded) == sorted(t for t in ids if t != chosen)
    for task_id in discarded:
        sibling = fleet.get_task(task_id)
        assert sibling.state == TaskState.DISCARDED
        assert not worktrees[task_id].exists()
    assert queued.land_state == LandState.WAITING
    drive(fleet, lambda: fleet.get_task(chosen).land_state == LandState.MERGED,
          what="the picked copy to land")
    assert (git_repo / f"copy-{chosen}.txt").read_text().strip() == chosen
    assert not list(git_repo.glob("copy-*.txt"))[1:]  # only the chosen copy's file
    assert fleet.get_task(chosen).gate == "passed"
    assert fleet.get_task(chosen).state == TaskState.MERGED


def test_diff_and_counts_measure_from_where_the_task_stands(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    fleet = make_fleet(endpoint, claude_bin)
    (task_id,) = _copies(fleet, git_repo, "ownfile", 1, "Add a file")
    (git_repo / "main_only.txt").write_text("landed meanwhile\n")
    commit_all(git_repo, "main moves on")
    result = fleet.update(task_id)
    assert result.status == "updated", result.message
    task = fleet.get_task(task_id)
    assert [f.path for f in fleet.diff(task_id).files] == [f"copy-{task_id}.txt"]
    assert (task.added_lines, task.deleted_lines) == (1, 0)
    assert fleet.update(task_id).status == "current"
    # a task started from a commit has no base branch to update from
    head = git(git_repo, "rev-parse", "HEAD").strip()
    (other,) = fleet.submit(TaskSpec(prompt="[script:ownfile] x", repo=git_repo,
                                     base_ref=head))
    drive(fleet, settled(fleet, other.id))
    with pytest.raises(FleetError, match="started from a commit"):
        fleet.update(other.id)
    assert paths.update_dir(git_repo, task_id).exists() is False
    assert subprocess.run(["git", "diff", "--quiet"], cwd=git_repo).returncode == 0


def test_the_demos_two_greetings_land_through_the_workers_resolution(
        tmp_path: Path, claude_bin: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo shows the landing workflow: its two greeting tasks change the same line;
    the first lands, the second's merge names the way out (update, the worker resolves),
    and after `update` + the worker's follow-up it lands too: main has both greetings."""
    from fleet_tui.demo import session as demo

    repo = demo.create_project(tmp_path / "inventory")
    prompts = dict(demo.DEMO_TASKS)
    monkeypatch.setenv("FLEET_ENDPOINT_PACE", "0")  # the demo's scripts, without its pacing
    with ScriptedEndpoint(demo.demo_scripts()) as endpoint:
        fleet = make_fleet(endpoint, claude_bin)
        ids = [fleet.submit(TaskSpec(prompt=prompts[title], title=title, repo=repo))[0].id
               for title in ("Make the greeting casual", "Make the greeting formal")]
        drive(fleet, settled(fleet, *ids), what="the greeting tasks")
        casual, formal = ids
        assert fleet.merge(casual).merged
        refused = fleet.merge(formal)
        assert not refused.merged and "--resolve worker" in refused.message

        assert fleet.update(formal).status == "conflicts"
        fleet.resolve_update(formal, "worker")
        drive(fleet, settled(fleet, formal), what="the demo worker's resolution")
        task = fleet.get_task(formal)
        assert task.state == TaskState.SUCCEEDED and task.conflicts == [], task.message
        assert fleet.merge(formal).merged
    # main keeps both changes (`checkout --ours` lost the first)
    text = (repo / "greeting.py").read_text()
    assert "Good day, and welcome to our shop." in text, text
    assert "Hey there, come on in!" in text, text
    assert "<<<<<<<" not in text and "=======" not in text and ">>>>>>>" not in text, text
    greet = "import greeting; print(greeting.greet('Ada'))"
    greeted = subprocess.run([sys.executable, "-c", greet], cwd=repo, capture_output=True,
                             text=True, check=True).stdout
    assert "Hey there, come on in!" in greeted and "welcome to our shop." in greeted, greeted
    assert git(repo, "status", "--porcelain") == ""
