"""The task list: the tasks as last read, the marks, the filter, the sort, the selection,
the polling of the store and the toasts of what changed in it.

The table (widgets/task_table.py) paints what this hands it; the detail below follows the
selection (``DetailController.refresh``).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from textual.widgets import Input, Label

from fleet_tui.core.states import CLOSED_STATES, PENDING_STATES, STATES
from fleet_tui.ui.controllers import Controller, Handlers, PanelScreen, Receivers, screen_work
from fleet_tui.ui.formatting import change_label
from fleet_tui.ui.messages import (
    BestPicked,
    PollFailed,
    SettingsChecked,
    TasksLoaded,
    TasksSubmitted,
)
from fleet_tui.ui.widgets.status_line import StatusLine
from fleet_tui.ui.widgets.task_table import SORTS, TaskTable, sort_tasks

if TYPE_CHECKING:
    from fleet_tui.core.model import Task
    from fleet_tui.core.states import TaskState
    from fleet_tui.engine.fleet import Fleet, FleetStatus


class TaskListController(Controller):
    """What the list shows and which task is selected."""

    def bindings(self) -> Handlers:
        return {"task.mark": self.toggle_mark, "task.mark_all": self.mark_all,
                "task.unmark_all": self.unmark_all, "list.filter": self.open_filter,
                "list.clear": self.clear_filter, "list.closed": self.toggle_closed,
                "list.sort": self.cycle_sort, "view.list": self.table.focus}

    def receives(self) -> Receivers:
        return {PollFailed: self.poll_failed, SettingsChecked: self.settings_checked,
                BestPicked: self.best_picked, TasksSubmitted: self.tasks_submitted}

    def __init__(self, screen: PanelScreen) -> None:
        super().__init__(screen)
        self.table = screen.table
        self.tasks: dict[str, Task] = {}
        self.marked: set[str] = set()
        self.filter_text = ""
        self.show_closed = False  # merged and discarded tasks are listed (H)
        self.sort_mode = "attention"  # one of SORTS (S cycles)
        self.closed_hidden = 0  # how many closed tasks the list leaves out now
        self.selected_id: str | None = None
        self.status: FleetStatus | None = None
        self.poll_error: str | None = None  # why the task list could not be read, if so
        self._poll_lock = threading.Lock()
        self._polled = False  # a task list was read once
        self._notice_shown: str | None = None
        self._seen_states: dict[str, TaskState] | None = None
        self._picks_since = time.time()  # groups decided before the panel opened: not told
        self._picks_told: set[str] = set()
        self._cooldown_seen: float | None = None
        # each endpoint's latest event (park, hold, cap) as last notified: one toast each
        self._endpoint_events: dict[str, tuple[str | None, float | None]] | None = None
        self._keep_row: int | None = None
        self._select_pending = False

    # --- which tasks -----------------------------------------------------------------------
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

    # --- polling the store -----------------------------------------------------------------
    def poll(self) -> None:
        fleet = self.screen.fleet
        if fleet is not None and self._poll_lock.acquire(blocking=False):
            self._load_tasks(fleet)

    @screen_work(thread=True, group="poll", description="reading the task list")
    def _load_tasks(self, fleet: Fleet) -> None:
        screen = self.screen
        try:
            try:
                tasks = fleet.list_tasks()
                status = fleet.status(tasks)
                if not screen.run_scheduler:  # the scheduler's passes do it otherwise
                    fleet.resume_queues()
            except Exception as exc:  # whatever the store raises: said, and polled again
                screen.post_message(PollFailed(poll_problem(fleet, exc)))
                return
            screen.post_message(TasksLoaded(tasks, status, time.monotonic()))
            # settings edited while the panel runs: config.toml, the repositories' files
            repos = {t.repo for t in tasks} | ({screen.repo} if screen.repo else set())
            notices = fleet.check_settings(repos)
            if notices:
                screen.post_message(SettingsChecked(notices))
            # best of N: a group decided (auto_pick) since the panel opened
            try:
                picks = [p for p in fleet.best_picks_since(self._picks_since)
                         if p.group_id not in self._picks_told]
            except Exception:  # the store's trouble is the list's to say; next poll
                picks = []
            if picks:
                screen.post_message(BestPicked(picks))
        finally:
            self._poll_lock.release()

    def settings_checked(self, message: SettingsChecked) -> None:
        """Settings reloaded (said briefly), or an edit that is not used (said until read:
        the previous settings stay)."""
        for notice in message.notices:
            error = notice.severity == "error"
            self.screen.notify(notice.message, title=notice.title,
                               severity="error" if error else "information",
                               timeout=15 if error else 5)

    def best_picked(self, message: BestPicked) -> None:
        """One toast per group of copies decided on its own (auto_pick): the winner and
        why, or that none passed."""
        for pick in message.picks:
            if pick.group_id in self._picks_told:
                continue
            self._picks_told.add(pick.group_id)
            if pick.task_id is None:
                self.screen.notify(pick.reason, title="Best of N: none passed",
                                   severity="warning", timeout=15, markup=False)
            else:
                self.screen.notify(pick.reason, title=f"{pick.task_id} picked as the best",
                                   timeout=15, markup=False)

    def poll_failed(self, message: PollFailed) -> None:
        """The list cannot be read: say why where the list is, keep what was read last
        (never an empty list that claims there are no tasks); the next poll tries again."""
        self.poll_error = message.problem + (
            "; showing the last list read and trying again." if self._polled
            else "; trying again.")
        self.show_notice()

    def tasks_loaded(self, message: TasksLoaded) -> None:
        self.poll_error = None
        self._polled = True
        self.tasks = {t.id: t for t in message.tasks}
        self.status = message.status
        self.marked &= set(self.tasks)
        selected = self.selected_id
        self.screen.stream.show_slot_waits(
            message.status.slot_waits.get(selected, 0) if selected else 0)
        self.screen.stream.show_host_wait(self._host_wait(selected))
        self._alert_transitions(message.tasks, message.status)
        self.render()

    def tasks_submitted(self, message: TasksSubmitted) -> None:
        """New tasks from the launch form: listed at once, the filter cleared, the first
        selected with its stream shown."""
        for task in message.tasks:
            self.tasks[task.id] = task
        self.filter_text = ""
        box = self.screen.filter_box
        if box is not None:
            box.value = ""
            box.display = False
        self.render()
        if message.tasks:
            first = message.tasks[0]
            self.table.select_key(first.id)
            self.select(first.id)
            self.screen.detail.show_tab("tab-stream")
            self.table.focus()
            n = len(message.tasks)
            self.screen.notify(f"{first.short_title}" + (f" ×{n}" if n > 1 else ""),
                               title=f"Queued {', '.join(t.id for t in message.tasks)}")
        self.poll()

    def keep_row_of(self, task_ids: list[str]) -> None:
        """An action on these tasks is done: their marks go, and when the selected one is
        among them the cursor stays on its row, so the next task is under it when the task
        sinks to the history at the bottom (lazygit does the same)."""
        self.marked -= set(task_ids)
        if self.selected_id in task_ids:
            self._keep_row = self.table.cursor_row

    # --- toasts of what changed ------------------------------------------------------------
    def _alert_transitions(self, tasks: list[Task], status: FleetStatus) -> None:
        """Toast and bell when a task finishes, fails or stalls, or a cooldown starts."""
        from fleet_tui.core.policy import STOPS  # in sys.modules: the engine imported it

        screen = self.screen
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
                screen.notify(f"{task.short_title}{detail}", title=f"{task.id} {word}",
                              severity=severity,  # type: ignore[arg-type]
                              timeout=8)
                screen.app.bell()
            cooldown = status.cooldown_until
            if cooldown is not None and cooldown > screen.now() \
                    and cooldown != self._cooldown_seen and self._cooldown_seen is None:
                screen.notify(f"The endpoint asked us to slow down; new attempts wait "
                              f"{int(cooldown - screen.now())} s.", title="Endpoint cooldown",
                              severity="warning", timeout=8)
                screen.app.bell()
        self._cooldown_seen = status.cooldown_until if (
            status.cooldown_until is not None
            and status.cooldown_until > screen.now()) else None
        self._seen_states = states
        self._alert_endpoints(tasks, status)

    def _alert_endpoints(self, tasks: list[Task], status: FleetStatus) -> None:
        """One toast per endpoint event (a park, a hold, a lowered cap), however many tasks
        it concerns; what is already so when the panel opens is shown, not announced."""
        screen = self.screen
        events = {e.endpoint: (e.event, e.event_at) for e in status.endpoints}
        seen = self._endpoint_events
        self._endpoint_events = events
        if seen is None:
            return
        for ep in status.endpoints:
            if ep.event is None or seen.get(ep.endpoint) == (ep.event, ep.event_at):
                continue
            whose = "" if ep.endpoint == "default" else f"{ep.endpoint} "
            waiting = sum(1 for t in tasks if t.endpoint == ep.endpoint
                          and t.state in PENDING_STATES)
            tasks_word = f"{waiting} task{'' if waiting == 1 else 's'}"
            if ep.event == "hold" and ep.held is not None and ep.budget:
                screen.notify(f"{ep.held}\n{tasks_word} held; running tasks go on.",
                              title="Endpoint budget met", severity="warning", timeout=15,
                              markup=False)
            elif ep.event == "hold" and ep.held is not None:
                met = f"task {ep.held_task} failed: " if ep.held_task else ""
                screen.notify(f"{met}{ep.held}\n{tasks_word} held until you retry "
                              f"{ep.held_task or 'it'} or change the settings.",
                              title=f"Endpoint {whose}held", severity="error", timeout=15,
                              markup=False)
            elif ep.event == "park" and ep.parked_until is not None \
                    and ep.parked_until > screen.now():
                from fleet_tui.core.policy import park_text

                park = park_text(ep.parked_until, ep.park_reason, screen.now())
                screen.notify(f"{park}; {tasks_word} wait for it.",
                              title=f"Endpoint {whose}parked", severity="warning", timeout=10,
                              markup=False)
            elif ep.event == "cap" and ep.cap < ep.max_workers:
                why = f" ({ep.cap_reason})" if ep.cap_reason else ""
                screen.notify(f"cap {ep.cap}/{ep.max_workers}{why}: fewer workers at once "
                              "until the endpoint takes more.",
                              title=f"Endpoint {whose}concurrency limit", severity="warning",
                              timeout=8, markup=False)
            else:
                continue
            screen.app.bell()

    # --- what the list shows ---------------------------------------------------------------
    def visible_tasks(self) -> list[Task]:
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

    def render(self) -> None:
        table = self.table
        visible = self.visible_tasks()
        table.show(visible, self.marked, self.screen.now(),
                   self.status.costs if self.status is not None else None,
                   self.status.uncaged if self.status is not None else frozenset())
        if self._keep_row is not None and self.selected is not None \
                and self.selected.state in CLOSED_STATES and visible:
            row = min(self._keep_row, len(visible) - 1)
            self._keep_row = None
            table.move_cursor(row=row, animate=False, scroll=True)
            self.select(visible[row].id)
        self.show_notice()
        self.show_status()
        if self.selected_id is None or self.selected_id not in {t.id for t in visible}:
            key = table.selected_key
            if key is not None:
                self.select(key)
            elif not visible and self.selected_id is not None:
                self.select(None)
        else:
            self.screen.detail.refresh()
        self.screen.refresh_keys()

    def show_notice(self) -> None:
        notice = self.screen.query_one("#list-notice", Label)
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

    def show_status(self) -> None:
        screen = self.screen
        status = screen.query_one(StatusLine)
        status.repo_name = screen.repo.name if screen.repo else "all repositories"
        status.marked = len(self.marked)
        notes = [] if self.sort_mode == "attention" else [SORTS[self.sort_mode]]
        if self.closed_hidden:
            notes.append(f"{self.closed_hidden} closed hidden (H)")
        status.view_note = " · ".join(notes)
        status.show(self.status, screen.now())

    # --- selection -------------------------------------------------------------------------
    def row_highlighted(self, event: TaskTable.RowHighlighted) -> None:
        if event.key != self.selected_id and not self._select_pending:
            # Paint the moved cursor first, then switch the views below to the task: a
            # key held down gets one frame per press and one switch per frame.
            self._select_pending = True
            self.screen.call_after_refresh(self._select_highlighted)

    def _select_highlighted(self) -> None:
        self._select_pending = False
        key = self.table.selected_key
        if key != self.selected_id:
            self.select(key)

    def _host_wait(self, task_id: str | None) -> str | None:
        """Why the task waits for its host ("waiting: host box at its 2 workers")."""
        task = self.tasks.get(task_id) if task_id else None
        if task is None or self.status is None or task.state not in PENDING_STATES:
            return None
        return self.status.host_waits.get(task.host)

    def select(self, task_id: str | None) -> None:
        self.selected_id = task_id
        waits = self.status.slot_waits if self.status is not None else {}
        self.screen.stream.show_slot_waits(waits.get(task_id, 0) if task_id else 0)
        self.screen.stream.show_host_wait(self._host_wait(task_id))
        self.screen.detail.refresh(new=True)
        self.screen.refresh_keys()

    # --- marks, filter, order --------------------------------------------------------------
    def toggle_mark(self) -> None:
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

    def mark_all(self) -> None:
        """Mark every task the list shows (a filter narrows it)."""
        self.marked |= set(self.table.keys)
        self._marks_changed()

    def unmark_all(self) -> None:
        self.marked.clear()
        self._marks_changed()

    def _marks_changed(self) -> None:
        self.table.set_marked(self.marked)
        self.show_status()
        self.screen.refresh_keys()

    def open_filter(self) -> None:
        box = self.screen.filter_box
        if box is None:  # pressed in the frame before it is mounted
            self.screen.call_after_refresh(self.open_filter)
            return
        box.display = True
        box.focus()
        self.screen.refresh_keys()

    def filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value
        self.render()

    def filter_submitted(self) -> None:
        box = self.screen.query_one("#filter", Input)
        if not box.value:
            box.display = False
        self.table.focus()

    def clear_filter(self) -> None:
        box = self.screen.filter_box
        self.filter_text = ""
        if box is not None:
            box.value = ""
            box.display = False
        self.table.focus()
        self.render()

    def toggle_closed(self) -> None:
        """Show or hide the merged and discarded tasks (hidden at first)."""
        self.show_closed = not self.show_closed
        self.render()
        self.screen.notify(
            "Merged and discarded tasks are listed (H hides them)." if self.show_closed
            else "Merged and discarded tasks are hidden (H shows them).",
            title="Closed tasks", timeout=3)

    def cycle_sort(self) -> None:
        """The next order of the list: needs you first, newest, repository, state."""
        modes = list(SORTS)
        self.sort_mode = modes[(modes.index(self.sort_mode) + 1) % len(modes)]
        self.render()
        self.screen.notify(f"Sorted {SORTS[self.sort_mode]} (S: the next order).",
                           title="Sort", timeout=3)


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
