"""fleet_tui.store.db on real SQLite files, shared by real processes and threads."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_tui.store.db import (
    ACTIVE_STATES,
    MIGRATIONS,
    SCHEMA_VERSION,
    AmbiguousTaskError,
    EndpointState,
    Store,
    StoreError,
    TaskState,
    UnknownTaskError,
)
from fleet_tui.system import paths

REPO = Path("/srv/project")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "fleet.db")
    yield s
    s.close()


_BARRIER = """
import os, sys, time
_go = sys.argv.pop()
_deadline = time.monotonic() + 30
while not os.path.exists(_go) and time.monotonic() < _deadline:
    time.sleep(0.001)
"""


def run_workers(script: str, args_list: list[list[str]], go_file: Path,
                timeout: float = 120) -> list[str]:
    """Start one real Python process per args, release them together once all have started
    (so they really contend), and return their stdouts (all must exit 0)."""
    code = _BARRIER + textwrap.dedent(script)
    procs = [subprocess.Popen([sys.executable, "-c", code, *args, str(go_file)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for args in args_list]
    time.sleep(0.3)  # let the interpreters start and import
    go_file.touch()
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err
        assert "locked" not in err
        outputs.append(out)
    return outputs


# --- schema -----------------------------------------------------------------------------------


def test_default_path_and_wal(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLEET_TUI_HOME", str(tmp_path / "home"))
    with Store() as s:
        assert s.path == paths.db_path() == tmp_path / "home" / "fleet.db"
        assert s.path.exists()
        assert s.journal_mode() == "wal"
        assert s.schema_version() == SCHEMA_VERSION
    raw = sqlite3.connect(tmp_path / "home" / "fleet.db")
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # persistent
    raw.close()


def test_migration_from_older_version(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db, isolation_level=None)
    MIGRATIONS[0](conn)  # a database as version 1 of fleet-tui left it
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO tasks (id, prompt, repo, state, created_at, updated_at, "
                 "extra_args) VALUES ('old001', 'fix it', '/r', 'succeeded', 1.5, 2.5, "
                 "'[\"--verbose\"]')")
    conn.close()
    with Store(db) as s:
        assert s.schema_version() == SCHEMA_VERSION
        task = s.get_task("old001")
        assert task.state is TaskState.SUCCEEDED
        assert task.extra_args == ["--verbose"]
        assert task.created_at == 1.5
        assert task.claimed_by is None  # the column the migration added
        assert s.update_task("old001", claimed_by="engine-1")
    with Store(db) as s:  # reopening does not migrate twice
        assert s.get_task("old001").claimed_by == "engine-1"


def _old_store(db: Path, version: int, task_id: str, state: str) -> None:
    """A database as version ``version`` of the schema left it, holding one task."""
    conn = sqlite3.connect(db, isolation_level=None)
    for migration in MIGRATIONS[:version]:
        migration(conn)
    conn.execute(f"PRAGMA user_version = {version}")
    conn.execute("INSERT INTO tasks (id, prompt, repo, state, created_at, updated_at) "
                 "VALUES (?, 'fix it', '/r', ?, 1.5, 2.5)", (task_id, state))
    conn.close()


def _version_before(table: str) -> int:
    """The schema version just before the migration that makes ``table``."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        for version, migration in enumerate(MIGRATIONS):
            migration(conn)
            if conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?",
                            (table,)).fetchone():
                return version
    finally:
        conn.close()
    raise AssertionError(f"no migration makes the table {table}")


def test_migration_adds_the_endpoints_table(tmp_path: Path) -> None:
    """A database of the version before (2): its tasks stay, the endpoints' limits start
    empty."""
    db = tmp_path / "v2.db"
    _old_store(db, 2, "old002", "queued")
    with Store(db) as s:
        assert s.schema_version() == SCHEMA_VERSION
        assert s.get_task("old002").state is TaskState.QUEUED
        assert s.list_endpoints() == [] and s.get_endpoint("https://x") is None
        state = s.change_endpoint("https://x", lambda st: {"cap": 2}, now=5.0)
        assert (state.endpoint, state.cap, state.updated_at) == ("https://x", 2, 5.0)
        assert s.get_endpoint("https://x") == state


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "new.db"
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    conn.close()
    with pytest.raises(StoreError, match="newer than this fleet-tui"):
        Store(db)


def test_unwritable_home_message(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(StoreError, match="FLEET_TUI_HOME"):
        Store(blocker / "sub" / "fleet.db")


# --- tasks ------------------------------------------------------------------------------------


def test_create_and_read_back_task_settings(store: Store) -> None:
    before = time.time()
    task = store.create_task(prompt="Add a CLI flag", repo=REPO, title="flag", base_ref="main",
                             base_branch="main", base_commit="a" * 40, endpoint="http://e",
                             model="small", permission_mode="acceptEdits", effort="low",
                             max_turns=12, timeout=90.5, extra_args=["--allowedTools", "Read"])
    assert re.fullmatch(r"[0-9a-z]{6}", task.id)
    assert task.branch == f"fleet/{task.id}"
    assert task.state is TaskState.QUEUED
    got = store.get_task(task.id)
    assert got == task
    assert isinstance(got.created_at, float) and got.created_at >= before
    assert got.extra_args == ["--allowedTools", "Read"]
    assert (got.model, got.permission_mode, got.effort, got.max_turns, got.timeout) == (
        "small", "acceptEdits", "low", 12, 90.5)
    assert got.repo == REPO and got.worktree is None
    assert store.update_task(task.id, worktree=REPO / ".fleet-work" / task.id)
    assert store.get_task(task.id).worktree == REPO / ".fleet-work" / task.id


def test_ids_are_unique_and_well_formed(store: Store) -> None:
    with store.transaction():  # one transaction: 300 inserts stay fast
        ids = {store.create_task(prompt=f"p{i}", repo=REPO).id for i in range(300)}
    assert len(ids) == 300
    assert all(re.fullmatch(r"[0-9a-z]{6}", i) for i in ids)
    with pytest.raises(StoreError, match="exists already"):
        store.create_task(prompt="dup", repo=REPO, task_id=next(iter(ids)))


def test_prefix_lookup_and_ambiguity(store: Store) -> None:
    store.create_task(prompt="one", repo=REPO, task_id="abc111")
    store.create_task(prompt="two", repo=REPO, task_id="abc222")
    store.create_task(prompt="three", repo=REPO, task_id="xyz999")
    assert store.get_task("abc1").prompt == "one"
    assert store.get_task("ABC2").prompt == "two"  # case-insensitive input
    assert store.get_task("x").prompt == "three"
    assert store.get_task("abc111").prompt == "one"
    with pytest.raises(AmbiguousTaskError, match="abc111, abc222") as ambiguous:
        store.get_task("abc")
    assert "type more characters" in str(ambiguous.value)
    with pytest.raises(UnknownTaskError, match=r"no task 'q'.*fleet-tui ls"):
        store.get_task("q")
    with pytest.raises(UnknownTaskError, match="1 to 6 characters"):
        store.get_task("ab%")  # LIKE wildcards are not id characters
    with pytest.raises(UnknownTaskError):
        store.get_task("")


def test_conditional_update(store: Store) -> None:
    task = store.create_task(prompt="p", repo=REPO)
    assert store.update_task(task.id, expect_state=TaskState.QUEUED, state=TaskState.RUNNING)
    # a second engine that also saw "queued" loses
    assert not store.update_task(task.id, expect_state=TaskState.QUEUED,
                                 state=TaskState.RUNNING)
    assert store.update_task(task.id, expect_state=ACTIVE_STATES, state="succeeded",
                             verdict="ok", finished_at=123.0)
    got = store.get_task(task.id)
    assert (got.state, got.verdict, got.finished_at) == (TaskState.SUCCEEDED, "ok", 123.0)
    assert got.updated_at >= got.created_at
    assert not store.update_task("nope00", state="failed")
    with pytest.raises(TypeError, match="api_key"):
        store.update_task(task.id, api_key="x")


def test_list_tasks_filters(store: Store) -> None:
    other = Path("/srv/other")
    a = store.create_task(prompt="a", repo=REPO, now=1.0)
    b = store.create_task(prompt="b", repo=REPO, now=2.0, state=TaskState.FAILED)
    c = store.create_task(prompt="c", repo=other, now=3.0)
    assert [t.id for t in store.list_tasks()] == [c.id, b.id, a.id]  # newest first
    assert [t.id for t in store.list_tasks(repo=REPO)] == [b.id, a.id]
    assert [t.id for t in store.list_tasks(states=[TaskState.QUEUED])] == [c.id, a.id]
    assert [t.id for t in store.list_tasks(REPO, [TaskState.QUEUED])] == [a.id]
    assert [t.id for t in store.list_tasks(limit=1)] == [c.id]
    assert store.list_tasks(states=[]) == []
    assert store.count_tasks(TaskState.QUEUED) == 2


def test_listing_1000_tasks_uses_the_index(store: Store) -> None:
    """(Its speed budget is bench/startup.py's startup.list_tasks.)"""
    states = list(TaskState)
    with store.transaction():
        for i in range(1000):
            store.create_task(prompt=f"task {i}", repo=REPO if i % 2 else Path("/srv/b"),
                              state=states[i % len(states)], now=float(i))
    everything = store.list_tasks()
    some = store.list_tasks(repo=REPO, states=[TaskState.RUNNING, TaskState.QUEUED])
    assert len(everything) == 1000
    assert some and all(t.repo == REPO and t.state in (TaskState.RUNNING, TaskState.QUEUED)
                        for t in some)
    plan = " ".join(str(r[-1]) for r in store._connect().execute(
        "EXPLAIN QUERY PLAN SELECT * FROM tasks WHERE repo = ? AND state IN (?, ?)",
        (str(REPO), "running", "queued")))
    assert "tasks_repo_state_updated" in plan


def test_modify_task_and_delete(store: Store) -> None:
    task = store.create_task(prompt="p", repo=REPO)
    store.add_attempt(task.id, prompt="p")
    after = store.modify_task(task.id, lambda t: {"turns": t.turns + 3})
    assert after.turns == 3 and store.get_task(task.id).turns == 3
    assert store.delete_task(task.id)
    assert store.list_attempts(task.id) == []
    with pytest.raises(UnknownTaskError):
        store.get_task(task.id)
    with pytest.raises(UnknownTaskError):
        store.modify_task(task.id, lambda t: None)


# --- claim_next -------------------------------------------------------------------------------


def test_claim_next_order_cap_and_backoff(store: Store) -> None:
    e = "http://127.0.0.1:1"
    first = store.create_task(prompt="1", repo=REPO, endpoint=e, now=10.0)
    waiting_later = store.create_task(prompt="2", repo=REPO, endpoint=e, now=11.0,
                                      state=TaskState.WAITING, not_before=500.0)
    waiting_due = store.create_task(prompt="3", repo=REPO, endpoint=e, now=12.0,
                                    state=TaskState.WAITING, not_before=90.0)
    store.create_task(prompt="other endpoint", repo=REPO, endpoint="http://other",
                      state=TaskState.RUNNING)
    claimed = store.claim_next(e, cap=2, now=100.0, owner="engine-a")
    assert claimed is not None and claimed.id == first.id
    assert claimed.state is TaskState.RUNNING
    assert (claimed.claimed_by, claimed.claimed_at) == ("engine-a", 100.0)
    second = store.claim_next(e, cap=2, now=100.0)
    assert second is not None and second.id == waiting_due.id and second.not_before is None
    assert store.claim_next(e, cap=2, now=1000.0) is None  # cap reached
    store.update_task(first.id, state=TaskState.SUCCEEDED)
    assert store.claim_next(e, cap=2, now=100.0) is None  # the other one is not due yet
    third = store.claim_next(e, cap=2, now=600.0)
    assert third is not None and third.id == waiting_later.id
    assert store.claim_next(e, cap=5, now=600.0) is None  # nothing left


def test_claim_next_holds_cap_across_processes(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    endpoint = "http://127.0.0.1:9"
    with Store(db) as s, s.transaction():
        ids = {s.create_task(prompt=f"t{i}", repo=REPO, endpoint=endpoint, now=float(i)).id
               for i in range(40)}
    script = """
        import sys, time
        from fleet_tui.store.db import Store, TaskState, ACTIVE_STATES
        db, endpoint, owner = sys.argv[1:4]
        other = {"a": "b", "b": "a"}[owner]
        store = Store(db)
        claimed, peak = [], 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            task = store.claim_next(endpoint, cap=3, owner=owner)
            if task is None:
                if store.count_tasks([TaskState.QUEUED]) == 0:
                    break
                time.sleep(0.001)
                continue
            with store.transaction():  # latest committed state
                peak = max(peak, store.count_tasks(ACTIVE_STATES, endpoint))
            claimed.append(task.id)
            # holding its first claim until the other process has one too: both take part
            # however the machine schedules them (else one may claim all 40 alone)
            while len(claimed) == 1 and time.monotonic() < deadline and not any(
                    t.claimed_by == other for t in store.list_tasks()):
                time.sleep(0.002)
            time.sleep(0.002)
            assert store.update_task(task.id, expect_state=TaskState.RUNNING,
                                     state=TaskState.SUCCEEDED)
        print(peak, " ".join(claimed))
    """
    outs = run_workers(script, [[str(db), endpoint, "a"], [str(db), endpoint, "b"]],
                       tmp_path / "go")
    peaks = [int(o.split()[0]) for o in outs]
    claimed = [tid for o in outs for tid in o.split()[1:]]
    assert sorted(claimed) == sorted(ids)  # every task claimed exactly once
    assert max(peaks) <= 3
    assert all(len(o.split()) > 1 for o in outs), "both processes should have claimed some"
    with Store(db) as s:
        done = s.list_tasks(states=[TaskState.SUCCEEDED])
        assert {t.claimed_by for t in done} == {"a", "b"}


# --- concurrency ------------------------------------------------------------------------------


def test_concurrent_processes_lose_no_updates(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    with Store(db) as s:
        task = s.create_task(prompt="counter", repo=REPO)
        attempt = s.add_attempt(task.id, prompt="counter")
    script = """
        import sys
        from fleet_tui.store.db import Store
        db, task_id, attempt_id = sys.argv[1], sys.argv[2], int(sys.argv[3])
        store = Store(db)
        start = time.perf_counter()
        for _ in range(200):
            store.modify_task(task_id, lambda t: {"turns": t.turns + 1,
                                                  "input_tokens": t.input_tokens + 7})
            with store.transaction():
                a = store.get_attempt(attempt_id)
                store.update_attempt(attempt_id, events_offset=a.events_offset + 1)
        print(f"done {time.perf_counter() - start:.3f}")
    """
    outs = run_workers(script, [[str(db), task.id, str(attempt.id)]] * 4, tmp_path / "go")
    assert [o.split()[0] for o in outs] == ["done"] * 4
    with Store(db) as s:
        got = s.get_task(task.id)
        assert got.turns == 800 and got.input_tokens == 5600
        assert s.get_attempt(attempt.id).events_offset == 800
    slowest = max(float(o.split()[1]) for o in outs)
    print(f"\n4 processes x 200 read-modify-write (x2 transactions): slowest {slowest:.2f} s")


def test_threads_share_one_store(store: Store) -> None:
    task = store.create_task(prompt="p", repo=REPO)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(100):
                store.modify_task(task.id, lambda t: {"output_tokens": t.output_tokens + 1})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert store.get_task(task.id).output_tokens == 400


def test_rollback_on_error(store: Store) -> None:
    task = store.create_task(prompt="p", repo=REPO)
    with pytest.raises(RuntimeError), store.transaction():
        store.update_task(task.id, state=TaskState.FAILED)
        raise RuntimeError("boom")
    assert store.get_task(task.id).state is TaskState.QUEUED


# --- attempts ---------------------------------------------------------------------------------


def test_attempts(store: Store, tmp_path: Path) -> None:
    task = store.create_task(prompt="p", repo=REPO)
    d = tmp_path / "logs" / "1"
    first = store.add_attempt(task.id, prompt="p", model="GLM-5.2", dir=d,
                              events_path=d / "events.jsonl", config_dir=tmp_path / "cfg",
                              now=50.0)
    assert (first.n, first.kind, first.started_at) == (1, "fresh", 50.0)
    assert store.update_attempt(first.id, pid=1234, pid_start="98765", runner_pid=1200,
                                finished_at=60.0, exit_code=1, verdict="overload",
                                session_id="s-1", turns=2, events_offset=4096)
    second = store.add_attempt(task.id, kind="resume", prompt="go on")
    assert second.n == 2
    assert store.get_task(task.id).attempt_count == 2
    got = store.get_attempt(first.id)
    assert (got.pid, got.pid_start, got.runner_pid, got.verdict, got.events_offset) == (
        1234, "98765", 1200, "overload", 4096)
    assert got.events_path == d / "events.jsonl" and got.config_dir == tmp_path / "cfg"
    assert [a.n for a in store.list_attempts(task.id)] == [1, 2]
    latest = store.latest_attempt(task.id)
    assert latest is not None and latest.id == second.id
    assert [a.id for a in store.unfinished_attempts()] == [second.id]
    with pytest.raises(UnknownTaskError):
        store.add_attempt("nope00", prompt="x")
    with pytest.raises(StoreError, match="no attempt 999"):
        store.get_attempt(999)


# --- secrets ----------------------------------------------------------------------------------


def test_store_file_never_holds_the_key(git_repo: Path, claude_bin: str,
                                        tmp_path: Path) -> None:
    """The key is where the engine handles it — the Fleet's environment, which the runner
    hands to claude, which sends it to the endpoint — while the engine writes the store at
    every step of two real runs (one refused with 401, one that succeeds). The store's
    files (fleet.db, its WAL and shm) never hold it. The endpoint receiving the key is the
    proof that it really went through the code that writes the store."""
    import hashlib

    from fleet_tui.demo.endpoint import ScriptedEndpoint
    from fleet_tui.engine.fleet import Fleet
    from fleet_tui.settings.config import load_settings
    from fleet_tui.store.db import FINISHED_STATES, TaskSpec

    key = "sk-fleet-" + os.urandom(12).hex()
    db = tmp_path / "fleet.db"
    scripts = {"default": ["All done."],
               "denied": {"turns": ["never"], "faults": [{"status": 401, "times": None}]}}
    with ScriptedEndpoint(scripts) as endpoint, Store(db) as s:
        settings = load_settings(env=os.environ, overrides={
            "base_url": endpoint.url, "claude": claude_bin, "sandbox": os.geteuid() == 0,
            "key_sources": "env", "backoff_base": 0.2, "backoff_cap": 1.0})
        env = dict(os.environ, ANTHROPIC_AUTH_TOKEN=key, GLM_API_KEY=key,
                   CLAUDE_CODE_MAX_RETRIES="0")
        fleet = Fleet(settings, s, env=env)
        (ok,) = fleet.submit(TaskSpec(prompt="say done", title="fine", repo=git_repo))
        (denied,) = fleet.submit(TaskSpec(prompt="[script:denied] go", repo=git_repo))
        deadline = time.monotonic() + 120
        while not all(fleet.get_task(t.id).state in FINISHED_STATES for t in (ok, denied)):
            assert time.monotonic() < deadline, [fleet.get_task(t.id) for t in (ok, denied)]
            fleet.tick()
            time.sleep(0.1)
        assert fleet.get_task(ok.id).state == TaskState.SUCCEEDED
        assert fleet.get_task(denied.id).verdict == "auth"
        blobs = b"".join(p.read_bytes() for p in tmp_path.glob("fleet.db*"))
    sent = {r.auth_sha256 for r in endpoint.message_requests()}
    assert sent == {hashlib.sha256(key.encode()).hexdigest()}  # the key went through
    assert len(blobs) > 10_000  # the store (and its WAL) really holds data
    assert key.encode() not in blobs, "the key is in the store's files"


# --- the endpoints' limits ----------------------------------------------------------------------


def test_two_processes_parking_one_endpoint_keep_the_later_reset(tmp_path: Path) -> None:
    """The read-modify-write of an endpoint's state is one transaction: processes that
    park it at the same moment (each task meeting the window) leave the latest reset."""
    db = tmp_path / "fleet.db"
    Store(db).close()
    script = """
        import sys
        from fleet_tui.core import policy
        from fleet_tui.settings.config import Settings
        from fleet_tui.store.db import Store
        db, start = sys.argv[1], int(sys.argv[2])
        store = Store(db)
        for i in range(start, start + 60, 2):
            effect = policy.Effect("park", until=1000.0 + i, reason=f"reset {i}")
            store.change_endpoint("https://ep", lambda st: policy.apply_effect(
                st, effect, Settings(), 10.0), now=10.0)
        print("ok")
    """
    run_workers(script, [[str(db), "0"], [str(db), "1"]], tmp_path / "go")
    with Store(db) as s:
        state = s.get_endpoint("https://ep")
    assert state is not None and state.parked_until == 1059.0
    assert state.event == "park" and state.event_at == 10.0


def test_claim_gated_obeys_the_park_and_staggers_the_resume(store: Store) -> None:
    from fleet_tui.core import policy
    from fleet_tui.settings.config import Settings

    e = "https://ep"
    settings = Settings(max_workers=4, resume_stagger=5.0)
    parked = [store.create_task(prompt=f"p{i}", repo=REPO, endpoint=e, now=float(i),
                                state=TaskState.WAITING, verdict="window", not_before=100.0)
              for i in range(2)]
    queued = store.create_task(prompt="q", repo=REPO, endpoint=e, now=5.0)
    store.change_endpoint(e, lambda st: {"parked_until": 100.0, "park_reason": "w"})

    def claim(now: float) -> str | None:
        def decide(state: EndpointState | None, n: int, at: float) -> Any:
            return policy.gate(state, settings, at, n).as_tuple()
        task = store.claim_gated(e, now, "engine", decide)
        return task.id if task is not None else None

    assert claim(50.0) is None  # parked: nothing
    assert claim(100.0) == parked[0].id  # the reset: one
    assert claim(101.0) is None  # the next one resume_stagger later
    assert claim(105.0) == parked[1].id
    state = store.get_endpoint(e)
    assert state is not None and state.parked_until == 100.0 and state.next_start == 110.0
    # none parked any more, but the task queued during the park is held back too
    assert claim(106.0) is None
    assert claim(110.0) == queued.id
    assert claim(111.0) is None
    state = store.get_endpoint(e)
    assert state is not None and state.parked_until == 100.0
    # nothing left to start once the stagger has passed: the park is over
    assert claim(115.0) is None
    state = store.get_endpoint(e)
    assert state is not None and (state.parked_until, state.next_start) == (None, None)


def test_claim_gated_holds_while_the_start_window_is_full(store: Store) -> None:
    """`starting` (most, since): a task counts as starting from its claim (after `since`)
    until an unfinished attempt of it has a session; a retry's finished attempt with a
    session does not count as begun; an older claim counts as started."""
    from fleet_tui.core import policy
    from fleet_tui.settings.config import Settings

    e = "zai"
    settings = Settings(max_workers=8)
    ids = [store.create_task(prompt=f"t{i}", repo=REPO, endpoint=e, now=float(i)).id
           for i in range(5)]

    def claim(now: float, most: int = 2, bound: float = 5.0) -> str | None:
        def decide(state: EndpointState | None, n: int, at: float) -> Any:
            return policy.gate(state, settings, at, n).as_tuple()
        task = store.claim_gated(e, now, "engine", decide, starting=(most, now - bound))
        return task.id if task is not None else None

    assert claim(10.0) == ids[0] and claim(10.0) == ids[1]
    assert claim(10.5) is None  # two claimed, neither begun
    assert store.starting_count(e, 5.0) == 2
    # the first one's claude begins (its session stored): one more may start
    first = store.add_attempt(ids[0], now=10.1)
    store.update_attempt(first.id, session_id="s-1")
    assert claim(11.0) == ids[2]
    assert claim(11.0) is None
    # the second's attempt is a retry: its earlier, finished attempt's session is not it
    old = store.add_attempt(ids[1], now=10.1)
    store.update_attempt(old.id, session_id="s-old", finished_at=10.2)
    store.add_attempt(ids[1], now=10.3)
    assert claim(12.0) is None
    # past the bound, claims that never began count as started: the next go on
    assert claim(15.5) == ids[3]  # the second's claim (10.0) is past; the third's is not
    assert claim(15.5) is None
    assert claim(16.5) == ids[4]
    assert store.starting_count(e, 0.0) == 4  # all but the begun one, counted from 0


def test_after_a_reset_two_engines_start_one_task_per_stagger_parked_first(
        tmp_path: Path) -> None:
    """One task parked by a window, three queued while parked; two
    engines (two Store objects on one database, as two processes) ask for claims at the
    reset and after it, the fresh ones asking first. The endpoint gets one claim per
    resume_stagger, the parked session first, whoever asks."""
    import itertools

    from fleet_tui.core import policy
    from fleet_tui.settings.config import Settings

    e = "https://ep"
    settings = Settings(max_workers=8, resume_stagger=5.0, park_jitter=1.0)
    db = tmp_path / "two.db"
    first, second = Store(db), Store(db)
    parked = first.create_task(prompt="parked", repo=REPO, endpoint=e, now=1.0,
                               state=TaskState.WAITING, verdict="window", not_before=100.0)
    first.change_endpoint(e, lambda st: {"parked_until": 100.0, "park_reason": "w"})
    fresh = [second.create_task(prompt=f"fresh {i}", repo=REPO, endpoint=e, now=0.5 + i / 10)
             for i in range(3)]  # created_at before the parked one's: age alone would lose

    def claim(store: Store, now: float) -> str | None:
        def decide(state: EndpointState | None, n: int, at: float) -> Any:
            return policy.gate(state, settings, at, n).as_tuple()
        task = store.claim_gated(e, now, f"engine-{id(store)}", decide)
        return task.id if task is not None else None

    claims: list[tuple[float, str]] = []
    now = 99.0
    while now < 140.0:  # both engines ask every 10 ms, one after the other
        for store in (second, first):
            got = claim(store, now)
            if got is not None:
                claims.append((now, got))
        now = round(now + 0.01, 2)
    assert [task_id for _, task_id in claims] == [parked.id, *(t.id for t in fresh)]
    times = [at for at, _ in claims]
    assert times[0] == 100.0
    assert all(b - a >= settings.resume_stagger for a, b in itertools.pairwise(times))
    state = first.get_endpoint(e)
    assert state is not None and state.parked_until is None  # the resume is over
    # afterwards the endpoint is open again: a new task starts at once
    late = first.create_task(prompt="late", repo=REPO, endpoint=e, now=141.0)
    assert claim(second, 141.0) == late.id
    first.close()
    second.close()


def test_note_queued_writes_only_its_own_notes(store: Store) -> None:
    e = "https://ep"
    plain = store.create_task(prompt="a", repo=REPO, endpoint=e)
    requeued = store.create_task(prompt="b", repo=REPO, endpoint=e, message="requeued: x")
    other = store.create_task(prompt="c", repo=REPO, endpoint="https://other")
    failed = store.create_task(prompt="d", repo=REPO, endpoint=e, state=TaskState.FAILED)
    prefixes = ("waits: ", "held: ")
    assert store.note_queued(e, "held: in arrears", prefixes) == 1
    assert store.get_task(plain.id).message == "held: in arrears"
    assert store.get_task(requeued.id).message == "requeued: x"  # not ours to replace
    assert store.get_task(other.id).message is None
    assert store.get_task(failed.id).message is None
    assert store.note_queued(e, "held: in arrears", prefixes) == 0  # no write when said
    assert store.note_queued(e, None, prefixes) == 1
    assert store.get_task(plain.id).message is None


def test_a_damaged_endpoint_row_is_ignored_and_said(store: Store) -> None:
    store.change_endpoint("https://ep", lambda st: {"cap": 2, "held": "in arrears"})
    with store.transaction() as conn:
        conn.execute("UPDATE endpoints SET cap = 'two' WHERE endpoint = 'https://ep'")
    state = store.get_endpoint("https://ep")
    assert state is not None and state.cap is None and state.held is None
    assert state.row_error is not None and "column cap holds 'two'" in state.row_error


def test_migration_adds_the_lost_attempts_table(tmp_path: Path) -> None:
    """A store of the version before the lost attempts' table: it gets the table, its
    tasks stay; a lost attempt is kept until swept (the first record wins), per host."""
    db = tmp_path / "before.db"
    _old_store(db, _version_before("lost_attempts"), "old003", "failed")
    with Store(db) as s:
        assert s.schema_version() == SCHEMA_VERSION
        assert s.get_task("old003").state is TaskState.FAILED
        assert s.lost_to_sweep() == []
        s.record_lost("box", "old003", 1, "lost: host box unreachable", 10.0)
        s.record_lost("box", "old003", 1, "a second word on it", 11.0)
        s.record_lost("other", "old003", 2, "lost: host other unreachable", 12.0)
    with Store(db) as s:  # a restarted engine finds them
        assert s.lost_to_sweep("box") == [("box", "old003", 1, "lost: host box unreachable")]
        assert [row[0] for row in s.lost_to_sweep()] == ["box", "other"]
        s.mark_swept("box", "old003", 1, 3, 20.0)
        assert s.lost_to_sweep("box") == []
        assert s.lost_to_sweep() == [("other", "old003", 2, "lost: host other unreachable")]


def test_a_file_put_in_the_databases_place_is_read_by_every_thread(tmp_path: Path) -> None:
    """Each thread keeps a connection; a database file replaced while they are open (a
    backup restored, a stray copy moved over it) is what they read next, within
    LOOK_EVERY, not the unlinked one for ever: in this thread, in a thread that had a
    connection before, and as an error that says so for a file that is not a database."""
    path = tmp_path / "fleet.db"
    store = Store(path)
    other = Store(tmp_path / "other.db")

    def read_until(want: Any) -> Any:  # what the reads give: `want` once they give it
        deadline = time.monotonic() + 10 * store.LOOK_EVERY + 5
        while True:
            try:
                got: Any = [t.id for t in store.list_tasks()]
            except StoreError:
                got = StoreError
            if got == want or time.monotonic() > deadline:
                return got
            time.sleep(0.02)

    def put_in_place(new: Path) -> None:  # the old file's log goes with it (it would be
        for suffix in ("-wal", "-shm"):  # read over the new one)
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        os.replace(new, path)

    try:
        mine = store.create_task(prompt="on the first file", repo=REPO)
        theirs = other.create_task(prompt="on the restored file", repo=REPO)
        before: list[str] = []
        after: list[Any] = []
        read, go = threading.Event(), threading.Event()

        def reader() -> None:  # a pool thread's reads: one before the swap, then after
            before.extend(t.id for t in store.list_tasks())
            read.set()
            go.wait(30)
            after.append(read_until([theirs.id]))

        thread = threading.Thread(target=reader)
        thread.start()
        assert read.wait(30)
        assert before == [mine.id]
        assert [t.id for t in store.list_tasks()] == [mine.id]  # this thread's connection
        other.close()
        put_in_place(tmp_path / "other.db")
        go.set()
        thread.join(30)
        assert after == [[theirs.id]]
        assert read_until([theirs.id]) == [theirs.id]

        (tmp_path / "garbage").write_bytes(b"not a database\n" * 100)
        put_in_place(tmp_path / "garbage")
        assert read_until(StoreError) is StoreError
        with pytest.raises(StoreError, match="not a database"):
            store.list_tasks()
    finally:
        store.close()
        other.close()
