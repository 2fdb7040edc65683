"""Two one-line bars of the main screen, each a single widget: the key bar (footer) and the
tab bar over the stream | diff views.

Textual's Footer builds one widget per key and rebuilds them all whenever the bindings
change; TabbedContent brings tabs, an animated underline and panes. On the first frame the
two cost ~60 ms of styling and layout (start-up budget: 1.5x a bare Textual app). These draw
the same information as one line of text each, and still answer the mouse.
"""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

TYPE_CHECKING = False
if TYPE_CHECKING:
    from textual.screen import Screen


class KeyBar(Widget):
    """The key bar: the keys that apply now and what they do (dimmed when check_action
    answers None: it applies to the selection but cannot be done now), the command palette
    key at the right. Redrawn when the screen's bindings change; a click presses the key,
    or on a dimmed one asks the screen to say why not (``Refused``).

    The keys go in ``order`` (binding ids, the most important first; the others after, in
    the screen's order). What does not fit the width is left out whole, never cut in a
    word: the ``pinned`` keys always stay (help, quit), and the help key then says how many
    it holds besides ("? Help +3")."""

    ALLOW_SELECT = False
    COMPONENT_CLASSES = {"keybar--key", "keybar--description"}
    DEFAULT_CSS = """
    KeyBar {
        dock: bottom;
        height: 1;
        color: $footer-foreground;
        background: $footer-background;
        & > .keybar--key { color: $footer-key-foreground; background: $footer-key-background;
                           text-style: bold; }
        & > .keybar--description { color: $footer-description-foreground;
                                   background: $footer-description-background; }
    }
    """

    class Refused(Message):
        """A dimmed key was clicked; the screen says why it cannot be done now."""

        def __init__(self, binding: Binding) -> None:
            super().__init__()
            self.binding = binding

    def __init__(self, *, order: tuple[str, ...] = (), pinned: tuple[str, ...] = (),
                 more: str | None = None, id: str | None = None) -> None:
        """``order``: binding ids, most important first; ``pinned``: ids always shown;
        ``more``: the id of the key that shows the rest (the help), which counts them."""
        super().__init__(id=id)
        self._order = {binding_id: n for n, binding_id in enumerate(order)}
        self._pinned = frozenset(pinned)
        self._more = more
        self._entries: list[tuple[Binding, bool]] = []  # what applies, in bar order
        self._spans: list[tuple[int, int, Binding, bool]] = []  # (start, end, binding, on)
        self._laid_out: tuple[int, int] | None = None  # (width, entries) of _text
        self._text = Text()
        self._palette: Binding | None = None
        self._palette_at = -1  # where the palette key starts (-1: not shown)
        self._stale = True  # the bindings changed since the text was built

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _bindings_changed(self, screen: Screen[object]) -> None:
        """Built again when next painted: the bindings change several times before the
        first frame (mount, focus), and a rebuild asks every binding's check_action."""
        if self.is_attached and screen is self.screen:
            self._stale = True
            self.refresh()

    def _rebuild(self) -> None:
        """What applies now, in bar order (laid out for a width when painted)."""
        self._stale = False
        self._laid_out = None
        active = self.screen.active_bindings
        palette: Binding | None = None
        if self.app.ENABLE_COMMAND_PALETTE:
            found = active.get(self.app.COMMAND_PALETTE_BINDING)
            palette = found.binding if found is not None else None
        entries: list[tuple[Binding, bool]] = []
        seen: set[str] = set()
        for _node, binding, enabled, _tooltip in active.values():
            if not binding.show or binding.action in seen or binding is palette:
                continue
            seen.add(binding.action)
            entries.append((binding, enabled))
        last = len(self._order)
        entries.sort(key=lambda e: self._order.get(e[0].id or "", last))  # stable
        self._palette = palette
        self._entries = entries

    def _entry_text(self, binding: Binding, enabled: bool, extra: str = "") -> Text:
        dim = Style() if enabled else Style(dim=True)  # check_action said None
        return Text.assemble(
            (f" {self.app.get_key_display(binding)} ",
             self.get_component_rich_style("keybar--key") + dim),
            (f"{binding.description}{extra} ",
             self.get_component_rich_style("keybar--description") + dim))

    def _lay_out(self, room: int) -> None:
        """The entries that fit in ``room`` cells, whole: the pinned ones first, then the
        others by importance until one does not fit; shown in bar order."""
        entries = self._entries
        texts = [self._entry_text(b, on) for b, on in entries]
        used = sum(t.cell_len for (b, _), t in zip(entries, texts, strict=True)
                   if b.id in self._pinned)
        keep = {n for n, (b, _) in enumerate(entries) if b.id in self._pinned}
        more_at = next((n for n, (b, _) in enumerate(entries) if b.id == self._more), None)
        for n, text in enumerate(texts):
            if n in keep:
                continue
            left = len(entries) - len(keep) - 1  # the others, were this one kept
            extra = len(f" +{left}") if more_at is not None and left else 0
            if used + text.cell_len + extra > room:
                break
            keep.add(n)
            used += text.cell_len
        hidden = len(entries) - len(keep)
        out = Text(no_wrap=True, overflow="ellipsis", end="")
        spans: list[tuple[int, int, Binding, bool]] = []
        for n, (binding, enabled) in enumerate(entries):
            if n not in keep:
                continue
            start = len(out)
            out.append_text(self._entry_text(binding, enabled, f" +{hidden}")
                            if n == more_at and hidden else texts[n])
            spans.append((start, len(out), binding, enabled))
        self._text = out
        self._spans = spans

    def render(self) -> Text:
        if self._stale:
            self._rebuild()
        width = self.size.width
        palette = self._palette
        tail = Text()
        if palette is not None:
            tail = Text.assemble(
                ("▏", "dim"),
                (f" {self.app.get_key_display(palette)} ",
                 self.get_component_rich_style("keybar--key")),
                (f"{palette.description} ", self.get_component_rich_style(
                    "keybar--description")))
        room = max(0, width - tail.cell_len)
        if self._laid_out != (room, len(self._entries)):
            self._lay_out(room)
            self._laid_out = (room, len(self._entries))
        text = self._text.copy()
        self._palette_at = -1
        if palette is not None and room > 0:
            text.truncate(room, overflow="ellipsis", pad=True)
            text.append_text(tail)
            self._palette_at = room
        return text

    def on_click(self, event: events.Click) -> None:
        x = event.x
        palette = self._palette
        if palette is not None and 0 <= self._palette_at <= x:
            self.app.simulate_key(palette.key)
            return
        for start, end, binding, enabled in self._spans:
            if start <= x < end:
                if enabled:
                    self.app.simulate_key(binding.key)
                else:
                    self.app.bell()
                    self.post_message(self.Refused(binding))
                return


class TabBar(Widget, can_focus=True):
    """Tab titles on one line; the active one is underlined and bold. Left/right (when
    focused) and a click choose a tab; the screen shows it (``Changed``). A click leaves
    the focus where it was (on the task list): choosing what to look at does not move the
    keys. ``note``, at the right, says where the keys are (whole, or not at all)."""

    ALLOW_SELECT = False
    FOCUS_ON_CLICK = False
    BINDINGS = [
        Binding("left", "move(-1)", "Previous tab", show=False),
        Binding("right", "move(1)", "Next tab", show=False),
    ]
    COMPONENT_CLASSES = {"tabbar--active", "tabbar--inactive", "tabbar--note"}
    DEFAULT_CSS = """
    TabBar {
        height: 1;
        background: $surface;
        & > .tabbar--active { color: $foreground; text-style: bold underline; }
        & > .tabbar--inactive { color: $text-muted; }
        & > .tabbar--note { color: $text-muted; }
        &:focus > .tabbar--active { color: $block-cursor-foreground;
                                    background: $block-cursor-background; }
    }
    """

    active: reactive[str] = reactive("", init=False)
    note: reactive[str] = reactive("", init=False)

    class Changed(Message):
        """A tab was chosen on the bar."""

        def __init__(self, tab: str) -> None:
            super().__init__()
            self.tab = tab

    def __init__(self, tabs: list[tuple[str, str]], active: str, *,
                 id: str | None = None) -> None:
        """``tabs``: (id, title) pairs in order."""
        super().__init__(id=id)
        self.tabs = tabs
        self.set_reactive(TabBar.active, active)
        self._spans: list[tuple[int, int, str]] = []

    def render(self) -> Text:
        on = self.get_component_rich_style("tabbar--active")
        off = self.get_component_rich_style("tabbar--inactive")
        text = Text(no_wrap=True, end="")
        spans: list[tuple[int, int, str]] = []
        for tab_id, title in self.tabs:
            text.append(" ")
            start = len(text)
            text.append(f" {title} ", on if tab_id == self.active else off)
            spans.append((start, len(text), tab_id))
        self._spans = spans
        room = self.size.width - text.cell_len - 1
        if self.note and len(self.note) + 2 <= room:
            text.append(" " * (room - len(self.note)))
            text.append(self.note, self.get_component_rich_style("tabbar--note"))
        return text

    def watch_active(self) -> None:
        self.refresh()

    def watch_note(self) -> None:
        self.refresh()

    def _choose(self, tab: str) -> None:
        if tab != self.active:
            self.active = tab
            self.post_message(self.Changed(tab))

    def action_move(self, step: int) -> None:
        ids = [t for t, _ in self.tabs]
        index = ids.index(self.active) if self.active in ids else 0
        self._choose(ids[(index + step) % len(ids)])

    def on_click(self, event: events.Click) -> None:
        for start, end, tab in self._spans:
            if start <= event.x < end:
                self._choose(tab)
                return
