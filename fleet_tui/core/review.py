"""Review comments on a task's diff: anchors, states and the message sent.

Pure rules, no I/O: the engine reads the files and the diff and asks these.

A comment is anchored to lines of one file: on the new side (an added or an unchanged
line, numbered as in the worktree's file) or, when every line commented on was deleted,
on the old side (numbered as in the base). The anchor keeps the lines' text, so it is
found again when lines above it move.

Its state, decided by ``state_of`` (the rules the panel, the CLI and the merge follow):

- **open**: not sent yet and its lines are as they were; or sent, and the worker has not
  touched its lines (yet).
- **addressed**: sent while its lines were as commented, and they have changed since (the
  worker changed, replaced or deleted them).
- **outdated**: its lines changed before the comment reached the worker (commented, then
  the lines changed before it was sent; or they had already changed when it was sent).

"Its lines are as they were" (``intact``): new side, the anchored lines' text is found
as a block in the file (nearest to where it was); old side, the lines are still deleted
lines of the file's patch. A comment on a line common enough to be found elsewhere (a
lone ``}``) may read open after the worker changed it: the rule errs towards open.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

Side = Literal["new", "old"]

__all__ = ["Anchor", "CommentState", "DiffLine", "Side", "anchor_of", "deleted_lines",
           "diff_lines", "find_block", "intact", "parse_line_spec", "review_message",
           "state_of"]


class CommentState(StrEnum):
    OPEN = "open"
    ADDRESSED = "addressed"
    OUTDATED = "outdated"


@dataclass(frozen=True, slots=True)
class DiffLine:
    """A content row of a patch: its file, kind ("+", "-", " ") and line numbers."""

    path: str
    kind: str
    old: int | None  # in the base (None for an added line)
    new: int | None  # in the worktree's file (None for a deleted line)
    text: str  # without the kind character

    @property
    def shown(self) -> str:
        return self.kind + self.text


@dataclass(frozen=True, slots=True)
class Anchor:
    """Where a comment points: lines ``start``..``end`` of ``path`` on ``side``."""

    path: str
    side: Side
    start: int
    end: int
    lines: tuple[str, ...]  # the anchored lines' text, as they were
    quote: tuple[str, ...]  # the rows commented on as the diff showed them (+/-/space)

    @property
    def where(self) -> str:
        """FILE:LINE or FILE:START-END (old side: "FILE:-LINE ... (deleted)" is said by
        ``label``)."""
        span = str(self.start) if self.start == self.end else f"{self.start}-{self.end}"
        return f"{self.path}:{span}"

    @property
    def label(self) -> str:
        return self.where + (" (deleted lines, numbered as in the base)"
                             if self.side == "old" else "")


_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def diff_lines(lines: Sequence[str], paths: Sequence[str]) -> list[DiffLine | None]:
    """Each row of a patch (one file's or several's, split into lines) as a DiffLine, or
    None for a header or a hunk line. ``paths``: the files in the patch's order (its
    ``diff --git`` headers), as git's listing names them."""
    out: list[DiffLine | None] = []
    file_index = -1
    path = paths[0] if len(paths) == 1 else ""
    old = new = 0
    in_hunk = False
    for line in lines:
        if line.startswith("diff --git "):
            file_index += 1
            path = paths[file_index] if file_index < len(paths) else ""
            in_hunk = False
            out.append(None)
            continue
        match = _HUNK.match(line) if line.startswith("@@") else None
        if match is not None:
            old, new = int(match.group(1)), int(match.group(2))
            in_hunk = True
            out.append(None)
            continue
        if not in_hunk or not line or line[0] not in "+- ":
            out.append(None)  # headers, "\ No newline at end of file"
            continue
        kind = line[0]
        if kind == "+":
            out.append(DiffLine(path, kind, None, new, line[1:]))
            new += 1
        elif kind == "-":
            out.append(DiffLine(path, kind, old, None, line[1:]))
            old += 1
        else:
            out.append(DiffLine(path, kind, old, new, line[1:]))
            old += 1
            new += 1
    return out


def anchor_of(rows: Sequence[DiffLine]) -> Anchor:
    """The anchor of diff rows commented on together (one file's, in order): their new
    side when any has one, else (only deleted lines) their old side."""
    if not rows:
        raise ValueError("no line to comment on")
    path = rows[0].path
    rows = [r for r in rows if r.path == path]
    quote = tuple(r.shown for r in rows)
    newer = [r for r in rows if r.new is not None]
    if newer:
        numbers = [r.new for r in newer if r.new is not None]
        return Anchor(path, "new", min(numbers), max(numbers),
                      tuple(r.text for r in newer), quote)
    older = [r.old for r in rows if r.old is not None]
    return Anchor(path, "old", min(older), max(older), tuple(r.text for r in rows), quote)


def deleted_lines(rows: Iterable[DiffLine | None]) -> dict[int, str]:
    """Old line number -> text of a file's deleted lines."""
    return {r.old: r.text for r in rows if r is not None and r.kind == "-" and r.old}


def find_block(block: Sequence[str], lines: Sequence[str], near: int) -> int | None:
    """The 1-based line where ``block`` starts in ``lines``, nearest to ``near``; None when
    it is not there."""
    if not block or len(block) > len(lines):
        return None
    first = block[0]
    best: int | None = None
    for index, line in enumerate(lines[:len(lines) - len(block) + 1]):
        if line == first and list(lines[index:index + len(block)]) == list(block):
            at = index + 1
            if best is None or abs(at - near) < abs(best - near):
                best = at
    return best


def intact(anchor: Anchor, file_lines: Sequence[str] | None,
           deleted: dict[int, str]) -> int | None:
    """Where the anchored lines are now, unchanged (their last line's number on their
    side), or None when they changed or are gone. ``file_lines``: the worktree's file
    (None: it is gone); ``deleted``: the file's deleted lines in the current diff."""
    if anchor.side == "new":
        if file_lines is None:
            return None
        at = find_block(anchor.lines, file_lines, anchor.start)
        return None if at is None else at + len(anchor.lines) - 1
    span = range(anchor.start, anchor.end + 1)
    if len(span) == len(anchor.lines) and all(
            deleted.get(n) == text for n, text in zip(span, anchor.lines, strict=True)):
        return anchor.end
    numbers = sorted(deleted)
    at = find_block(anchor.lines, [deleted[n] for n in numbers], 1)
    if at is None:
        return None
    run = numbers[at - 1:at - 1 + len(anchor.lines)]
    return run[-1] if run == list(range(run[0], run[0] + len(run))) else None


def state_of(*, sent: bool, intact_now: bool, intact_at_send: bool | None) -> CommentState:
    """A comment's state (the module's docstring says the rules)."""
    if not sent:
        return CommentState.OPEN if intact_now else CommentState.OUTDATED
    if intact_at_send is False:
        return CommentState.OUTDATED
    return CommentState.OPEN if intact_now else CommentState.ADDRESSED


def parse_line_spec(spec: str) -> tuple[str, int, int]:
    """FILE:LINE or FILE:START-END -> (file, start, end). ValueError says what is wrong."""
    path, sep, span = spec.rpartition(":")
    if not sep or not path:
        raise ValueError(f"{spec!r}: expected FILE:LINE or FILE:START-END (e.g. src/app.py:12 "
                         "or src/app.py:12-14)")
    first, dash, last = span.partition("-")
    try:
        start = int(first)
        end = int(last) if dash else start
    except ValueError:
        raise ValueError(f"{spec!r}: the line numbers must be whole numbers "
                         "(FILE:LINE or FILE:START-END)") from None
    if start < 1 or end < start:
        raise ValueError(f"{spec!r}: lines are numbered from 1, and END is not before START")
    return path, start, end


def review_message(comments: Sequence[tuple[Anchor, str]]) -> str:
    """The one message that sends a review: each comment with its file, line numbers, the
    lines quoted and the comment."""
    count = len(comments)
    head = (f"Review of your changes: {count} comment{'s' if count != 1 else ''} on the "
            "diff. Address each one (change the code, or say why not), then summarise "
            "what you did for each.")
    parts = [head]
    for number, (anchor, body) in enumerate(comments, 1):
        quoted = "\n".join(f"    > {line}" for line in anchor.quote)
        parts.append(f"{number}. {anchor.label}\n{quoted}\n    {_indent(body.strip())}")
    return "\n\n".join(parts) + "\n"


def _indent(text: str) -> str:
    return text.replace("\n", "\n    ")
