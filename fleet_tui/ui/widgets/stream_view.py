"""The live stream of one attempt: a virtual view over formatted rows.

Rows arrive in batches (a thread worker reads the attempt's events file, formats, and
posts one message per batch), so the cost per event is a list append, never a widget.
A newly selected attempt starts from the end of its file; scrolling up to the top asks
for the rows before (``WantsOlder``), which arrive through ``prepend_rows``.

What the user said (the prompt, a steering message: "» you:" rows) wraps at the view's
width instead of running off its right edge; every other row stays one line (a tool call
is read whole with x). The rows as read are kept, so a new width wraps them again.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len, chop_cells
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive

from fleet_tui.ui.formatting import TOOL_KINDS, Row, StreamRow, row_width
from fleet_tui.ui.widgets.line_view import LineView

MAX_ROWS = 200_000  # beyond this the oldest rows go (the file keeps everything)
WRAPPED = frozenset({"user"})  # the row kinds that wrap at the view's width
MAX_WRAPPED_LINES = 40  # one line of a message never takes more than this many rows


def wrap_words(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` cells, broken at spaces (a word longer than
    a line is cut where the line ends)."""
    lines: list[str] = []
    line = ""
    for word in text.split(" "):
        candidate = f"{line} {word}" if line else word
        if cell_len(candidate) <= width:
            line = candidate
            continue
        if line:
            lines.append(line)
        pieces = chop_cells(word, width) if cell_len(word) > width else [word]
        lines.extend(pieces[:-1])
        line = pieces[-1] if pieces else ""
    lines.append(line)
    return lines


def wrap_row(row: StreamRow, width: int) -> list[StreamRow]:
    """A row of a WRAPPED kind as rows of at most ``width`` cells: its last span (the
    text) broken in words, each further line indented under the first one's text."""
    if width <= 0 or row.kind not in WRAPPED or row_width(row.row) <= width:
        return [row]
    *head, (style, text) = row.row
    indent = sum(cell_len(chunk) for _, chunk in head)
    if width - indent < 10:
        return [row]  # too narrow to wrap usefully: the view scrolls instead
    lines = wrap_words(text, width - indent)
    if len(lines) > MAX_WRAPPED_LINES:
        lines = [*lines[:MAX_WRAPPED_LINES - 1], lines[MAX_WRAPPED_LINES - 1][:-1] + "…"]
    pad = ("", " " * indent)
    return [StreamRow(row.kind, (*head, (style, lines[0])), row.ref),
            *(StreamRow(row.kind, (pad, (style, line)), row.ref) for line in lines[1:])]


class StreamView(LineView):
    """Rows of one attempt, filtered to tool calls or showing everything."""

    COMPONENT_CLASSES = {
        "stream--icon", "stream--tool", "stream--dim", "stream--error", "stream--warn",
        "stream--ok", "stream--say", "stream--user",
    }
    STYLE_PREFIX = "stream--"
    DEFAULT_CSS = """
    StreamView {
        & > .stream--icon { color: $accent; text-style: bold; }
        & > .stream--tool { color: $primary; text-style: bold; }
        & > .stream--dim { color: $text-muted; }
        & > .stream--error { color: $text-error; background: $error-muted; }
        & > .stream--warn { color: $text-warning; background: $warning-muted; }
        & > .stream--ok { color: $text-success; text-style: bold; }
        & > .stream--say { color: $secondary; }
        & > .stream--user { color: $text-accent; text-style: bold; }
    }
    """

    CURSOR = True  # a key acts on the selected line (x: the whole tool call)
    BINDINGS = [Binding("enter,x", "expand", "Expand", show=False)]

    tools_only: reactive[bool] = reactive(False)

    class WantsOlder(Message):
        """The view reached its top and older rows exist; ``everything`` for ``home``."""

        def __init__(self, everything: bool = False) -> None:
            super().__init__()
            self.everything = everything

    class ExpandAsked(Message):
        """`enter` / `x` on a line: show the whole tool call it belongs to (``ref``: the
        call's id; None when the line belongs to none)."""

        def __init__(self, ref: str | None) -> None:
            super().__init__()
            self.ref = ref

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.set_reactive(LineView.follow, True)
        self._all: list[StreamRow] = []
        self._visible: list[StreamRow] = []  # what is shown: kept rows, wrapped
        self._wrap_width = 0  # the width WRAPPED rows were wrapped at (0: not yet)
        self._wraps = False  # some row of a WRAPPED kind is held
        self.has_older = False
        """Rows before the first one here can still be read (the panel sets it)."""

    @property
    def total_rows(self) -> int:
        return len(self._all)

    def row_count(self) -> int:
        return len(self._visible)

    def get_row(self, index: int) -> Row:
        return self._visible[index].row

    def ref_at(self, index: int | None = None) -> str | None:
        """The tool call the line at ``index`` (default: the cursor's) belongs to: its own,
        else the nearest call above it (a result's lines, a sub-agent's), None if none."""
        index = self.cursor if index is None else index
        for row in reversed(self._visible[max(0, index - 200):index + 1]):
            if row.ref is not None:
                return row.ref
            if row.kind in ("text", "user", "info", "done"):
                return None  # the call's lines end at the next message
        return None

    def action_expand(self) -> None:
        self.post_message(self.ExpandAsked(self.ref_at()))

    def _keep(self, row: StreamRow) -> bool:
        return not self.tools_only or row.kind in TOOL_KINDS or row.kind == "raw"

    def _shown(self, rows: Sequence[StreamRow]) -> list[StreamRow]:
        """The display rows of ``rows``: those the filter keeps, WRAPPED kinds wrapped."""
        out: list[StreamRow] = []
        width = self._wrap_width
        for row in rows:
            if not self._keep(row):
                continue
            if row.kind in WRAPPED:
                self._wraps = True
                out.extend(wrap_row(row, width))
            else:
                out.append(row)
        return out

    def _content_width(self) -> int:
        """The width rows wrap at: the view's, less a vertical scrollbar's (it comes and
        goes with the rows; wrapping again each time would make the rows jump)."""
        return max(0, self.size.width - self.styles.scrollbar_size_vertical)

    def on_resize(self) -> None:  # (LineView's runs too: Textual calls each class's)
        width = self._content_width()
        if width != self._wrap_width and width > 0:
            self._wrap_width = width
            if self._wraps:
                self._rebuild()

    def clear_rows(self) -> None:
        self._all = []
        self._visible = []
        self.cursor = -1
        self.follow = True
        self.reset_view(0)
        self.scroll_to(0, 0, animate=False, immediate=True)

    def append_rows(self, rows: Sequence[StreamRow]) -> None:
        if not rows:
            return
        self._all.extend(rows)
        if len(self._all) > MAX_ROWS:
            del self._all[: len(self._all) - MAX_ROWS]
            self._rebuild()
            return
        first = len(self._visible)
        new = self._shown(rows)
        if not new:
            return
        self._visible.extend(new)
        self.rows_appended(first, max(row_width(r.row) for r in new))

    def prepend_rows(self, rows: Sequence[StreamRow], *, to_top: bool = False) -> None:
        """Older rows go before the others; what is on screen stays where it is, unless
        ``to_top`` (``home`` asked for the start)."""
        room = MAX_ROWS - len(self._all)
        rows = list(rows)[-room:] if room > 0 else []
        new = self._shown(rows)
        self._all[:0] = rows
        self._visible[:0] = new
        self._cache.clear()  # row indexes moved
        self.rows_prepended(len(new))
        if new:
            self._width = max(self._width, max(row_width(r.row) for r in new))
        self.virtual_size = Size(self._width, self.row_count())
        if self.follow:
            self.scroll_end(animate=False, immediate=True, x_axis=False)
        else:
            y = 0 if to_top else self.scroll_y + len(new)
            self.scroll_to(y=y, animate=False, immediate=True)
        self.refresh()

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        if new <= 0 < old and self.has_older:
            self.post_message(self.WantsOlder())

    def action_scroll_home(self) -> None:
        super().action_scroll_home()
        if self.has_older:
            self.post_message(self.WantsOlder(everything=True))

    def _rebuild(self) -> None:
        self._visible = self._shown(self._all)
        self.reset_view(max((row_width(r.row) for r in self._visible), default=0))

    def watch_tools_only(self) -> None:
        self._rebuild()

    def plain_lines(self) -> list[str]:
        """What is on display, as plain text, row by row as shown (tests and copy)."""
        return ["".join(chunk for _, chunk in row.row) for row in self._visible]
