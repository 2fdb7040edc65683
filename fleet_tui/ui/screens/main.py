"""The main screen: task list on top, the selected task's stream and diff below.

The screen renders state and sends intents. Every engine call, git call and file read runs
in a thread worker; results come back as messages (ui/messages.py). Failures of any worker
become one error toast in FleetApp.on_worker_state_changed.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Input, Label
from textual.worker import Worker, WorkerState, get_current_worker

from fleet_tui.store import (
    ACTIVE_STATES,
    CLOSED_STATES,
    FINISHED_STATES,
    Attempt,
    Task,
    TaskState,
)
from fleet_tui.ui.formatting import StreamFormatter, StreamRow, raw_rows
from fleet_tui.ui.messages import (
    ActionDone,
    DiffLoaded,
    PollFailed,
    StreamBatch,
    StreamOlder,
    TasksLoaded,
    TasksSubmitted,
)
from fleet_tui.ui.screens.help import HelpScreen, HelpSection
from fleet_tui.ui.widgets.bars import KeyBar, TabBar
from fleet_tui.ui.widgets.diff_view import DiffView, PreparedDiff
from fleet_tui.ui.widgets.status_line import StatusLine
from fleet_tui.ui.widgets.stream_view import MAX_ROWS, StreamView
from fleet_tui.ui.widgets.task_table import TaskTable, sort_tasks

if TYPE_CHECKING:
    from fleet_tui.fleet import Fleet, FleetStatus
    from fleet_tui.ui.app import FleetApp
    from fleet_tui.ui.screens.launch import LaunchRequest
    from fleet_tui.ui.screens.modals import MergeAnswer, MergeItem

READ_CHUNK = 4 * 1024 * 1024  # bytes of events per batch; bigger backlogs take several
TAIL_BYTES = 128 * 1024  # a newly selected attempt shows its last events first ...
OLDER_CHUNK = 1024 * 1024  # ... and reads older ones, a chunk at a time, on scrolling up
STREAM_SETTLE = 0.08  # seconds a selection must stay before its events file is read
KILLABLE = frozenset({TaskState.RUNNING, TaskState.STALLED, TaskState.QUEUED,
                      TaskState.WAITING})
ALERT_STATES = {
    TaskState.SUCCEEDED: ("finished", "information"),
    TaskState.FAILED: ("failed", "error"),
    TaskState.STALLED: ("stalled", "warning"),
}


class MainScreen(Screen[None]):
    """Task list, status line, stream | diff tabs, footer."""

    BINDINGS = [
        Binding("n", "new_task", "New", id="task.new"),
        Binding("question_mark", "help", "Help", id="app.help"),
        Binding("m", "merge", "Merge", id="task.merge"),
        Binding("d", "discard", "Discard", id="task.discard"),
        Binding("r", "retry", "Retry", id="task.retry"),
        Binding("f", "follow_up", "Follow-up", id="task.follow_up"),
        Binding("k", "kill", "Kill", id="task.kill"),
        Binding("space", "toggle_mark", "Mark", id="task.mark"),
        Binding("ctrl+a", "mark_all", "Mark all", id="task.mark_all"),
        # escape clears the filter first (while there is one), then the marks; ctrl+\ as
        # in k9s
        Binding("escape", "clear_filter", "Clear filter", show=False, id="list.clear"),
        Binding("escape,ctrl+backslash", "unmark_all", "Unmark all", key_display="esc",
                id="task.unmark_all"),
        Binding("o", "shell", "Shell", id="task.shell"),
        Binding("e", "edit", "Edit", id="task.edit"),
        Binding("slash", "filter", "Filter", id="list.filter"),
        Binding("1", "show_tab('tab-stream')", "Stream", show=False, id="view.stream"),
        Binding("2", "show_tab('tab-diff')", "Diff", show=False, id="view.diff"),
        Binding("t", "toggle_tools", "Tools only", show=False, id="stream.tools_only"),
        Binding("J", "toggle_raw", "Raw JSON", show=False, id="stream.raw"),
        Binding("a", "choose_attempt", "Attempt", show=False, id="stream.attempt"),
        Binding("F", "toggle_follow", "Follow", show=False, id="stream.follow"),
        Binding("q", "quit", "Quit", id="app.quit"),
    ]

    HELP_EXTRA: list[HelpSection] = [
        ("Lists and views", [
            ("↑ ↓ / pgup pgdn", "move in the task list, scroll the stream or the diff"),
            ("tab / shift+tab", "move focus: task list, tabs, file list, diff"),
            ("home / end", "stream: jump to the start / the end (end resumes following)"),
            ("enter", "filter: apply and go back to the list"),
        ]),
        ("In dialogs", [
            ("y / n / escape", "confirm, refuse, cancel"),
            ("ctrl+s", "submit the launch form, a follow-up or a merge"),
            ("f / r", "retry: a fresh run or resume the session"),
            ("ctrl+p", "command palette: every action by name"),
        ]),
    ]

    def __init__(self) -> None:
        super().__init__(id="main")
        self.tasks: dict[str, Task] = {}
        self.marked: set[str] = set()
        self.filter_text = ""
        self.selected_id: str | None = None
        self.status: FleetStatus | None = None
        self.raw = False
        self.attempt_choice: dict[str, int] = {}
        self._stream_gen = 0
        self._stream_task: tuple[str, int] | None = None  # (task id, attempt_count)
        self._stream_attempt: Attempt | None = None
        self._stream_attempts = 0
        self._stream_older = 0  # bytes of the attempt's events not read yet (before the tail)
        self._older_loading = False
        self._diff_loading = False
        self._diff_wanted: str | None = None
        # (task id, state, attempt_count) the diff was last asked for: a change of state
        # (a worker finishing right after the last timed refresh) loads it again
        self._diff_key: tuple[str, TaskState, int] | None = None
        self._diff_when_shown: str | None = None  # a diff asked for while its tab was hidden
        self._select_pending = False
        self._poll_lock = threading.Lock()
        self.poll_error: str | None = None  # why the task list could not be read, if so
        self._polled = False  # a task list was read once
        self._notice_shown: str | None = None
        self._seen_states: dict[str, TaskState] | None = None
        self._cooldown_seen: float | None = None
        self._bindings_signature: object = None
        self._actions: list[tuple[str, tuple[object, ...]]] | None = None
        self._title_shown = ""
        self._keep_row: int | None = None
        self._diff_pending = "Select a task to see its changes."
        self._diff_pending_loaded: DiffLoaded | None = None
        self._diff: DiffView | None = None
        self._hidden_started = False
        self._hidden_done = asyncio.Event()

    # --- helpers -------------------------------------------------------------------------
    @property
    def fleet_app(self) -> FleetApp:
        from fleet_tui.ui.app import FleetApp

        app = self.app
        assert isinstance(app, FleetApp)
        return app

    @property
    def fleet(self) -> Fleet:
        return self.fleet_app.fleet

    def now(self) -> float:
        return self.fleet_app.clock()

    @property
    def selected(self) -> Task | None:
        return self.tasks.get(self.selected_id) if self.selected_id else None

    @property
    def cursor_task(self) -> Task | None:
        """The task on the cursor row: what a key press acts on. ``selected`` (the task the
        detail pane shows) follows it a frame later, so keys must not act on that."""
        key = self.query_one(TaskTable).selected_key
        return self.tasks.get(key) if key is not None else None

    def targets(self) -> list[Task]:
        """The marked tasks (in list order) when any are marked, else the cursor's task."""
        if self.marked:
            order = self.query_one(TaskTable).keys
            listed = [self.tasks[t] for t in order if t in self.marked and t in self.tasks]
            hidden = sorted(t for t in self.marked if t in self.tasks and t not in order)
            return listed + [self.tasks[t] for t in hidden]
        task = self.cursor_task
        return [task] if task is not None else []

    # --- layout --------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        with Vertical(id="list-pane"):
            yield TaskTable(id="tasks")
            notice = Label("", id="list-notice", markup=False)
            notice.display = False  # until the first poll says what to show
            yield notice
        with Vertical(id="detail-pane"):
            yield Label("", id="detail-title", markup=False)
            yield TabBar([("tab-stream", "Stream"), ("tab-diff", "Diff")], "tab-stream",
                         id="tabs")
            with ContentSwitcher(id="views", initial="tab-stream"):
                with Vertical(id="tab-stream"):
                    yield Label("", id="stream-caption", markup=False)
                    yield StreamView(id="stream")
                yield Vertical(id="tab-diff")  # its DiffView: see mount_hidden
        yield KeyBar(id="keys")

    async def mount_hidden(self) -> None:
        """Mount what the first frame does not show: the filter box (hidden until `/`) and
        the diff view (behind the stream tab). Their CSS and composing cost the first frame
        tens of milliseconds. They are mounted 50 ms after it (FleetApp.on_ready) or before
        the first task list is shown, whichever comes first."""
        if self._hidden_started:
            await self._hidden_done.wait()
            return
        self._hidden_started = True
        try:
            await self._mount_hidden()
        finally:
            self._hidden_done.set()

    async def _mount_hidden(self) -> None:
        box = Input(id="filter", placeholder="filter: text in id, title, state, model, "
                    "tool (enter: keep, escape: clear)")
        box.display = False
        diff = DiffView(id="diff")
        await self.query_one("#list-pane").mount(box, before=0)
        await self.query_one("#tab-diff").mount(diff)
        if not diff.composed or self.fleet_app.quitting:
            return  # the panel is closing: it never got its children
        self._diff = diff
        diff.show_message(self._diff_pending)
        self._maybe_refresh_bindings()
        loaded, self._diff_pending_loaded = self._diff_pending_loaded, None
        if loaded is not None and loaded.task_id == self.selected_id:
            self._show_loaded(diff, loaded)

    def _diff_view(self) -> DiffView | None:
        """The diff view, or None until it is mounted (with its children)."""
        return self._diff

    def _show_diff_message(self, text: str) -> None:
        view = self._diff_view()
        if view is None:
            self._diff_pending = text
        else:
            view.show_message(text)

    def _filter_box(self) -> Input | None:
        found = self.query("#filter").results(Input)
        return next(found, None)

    def on_mount(self) -> None:
        status = self.query_one(StatusLine)
        status.scheduler = self.fleet_app.run_scheduler
        self._show_status()
        self.query_one(TaskTable).focus()
        app = self.fleet_app
        self.set_interval(app.poll_interval, self.poll)
        self.set_interval(app.diff_interval, self._diff_tick)
        self.set_interval(1.0, self._second_tick)
        self.poll()

    def _show_status(self) -> None:
        """The header; the repository is read each time, since the panel may learn it
        after the first frame (it is looked up while the engine starts)."""
        status = self.query_one(StatusLine)
        repo = self.fleet_app.repo
        status.repo_name = repo.name if repo else ""
        status.marked = len(self.marked)
        status.show(self.status, self.now())

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """StateChanged does not bubble: hand it to the app's one failure handler."""
        if event.worker.group == "diff" and event.state in (WorkerState.ERROR,
                                                           WorkerState.CANCELLED):
            self._diff_failed()
        self.fleet_app.on_worker_state_changed(event)

    # --- polling the store ---------------------------------------------------------------
    def poll(self) -> None:
        if self._poll_lock.acquire(blocking=False):
            self._load_tasks()

    @work(thread=True, exit_on_error=False, group="poll", description="reading the task list")
    def _load_tasks(self) -> None:
        from fleet_tui.ui.app import EngineNotStarted

        try:
            fleet = self.fleet
            try:
                tasks = fleet.list_tasks()
                status = fleet.status(tasks)
            except Exception as exc:  # whatever the store raises: said, and polled again
                self.post_message(PollFailed(poll_problem(fleet, exc)))
                return
            self.post_message(TasksLoaded(tasks, status, time.monotonic()))
        except EngineNotStarted:
            return  # the engine's own failure is reported (and ends the panel)
        finally:
            self._poll_lock.release()

    def on_poll_failed(self, message: PollFailed) -> None:
        """The list cannot be read: say why where the list is, keep what was read last
        (never an empty list that claims there are no tasks); the next poll tries again."""
        self.poll_error = message.problem + (
            "; showing the last list read and trying again." if self._polled
            else "; trying again.")
        self._show_notice()

    def _show_notice(self) -> None:
        notice = self.query_one("#list-notice", Label)
        if self.poll_error is not None:
            text = self.poll_error
        elif not self.tasks:
            text = "No tasks yet: press n to launch one."
        else:
            text = ""
        if text != self._notice_shown:
            self._notice_shown = text
            notice.update(text)
        notice.set_class(self.poll_error is not None, "-error")
        notice.display = bool(text)

    async def on_tasks_loaded(self, message: TasksLoaded) -> None:
        await self.mount_hidden()
        self.poll_error = None
        self._polled = True
        self.tasks = {t.id: t for t in message.tasks}
        self.status = message.status
        self.marked &= set(self.tasks)
        self._alert_transitions(message.tasks, message.status)
        self._render_tasks()

    def _alert_transitions(self, tasks: list[Task], status: FleetStatus) -> None:
        """Toast and bell when a task finishes, fails or stalls, or a cooldown starts."""
        states = {t.id: t.state for t in tasks}
        if self._seen_states is not None:
            for task in tasks:
                old = self._seen_states.get(task.id)
                if old == task.state or task.state not in ALERT_STATES:
                    continue
                word, severity = ALERT_STATES[task.state]
                detail = f"\n{task.message}" if task.message else ""
                self.notify(f"{task.short_title}{detail}", title=f"{task.id} {word}",
                            severity=severity,  # type: ignore[arg-type]
                            timeout=8)
                self.fleet_app.ring()
            cooldown = status.cooldown_until
            if cooldown is not None and cooldown > self.now() and cooldown != self._cooldown_seen \
                    and self._cooldown_seen is None:
                self.notify(f"The endpoint asked us to slow down; new attempts wait "
                            f"{int(cooldown - self.now())} s.", title="Endpoint cooldown",
                            severity="warning", timeout=8)
                self.fleet_app.ring()
        self._cooldown_seen = status.cooldown_until if (
            status.cooldown_until is not None and status.cooldown_until > self.now()) else None
        self._seen_states = states

    def _visible_tasks(self) -> list[Task]:
        tasks = sort_tasks(self.tasks.values())
        needle = self.filter_text.lower().strip()
        if not needle:
            return tasks
        return [t for t in tasks if needle in " ".join(
            (t.id, t.short_title, str(t.state), t.model, t.last_tool or "")).lower()]

    def _render_tasks(self) -> None:
        table = self.query_one(TaskTable)
        visible = self._visible_tasks()
        table.show(visible, self.marked, self.now())
        if self._keep_row is not None and self.selected is not None \
                and self.selected.state in CLOSED_STATES and visible:
            row = min(self._keep_row, len(visible) - 1)
            self._keep_row = None
            table.move_cursor(row=row, animate=False, scroll=True)
            self._select(visible[row].id)
        self._show_notice()
        self._show_status()
        if self.selected_id is None or self.selected_id not in {t.id for t in visible}:
            key = table.selected_key
            if key is not None:
                self._select(key)
            elif not visible and self.selected_id is not None:
                self._select(None)
        else:
            self._refresh_selected()
        self._maybe_refresh_bindings()

    def _maybe_refresh_bindings(self) -> None:
        """Refresh the footer only when the set of applicable actions changed: Textual
        rebuilds the whole footer on refresh_bindings(), which costs more than a poll
        or a cursor move."""
        signature = tuple(self.check_action(name, params)
                          for name, params in self._binding_actions())
        if signature != self._bindings_signature:
            self._bindings_signature = signature
            self.refresh_bindings()

    def _binding_actions(self) -> list[tuple[str, tuple[object, ...]]]:
        if self._actions is None:
            self._actions = []
            for binding in self.BINDINGS:
                assert isinstance(binding, Binding)
                name, _, args = binding.action.partition("(")
                params = (args.rstrip(")").strip("'\""),) if args else ()
                self._actions.append((name, params))
        return self._actions

    def _second_tick(self) -> None:
        self._show_status()

    # --- selection -----------------------------------------------------------------------
    @on(TaskTable.RowHighlighted, "#tasks")
    def _row_highlighted(self, event: TaskTable.RowHighlighted) -> None:
        if event.key != self.selected_id and not self._select_pending:
            # Paint the moved cursor first, then switch the views below to the task: a
            # key held down gets one frame per press and one switch per frame.
            self._select_pending = True
            self.call_after_refresh(self._select_highlighted)

    def _select_highlighted(self) -> None:
        self._select_pending = False
        key = self.query_one(TaskTable).selected_key
        if key != self.selected_id:
            self._select(key)

    def _select(self, task_id: str | None) -> None:
        self.selected_id = task_id
        self._stream_task = None
        self._refresh_selected(new=True)
        self._maybe_refresh_bindings()

    def _refresh_selected(self, *, new: bool = False) -> None:
        """Update the detail title; restart the stream when the attempt changed."""
        task = self.selected
        title = self.query_one("#detail-title", Label)
        if task is None:
            title.update("")
            self._title_shown = ""
            self._diff_key = None
            if new:
                self._stream_gen += 1
                self.query_one(StreamView).clear_rows()
                self._caption()
                self._show_diff_message("Select a task to see its changes.")
            return
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(f"{task.id} ", style="bold")
        text.append(task.short_title)
        text.append(f"  ·  {task.state}")
        if task.branch:
            text.append(f"  ·  {task.branch}")
            if task.base_branch:
                text.append(f" → {task.base_branch}")
        if task.message and task.state not in (TaskState.RUNNING, TaskState.QUEUED):
            text.append(f"  ·  {task.message.splitlines()[0] if task.message else ''}")
        if text.plain != self._title_shown:
            self._title_shown = text.plain
            title.update(text)
        key = (task.id, task.attempt_count)
        if key != self._stream_task:
            self._stream_task = key
            self._restart_stream()
        diff_key = (task.id, task.state, task.attempt_count)
        if new or diff_key != self._diff_key:
            self._diff_key = diff_key
            self._load_diff_now(task.id, first=new)

    # --- stream --------------------------------------------------------------------------
    def _restart_stream(self) -> None:
        task = self.selected
        self._stream_gen += 1
        view = self.query_one(StreamView)
        view.clear_rows()
        self._stream_attempt = None
        self._stream_attempts = 0
        self._stream_older = 0
        self._older_loading = False
        view.has_older = False
        self._caption()
        if task is None:
            return
        self._follow_stream(self._stream_gen, task.id, self.attempt_choice.get(task.id),
                            self.raw)

    @work(thread=True, exclusive=True, exit_on_error=False, group="stream",
          description="reading the attempt's events")
    def _follow_stream(self, generation: int, task_id: str, attempt_no: int | None,
                       raw: bool) -> None:
        """Read the end of one attempt's events file and keep following it while it runs;
        older history is read when the view scrolls up to it (``_load_older``). One
        message per batch, so a fast stream costs few messages."""
        worker = get_current_worker()
        worker_sleep(worker, STREAM_SETTLE)  # a key held down has moved on: read nothing
        if worker.is_cancelled:
            return
        task = self.fleet.get_task(task_id)
        cwd = str(task.worktree) if task.worktree else None
        formatter = StreamFormatter(cwd=cwd)
        attempt: Attempt | None = None
        announce: tuple[Attempt, int, int] | None = None
        offset = 0
        last_check = 0.0
        interval = self.fleet_app.stream_interval
        while not worker.is_cancelled:
            if attempt is None or time.monotonic() - last_check > 1.0:
                last_check = time.monotonic()
                attempts = self.fleet.attempts(task_id)
                chosen = [a for a in attempts if a.n == attempt_no] if attempt_no else []
                current = chosen[0] if chosen else (attempts[-1] if attempts else None)
                if current is None:
                    task = self.fleet.get_task(task_id)
                    if task.state not in (TaskState.QUEUED, TaskState.WAITING):
                        return
                    worker_sleep(worker, 0.5)
                    continue
                if attempt is None or current.n != attempt.n:
                    offset = tail_start(events_path(current), TAIL_BYTES)
                    formatter = StreamFormatter(cwd=cwd)
                    # said with the tail's rows, so the view knows what it holds at once
                    announce = (current, len(attempts), offset)
                attempt = current
            if raw:
                lines, offset, more = read_raw_lines(events_path(attempt), offset, READ_CHUNK)
                rows = raw_rows(lines)
            else:
                before = offset
                events, offset = self.fleet.read_events(attempt, offset, READ_CHUNK)
                more = offset - before >= READ_CHUNK // 2
                rows = formatter.rows(events)
            if announce is not None:
                self.post_message(StreamBatch(generation, rows, announce[0], announce[1],
                                              older=announce[2]))
                announce = None
            elif rows:
                self.post_message(StreamBatch(generation, rows))
            if more:
                time.sleep(0.001)  # between big batches, let the event loop have the GIL
                continue
            if attempt.finished_at is not None and time.monotonic() - last_check < 1.0 \
                    and not rows:
                # Finished and read to the end: one last look after the check above.
                return
            worker_sleep(worker, interval)

    @work(thread=True, exclusive=True, exit_on_error=False, group="stream-older",
          description="reading older events")
    def _load_older(self, generation: int, attempt: Attempt, end: int, everything: bool,
                    raw: bool, cwd: str | None) -> None:
        """Rows of the attempt's events from before ``end`` (a line start): the previous
        chunk, or everything (``home``), posted as one StreamOlder."""
        path = events_path(attempt)
        start = 0 if everything else tail_start(path, OLDER_CHUNK, end=end)
        formatter = StreamFormatter(cwd=cwd)
        rows: list[StreamRow] = []
        offset = start
        worker = get_current_worker()
        while offset < end and not worker.is_cancelled:
            want = min(READ_CHUNK, end - offset)
            if raw:
                lines, new, _ = read_raw_lines(path, offset, want)
                rows += raw_rows(lines)
            else:
                events, new = self.fleet.read_events(attempt, offset, want)
                rows += formatter.rows(events)
            if new <= offset:
                break
            offset = new
            del rows[:-MAX_ROWS]
        if not worker.is_cancelled:
            self.post_message(StreamOlder(generation, rows, start, everything))

    def on_stream_batch(self, message: StreamBatch) -> None:
        if message.generation != self._stream_gen:
            return
        view = self.query_one(StreamView)
        if message.attempt is not None:
            self._stream_attempt = message.attempt
            self._stream_attempts = message.attempts
            self._stream_older = message.older or 0
            view.clear_rows()
            view.has_older = self._stream_older > 0
            self._caption()
        view.append_rows(message.rows)
        self._fill_stream()

    def on_stream_older(self, message: StreamOlder) -> None:
        if message.generation != self._stream_gen:
            return
        self._older_loading = False
        self._stream_older = message.older
        view = self.query_one(StreamView)
        view.has_older = message.older > 0
        view.prepend_rows(message.rows, to_top=message.everything)
        self._fill_stream()

    @on(StreamView.WantsOlder)
    def _wants_older(self, message: StreamView.WantsOlder) -> None:
        self._read_older(everything=message.everything)

    def _read_older(self, *, everything: bool = False) -> None:
        attempt = self._stream_attempt
        task = self.selected
        if attempt is None or task is None or self._stream_older <= 0:
            return
        if self._older_loading and not everything:
            return
        self._older_loading = True
        self._load_older(self._stream_gen, attempt, self._stream_older, everything,
                         self.raw, str(task.worktree) if task.worktree else None)

    def _fill_stream(self) -> None:
        """Fewer rows than the view is high (a short tail, tool calls only): read on back."""
        view = self.query_one(StreamView)
        if self._stream_older > 0 and not self._older_loading \
                and view.row_count() < max(1, view.size.height):
            self._read_older()

    def _caption(self) -> None:
        view = self.query_one(StreamView)
        attempt = self._stream_attempt
        text = Text(no_wrap=True, overflow="ellipsis")
        if self.selected is None:
            text.append("No task selected.")
        elif attempt is None:
            state = self.selected.state
            text.append("Waiting for a free slot…" if state in (
                TaskState.QUEUED, TaskState.WAITING) else "No attempt yet.")
        else:
            text.append(f"attempt {attempt.n}/{self._stream_attempts} ({attempt.kind})",
                        style="bold")
            if attempt.verdict:
                text.append(f" · {attempt.verdict}")
        text.append("   ")
        text.append("following" if view.follow else "paused (end: follow)")
        text.append(" · JSON lines" if self.raw else (
            " · tool calls only" if view.tools_only else " · everything"))
        text.append("   t: tools/all  J: raw  a: attempt  F: follow")
        self.query_one("#stream-caption", Label).update(text)

    def on_line_view_follow_changed(self) -> None:
        self._caption()

    # --- diff ----------------------------------------------------------------------------
    def _diff_tick(self) -> None:
        task = self.selected
        if task is None or task.state not in ACTIVE_STATES or self._diff_loading:
            return
        self._load_diff_now(task.id)

    def _load_diff_now(self, task_id: str, *, first: bool = False) -> None:
        task = self.tasks.get(task_id)
        if task is None:
            return
        if task.worktree is None or task.state in CLOSED_STATES:
            why = {TaskState.MERGED: "Merged: the worktree is gone; the change is on "
                                     f"{task.base_branch or 'the base branch'}.",
                   TaskState.DISCARDED: "Discarded."}.get(
                task.state, "No worktree yet: the task has not started.")
            self._show_diff_message(why)
            return
        if self.active_tab != "tab-diff":
            # The diff view is hidden: no `git diff` (nor the GIL it holds) for nobody to
            # see; showing the diff tab loads it.
            self._diff_when_shown = task_id
            return
        if first:
            self._show_diff_message("Loading the diff…")
        if self._diff_loading:
            self._diff_wanted = task_id  # one git diff at a time: this one goes next
            return
        self._diff_loading = True
        self._load_diff(task_id)

    @work(thread=True, exclusive=True, exit_on_error=False, group="diff",
          description="computing the diff")
    def _load_diff(self, task_id: str) -> None:
        from fleet_tui.fleet import FleetError
        from fleet_tui.git import GitError

        try:
            prepared = PreparedDiff.build(self.fleet.diff(task_id))
        except (FleetError, GitError) as exc:
            self.post_message(DiffLoaded(task_id, None, str(exc)))
            return
        self.post_message(DiffLoaded(task_id, prepared))

    def on_diff_loaded(self, message: DiffLoaded) -> None:
        self._diff_loading = False
        wanted, self._diff_wanted = self._diff_wanted, None
        if wanted is not None and wanted == self.selected_id:
            self._load_diff_now(wanted)  # asked for while this one ran
        if message.task_id != self.selected_id:
            return
        view = self._diff_view()
        if view is None:
            self._diff_pending_loaded = message
            return
        self._show_loaded(view, message)

    def _show_loaded(self, view: DiffView, message: DiffLoaded) -> None:
        if message.prepared is None:
            view.show_message(message.problem or "No diff.")
        else:
            view.show(message.task_id, message.prepared)
        self._maybe_refresh_bindings()

    def _diff_failed(self) -> None:
        """A diff worker died (the app's handler says why): let the next load start."""
        self._diff_loading = False
        self._diff_wanted = None

    @on(DiffView.FileHighlighted)
    def _file_highlighted(self) -> None:
        self._maybe_refresh_bindings()

    # --- bindings that apply right now -----------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if self.fleet_app.quitting:
            return False
        targets = self.targets()
        states = {t.state for t in targets}
        task = self.selected
        if action == "merge":
            return bool(targets) and states <= FINISHED_STATES
        if action == "discard":
            return bool(targets) and not (states & (CLOSED_STATES | ACTIVE_STATES))
        if action == "retry":
            return bool(targets) and states <= FINISHED_STATES
        if action == "kill":
            return bool(targets) and states <= KILLABLE
        if action == "follow_up":
            return bool(targets) and states <= FINISHED_STATES and not self.marked
        if action == "shell":
            here = self.cursor_task
            return (here is not None and here.worktree is not None
                    and here.state not in CLOSED_STATES)
        if action == "edit":
            view = self._diff_view()
            return (task is not None and task.worktree is not None and view is not None
                    and task.state not in CLOSED_STATES and view.selected_path is not None)
        if action == "toggle_mark":
            return self.cursor_task is not None
        if action == "mark_all":
            shown = self.query_one(TaskTable).keys
            return bool(shown) and not set(shown) <= self.marked
        if action == "unmark_all":
            return bool(self.marked)
        if action in ("toggle_tools", "toggle_raw", "toggle_follow", "choose_attempt"):
            return task is not None and (action != "choose_attempt" or task.attempt_count > 0)
        if action == "clear_filter":
            box = self._filter_box()
            return bool(self.filter_text) or (box is not None and box.display)
        return True

    # --- actions: list -------------------------------------------------------------------
    def action_toggle_mark(self) -> None:
        """Mark / unmark the cursor row and move down: each press acts on the row the
        cursor is on when the key is handled, however fast the keys come."""
        table = self.query_one(TaskTable)
        key = table.selected_key
        if key is None:
            return
        self.marked ^= {key}
        self._marks_changed()
        if table.cursor_row < table.row_count - 1:
            table.move_cursor(row=table.cursor_row + 1)

    def action_mark_all(self) -> None:
        """Mark every task the list shows (a filter narrows it)."""
        self.marked |= set(self.query_one(TaskTable).keys)
        self._marks_changed()

    def action_unmark_all(self) -> None:
        self.marked.clear()
        self._marks_changed()

    def _marks_changed(self) -> None:
        self.query_one(TaskTable).set_marked(self.marked)
        self._show_status()
        self._maybe_refresh_bindings()

    def action_filter(self) -> None:
        box = self._filter_box()
        if box is None:  # pressed in the frame before it is mounted
            self.call_after_refresh(self.action_filter)
            return
        box.display = True
        box.focus()
        self._maybe_refresh_bindings()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value
        self._render_tasks()

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self) -> None:
        box = self.query_one("#filter", Input)
        if not box.value:
            box.display = False
        self.query_one(TaskTable).focus()

    def action_clear_filter(self) -> None:
        box = self._filter_box()
        self.filter_text = ""
        if box is not None:
            box.value = ""
            box.display = False
        self.query_one(TaskTable).focus()
        self._render_tasks()

    @property
    def active_tab(self) -> str:
        """The view shown below the list: "tab-stream" or "tab-diff"."""
        return self.query_one(ContentSwitcher).current or "tab-stream"

    def action_show_tab(self, tab: str) -> None:
        self.query_one(TabBar).active = tab
        self._switch_to(tab)

    @on(TabBar.Changed)
    def _tab_chosen(self, event: TabBar.Changed) -> None:
        self._switch_to(event.tab)

    def _switch_to(self, tab: str) -> None:
        self.query_one(ContentSwitcher).current = tab
        wanted, self._diff_when_shown = self._diff_when_shown, None
        if tab == "tab-diff" and wanted is not None and wanted == self.selected_id:
            self._load_diff_now(wanted, first=True)

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(self.help_sections()))

    def help_sections(self) -> list[HelpSection]:
        keys: list[tuple[str, str]] = []
        for binding in self.BINDINGS:
            assert isinstance(binding, Binding)
            keys.append((self.app.get_key_display(binding), HELP_TEXT.get(
                binding.action, binding.description)))
        return [("Tasks and views", keys), *self.HELP_EXTRA]

    # --- actions: stream -----------------------------------------------------------------
    def action_toggle_tools(self) -> None:
        view = self.query_one(StreamView)
        view.tools_only = not view.tools_only
        self._caption()

    def action_toggle_raw(self) -> None:
        self.raw = not self.raw
        self._stream_task = None
        self._refresh_selected()

    def action_toggle_follow(self) -> None:
        view = self.query_one(StreamView)
        view.follow = not view.follow
        self._caption()

    def action_choose_attempt(self) -> None:
        task = self.selected
        if task is None:
            return
        self._open_attempts(task.id)

    @work(thread=True, exit_on_error=False, group="actions", description="listing attempts")
    def _open_attempts(self, task_id: str) -> None:
        attempts = self.fleet.attempts(task_id)
        current = self._stream_attempt.n if self._stream_attempt else 0
        items = [(a.n, f"{a.n}. {a.kind:<8} {a.verdict or 'running':<10} "
                  f"{a.turns} turns  {a.model or ''}") for a in attempts]
        self.app.call_from_thread(self._push_attempts, task_id, items, current)

    def _push_attempts(self, task_id: str, items: list[tuple[int, str]], current: int) -> None:
        def chosen(n: int | None) -> None:
            if n is None:
                return
            latest = max((i[0] for i in items), default=0)
            if n == latest:
                self.attempt_choice.pop(task_id, None)
            else:
                self.attempt_choice[task_id] = n
            self._stream_task = None
            self._refresh_selected()

        from fleet_tui.ui.screens.modals import AttemptScreen

        self.app.push_screen(AttemptScreen(f"Attempts of {task_id}", items, current), chosen)

    # --- actions: engine -----------------------------------------------------------------
    def action_new_task(self) -> None:
        repo = self.fleet_app.repo
        if repo is None:
            self.notify("Open fleet-tui inside a git repository, or pass --repo PATH.",
                        title="No repository", severity="error")
            return

        from fleet_tui.ui.screens.launch import LaunchScreen

        def launched(request: LaunchRequest | None) -> None:
            if request is not None:
                self._submit(request)

        self.app.push_screen(LaunchScreen(repo, default_base=self.fleet_app.default_base),
                             launched)

    @work(thread=True, exit_on_error=False, group="actions", description="launching")
    def _submit(self, request: LaunchRequest) -> None:
        tasks = self.fleet.submit(request.spec, copies=request.copies)
        self.post_message(TasksSubmitted(tasks))

    def on_tasks_submitted(self, message: TasksSubmitted) -> None:
        for task in message.tasks:
            self.tasks[task.id] = task
        self.filter_text = ""
        box = self._filter_box()
        if box is not None:
            box.value = ""
            box.display = False
        self._render_tasks()
        if message.tasks:
            first = message.tasks[0]
            self.query_one(TaskTable).select_key(first.id)
            self._select(first.id)
            self.action_show_tab("tab-stream")
            self.query_one(TaskTable).focus()
            n = len(message.tasks)
            self.notify(f"{first.short_title}" + (f" ×{n}" if n > 1 else ""),
                        title=f"Queued {', '.join(t.id for t in message.tasks)}")
        self.poll()

    def action_merge(self) -> None:
        targets = self.targets()
        if targets:
            self._prepare_merge([t.id for t in targets])

    @work(thread=True, exit_on_error=False, group="actions",
          description="previewing the merge")
    def _prepare_merge(self, task_ids: list[str]) -> None:
        from fleet_tui.ui.screens.modals import MergeItem

        items = []
        for task_id in task_ids:
            task = self.fleet.get_task(task_id)
            preview = self.fleet.conflict_preview(task_id)
            items.append(MergeItem(task.id, task.short_title, task.branch,
                                   task.base_branch or "the base branch", preview.clean,
                                   list(preview.conflicts), preview.message,
                                   task.added_lines, task.deleted_lines))
        test_command = self.fleet_app.settings_test_command()
        self.app.call_from_thread(self._confirm_merge, items, test_command)

    def _confirm_merge(self, items: list[MergeItem], test_command: str | None) -> None:
        def answered(answer: MergeAnswer | None) -> None:
            if answer is not None:
                self._merge([i.task_id for i in items], answer.message, test_command)

        from fleet_tui.ui.screens.modals import MergeScreen

        self.app.push_screen(MergeScreen(items, test_command), answered)

    @work(thread=True, exit_on_error=False, group="actions", description="merging")
    def _merge(self, task_ids: list[str], message: str | None,
               test_command: str | None) -> None:
        if len(task_ids) > 1:
            def merge_one(task_id: str) -> str | None:
                result = self.fleet.merge(task_id, message=message, test_command=test_command)
                if result.merged:
                    return None
                return result.message + (
                    f" (conflicts: {', '.join(result.conflicts)})" if result.conflicts else "")

            self.post_message(_each(task_ids, merge_one, "merged", "Merged"))
            return
        for task_id in task_ids:
            result = self.fleet.merge(task_id, message=message, test_command=test_command)
            if result.merged:
                self.post_message(ActionDone(
                    result.message or f"commit {(result.commit or '')[:10]}",
                    title=f"{task_id} merged", task_ids=[task_id],
                    details=result.test_output if result.test_output else None))
            else:
                detail = result.message
                if result.conflicts:
                    detail += "\nConflicts: " + ", ".join(result.conflicts)
                if result.test_output:
                    detail += "\n\nTest output:\n" + result.test_output
                self.post_message(ActionDone(detail, title=f"{task_id} not merged",
                                             severity="error", details=detail,
                                             task_ids=[task_id]))

    def action_discard(self) -> None:
        targets = self.targets()
        if not targets:
            return
        names = "\n".join(f"  {t.id}  {t.short_title}" for t in targets)
        body = (f"Delete the worktree and the branch of:\n{names}\n\n"
                "The work in them is lost. The logs stay.")

        def answered(yes: bool | None) -> None:
            if yes:
                self._engine_each("discard", [t.id for t in targets], "discarded")

        from fleet_tui.ui.screens.modals import ConfirmScreen

        self.app.push_screen(ConfirmScreen(
            f"Discard {len(targets)} task{'s' if len(targets) > 1 else ''}?", body,
            yes="Discard"), answered)

    def action_kill(self) -> None:
        targets = self.targets()
        if not targets:
            return
        names = "\n".join(f"  {t.id}  {t.short_title}  ({t.state})" for t in targets)
        body = f"Stop these workers (their whole process group):\n{names}"

        def answered(yes: bool | None) -> None:
            if yes:
                self._engine_each("kill", [t.id for t in targets], "killed")

        from fleet_tui.ui.screens.modals import ConfirmScreen

        self.app.push_screen(ConfirmScreen(
            f"Kill {len(targets)} task{'s' if len(targets) > 1 else ''}?", body,
            yes="Kill"), answered)

    def action_retry(self) -> None:
        targets = self.targets()
        if not targets:
            return
        can_resume = all(t.session_id for t in targets)
        choices = [("f", "fresh", "Fresh run")]
        if can_resume:
            choices.append(("r", "resume", "Resume session"))
        body = ("A fresh run starts over from the prompt; the worktree is reset to its "
                "base first (its changes are dropped)."
                + ("\nResume continues the last session, changes and history kept."
                   if can_resume
                   else "\n(No session to resume.)"))

        def answered(choice: str | None) -> None:
            if choice:
                self._retry([t.id for t in targets], choice == "resume")

        from fleet_tui.ui.screens.modals import ChoiceScreen

        title = (f"Retry {targets[0].id}" if len(targets) == 1
                 else f"Retry {len(targets)} tasks?")
        if len(targets) > 1:
            body = "\n".join(f"  {t.id}  {t.short_title}  ({t.state})"
                             for t in targets) + "\n\n" + body
        self.app.push_screen(ChoiceScreen(title, body, choices), answered)

    @work(thread=True, exit_on_error=False, group="actions", description="retrying")
    def _retry(self, task_ids: list[str], resume: bool) -> None:
        if len(task_ids) > 1:
            def retry_one(task_id: str) -> None:
                self.fleet.retry(task_id, resume=resume)

            self.post_message(_each(task_ids, retry_one, "queued again",
                                    "Queued", again=" again"))
            return
        for task_id in task_ids:
            self.fleet.retry(task_id, resume=resume)
            self.post_message(ActionDone("queued again" + (" (resume)" if resume else ""),
                                         title=f"{task_id} retry", task_ids=[task_id]))

    def action_follow_up(self) -> None:
        task = self.cursor_task
        if task is None:
            return

        def answered(prompt: str | None) -> None:
            if prompt:
                self._follow_up(task.id, prompt)

        from fleet_tui.ui.screens.modals import PromptScreen

        self.app.push_screen(PromptScreen(
            f"Follow-up for {task.id}: {task.short_title}",
            "Continues the task's session with this prompt, in the same worktree."),
            answered)

    @work(thread=True, exit_on_error=False, group="actions", description="following up")
    def _follow_up(self, task_id: str, prompt: str) -> None:
        self.fleet.follow_up(task_id, prompt)
        self.post_message(ActionDone("follow-up queued", title=task_id, task_ids=[task_id]))

    @work(thread=True, exit_on_error=False, group="actions", description="engine call")
    def _engine_each(self, method: str, task_ids: list[str], word: str) -> None:
        call: Callable[[str], Any] = getattr(self.fleet, method)
        if len(task_ids) > 1:
            def one(task_id: str) -> None:
                call(task_id)

            self.post_message(_each(task_ids, one, word, word.capitalize()))
            return
        for task_id in task_ids:
            call(task_id)
            self.post_message(ActionDone(word, title=task_id, task_ids=[task_id]))

    def on_action_done(self, message: ActionDone) -> None:
        self.marked -= set(message.task_ids)
        if self.selected_id in message.task_ids:
            # The task may sink to the history at the bottom; the cursor stays on its row
            # so the next task is under it (lazygit does the same).
            self._keep_row = self.query_one(TaskTable).cursor_row
        if message.details and message.severity == "error":
            from fleet_tui.ui.screens.modals import MessageScreen

            self.app.push_screen(MessageScreen(message.title, message.details))
            self.fleet_app.ring()
        else:
            self.notify(message.text, title=message.title,
                        severity=message.severity)  # type: ignore[arg-type]
        self._stream_task = None
        self.poll()

    # --- actions: outside programs -------------------------------------------------------
    def action_shell(self) -> None:
        task = self.cursor_task
        if task is None or task.worktree is None:
            return
        shell = os.environ.get("SHELL") or "/bin/sh"
        self.fleet_app.run_external([shell], task.worktree,
                                    f"shell in {task.worktree} (exit to come back)")

    def action_edit(self) -> None:
        task = self.selected
        view = self._diff_view()
        path = view.selected_path if view is not None else None
        if task is None or task.worktree is None or path is None:
            return
        target = Path(task.worktree) / path
        if not target.exists():
            self.notify(f"{path} was deleted in this task.", severity="warning")
            return
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
        self.fleet_app.run_external([*shlex.split(editor), str(target)], task.worktree,
                                    f"editing {path}")
        self._load_diff_now(task.id)

    async def action_quit(self) -> None:
        await self.fleet_app.action_quit()


def _each(task_ids: list[str], act: Callable[[str], str | None], word: str, verb: str,
          *, again: str = "") -> ActionDone:
    """Run ``act`` on every task of a bulk action, one failure not stopping the others,
    and say in one message how many it did: ``act`` returns None when it did it, or why
    not (or raises). ``task_ids`` of the message are the ones done (their marks go)."""
    from fleet_tui.ui.app import describe_error

    done: list[str] = []
    failed: list[tuple[str, str]] = []
    for task_id in task_ids:
        try:
            why = act(task_id)
        except Exception as exc:  # reported below with the task's id; the others go on
            why = describe_error(exc)
        if why is None:
            done.append(task_id)
        else:
            failed.append((task_id, why))
    total = len(task_ids)
    if not failed:
        return ActionDone(", ".join(done), title=f"{verb} {total} tasks{again}",
                          task_ids=done)
    lines = [f"{verb} {len(done)} of {total} tasks{again}"
             + (f": {', '.join(done)}." if done else "."),
             f"Not {word} ({len(failed)}, still marked):"]
    lines += [f"  {task_id}: {why}" for task_id, why in failed]
    text = "\n".join(lines)
    return ActionDone(text, title=f"{verb} {len(done)} of {total} tasks{again}",
                      severity="error", details=text, task_ids=done)


HELP_TEXT = {
    "new_task": "launch a task (the form; ctrl+s submits)",
    "merge": "merge into the base branch (conflict preview, message, test gate)",
    "discard": "delete the task's worktree and branch (asks first)",
    "retry": "run again: fresh, or resume the session",
    "follow_up": "send a follow-up prompt to a finished task's session",
    "kill": "stop a running or queued task (asks first)",
    "toggle_mark": "mark / unmark the cursor row and move down; merge, discard, kill and "
                   "retry act on every marked task",
    "mark_all": "mark every task shown in the list (a filter narrows it)",
    "unmark_all": "unmark every task (escape once more after a filter; ctrl+\\ too)",
    "shell": "open $SHELL in the task's worktree (exit to come back)",
    "edit": "open the highlighted diff file in $EDITOR",
    "filter": "filter the task list",
    "help": "this help",
    "show_tab('tab-stream')": "show the live stream",
    "show_tab('tab-diff')": "show the diff review",
    "toggle_tools": "stream: tool calls only / everything",
    "toggle_raw": "stream: raw JSON lines / readable",
    "choose_attempt": "stream: choose the attempt to show",
    "toggle_follow": "stream: follow the end on / off",
    "clear_filter": "clear the filter",
    "quit": "quit (workers keep running; the next start picks them up)",
}


def poll_problem(fleet: Fleet, error: BaseException) -> str:
    """The start of one sentence for a task list that cannot be read: where from and why
    ("Cannot read the task list from F: file is not a database (DatabaseError)")."""
    from fleet_tui.fleet import FleetError
    from fleet_tui.store import StoreError

    where = getattr(getattr(fleet, "store", None), "path", None)
    text = " ".join(str(error).split()).rstrip(".")
    if isinstance(error, FleetError | StoreError) and text:
        cause = text  # written for the user already
    else:
        cause = f"{text} ({type(error).__name__})" if text else type(error).__name__
    return f"Cannot read the task list{f' from {where}' if where else ''}: {cause}"


def worker_sleep(worker: Any, seconds: float) -> None:
    """Sleep in small steps so a cancelled worker stops quickly."""
    end = time.monotonic() + seconds
    while not worker.is_cancelled and time.monotonic() < end:
        time.sleep(min(0.05, max(0.0, end - time.monotonic())))


def events_path(attempt: Attempt) -> Path | None:
    if attempt.events_path is not None:
        return Path(attempt.events_path)
    return attempt.dir / "events.jsonl" if attempt.dir else None


def tail_start(path: Path | None, tail: int, *, end: int | None = None) -> int:
    """Where to start reading to get the last ``tail`` bytes before ``end`` (default: the
    end of the file) as whole lines: the first line start in that window, or the start
    of the one long line that covers it; 0 when the window reaches the file's start."""
    if path is None:
        return 0
    try:
        with open(path, "rb") as fh:
            if end is None:
                end = fh.seek(0, os.SEEK_END)
            at = end - tail
            if at <= 0:
                return 0
            fh.seek(at - 1)  # a newline just before ``at`` makes ``at`` a line start
            cut = fh.read(end - at + 1).find(b"\n")
            if 0 <= cut < end - at:
                return at + cut
            while at > 0:  # no line starts in the window: go back to the long line's start
                step = min(tail, at)
                fh.seek(at - step)
                newline = fh.read(step).rfind(b"\n")
                if newline >= 0:
                    return at - step + newline + 1
                at -= step
            return 0
    except FileNotFoundError:
        return 0


def read_raw_lines(path: Path | None, offset: int, max_bytes: int) -> tuple[list[str], int, bool]:
    """Complete lines of ``path`` from ``offset``: (lines, new offset, more to read)."""
    if path is None:
        return [], offset, False
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read(max_bytes)
    except FileNotFoundError:
        return [], offset, False
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset, False
    chunk = data[: end + 1]
    lines = chunk.decode("utf-8", errors="replace").splitlines()
    return lines, offset + len(chunk), len(data) >= max_bytes


def run_command(argv: list[str], cwd: Path) -> int:
    """Run an interactive program on the real terminal (the app is suspended)."""
    try:
        return subprocess.call(argv, cwd=cwd)
    except OSError as exc:
        raise RuntimeError(f"could not start {argv[0]}: {exc.strerror}") from None
