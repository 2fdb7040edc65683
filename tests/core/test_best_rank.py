"""Best of N below the CLI: the ranking's rules and reasons (core/ranking.py), the
repository's `[rank] checks` and `auto_pick` (settings, refused with the file and line),
the store's evidence (its migration), and the engine's evidence over real git worktrees
and real test commands: gathered once, gathered again when a copy or its base changes."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from landing_support import commit_all, finished_task

from fleet_tui.core.ranking import CheckResult, CopyEvidence, rank
from fleet_tui.engine.fleet import Fleet, FleetRefused
from fleet_tui.settings.config import ConfigError, load_settings
from fleet_tui.settings.repo_settings import load_repo_settings
from fleet_tui.store.db import MIGRATIONS, SCHEMA_VERSION, Store, TaskState
from fleet_tui.store.evidence import EvidenceStore


def ev(task_id: str, *, test: bool | None = True, checks: tuple[bool, ...] = (),
       added: int = 1, files: int = 1, clean: bool = True) -> CopyEvidence:
    return CopyEvidence(
        task_id, "fp", 0.0,
        None if test is None else CheckResult("make test", test, 1.0),
        tuple(CheckResult(f"check{n}", ok, 0.1) for n, ok in enumerate(checks)),
        added, 0, tuple(f"f{n}" for n in range(files)), (), clean,
        "yes" if clean else "conflicts: a.py")


# --- the rules --------------------------------------------------------------------------------


def test_failing_tests_and_unmergeable_copies_rank_last_then_size_then_cost() -> None:
    ranked = rank([("broken", ev("broken", test=False, added=1), 0.0),
                   ("big", ev("big", added=9), 0.01),
                   ("conflict", ev("conflict", clean=False), 0.0),
                   ("small_dear", ev("small_dear", added=2), 0.50),
                   ("small_cheap", ev("small_cheap", added=2), 0.10)])
    assert [r.task_id for r in ranked] == ["small_cheap", "small_dear", "big", "broken",
                                           "conflict"]
    assert [r.best for r in ranked] == [True, False, False, False, False]
    assert [r.place for r in ranked] == [1, 2, 3, 4, 4]  # failing alike: one place
    assert ranked[0].reason == "passes the tests; +2/-0 in 1 file; the smallest passing change"
    assert ranked[1].reason.endswith("costs more ($0.50 against $0.10)")
    assert ranked[2].reason.endswith("a larger change than the one above")
    assert ranked[3].reason == "fails the test command (make test)"
    assert ranked[4].reason == "does not merge cleanly: conflicts: a.py"


def test_a_failing_named_check_ranks_below_a_larger_change_that_passes_them() -> None:
    ranked = rank([("small", ev("small", checks=(False, True), added=1), 0.0),
                   ("large", ev("large", checks=(True, True), added=5), 0.0)])
    assert [r.task_id for r in ranked] == ["large", "small"]
    assert ranked[0].best and ranked[1].passes and not ranked[1].best
    assert "fails 1 check (check0)" in ranked[1].reason
    assert "below one that fails fewer checks" in ranked[1].reason


def test_equal_evidence_is_a_tie_both_best_in_copy_order() -> None:
    ranked = rank([("a", ev("a"), 0.0), ("b", ev("b"), 0.0), ("c", ev("c", added=3), 0.0)])
    assert [(r.task_id, r.place, r.best) for r in ranked] == [("a", 1, True), ("b", 1, True),
                                                              ("c", 3, False)]
    assert ranked[0].tied == ("b",) and "tied: equal evidence" in ranked[0].reason


def test_nothing_changed_no_evidence_and_no_test_command() -> None:
    ranked = rank([("none", ev("none", added=0, files=0), 0.0), ("later", None, 0.0),
                   ("untested", ev("untested", test=None), 0.0)])
    assert [r.task_id for r in ranked] == ["untested", "none", "later"]
    assert ranked[0].reason.startswith("no test command; +1/-0")
    assert ranked[1].reason == "changed nothing"
    assert ranked[2].reason == "no evidence yet"
    assert all(not r.passes for r in ranked[1:])


# --- settings ---------------------------------------------------------------------------------


def test_rank_checks_and_auto_pick_are_read(git_repo: Path, tmp_path: Path) -> None:
    (git_repo / ".fleet-tui.toml").write_text(
        'test_command = "make test"\nauto_pick = true\n\n[rank]\n'
        'checks = ["ruff check .", " mypy src "]\n')
    got = load_repo_settings(git_repo, str(tmp_path / "none.toml"))
    assert got.checks == ("ruff check .", "mypy src") and got.auto_pick is True
    user = tmp_path / "config.toml"
    user.write_text(f'[repos."{git_repo}"]\nauto_pick = false\n')
    assert load_repo_settings(git_repo, str(user)).auto_pick is False


@pytest.mark.parametrize(("text", "words"), [
    ('auto_pick = "yes"\n', ["line 1", "auto_pick: expected true or false"]),
    ('rank = 3\n', ["rank: expected a table"]),
    ('[rank]\n\nchecks = "ruff"\n', ["line 3", "rank.checks: expected a list of commands"]),
    ('[rank]\nchecks = ["ruff", ""]\n', ["line 2", "expected a list of commands"]),
    ('[rank]\ncheck = ["ruff"]\n', ["line 2", "unknown setting 'check' in [rank]; use checks"]),
    ('[rank]\nchecks = ["' + "x" * 5000 + '"]\n', ["line 2", "rank.checks:"]),
])
def test_a_bad_rank_setting_names_the_file_and_the_line(git_repo: Path, tmp_path: Path,
                                                         text: str, words: list[str]) -> None:
    (git_repo / ".fleet-tui.toml").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_repo_settings(git_repo, str(tmp_path / "none.toml"))
    assert str(git_repo / ".fleet-tui.toml") in str(err.value)
    assert all(w in str(err.value) for w in words), str(err.value)


# --- the store --------------------------------------------------------------------------------


def test_an_older_store_gains_the_evidence_tables_and_keeps_its_tasks(tmp_path: Path) -> None:
    db = tmp_path / "older.db"
    conn = sqlite3.connect(db, isolation_level=None)
    before = 0  # the version just before the evidence tables (later ones come after)
    for migrate in MIGRATIONS:
        migrate(conn)
        if "copy_evidence" in {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}:
            break
        before += 1
    conn.execute("DROP TABLE copy_evidence")
    conn.execute("DROP TABLE best_picks")
    conn.execute(f"PRAGMA user_version = {before}")
    conn.execute("INSERT INTO tasks (id, prompt, repo, state, created_at, updated_at, "
                 "group_id) VALUES ('old038', 'p', '/r', 'succeeded', 1.0, 2.0, 'g1')")
    conn.close()
    with Store(db) as store:
        assert store.schema_version() == SCHEMA_VERSION
        evidence = EvidenceStore(store)
        evidence.put("g1", [ev("old038", checks=(True, False))])
        assert evidence.record_pick("g1", "old038", "best of 1", "auto", 5.0) is True
        assert evidence.record_pick("g1", None, "again", "auto", 6.0) is False  # once
    with Store(db) as store:
        evidence = EvidenceStore(store)
        assert evidence.of_group("g1") == {"old038": ev("old038", checks=(True, False))}
        pick = evidence.pick_of("g1")
        assert pick is not None and (pick.task_id, pick.reason) == ("old038", "best of 1")
        assert [p.group_id for p in evidence.picks_since(5.0)] == ["g1"]
        assert evidence.picks_since(5.5) == []


# --- the engine, over real worktrees and real test commands ----------------------------------


def _copies(store: Store, repo: Path) -> list[str]:
    ids = ["bq1aaa", "bq2bbb", "bq3ccc"]
    for n, task_id in enumerate(ids):
        task = finished_task(store, repo, task_id, group_id="grp038",
                             title=f"Notes ({n + 1}/3)")
        worktree = Path(task.worktree or "")
        (worktree / "notes.txt").write_text("x\n" * (n + 1))
        if n == 2:
            (worktree / "only-mine.txt").write_text("mine\n")
    return ids


def test_evidence_is_gathered_once_and_again_when_a_copy_or_its_base_changes(
        git_repo: Path, tmp_path: Path) -> None:
    (git_repo / ".fleet-tui.toml").write_text('test_command = "test -s notes.txt"\n')
    commit_all(git_repo, "a test command")
    store = Store(tmp_path / "fleet.db")
    fleet = Fleet(load_settings(), store)
    fleet.spawn_queue_runners = False
    ids = _copies(store, git_repo)
    first = fleet.best.gather(ids[0])
    assert sorted(first) == ids
    assert all(e.test is not None and e.test.passed for e in first.values())
    assert [first[i].size for i in ids] == [1, 2, 4]
    assert first[ids[2]].outside == ("only-mine.txt",)  # no other copy touched it
    assert first[ids[0]].outside == ()
    assert fleet.best.gather(ids[1]) == first  # nothing changed: nothing run again

    # a copy changes (a commit in its worktree): only its evidence is gathered again
    worktree = Path(fleet.get_task(ids[0]).worktree or "")
    (worktree / "notes.txt").write_text("")
    commit_all(worktree, "empty notes")
    second = fleet.best.gather(ids[0])
    assert second[ids[1]] == first[ids[1]] and second[ids[2]] == first[ids[2]]
    test = second[ids[0]].test
    assert test is not None and not test.passed and "exited with status 1" in test.tail
    ranked = fleet.rank(ids[0], gather=False)
    assert [r.task_id for r in ranked] == [ids[1], ids[2], ids[0]]

    # the base moves: every copy's "merges cleanly" is asked again
    (git_repo / "README.md").write_text("moved on\n")
    commit_all(git_repo, "main moves")
    third = fleet.best.gather(ids[0])
    assert all(third[i].gathered_at >= second[i].gathered_at for i in ids)
    assert all(third[i].fingerprint != second[i].fingerprint for i in ids)


def test_a_task_that_is_not_a_copy_has_nothing_to_rank(git_repo: Path,
                                                       tmp_path: Path) -> None:
    store = Store(tmp_path / "fleet.db")
    fleet = Fleet(load_settings(), store)
    finished_task(store, git_repo, "solo38")
    with pytest.raises(FleetRefused, match="not launched as one of several copies"):
        fleet.pick_best("solo38")
    assert fleet.get_task("solo38").land_state is None


def test_a_copy_whose_worker_did_not_succeed_is_never_the_best(git_repo: Path,
                                                                tmp_path: Path) -> None:
    store = Store(tmp_path / "fleet.db")
    fleet = Fleet(load_settings(), store)
    fleet.spawn_queue_runners = False
    ids = _copies(store, git_repo)
    store.update_task(ids[0], state=TaskState.FAILED, verdict="max_turns")
    ranked = fleet.rank(ids[1])
    assert [r.task_id for r in ranked] == [ids[1], ids[2], ids[0]]
    assert ranked[2].reason == ("cannot be landed: its worker ended failed (verdict "
                                "max_turns)")
    assert ranked[2].evidence is not None and ranked[2].evidence.size == 1  # it was smallest


def test_an_auto_pick_group_left_undecided_gets_a_runner_again(git_repo: Path,
                                                                tmp_path: Path) -> None:
    """Copies that ended while no rank runner decided (one killed, the machine restarted):
    the next engine's pass starts one, and the winner lands through the queue."""
    (git_repo / ".fleet-tui.toml").write_text(
        'test_command = "test -s notes.txt"\nauto_pick = true\n')
    commit_all(git_repo, "auto_pick")
    store = Store(tmp_path / "fleet.db")
    ids = _copies(store, git_repo)
    for task_id in ids:  # ended a moment ago, no pass saw it end
        store.update_task(task_id, finished_at=time.time())
    fleet = Fleet(load_settings(), store)
    deadline = time.monotonic() + 180
    while fleet.get_task(ids[0]).state != TaskState.MERGED:
        assert time.monotonic() < deadline, [fleet.get_task(i).state for i in ids]
        fleet.tick()
        time.sleep(0.2)
    assert [fleet.get_task(i).state for i in ids[1:]] == [TaskState.DISCARDED] * 2
    pick = EvidenceStore(store).pick_of("grp038")
    assert pick is not None and pick.task_id == ids[0] and pick.how == "auto"
    assert (git_repo / "notes.txt").read_text() == "x\n"
    fleet.best.wait_runners(30)
