"""Review comments: the rules (anchors, states, the message), the store, the
engine with the real claude against the scripted endpoint (two comments sent as one
follow-up; the worker's change marks the one whose lines it touched), and the CLI."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from endpoint_helpers import cli_env, poll_pauses

from fleet_tui.core.review import (
    CommentState,
    anchor_of,
    diff_lines,
    intact,
    parse_line_spec,
    review_message,
    state_of,
)
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, FleetRefused, InvalidSpec, TaskSpec
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import MIGRATIONS, SCHEMA_VERSION, Store, TaskState
from fleet_tui.store.reviews import Reviews, UnknownComment, ViewedFiles
from fleet_tui.system import paths

KEY = "sk-review-test-SECRET-71ac"
TICK = 0.05

FIRST = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a ** b\n"
FIXED = "# calc\ndef add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a ** b\n"


def _write(content: str, done: str) -> list[Any]:
    return [[{"type": "tool_use", "name": "Write",
              "input": {"file_path": "{cwd}/calc.py", "content": content}}], done]


SCRIPTS: dict[str, Any] = {
    # the worker writes calc.py; the review's follow-up fixes add (and a line above it)
    "default": {"turns": _write(FIRST, "wrote calc.py"),
                "followup": _write(FIXED, "fixed add")},
}


# --- the rules ------------------------------------------------------------------------------

PATCH = """diff --git a/calc.py b/calc.py
index 1111111..2222222 100644
--- a/calc.py
+++ b/calc.py
@@ -1,3 +1,4 @@
 def add(a, b):
-    return a
+    return a - b
+
 x = 1
"""


def test_diff_lines_number_both_sides() -> None:
    rows = diff_lines(PATCH.splitlines(), ["calc.py"])
    content = [r for r in rows if r is not None]
    assert [(r.kind, r.old, r.new) for r in content] == [
        (" ", 1, 1), ("-", 2, None), ("+", None, 2), ("+", None, 3), (" ", 3, 4)]
    assert rows[:5] == [None] * 5  # headers and the hunk line
    assert all(r.path == "calc.py" for r in content)


def test_diff_lines_of_several_files_name_each() -> None:
    two = PATCH + PATCH.replace("calc.py", "b.py")
    rows = [r for r in diff_lines(two.splitlines(), ["calc.py", "b.py"]) if r is not None]
    assert [r.path for r in rows] == ["calc.py"] * 5 + ["b.py"] * 5


def test_anchor_prefers_the_new_side_and_quotes_every_row() -> None:
    rows = [r for r in diff_lines(PATCH.splitlines(), ["calc.py"]) if r is not None]
    anchor = anchor_of(rows[1:3])  # the deleted line and the added one
    assert (anchor.side, anchor.start, anchor.end) == ("new", 2, 2)
    assert anchor.lines == ("    return a - b",)
    assert anchor.quote == ("-    return a", "+    return a - b")
    deleted = anchor_of(rows[1:2])
    assert (deleted.side, deleted.start, deleted.end, deleted.lines) == (
        "old", 2, 2, ("    return a",))
    assert deleted.label.endswith("(deleted lines, numbered as in the base)")


def test_intact_follows_lines_that_moved_and_sees_changes() -> None:
    rows = [r for r in diff_lines(PATCH.splitlines(), ["calc.py"]) if r is not None]
    anchor = anchor_of(rows[2:4])
    now = ["def add(a, b):", "    return a - b", "", "x = 1"]
    assert intact(anchor, now, {}) == 3
    assert intact(anchor, ["# new", "# lines", *now], {}) == 5  # moved down by two
    assert intact(anchor, ["def add(a, b):", "    return a + b", "", "x = 1"], {}) is None
    assert intact(anchor, None, {}) is None  # the file is gone
    old = anchor_of(rows[1:2])
    assert intact(old, None, {2: "    return a"}) == 2
    assert intact(old, None, {}) is None  # no longer deleted: put back


@pytest.mark.parametrize(("sent", "now", "at_send", "state"), [
    (False, True, None, CommentState.OPEN),
    (False, False, None, CommentState.OUTDATED),
    (True, True, True, CommentState.OPEN),
    (True, False, True, CommentState.ADDRESSED),
    (True, False, False, CommentState.OUTDATED),
])
def test_the_state_rules(sent: bool, now: bool, at_send: bool | None,
                         state: CommentState) -> None:
    assert state_of(sent=sent, intact_now=now, intact_at_send=at_send) == state


def test_line_specs() -> None:
    assert parse_line_spec("src/a b.py:12") == ("src/a b.py", 12, 12)
    assert parse_line_spec("c:\\x.py:3-9") == ("c:\\x.py", 3, 9)
    for bad in ("calc.py", "calc.py:x", "calc.py:0", "calc.py:9-3", ":3"):
        with pytest.raises(ValueError, match=r"FILE:LINE|numbered from 1"):
            parse_line_spec(bad)


def test_the_message_carries_file_lines_quote_and_comment() -> None:
    rows = [r for r in diff_lines(PATCH.splitlines(), ["calc.py"]) if r is not None]
    text = review_message([(anchor_of(rows[2:3]), "add must add"),
                           (anchor_of(rows[4:5]), "why x?\nkeep it")])
    assert "2 comments" in text
    assert "1. calc.py:2\n    > +    return a - b\n    add must add" in text
    assert "2. calc.py:4\n    >  x = 1\n    why x?\n    keep it" in text


# --- the store ------------------------------------------------------------------------------


def test_store_keeps_comments_through_a_reopen(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    with Store(db) as store:
        assert store.schema_version() == SCHEMA_VERSION
        task = store.create_task(prompt="p", repo=tmp_path)
        rows = [r for r in diff_lines(PATCH.splitlines(), ["calc.py"]) if r is not None]
        reviews = Reviews(store)
        made = reviews.add(task.id, anchor_of(rows[2:3]), "first", now=5.0)
        second = reviews.add(task.id, anchor_of(rows[1:2]), "second", now=6.0)
        reviews.edit(task.id, made.id, "first, edited", now=7.0)
        reviews.mark_sent({second.id: False}, "say", 8.0)
    with Store(db) as store:
        reviews = Reviews(store)
        listed = reviews.list(task.id)
        assert [(c.body, c.sent, c.state) for c in listed] == [
            ("first, edited", False, "open"), ("second", True, CommentState.OUTDATED)]
        assert listed[0].anchor == made.anchor and listed[0].updated_at == 7.0
        reviews.delete(task.id, made.id)
        with pytest.raises(UnknownComment, match="no comment #"):
            reviews.delete(task.id, made.id)
        assert [c.id for c in reviews.list(task.id)] == [second.id]


def test_viewed_marks_are_kept_and_an_older_store_gains_their_table(tmp_path: Path) -> None:
    """The diff's viewed marks live in the store (the migration after the tasks' hosts):
    a store of the version before gets the table, its tasks kept; a mark set, changed and
    taken off reads back after a reopen."""
    db = tmp_path / "older.db"
    conn = sqlite3.connect(db, isolation_level=None)
    before = 0  # the version just before this table (later migrations come after it)
    for migrate in MIGRATIONS:
        migrate(conn)
        if "viewed_files" in {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}:
            break
        before += 1
    conn.close()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("DROP TABLE viewed_files")
    conn.execute(f"PRAGMA user_version = {before}")
    conn.execute("INSERT INTO tasks (id, prompt, repo, state, created_at, updated_at) "
                 "VALUES ('old022', 'p', '/r', 'succeeded', 1.0, 2.0)")
    assert "viewed_files" not in {r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    conn.close()
    with Store(db) as store:
        assert store.schema_version() == SCHEMA_VERSION
        marks = ViewedFiles(store)
        assert marks.of("old022") == {}
        marks.set("old022", "calc.py", "d1", now=3.0)
        marks.set("old022", "calc.py", "d2", now=4.0)  # marked again as it is now
        marks.set("old022", "gone.py", "d3")
        marks.set("old022", "gone.py", None)  # the mark taken off
        marks.set("old022", "new file.py", "d4")
    with Store(db) as store:
        assert store.get_task("old022").state == TaskState.SUCCEEDED
        assert ViewedFiles(store).of("old022") == {"calc.py": "d2", "new file.py": "d4"}
        assert ViewedFiles(store).of("other") == {}


# --- the engine, the real claude ------------------------------------------------------------


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(SCRIPTS) as ep:
        yield ep


def _fleet(endpoint: ScriptedEndpoint, claude: str) -> Fleet:
    settings = load_settings(env=os.environ, overrides={
        "base_url": endpoint.url, "claude": claude, "sandbox": os.geteuid() == 0,
        "key_sources": "env", "kill_grace": 2.0})
    env = dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0")
    return Fleet(settings, Store(paths.db_path()), env=env)


def _until_settled(fleet: Fleet, task_id: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while fleet.get_task(task_id).state not in (TaskState.SUCCEEDED, TaskState.FAILED,
                                                TaskState.KILLED):
        assert time.monotonic() < deadline, fleet.get_task(task_id)
        fleet.tick()
        time.sleep(TICK)


@pytest.mark.real_claude
def test_two_comments_go_as_one_follow_up_and_the_next_diff_says_which_was_dealt_with(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    fleet = _fleet(endpoint, claude_bin)
    (task,) = fleet.submit(TaskSpec(prompt="write calc.py", repo=git_repo))
    _until_settled(fleet, task.id)
    assert fleet.get_task(task.id).state == TaskState.SUCCEEDED

    with pytest.raises(FleetRefused, match="no comments to send"):
        fleet.send_review(task.id)
    with pytest.raises(InvalidSpec, match="empty"):
        fleet.comment_at(task.id, "calc.py", 2, 2, "  ")
    with pytest.raises(FleetRefused, match="past its end"):
        fleet.comment_at(task.id, "calc.py", 7, 9, "no such lines")
    add = fleet.comment_at(task.id, "calc.py", 2, 2, "add must add, not subtract")
    mul = fleet.comment_at(task.id, "calc.py", 5, 6, "mul: is a power meant?")
    assert add.anchor.quote == ("+    return a - b",)
    assert [c.state for c in fleet.comments(task.id)] == ["open", "open"]
    assert fleet.open_comments(task.id) == 2

    before = len(endpoint.requests)
    sent = fleet.send_review(task.id)
    assert (sent.count, sent.how) == (2, "follow-up")
    with pytest.raises(FleetRefused, match="no comments to send"):
        fleet.send_review(task.id)  # both went
    _until_settled(fleet, task.id)
    again = fleet.get_task(task.id)
    assert again.state == TaskState.SUCCEEDED, again.message
    assert again.session_id == task.session_id or task.session_id is None

    # the endpoint's next request carries both comments, each with its file:line and text
    asked = endpoint.requests[before]
    said = "\n".join([asked.prompt or "", *asked.conversation_texts])
    for where, text in (("calc.py:2", "add must add, not subtract"),
                        ("calc.py:5-6", "mul: is a power meant?")):
        assert where in said and text in said, said
    assert "> +    return a - b" in said

    # the worker rewrote add's line (and put a line above it): that comment is addressed;
    # mul's lines are untouched (one line lower now): still open
    states = {c.id: (c.state, c.where) for c in fleet.comments(task.id)}
    assert states == {add.id: (CommentState.ADDRESSED, None),
                      mul.id: (CommentState.OPEN, 7)}
    assert fleet.open_comments(task.id) == 1
    # a comment made now and its lines changed before it is sent: outdated
    late = fleet.comment_at(task.id, "calc.py", 1, 1, "drop this header")
    (Path(again.worktree or "") / "calc.py").write_text(FIXED.replace("# calc\n", ""))
    assert {c.id: c.state for c in fleet.comments(task.id)}[late.id] == "outdated"


# --- the CLI --------------------------------------------------------------------------------


def cli(env: dict[str, str], cwd: Path, *args: str,
        timeout: float = 90) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-m", "fleet_tui.cli", *args], cwd=cwd, env=env,
                         input="", capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in out.stderr, out.stderr
    return out


@pytest.mark.real_claude
def test_the_review_commands_and_a_merge_with_open_comments(
        git_repo: Path, claude_bin: str, endpoint: ScriptedEndpoint) -> None:
    env = cli_env(endpoint.url, claude_bin, KEY)
    out = cli(env, git_repo, "run", "write calc.py", "--wait", "--json")
    assert out.returncode == 0, out.stderr
    tid = json.loads(out.stdout)[0]["id"]

    empty = cli(env, git_repo, "review", tid)
    assert empty.returncode == 0 and "no review comments" in empty.stderr
    bad = cli(env, git_repo, "review", tid, "--comment", "calc.py", "text")
    assert bad.returncode == 2 and "FILE:LINE" in bad.stderr
    gone = cli(env, git_repo, "review", tid, "--comment", "nope.py:1", "text")
    assert gone.returncode == 4 and "nope.py is not in task" in gone.stderr
    one = cli(env, git_repo, "review", tid, "--comment", "calc.py:2", "add must add")
    assert one.returncode == 0, one.stderr
    assert f"{tid}: comment #" in one.stdout and "calc.py:2" in one.stdout
    two = cli(env, git_repo, "review", tid, "--json", "--comment", "calc.py:5-6", "mul?")
    second = json.loads(two.stdout)
    assert (second["where"], second["state"], second["sent"]) == ("calc.py:5-6", "open",
                                                                  False)
    edited = cli(env, git_repo, "review", tid, "--edit", str(second["id"]), "mul: power?")
    assert edited.returncode == 0 and "edited" in edited.stdout

    listed = cli(env, git_repo, "review", tid)
    assert listed.returncode == 0, listed.stderr
    assert "2 open" in listed.stdout and "mul: power?" in listed.stdout
    assert "> +    return a - b" in listed.stdout

    # a merge with open comments is refused without a terminal and without --yes
    refused = cli(env, git_repo, "merge", tid)
    assert refused.returncode == 4, refused.stderr
    assert "2 review comments are open" in refused.stderr and "--yes" in refused.stderr
    # the merge queue asks the same (queue, and pick, which queues the copy): refused,
    # nothing queued
    for command, done in (("queue", "not queued"), ("pick", "not picked")):
        out = cli(env, git_repo, command, tid)
        assert out.returncode == 4, (command, out.stderr)
        assert f"{done}: 2 review comments are open" in out.stderr, out.stderr
        assert f"fleet-tui review {tid} --send" in out.stderr and "--yes" in out.stderr
    assert "the merge queue is empty" in cli(env, git_repo, "queue").stdout

    sent = cli(env, git_repo, "review", tid, "--send")
    assert sent.returncode == 0, sent.stderr
    assert "2 comments sent as a follow-up" in sent.stdout
    deadline = time.monotonic() + 90
    pauses = poll_pauses()
    while True:
        shown = json.loads(cli(env, git_repo, "ls", "--json").stdout)
        if next(t for t in shown if t["id"] == tid)["state"] == "succeeded":
            break
        assert time.monotonic() < deadline, shown
        time.sleep(next(pauses))
    states = json.loads(cli(env, git_repo, "review", tid, "--json").stdout)
    assert [(c["where"], c["state"], c["sent"]) for c in states] == [
        ("calc.py:2", "addressed", True), ("calc.py:5-6", "open", True)]
    deleted = cli(env, git_repo, "review", tid, "--delete", str(second["id"]))
    assert deleted.returncode == 0 and "deleted" in deleted.stdout
    merged = cli(env, git_repo, "merge", tid, "--yes")  # nothing open now
    assert merged.returncode == 0, merged.stderr
    kept = json.loads(cli(env, git_repo, "review", tid, "--json").stdout)
    assert [c["state"] for c in kept] == ["addressed"]  # its last known state, kept
