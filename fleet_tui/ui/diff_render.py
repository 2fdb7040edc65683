"""How one line of a diff is painted: its kind (added, removed, hunk, header), syntax
colours by the file's type, and the words that changed inside a changed line.

Lazy by design: nothing is tokenised up front. A line is lexed (pygments, one line at a
time) and its block's words compared (core.diffwords.BlockWords: as far into the block
as the lines painted need) only when the view paints it, and the result is cached per
line, so a 20,000-line patch costs a screenful of lexing and pairing for its first paint
and a page for each page down.

No Textual here (the diff's preparation, in formatting.py, looks its lexers up), so it
is tested without a terminal. A row is a tuple of (style name, text) spans. A name is
the line's kind ("add", "del", "hunk", "header", "") and, space-separated, a syntax
class ("syn-kw", "syn-str", ...) and "word" for a changed word; the view turns each name
into a style from its component classes, which take their colours from the theme's
variables ($text-accent, $text-success, ...), so every theme stays readable (no colour
is written here).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import PurePosixPath
from typing import Any

from fleet_tui.core.diffwords import BlockWords, DiffLayout, Spans, is_header

Span = tuple[str, str]
Row = tuple[Span, ...]

SYNTAX_CLASSES = ("kw", "const", "str", "num", "com", "fn", "cls", "bi", "deco", "tag",
                  "attr")
"""The syntax classes a span can carry (component classes ``diff--syn-<name>``)."""

ROW_CACHE = 8192  # rows (and change blocks) kept per patch

_lexers: dict[str, Any] = {}  # file name key -> a pygments lexer, or None (plain text)
_lexers_lock = threading.Lock()


def _lexer_key(path: str) -> str:
    name = PurePosixPath(path).name
    suffix = PurePosixPath(name).suffix
    return suffix.lower() if suffix else name


def lexer_for(path: str) -> Any:
    """A pygments lexer for the file's type, or None (unknown, or plain text). Looked up
    once per file type and process (the first look-up loads pygments' table: tens of
    milliseconds, which the diff's preparation pays off the UI thread)."""
    key = _lexer_key(path)
    if key in _lexers:
        return _lexers[key]
    with _lexers_lock:
        if key in _lexers:
            return _lexers[key]
        lexer = None
        try:
            from pygments.lexers import find_lexer_class_for_filename
            from pygments.lexers.special import TextLexer

            found = find_lexer_class_for_filename(PurePosixPath(path).name)
            if found is not None and found is not TextLexer:
                lexer = found(stripnl=False, ensurenl=False, stripall=False)
        except Exception:  # a broken lexer plugin must not cost the diff
            lexer = None
        _lexers[key] = lexer
        return lexer


def lexers_for(paths: Iterable[str]) -> dict[str, Any]:
    """Each path's lexer (see lexer_for), for a diff's preparation."""
    return {path: lexer_for(path) for path in paths}


_token_classes: dict[Any, str] = {}


def syntax_class(ttype: Any) -> str:
    """The syntax class of a pygments token type ("" for plain text)."""
    found = _token_classes.get(ttype)
    if found is not None:
        return found
    from pygments import token as t

    table = ((t.Comment, "com"), (t.Keyword.Constant, "const"), (t.Keyword, "kw"),
             (t.Operator.Word, "kw"), (t.String, "str"), (t.Number, "num"),
             (t.Name.Builtin, "bi"), (t.Name.Function, "fn"), (t.Name.Class, "cls"),
             (t.Name.Decorator, "deco"), (t.Name.Tag, "tag"), (t.Name.Attribute, "attr"),
             (t.Name.Constant, "const"), (t.Name.Namespace, "cls"),
             (t.Generic.Heading, "kw"), (t.Generic.Subheading, "kw"))
    name = next((cls for parent, cls in table if ttype in parent), "")
    _token_classes[ttype] = name
    return name


class DiffRenderer:
    """The rows of one patch's lines, made when painted and cached per line."""

    def __init__(self, lines: Sequence[str], layout: DiffLayout,
                 file_lexers: Sequence[Any], *, colours: bool = True) -> None:
        """``file_lexers``: the lexer of each file of the patch, in order (the layout's
        file_starts); ``colours`` False paints kinds only (no syntax, no words)."""
        self.lines = lines
        self.layout = layout
        self.file_lexers = file_lexers
        self.colours = colours
        self._rows: dict[int, Row] = {}
        self._words: dict[int, BlockWords] = {}  # block start -> its words, as far as asked
        # A paint's lexing budget (perf_counter time; None: none): a line asked for after
        # it is painted without syntax colours and not cached, and ``pending`` says so,
        # so the view paints it again a moment later (page down shows at once).
        self.lex_until: float | None = None
        self.pending = False
        self._provisional = False

    def kind(self, index: int) -> str:
        """"add", "del", "hunk", "header", "nonl" (no newline at end) or "" (context)."""
        line = self.lines[index]
        first = line[:1]
        layout = self.layout
        if line.startswith("@@"):
            return "hunk"
        if first in ("+", "-", " ", "\\") and self._in_hunk(index):
            return {"+": "add", "-": "del", " ": "", "\\": "nonl"}[first]
        if is_header(line) or line.startswith("diff "):
            return "header"
        if not layout.file_starts and first in "+-":
            return "add" if first == "+" else "del"  # a bare hunk without headers
        return ""

    def _in_hunk(self, index: int) -> bool:
        from bisect import bisect_right

        layout = self.layout
        hunk = bisect_right(layout.hunk_starts, index) - 1
        if hunk < 0:
            return False
        file = layout.file_at(index)
        return file < 0 or layout.hunk_starts[hunk] > layout.file_starts[file]

    def row(self, index: int) -> Row:
        cached = self._rows.get(index)
        if cached is None:
            if len(self._rows) >= ROW_CACHE:
                self._rows.clear()  # a long scroll: start again (no per-hit bookkeeping)
            made = self._make(index)
            if self._provisional:
                self._provisional = False
                self.pending = True
                return made
            cached = self._rows[index] = made
        return cached

    def _make(self, index: int) -> Row:
        line = self.lines[index]
        kind = self.kind(index)
        if not self.colours or kind not in ("add", "del", "") or not line:
            return ((kind, line),)
        file = self.layout.file_at(index)
        lexer = self.file_lexers[file] if 0 <= file < len(self.file_lexers) else None
        words = self._changed(index) if kind in ("add", "del") else None
        if lexer is None and not words:
            return ((kind, line),)
        # character classes of the content (after the +, - or space)
        body = line[1:]
        marks: list[str] = [""] * len(body)
        if lexer is not None and self.lex_until is not None and (
                time.perf_counter() > self.lex_until):
            lexer, self._provisional = None, True  # over the paint's budget: later
        if lexer is not None:
            try:
                for at, ttype, value in lexer.get_tokens_unprocessed(body):
                    name = syntax_class(ttype)
                    if name:
                        marks[at:at + len(value)] = [" syn-" + name] * len(value)
            except Exception:  # a lexer that fails on a line leaves it plain
                marks = [""] * len(body)
        if words:
            for start, end in words:
                for i in range(max(0, start - 1), min(len(body), end - 1)):
                    marks[i] += " word"
        spans: list[Span] = [(kind, line[:1])]
        start = 0
        for i in range(1, len(body) + 1):
            if i == len(body) or marks[i] != marks[start]:
                spans.append((kind + marks[start], body[start:i]))
                start = i
        spans.append((kind, ""))  # the row's fill is the line's own style
        return tuple(spans)

    def _changed(self, index: int) -> Spans | None:
        block = self.layout.block_at(index)
        if block is None:
            return None
        found = self._words.get(block.start)
        if found is None:
            if len(self._words) >= ROW_CACHE:
                self._words.clear()
            found = self._words[block.start] = BlockWords(self.lines, block)
        return found.spans(index)
