"""The store reads any row and keeps its files private.

Rows are tampered with through SQLite itself, as a hand edit or a damaged file would do;
modes are set as an older install left them, then the store is opened again."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest

from fleet_tui.store.db import Store, TaskState
from fleet_tui.system import paths

REPO = Path("/srv/project")


def _tamper(db: Path, sql: str, *args: Any) -> None:
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(sql, args)
    conn.close()


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize(("column", "value", "shown"), [
    ("state", "zzz", "'zzz'"),
    ("turns", "abc", "'abc'"),
    ("extra_args", "{junk", "'{junk'"),
    ("extra_args", "[1, 2]", "'[1, 2]'"),
    ("repo", b"\x00\xff", "b'\\x00\\xff'"),
    ("repo", "", "''"),
    ("created_at", "yesterday", "'yesterday'"),
    ("not_before", b"blob", "b'blob'"),
    ("max_turns", "ten", "'ten'"),
    ("input_tokens", 1.5, "1.5"),
])
def test_a_tampered_task_row_is_read_and_marked(tmp_path: Path, column: str, value: Any,
                                                shown: str) -> None:
    db = tmp_path / "fleet.db"
    with Store(db) as store:
        good = store.create_task(prompt="good", repo=REPO, title="good", now=1.0)
        bad = store.create_task(prompt="bad", repo=REPO, title="bad", now=2.0,
                                extra_args=["--verbose"])
        store.add_attempt(bad.id, prompt="bad")
    _tamper(db, f"UPDATE tasks SET {column} = ? WHERE id = ?", value, bad.id)
    with Store(db) as store:
        tasks = store.list_tasks()
        assert {t.id for t in tasks} == {good.id, bad.id}
        read = store.get_task(bad.id)
        expected = (f"the store row of task {bad.id} is unreadable: column {column} holds "
                    f"{shown}; discard the task, or correct the row")
        assert read.row_error == expected
        assert read.message == expected and read.verdict == "crashed"
        if column == "state":
            assert read.state == TaskState.FAILED
        # what could be read is kept; the bad column has its default
        assert read.prompt == "bad" and read.title == "bad"
        assert isinstance(read.turns, int) and isinstance(read.extra_args, list)
        fine = store.get_task(good.id)
        assert fine.row_error is None and fine.message is None
        assert [t.id for t in store.list_tasks(states=[TaskState.QUEUED])] == (
            [good.id] if column == "state" else [bad.id, good.id])


def test_several_bad_columns_are_counted(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    with Store(db) as store:
        task = store.create_task(prompt="p", repo=REPO)
    _tamper(db, "UPDATE tasks SET turns = 'a', output_tokens = 'b', state = 'c' WHERE id = ?",
            task.id)
    with Store(db) as store:
        read = store.get_task(task.id)
    assert read.row_error is not None
    assert "column state holds 'c' (and 2 more)" in read.row_error


def test_a_tampered_attempt_row_is_read_and_marked(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    with Store(db) as store:
        task = store.create_task(prompt="p", repo=REPO)
        first = store.add_attempt(task.id, prompt="p", dir=tmp_path / "a1")
        store.add_attempt(task.id, prompt="p", dir=tmp_path / "a2")
    _tamper(db, "UPDATE attempts SET dir = X'00', exit_code = 'one' WHERE id = ?", first.id)
    with Store(db) as store:
        attempts = store.list_attempts(task.id)
        assert [a.n for a in attempts] == [1, 2]
        assert attempts[0].row_error == (f"the store row of attempt 1 of task {task.id} is "
                                         "unreadable: column dir holds b'\\x00' (and 1 more)")
        assert attempts[0].dir is None and attempts[0].exit_code is None
        assert attempts[1].row_error is None and attempts[1].dir == tmp_path / "a2"
        assert store.get_attempt(first.id).row_error == attempts[0].row_error


def test_a_new_store_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "fleet-home"
    monkeypatch.setenv("FLEET_TUI_HOME", str(home))
    old = os.umask(0o022)
    try:
        with Store() as store:
            store.create_task(prompt="secret prompt", repo=REPO)
            assert store.journal_mode() == "wal"
            files = sorted(p.name for p in home.iterdir())
            assert files == ["fleet.db", "fleet.db-shm", "fleet.db-wal"]
            for name in files:
                assert _mode(home / name) == 0o600, name
        assert _mode(home) == 0o700
    finally:
        os.umask(old)


def test_an_older_install_is_made_private_when_opened(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "fleet-home"
    monkeypatch.setenv("FLEET_TUI_HOME", str(home))
    with Store() as store:
        store.create_task(prompt="secret prompt", repo=REPO)
    # what an older fleet-tui left: everything readable by every local user
    config = home / "config"
    (config / "abc123").mkdir(parents=True)
    (home / "launch-form.json").write_text("{}")
    for name in ("fleet.db-wal", "fleet.db-shm"):
        (home / name).touch()
    for path in [home, config, config / "abc123"]:
        os.chmod(path, 0o755)
    for path in home.iterdir():
        if path.is_file():
            os.chmod(path, 0o644)
    with Store() as store:
        assert store.list_tasks()[0].prompt == "secret prompt"
        store.create_task(prompt="another", repo=REPO)
        assert _mode(home) == 0o700
        assert _mode(config) == 0o700 and _mode(config / "abc123") == 0o700
        for name in ("fleet.db", "fleet.db-wal", "fleet.db-shm", "launch-form.json"):
            assert _mode(home / name) == 0o600, name


def test_paths_private_helpers(tmp_path: Path) -> None:
    folder = paths.private_dir(tmp_path / "a" / "b")
    assert _mode(folder) == 0o700
    f = paths.private_file(folder / "x.log")
    assert _mode(f) == 0o600 and f.read_bytes() == b""
    f.write_bytes(b"kept")
    os.chmod(f, 0o644)
    paths.private_file(f)
    assert _mode(f) == 0o600 and f.read_bytes() == b"kept"  # never truncated
    link = tmp_path / "link"
    link.symlink_to(f)
    assert not paths.make_private(link, 0o700)  # a symlink is not followed
    assert _mode(f) == 0o600
    assert not paths.make_private(tmp_path / "missing", 0o700)
