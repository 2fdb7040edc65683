"""The main screen: the task list on top, the selected task's stream and diff below.

The screen composes the panel, says what the keys do and when they apply (ui/actions.py),
which pane has them, and wires the engine in. The work behind the keys is its controllers'
(ui/controllers/): the list, the marks, the filter and the polling (``task_list``); the
engine actions and their dialogs (``landing``); the detail title, the tabs and the panes'
keys (``detail``). The panes own their own reading: the stream (widgets/stream_pane.py) and
the diff (widgets/diff_pane.py).

It gets what it needs as arguments (``FleetApp.get_default_screen``) and the engine when it
is ready (``engine_ready``, on the app's EngineReady); it never imports the app. Every engine
call runs in a worker of this screen; results come back as messages (ui/messages.py), and a
failed worker becomes one error toast in the app (``WorkerFailed``).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import ContentSwitcher, Input, Label
from textual.worker import Worker

from fleet_tui.ui.actions import (
    ACTIONS,
    IN_BROWSER_EDITOR,
    IN_BROWSER_SHELL,
    KEY_BAR_ORDER,
    KEY_BAR_PINNED,
    Context,
    PanelAction,
    find,
)
from fleet_tui.ui.controllers import PanelScreen
from fleet_tui.ui.controllers.detail import DetailController
from fleet_tui.ui.controllers.landing import LandingController
from fleet_tui.ui.controllers.review import ReviewController
from fleet_tui.ui.controllers.task_list import TaskListController
from fleet_tui.ui.external import run_external
from fleet_tui.ui.messages import (
    ActionDone,
    BestPicked,
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
from fleet_tui.ui.widgets.task_table import TaskTable

if TYPE_CHECKING:
    from fleet_tui.engine.fleet import FleetStatus
    from fleet_tui.store.db import Task
    from fleet_tui.ui.screens.help import HelpSection

PaletteCommand = tuple[str, str, Callable[[], object]]
"""(title, help, callback) of one command palette entry."""


class MainScreen(PanelScreen):
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
            ("shift+↑ ↓", "diff: select a range of lines (C comments on them all)"),
            ("enter", "filter: apply and go back to the list"),
        ]),
        ("In dialogs", [
            ("y / n / escape", "confirm, refuse, cancel"),
            ("ctrl+s", "submit the launch form, a follow-up or a merge"),
            ("e", "merge: edit the commit message (enter: done; y and n are typed there)"),
            ("e / d / s", "review: edit, delete the highlighted comment; send them all"),
            ("w / o / a", "update stopped on conflicts: the worker, a shell, abort"),
            ("f / r", "retry: a fresh run or resume the session"),
            ("ctrl+p", "command palette: every action by name"),
        ]),
    ]

    def __init__(self, *, repo: Path | None = None, clock: Callable[[], float] = time.time,
                 run_scheduler: bool = True, poll_interval: float = 0.5,
                 diff_interval: float = 2.0, stream_interval: float = 0.1,
                 keymap: Mapping[str, str] | None = None, served: bool = False) -> None:
        """``repo``: where new tasks start, when known before the engine is made (the
        engine's EngineReady says it otherwise); ``clock``: what "now" is for durations
        and cooldowns; ``run_scheduler``: whether this panel starts queued tasks (said in
        the header); the intervals: how often the list, a running task's diff and a
        running attempt's events are read; ``keymap``: binding id -> keys, as given to the
        app (help and palette name the keys it sets); ``served``: the panel is in a browser
        (`fleet-tui serve`), where a shell or an editor would open on the server."""
        super().__init__(id="main")
        self.served = served
        self.fleet = None
        self.repo = repo
        self.default_base = ""
        self.clock = clock
        self.run_scheduler = run_scheduler
        self.poll_interval = poll_interval
        self.keymap: Mapping[str, str] = dict(keymap or {})
        self.closing = False
        self.ready = asyncio.Event()
        self._bindings_signature: object = None
        self._hidden_started = False
        self._hidden_done = asyncio.Event()
        self.filter_box = None
        self.table = TaskTable(id="tasks")
        self.stream = StreamPane(interval=stream_interval, hints=self._caption_hints(),
                                 id="tab-stream")
        self.diff = DiffPane(interval=diff_interval, id="tab-diff")
        self.task_list = TaskListController(self)
        self.landing = LandingController(self)
        self.detail = DetailController(self)
        self.review = ReviewController(self)

    # --- the controllers' state, as the screen's (tests and the app read these) -----------
    @property
    def tasks(self) -> dict[str, Task]:
        return self.task_list.tasks

    @property
    def marked(self) -> set[str]:
        return self.task_list.marked

    @property
    def selected_id(self) -> str | None:
        return self.task_list.selected_id

    @property
    def cursor_task(self) -> Task | None:
        return self.task_list.cursor_task

    @property
    def status(self) -> FleetStatus | None:
        return self.task_list.status

    @property
    def poll_error(self) -> str | None:
        return self.task_list.poll_error

    @property
    def filter_text(self) -> str:
        return self.task_list.filter_text

    @filter_text.setter
    def filter_text(self, text: str) -> None:
        self.task_list.filter_text = text

    @property
    def sort_mode(self) -> str:
        return self.task_list.sort_mode

    @property
    def show_closed(self) -> bool:
        return self.task_list.show_closed

    @property
    def closed_hidden(self) -> int:
        return self.task_list.closed_hidden

    @property
    def active_tab(self) -> str:
        """The view shown below the list: "tab-stream" or "tab-diff"."""
        return self.detail.active_tab

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
            self.filter_box = box  # kept: a query per key-bar check costs ~0.3 ms
            if self._going(self.stream):
                return
            await self.stream.mount_search()
            if self._going(self.diff):
                return
            await self.diff.mount_view()
            if not self.closing:
                self.refresh_keys()
        finally:
            self._hidden_done.set()

    def _going(self, widget: Widget) -> bool:
        """The panel is closing, or `widget` is no longer in a live DOM."""
        return self.closing or not widget.is_attached or widget._closing or widget._pruning

    def on_mount(self) -> None:
        status = self.query_one(StatusLine)
        status.scheduler = self.run_scheduler
        self.task_list.show_status()
        self.table.focus()

    def engine_ready(self, ready: EngineReady) -> None:
        """The engine is made: read the list now and every poll interval; the panes can
        read streams and diffs; a launch form asked for before opens."""
        self.fleet = ready.fleet
        self.repo = ready.repo
        self.default_base = ready.default_base
        self.stream.fleet = ready.fleet
        self.diff.start(ready.fleet)
        self.set_interval(self.poll_interval, self.task_list.poll)
        self.set_interval(1.0, self.task_list.show_status)
        self.task_list.poll()
        self.task_list.show_status()
        self.ready.set()

    # --- messages: handed to the controllers ------------------------------------------------
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """StateChanged does not bubble: hand failures to the app's one handler."""
        report_failure(self, event)

    async def on_tasks_loaded(self, message: TasksLoaded) -> None:
        await self.mount_hidden()
        self.task_list.tasks_loaded(message)

    def on_poll_failed(self, message: PollFailed) -> None:
        self.task_list.poll_failed(message)

    def on_settings_checked(self, message: SettingsChecked) -> None:
        self.task_list.settings_checked(message)

    def on_best_picked(self, message: BestPicked) -> None:
        self.task_list.best_picked(message)

    def on_tasks_submitted(self, message: TasksSubmitted) -> None:
        self.task_list.tasks_submitted(message)

    def on_action_done(self, message: ActionDone) -> None:
        self.landing.action_done(message)

    def on_tool_call_loaded(self, message: ToolCallLoaded) -> None:
        self.detail.tool_call_loaded(message)

    def on_diff_loaded(self, message: DiffLoaded) -> None:
        """The diff pane showed a diff: `e` may apply now."""
        self.refresh_keys()

    def on_comments_loaded(self) -> None:
        """The selected task's review comments were read: ctrl+r may apply now."""
        self.refresh_keys()

    def on_diff_view_file_highlighted(self) -> None:
        """Another file of the diff: `e` may apply now (the diff view is imported with
        the diff pane's first mount, after the first frame: handled by name)."""
        self.refresh_keys()

    @on(TaskTable.RowHighlighted, "#tasks")
    def _row_highlighted(self, event: TaskTable.RowHighlighted) -> None:
        self.task_list.row_highlighted(event)

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.task_list.filter_changed(event)

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self) -> None:
        self.task_list.filter_submitted()

    @on(TabBar.Changed)
    def _tab_chosen(self, event: TabBar.Changed) -> None:
        self.detail.switch_to(event.tab)

    # --- what applies now: the action records ----------------------------------------------
    def context(self) -> Context:
        """What the action guards look at (ui/actions.py)."""
        table = self.table
        box = self.filter_box
        marked = self.task_list.marked
        shown = table.row_count
        unmarked_shown = shown > len(marked) or (
            shown > 0 and not set(table.keys) <= marked)
        return Context(targets=self.task_list.targets(), cursor=self.task_list.cursor_task,
                       selected=self.task_list.selected, marked=len(marked),
                       unmarked_shown=unmarked_shown, diff_file=self.diff.selected_path,
                       filtering=bool(self.task_list.filter_text)
                       or (box is not None and box.display),
                       in_view=self.keys_pane not in ("list", "filter", ""),
                       served=self.served,
                       diff_files=self.diff.file_count if self.active_tab == "tab-diff"
                       else 0,
                       in_diff=self.keys_pane == "diff", unsent=self._unsent())

    def _unsent(self) -> int:
        """The selected task's review comments not sent yet, as last read with its diff."""
        task = self.task_list.selected
        return 0 if task is None else sum(1 for c in self.diff.comments_of(task.id)
                                          if not c.sent)

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

    def refresh_keys(self) -> None:
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

    # --- which pane has the keys -------------------------------------------------------------
    PANE_NOTES: dict[str, str] = {
        "list": "keys: task list",
        "stream": "keys: stream (↑↓ lines, x expand) · esc: task list",
        "diff-files": "keys: diff files (↑↓) · esc: task list",
        "diff": "keys: diff (↑↓ lines, C comment, R review) · esc: task list",
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
        if focused is self.filter_box:
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
        self.refresh_keys()

    # --- actions: the list ---------------------------------------------------------------
    def action_toggle_mark(self) -> None:
        self.task_list.toggle_mark()

    def action_mark_all(self) -> None:
        self.task_list.mark_all()

    def action_unmark_all(self) -> None:
        self.task_list.unmark_all()

    def action_filter(self) -> None:
        self.task_list.open_filter()

    def action_clear_filter(self) -> None:
        self.task_list.clear_filter()

    def action_toggle_closed(self) -> None:
        self.task_list.toggle_closed()

    def action_cycle_sort(self) -> None:
        self.task_list.cycle_sort()

    def action_focus_list(self) -> None:
        self.table.focus()

    def action_help(self) -> None:
        from fleet_tui.ui.screens.help import HelpScreen

        # One help screen, installed, kept while its keys stay the same: composing it and
        # laying out its tables again took 150-400 ms a press (more than a frame in a
        # browser); shown again it is a screen switch.
        sections = self.help_sections()
        name = "fleet-help"
        if self.app.is_screen_installed(name):
            installed = self.app.get_screen(name)
            if isinstance(installed, HelpScreen) and installed.sections == sections:
                self.app.push_screen(name)
                return
            self.app.uninstall_screen(name)
        self.app.install_screen(HelpScreen(sections), name)
        self.app.push_screen(name)

    # --- actions: the views below --------------------------------------------------------
    def action_show_tab(self, tab: str) -> None:
        self.detail.show_tab(tab)

    def action_toggle_tools(self) -> None:
        self.detail.toggle_tools()

    def action_toggle_raw(self) -> None:
        self.detail.toggle_raw()

    def action_toggle_follow(self) -> None:
        self.detail.toggle_follow()

    def action_expand(self) -> None:
        self.detail.expand()

    def action_search(self) -> None:
        self.detail.search()

    def action_choose_attempt(self) -> None:
        self.detail.choose_attempt()

    def action_next_file(self) -> None:
        self.detail.jump_file(1)

    def action_prev_file(self) -> None:
        self.detail.jump_file(-1)

    def action_next_hunk(self) -> None:
        self.detail.jump_hunk(1)

    def action_prev_hunk(self) -> None:
        self.detail.jump_hunk(-1)

    def action_toggle_viewed(self) -> None:
        self.detail.toggle_viewed()

    # --- actions: the engine -------------------------------------------------------------
    def action_new_task(self) -> None:
        self.landing.new_task()

    def action_merge(self) -> None:
        self.landing.merge()

    def action_discard(self) -> None:
        self.landing.discard()

    def action_kill(self) -> None:
        self.landing.kill()

    def action_retry(self) -> None:
        self.landing.retry()

    def action_follow_up(self) -> None:
        self.landing.follow_up()

    def action_say(self) -> None:
        self.landing.say()

    def action_update(self) -> None:
        self.landing.update()

    def action_compare(self) -> None:
        self.landing.compare()

    def action_pick(self) -> None:
        self.landing.pick()

    def action_push(self) -> None:
        self.landing.push()

    def action_queue_view(self) -> None:
        self.landing.queue_view()

    def action_comment(self) -> None:
        self.review.comment()

    def action_review(self) -> None:
        self.review.review()

    def action_send_review(self) -> None:
        self.review.send()

    # --- actions: outside programs -------------------------------------------------------
    def action_shell(self) -> None:
        if self.served:  # its guard dims the key; a keymap or the palette may still ask
            self.explain(IN_BROWSER_SHELL)
            return
        task = self.task_list.cursor_task
        if task is None or task.worktree is None or self.fleet is None:
            return
        if self.fleet.worktree_here(task) is None:
            self.notify(self.fleet.elsewhere(task), severity="warning", markup=False)
            return
        shell = os.environ.get("SHELL") or "/bin/sh"
        run_external(self.app, [shell], task.worktree,
                     f"shell in {task.worktree} (exit to come back)")

    def action_edit(self) -> None:
        if self.served:
            self.explain(IN_BROWSER_EDITOR)
            return
        task = self.task_list.selected
        path = self.diff.selected_path
        if task is None or task.worktree is None or path is None or self.fleet is None:
            return
        if self.fleet.worktree_here(task) is None:
            self.notify(self.fleet.elsewhere(task), severity="warning", markup=False)
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


def _parse(action: str) -> tuple[str, tuple[object, ...]]:
    name, _, args = action.partition("(")
    return name, ((args.rstrip(")").strip("'\""),) if args else ())
