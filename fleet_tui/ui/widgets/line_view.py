"""A virtual scrolling view of styled lines (toolong style).

Only the lines on screen are turned into strips, and those are cached; the data behind the
view is a plain list. So a 20,000-line diff or an attempt with 100,000 events costs one list
and a screenful of rendering, never one widget per line.
"""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.cache import LRUCache
from textual.events import MouseScrollUp
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widget import Widget

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
        &:focus { background-tint: $foreground 4%; }
    }
    """
    STYLE_PREFIX = "lineview--"
    FILL_ROWS = False
    """Paint a styled row's background to the right edge (diff lines, like lazygit)."""

    follow: reactive[bool] = reactive(False)
    """Stick to the end as rows arrive (turned off by scrolling up, on by `end`)."""

    def __init__(self, *, name: str | None = None, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._cache: LRUCache[int, Strip] = LRUCache(2048)
        self._styles: dict[str, Style] = {}
        self._base: tuple[bool, Style] | None = None
        self._width = 0

    # --- data model for subclasses -------------------------------------------------------
    def row_count(self) -> int:
        raise NotImplementedError

    def get_row(self, index: int) -> Row:
        raise NotImplementedError

    # --- bookkeeping ---------------------------------------------------------------------
    def reset_view(self, width: int) -> None:
        """The rows were replaced: forget cached strips and resize."""
        self._cache.clear()
        self._width = width
        self.virtual_size = Size(self._width, self.row_count())
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
        if self.follow:
            self.scroll_end(animate=False, immediate=True, x_axis=False)
        self.refresh()

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
    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.size.width
        base = self._base_style()
        if index >= self.row_count():
            return Strip.blank(width, base)
        cached = self._cache.get(index)
        if cached is None:
            text = Text(no_wrap=True, end="")
            fill = base
            for name, chunk in self.get_row(index):
                style = base + self._style(name) if name else base
                text.append(chunk, style)
                if self.FILL_ROWS:
                    fill = style
            strip = Strip(text.render(self.app.console), text.cell_len)
            cached = self._cache[index] = strip if fill is base else strip.extend_cell_length(
                max(self._width, width) + scroll_x, fill)
        return cached.crop_extend(scroll_x, scroll_x + width, base)

    # --- follow mode ---------------------------------------------------------------------
    def _unfollow(self) -> None:
        if self.follow:
            self.follow = False

    def _refollow_if_at_end(self) -> None:
        if self.is_vertical_scroll_end and not self.follow:
            self.follow = True

    def action_scroll_up(self) -> None:
        self._unfollow()
        super().action_scroll_up()

    def action_page_up(self) -> None:
        self._unfollow()
        super().action_page_up()

    def action_scroll_home(self) -> None:
        self._unfollow()
        super().action_scroll_home()

    def action_scroll_end(self) -> None:
        self.follow = True
        super().action_scroll_end()

    def action_scroll_down(self) -> None:
        super().action_scroll_down()
        self.call_after_refresh(self._refollow_if_at_end)

    def action_page_down(self) -> None:
        super().action_page_down()
        self.call_after_refresh(self._refollow_if_at_end)

    def on_mouse_scroll_up(self, event: MouseScrollUp) -> None:
        self._unfollow()

    class FollowChanged(Message):
        """Following switched on or off (the caption says which)."""

    def watch_follow(self, follow: bool) -> None:
        self.post_message(self.FollowChanged())
        if follow:
            self.scroll_end(animate=False, immediate=True, x_axis=False)
