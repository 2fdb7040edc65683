"""The main screen: the task list on top, the selected task's stream and diff below.

The screen keeps the list (the tasks as last read, the marks, the filter), the selection
and the wiring: which task the panes below show, what the keys do and when they apply
(ui/actions.py), and the dialogs of the engine actions. The panes own their own work: the
stream (widgets/stream_pane.py) and the diff (widgets/diff_pane.py).

It gets what it needs as arguments (``FleetApp.get_default_screen``) and the engine when it
is ready (``engine_ready``, on the app's EngineReady); it never imports the app. Every engine
call runs in a worker; results come back as messages (ui/messages.py), and a failed worker
becomes one error toast in the app (``WorkerFailed``).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import ContentSwitcher, Input, Label
from textual.worker import Worker

from fleet_tui.core.states import (
    ACTIVE_STATES,
    CLOSED_STATES,
    PENDING_STATES,
    STATES,
    Action,
    TaskState,
)
from fleet_tui.ui.actions import (
    ACTIONS,
    KEY_BAR_ORDER,
    KEY_BAR_PINNED,
    Context,
    PanelAction,
    find,
)
from fleet_tui.ui.external import run_external
from fleet_tui.ui.formatting import (
    change_label,
    describe_error,
    landing_label,
    pushed_label,
)
from fleet_tui.ui.messages import (
    ActionDone,
    DiffLoaded,
    EngineReady,
    PollFailed,
    SettingsChecked,
    TasksLoaded,
    TasksSubmitted,
    ToolCallLoaded,
    report_failure,
)
from fleet_tui.ui.widgets.bars import KeyBar, TabBar
from fleet_tui.ui.widgets.diff_pane import DiffPane
from fleet_tui.ui.widgets.status_line import StatusLine
from fleet_tui.ui.widgets.stream_pane import StreamPane
from fleet_tui.ui.widgets.task_table import SORTS, TaskTable, sort_tasks

if TYPE_CHECKING:
    from fleet_tui.engine.fleet import Fleet, FleetStatus
    from fleet_tui.store.db import Task
    from fleet_tui.ui.screens.help import HelpSection
    from fleet_tui.ui.screens.landing import CopyRow, QueueRow
    from fleet_tui.ui.screens.launch import FormDraft, LaunchRequest
    from fleet_tui.ui.screens.modals import MergeItem

PaletteCommand = tuple[str, str, Callable[[], object]]
"""(title, help, callback) of one command palette entry."""

SAY_SETTLE = 15.0
"""Seconds a message to a worker that ended its turn meanwhile waits for the task to be
recorded finished, to go as a follow-up instead (the scheduler records it within a tick)."""


class MainScreen(Screen[None]):
    """Task list, status line, stream | diff tabs, key bar."""

    BINDINGS = [action.binding() for action in ACTIONS]

    HELP_EXTRA: list[HelpSection] = [
        ("Lists and views", [
            ("↑ ↓ / pgup pgdn", "move in the task list, scroll the stream or the diff"),
            ("tab / shift+tab", "move focus: task list, tabs, file list, diff"),
            ("home / end", "stream: jump to the start / the end (end resumes following)"),
            ("enter / x", "stream: the whole tool call of the cursor's line"),
            ("/ (in a view)", "search the stream, the diff or a tool call; n / N: next / "
                              "previous match; escape: end the search"),
            ("enter", "filter: apply and go back to the list"),
        ]),
        ("In dialogs", [
            ("y / n / escape", "confirm, refuse, cancel"),
            ("ctrl+s", "submit the launch form, a follow-up or a merge"),
            ("e", "merge: edit the commit message (enter: done; y and n are typed there)"),
            ("w / o / a", "update stopped on conflicts: the worker, a shell, abort"),
            ("f / r", "retry: a fresh run or resume the session"),
            ("ctrl+p", "command palette: every action by name"),
        ]),
    ]

    def __init__(self, *, repo: Path | None = None, clock: Callable[[], float] = time.time,
                 run_scheduler: bool = True, poll_interval: float = 0.5,
                 diff_interval: float = 2.0, stream_interval: float = 0.1,
                 keymap: Mapping[str, str] | None = None) -> None:
        """``repo``: where new tasks start, when known before the engine is made (the
        engine's EngineReady says it otherwise); ``clock``: what "now" is for durations
        and cooldowns; ``run_scheduler``: whether this panel starts queued tasks (said in
        the header); the intervals: how often the list, a running task's diff and a
        running attempt's events are read; ``keymap``: binding id -> keys, as given to the
        app (help and palette name the keys it sets)."""
        super().__init__(id="main")
        self.fleet: Fleet | None = None
        self.repo = repo
        self.default_base = ""
        self.clock = clock
        self.run_scheduler = run_scheduler
        self.poll_interval = poll_interval
        self.keymap: Mapping[str, str] = dict(keymap or {})
        self.closing = False  # the app is quitting: keys typed on the way out do nothing
        self.tasks: dict[str, Task] = {}
        self.marked: set[str] = set()
        self.launch_drafts: dict[Path, FormDraft] = {}  # a closed launch form's text, by repo
        self.filter_text = ""
        self.show_closed = False  # merged and discarded tasks are listed (H)
        self.sort_mode = "attention"  # one of SORTS (S cycles)
        self.closed_hidden = 0  # how many closed tasks the list leaves out now
        self.selected_id: str | None = None
        self.status: FleetStatus | None = None
        self.poll_error: str | None = None  # why the task list could not be read, if so
        self._ready = asyncio.Event()  # the engine is here
        self._poll_lock = threading.Lock()
        self._polled = False  # a task list was read once
        self._notice_shown: str | None = None
        self._seen_states: dict[str, TaskState] | None = None
        self._cooldown_seen: float | None = None
        # each endpoint's latest event (park, hold, cap) as last notified: one toast each
        self._endpoint_events: dict[str, tuple[str | None, float | None]] | None = None
        self._bindings_signature: object = None
        self._title_shown = ""
        self._keep_row: int | None = None
        self._select_pending = False
        self._hidden_started = False
        self._hidden_done = asyncio.Event()
        self._filter: Input | None = None
        self.table = TaskTable(id="tasks")
        self.stream = StreamPane(interval=stream_interval, hints=self._caption_hints(),
                                 id="tab-stream")
        self.diff = DiffPane(interval=diff_interval, id="tab-diff")

    # --- helpers -------------------------------------------------------------------------
    def now(self) -> float:
        return self.clock()

    @property
    def selected(self) -> Task | None:
        return self.tasks.get(self.selected_id) if self.selected_id else None

    @property
    def cursor_task(self) -> Task | None:
        """The task on the cursor row: what a key press acts on. ``selected`` (the task the
        detail pane shows) follows it a frame later, so keys must not act on that."""
        key = self.table.selected_key
        return self.tasks.get(key) if key is not None else None

    def targets(self) -> list[Task]:
        """The marked tasks (in list order) when any are marked, else the cursor's task."""
        if self.marked:
            order = self.table.keys
            listed = [self.tasks[t] for t in order if t in self.marked and t in self.tasks]
            hidden = sorted(t for t in self.marked if t in self.tasks and t not in order)
            return listed + [self.tasks[t] for t in hidden]
        task = self.cursor_task
        return [task] if task is not None else []

    def _engine(self) -> Fleet:
        """The engine, for a worker started by a key (keys that need it apply only once
        the list was read, which needs it)."""
        if self.fleet is None:
            raise RuntimeError("the engine is not ready yet")
        return self.fleet

    # --- layout --------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        with Vertical(id="list-pane"):
            yield self.table
            notice = Label("", id="list-notice", markup=False)
            notice.display = False  # until the first poll says what to show
            yield notice
        with Vertical(id="detail-pane"):
            yield Label("", id="detail-title", markup=False)
            yield TabBar([("tab-stream", "Stream"), ("tab-diff", "Diff")], "tab-stream",
                         id="tabs")
            with ContentSwitcher(id="views", initial="tab-stream"):
                yield self.stream
                yield self.diff  # its DiffView: see mount_hidden
        yield KeyBar(order=KEY_BAR_ORDER, pinned=KEY_BAR_PINNED, more="app.help", id="keys")

    async def mount_hidden(self) -> None:
        """Mount what the first frame does not show: the filter box (hidden until `/`), the
        stream's search bar and the diff view (behind the stream tab). Their CSS and
        composing cost the first frame tens of milliseconds. They are mounted 50 ms after
        it (FleetApp.on_ready) or before the first task list is shown, whichever comes
        first."""
        if self._hidden_started:
            await self._hidden_done.wait()
            return
        self._hidden_started = True
        try:
            # The timer can fire while the app exits (an engine that cannot start ends the
            # panel at once): a pane being taken down cannot take children. Checked before
            # each mount, with no await between the check and the mount.
            pane = self.query_one("#list-pane")
            if self._going(pane):
                return
            box = Input(id="filter", placeholder="filter: text in id, title, state, model, "
                        "tool (enter: keep, escape: clear)")
            box.display = False
            await pane.mount(box, before=0)
            self._filter = box
            if self._going(self.stream):
                return
            await self.stream.mount_search()
            if self._going(self.diff):
                return
            await self.diff.mount_view()
            if not self.closing:
                self._maybe_refresh_bindings()
        finally:
            self._hidden_done.set()

    def _going(self, widget: Widget) -> bool:
        """The panel is closing, or `widget` is no longer in a live DOM."""
        return self.closing or not widget.is_attached or widget._closing or widget._pruning

    def _filter_box(self) -> Input | None:
        """The filter box, once mounted (kept: a query per key-bar check costs ~0.3 ms)."""
        return self._filter

    def on_mount(self) -> None:
        status = self.query_one(StatusLine)
        status.scheduler = self.run_scheduler
        self._show_status()
        self.table.focus()

    def engine_ready(self, ready: EngineReady) -> None:
        """The engine is made: read the list now and every poll interval; the panes can
        read streams and diffs; a launch form asked for before opens."""
        self.fleet = ready.fleet
        self.repo = ready.repo
        self.default_base = ready.default_base
        self.stream.fleet = ready.fleet
        self.diff.start(ready.fleet)
        self.set_interval(self.poll_interval, self.poll)
        self.set_interval(1.0, self._show_status)
        self.poll()
        self._show_status()
        self._ready.set()

    def _show_status(self) -> None:
        status = self.query_one(StatusLine)
        status.repo_name = self.repo.name if self.repo else "all repositories"
        status.marked = len(self.marked)
        notes = [] if self.sort_mode == "attention" else [SORTS[self.sort_mode]]
        if self.closed_hidden:
            notes.append(f"{self.closed_hidden} closed hidden (H)")
        status.view_note = " · ".join(notes)
        status.show(self.status, self.now())

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """StateChanged does not bubble: hand failures to the app's one handler."""
        report_failure(self, event)

    # --- polling the store ---------------------------------------------------------------
    def poll(self) -> None:
        if self.fleet is not None and self._poll_lock.acquire(blocking=False):
            self._load_tasks(self.fleet)

    @work(thread=True, exit_on_error=False, group="poll", description="reading the task list")
    def _load_tasks(self, fleet: Fleet) -> None:
        try:
            try:
                tasks = fleet.list_tasks()
                status = fleet.status(tasks)
                if not self.run_scheduler:  # the scheduler's passes do it otherwise
                    fleet.resume_queues()
            except Exception as exc:  # whatever the store raises: said, and polled again
                self.post_message(PollFailed(poll_problem(fleet, exc)))
                return
            self.post_message(TasksLoaded(tasks, status, time.monotonic()))
            # settings edited while the panel runs: config.toml, the repositories' files
            repos = {t.repo for t in tasks} | ({self.repo} if self.repo else set())
            notices = fleet.check_settings(repos)
            if notices:
                self.post_message(SettingsChecked(notices))
        finally:
            self._poll_lock.release()

    def on_settings_checked(self, message: SettingsChecked) -> None:
        """Settings reloaded (said briefly), or an edit that is not used (said until read:
        the previous settings stay)."""
        for notice in message.notices:
            error = notice.severity == "error"
            self.notify(notice.message, title=notice.title,
                        severity="error" if error else "information",
                        timeout=15 if error else 5)

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
        elif not self.table.row_count and self.closed_hidden and not self.filter_text:
            text = (f"No open tasks: H shows the {self.closed_hidden} merged or discarded "
                    "ones; n launches a new one.")
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
        from fleet_tui.core.policy import STOPS  # in sys.modules: the engine imported it

        states = {t.id: t.state for t in tasks}
        held = {e.endpoint for e in status.endpoints if e.held is not None}
        if self._seen_states is not None:
            for task in tasks:
                old = self._seen_states.get(task.id)
                row = STATES.get(task.state)
                if old == task.state or row is None or row.alert is None:
                    continue
                if task.endpoint in held and task.verdict in STOPS:
                    continue  # the endpoint's hold says it, once for all its tasks
                word, severity = row.alert
                unchanged = change_label(task)
                if unchanged is not None:
                    word = f"{word}, {unchanged}"
                detail = f"\n{task.message}" if task.message else ""
                self.notify(f"{task.short_title}{detail}", title=f"{task.id} {word}",
                            severity=severity,  # type: ignore[arg-type]
                            timeout=8)
                self.app.bell()
            cooldown = status.cooldown_until
            if cooldown is not None and cooldown > self.now() and cooldown != self._cooldown_seen \
                    and self._cooldown_seen is None:
                self.notify(f"The endpoint asked us to slow down; new attempts wait "
                            f"{int(cooldown - self.now())} s.", title="Endpoint cooldown",
                            severity="warning", timeout=8)
                self.app.bell()
        self._cooldown_seen = status.cooldown_until if (
            status.cooldown_until is not None and status.cooldown_until > self.now()) else None
        self._seen_states = states
        self._alert_endpoints(tasks, status)

    def _alert_endpoints(self, tasks: list[Task], status: FleetStatus) -> None:
        """One toast per endpoint event (a park, a hold, a lowered cap), however many tasks
        it concerns; what is already so when the panel opens is shown, not announced."""
        events = {e.endpoint: (e.event, e.event_at) for e in status.endpoints}
        seen = self._endpoint_events
        self._endpoint_events = events
        if seen is None:
            return
        for ep in status.endpoints:
            if ep.event is None or seen.get(ep.endpoint) == (ep.event, ep.event_at):
                continue
            waiting = sum(1 for t in tasks if t.endpoint == ep.endpoint
                          and t.state in PENDING_STATES)
            tasks_word = f"{waiting} task{'' if waiting == 1 else 's'}"
            if ep.event == "hold" and ep.held is not None:
                met = f"task {ep.held_task} failed: " if ep.held_task else ""
                self.notify(f"{met}{ep.held}\n{tasks_word} held until you retry "
                            f"{ep.held_task or 'it'} or change the settings.",
                            title="Endpoint held", severity="error", timeout=15,
                            markup=False)
            elif ep.event == "park" and ep.parked_until is not None \
                    and ep.parked_until > self.now():
                from fleet_tui.core.policy import park_text

                park = park_text(ep.parked_until, ep.park_reason, self.now())
                self.notify(f"{park}; {tasks_word} wait for it.",
                            title="Endpoint parked", severity="warning", timeout=10,
                            markup=False)
            elif ep.event == "cap" and ep.cap < ep.max_workers:
                why = f" ({ep.cap_reason})" if ep.cap_reason else ""
                self.notify(f"cap {ep.cap}/{ep.max_workers}{why}: fewer workers at once "
                            "until the endpoint takes more.", title="Endpoint concurrency limit",
                            severity="warning", timeout=8, markup=False)
            else:
                continue
            self.app.bell()

    def _visible_tasks(self) -> list[Task]:
        tasks = sort_tasks(self.tasks.values(), self.sort_mode)
        if not self.show_closed:
            shown = [t for t in tasks if t.state not in CLOSED_STATES]
            self.closed_hidden = len(tasks) - len(shown)
            tasks = shown
        else:
            self.closed_hidden = 0
        needle = self.filter_text.lower().strip()
        if not needle:
            return tasks
        return [t for t in tasks if needle in " ".join(
            (t.id, t.short_title, str(t.state), t.model, t.last_tool or "",
             t.repo.name)).lower()]

    def _render_tasks(self) -> None:
        table = self.table
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

    # --- what applies now: the action records ----------------------------------------------
    def context(self) -> Context:
        """What the action guards look at (ui/actions.py)."""
        table = self.table
        box = self._filter_box()
        shown = table.row_count
        unmarked_shown = shown > len(self.marked) or (
            shown > 0 and not set(table.keys) <= self.marked)
        return Context(targets=self.targets(), cursor=self.cursor_task, selected=self.selected,
                       marked=len(self.marked), unmarked_shown=unmarked_shown,
                       diff_file=self.diff.selected_path,
                       filtering=bool(self.filter_text) or (box is not None and box.display),
                       in_view=self.keys_pane not in ("list", "filter", ""))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """True: the key applies; None: it applies to the selection but cannot be done now
        (shown dimmed; a click says why); False: hidden."""
        if self.closing:
            return False
        record = find(action, parameters)
        if record is None:
            return True
        verdict = record.verdict(self.context())
        return True if verdict is True else (None if verdict else False)

    def why_not(self, record: PanelAction) -> str | None:
        """Why an action that is shown dimmed cannot be done now (None: it can)."""
        verdict = record.verdict(self.context())
        return verdict if isinstance(verdict, str) else None

    def _maybe_refresh_bindings(self) -> None:
        """Refresh the key bar only when what applies changed: it is rebuilt on every
        refresh_bindings(), which costs more than a poll or a cursor move."""
        ctx = self.context()
        signature = (self.closing, tuple(a.verdict(ctx) for a in ACTIONS))
        if signature != self._bindings_signature:
            self._bindings_signature = signature
            self.refresh_bindings()

    def key_display(self, record: PanelAction) -> str:
        """The key of an action as the help and the palette name it (a keymap's first)."""
        binding = record.binding()
        keys = self.keymap.get(record.id)
        if keys:
            binding = replace(binding, key=keys.split(",")[0].strip(), key_display=None)
        return self.app.get_key_display(binding)

    def _caption_hints(self) -> str:
        """The view flags' keys for the stream's caption ("t: tools/all  J: raw ...")."""
        return "  ".join(f"{(self.keymap.get(a.id) or a.keys).split(',')[0]}: {a.hint}"
                         for a in ACTIONS if a.hint)

    def help_sections(self) -> list[HelpSection]:
        keys = [(self.key_display(a), a.help) for a in ACTIONS]
        return [("Tasks and views", keys), *self.HELP_EXTRA]

    def palette_commands(self) -> Iterator[PaletteCommand]:
        """The command palette's entries: every action that applies now, and those shown
        dimmed with the reason they cannot be done."""
        ctx = self.context()
        for record in ACTIONS:
            if not record.palette:
                continue
            verdict = record.verdict(ctx)
            if verdict is False:
                continue
            title = f"{record.label} ({self.key_display(record)})"
            if verdict is True:
                yield title, record.help, partial(self.run_action, record.action)
            else:
                yield title, f"Not now: {verdict}", partial(self.explain, verdict)

    @on(KeyBar.Refused)
    def _refused(self, message: KeyBar.Refused) -> None:
        """A dimmed key was clicked: say why it cannot be done."""
        record = find(*_parse(message.binding.action))
        reason = self.why_not(record) if record is not None else None
        if reason:
            self.explain(reason)

    def explain(self, reason: str) -> None:
        """Say why an action cannot be done now."""
        self.notify(reason, title="Not now", severity="warning")

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
        key = self.table.selected_key
        if key != self.selected_id:
            self._select(key)

    def _select(self, task_id: str | None) -> None:
        self.selected_id = task_id
        self._refresh_selected(new=True)
        self._maybe_refresh_bindings()

    def _refresh_selected(self, *, new: bool = False) -> None:
        """Update the detail title; hand the task to the stream and the diff panes."""
        task = self.selected
        title = self.query_one("#detail-title", Label)
        if task is None:
            title.update("")
            self._title_shown = ""
        else:
            text = Text(no_wrap=True, overflow="ellipsis")
            text.append(f"{task.id} ", style="bold")
            text.append(task.short_title)
            text.append(f"  ·  {task.state}")
            if task.branch:
                text.append(f"  ·  {task.branch}")
                if task.base_branch:
                    text.append(f" → {task.base_branch}")
            landing = landing_label(task)
            if landing is not None:
                text.append(f"  ·  {landing[0]}")
                if task.land_state and task.land_note:
                    text.append(f": {task.land_note.splitlines()[0]}")
            pushed = pushed_label(task)
            if pushed is not None and not (landing and landing[0] == "↑pushed"):
                text.append(f"  ·  ↑{pushed}")
            elif pushed is not None:
                text.append(f" {pushed}")
            if task.message and task.state not in (TaskState.RUNNING, TaskState.QUEUED):
                text.append(f"  ·  {task.message.splitlines()[0] if task.message else ''}")
            if text.plain != self._title_shown:
                self._title_shown = text.plain
                title.update(text)
        if new or task is not None:
            self.stream.show(task)
        self.diff.show(task, new=new)

    # --- actions: list -------------------------------------------------------------------
    def action_toggle_mark(self) -> None:
        """Mark / unmark the cursor row and move down: each press acts on the row the
        cursor is on when the key is handled, however fast the keys come."""
        table = self.table
        key = table.selected_key
        if key is None:
            return
        self.marked ^= {key}
        self._marks_changed()
        if table.cursor_row < table.row_count - 1:
            table.move_cursor(row=table.cursor_row + 1)

    def action_mark_all(self) -> None:
        """Mark every task the list shows (a filter narrows it)."""
        self.marked |= set(self.table.keys)
        self._marks_changed()

    def action_unmark_all(self) -> None:
        self.marked.clear()
        self._marks_changed()

    def _marks_changed(self) -> None:
        self.table.set_marked(self.marked)
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
        self.table.focus()

    def action_clear_filter(self) -> None:
        box = self._filter_box()
        self.filter_text = ""
        if box is not None:
            box.value = ""
            box.display = False
        self.table.focus()
        self._render_tasks()

    def action_toggle_closed(self) -> None:
        """Show or hide the merged and discarded tasks (hidden at first)."""
        self.show_closed = not self.show_closed
        self._render_tasks()
        self.notify("Merged and discarded tasks are listed (H hides them)." if self.show_closed
                    else "Merged and discarded tasks are hidden (H shows them).",
                    title="Closed tasks", timeout=3)

    def action_cycle_sort(self) -> None:
        """The next order of the list: needs you first, newest, repository, state."""
        modes = list(SORTS)
        self.sort_mode = modes[(modes.index(self.sort_mode) + 1) % len(modes)]
        self._render_tasks()
        self.notify(f"Sorted {SORTS[self.sort_mode]} (S: the next order).",
                    title="Sort", timeout=3)

    @property
    def active_tab(self) -> str:
        """The view shown below the list: "tab-stream" or "tab-diff"."""
        return self.query_one(ContentSwitcher).current or "tab-stream"

    def action_show_tab(self, tab: str) -> None:
        """`1` / `2`: the view below changes, the keys stay on (or come back to) the task
        list, so ↑ ↓ move the tasks and the task keys act on the row the list highlights."""
        self.query_one(TabBar).active = tab
        self.table.focus()
        self._switch_to(tab)

    @on(TabBar.Changed)
    def _tab_chosen(self, event: TabBar.Changed) -> None:
        self._switch_to(event.tab)

    def _switch_to(self, tab: str) -> None:
        # A focused widget that is hidden hands the focus to the next one Textual finds
        # (the diff's file list): ↑ ↓ then moved nothing the user could see. It goes back to
        # the list instead.
        focused = self.focused
        switcher = self.query_one(ContentSwitcher)
        if focused is not None and switcher.current and tab != switcher.current and any(
                node.id == switcher.current for node in focused.ancestors_with_self):
            self.table.focus()
        switcher.current = tab
        self.diff.set_shown(tab == "tab-diff")

    def action_focus_list(self) -> None:
        self.table.focus()

    # --- which pane has the keys -------------------------------------------------------------
    PANE_NOTES: dict[str, str] = {
        "list": "keys: task list",
        "stream": "keys: stream (↑↓ lines, x expand) · esc: task list",
        "diff-files": "keys: diff files (↑↓) · esc: task list",
        "diff": "keys: diff (↑↓ scroll) · esc: task list",
        "tabs": "keys: tabs (←→) · esc: task list",
        "filter": "keys: filter · enter: task list",
    }

    @property
    def keys_pane(self) -> str:
        """Where the keys go now: "list", "filter", "tabs", "stream", "diff-files", "diff",
        or "" (nothing of the main screen has the focus)."""
        focused = self.focused
        if focused is None:
            return ""
        if focused is self.table:
            return "list"
        if focused is self._filter:
            return "filter"
        for node in focused.ancestors_with_self:
            if isinstance(node, TabBar):
                return "tabs"
            if node.id == "diff-files":
                return "diff-files"
            if node is self.diff:
                return "diff"
            if node is self.stream:
                return "stream"
        return ""

    def on_descendant_focus(self) -> None:
        self._show_keys_pane()

    def on_descendant_blur(self) -> None:
        self.call_after_refresh(self._show_keys_pane)

    def _show_keys_pane(self) -> None:
        """Say over the views which pane has the keys (the list's cursor dims when it has
        them not, and the detail pane's top edge lights up when one of its views has)."""
        pane = self.keys_pane
        bars = self.query(TabBar)
        if bars:
            bars.first().note = self.PANE_NOTES.get(pane, "")
        self._maybe_refresh_bindings()

    def action_help(self) -> None:
        from fleet_tui.ui.screens.help import HelpScreen

        self.app.push_screen(HelpScreen(self.help_sections()))

    # --- actions: stream -----------------------------------------------------------------
    def action_toggle_tools(self) -> None:
        self.stream.tools_only = not self.stream.tools_only

    def action_toggle_raw(self) -> None:
        self.stream.raw = not self.stream.raw

    def action_toggle_follow(self) -> None:
        self.stream.follow = not self.stream.follow

    def action_expand(self) -> None:
        if self.active_tab != "tab-stream":
            self.action_show_tab("tab-stream")
        self.stream.expand_tool_call()

    def action_search(self) -> None:
        if self.active_tab == "tab-diff":
            self.diff.open_search()
        else:
            self.stream.open_search()

    def action_choose_attempt(self) -> None:
        task = self.selected
        if task is not None:
            self._choose_attempt(self._engine(), task.id)

    @work(exclusive=True, exit_on_error=False, group="dialog", description="listing attempts")
    async def _choose_attempt(self, fleet: Fleet, task_id: str) -> None:
        from fleet_tui.ui.screens.modals import AttemptScreen

        attempts = await asyncio.to_thread(fleet.attempts, task_id)
        shown = self.stream.attempt
        current = shown.n if shown is not None else 0
        items = [(a.n, f"{a.n}. {a.kind:<8} {a.verdict or 'running':<10} "
                  f"{a.turns} turns  {a.model or ''}") for a in attempts]
        if self.closing:
            return
        n = await self.app.push_screen_wait(AttemptScreen(f"Attempts of {task_id}", items,
                                                          current))
        if n is not None:
            self.stream.choose_attempt(task_id, n, max((i[0] for i in items), default=0))

    # --- actions: engine -----------------------------------------------------------------
    def action_new_task(self) -> None:
        self._new_task()

    @work(exclusive=True, exit_on_error=False, group="dialog", description="launching")
    async def _new_task(self) -> None:
        """The launch form, once the engine is ready (a key pressed before waits for it:
        the repository is known only then when the panel looked for it)."""
        from fleet_tui.ui.screens.launch import LaunchScreen

        await self._ready.wait()
        repo = self.repo
        base = self.default_base
        if repo is None:
            # opened outside a repository: which one (the recent ones are offered)
            chosen = await self._choose_repository(self._engine())
            if chosen is None:
                return
            repo, base = chosen
        if self.closing:
            return
        form = LaunchScreen(repo, default_base=base, draft=self.launch_drafts.get(repo))
        request = await self.app.push_screen_wait(form)
        if form.draft is not None and request is None:
            self.launch_drafts[repo] = form.draft  # closed with something typed: kept
        else:
            self.launch_drafts.pop(repo, None)
        if request is not None:
            self._submit(self._engine(), request)

    async def _choose_repository(self, fleet: Fleet) -> tuple[Path, str] | None:
        """Ask which repository a new task starts in (the panel was opened outside one):
        the recent ones from the task list, or a path typed. (repository, its branch)."""
        from fleet_tui.ui.screens.modals import RepoScreen

        recent = await asyncio.to_thread(fleet.recent_repos)
        while not self.closing:
            answer = await self.app.push_screen_wait(RepoScreen(
                [str(r) for r in recent if Path(r).is_dir()]))
            if answer is None:
                return None
            try:
                return await asyncio.to_thread(_repository_at, answer)
            except Exception as exc:  # GitError: not a repository; said, and asked again
                self.notify(describe_error(exc), title="Not a repository", severity="error")
        return None

    @work(thread=True, exit_on_error=False, group="actions", description="launching")
    def _submit(self, fleet: Fleet, request: LaunchRequest) -> None:
        tasks = fleet.submit(request.spec, copies=request.copies)
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
            self.table.select_key(first.id)
            self._select(first.id)
            self.action_show_tab("tab-stream")
            self.table.focus()
            n = len(message.tasks)
            self.notify(f"{first.short_title}" + (f" ×{n}" if n > 1 else ""),
                        title=f"Queued {', '.join(t.id for t in message.tasks)}")
        self.poll()

    def action_merge(self) -> None:
        targets = self.targets()
        if targets:
            self._merge_flow(self._engine(), [t.id for t in targets])

    @work(exclusive=True, exit_on_error=False, group="dialog",
          description="previewing the merge")
    async def _merge_flow(self, fleet: Fleet, task_ids: list[str]) -> None:
        """The conflict preview (in a thread), the merge dialog, then the merge. Several
        tasks (marked) land through the merge queue, in the list's order."""
        from fleet_tui.ui.screens.modals import MergeScreen

        items, test_command = await asyncio.to_thread(merge_items, fleet, task_ids)
        if self.closing:
            return
        queue = len(task_ids) > 1
        answer = await self.app.push_screen_wait(MergeScreen(items, test_command,
                                                             queue=queue))
        if answer is None or not answer.task_ids:
            return
        chosen = list(answer.task_ids)
        if queue:
            left_out = [(i.task_id, i.problem) for i in items if not i.landable]
            self._enqueue(fleet, chosen, left_out)
        else:
            # each task's own test gate (tasks of several repositories may differ)
            self._merge(fleet, chosen, answer.message, None)

    @work(thread=True, exit_on_error=False, group="actions", description="queuing to land")
    def _enqueue(self, fleet: Fleet, task_ids: list[str],
                 left_out: list[tuple[str, str]] | None = None) -> None:
        """Queue ``task_ids``; ``left_out``: (task, why) of the marked tasks the dialog
        showed as unable to land, named in the toast (they stay marked)."""
        tasks = fleet.enqueue(task_ids)
        text = (f"{', '.join(t.id for t in tasks)} land one at a time, in this order (Q "
                "shows the queue)")
        title = f"Queued {len(tasks)} tasks to land"
        if left_out:
            text += "\nLeft out (still marked): " + "; ".join(
                f"{task_id}: {why}" for task_id, why in left_out)
            title = f"Queued {len(tasks)} of {len(tasks) + len(left_out)} tasks to land"
        self.post_message(ActionDone(text, title=title, task_ids=task_ids,
                                     severity="warning" if left_out else "information"))

    @work(thread=True, exit_on_error=False, group="actions", description="merging")
    def _merge(self, fleet: Fleet, task_ids: list[str], message: str | None,
               test_command: str | None) -> None:
        if len(task_ids) > 1:
            def merge_one(task_id: str) -> str | None:
                result = fleet.merge(task_id, message=message, test_command=test_command)
                if result.merged:
                    return None
                return result.message + (
                    f" (conflicts: {', '.join(result.conflicts)})" if result.conflicts else "")

            self.post_message(_each(task_ids, merge_one, "merged", "Merged"))
            return
        for task_id in task_ids:
            result = fleet.merge(task_id, message=message, test_command=test_command)
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
        if targets:
            self._confirm_each(self._engine(), Action.DISCARD, targets)

    def action_kill(self) -> None:
        targets = self.targets()
        if targets:
            self._confirm_each(self._engine(), Action.KILL, targets)

    @work(exclusive=True, exit_on_error=False, group="dialog", description="asking first")
    async def _confirm_each(self, fleet: Fleet, action: Action, targets: list[Task]) -> None:
        """Discard and kill: ask (y / n / escape), then do it to every target."""
        from fleet_tui.ui.screens.modals import ConfirmScreen

        title, body, yes, word = confirm_text(action, targets)
        if await self.app.push_screen_wait(ConfirmScreen(title, body, yes=yes)):
            self._engine_each(fleet, action.value, [t.id for t in targets], word)

    def action_retry(self) -> None:
        targets = self.targets()
        if targets:
            self._retry_flow(self._engine(), targets)

    @work(exclusive=True, exit_on_error=False, group="dialog", description="asking first")
    async def _retry_flow(self, fleet: Fleet, targets: list[Task]) -> None:
        from fleet_tui.ui.screens.modals import ChoiceScreen

        can_resume = all(t.session_id for t in targets)
        choices = [("f", "fresh", "Fresh run")]
        if can_resume:
            choices.append(("r", "resume", "Resume session"))
        body = ("A fresh run starts over from the prompt; the worktree is reset to its "
                "base first (its changes are dropped)."
                + ("\nResume continues the last session, changes and history kept."
                   if can_resume
                   else "\n(No session to resume.)"))
        title = (f"Retry {targets[0].id}" if len(targets) == 1
                 else f"Retry {len(targets)} tasks?")
        if len(targets) > 1:
            body = "\n".join(f"  {t.id}  {t.short_title}  ({t.state})"
                             for t in targets) + "\n\n" + body
        choice = await self.app.push_screen_wait(ChoiceScreen(title, body, choices))
        if choice:
            self._retry(fleet, [t.id for t in targets], choice == "resume")

    @work(thread=True, exit_on_error=False, group="actions", description="retrying")
    def _retry(self, fleet: Fleet, task_ids: list[str], resume: bool) -> None:
        if len(task_ids) > 1:
            def retry_one(task_id: str) -> None:
                fleet.retry(task_id, resume=resume)

            self.post_message(_each(task_ids, retry_one, "queued again",
                                    "Queued", again=" again"))
            return
        for task_id in task_ids:
            fleet.retry(task_id, resume=resume)
            self.post_message(ActionDone("queued again" + (" (resume)" if resume else ""),
                                         title=f"{task_id} retry", task_ids=[task_id]))

    def action_follow_up(self) -> None:
        task = self.cursor_task
        if task is not None:
            self._follow_up_flow(self._engine(), task)

    @work(exclusive=True, exit_on_error=False, group="dialog", description="asking first")
    async def _follow_up_flow(self, fleet: Fleet, task: Task) -> None:
        from fleet_tui.ui.screens.modals import PromptScreen

        prompt = await self.app.push_screen_wait(PromptScreen(
            f"Follow-up for {task.id}: {task.short_title}",
            "Continues the task's session with this prompt, in the same worktree."))
        if prompt:
            self._follow_up(fleet, task.id, prompt)

    @work(thread=True, exit_on_error=False, group="actions", description="following up")
    def _follow_up(self, fleet: Fleet, task_id: str, prompt: str) -> None:
        fleet.follow_up(task_id, prompt)
        self.post_message(ActionDone("follow-up queued", title=task_id, task_ids=[task_id]))

    def action_say(self) -> None:
        task = self.cursor_task
        if task is not None:
            self._say_flow(self._engine(), task)

    @work(exclusive=True, exit_on_error=False, group="dialog", description="asking first")
    async def _say_flow(self, fleet: Fleet, task: Task) -> None:
        from fleet_tui.ui.screens.modals import PromptScreen

        text = await self.app.push_screen_wait(PromptScreen(
            f"Message to {task.id}: {task.short_title}",
            "The running worker gets it as your next message: it joins the turn the "
            "worker is in, or starts its next one (a follow-up, if the worker has "
            "finished by then). The stream shows it when the worker takes it in."))
        if text:
            self._say(fleet, task.id, text)

    @work(thread=True, exit_on_error=False, group="actions",
          description="sending the message")
    def _say(self, fleet: Fleet, task_id: str, text: str) -> None:
        from fleet_tui.core.errors import WorkerFinished
        from fleet_tui.core.policy import why_not

        try:
            taken = fleet.say(task_id, text)
        except WorkerFinished:
            # The worker ended its turn while the message was written: its session takes
            # the text as a follow-up, once this panel's scheduler has recorded the end.
            deadline = time.monotonic() + SAY_SETTLE
            while True:
                task = fleet.get_task(task_id)
                if why_not(task, Action.FOLLOW_UP) is None:
                    fleet.follow_up(task_id, text)
                    self.app.call_from_thread(
                        self.notify, "its worker had finished: sent as a follow-up to the "
                        "same session", title=f"{task_id}: message sent")
                    return
                if task.state not in ACTIVE_STATES or time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)
        self.app.call_from_thread(
            self.notify, "taken by the worker" if taken else
            "waiting for the worker to take it in", title=f"{task_id}: message sent")

    @work(thread=True, exit_on_error=False, group="actions", description="engine call")
    def _engine_each(self, fleet: Fleet, method: str, task_ids: list[str], word: str) -> None:
        call: Callable[[str], Any] = getattr(fleet, method)
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
            self._keep_row = self.table.cursor_row
        if message.details and message.severity == "error":
            from fleet_tui.ui.screens.modals import MessageScreen

            self.app.push_screen(MessageScreen(message.title, message.details))
            self.app.bell()
        else:
            self.notify(message.text, title=message.title,
                        severity=message.severity)  # type: ignore[arg-type]
        self.stream.reread()
        self.poll()

    def on_tool_call_loaded(self, message: ToolCallLoaded) -> None:
        """The stream pane read a whole tool call (x / enter on its line): show it."""
        from fleet_tui.ui.screens.modals import ToolCallScreen

        if self.closing:
            return
        detail = message.detail
        self.app.push_screen(ToolCallScreen(detail.title, detail.status, detail.rows))

    def on_diff_loaded(self, message: DiffLoaded) -> None:
        """The diff pane showed a diff: `e` may apply now."""
        self._maybe_refresh_bindings()

    def on_diff_view_file_highlighted(self) -> None:
        """Another file of the diff: `e` may apply now (the diff view is imported with
        the diff pane's first mount, after the first frame: handled by name)."""
        self._maybe_refresh_bindings()

    # --- actions: landing (issue 12) ------------------------------------------------------
    def action_update(self) -> None:
        task = self.cursor_task
        if task is not None:
            self._update_flow(self._engine(), task.id)

    @work(exclusive=True, exit_on_error=False, group="dialog",
          description="updating from the base branch")
    async def _update_flow(self, fleet: Fleet, task_id: str) -> None:
        """Update from base; on conflicts ask: the worker, a shell, or abort."""
        from fleet_tui.ui.screens.modals import ChoiceScreen, MessageScreen

        result = await asyncio.to_thread(fleet.update, task_id)
        for _ in range(3):  # a shell may leave it conflicted: ask again, a few times
            if self.closing:
                return
            if result.status == "refused":
                self.app.push_screen(MessageScreen(f"{task_id} not updated", result.message))
                self.app.bell()
                return
            if result.status != "conflicts":
                self.notify(result.message, title=f"{task_id} up to date")
                self._after_landing_action(task_id)
                return
            files = "\n".join(f"• {path}" for path in result.conflicts)
            body = (f"{result.message}\n\nConflicted files:\n{files}\n\n"
                    "w: a follow-up asks the worker to resolve them, keep the tests passing "
                    "and commit (its stream shows the work)\no: a shell in the worktree\n"
                    "a: abort: the worktree goes back exactly as it was")
            choice = await self.app.push_screen_wait(ChoiceScreen(
                f"Update of {task_id} stopped on conflicts", body,
                [("w", "worker", "Worker resolves"), ("o", "shell", "Shell"),
                 ("a", "abort", "Abort update")]))
            if choice is None:
                self.notify("Left mid-merge; u again to choose.", title=task_id,
                            severity="warning")
                self._after_landing_action(task_id)
                return
            if choice == "worker":
                await asyncio.to_thread(fleet.resolve_update, task_id, "worker")
                self.notify(f"Sent to its worker: resolve {', '.join(result.conflicts)}.",
                            title=f"{task_id} follow-up queued")
                self.action_show_tab("tab-stream")
                self._after_landing_action(task_id)
                return
            if choice == "abort":
                task = await asyncio.to_thread(fleet.resolve_update, task_id, "abort")
                self.notify(task.message or "aborted", title=f"{task_id} update aborted")
                self._after_landing_action(task_id)
                return
            worktree = self.tasks[task_id].worktree if task_id in self.tasks else None
            if worktree is None:
                return
            shell = os.environ.get("SHELL") or "/bin/sh"
            run_external(self.app, [shell], worktree,
                         f"resolve the conflicts in {worktree}, `git add` them, then exit")
            result = await asyncio.to_thread(fleet.update, task_id)

    def _after_landing_action(self, task_id: str) -> None:
        if task_id == self.selected_id:
            self.diff.reload()
            self.stream.reread()
        self.poll()

    def action_compare(self) -> None:
        task = self.cursor_task
        if task is not None:
            self._compare_flow(self._engine(), task.id)

    @work(exclusive=True, exit_on_error=False, group="dialog",
          description="comparing the copies")
    async def _compare_flow(self, fleet: Fleet, task_id: str) -> None:
        from fleet_tui.ui.screens.landing import CompareScreen

        title, rows = await asyncio.to_thread(compare_rows, fleet, task_id)
        if self.closing:
            return
        answer = await self.app.push_screen_wait(CompareScreen(title, rows, task_id))
        if answer is None:
            return
        what, chosen = answer
        if what == "select":
            if self.table.select_key(chosen):
                self._select(chosen)
                self.action_show_tab("tab-diff")
            return
        await self._pick(fleet, chosen)

    def action_pick(self) -> None:
        task = self.cursor_task
        if task is not None:
            self._pick_flow(self._engine(), task.id)

    @work(exclusive=True, exit_on_error=False, group="dialog", description="picking a copy")
    async def _pick_flow(self, fleet: Fleet, task_id: str) -> None:
        await self._pick(fleet, task_id)

    async def _pick(self, fleet: Fleet, task_id: str) -> None:
        """Ask once, then land the copy through the queue and discard its siblings."""
        from fleet_tui.ui.screens.modals import ConfirmScreen

        copies = await asyncio.to_thread(fleet.copies, task_id)
        siblings = [t for t in copies if t.id != task_id and t.state not in CLOSED_STATES]
        chosen = next((t for t in copies if t.id == task_id), None)
        if chosen is None or self.closing:
            return
        names = "\n".join(f"  {t.id}  {t.short_title}  ({t.state})" for t in siblings)
        body = (f"Land {chosen.id} ({chosen.short_title}) through the merge queue, and "
                f"discard its other copies (their worktrees and branches):\n"
                f"{names or '  (none left)'}")
        if not await self.app.push_screen_wait(ConfirmScreen(f"Pick {chosen.id}?", body,
                                                             yes="Pick")):
            return
        self._pick_now(fleet, task_id)

    @work(thread=True, exit_on_error=False, group="actions", description="picking a copy")
    def _pick_now(self, fleet: Fleet, task_id: str) -> None:
        queued, discarded = fleet.pick(task_id)
        gone = f"; discarded {', '.join(discarded)}" if discarded else ""
        self.post_message(ActionDone(f"queued to land ({queued.land_state}){gone}",
                                     title=f"{task_id} picked", task_ids=[task_id, *discarded]))

    def action_push(self) -> None:
        task = self.cursor_task
        if task is not None:
            self._push(self._engine(), task.id)

    @work(thread=True, exit_on_error=False, group="actions", description="pushing")
    def _push(self, fleet: Fleet, task_id: str) -> None:
        result = fleet.push(task_id)
        details = None
        text = f"{result.remote}/{result.remote_branch} ({result.commit[:10]})"
        if result.hook_output is not None:
            details = f"{result.message}\n\npr_command said:\n{result.hook_output}"
            if not result.hook_passed:
                self.post_message(ActionDone(details, title=f"{task_id} pushed; pr_command "
                                             "failed", severity="error", details=details,
                                             task_ids=[task_id]))
                return
        self.post_message(ActionDone(text, title=f"{task_id} pushed", details=details,
                                     task_ids=[task_id]))

    def action_queue_view(self) -> None:
        from fleet_tui.ui.screens.landing import QueueScreen

        fleet = self._engine()
        self.app.push_screen(QueueScreen(partial(queue_rows, fleet, self.repo)))

    # --- actions: outside programs -------------------------------------------------------
    def action_shell(self) -> None:
        task = self.cursor_task
        if task is None or task.worktree is None:
            return
        shell = os.environ.get("SHELL") or "/bin/sh"
        run_external(self.app, [shell], task.worktree,
                     f"shell in {task.worktree} (exit to come back)")

    def action_edit(self) -> None:
        task = self.selected
        path = self.diff.selected_path
        if task is None or task.worktree is None or path is None:
            return
        target = Path(task.worktree) / path
        if not target.exists():
            self.notify(f"{path} was deleted in this task.", severity="warning")
            return
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
        run_external(self.app, [*shlex.split(editor), str(target)], task.worktree,
                     f"editing {path}")
        self.diff.reload()

    async def action_quit(self) -> None:
        await self.app.action_quit()


def _repository_at(text: str) -> tuple[Path, str]:
    """The main checkout of the repository at (or around) a path, and its branch; GitError
    when there is none."""
    from fleet_tui.vcs import git

    repo = git.main_worktree(Path(os.path.expanduser(text.strip())))
    return repo, git.current_branch(repo) or ""


def _parse(action: str) -> tuple[str, tuple[object, ...]]:
    name, _, args = action.partition("(")
    return name, ((args.rstrip(")").strip("'\""),) if args else ())


def confirm_text(action: Action, targets: list[Task]) -> tuple[str, str, str, str]:
    """(title, body, yes button, past-tense word) of the confirm dialog of a discard or a
    kill of ``targets``."""
    many = f"{len(targets)} task{'s' if len(targets) > 1 else ''}"
    if action is Action.KILL:
        names = "\n".join(f"  {t.id}  {t.short_title}  ({t.state})" for t in targets)
        return (f"Kill {many}?", f"Stop these workers (their whole process group):\n{names}",
                "Kill", "killed")
    names = "\n".join(f"  {t.id}  {t.short_title}" for t in targets)
    body = (f"Delete the worktree and the branch of:\n{names}\n\n"
            "The work in them is lost. The logs stay.")
    live = [t.id for t in targets if t.state in ACTIVE_STATES | PENDING_STATES]
    if live:
        # the engine stops a running or queued task before it discards it
        body += (f"\n{live[0]} is still running or queued: it is stopped first."
                 if len(live) == 1 else
                 f"\n{', '.join(live)} are still running or queued: they are stopped first.")
    return f"Discard {many}?", body, "Discard", "discarded"


def merge_items(fleet: Fleet, task_ids: list[str]) -> tuple[list[MergeItem], str | None]:
    """What the merge dialog shows (the conflict preview of each task) and the test
    command that gates the merge. Runs in a thread: git work."""
    from fleet_tui.core.titles import commit_title
    from fleet_tui.ui.screens.modals import MergeItem

    items = []
    for task_id in task_ids:
        task: Task | None = None
        try:
            task = fleet.get_task(task_id)
            preview = fleet.conflict_preview(task_id)
        except Exception as exc:  # this task's row says why; the others go on
            problem = describe_error(exc)
            if task is None:
                items.append(MergeItem.unlandable(task_id, "", "", "", problem))
            else:
                items.append(MergeItem.unlandable(task.id, task.short_title, task.branch,
                                                  task.base_branch or "the base branch",
                                                  problem))
            continue
        try:  # counted from where the task stands against its base branch now
            added, deleted = fleet.diff_stat(task)
        except Exception:  # a worktree that cannot be read: the stored counts
            added, deleted = task.added_lines, task.deleted_lines
        items.append(MergeItem(task.id, task.short_title, task.branch,
                               task.base_branch or "the base branch", preview.clean,
                               list(preview.conflicts), preview.message, added, deleted,
                               message=commit_title(task.short_title)))
    # the repository's own test gate (.fleet-tui.toml), else the setting; read afresh
    # (for the first task that can land: a damaged row has no repository to ask)
    landable = [i.task_id for i in items if i.landable]
    command = fleet.test_command_for(landable[0]) if landable else None
    return items, command if isinstance(command, str) and command else None


def _each(task_ids: list[str], act: Callable[[str], str | None], word: str, verb: str,
          *, again: str = "") -> ActionDone:
    """Run ``act`` on every task of a bulk action, one failure not stopping the others,
    and say in one message how many it did: ``act`` returns None when it did it, or why
    not (or raises). ``task_ids`` of the message are the ones done (their marks go)."""
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


def poll_problem(fleet: Fleet, error: BaseException) -> str:
    """The start of one sentence for a task list that cannot be read: where from and why
    ("Cannot read the task list from F: file is not a database (DatabaseError)")."""
    from fleet_tui.engine.fleet import FleetError
    from fleet_tui.store.db import StoreError

    where = getattr(getattr(fleet, "store", None), "path", None)
    text = " ".join(str(error).split()).rstrip(".")
    if isinstance(error, FleetError | StoreError) and text:
        cause = text  # written for the user already
    else:
        cause = f"{text} ({type(error).__name__})" if text else type(error).__name__
    return f"Cannot read the task list{f' from {where}' if where else ''}: {cause}"


def compare_rows(fleet: Fleet, task_id: str) -> tuple[str, list[CopyRow]]:
    """What the compare view shows: the copies' title and one row per copy (with its diff
    prepared for painting). Runs in a thread: git work."""
    from fleet_tui.core.titles import commit_title
    from fleet_tui.ui.formatting import PreparedDiff
    from fleet_tui.ui.screens.landing import CopyRow

    reports = fleet.compare(task_id)
    rows = [CopyRow(r.task.id, r.task.short_title, str(r.task.state), r.task.verdict or "",
                    r.task.turns, r.task.input_tokens + r.task.output_tokens, r.added,
                    r.deleted, list(r.files), r.gate, r.merges, r.clean,
                    PreparedDiff.build(r.diff) if r.diff is not None else None)
            for r in reports]
    title = commit_title(reports[0].task.short_title) if reports else task_id
    return title, rows


def queue_rows(fleet: Fleet, repo: Path | None) -> list[QueueRow]:
    """The merge queue view's rows: the queue in landing order, then the tasks it stopped
    (they wait for the user). Runs in a thread: the store."""
    from fleet_tui.core.states import LandState
    from fleet_tui.ui.screens.landing import QueueRow

    fleet.resume_queues()  # a queue whose runner was killed gets one again
    queue = fleet.landing_queue(repo)
    stopped = [t for t in fleet.list_tasks(repo) if t.land_state == LandState.STOPPED
               and t.state not in CLOSED_STATES]
    return [QueueRow(t.id, t.short_title, t.land_state or "", t.land_note or "",
                     str(t.state), t.land_fixes) for t in [*queue, *stopped]]
