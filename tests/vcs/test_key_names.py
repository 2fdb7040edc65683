"""A file whose NAME holds the API key (review finding): the diff names it with the key
hidden and lists it among the files that hold the key; the merge (and its preview)
refuses it, in the changes or in the branch's history, and says precisely what it found
(a name in a folder, not "a folder listing"). Real git repositories; no worker."""

from __future__ import annotations

from pathlib import Path

from test_git import commit_all, git, snapshot

from fleet_tui.core import redaction
from fleet_tui.vcs import git as fgit

KEY = "sk-key-names-SECRET-90b1e2"


def test_a_file_named_after_the_key_is_named_hidden_and_refused(git_repo: Path) -> None:
    info = fgit.create_worktree(git_repo, "n1")
    (info.path / "notes").mkdir()
    (info.path / "notes" / f"{KEY}.txt").write_text("harmless\n")
    (info.path / "feature.txt").write_text("work\n")
    hidden = f"notes/{fgit.REDACTED}.txt"
    diff = fgit.diff(info.path, info.base_commit, secrets=(KEY,))
    assert sorted(f.path for f in diff.files) == ["feature.txt", hidden]
    assert diff.secret_paths == [hidden]
    assert KEY not in diff.patch and all(KEY not in f.patch for f in diff.files)
    preview = fgit.conflict_preview(git_repo, info.branch, "main", worktree=info.path,
                                    secrets=(KEY,))
    assert preview.reason == "secret" and preview.secret_paths == [hidden]
    before = snapshot(git_repo)
    commit_all(info.path, "work")
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="x",
                        secrets=(KEY,))
    assert not result.merged
    assert result.message == (f"the changes of {info.branch} contain the API key in: "
                              f"{hidden}; remove it before merging")
    assert snapshot(git_repo) == before


def test_a_name_in_the_history_is_said_as_a_name(git_repo: Path) -> None:
    info = fgit.create_worktree(git_repo, "n2")
    (info.path / "src" / f"{KEY}.txt").write_text("harmless\n")
    commit_all(info.path, "oops")
    git(info.path, "mv", f"src/{KEY}.txt", "src/renamed.txt")
    commit_all(info.path, "renamed it")
    before = snapshot(git_repo)
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="x",
                        secrets=(KEY,))
    assert not result.merged and KEY not in result.message
    assert result.message == (
        f"an earlier commit of {info.branch} contains the API key in: the name "
        f"src/{fgit.REDACTED}.txt in folder src; a merge would copy it into the history "
        "of main: remove it from the branch's commits, or discard the task")
    assert snapshot(git_repo) == before


def test_the_one_helper() -> None:
    redaction.forget_all()
    try:
        assert redaction.redact(f"a {KEY} b") == f"a {KEY} b"  # nothing known yet
        assert redaction.redact(f"a {KEY} b", [KEY]) == f"a {redaction.MARK} b"
        assert redaction.redact("a short b", ["short"]) == "a short b"  # too short to look for
        redaction.remember([KEY])
        assert redaction.redact(f"{KEY}{KEY}") == redaction.MARK * 2
        assert redaction.redact_bytes(f'{{"k": "{KEY}"}}'.encode()) == \
            f'{{"k": "{redaction.MARK}"}}'.encode()
        redaction.remember([KEY + "-longer"])  # one holding another: the longer first
        assert redaction.redact(f"x {KEY}-longer") == f"x {redaction.MARK}"
    finally:
        redaction.forget_all()


def test_the_store_and_the_attempt_folder_readers_hide_a_known_key(tmp_path: Path) -> None:
    """The boundaries without a worker: what the store writes of a worker's words, and
    what the attempt folder's readers give the CLI, the panel and the follower."""
    import json

    from fleet_tui.execution.worker.attemptlog import AttemptLog
    from fleet_tui.store.db import Store, TaskState

    events = tmp_path / "attempt"
    events.mkdir()
    use = {"type": "assistant", "message": {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "Bash",
         "input": {"command": f"echo {KEY}"}}]}}
    result = {"type": "user", "message": {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": KEY}]}}
    data = (json.dumps(use) + "\n" + json.dumps(result) + "\n").encode()
    (events / "events.jsonl").write_bytes(data)
    (events / "stderr.log").write_text(f"Invalid API key {KEY}\n")
    log = AttemptLog(events)
    redaction.forget_all()
    try:
        assert KEY.encode() in log.read_bytes(finished=True)[0]  # not known: nothing to hide
        redaction.remember([KEY])
        raw, end = log.read_bytes(finished=True)
        assert KEY.encode() not in raw and redaction.MARK.encode() in raw
        assert end == len(data)  # offsets are the file's
        lines, end, _ = log.read_lines(finished=True)
        assert end == len(data) and all(KEY not in line for line in lines)
        decoded, _ = log.read_events(finished=True)
        assert decoded and KEY not in repr(decoded)
        call, output = log.tool_call("toolu_1")
        assert call is not None and output is not None
        assert KEY not in repr(call) + repr(output) and redaction.MARK in output.content
        assert log.stderr_tail() == f"Invalid API key {redaction.MARK}\n"
        assert (events / "events.jsonl").read_bytes() == data  # claude's bytes, kept

        db = tmp_path / "fleet.db"
        with Store(db) as store:
            task = store.create_task(prompt=f"use {KEY}", repo=tmp_path, title="t",
                                     message=f"said {KEY}", state=TaskState.RUNNING)
            assert store.get_task(task.id).message == f"said {redaction.MARK}"
            store.update_task(task.id, last_tool=f"Bash echo {KEY}", land_note=KEY)
            attempt = store.add_attempt(task.id, prompt="p", message=KEY)
            store.update_attempt(attempt.id, last_tool=f"Write {KEY}.txt")
            assert store.requeue_claim(task.id, None, None, 1.0, KEY)
            read = store.get_task(task.id)
            assert read.message == redaction.MARK
            assert read.last_tool == f"Bash echo {redaction.MARK}"
            assert store.get_attempt(attempt.id).last_tool == f"Write {redaction.MARK}.txt"
            assert read.prompt == f"use {KEY}"  # the user's own words are kept as given
        stored = b"".join(p.read_bytes() for p in tmp_path.glob("fleet.db*"))
        assert stored.count(KEY.encode()) == stored.count(f"use {KEY}".encode())
    finally:
        redaction.forget_all()


def test_an_engine_error_that_quotes_the_key_hides_it(git_repo: Path) -> None:
    """git's own words quote what they were given: here a base commit hand-edited into
    the key (a worker's file name would do the same) in the error of a real git call."""
    import os
    import time

    import pytest

    from fleet_tui.engine.fleet import Fleet
    from fleet_tui.settings.config import load_settings
    from fleet_tui.store.db import Store, TaskState

    fleet = Fleet(load_settings(env=os.environ, overrides={"key_sources": "env"}),
                  Store(git_repo.parent / "fleet.db"),
                  env=dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY))
    info = fgit.create_worktree(git_repo, "n3")
    now = time.time()
    fleet.store.create_task(prompt="p", repo=git_repo, task_id="n3", title="p",
                            state=TaskState.SUCCEEDED, worktree=info.path,
                            branch=info.branch, base_commit=KEY, base_branch=None,
                            started_at=now, finished_at=now, now=now)
    try:
        with pytest.raises(fgit.GitError) as caught:
            fleet.diff("n3")
        assert str(caught.value) == (f"unknown base commit '{redaction.MARK}' in "
                                     f"{info.path}")
    finally:
        redaction.forget_all()


def test_the_panel_never_shows_the_key_in_an_error() -> None:
    """describe_error (every failure toast of the panel) hides a known key, in fleet-tui's
    own errors and in any other exception that quotes it."""
    from fleet_tui.core.errors import FleetRefused
    from fleet_tui.ui.formatting import describe_error

    key = "sk-panel-error-SECRET-77ab"
    redaction.remember([key])
    try:
        for error in (FleetRefused(f"cannot use {key}"), OSError(f"open {key}/x failed")):
            said = describe_error(error)
            assert key not in said and redaction.MARK in said
    finally:
        redaction.forget_all()


def test_a_row_written_before_the_key_was_hidden_is_read_hidden(tmp_path: Path) -> None:
    """A row stored by an older fleet-tui (or a process that did not know the key) still
    holds the key: what the store reads, which the panel shows, has it hidden (review
    finding: the panel showed `worker said sk-...` from such a row)."""
    import sqlite3

    from fleet_tui.store.db import Store, TaskState

    db = tmp_path / "fleet.db"
    redaction.forget_all()
    try:
        with Store(db) as store:
            task = store.create_task(prompt="p", repo=tmp_path, title="t",
                                     state=TaskState.FAILED)
        conn = sqlite3.connect(db)
        with conn:
            conn.execute("UPDATE tasks SET message = ?, last_tool = ? WHERE id = ?",
                         (f"worker said {KEY}", f"Bash echo {KEY}", task.id))
        conn.close()
        redaction.remember([KEY])
        with Store(db) as store:
            read = store.get_task(task.id)
            listed = {t.id: t for t in store.list_tasks()}[task.id]
        for shown in (read, listed):
            assert shown.message == f"worker said {redaction.MARK}"
            assert shown.last_tool == f"Bash echo {redaction.MARK}"
            assert shown.row_error is None
    finally:
        redaction.forget_all()
