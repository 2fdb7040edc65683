"""An edit is read once it has settled (settings.watch): a look between a writer's
truncate and its write must not apply an empty or half file. Seen on a loaded machine:
the reload said "Settings reloaded" for the empty config.toml, and the merge dialog that
opened on it showed no test gate. Real files; the file's age is set with os.utime instead
of waiting for it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from fleet_tui.settings.repo_settings import REPO_FILE, RepoSettingsCache
from fleet_tui.settings.watch import SETTLE, file_stamp, settled


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_fresh_stamp_is_not_settled_and_an_old_one_is(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("max_workers = 4\n")
    assert not settled(file_stamp(path))
    _age(path, SETTLE + 0.1)
    assert settled(file_stamp(path))
    assert settled(file_stamp(tmp_path / "gone.toml"))  # nothing to wait for


def test_a_repository_file_being_written_is_read_once_it_rests(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    path = repo / REPO_FILE
    path.write_text('test_command = "make check"\n')
    _age(path, 10)
    cache = RepoSettingsCache({}, config_file=str(tmp_path / "none.toml"))
    assert cache.check(repo) == ("same", None)  # the first look
    assert cache.get(repo).test_command == "make check"
    path.write_text("")  # truncated: the writer has not written yet
    assert cache.check(repo) == ("same", None)  # not read: it was just modified
    path.write_text('test_command = "make test"\n')
    assert cache.check(repo) == ("same", None)
    _age(path, SETTLE + 0.1)
    assert cache.check(repo) == ("reloaded", None)
    assert cache.get(repo).test_command == "make test"


def test_config_being_written_is_not_applied_half_way(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet_tui.engine.fleet import Fleet
    from fleet_tui.settings.config import load_settings
    from fleet_tui.store.db import Store

    config = tmp_path / "config.toml"
    config.write_text('max_workers = 3\ntest_command = "make check"\n')
    _age(config, 10)
    monkeypatch.setenv("FLEET_TUI_CONFIG", str(config))
    fleet = Fleet(load_settings(), Store(tmp_path / "fleet.db"))
    fleet.watch_settings()
    config.write_text("")  # the writer truncated it and has not written yet
    assert fleet.check_settings() == []
    assert fleet.settings.max_workers == 3 and fleet.settings.test_command == "make check"
    config.write_text('max_workers = 5\ntest_command = "make test"\n')
    assert fleet.check_settings() == []  # still resting
    _age(config, SETTLE + 0.1)
    (notice,) = fleet.check_settings()
    assert notice.title == "Settings reloaded"
    assert fleet.settings.max_workers == 5 and fleet.settings.test_command == "make test"
    assert fleet.check_settings() == []  # said once
