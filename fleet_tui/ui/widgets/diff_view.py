"""Diff review: a file list with status and +/- counts beside a coloured unified diff.

The diff is a list of strings; a line is classified (added, removed, hunk, header) only
when it is painted, so a 20,000-line patch paints its first screen at once.
"""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from fleet_tui.ui.formatting import ALL_FILES, PreparedDiff, Row, clean
from fleet_tui.ui.widgets.line_view import LineView

TYPE_CHECKING = False
if TYPE_CHECKING:  # GitPython is slow to import: the panel's first frame does not wait
    from fleet_tui.vcs.git import Diff

STATUS_MARKS = {"added": "A", "modified": "M", "deleted": "D", "untracked": "?",
                "renamed": "R"}
__all__ = ["ALL_FILES", "DiffLines", "DiffView", "FileList", "PreparedDiff"]


class DiffLines(LineView):
    """The patch text, coloured per line by its first character."""

    COMPONENT_CLASSES = {"diff--add", "diff--del", "diff--hunk", "diff--header",
                         "diff--empty"}
    STYLE_PREFIX = "diff--"
    FILL_ROWS = True
    DEFAULT_CSS = """
    DiffLines {
        & > .diff--add { color: $text-success; background: $success-muted; }
        & > .diff--del { color: $text-error; background: $error-muted; }
        & > .diff--hunk { color: $accent; text-style: bold; }
        & > .diff--header { color: $text-muted; text-style: bold; }
        & > .diff--empty { color: $text-muted; text-style: italic; }
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._lines: list[str] = []
        self._empty = "No changes."

    def row_count(self) -> int:
        return len(self._lines) or 1

    def get_row(self, index: int) -> Row:
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
        self.reset_view(width)
        if keep_scroll:
            self.scroll_to(y=y, animate=False, immediate=True)
        else:
            self.scroll_to(0, 0, animate=False, immediate=True)

    @property
    def lines(self) -> list[str]:
        return self._lines


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


def _same_files(a: Diff, b: Diff) -> bool:
    return [(f.path, f.status, f.added, f.deleted) for f in a.files] == [
        (f.path, f.status, f.added, f.deleted) for f in b.files]
