"""The task list: one row per task, keyed by its id, what needs attention first.

A virtual list (a ScrollView that paints only the rows on screen), not a DataTable: with
a thousand tasks in the store, DataTable's add_row and its measuring of every cell cost
most of a second at start-up and on every poll. Columns have fixed widths here, so
nothing needs measuring; a row's cells are built when it is painted, and cached.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from fleet_tui.core.states import STATES, Phase, TaskState
from fleet_tui.ui.formatting import (
    change_label,
    clean,
    human_cost,
    human_duration,
    human_tokens,
    landing_label,
)
from fleet_tui.ui.widgets.line_view import text_style

TYPE_CHECKING = False
if TYPE_CHECKING:
    from fleet_tui.core.model import Task
    from fleet_tui.store.meter import Totals

COLUMNS: tuple[tuple[str, str, int | None], ...] = (
    ("mark", " ", 1),
    ("state", "state", 11),
    ("id", "id", 6),
    ("repo", "repo", 14),  # only while tasks of more than one repository are listed
    ("endpoint", "endpoint", 10),  # only while tasks of more than one endpoint are listed
    ("host", "host", 10),  # likewise, tasks of more than one host
    ("title", "title", None),
    ("model", "model", 10),
    ("elapsed", "time", 7),
    ("turns", "turns", 5),
    ("tokens", "tokens", 6),
    ("cost", "cost", 8),  # only while a listed task has metered requests (the gateway's)
    ("lines", "+/-", 11),
    ("tool", "last tool", None),
)
# Below this width the model, turns and last-tool columns give way to the title.
NARROW_WIDTH = 110
NARROW_HIDDEN = frozenset({"model", "turns", "tool"})
# Below this width, with the cost column shown, the tokens column gives way too (at 80
# columns a title had 16 characters; the header still counts the tokens, Σ)
TIGHT_WIDTH = 100
TIGHT_WIDTHS = {"elapsed": 6, "lines": 8}  # there: "59m59s"; "+1234 -5…" cut


SORTS: dict[str, str] = {  # the list's orders (S cycles them), and how they are named
    "attention": "needs you first",
    "newest": "newest first",
    "repository": "by repository",
    "state": "by state",
}
# the "state" order: a task's life, from the queue to the history
LIFECYCLE = (TaskState.RUNNING, TaskState.STALLED, TaskState.QUEUED, TaskState.WAITING,
             TaskState.SUCCEEDED, TaskState.FAILED, TaskState.KILLED, TaskState.MERGED,
             TaskState.DISCARDED)


def sort_tasks(tasks: Iterable[Task], mode: str = "attention") -> list[Task]:
    """The list in one of SORTS' orders; newest first within a group. "attention":
    what needs you (stalled, failed, done, killed), then running, waiting, queued, then
    history; "newest": by creation; "repository": by repository, then as "attention";
    "state": by LIFECYCLE."""
    def order(task: Task) -> int:
        row = STATES.get(task.state)
        return row.order if row is not None else len(STATES)

    if mode == "newest":
        return sorted(tasks, key=lambda t: (-t.created_at, t.id))
    if mode == "repository":
        return sorted(tasks, key=lambda t: (t.repo.name, str(t.repo), order(t),
                                            -t.created_at, t.id))
    if mode == "state":
        rank = {state: i for i, state in enumerate(LIFECYCLE)}
        return sorted(tasks, key=lambda t: (rank.get(t.state, len(rank)), -t.created_at,
                                            t.id))
    return sorted(tasks, key=lambda t: (order(t), -t.created_at, t.id))


def repo_names(repos: Iterable[Path]) -> dict[Path, str]:
    """A short name for each repository: its folder's name, with its parent's where two
    share one ("work/shop", "old/shop")."""
    unique = sorted(set(repos))
    names = {repo: repo.name or str(repo) for repo in unique}
    taken: dict[str, int] = {}
    for name in names.values():
        taken[name] = taken.get(name, 0) + 1
    for repo, name in names.items():
        if taken[name] > 1:
            names[repo] = f"{repo.parent.name}/{name}"
    return names


def elapsed(task: Task, now: float) -> float | None:
    if task.started_at is None:
        return None
    end = task.finished_at if task.finished_at is not None else now
    return max(0.0, end - task.started_at)


RIGHT_ALIGNED = frozenset({"elapsed", "turns", "tokens", "cost"})
CELL_PAD = 1  # blank cells each side of a column, as DataTable draws them


class TaskTable(ScrollView, can_focus=True):
    """The task list: a fixed header line, then one row per task, a row cursor.

    It keeps DataTable's vocabulary (``cursor_row``, ``row_count``, ``move_cursor``,
    ``get_row``) so callers read the same, and posts ``RowHighlighted`` with the task id
    when the cursor lands on another task. Cell styles come from component classes.
    """

    COMPONENT_CLASSES = {
        "tasktable--header", "tasktable--cursor",
        "tasktable--muted", "tasktable--running", "tasktable--stalled",
        "tasktable--waiting", "tasktable--succeeded", "tasktable--failed",
        "tasktable--attention", "tasktable--mark", "tasktable--add", "tasktable--del",
    }
    DEFAULT_CSS = """
    TaskTable {
        background: $surface;
        color: $foreground;
        height: auto;
        max-height: 100%;
        overflow-x: hidden;
        overflow-y: auto;
        &:focus {
            background-tint: $foreground 5%;
            & > .tasktable--cursor {
                background: $block-cursor-background;
                color: $block-cursor-foreground;
                text-style: $block-cursor-text-style;
            }
            & > .tasktable--header { background-tint: $foreground 5%; }
        }
        & > .tasktable--header { text-style: bold; background: $panel; color: $foreground; }
        & > .tasktable--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
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
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor_up", "Up", show=False),
        Binding("down", "cursor_down", "Down", show=False),
        Binding("pageup", "cursor_page_up", "Page up", show=False),
        Binding("pagedown", "cursor_page_down", "Page down", show=False),
        Binding("home,ctrl+home", "cursor_first", "First", show=False),
        Binding("end,ctrl+end", "cursor_last", "Last", show=False),
    ]

    class RowHighlighted(Message):
        """The cursor is on another task (``key`` is its id, None when the list is empty)."""

        def __init__(self, table: TaskTable, key: str | None, cursor_row: int) -> None:
            super().__init__()
            self.table = table
            self.key = key
            self.cursor_row = cursor_row

        @property
        def control(self) -> TaskTable:
            return self.table

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._order: list[str] = []
        self._tasks: dict[str, Task] = {}
        self._marked: set[str] = set()
        self._uncaged: frozenset[str] = frozenset()  # tasks that ran without the cage
        self._now = 0.0
        self.cursor_row = 0
        self._highlighted: str | None = None
        self._styles: dict[str, Style] = {}
        self._strips: dict[tuple[str, bool], tuple[object, Strip]] = {}
        self._header: tuple[object, Strip] | None = None
        self._base: Style | None = None
        self._repo_names: dict[Path, str] = {}  # shown while more than one is listed
        self._costs: dict[str, Totals] = {}  # the listed tasks' metered totals
        self._endpoints: set[str] = set()  # likewise, the tasks' endpoints
        self._hosts: set[str] = set()  # and their hosts
        # The header's line from the first layout on: the height is auto, and a virtual
        # size of nothing before the first resize laid the table out with no height, so
        # the first frame had no task list and the header came a frame (~20 ms) later.
        self.set_reactive(TaskTable.virtual_size, Size(0, 1))

    # --- what callers use ----------------------------------------------------------------
    @property
    def row_count(self) -> int:
        return len(self._order)

    @property
    def keys(self) -> list[str]:
        return list(self._order)

    @property
    def selected_key(self) -> str | None:
        if 0 <= self.cursor_row < len(self._order):
            return self._order[self.cursor_row]
        return None

    def select_key(self, task_id: str) -> bool:
        if task_id not in self._tasks:
            return False
        self.move_cursor(row=self._order.index(task_id))
        return True

    def get_row(self, task_id: str) -> list[Text]:
        """The cells of a task's row as they are painted (tests, copy)."""
        shown = {key for key, _, _ in self._columns()}
        keep = [i for i, c in enumerate(COLUMNS) if c[0] in shown]
        cells = self._row(self._tasks[task_id], task_id in self._marked, self._now)
        return [cells[i] for i in keep]

    @property
    def shows_cost(self) -> bool:
        """The cost column is shown (a listed task has metered requests)."""
        return any(t.requests for t in self._costs.values())

    @property
    def shows_repo(self) -> bool:
        """The repository column is shown (tasks of several repositories are listed)."""
        return len(self._repo_names) > 1

    @property
    def shows_endpoint(self) -> bool:
        """The endpoint column is shown (tasks of several endpoints are listed)."""
        return len(self._endpoints) > 1

    @property
    def shows_host(self) -> bool:
        """The host column is shown (tasks of several hosts are listed)."""
        return len(self._hosts) > 1

    def show(self, tasks: list[Task], marked: set[str], now: float,
             costs: dict[str, Totals] | None = None,
             uncaged: frozenset[str] | set[str] = frozenset()) -> None:
        """Show ``tasks`` (already sorted). The cursor stays on its task when it is still
        listed, else on the same row; only the rows on screen are painted. With tasks of
        more than one repository, a repository column tells them apart (likewise an
        endpoint column for tasks of more than one endpoint, and a host column for tasks
        of more than one host); with `costs` (the meter's
        totals per task) of any listed task, a cost column."""
        selected = self.selected_key
        repos = {t.repo for t in tasks}
        if repos != set(self._repo_names):
            self._repo_names = repo_names(repos)
            self._header = None
        listed = {t.id for t in tasks}
        costs = {k: v for k, v in (costs or {}).items() if k in listed}
        if bool(costs) != bool(self._costs):
            self._header = None
        self._costs = costs
        endpoints = {t.endpoint for t in tasks}
        hosts = {t.host for t in tasks}
        if endpoints != self._endpoints or hosts != self._hosts:
            self._endpoints = endpoints
            self._hosts = hosts
            self._header = None
        self._order = [t.id for t in tasks]
        self._tasks = {t.id: t for t in tasks}
        self._marked = set(marked)
        self._uncaged = frozenset(uncaged)
        self._now = now
        if selected is not None and selected in self._tasks:
            self.cursor_row = self._order.index(selected)
        self.cursor_row = max(0, min(self.cursor_row, len(self._order) - 1))
        self._resize_virtual()
        self._scroll_to_cursor()
        self.refresh()
        self._announce()

    def set_marked(self, marked: set[str]) -> None:
        """Show these marks (repaints the rows on screen; rows are cached per mark)."""
        if marked != self._marked:
            self._marked = set(marked)
            self.refresh()

    def move_cursor(self, *, row: int, animate: bool = False, scroll: bool = True) -> None:
        """Put the cursor on ``row`` (clamped), scroll it into view, say which task."""
        del animate  # the list never animates; kept for DataTable's signature
        row = max(0, min(row, len(self._order) - 1))
        if row != self.cursor_row:
            self.cursor_row = row
            self.refresh()
        if scroll:
            self._scroll_to_cursor()
        self._announce()

    # --- cursor keys and the mouse -------------------------------------------------------
    def _page(self) -> int:
        return max(1, self.scrollable_content_region.height - 1)

    def action_cursor_up(self) -> None:
        self.move_cursor(row=self.cursor_row - 1)

    def action_cursor_down(self) -> None:
        self.move_cursor(row=self.cursor_row + 1)

    def action_cursor_page_up(self) -> None:
        self.move_cursor(row=self.cursor_row - self._page())

    def action_cursor_page_down(self) -> None:
        self.move_cursor(row=self.cursor_row + self._page())

    def action_cursor_first(self) -> None:
        self.move_cursor(row=0)

    def action_cursor_last(self) -> None:
        self.move_cursor(row=len(self._order) - 1)

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None or offset.y < 1:
            return
        row = int(self.scroll_y) + offset.y - 1
        if row < len(self._order):
            self.move_cursor(row=row, scroll=False)

    def _announce(self) -> None:
        key = self.selected_key
        if key != self._highlighted:
            self._highlighted = key
            self.post_message(self.RowHighlighted(self, key, self.cursor_row))

    def _scroll_to_cursor(self) -> None:
        rows = self.scrollable_content_region.height - 1  # below the header
        if rows <= 0 or not self._order:
            return
        top = int(self.scroll_y)
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False, immediate=True)
        elif self.cursor_row >= top + rows:
            self.scroll_to(y=self.cursor_row - rows + 1, animate=False, immediate=True)

    def _resize_virtual(self) -> None:
        size = Size(self.size.width, len(self._order) + 1)
        if size != self.virtual_size:
            self.virtual_size = size

    def on_resize(self) -> None:
        self._strips.clear()
        self._header = None
        self._resize_virtual()
        self.call_after_refresh(self._scroll_to_cursor)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()
        self._strips.clear()
        self._header = None
        self._base = None

    def _base_style(self) -> Style:
        """``rich_style`` walks every ancestor: once per style change, not per line."""
        if self._base is None:
            self._base = self.rich_style
        return self._base

    def _on_focus(self, event: events.Focus) -> None:
        super()._on_focus(event)
        self.notify_style_update()
        self.refresh()

    def _on_blur(self, event: events.Blur) -> None:
        super()._on_blur(event)
        self.notify_style_update()
        self.refresh()

    # --- columns and cells ---------------------------------------------------------------
    def _style(self, name: str) -> Style:
        style = self._styles.get(name)
        if style is None:
            full = name in ("header", "cursor")  # these paint their own background
            style = self._styles[name] = (
                self.get_component_rich_style(f"tasktable--{name}") if full
                else text_style(self, f"tasktable--{name}"))
        return style

    def _columns(self) -> list[tuple[str, str, int | None]]:
        hidden = set() if self.shows_repo else {"repo"}
        if not self.shows_cost:
            hidden.add("cost")
        if not self.shows_endpoint:
            hidden.add("endpoint")
        if not self.shows_host:
            hidden.add("host")
        if self.size.width and self.size.width < NARROW_WIDTH:
            hidden |= NARROW_HIDDEN
        tight = self._tight()
        if tight:
            hidden.add("tokens")  # the title goes first: the cost says more than tokens
        return [(key, label, TIGHT_WIDTHS.get(key, width) if tight else width)
                for key, label, width in COLUMNS if key not in hidden]

    def _tight(self) -> bool:
        return bool(self.size.width) and self.size.width < TIGHT_WIDTH and self.shows_cost

    def _widths(self) -> tuple[int, int]:
        columns = self._columns()
        fixed = sum(w for _, _, w in columns if w) + 2 * len(columns)
        free = max(0, self.size.width - fixed - 2)
        if not any(key == "tool" for key, _, _ in columns):
            return max(16, free), 0
        title = max(16, min(48, free * 2 // 3))
        tool = max(12, free - title)
        return title, tool

    def _layout(self) -> list[tuple[int, str, str, int]]:
        """(index in COLUMNS, key, label, width) of the columns that fit."""
        title_w, tool_w = self._widths()
        shown = {key: width for key, _, width in self._columns()}
        out = []
        for index, (key, label, _) in enumerate(COLUMNS):
            if key not in shown:
                continue
            width = shown[key]
            if key == "title":
                width = title_w
            elif key == "tool":
                width = tool_w
            out.append((index, key, label, width or 0))
        return out

    def _row(self, task: Task, marked: bool, now: float) -> tuple[Text, ...]:
        row = STATES.get(task.state)  # None: a value that is not a state (a tampered row)
        state_style = self._style(row.style if row is not None else "muted")
        title_style = self._style("attention") if row is not None and row.attention else (
            self._style("muted") if row is not None and row.phase is Phase.CLOSED else "")
        spent = elapsed(task, now)
        tokens = task.input_tokens + task.output_tokens
        cost = self._costs.get(task.id)
        title = Text(no_wrap=True, overflow="ellipsis", style=title_style)
        landing = landing_label(task)
        if landing is not None:
            title.append(f"{landing[0]} ", style=self._style(landing[1]))
        if task.id in self._uncaged:  # ran as the user, as `ls` marks it
            title.append("[uncaged] ", style=self._style("waiting"))
        title.append(clean(task.short_title))
        lines = Text(no_wrap=True)
        if task.added_lines or task.deleted_lines:
            lines.append(f"+{task.added_lines}", style=self._style("add"))
            lines.append(f" -{task.deleted_lines}", style=self._style("del"))
        elif (unchanged := change_label(task)) is not None:
            lines.append(unchanged, style=self._style("muted"))
        return (
            Text("●" if marked else " ", style=self._style("mark")),
            Text(row.badge if row is not None else str(task.state), style=state_style,
                 no_wrap=True),
            Text(task.id, no_wrap=True),
            Text(self._repo_names.get(task.repo, task.repo.name), no_wrap=True,
                 overflow="ellipsis", style=self._style("muted")),
            Text(task.endpoint, no_wrap=True, overflow="ellipsis",
                 style=self._style("muted")),
            Text(task.host, no_wrap=True, overflow="ellipsis", style=self._style("muted")),
            title,
            Text(task.model, no_wrap=True, overflow="ellipsis"),
            Text(human_duration(spent) if spent is not None else "", no_wrap=True,
                 justify="right"),
            Text(str(task.turns) if task.turns else "", justify="right"),
            Text(human_tokens(tokens) if tokens else "", justify="right"),
            Text(human_cost(cost.cost, cost.unpriced) if cost is not None else "",
                 no_wrap=True, justify="right"),
            lines,
            Text(task.last_tool or "", no_wrap=True, overflow="ellipsis",
                 style=self._style("muted")),
        )

    def _signature(self, task: Task, marked: bool) -> object:
        """What a painted row depends on: the strip is rebuilt only when this changes."""
        spent = elapsed(task, self._now)
        return (task.state, task.short_title, task.model, task.turns, task.input_tokens,
                task.output_tokens, task.added_lines, task.deleted_lines, task.last_tool,
                None if spent is None else int(spent), marked, landing_label(task),
                task.id in self._uncaged,
                self.shows_repo, self._repo_names.get(task.repo), self.shows_endpoint,
                task.endpoint, self.shows_host, task.host, self._cost_key(task.id))

    def _cost_key(self, task_id: str) -> object:
        """What a row's cost cell depends on (and whether the column is shown at all)."""
        cost = self._costs.get(task_id)
        return (self.shows_cost, None if cost is None else (round(cost.cost, 4),
                                                            cost.unpriced))

    def _paint(self, cells: list[tuple[Text, str, int]], row_style: Style,
               *, over: bool = False) -> Strip:
        """One line of cells. ``over``: row_style wins over the cells' own colours (the
        cursor row, where a muted or state colour on the cursor background is unreadable)."""
        line = Text(no_wrap=True, end="")
        pad = " " * CELL_PAD
        for cell, key, width in cells:
            cell = cell.copy()
            cell.truncate(width, overflow="ellipsis")
            cell.align("right" if key in RIGHT_ALIGNED else "left", width)
            line.append(pad)
            line.append_text(cell)
            line.append(pad)
        rendered = line.render(self.app.console)
        segments = list(Segment.apply_style(rendered, post_style=row_style) if over
                        else Segment.apply_style(rendered, row_style))
        width = self.size.width
        strip = Strip(segments, line.cell_len)
        return strip.extend_cell_length(width, row_style).crop(0, width)

    # --- rendering -----------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self._base_style()
        if y == 0:
            layout = self._layout()
            key = (width, tuple(layout))
            if self._header is None or self._header[0] != key:
                style = base + self._style("header")
                # each label its own span, as the rows' cells are (an SVG export then
                # places every column at its cell instead of one long run of text)
                self._header = (key, self._paint(
                    [(Text(label, no_wrap=True, style=style), k, w)
                     for _, k, label, w in layout], style))
            return self._header[1]
        index = int(self.scroll_y) + y - 1
        if index >= len(self._order):
            return Strip.blank(width, base)
        task_id = self._order[index]
        task = self._tasks[task_id]
        marked = task_id in self._marked
        is_cursor = index == self.cursor_row
        signature = (self._signature(task, marked), width)
        cached = self._strips.get((task_id, is_cursor))
        if cached is None or cached[0] != signature:
            row_style = base + self._style("cursor") if is_cursor else base
            layout = self._layout()
            cells = self._row(task, marked, self._now)
            strip = self._paint([(cells[i], k, w) for i, k, _, w in layout], row_style,
                                over=is_cursor)
            if len(self._strips) > 4096:
                self._strips.clear()
            cached = self._strips[(task_id, is_cursor)] = (signature, strip)
        return cached[1]

