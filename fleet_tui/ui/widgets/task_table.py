"""The task list: one row per task, keyed by its id, what needs attention first."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text
from textual.widgets import DataTable

from fleet_tui.store import Task, TaskState
from fleet_tui.ui.formatting import (
    ATTENTION_STATES,
    STATE_BADGES,
    STATE_ORDER,
    human_duration,
    human_tokens,
)

COLUMNS: tuple[tuple[str, str, int | None], ...] = (
    ("mark", " ", 1),
    ("state", "state", 11),
    ("id", "id", 6),
    ("title", "title", None),
    ("model", "model", 10),
    ("elapsed", "time", 7),
    ("turns", "turns", 5),
    ("tokens", "tokens", 6),
    ("lines", "+/-", 11),
    ("tool", "last tool", None),
)
# Below this width the model, turns and last-tool columns give way to the title.
NARROW_WIDTH = 110
NARROW_HIDDEN = frozenset({"model", "turns", "tool"})
STATE_CLASS: dict[TaskState, str] = {
    TaskState.QUEUED: "muted",
    TaskState.RUNNING: "running",
    TaskState.STALLED: "stalled",
    TaskState.WAITING: "waiting",
    TaskState.SUCCEEDED: "succeeded",
    TaskState.FAILED: "failed",
    TaskState.KILLED: "stalled",
    TaskState.MERGED: "muted",
    TaskState.DISCARDED: "muted",
}


def sort_tasks(tasks: Iterable[Task]) -> list[Task]:
    """Attention first (stalled, failed, done, killed), then running, waiting, queued,
    then history; newest first within a group."""
    return sorted(tasks, key=lambda t: (STATE_ORDER.get(t.state, 9), -t.created_at, t.id))


def elapsed(task: Task, now: float) -> float | None:
    if task.started_at is None:
        return None
    end = task.finished_at if task.finished_at is not None else now
    return max(0.0, end - task.started_at)


class TaskTable(DataTable[Text]):
    """A DataTable whose cells are Text styled from component classes (theme colours)."""

    COMPONENT_CLASSES = {
        "tasktable--muted", "tasktable--running", "tasktable--stalled",
        "tasktable--waiting", "tasktable--succeeded", "tasktable--failed",
        "tasktable--attention", "tasktable--mark", "tasktable--add", "tasktable--del",
    }
    DEFAULT_CSS = """
    TaskTable {
        & > .tasktable--muted { color: $text-muted; }
        & > .tasktable--running { color: $text-primary; }
        & > .tasktable--waiting { color: $text-warning; }
        & > .tasktable--stalled { color: $text-warning; text-style: bold; }
        & > .tasktable--succeeded { color: $text-success; text-style: bold; }
        & > .tasktable--failed { color: $text-error; text-style: bold; }
        & > .tasktable--attention { text-style: bold; }
        & > .tasktable--mark { color: $accent; text-style: bold; }
        & > .tasktable--add { color: $text-success; }
        & > .tasktable--del { color: $text-error; }
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False)
        self._order: list[str] = []
        self._cells: dict[str, tuple[Text, ...]] = {}
        self._title_width = 0
        self._built = False

    def _style(self, name: str) -> object:
        return self.get_component_rich_style(f"tasktable--{name}")

    def _columns(self) -> list[tuple[str, str, int | None]]:
        if self.size.width and self.size.width < NARROW_WIDTH:
            return [c for c in COLUMNS if c[0] not in NARROW_HIDDEN]
        return list(COLUMNS)

    def _widths(self) -> tuple[int, int]:
        columns = self._columns()
        fixed = sum(w for _, _, w in columns if w) + 2 * len(columns)
        free = max(0, self.size.width - fixed - 2)
        if not any(key == "tool" for key, _, _ in columns):
            return max(16, free), 0
        title = max(16, min(48, free * 2 // 3))
        tool = max(12, free - title)
        return title, tool

    def _row(self, task: Task, marked: bool, now: float) -> tuple[Text, ...]:
        state_style = self._style(STATE_CLASS.get(task.state, "muted"))
        attention = task.state in ATTENTION_STATES
        title_style = self._style("attention") if attention else (
            self._style("muted") if task.state in (TaskState.MERGED, TaskState.DISCARDED)
            else None)
        spent = elapsed(task, now)
        tokens = task.input_tokens + task.output_tokens
        lines = Text(no_wrap=True)
        if task.added_lines or task.deleted_lines:
            lines.append(f"+{task.added_lines}", style=self._style("add"))  # type: ignore[arg-type]
            lines.append(f" -{task.deleted_lines}", style=self._style("del"))  # type: ignore[arg-type]
        return (
            Text("●" if marked else " ", style=self._style("mark")),  # type: ignore[arg-type]
            Text(STATE_BADGES.get(task.state, str(task.state)), style=state_style,  # type: ignore[arg-type]
                 no_wrap=True),
            Text(task.id, no_wrap=True),
            Text(task.short_title, style=title_style, no_wrap=True,  # type: ignore[arg-type]
                 overflow="ellipsis"),
            Text(task.model, no_wrap=True, overflow="ellipsis"),
            Text(human_duration(spent) if spent is not None else "", no_wrap=True,
                 justify="right"),
            Text(str(task.turns) if task.turns else "", justify="right"),
            Text(human_tokens(tokens) if tokens else "", justify="right"),
            lines,
            Text(task.last_tool or "", no_wrap=True, overflow="ellipsis",
                 style=self._style("muted")),  # type: ignore[arg-type]
        )

    def show(self, tasks: list[Task], marked: set[str], now: float) -> None:
        """Show ``tasks`` (already sorted), updating in place when only cells changed."""
        title_w, tool_w = self._widths()
        columns = self._columns()
        keep = [i for i, c in enumerate(COLUMNS) if c in columns]
        order = [t.id for t in tasks]
        rows = {t.id: tuple(cells[i] for i in keep) for t in tasks
                for cells in (self._row(t, t.id in marked, now),)}
        same_columns = [c[0] for c in columns] == [str(k.value) for k in self.columns]
        if order == self._order and title_w == self._title_width and same_columns \
                and self._built:
            col_keys = list(self.columns)
            for task_id in order:
                old = self._cells.get(task_id)
                new = rows[task_id]
                for i, cell in enumerate(new):
                    if old is None or _same(old[i], cell) is False:
                        self.update_cell(task_id, col_keys[i], cell)
            self._cells = rows
            return
        selected = self.selected_key
        self.clear(columns=not same_columns or title_w != self._title_width)
        if not self.columns:
            for key, label, width in columns:
                if key == "title":
                    width = title_w
                elif key == "tool":
                    width = tool_w
                self.add_column(label, key=key, width=width)
        self._title_width = title_w
        for task_id in order:
            self.add_row(*rows[task_id], key=task_id)
        self._order = order
        self._cells = rows
        self._built = True
        if selected in order:
            self.move_cursor(row=order.index(selected), animate=False, scroll=True)

    @property
    def selected_key(self) -> str | None:
        if not self._order or self.cursor_row < 0 or self.cursor_row >= len(self._order):
            return None
        return self._order[self.cursor_row]

    def select_key(self, task_id: str) -> bool:
        if task_id not in self._order:
            return False
        self.move_cursor(row=self._order.index(task_id), animate=False, scroll=True)
        return True

    @property
    def keys(self) -> list[str]:
        return list(self._order)

    def on_resize(self) -> None:
        if self._widths()[0] != self._title_width and self._order:
            self._built = False  # rebuild with the new widths on the next show


def _same(a: Text, b: Text) -> bool:
    return a.plain == b.plain and str(a.style) == str(b.style) and a.spans == b.spans
