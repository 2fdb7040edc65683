"""A virtual scrolling view of styled lines (toolong style).

Only the lines on screen are turned into strips, and those are cached; the data behind the
view is a plain list. So a 20,000-line diff or an attempt with 100,000 events costs one list
and a screenful of rendering, never one widget per line.

Every view searches (`/` or `ctrl+f` asks its container for the search bar, `SearchBar`;
`n` / `N` go to the next / previous match, `escape` ends the search): the matches are
highlighted and the view scrolls to the current one. A view may also keep a row cursor
(``CURSOR``): the stream does, so that a key acts on "the selected line".
"""

from __future__ import annotations

import time
from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.cache import LRUCache
from textual.containers import Horizontal
from textual.events import MouseScrollUp
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Input, Label

from fleet_tui.ui.formatting import Row


def text_style(widget: Widget, name: str) -> Style:
    """A component class's text style without its background (the row's shows through).

    ``partial=True`` alone leaves an alpha colour such as ``$text-muted`` unblended (it
    comes out white), so the colour is taken from the full style, which is blended
    against the widget's background."""
    partial = widget.get_component_rich_style(name, partial=True)
    if partial.color is None:
        return partial
    full = widget.get_component_rich_style(name)
    return partial + Style(color=full.color)


class LineView(ScrollView, can_focus=True):
    """Base class: subclasses say how many rows there are and what row ``y`` holds.

    Styles come from component classes named ``<STYLE_PREFIX><name>`` so that colours live
    in the stylesheet (theme variables), never in Python.
    """

    DEFAULT_CSS = """
    LineView {
        background: $surface;
        overflow: auto auto;
        &:focus {
            background-tint: $foreground 4%;
            & > .lineview--cursor { background: $block-cursor-background 40%; }
        }
        & > .lineview--match { background: $warning-muted; }
        & > .lineview--match-current { background: $warning; color: $background;
                                       text-style: bold; }
        & > .lineview--cursor { background: $boost; }
    }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "lineview--match", "lineview--match-current", "lineview--cursor"}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash,ctrl+f", "search", "Search", show=False),
        Binding("n", "search_next(1)", "Next match", show=False),
        Binding("N", "search_next(-1)", "Previous match", show=False),
        Binding("escape", "end_search", "End search", show=False),
    ]
    STYLE_PREFIX = "lineview--"
    FILL_ROWS = False
    """Paint a styled row's background to the right edge (diff lines, like lazygit)."""
    CURSOR = False
    """Keep a row cursor (up / down move it; the view scrolls to keep it in sight)."""

    follow: reactive[bool] = reactive(False)
    """Stick to the end as rows arrive (turned off by scrolling up, on by `end`)."""

    class SearchAsked(Message):
        """`/` or `ctrl+f` in the view: its container shows the search bar."""

        def __init__(self, view: LineView) -> None:
            super().__init__()
            self.view = view

    class SearchMoved(Message):
        """The search found other matches, or moved to another one (the bar's count)."""

        def __init__(self, view: LineView) -> None:
            super().__init__()
            self.view = view

    def __init__(self, *, name: str | None = None, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._cache: LRUCache[int, Strip] = LRUCache(2048)
        self._styles: dict[str, Style] = {}
        self._base: tuple[bool, Style] | None = None
        self._width = 0
        self._prefetch_timer: Timer | None = None
        self.cursor = -1  # the cursor's row (CURSOR views; -1: none yet)
        self.query_text = ""  # what the search looks for ("": no search)
        self.matches: list[int] = []  # rows holding it, in order
        self.match_index = -1  # the current one (index into matches)

    # --- data model for subclasses -------------------------------------------------------
    def row_count(self) -> int:
        raise NotImplementedError

    def get_row(self, index: int) -> Row:
        raise NotImplementedError

    def row_marked(self, index: int) -> bool:
        """Paint row ``index`` as the cursor's (a selected range of rows, in a subclass)."""
        return False

    def row_text(self, index: int) -> str:
        """A row as plain text (what the search looks in)."""
        return "".join(chunk for _, chunk in self.get_row(index))

    # --- bookkeeping ---------------------------------------------------------------------
    def reset_view(self, width: int) -> None:
        """The rows were replaced: forget cached strips and resize."""
        self._cache.clear()
        self._width = width
        self.virtual_size = Size(self._width, self.row_count())
        if self.CURSOR:
            count = self.row_count()
            self.cursor = count - 1 if self.follow or self.cursor >= count else self.cursor
        if self.query_text:
            self._find(keep=True)
        if self.follow:
            self.scroll_end(animate=False, immediate=True, x_axis=False)
        self.refresh()

    def rows_appended(self, first: int, width: int) -> None:
        """Rows from ``first`` on are new: extend the virtual size, follow if asked."""
        self._width = max(self._width, width)
        count = self.row_count()
        self.virtual_size = Size(self._width, count)
        for y in range(first, count):
            self._cache.discard(y)
        if self.query_text:
            needle = self.query_text.lower()
            found = [i for i in range(first, count) if needle in self.row_text(i).lower()]
            if found:
                self.matches.extend(found)
                self.post_message(self.SearchMoved(self))
        if self.follow:
            if self.CURSOR and count:
                self._cache.discard(self.cursor)
                self.cursor = count - 1
            self.scroll_end(animate=False, immediate=True, x_axis=False)
        self.refresh()

    def rows_prepended(self, count: int) -> None:
        """``count`` rows went before the others: the cursor and the matches move down."""
        if self.CURSOR and self.cursor >= 0:
            self.cursor += count
        if self.query_text:
            self._find(keep=True)

    # --- the cursor ----------------------------------------------------------------------
    def move_cursor(self, row: int) -> None:
        """Put the cursor on ``row`` (clamped) and scroll it into sight."""
        count = self.row_count()
        if not count:
            return
        row = max(0, min(row, count - 1))
        if row != self.cursor:
            self._cache.discard(self.cursor)
            self._cache.discard(row)
            self.cursor = row
        self._scroll_to_row(row)
        self.refresh()

    def _scroll_to_row(self, row: int) -> None:
        height = max(1, self.scrollable_content_region.height)
        top = int(self.scroll_y)
        if row < top:
            self.scroll_to(y=row, animate=False, immediate=True)
        elif row >= top + height:
            self.scroll_to(y=row - height + 1, animate=False, immediate=True)

    def on_click(self, event: events.Click) -> None:
        if not self.CURSOR:
            return
        offset = event.get_content_offset(self)
        if offset is not None:
            row = int(self.scroll_y) + offset.y
            if row < self.row_count():
                if row < self.row_count() - 1:
                    self._unfollow()
                self.move_cursor(row)

    # --- search --------------------------------------------------------------------------
    def action_search(self) -> None:
        self.post_message(self.SearchAsked(self))

    def set_search(self, text: str) -> None:
        """Look for ``text`` (case-insensitive; "" ends the search) and go to the first
        match at or after the cursor (or the top of the view)."""
        self.query_text = text
        self._find(keep=False)
        self._cache.clear()
        self.refresh()
        self.post_message(self.SearchMoved(self))

    def _find(self, *, keep: bool) -> None:
        needle = self.query_text.lower()
        current = self.matches[self.match_index] if keep and 0 <= self.match_index < len(
            self.matches) else None
        self.matches = [i for i in range(self.row_count())
                        if needle in self.row_text(i).lower()] if needle else []
        if not self.matches:
            self.match_index = -1
            return
        if current is not None and current in self.matches:
            self.match_index = self.matches.index(current)
            return
        start = self.cursor if self.CURSOR and self.cursor >= 0 else int(self.scroll_y)
        after = [n for n, row in enumerate(self.matches) if row >= start]
        self.match_index = after[0] if after else 0
        self._show_match()

    def _show_match(self) -> None:
        if not 0 <= self.match_index < len(self.matches):
            return
        row = self.matches[self.match_index]
        self._unfollow()
        if self.CURSOR:
            self.move_cursor(row)
        else:
            self._scroll_to_row(row)

    def action_search_next(self, step: int) -> None:
        if not self.matches:
            return
        old = self.matches[self.match_index] if self.match_index >= 0 else None
        self.match_index = (self.match_index + step) % len(self.matches)
        self._cache.discard(self.matches[self.match_index])
        if old is not None:
            self._cache.discard(old)
        self._show_match()
        self.refresh()
        self.post_message(self.SearchMoved(self))

    def action_end_search(self) -> None:
        self.set_search("")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("search_next", "end_search"):
            return bool(self.query_text)  # else the key goes on to the screen (n: new)
        return True

    @property
    def search_status(self) -> str:
        """"3/17", "no match" or "" (no search), for the search bar."""
        if not self.query_text:
            return ""
        if not self.matches:
            return "no match"
        return f"{self.match_index + 1}/{len(self.matches)}"

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()
        self._cache.clear()
        self._base = None

    def _base_style(self) -> Style:
        """``rich_style`` (it walks every ancestor) once per focus state, not per line."""
        key = self.has_focus
        if self._base is None or self._base[0] != key:
            self._base = (key, self.rich_style)
            self._cache.clear()
        return self._base[1]

    def on_resize(self) -> None:
        self._cache.clear()  # filled rows were cut to the old width

    def _style(self, name: str) -> Style:
        style = self._styles.get(name)
        if style is None:
            style = text_style(self, self.STYLE_PREFIX + name) if name else Style()
            self._styles[name] = style
        return style

    # --- rendering -----------------------------------------------------------------------
    PREFETCH_SLICE = 0.006
    """Seconds one slice of building the next page's rows ahead may take (a key pressed
    meanwhile waits at most this long)."""

    def render_lines(self, crop: Region) -> list[Strip]:
        strips = super().render_lines(crop)
        if self._prefetch_timer is None and self.row_count() > self.size.height:
            # after this frame is out: build the pages either side of it while idle, so a
            # page key finds its rows made (a page of coloured rows costs ~1 ms a row)
            self._prefetch_timer = self.set_timer(0.005, self._prefetch)
        return strips

    def _prefetch_rows(self) -> list[int]:
        """The rows a page key shows next: the page below, then the page above."""
        top = int(self.scroll_y)
        height = self.size.height
        count = self.row_count()
        below = range(top + height, min(count, top + 2 * height))
        above = range(max(0, top - height), top)
        return [*below, *reversed(above)]

    def _prefetch(self) -> None:
        self._prefetch_timer = None
        if not self.display or not self.size.height:
            return
        deadline = time.perf_counter() + self.PREFETCH_SLICE
        for index in self._prefetch_rows():
            if index in self._cache:
                continue
            if time.perf_counter() > deadline or not self._prefetch_row(index):
                self._prefetch_timer = self.set_timer(0.005, self._prefetch)
                return

    def _prefetch_row(self, index: int) -> bool:
        """Build and keep row ``index``'s strip ahead of its paint (False: try later)."""
        self._row_strip(index, self._base_style())
        return True

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.size.width
        base = self._base_style()
        if index >= self.row_count():
            return Strip.blank(width, base)
        return self._row_strip(index, base).crop_extend(scroll_x, scroll_x + width, base)

    def _row_strip(self, index: int, base: Style) -> Strip:
        """Row ``index`` as one strip of the view's whole width (cached)."""
        cached = self._cache.get(index)
        if cached is None:
            scroll_x = self.scroll_offset.x
            width = self.size.width
            text = Text(no_wrap=True, end="")
            fill = base
            for name, chunk in self.get_row(index):
                style = base + self._style(name) if name else base
                text.append(chunk, style)
                if self.FILL_ROWS:
                    fill = style
            if self.CURSOR and (index == self.cursor or self.row_marked(index)):
                fill = base + self._own_style("cursor")
                text.stylize(self._own_style("cursor"))
            if self.query_text:
                self._highlight(text, index)
            strip = Strip(text.render(self.app.console), text.cell_len)
            cached = self._cache[index] = strip if fill is base else strip.extend_cell_length(
                max(self._width, width) + scroll_x, fill)
        return cached

    def _own_style(self, name: str) -> Style:
        """A style of LineView itself (match, cursor), whatever the subclass's prefix."""
        key = "\0" + name
        style = self._styles.get(key)
        if style is None:
            style = self._styles[key] = self.get_component_rich_style(f"lineview--{name}")
        return style

    def _highlight(self, text: Text, index: int) -> None:
        plain = text.plain.lower()
        needle = self.query_text.lower()
        current = 0 <= self.match_index < len(self.matches) \
            and self.matches[self.match_index] == index
        style = self._own_style("match-current" if current else "match")
        at = plain.find(needle)
        while at >= 0 and needle:
            text.stylize(style, at, at + len(needle))
            at = plain.find(needle, at + len(needle))

    # --- follow mode ---------------------------------------------------------------------
    def _unfollow(self) -> None:
        if self.follow:
            self.follow = False

    def _refollow_if_at_end(self) -> None:
        if self.is_vertical_scroll_end and not self.follow:
            self.follow = True

    def _page(self) -> int:
        return max(1, self.scrollable_content_region.height - 1)

    def action_scroll_up(self) -> None:
        self._unfollow()
        if self.CURSOR and self.row_count():
            self.move_cursor(self.cursor - 1)
            return
        super().action_scroll_up()

    def action_page_up(self) -> None:
        self._unfollow()
        if self.CURSOR and self.row_count():
            self.move_cursor(self.cursor - self._page())
            return
        super().action_page_up()

    def action_scroll_home(self) -> None:
        self._unfollow()
        if self.CURSOR and self.row_count():
            self.move_cursor(0)
        super().action_scroll_home()

    def action_scroll_end(self) -> None:
        self.follow = True
        if self.CURSOR and self.row_count():
            self.move_cursor(self.row_count() - 1)
        super().action_scroll_end()

    def action_scroll_down(self) -> None:
        if self.CURSOR and self.row_count():
            self.move_cursor(self.cursor + 1)
            if self.cursor >= self.row_count() - 1:
                self.follow = True
            return
        super().action_scroll_down()
        self.call_after_refresh(self._refollow_if_at_end)

    def action_page_down(self) -> None:
        if self.CURSOR and self.row_count():
            self.move_cursor(self.cursor + self._page())
            if self.cursor >= self.row_count() - 1:
                self.follow = True
            return
        super().action_page_down()
        self.call_after_refresh(self._refollow_if_at_end)

    def on_mouse_scroll_up(self, event: MouseScrollUp) -> None:
        self._unfollow()

    class FollowChanged(Message):
        """Following switched on or off (the caption says which)."""

    def watch_follow(self, follow: bool) -> None:
        self.post_message(self.FollowChanged())
        if follow:
            if self.CURSOR and self.row_count():
                self._cache.discard(self.cursor)
                self.cursor = self.row_count() - 1
                self._cache.discard(self.cursor)
            self.scroll_end(animate=False, immediate=True, x_axis=False)


class SearchBar(Horizontal):
    """The search box of one view (hidden until the view asks for it): typing searches,
    enter keeps the search and goes back to the view (`n` / `N` move on), escape ends it."""

    DEFAULT_CSS = """
    SearchBar {
        height: 1;
        display: none;
        background: $boost;
        & > Input, & > Input:focus {
            width: 1fr; height: 1; border: none; padding: 0 1; background: $boost;
        }
        & > Label { width: auto; padding: 0 1; color: $text-muted; }
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "End search", show=False),
    ]

    def __init__(self, view: LineView, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.view = view
        self._input = Input(placeholder="search (enter: keep · n / N: next / previous · "
                            "escape: end)", classes="search-input")
        self._count = Label("", markup=False)

    def compose(self) -> ComposeResult:
        yield self._input
        yield self._count

    @property
    def value(self) -> str:
        return self._input.value

    def open(self) -> None:
        """Show the bar with the current search, and type in it."""
        self.display = True
        self._input.value = self.view.query_text
        self._input.focus()
        self.show_count()

    def show_count(self) -> None:
        self._count.update(self.view.search_status)

    def sync(self) -> None:
        """The view's search moved or ended (escape in the view): say so."""
        if not self.view.query_text:
            self._input.value = ""
            self.display = False
        self.show_count()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.view.set_search(event.value)
        self.show_count()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if not event.value:
            self.display = False
        self.view.focus()

    def action_close(self) -> None:
        self.view.set_search("")
        self._input.value = ""
        self.display = False
        self.view.focus()


class TextLines(LineView):
    """Plain rows of text, each with a style name: a tool call's whole input and output,
    searchable like the stream and the diff."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"text--head", "text--error", "text--dim"}
    STYLE_PREFIX = "text--"
    DEFAULT_CSS = """
    TextLines {
        & > .text--head { color: $accent; text-style: bold; }
        & > .text--error { color: $text-error; }
        & > .text--dim { color: $text-muted; }
    }
    """

    def __init__(self, rows: list[tuple[str, str]] | None = None, *,
                 id: str | None = None) -> None:
        super().__init__(id=id)
        self._rows: list[tuple[str, str]] = list(rows or [])
        self._width = max((len(text) for _, text in self._rows), default=0)

    def row_count(self) -> int:
        return len(self._rows)

    def get_row(self, index: int) -> Row:
        return (self._rows[index],)

    def on_mount(self) -> None:
        self.reset_view(self._width)

    def plain_lines(self) -> list[str]:
        return [text for _, text in self._rows]
