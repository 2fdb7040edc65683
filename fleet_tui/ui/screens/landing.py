"""Landing many branches: the compare view of a task's copies and the merge queue.

- `CompareScreen` (`c`): the copies of one prompt ranked by evidence (best of N: the best
  marked ★, the test command's and the named checks' results, +/-, files touched, whether
  each merges cleanly now, state, verdict, turns, tokens), the highlighted copy's reason for
  its place on one line, and below them its diff: moving the cursor is the one key to
  another copy's diff. `p` picks the highlighted copy, `b` the best (the main screen asks
  once, then lands it through the merge queue and discards its siblings), `enter` goes to
  it in the task list.
- `QueueScreen` (`Q`): the merge queue in landing order, what each task is at (waiting,
  updating, testing, merging, fixing, stopped) and why; read again every half second by a
  loader the main screen gives it (a thread: the store), so it follows the queue runner.

Both get plain rows (no engine object), and everything shown from agents or git is Text,
never markup.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label
from textual.worker import Worker

from fleet_tui.core.stream import one_line
from fleet_tui.ui.formatting import PreparedDiff, human_tokens
from fleet_tui.ui.messages import report_failure
from fleet_tui.ui.screens import DIALOG_CSS
from fleet_tui.ui.widgets.diff_view import DiffView

__all__ = ["CompareScreen", "CopyRow", "QueueRow", "QueueScreen"]


@dataclass(frozen=True)
class CopyRow:
    """One copy in the compare view."""

    task_id: str
    title: str
    state: str
    verdict: str
    turns: int
    tokens: int
    added: int
    deleted: int
    files: list[str] = field(default_factory=list)
    gate: str = "-"
    merges: str = ""
    clean: bool | None = None
    diff: PreparedDiff | None = None
    place: int | None = None  # its rank (None: not ranked yet)
    best: bool = False
    reason: str = ""  # why it stands there, one line
    tests: str = "-"  # the test command's result: passed, FAILED, - (none)
    checks: str = "-"  # the named checks passed, "2/3"


class CompareScreen(ModalScreen[tuple[str, str] | None]):
    """The copies of a task side by side; answers ("pick", id), ("select", id) or None."""

    CSS_PATH = DIALOG_CSS
    AUTO_FOCUS = "#copies"  # set as it composes: ↑ ↓ pressed at once move along the copies

    BINDINGS = [
        Binding("p", "pick", "Pick this copy", id="compare.pick"),
        Binding("b", "pick_best", "Pick the best", id="compare.pick_best"),
        Binding("escape,q", "close", "Close", id="compare.close"),
    ]
    COLUMNS = ("rank", "id", "tests", "checks", "+/-", "files", "merges cleanly", "state",
               "verdict", "turns", "tokens")

    def __init__(self, title: str, rows: list[CopyRow], current: str) -> None:
        super().__init__(classes="modal")
        self._title = title
        self.rows = rows
        self._current = current

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="compare-dialog"):
            yield Label(f"Copies of: {self._title}", classes="dialog-title", markup=False)
            table: DataTable[Text] = DataTable(id="copies", cursor_type="row",
                                               zebra_stripes=True)
            yield table
            yield Label("", id="compare-why", markup=False)
            yield Label("", id="compare-files", markup=False)
            yield DiffView(id="compare-diff")
            yield Label("↑ ↓: another copy and its diff    p: pick it (land it, discard "
                        "the others)    b: pick the best    enter: go to it    esc: close",
                        classes="dialog-hint", markup=False)

    def on_mount(self) -> None:
        table = self.query_one("#copies", DataTable)
        table.add_columns(*self.COLUMNS)
        for n, row in enumerate(self.rows, 1):
            clean = "✔ " if row.clean else ("✗ " if row.clean is False else "")
            place = f"★{row.place}" if row.best else str(row.place or n)
            table.add_row(
                Text(place, style="bold" if row.best else ""), Text(row.task_id),
                Text(row.tests), Text(row.checks), Text(f"+{row.added} -{row.deleted}"),
                Text(str(len(row.files))), Text(clean + row.merges, overflow="ellipsis"),
                Text(row.state), Text(row.verdict or "-"),
                Text(str(row.turns)), Text(human_tokens(row.tokens)), key=row.task_id)
        index = next((i for i, r in enumerate(self.rows) if r.task_id == self._current), 0)
        table.move_cursor(row=index)
        self._show(index)

    @property
    def highlighted(self) -> CopyRow | None:
        table = self.query_one("#copies", DataTable)
        if 0 <= table.cursor_row < len(self.rows):
            return self.rows[table.cursor_row]
        return None

    @on(DataTable.RowHighlighted, "#copies")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show(event.cursor_row)

    def _show(self, index: int) -> None:
        if not 0 <= index < len(self.rows):
            return
        row = self.rows[index]
        files = ", ".join(row.files) if row.files else "no changes"
        self.query_one("#compare-files", Label).update(f"{row.task_id}: {files}")
        mark = "★ best: " if row.best else f"#{row.place}: " if row.place else ""
        self.query_one("#compare-why", Label).update(
            Text(one_line(f"{mark}{row.reason}", 200) if row.reason else "",
                 overflow="ellipsis", no_wrap=True))
        view = self.query_one("#compare-diff", DiffView)
        if not view.composed:
            self.call_after_refresh(self._show, index)
            return
        if row.diff is None:
            view.show_message(row.merges or "No diff to show.")
        else:
            view.show(row.task_id, row.diff)

    @on(DataTable.RowSelected, "#copies")
    def _selected(self, event: DataTable.RowSelected) -> None:
        row = self.highlighted
        if row is not None:
            self.dismiss(("select", row.task_id))

    def action_pick(self) -> None:
        row = self.highlighted
        if row is not None:
            self.dismiss(("pick", row.task_id))

    def action_pick_best(self) -> None:
        """The best copy (the first of those tied); said, and nothing done, when none
        passes."""
        best = next((r for r in self.rows if r.best), None)
        if best is None:
            self.notify("No copy passes (each one's reason is under the table); nothing to "
                        "pick.", title="Best of N", severity="warning", markup=False)
            return
        self.dismiss(("pick", best.task_id))

    def action_close(self) -> None:
        self.dismiss(None)


@dataclass(frozen=True)
class QueueRow:
    """One task in the merge queue view."""

    task_id: str
    title: str
    land_state: str
    note: str
    state: str
    fixes: int = 0


class QueueScreen(ModalScreen[None]):
    """The merge queue, refreshed while it is open."""

    CSS_PATH = DIALOG_CSS
    AUTO_FOCUS = "#queue"

    BINDINGS = [Binding("escape,q,Q", "close", "Close", id="queue.close")]
    INTERVAL = 0.5

    def __init__(self, load: Callable[[], list[QueueRow]]) -> None:
        """``load`` reads the queue (it runs in a thread)."""
        super().__init__(classes="modal")
        self._load_rows = load
        self.rows: list[QueueRow] = []
        self.loaded_at = 0.0
        self.problem: str | None = None  # why the last read failed (None: it did not)
        self._answered = False  # "Reading the queue…" until the first read answers

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="queue-dialog"):
            yield Label("Merge queue", classes="dialog-title")
            table: DataTable[Text] = DataTable(id="queue", cursor_type="row")
            yield table
            yield Label("Reading the queue…", id="queue-empty", markup=False)
            yield Label("In landing order: each is brought up to date with its base, tested "
                        "in its worktree, then merged. A conflict or a failing test goes back "
                        "to its worker (fixing) and rejoins the end. esc closes.",
                        classes="dialog-hint")

    def on_mount(self) -> None:
        self.query_one("#queue", DataTable).add_columns("#", "id", "landing", "fixes",
                                                         "news", "task", "title")
        self._refresh()
        self.set_interval(self.INTERVAL, self._refresh)

    def _refresh(self) -> None:
        self._read()

    @work(thread=True, exclusive=True, exit_on_error=False, group="queue-view",
          description="reading the merge queue")
    def _read(self) -> None:
        try:
            rows = self._load_rows()
        except Exception as exc:  # the store, git: said in the view, read again next tick
            from fleet_tui.ui.formatting import describe_error

            self.app.call_from_thread(self._failed, describe_error(exc))
            return
        self.app.call_from_thread(self._show, rows)

    def _say(self, text: str, *, error: bool = False) -> None:
        label = self.query_one("#queue-empty", Label)
        label.update(text)
        label.set_class(error, "-error")
        label.display = bool(text)

    def _failed(self, problem: str) -> None:
        """A read failed: say why (rows read before stay, said to be the last read); the
        next tick reads again."""
        self.loaded_at = time.monotonic()
        self._answered = True
        self.problem = problem
        kept = " (the rows above are from the last read)" if self.rows else ""
        self._say(f"Cannot read the merge queue: {problem}{kept}; trying again.", error=True)

    def _show(self, rows: list[QueueRow]) -> None:
        self.loaded_at = time.monotonic()
        first, self._answered = not self._answered, True
        recovered, self.problem = self.problem is not None, None
        table = self.query_one("#queue", DataTable)
        if rows == self.rows and table.row_count == len(rows) and not (first or recovered):
            return
        if rows != self.rows or table.row_count != len(rows):
            self.rows = rows
            row = table.cursor_row
            table.clear()
            for n, item in enumerate(rows, 1):
                table.add_row(Text(str(n)), Text(item.task_id), Text(item.land_state),
                              Text(str(item.fixes)), Text(item.note, overflow="ellipsis"),
                              Text(item.state), Text(item.title, overflow="ellipsis"),
                              key=item.task_id)
            if rows:
                table.move_cursor(row=min(row, len(rows) - 1))
        # said from the first read on: an empty queue is empty at once, not "reading"
        self._say("" if rows else "The merge queue is empty: mark tasks and press m.")

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        report_failure(self, event)

    def action_close(self) -> None:
        self.dismiss(None)
