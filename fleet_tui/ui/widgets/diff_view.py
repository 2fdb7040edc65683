"""Diff review: a file list with status and +/- counts beside a coloured unified diff.

The diff is a list of strings; a line is classified (added, removed, hunk, header) only
when it is painted, so a 20,000-line patch paints its first screen at once.

Review comments (issue 22) are rows the view adds under their lines (``set_comments``); the
patch itself is never copied. The cursor (up / down) and a range (shift+up / shift+down)
say which lines a new comment is on (``DiffView.lines_at_cursor``).
"""

from __future__ import annotations

from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from fleet_tui.ui.formatting import ALL_FILES, PreparedDiff, Row, clean
from fleet_tui.ui.widgets.line_view import LineView

TYPE_CHECKING = False
if TYPE_CHECKING:  # GitPython is slow to import: the panel's first frame does not wait
    from fleet_tui.core.review import DiffLine
    from fleet_tui.store.reviews import ReviewComment
    from fleet_tui.vcs.git import Diff

STATUS_MARKS = {"added": "A", "modified": "M", "deleted": "D", "untracked": "?",
                "renamed": "R"}
__all__ = ["ALL_FILES", "DiffLines", "DiffView", "FileList", "PreparedDiff"]


class DiffLines(LineView):
    """The patch text, coloured per line by its first character."""

    COMPONENT_CLASSES = {"diff--add", "diff--del", "diff--hunk", "diff--header",
                         "diff--empty", "diff--comment-open", "diff--comment-addressed",
                         "diff--comment-outdated"}
    STYLE_PREFIX = "diff--"
    FILL_ROWS = True
    CURSOR = True
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
        if not self._lines:
            return (("empty", self._empty),)
        line = self._lines[index]
        if line.startswith(("+++", "---", "diff ", "index ", "new file", "deleted file",
                            "similarity", "rename ", "old mode", "new mode", "Binary")):
            return (("header", line),)
        if line.startswith("+"):
            return (("add", line),)
        if line.startswith("-"):
            return (("del", line),)
        if line.startswith("@@"):
            return (("hunk", line),)
        return (("", line),)

    def set_lines(self, lines: list[str], width: int, *, keep_scroll: bool = False,
                  empty: str = "No changes.") -> None:
        y = self.scroll_y
        self._lines = lines
        self._empty = empty
        self._rows = None
        self.select_from = None
        if not keep_scroll:
            self.cursor = -1
        self.reset_view(width)
        if keep_scroll:
            self.scroll_to(y=y, animate=False, immediate=True)
        else:
            self.scroll_to(0, 0, animate=False, immediate=True)

    @property
    def lines(self) -> list[str]:
        return self._lines

    # --- review comments (issue 22) ------------------------------------------------------
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
    """Changed files: a status letter, the path and +/- counts."""

    COMPONENT_CLASSES = {"filelist--add", "filelist--del", "filelist--mark"}
    DEFAULT_CSS = """
    FileList {
        & > .filelist--add { color: $text-success; }
        & > .filelist--del { color: $text-error; }
        & > .filelist--mark { color: $accent; text-style: bold; }
    }
    """

    def label(self, mark: str, path: str, added: int, deleted: int,
              styles: tuple[Style, Style, Style] | None = None) -> Text:
        """One file's line; pass ``label_styles()`` when labelling many (looking a component
        style up costs more than building the label)."""
        mark_style, add_style, del_style = styles or self.label_styles()
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(f"{mark} ", style=mark_style)
        text.append(clean(path))
        text.append(f"  +{added}", style=add_style)
        text.append(f" -{deleted}", style=del_style)
        return text

    def label_styles(self) -> tuple[Style, Style, Style]:
        return (self.get_component_rich_style("filelist--mark"),
                self.get_component_rich_style("filelist--add"),
                self.get_component_rich_style("filelist--del"))


class DiffView(Horizontal):
    """The file list and the patch of the highlighted file (or of all files)."""

    DEFAULT_CSS = """
    DiffView {
        height: 1fr;
        & > FileList { width: 34; max-width: 40%; height: 1fr; border: none; }
        & > DiffLines { width: 1fr; height: 1fr; }
    }
    """

    class FileHighlighted(Message):
        def __init__(self, path: str | None) -> None:
            super().__init__()
            self.path = path

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._prepared: PreparedDiff | None = None
        self._task_id: str | None = None
        self._message: str | None = None
        self.selected: str = ALL_FILES
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
        if not (same_task and old is not None and _same_files(old.diff, prepared.diff)):
            total_add = sum(f.added for f in prepared.diff.files)
            total_del = sum(f.deleted for f in prepared.diff.files)
            styles = files.label_styles()
            options = [Option(files.label("*", f"all files ({len(prepared.diff.files)})",
                                          total_add, total_del, styles), id=ALL_FILES)]
            options += [Option(files.label(STATUS_MARKS.get(f.status, "?"), f.path, f.added,
                                           f.deleted, styles), id=f.path)
                        for f in prepared.diff.files]
            files.set_options(options)
            try:
                files.highlighted = files.get_option_index(self.selected)
            except Exception:
                files.highlighted = 0
        self._paint(keep_scroll=same_task)

    def _paint(self, keep_scroll: bool = False) -> None:
        lines = self.query_one(DiffLines)
        if self._prepared is None:
            return
        data = self._prepared.lines.get(self.selected, [])
        lines.set_lines(data, self._prepared.widths.get(self.selected, 0),
                        keep_scroll=keep_scroll,
                        empty="No changes yet." if not self._prepared.diff.files
                        else "No textual changes in this file.")
        if self._comments:
            self._place()

    # --- review comments (issue 22) --------------------------------------------------------
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
        path = event.option.id or ALL_FILES
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


def _same_files(a: Diff, b: Diff) -> bool:
    return [(f.path, f.status, f.added, f.deleted) for f in a.files] == [
        (f.path, f.status, f.added, f.deleted) for f in b.files]
