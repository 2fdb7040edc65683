"""The live stream of one attempt: a virtual view over formatted rows.

Rows arrive in batches (a thread worker reads the attempt's events file, formats, and
posts one message per batch), so the cost per event is a list append, never a widget.
A newly selected attempt starts from the end of its file; scrolling up to the top asks
for the rows before (``WantsOlder``), which arrive through ``prepend_rows``.
"""

from __future__ import annotations

from collections.abc import Sequence

from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive

from fleet_tui.ui.formatting import TOOL_KINDS, Row, StreamRow, row_width
from fleet_tui.ui.widgets.line_view import LineView

MAX_ROWS = 200_000  # beyond this the oldest rows go (the file keeps everything)


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
        self._visible: list[StreamRow] = []
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
        new = [r for r in rows if self._keep(r)]
        if not new:
            return
        self._visible.extend(new)
        self.rows_appended(first, max(row_width(r.row) for r in new))

    def prepend_rows(self, rows: Sequence[StreamRow], *, to_top: bool = False) -> None:
        """Older rows go before the others; what is on screen stays where it is, unless
        ``to_top`` (``home`` asked for the start)."""
        room = MAX_ROWS - len(self._all)
        rows = list(rows)[-room:] if room > 0 else []
        new = [r for r in rows if self._keep(r)]
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
        self._visible = [r for r in self._all if self._keep(r)]
        self.reset_view(max((row_width(r.row) for r in self._visible), default=0))

    def watch_tools_only(self) -> None:
        self._rebuild()

    def plain_lines(self) -> list[str]:
        """What is on display, as plain text (tests and copy)."""
        return ["".join(chunk for _, chunk in row.row) for row in self._visible]
