"""Below the list: the selected task's detail title, the Stream | Diff tabs, and the keys
of the stream and diff panes (the panes do their own reading: widgets/stream_pane.py and
widgets/diff_pane.py)."""

from __future__ import annotations

import asyncio
import os
import shlex
import threading
from collections import deque
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text
from textual.widgets import ContentSwitcher, Label

from fleet_tui.core.states import TaskState
from fleet_tui.ui.actions import IN_BROWSER_EDITOR
from fleet_tui.ui.controllers import Controller, Handlers, PanelScreen, Receivers, screen_work
from fleet_tui.ui.external import run_external
from fleet_tui.ui.formatting import attempt_label, landing_label, pushed_label
from fleet_tui.ui.messages import ToolCallLoaded
from fleet_tui.ui.widgets.bars import TabBar

if TYPE_CHECKING:
    from fleet_tui.core.model import Task
    from fleet_tui.engine.fleet import Fleet
    from fleet_tui.ui.widgets.diff_view import ViewedChange


class DetailController(Controller):
    """Hands the selected task to the panes and switches the view below the list."""

    def __init__(self, screen: PanelScreen) -> None:
        super().__init__(screen)
        self.stream = screen.stream
        self.diff = screen.diff
        self._title_shown = ""
        # viewed marks toggled and not yet in the store (written in a thread, in order)
        self._marks: deque[ViewedChange] = deque()
        self._marks_lock = threading.Lock()

    def bindings(self) -> Handlers:
        return {"view.stream": partial(self.show_tab, "tab-stream"),
                "view.diff": partial(self.show_tab, "tab-diff"),
                "stream.tools_only": self.toggle_tools, "stream.raw": self.toggle_raw,
                "stream.attempt": self.choose_attempt, "stream.follow": self.toggle_follow,
                "stream.expand": self.expand, "view.search": self.search,
                "diff.next_file": partial(self.jump_file, 1),
                "diff.prev_file": partial(self.jump_file, -1),
                "diff.next_hunk": partial(self.jump_hunk, 1),
                "diff.prev_hunk": partial(self.jump_hunk, -1),
                "diff.viewed": self.toggle_viewed, "task.edit": self.edit}

    def receives(self) -> Receivers:
        return {ToolCallLoaded: self.tool_call_loaded}

    def refresh(self, *, new: bool = False) -> None:
        """Update the detail title; hand the task to the stream and the diff panes
        (``new``: another task than before)."""
        task = self.screen.task_list.selected
        title = self.screen.query_one("#detail-title", Label)
        if task is None:
            title.update("")
            self._title_shown = ""
        else:
            text = detail_title(task)
            if text.plain != self._title_shown:
                self._title_shown = text.plain
                title.update(text)
        if new or task is not None:
            self.stream.show(task)
        self.diff.show(task, new=new)

    # --- the tabs --------------------------------------------------------------------------
    @property
    def active_tab(self) -> str:
        """The view shown below the list: "tab-stream" or "tab-diff"."""
        return self.screen.query_one(ContentSwitcher).current or "tab-stream"

    def show_tab(self, tab: str) -> None:
        """`1` / `2`: the view below changes, the keys stay on (or come back to) the task
        list, so ↑ ↓ move the tasks and the task keys act on the row the list highlights."""
        self.screen.query_one(TabBar).active = tab
        self.screen.table.focus()
        self.switch_to(tab)

    def switch_to(self, tab: str) -> None:
        # A focused widget that is hidden hands the focus to the next one Textual finds
        # (the diff's file list): ↑ ↓ then moved nothing the user could see. It goes back to
        # the list instead.
        focused = self.screen.focused
        switcher = self.screen.query_one(ContentSwitcher)
        if focused is not None and switcher.current and tab != switcher.current and any(
                node.id == switcher.current for node in focused.ancestors_with_self):
            self.screen.table.focus()
        switcher.current = tab
        self.diff.set_shown(tab == "tab-diff")

    # --- the stream's and the diff's keys ----------------------------------------------------
    def toggle_tools(self) -> None:
        self.stream.tools_only = not self.stream.tools_only

    def toggle_raw(self) -> None:
        self.stream.raw = not self.stream.raw

    def toggle_follow(self) -> None:
        self.stream.follow = not self.stream.follow

    def expand(self) -> None:
        if self.active_tab != "tab-stream":
            self.show_tab("tab-stream")
        self.stream.expand_tool_call()

    def search(self) -> None:
        if self.active_tab == "tab-diff":
            self.diff.open_search()
        else:
            self.stream.open_search()

    # the diff's reading aids: they act on the diff on screen
    def jump_file(self, step: int) -> None:
        view = self.diff.view
        if view is not None and not view.jump_file(step):
            self._edge("file", step)

    def jump_hunk(self, step: int) -> None:
        view = self.diff.view
        if view is not None and not view.jump_hunk(step):
            self._edge("hunk", step)

    def _edge(self, what: str, step: int) -> None:
        self.screen.notify(f"No {'next' if step > 0 else 'previous'} {what}.",
                           timeout=2)

    def toggle_viewed(self) -> None:
        view = self.diff.view
        if view is None:
            return
        change = view.toggle_viewed()  # the file list says ✓ at once
        if change is not None:  # and the store keeps it, in the keys' order
            self._marks.append(change)
            self._save_marks(self.screen.engine())

    def edit(self) -> None:
        """The highlighted diff file in $VISUAL / $EDITOR (this machine's terminal)."""
        screen = self.screen
        if screen.served:  # its guard dims the key; a keymap or the palette may still ask
            screen.explain(IN_BROWSER_EDITOR)
            return
        task = screen.task_list.selected
        path = self.diff.selected_path
        if task is None or task.worktree is None or path is None or screen.fleet is None:
            return
        if screen.fleet.worktree_here(task) is None:
            screen.notify(screen.fleet.elsewhere(task), severity="warning", markup=False)
            return
        target = Path(task.worktree) / path
        if not target.exists():
            screen.notify(f"{path} was deleted in this task.", severity="warning")
            return
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
        run_external(screen.app, [*shlex.split(editor), str(target)], task.worktree,
                     f"editing {path}")
        self.diff.reload()

    @screen_work(thread=True, group="viewed", description="keeping the viewed mark")
    def _save_marks(self, fleet: Fleet) -> None:
        with self._marks_lock:  # one writer at a time: v v ends unviewed in the store too
            while self._marks:
                change = self._marks.popleft()
                fleet.mark_viewed(change.task_id, change.path, change.digest)

    def choose_attempt(self) -> None:
        task = self.screen.task_list.selected
        if task is not None:
            self._choose_attempt(self.screen.engine(), task.id)

    @screen_work(exclusive=True, group="dialog", description="listing attempts")
    async def _choose_attempt(self, fleet: Fleet, task_id: str) -> None:
        from fleet_tui.ui.screens.modals import AttemptScreen

        attempts = await asyncio.to_thread(fleet.attempts, task_id)
        shown = self.stream.attempt
        current = shown.n if shown is not None else 0
        items = [(a.n, attempt_label(a.n, a.kind, a.verdict, a.turns, a.model))
                 for a in attempts]
        if self.screen.closing:
            return
        n = await self.screen.app.push_screen_wait(AttemptScreen(
            f"Attempts of {task_id}", items, current))
        if n is not None:
            self.stream.choose_attempt(task_id, n, max((i[0] for i in items), default=0))

    def tool_call_loaded(self, message: ToolCallLoaded) -> None:
        """The stream pane read a whole tool call (x / enter on its line): show it."""
        from fleet_tui.ui.screens.modals import ToolCallScreen

        if self.screen.closing:
            return
        detail = message.detail
        self.screen.app.push_screen(ToolCallScreen(detail.title, detail.status, detail.rows))

    def reload(self) -> None:
        """The task's worktree or history changed under the panes: read them again."""
        self.diff.reload()
        self.stream.reread()


def detail_title(task: Task) -> Text:
    """The one line over the tabs: id, title, state, branches, landing, push, message."""
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
    return text
