"""Diff review: a file list with status and +/- counts beside a coloured unified diff.

The diff is a list of strings; a line is classified (added, removed, hunk, header) only
when it is painted, so a 20,000-line patch paints its first screen at once.

Review comments are rows the view adds under their lines (``set_comments``); the
patch itself is never copied. The cursor (up / down) and a range (shift+up / shift+down)
say which lines a new comment is on (``DiffView.lines_at_cursor``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar, NamedTuple

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.geometry import Region
from textual.message import Message
from textual.strip import Strip
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from fleet_tui.core.diffwords import (
    DiffLayout,
    ViewMark,
    layout_of,
    next_start,
    toggle_viewed,
    view_mark,
)
from fleet_tui.ui.diff_render import SYNTAX_CLASSES, DiffRenderer
from fleet_tui.ui.formatting import ALL_FILES, PreparedDiff, Row, clean
from fleet_tui.ui.widgets.line_view import LineView, text_style

TYPE_CHECKING = False
if TYPE_CHECKING:  # GitPython is slow to import: the panel's first frame does not wait
    from fleet_tui.core.review import DiffLine
    from fleet_tui.store.reviews import ReviewComment

STATUS_MARKS = {"added": "A", "modified": "M", "deleted": "D", "untracked": "?",
                "renamed": "R"}
__all__ = ["ALL_FILES", "DiffLines", "DiffView", "FileList", "PreparedDiff"]


class DiffLines(LineView):
    """The patch text: each line coloured by its kind, its syntax and its changed words
    when it is painted (ui/diff_render.py), never the whole patch up front."""

    COMPONENT_CLASSES = {"diff--add", "diff--del", "diff--hunk", "diff--header",
                         "diff--empty", "diff--nonl", "diff--word", "diff--add-word",
                         "diff--del-word", "diff--comment-open", "diff--comment-addressed",
                         "diff--comment-outdated",
                         *(f"diff--syn-{name}" for name in SYNTAX_CLASSES)}
    STYLE_PREFIX = "diff--"
    FILL_ROWS = True
    CURSOR = True
    # Syntax colours are the theme's text colours (the $text-* variables are made to be
    # read on the theme's surfaces and on its -muted backgrounds, the added and removed
    # lines'), so every theme stays readable; changed words get the stronger background.
    DEFAULT_CSS = """
    DiffLines {
        & > .diff--comment-open { color: $text-warning; background: $warning-muted; }
        & > .diff--comment-addressed { color: $text-success; background: $success-muted; }
        & > .diff--comment-outdated { color: $text-muted; background: $panel;
                                      text-style: italic; }
        & > .diff--add { color: $text-success; background: $success-muted; }
        & > .diff--del { color: $text-error; background: $error-muted; }
        & > .diff--hunk { color: $accent; text-style: bold; }
        & > .diff--header { color: $text-muted; text-style: bold; }
        & > .diff--empty { color: $text-muted; text-style: italic; }
        & > .diff--nonl { color: $text-muted; text-style: italic; }
        & > .diff--add-word { background: $success 45%; text-style: bold; }
        & > .diff--del-word { background: $error 45%; text-style: bold; }
        & > .diff--syn-kw { color: $text-accent; }
        & > .diff--syn-const { color: $text-warning; }
        & > .diff--syn-str { color: $text-success; }
        & > .diff--syn-num { color: $text-warning; }
        & > .diff--syn-com { color: $text-muted; text-style: italic; }
        & > .diff--syn-fn { color: $text-primary; }
        & > .diff--syn-cls { color: $text-warning; text-style: bold; }
        & > .diff--syn-bi { color: $text-secondary; }
        & > .diff--syn-deco { color: $text-primary; text-style: bold; }
        & > .diff--syn-tag { color: $text-primary; }
        & > .diff--syn-attr { color: $text-warning; }
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("shift+down", "select(1)", "Select down", show=False),
        Binding("shift+up", "select(-1)", "Select up", show=False),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._lines: list[str] = []
        self._empty = "No changes."
        self._renderer: DiffRenderer | None = None
        self._jumped: int | None = None  # the row the last jump went to
        # with comments shown: each row of the view, a patch line's index or a comment row
        self._rows: list[int | Row] | None = None
        self.select_from: int | None = None  # the other end of a selected range (rows)
        self._extending = False

    def row_count(self) -> int:
        if self._rows is not None:
            return len(self._rows)
        return len(self._lines) or 1

    def get_row(self, index: int) -> Row:
        if self._rows is not None:
            ref = self._rows[index]
            if not isinstance(ref, int):
                return ref  # a comment's row
            index = ref
        if not self._lines or self._renderer is None:
            return (("empty", self._empty),)
        return self._renderer.row(index)

    LEX_BUDGET = 0.012
    """Seconds of syntax colouring one paint may spend; lines past it are painted without
    their syntax colours and coloured by the next paint, a moment later."""

    def render_lines(self, crop: Region) -> list[Strip]:
        renderer = self._renderer
        if renderer is None:
            return super().render_lines(crop)
        renderer.lex_until = time.perf_counter() + self.LEX_BUDGET
        try:
            return super().render_lines(crop)
        finally:
            renderer.lex_until = None
            if renderer.pending:
                renderer.pending = False
                self.set_timer(0.02, self.refresh)

    def render_line(self, y: int) -> Strip:
        strip = super().render_line(y)
        if self._renderer is not None and self._renderer.pending:
            # past the paint's budget: this row is not kept, the next paint colours it
            self._cache.discard(int(self.scroll_offset.y) + y)
        return strip

    # With the cursor still hidden (no line picked yet), a page key turns the page, as in
    # a pager: moving a hidden cursor by a page kept it on screen and nothing scrolled.
    def action_page_down(self) -> None:
        if self.cursor < 0:
            self.scroll_to(y=self.scroll_y + self._page(), animate=False, immediate=True)
            return
        super().action_page_down()

    def action_page_up(self) -> None:
        if self.cursor < 0:
            self.scroll_to(y=max(0, self.scroll_y - self._page()), animate=False,
                           immediate=True)
            return
        super().action_page_up()

    def row_text(self, index: int) -> str:
        """The line as it is (a search must not colour the whole patch to look in it)."""
        if self._rows is not None:
            ref = self._rows[index]
            if not isinstance(ref, int):
                return "".join(text for _, text in ref)  # a comment's row
            index = ref
        return self._lines[index] if self._lines else self._empty

    def set_lines(self, lines: list[str], width: int, *, keep_scroll: bool = False,
                  empty: str = "No changes.", renderer: DiffRenderer | None = None) -> None:
        y = self.scroll_y
        self._lines = lines
        self._empty = empty
        self._renderer = renderer if renderer is not None else DiffRenderer(
            lines, layout_of(lines), [])
        self._rows = None
        self.select_from = None
        if not keep_scroll:
            self._jumped = None
            self.cursor = -1
        self.reset_view(width)
        if keep_scroll:
            self.scroll_to(y=y, animate=False, immediate=True)
        else:
            self.scroll_to(0, 0, animate=False, immediate=True)

    @property
    def lines(self) -> list[str]:
        return self._lines

    @property
    def renderer(self) -> DiffRenderer | None:
        return self._renderer

    @property
    def top_row(self) -> int:
        """The patch line a jump measures from: the cursor's (a cursor view), else the row
        the last jump went to while it is on screen (the end of a patch cannot scroll to
        the top), else the first row on screen; a comment's row counts as the patch line
        above it."""
        if self.CURSOR and self.cursor >= 0:
            row = self.cursor
        else:
            row = top = int(self.scroll_y)
            height = max(1, self.scrollable_content_region.height)
            if self._jumped is not None and top <= self._jumped < top + height:
                row = self._jumped
        while row > 0 and self.patch_index(row) is None:
            row -= 1
        index = self.patch_index(row)
        return row if index is None else index

    def go_to_row(self, row: int) -> None:
        """Bring patch line ``row`` to the top of the view (the cursor onto it, for a
        cursor view)."""
        view = self.row_of(row)
        self._jumped = view
        if self.CURSOR:
            self.move_cursor(view)
        self.scroll_to(y=view, animate=False, immediate=True)

    def _style(self, name: str) -> Style:
        """A span's style: its kind's, its syntax class's and its changed word's, added
        (cached by the span's name)."""
        style = self._styles.get(name)
        if style is None:
            kind, *parts = name.split(" ")
            style = super()._style(kind)
            for part in parts:
                if part == "word":
                    style += self._blended(f"{kind}-word" if kind in ("add", "del")
                                           else "word")
                else:
                    style += super()._style(part)
            self._styles[name] = style
        return style

    def _blended(self, name: str) -> Style:
        """A component style with its background blended over the view's (an alpha
        background such as ``$success 45%``, which the partial style leaves unblended)."""
        partial = text_style(self, self.STYLE_PREFIX + name)
        full = self.get_component_rich_style(self.STYLE_PREFIX + name)
        return partial + Style(bgcolor=full.bgcolor) if partial.bgcolor else partial

    # --- review comments -----------------------------------------------------------------
    def set_comments(self, under: dict[int, list[Row]]) -> None:
        """Show ``under[i]``'s rows below patch line ``i`` (none: the patch alone); the
        cursor stays on its patch line."""
        at = self.patch_index(self.cursor) if self.cursor >= 0 else None
        if not under:
            self._rows = None
        else:
            rows: list[int | Row] = []
            for index in range(len(self._lines)):
                rows.append(index)
                rows.extend(under.get(index, ()))
            self._rows = rows
            self._width = max(self._width, *(sum(len(text) for _, text in row)
                                             for added in under.values() for row in added))
        self.select_from = None
        self.reset_view(self._width)
        if at is not None:
            self.cursor = self.row_of(at)

    def patch_index(self, row: int) -> int | None:
        """The patch line shown at view row ``row`` (None: a comment's row, or none)."""
        if self._rows is None:
            return row if 0 <= row < len(self._lines) else None
        ref = self._rows[row] if 0 <= row < len(self._rows) else None
        return ref if isinstance(ref, int) else None

    def row_of(self, index: int) -> int:
        """The view row of patch line ``index``."""
        if self._rows is None:
            return index
        for row, ref in enumerate(self._rows):
            if ref == index:
                return row
        return index

    def selected_patch_lines(self) -> list[int]:
        """The patch lines of the cursor's row, or of the selected range (shift+arrows);
        with no cursor yet, the first line on screen."""
        cursor = self.cursor if self.cursor >= 0 else int(self.scroll_y)
        low, high = sorted((cursor, cursor if self.select_from is None else self.select_from))
        found = [self.patch_index(row) for row in range(low, high + 1)]
        return [i for i in found if i is not None]

    def row_marked(self, index: int) -> bool:
        if self.select_from is None:
            return False
        low, high = sorted((self.cursor, self.select_from))
        return low <= index <= high

    def move_cursor(self, row: int) -> None:
        if not self._extending and self.select_from is not None:
            self.select_from = None
            self._cache.clear()
        super().move_cursor(row)

    def action_select(self, step: int) -> None:
        """shift+down / shift+up: grow or shrink the range a comment will be on."""
        if self.cursor < 0:
            self.cursor = int(self.scroll_y)
        if self.select_from is None:
            self.select_from = self.cursor
        self._extending = True
        try:
            self.move_cursor(self.cursor + step)
        finally:
            self._extending = False
        self._cache.clear()
        self.refresh()


class FileList(OptionList):
    """Changed files: a status letter, the viewed mark, the path and +/- counts."""

    COMPONENT_CLASSES = {"filelist--add", "filelist--del", "filelist--mark",
                         "filelist--viewed", "filelist--changed"}
    DEFAULT_CSS = """
    FileList {
        & > .filelist--add { color: $text-success; }
        & > .filelist--del { color: $text-error; }
        & > .filelist--mark { color: $accent; text-style: bold; }
        & > .filelist--viewed { color: $text-muted; }
        & > .filelist--changed { color: $text-warning; text-style: bold; }
    }
    """

    def label(self, mark: str, path: str, added: int, deleted: int,
              styles: LabelStyles | None = None, *, viewed: ViewMark | None = None) -> Text:
        """One file's line; pass ``label_styles()`` when labelling many (looking a component
        style up costs more than building the label). ``viewed``: the file's viewed mark
        (✓ viewed, its path dimmed; ! changed since it was viewed; None: the "all files"
        line, which has no mark)."""
        mark_style, add_style, del_style, viewed_style, changed_style = (
            styles or self.label_styles())
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(f"{mark} ", style=mark_style)
        if viewed is not None:
            text.append(*VIEW_MARKS[viewed](viewed_style, changed_style))
        text.append(clean(path), style=viewed_style if viewed == "viewed" else "")
        text.append(f"  +{added}", style=add_style)
        text.append(f" -{deleted}", style=del_style)
        return text

    def label_styles(self) -> LabelStyles:
        return (self.get_component_rich_style("filelist--mark"),
                self.get_component_rich_style("filelist--add"),
                self.get_component_rich_style("filelist--del"),
                self.get_component_rich_style("filelist--viewed"),
                self.get_component_rich_style("filelist--changed"))


LabelStyles = tuple[Style, Style, Style, Style, Style]
VIEW_MARKS: dict[ViewMark, Callable[[Style, Style], tuple[str, Style | str]]] = {
    "viewed": lambda viewed, changed: ("✓ ", viewed),
    "changed": lambda viewed, changed: ("! ", changed),
    "unviewed": lambda viewed, changed: ("  ", ""),
}


class ViewedChange(NamedTuple):
    """A viewed mark toggled: the file's digest when it was marked, None when unmarked."""

    task_id: str
    path: str
    digest: str | None


class DiffView(Horizontal):
    """The file list and the patch of the highlighted file (or of all files).

    Reading aids: next / previous file (the list's) and hunk (``jump_file``,
    ``jump_hunk``: the view scrolls it to the top) and a viewed mark per file
    (``toggle_viewed``), kept by task and path with the file's digest, so it clears when
    the file changes again (the store keeps them: ``set_viewed`` takes them back)."""

    DEFAULT_CSS = """
    DiffView {
        height: 1fr;
        & > FileList { width: 38; max-width: 40%; height: 1fr; border: none; }
        & > DiffLines { width: 1fr; height: 1fr; }
    }
    """

    class FileHighlighted(Message):
        def __init__(self, path: str | None) -> None:
            super().__init__()
            self.path = path

    def __init__(self, *, id: str | None = None, colours: bool = True) -> None:
        """``colours``: syntax colours and changed words (False: kinds of lines only)."""
        super().__init__(id=id)
        self._prepared: PreparedDiff | None = None
        self._task_id: str | None = None
        self._message: str | None = None
        self.selected: str = ALL_FILES
        self.colours = colours
        # task id -> path -> the digest the file had when it was marked viewed (the store's
        # marks, set_viewed, then those toggled here)
        self.viewed: dict[str, dict[str, str]] = {}
        self._comments: list[ReviewComment] = []  # the shown task's review comments
        self._refs: tuple[tuple[int, str], list[DiffLine | None]] | None = None

    def compose(self) -> ComposeResult:
        yield FileList(id="diff-files")
        yield DiffLines(id="diff-lines")

    @property
    def composed(self) -> bool:
        """True once its file list and lines are in place (not when the app closed while
        it was being mounted)."""
        return bool(self.children)

    @property
    def prepared(self) -> PreparedDiff | None:
        return self._prepared

    @property
    def selected_path(self) -> str | None:
        """The highlighted file's path, or None for "all files"."""
        return None if self.selected == ALL_FILES else self.selected

    @property
    def file_count(self) -> int:
        """How many files the diff shown has (0: none, or a message)."""
        return len(self._prepared.diff.files) if self._prepared is not None else 0

    def show_message(self, text: str) -> None:
        if self._prepared is None and self._message == text:
            return  # already shown (moving along tasks without worktrees)
        self._prepared = None
        self._task_id = None
        self._message = text
        self.query_one(FileList).clear_options()
        self.query_one(DiffLines).set_lines([], 0, empty=text)

    def show(self, task_id: str, prepared: PreparedDiff) -> None:
        """Show a diff; a refresh of the same task keeps the file and the scroll position."""
        same_task = task_id == self._task_id
        if not same_task:
            self._comments = []
        old = self._prepared
        self._prepared = prepared
        self._task_id = task_id
        self._message = None
        if not same_task or prepared.lines.get(self.selected) is None:
            self.selected = ALL_FILES
        files = self.query_one(FileList)
        if not (same_task and old is not None and _same_files(old, prepared)):
            files.set_options(self._options(files, prepared))
            try:
                files.highlighted = files.get_option_index(self.selected)
            except Exception:
                files.highlighted = 0
        self._paint(keep_scroll=same_task)

    def view_mark(self, path: str) -> ViewMark:
        """The viewed mark of a file of the diff shown."""
        if self._prepared is None or self._task_id is None:
            return "unviewed"
        return view_mark(self.viewed.get(self._task_id, {}), path,
                         self._prepared.digests.get(path, ""))

    def _options(self, files: FileList, prepared: PreparedDiff) -> list[Option]:
        diff = prepared.diff
        styles = files.label_styles()
        marks = [self.view_mark(f.path) for f in diff.files]
        seen = marks.count("viewed")
        title = f"all files ({len(diff.files)}" + (f", {seen} viewed)" if seen else ")")
        options = [Option(files.label("*", title, diff.added, diff.deleted, styles),
                          id=ALL_FILES)]
        options += [Option(files.label(STATUS_MARKS.get(f.status, "?"), f.path, f.added,
                                       f.deleted, styles, viewed=mark), id=f.path)
                    for f, mark in zip(diff.files, marks, strict=True)]
        return options

    def _relabel(self) -> None:
        if self._prepared is None:
            return
        files = self.query_one(FileList)
        for index, option in enumerate(self._options(files, self._prepared)):
            files.replace_option_prompt_at_index(index, option.prompt)

    def _paint(self, keep_scroll: bool = False) -> None:
        lines = self.query_one(DiffLines)
        if self._prepared is None:
            return
        data = self._prepared.lines.get(self.selected, [])
        lines.set_lines(data, self._prepared.widths.get(self.selected, 0),
                        keep_scroll=keep_scroll,
                        empty="No changes yet." if not self._prepared.diff.files
                        else "No textual changes in this file.",
                        renderer=self._prepared.renderer(self.selected,
                                                         colours=self.colours))
        if self._comments:
            self._place()

    # --- reading aids ------------------------------------------------------------------------
    def current_file(self) -> str | None:
        """The file the keys act on: the highlighted one, or with "all files" the one at
        the top of the patch shown (None: no file)."""
        if self._prepared is None or not self._prepared.diff.files:
            return None
        if self.selected != ALL_FILES:
            return self.selected
        lines = self.query_one(DiffLines)
        renderer = lines.renderer
        files = self._prepared.diff.files
        if renderer is None or len(renderer.layout.file_starts) != len(files):
            return files[0].path
        return files[max(0, renderer.layout.file_at(lines.top_row))].path

    def toggle_viewed(self) -> ViewedChange | None:
        """Mark the current file viewed (as it is now), or take its mark off; what changed
        (for the store), or None when no file is shown."""
        path = self.current_file()
        if path is None or self._prepared is None or self._task_id is None:
            return None
        marks = self.viewed.setdefault(self._task_id, {})
        digest = self._prepared.digests.get(path, "")
        mark = toggle_viewed(marks, path, digest)
        self._relabel()
        return ViewedChange(self._task_id, path, digest if mark == "viewed" else None)

    def set_viewed(self, task_id: str, marks: dict[str, str]) -> None:
        """The task's viewed marks as the store has them, taken the first time
        this view sees the task: after that the marks toggled here are the newer ones (a
        diff read while a mark was being written brings the older)."""
        if task_id in self.viewed:
            return
        self.viewed[task_id] = dict(marks)
        if task_id == self._task_id and self._prepared is not None:
            self._relabel()

    def jump_file(self, step: int) -> bool:
        """Highlight the next (1) or previous (-1) file of the list, which shows its patch
        ("all files" goes to the first file, or to the last going back). False: there is
        none that way."""
        if self._prepared is None or not self._prepared.diff.files:
            return False
        files = self.query_one(FileList)
        current = files.highlighted or 0
        index = current + step if current else (1 if step > 0 else files.option_count - 1)
        if not 1 <= index < files.option_count:
            return False
        files.highlighted = index  # its OptionHighlighted paints the file
        return True

    def jump_hunk(self, step: int) -> bool:
        """The next (1) or previous (-1) hunk; past the last hunk of the file shown, the
        next file's first (the previous file's last going back)."""
        if self._jump(lambda layout: layout.hunk_starts, step):
            return True
        if self.selected == ALL_FILES or not self.jump_file(step):
            return False
        self._select(self.query_one(FileList))  # the new file now, not after its message
        lines = self.query_one(DiffLines)
        renderer = lines.renderer
        if renderer is not None and renderer.layout.hunk_starts:
            hunks = renderer.layout.hunk_starts
            lines.go_to_row(hunks[0] if step > 0 else hunks[-1])
        return True

    def _jump(self, starts_of: Callable[[DiffLayout], list[int]], step: int) -> bool:
        lines = self.query_one(DiffLines)
        renderer = lines.renderer
        if renderer is None:
            return False
        row = next_start(starts_of(renderer.layout), lines.top_row, step)
        if row is None:
            return False
        lines.go_to_row(row)
        return True

    # --- review comments -------------------------------------------------------------------
    @property
    def comments(self) -> list[ReviewComment]:
        return self._comments

    def set_comments(self, task_id: str, comments: list[ReviewComment]) -> None:
        """The shown task's comments (with their states): shown under their lines."""
        if task_id != self._task_id or (not comments and not self._comments):
            return
        self._comments = comments
        self._place()

    def line_refs(self) -> list[DiffLine | None]:
        """Each patch line shown: its file and line numbers (core.review.diff_lines), read
        from the raw patch (the shown lines are cleaned of control characters)."""
        from fleet_tui.core.review import diff_lines

        prepared = self._prepared
        if prepared is None:
            return []
        key = (id(prepared), self.selected)
        if self._refs is not None and self._refs[0] == key:
            return self._refs[1]
        if self.selected == ALL_FILES:
            refs = diff_lines(prepared.diff.patch.splitlines(),
                              [f.path for f in prepared.diff.files])
        else:
            found = next((f for f in prepared.diff.files if f.path == self.selected), None)
            refs = diff_lines(found.patch.splitlines(), [found.path]) if found else []
        self._refs = (key, refs)
        return refs

    def lines_at_cursor(self) -> list[DiffLine]:
        """The lines a comment made now is on: the cursor's line or the selected range
        (of one file: the first line's), without headers and hunk lines."""
        if self._prepared is None:
            return []
        refs = self.line_refs()
        picked = [refs[i] for i in self.query_one(DiffLines).selected_patch_lines()
                  if i < len(refs)]
        rows = [r for r in picked if r is not None]
        return [r for r in rows if r.path == rows[0].path] if rows else []

    def _place(self) -> None:
        """Put each comment's rows under the line its anchored lines end at now (under
        the file's first hunk line when they are not in the diff any more)."""
        view = self.query_one(DiffLines)
        refs = self.line_refs() if self._comments else []
        lines: dict[tuple[str, str, int], int] = {}
        first: dict[str, int] = {}
        for index, ref in enumerate(refs):
            if ref is None:
                continue
            first.setdefault(ref.path, max(0, index - 1))
            if ref.new is not None:
                lines[("new", ref.path, ref.new)] = index
            if ref.kind == "-" and ref.old is not None:
                lines[("old", ref.path, ref.old)] = index
        under: dict[int, list[Row]] = {}
        for comment in self._comments:
            anchor = comment.anchor
            end = comment.where if comment.where is not None else anchor.end
            at = lines.get((anchor.side, anchor.path, end), first.get(anchor.path))
            if at is not None:
                under.setdefault(at, []).extend(comment_rows(comment))
        view.set_comments(under)

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        self._select(event.option_list)

    def _select(self, files: OptionList) -> None:
        option = files.highlighted_option
        path = (option.id if option is not None else None) or ALL_FILES
        if path != self.selected:
            self.selected = path
            self._paint()
            self.post_message(self.FileHighlighted(self.selected_path))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.query_one(DiffLines).focus()


def comment_rows(comment: ReviewComment) -> list[Row]:
    """A comment as the diff shows it under its line: its number, state and text."""
    style = f"comment-{comment.state}"
    sent = "sent" if comment.sent else "not sent"
    body = comment.body.splitlines() or [""]
    rows: list[Row] = [((style, f"  ┃ #{comment.id} {comment.state} ({sent}) "
                                f"{clean(comment.anchor.where)}: {clean(body[0])}"),)]
    rows += [((style, f"  ┃   {clean(line)}"),) for line in body[1:]]
    return rows


def _same_files(a: PreparedDiff, b: PreparedDiff) -> bool:
    """The file list would read the same (the digests: a viewed mark may have cleared)."""
    return [(f.path, f.status, f.added, f.deleted) for f in a.diff.files] == [
        (f.path, f.status, f.added, f.deleted) for f in b.diff.files] and (
        a.digests == b.digests)
