"""The two panes that own their work, each on its own in a small app: the stream pane (the
follower, the caption and the view flags) and the diff pane (one `git diff` at a time,
nothing while hidden, what arrives before its view).

No claude here: real recordings of claude's stream written into real attempt folders, a
real store, real git worktrees, the real engine's `diff`.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_ui_support import wait_until
from textual.app import App, ComposeResult
from textual.widget import Widget

from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Task, TaskSpec, TaskState
from fleet_tui.ui.widgets.diff_pane import DiffPane
from fleet_tui.ui.widgets.stream_pane import TAIL_BYTES, StreamPane
from fleet_tui.vcs import git as gitmod

FIXTURES = Path(__file__).resolve().parents[1] / "support" / "fixtures" / "stream-json"
SIZE = (120, 30)


class Host(App[None]):
    """One pane, full screen (the panel's own layout rules, for the pane alone)."""

    CSS = """
    StreamPane, DiffPane { height: 1fr; }
    #stream-caption { height: 1; }
    #stream, #diff { height: 1fr; }
    """

    def __init__(self, pane: Widget) -> None:
        super().__init__()
        self.pane = pane

    def compose(self) -> ComposeResult:
        yield self.pane


@pytest.fixture
def fleet(git_repo: Path) -> Fleet:
    return Fleet(load_settings())


def recording(name: str) -> list[bytes]:
    return (FIXTURES / name / "stdout.jsonl").read_bytes().splitlines(keepends=True)


def with_attempt(fleet: Fleet, repo: Path, folder: Path, data: bytes, *,
                 state: TaskState = TaskState.RUNNING, finished: bool = False) -> Task:
    """A task with one attempt whose events file holds ``data``."""
    task = fleet.submit(TaskSpec(prompt="stream it", repo=repo))[0]
    return add_attempt(fleet, task, folder, data, state=state, finished=finished)


def add_attempt(fleet: Fleet, task: Task, folder: Path, data: bytes, *,
                state: TaskState = TaskState.RUNNING, finished: bool = False) -> Task:
    folder.mkdir(parents=True)
    (folder / "events.jsonl").write_bytes(data)
    now = time.time()
    fleet.store.add_attempt(task.id, now=now, dir=folder, events_path=folder / "events.jsonl",
                            finished_at=now if finished else None)
    fleet.store.update_task(task.id, state=state, started_at=now,
                            finished_at=now if finished else None)
    return fleet.get_task(task.id)


def plain(pane: StreamPane) -> list[str]:
    return pane.view.plain_lines()


async def test_stream_pane_follows_a_running_attempt_and_its_flags(
        fleet: Fleet, git_repo: Path, tmp_path: Path) -> None:
    lines = recording("root_529_then_ok")
    # running: six whole lines and half of the seventh (claude is writing it)
    first, partial = b"".join(lines[:6]), lines[6][:20]
    folder = tmp_path / "logs" / "1"
    task = with_attempt(fleet, git_repo, folder, first + partial)
    pane = StreamPane(interval=0.05)
    async with Host(pane).run_test(size=SIZE) as pilot:
        pane.fleet = fleet
        pane.show(task)
        await wait_until(pilot, lambda: "attempt 1/1 (fresh)" in pane.caption
                         and "Write hello.txt" in "\n".join(plain(pane)), what="the tail")
        assert "following · everything" in pane.caption
        assert not any(line.startswith("$ Bash ls") for line in plain(pane))
        # raw lines: the six whole lines, not the half-written one
        pane.raw = True
        await wait_until(pilot, lambda: "JSON lines" in pane.caption
                         and pane.view.total_rows == 6, what="raw lines")
        await pilot.pause(0.2)
        assert pane.view.total_rows == 6
        pane.raw = False
        await wait_until(pilot, lambda: "Write hello.txt" in "\n".join(plain(pane)),
                         what="readable again")
        # the worker writes on: the rest of the line and more arrive while following
        with open(folder / "events.jsonl", "ab") as fh:
            fh.write(lines[6][20:] + b"".join(lines[7:9]))
        await wait_until(pilot, lambda: any(line.startswith("$ Bash ls")
                                            for line in plain(pane)), what="the new rows")
        assert pane.view.follow and pane.follow
        # tools only: bound down to the view, said in the caption
        pane.tools_only = True
        await pilot.pause()
        assert pane.view.tools_only and "tool calls only" in pane.caption
        assert not any(line.startswith("▌") for line in plain(pane))
        pane.tools_only = False
        await pilot.pause()
        # scrolling up stops following (the view says so, the pane and caption follow)
        pane.view.focus()
        await pilot.press("up")
        await wait_until(pilot, lambda: not pane.follow, what="paused")
        assert "paused (end: follow)" in pane.caption
        pane.follow = True
        await pilot.pause()
        assert pane.view.follow and "following" in pane.caption
        # it ends: the last line without its newline belongs to the stream now
        with open(folder / "events.jsonl", "ab") as fh:
            fh.write(lines[9].rstrip(b"\n"))
        attempt = fleet.attempts(task.id)[-1]
        fleet.store.update_attempt(attempt.id, finished_at=time.time(), verdict="ok")
        await wait_until(pilot, lambda: any(line.startswith("■ done in 3 turns")
                                            for line in plain(pane)), what="the end")


async def test_stream_pane_reads_older_history_when_asked(
        fleet: Fleet, git_repo: Path, tmp_path: Path) -> None:
    one_run = b"".join(recording("root_529_then_ok"))
    repeats = 3 * TAIL_BYTES // len(one_run) + 1
    task = with_attempt(fleet, git_repo, tmp_path / "logs" / "1", one_run * repeats,
                        state=TaskState.SUCCEEDED, finished=True)
    pane = StreamPane(interval=0.05)
    async with Host(pane).run_test(size=SIZE) as pilot:
        pane.fleet = fleet
        pane.show(task)
        await wait_until(pilot, lambda: pane.view.has_older and pane.view.row_count() > 0,
                         what="the tail")
        tail = pane.view.total_rows
        assert plain(pane)[-1].startswith("■ done")
        pane.view.focus()
        await pilot.press("home")
        await wait_until(pilot, lambda: not pane.view.has_older, what="everything")
        assert pane.view.total_rows > tail
        assert sum(line.startswith("● session started") for line in plain(pane)) == repeats


async def test_stream_pane_shows_the_chosen_attempt(
        fleet: Fleet, git_repo: Path, tmp_path: Path) -> None:
    task = with_attempt(fleet, git_repo, tmp_path / "logs" / "1",
                        b"".join(recording("root_529_retries2")), state=TaskState.FAILED,
                        finished=True)
    task = add_attempt(fleet, task, tmp_path / "logs" / "2",
                       b"".join(recording("root_529_then_ok")), state=TaskState.SUCCEEDED,
                       finished=True)
    pane = StreamPane(interval=0.05)
    async with Host(pane).run_test(size=SIZE) as pilot:
        pane.fleet = fleet
        pane.show(task)
        await wait_until(pilot, lambda: "attempt 2/2" in pane.caption
                         and "done in 3 turns" in "\n".join(plain(pane)), what="the newest")
        pane.choose_attempt(task.id, 1, latest=2)
        await wait_until(pilot, lambda: "attempt 1/2" in pane.caption
                         and "HTTP 529" in "\n".join(plain(pane)), what="the first")
        pane.show(task)  # a fresh read of the same task keeps the choice
        await pilot.pause(0.2)
        assert "attempt 1/2" in pane.caption
        pane.choose_attempt(task.id, 2, latest=2)
        await wait_until(pilot, lambda: "attempt 2/2" in pane.caption, what="the newest")
        pane.show(None)
        await wait_until(pilot, lambda: "No task selected." in pane.caption, what="nothing")
        assert plain(pane) == []


async def test_stream_pane_reads_an_attempt_whose_folder_is_recorded_late(
        fleet: Fleet, git_repo: Path, tmp_path: Path) -> None:
    """An attempt is in the store a moment before its folder (the starter records it once
    it holds the folder's lock): the pane starts following it, and reads the file when
    the folder is there. (A quick follow-up showed its caption and no rows.)"""
    task = fleet.submit(TaskSpec(prompt="stream it", repo=git_repo))[0]
    attempt = fleet.store.add_attempt(task.id, now=time.time())
    fleet.store.update_task(task.id, state=TaskState.RUNNING, started_at=time.time())
    pane = StreamPane(interval=0.05)
    async with Host(pane).run_test(size=SIZE) as pilot:
        pane.fleet = fleet
        pane.show(fleet.get_task(task.id))
        await wait_until(pilot, lambda: "attempt 1/1 (fresh)" in pane.caption,
                         what="the attempt")
        await pilot.pause(0.3)
        folder = tmp_path / "logs" / "1"
        folder.mkdir(parents=True)
        (folder / "events.jsonl").write_bytes(b"".join(recording("root_529_then_ok")))
        fleet.store.update_attempt(attempt.id, dir=folder,
                                   events_path=folder / "events.jsonl")
        await wait_until(pilot, lambda: "Write hello.txt" in "\n".join(plain(pane)),
                         what="its events")


# --- the diff pane ------------------------------------------------------------------------


def with_worktree(fleet: Fleet, repo: Path, name: str, *,
                  state: TaskState = TaskState.SUCCEEDED) -> Task:
    """A task whose worktree has one new file, ``name``."""
    task = fleet.submit(TaskSpec(prompt=f"write {name}", repo=repo))[0]
    info = gitmod.create_worktree(repo, task.id, task.base_commit)
    (info.path / name).write_text(f"{name}\n")
    fleet.store.update_task(task.id, state=state, worktree=info.path, branch=info.branch,
                            started_at=time.time())
    return fleet.get_task(task.id)


class SpyDiff:
    """Stand-in around Fleet.diff: records the calls and how many ran at once, and takes
    ``delay`` longer (a slow `git diff` on a big worktree), then runs the real diff."""

    def __init__(self, fleet: Fleet, delay: float = 0.0) -> None:
        self.real = fleet.diff
        self.delay = delay
        self.calls: list[str] = []
        self.running = 0
        self.most = 0
        self._lock = threading.Lock()

    def __call__(self, task_id: str) -> Any:
        with self._lock:
            self.calls.append(task_id)
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(self.delay)
            return self.real(task_id)
        finally:
            with self._lock:
                self.running -= 1


def files_shown(pane: DiffPane) -> list[str]:
    view = pane.view
    if view is None or view.prepared is None:
        return []
    return [f.path for f in view.prepared.diff.files]


async def test_diff_pane_computes_nothing_while_hidden_and_one_diff_at_a_time(
        fleet: Fleet, git_repo: Path) -> None:
    a, b, c = (with_worktree(fleet, git_repo, f"{n}.txt") for n in "abc")
    spy = SpyDiff(fleet, delay=0.3)
    fleet.diff = spy  # type: ignore[method-assign]
    pane = DiffPane(interval=60)
    async with Host(pane).run_test(size=SIZE) as pilot:
        await pane.mount_view()
        pane.start(fleet)
        pane.show(a, new=True)
        await pilot.pause(0.3)
        assert spy.calls == []  # hidden: no git diff for nobody to see
        pane.set_shown(True)
        await wait_until(pilot, lambda: files_shown(pane) == ["a.txt"], what="a's diff")
        # a key held down over the list: b, then c while b's diff runs
        pane.show(b, new=True)
        await wait_until(pilot, lambda: spy.calls[-1:] == [b.id], what="b's diff to start")
        pane.show(c, new=True)
        await wait_until(pilot, lambda: files_shown(pane) == ["c.txt"], what="c's diff")
        await pilot.pause(0.4)
        assert spy.most == 1 and spy.calls == [a.id, b.id, c.id]


async def test_a_diff_still_reading_its_comments_lets_no_two_diffs_run_at_once(
        fleet: Fleet, git_repo: Path) -> None:
    """The diff's worker goes on after the diff (the review comments' states, read against
    it). The next selection's diff cancelled that worker as it started, and the cancel
    cleared the pane's "a diff runs" mark: a third selection then ran its git diff beside
    the second's (seen in a whole-suite run, 2 at once, when the comments read was slow)."""
    a, b, c = (with_worktree(fleet, git_repo, f"{n}.txt") for n in "abc")
    spy = SpyDiff(fleet, delay=0.3)
    fleet.diff = spy  # type: ignore[method-assign]
    read_comments = fleet.comments

    def slow_comments(task_id: str, **kwargs: Any) -> Any:
        if task_id == a.id:
            time.sleep(1.0)  # a's worker still runs when b's diff starts
        return read_comments(task_id, **kwargs)

    fleet.comments = slow_comments  # type: ignore[method-assign]
    pane = DiffPane(interval=60)
    async with Host(pane).run_test(size=SIZE) as pilot:
        await pane.mount_view()
        pane.start(fleet)
        pane.set_shown(True)
        pane.show(a, new=True)
        await wait_until(pilot, lambda: files_shown(pane) == ["a.txt"], what="a's diff")
        pane.show(b, new=True)
        await wait_until(pilot, lambda: spy.calls[-1:] == [b.id], what="b's diff to start")
        pane.show(c, new=True)
        await wait_until(pilot, lambda: files_shown(pane) == ["c.txt"], what="c's diff")
        assert spy.most == 1 and spy.calls == [a.id, b.id, c.id]


async def test_diff_pane_keeps_what_arrives_before_its_view(
        fleet: Fleet, git_repo: Path) -> None:
    task = with_worktree(fleet, git_repo, "early.txt")
    spy = SpyDiff(fleet)
    fleet.diff = spy  # type: ignore[method-assign]
    pane = DiffPane(interval=60)
    async with Host(pane).run_test(size=SIZE) as pilot:
        pane.start(fleet)
        pane.set_shown(True)
        pane.show(task, new=True)
        await wait_until(pilot, lambda: spy.calls == [task.id] and spy.running == 0,
                         what="the diff computed")
        await pilot.pause(0.1)
        assert pane.view is None
        await pane.mount_view()
        assert files_shown(pane) == ["early.txt"]


async def test_diff_pane_says_why_there_is_no_diff_and_follows_a_running_task(
        fleet: Fleet, git_repo: Path) -> None:
    spy = SpyDiff(fleet)
    fleet.diff = spy  # type: ignore[method-assign]
    queued = fleet.submit(TaskSpec(prompt="later", repo=git_repo))[0]
    merged = with_worktree(fleet, git_repo, "m.txt", state=TaskState.MERGED)
    running = with_worktree(fleet, git_repo, "r.txt", state=TaskState.RUNNING)
    pane = DiffPane(interval=0.1)
    async with Host(pane).run_test(size=SIZE) as pilot:
        await pane.mount_view()
        pane.start(fleet)
        pane.set_shown(True)
        view = pane.view
        assert view is not None

        def said() -> str:
            return " ".join(view.query_one("DiffLines").lines  # type: ignore[attr-defined]
                            ) or str(view.query_one("DiffLines").get_row(0))

        pane.show(queued, new=True)
        await pilot.pause()
        assert "No worktree yet" in said()
        pane.show(merged, new=True)
        await pilot.pause()
        assert "Merged: the worktree is gone; the change is on main." in said()
        assert spy.calls == []
        pane.show(running, new=True)
        await wait_until(pilot, lambda: files_shown(pane) == ["r.txt"], what="its diff")
        assert running.worktree is not None
        (running.worktree / "later.txt").write_text("written while it runs\n")
        await wait_until(pilot, lambda: "later.txt" in files_shown(pane),
                         what="the timed refresh")


async def test_the_caption_says_a_request_waits_for_a_slot(
        fleet: Fleet, git_repo: Path, tmp_path: Path) -> None:
    """The gateway's line: while the selected task's requests wait for a
    request slot, its stream's caption says so; once they are through, it no longer does."""
    lines = recording("root_529_then_ok")
    task = with_attempt(fleet, git_repo, tmp_path / "logs" / "1", b"".join(lines[:6]))
    pane = StreamPane(interval=0.05)
    async with Host(pane).run_test(size=SIZE) as pilot:
        pane.fleet = fleet
        pane.show(task)
        await wait_until(pilot, lambda: "attempt 1/1 (fresh)" in pane.caption,
                         what="the caption")
        assert "waiting for a request slot" not in pane.caption
        pane.show_slot_waits(1)
        assert "attempt 1/1 (fresh) · waiting for a request slot" in pane.caption
        pane.show_slot_waits(0)
        assert "waiting for a request slot" not in pane.caption
