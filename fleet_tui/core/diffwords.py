"""Reading a unified diff: where its files, hunks and changed blocks start, what changed
inside a changed line, and whether a file was viewed.

Pure functions over the patch's lines (no git, no terminal), so the panel's diff view and
the tests use the same rules:

- ``layout_of(lines)``: one pass over the lines' first characters (no tokenising): the
  file headers, the hunk headers and the change blocks (a run of removed lines followed
  by a run of added ones). Done off the UI thread with the rest of the diff's
  preparation; the view uses it for its jumps and to find a painted line's partner.
- ``BlockWords(lines, block)``: the removed and added lines of one block paired (each
  removed line with the most similar added line after the previous pair's) and, for each
  pair, the character spans that differ, from ``difflib.SequenceMatcher`` over words,
  worked out only as far as the lines asked for need (``block_spans``: all of them). The
  view asks when it paints a line of the block, and keeps it per block.
- ``view_mark``: a file marked viewed stays viewed while its digest (the hash of its
  patch, which carries the new blob id) is the one it was marked with; once the file
  changes again the mark reads "changed" (as a forge's review says "changed since last
  viewed") until the user marks it again.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Literal

Spans = list[tuple[int, int]]
"""Character ranges [start, end) of a line (the leading + or - included in the count)."""

# A pair whose lines share less than this (SequenceMatcher's ratio over words) is two
# different lines: highlighting "what changed" would light up all of both.
MIN_SIMILARITY = 0.4
# A block longer than this on either side is paired line by line without looking for the
# best partner (the search costs a ratio per candidate).
MAX_SEARCH = 64
SEARCH_WINDOW = 8  # how many added lines ahead a removed line looks for its partner
MAX_LINE = 1000  # longer lines are not compared word by word (minified files)

_WORD = re.compile(r"\w+|\s+|[^\w\s]")

_HEADER_PREFIXES = ("+++ ", "--- ", "diff ", "index ", "new file", "deleted file",
                    "similarity", "rename ", "old mode", "new mode", "Binary", "copy ",
                    "dissimilarity")


@dataclass(frozen=True, slots=True)
class Block:
    """Removed lines [start, mid) followed by added lines [mid, end) of one hunk."""

    start: int
    mid: int
    end: int


@dataclass(slots=True)
class DiffLayout:
    """Where things start in a patch's lines (indices into the lines)."""

    file_starts: list[int] = field(default_factory=list)  # each "diff --git" line
    hunk_starts: list[int] = field(default_factory=list)  # each "@@" line
    blocks: list[Block] = field(default_factory=list)  # with both removed and added lines
    _block_starts: list[int] = field(default_factory=list)

    def block_at(self, index: int) -> Block | None:
        """The change block holding line ``index`` (None: not a paired changed line)."""
        at = bisect_right(self._block_starts, index) - 1
        if at >= 0:
            block = self.blocks[at]
            if index < block.end:
                return block
        return None

    def part(self, start: int, end: int) -> DiffLayout:
        """The layout of lines [start, end) alone (one file's part of a whole patch)."""
        def cut(starts: list[int]) -> list[int]:
            return [x - start for x in starts[bisect_left(starts, start):
                                              bisect_left(starts, end)]]

        first, last = bisect_left(self._block_starts, start), bisect_left(
            self._block_starts, end)
        blocks = [Block(b.start - start, b.mid - start, b.end - start)
                  for b in self.blocks[first:last]]
        return DiffLayout(cut(self.file_starts), cut(self.hunk_starts), blocks,
                          [b.start for b in blocks])

    def file_at(self, index: int) -> int:
        """The number of the file (0, 1, ...) line ``index`` belongs to (-1: before any)."""
        return bisect_right(self.file_starts, index) - 1


def is_header(line: str) -> bool:
    """A file header line of a patch (outside hunks only: "--- " can be a removed "-- ")."""
    return line.startswith(_HEADER_PREFIXES)


def layout_of(lines: Sequence[str]) -> DiffLayout:
    """The file headers, hunks and change blocks of a patch's lines, in one pass."""
    layout = DiffLayout()
    in_hunk = False
    del_start = -1  # the current run of removed lines
    add_start = -1  # the run of added lines after it

    def close(end: int) -> None:
        nonlocal del_start, add_start
        if del_start >= 0 and add_start >= 0:
            layout.blocks.append(Block(del_start, add_start, end))
            layout._block_starts.append(del_start)
        del_start = add_start = -1

    for index, line in enumerate(lines):
        first = line[:1]
        if line.startswith("diff "):
            close(index)
            in_hunk = False
            layout.file_starts.append(index)
        elif line.startswith("@@"):
            close(index)
            in_hunk = True
            layout.hunk_starts.append(index)
        elif not in_hunk:
            continue
        elif first == "-":
            if add_start >= 0:
                close(index)
            if del_start < 0:
                del_start = index
        elif first == "+":
            if del_start >= 0 and add_start < 0:
                add_start = index
        elif first == "\\":  # "\ No newline at end of file" belongs to the run
            continue
        else:
            close(index)
    close(len(lines))
    return layout


def tokens(text: str) -> list[str]:
    """Words, runs of white space and single punctuation marks."""
    return _WORD.findall(text)


def line_spans(old: str, new: str) -> tuple[Spans, Spans] | None:
    """The spans of ``old`` and ``new`` (texts without their +/-) that differ, word by
    word; None when the lines are too different to be called a change of one line."""
    if old == new or len(old) > MAX_LINE or len(new) > MAX_LINE:
        return None
    a, b = tokens(old), tokens(new)
    matcher = SequenceMatcher(None, a, b, autojunk=False)
    if matcher.ratio() < MIN_SIMILARITY:
        return None
    return _spans_of(matcher, a, b)


def _offsets(words: list[str]) -> list[int]:
    at = [0]
    for word in words:
        at.append(at[-1] + len(word))
    return at


def _add_span(spans: Spans, start: int, end: int) -> None:
    if spans and spans[-1][1] == start:
        spans[-1] = (spans[-1][0], end)  # adjacent changes read as one
    else:
        spans.append((start, end))


def _similarity(old: str, new: str) -> float:
    matcher = SequenceMatcher(None, tokens(old), tokens(new), autojunk=False)
    return matcher.ratio() if matcher.real_quick_ratio() >= MIN_SIMILARITY else 0.0


class BlockWords:
    """The changed spans of one change block's lines, worked out only as far as they are
    asked for: painting the first lines of a long block pairs those lines, not the block.

    The pairing is ``pair_lines``' (each removed line, in order, takes the most similar of
    the next SEARCH_WINDOW added lines after the last pair's), done one removed line at a
    time, so the lines asked for so far decide how far it has gone. Exact and cheaper than
    a matcher per candidate: each line is tokenised once; each added line keeps its own
    matcher (what SequenceMatcher learns of its second sequence is kept while the removed
    lines change); a candidate whose upper bounds (``real_quick_ratio``, ``quick_ratio``)
    cannot beat the best so far is not measured; a pair's spans come from the matcher that
    measured it."""

    def __init__(self, lines: Sequence[str], block: Block) -> None:
        self.block = block
        self._removed = [line[1:] for line in lines[block.start:block.mid]]
        self._added = [line[1:] for line in lines[block.mid:block.end]]
        self._old_words: dict[int, list[str]] = {}
        self._new_words: dict[int, list[str]] = {}
        self._matchers: dict[int, SequenceMatcher[str]] = {}
        self._by_line = len(self._removed) > MAX_SEARCH or len(self._added) > MAX_SEARCH
        self._i = 0  # the next removed line to pair
        self._next_j = 0  # the first added line it may take
        self._pairs: list[tuple[int, int]] = []
        self._spans: dict[int, Spans] = {}  # line index -> its changed spans (paired)

    @property
    def done(self) -> bool:
        return self._i >= len(self._removed) or self._next_j >= len(self._added)

    def pairs(self) -> list[tuple[int, int]]:
        """Every pair of the block (pairing it all)."""
        while not self.done:
            self._step()
        return list(self._pairs)

    def spans(self, index: int) -> Spans | None:
        """The changed spans of line ``index`` of the patch (in this block); None when it
        has no partner (all of it changed) or the two are too different."""
        block = self.block
        if index < block.mid:
            while self._i <= index - block.start and not self.done:
                self._step()
        else:
            while self._next_j <= index - block.mid and not self.done:
                self._step()
        return self._spans.get(index)

    def _words_of(self, i: int) -> list[str]:
        found = self._old_words.get(i)
        if found is None:
            found = self._old_words[i] = tokens(self._removed[i])
        return found

    def _matcher(self, j: int) -> SequenceMatcher[str]:
        found = self._matchers.get(j)
        if found is None:
            found = self._matchers[j] = SequenceMatcher(None, autojunk=False)
            words = self._new_words[j] = tokens(self._added[j])
            found.set_seq2(words)
        return found

    def _step(self) -> None:
        i = self._i
        self._i += 1
        if self._by_line:  # too long to search: line by line
            if i < len(self._added):
                matcher = self._matcher(i)
                matcher.set_seq1(self._words_of(i))
                self._pair(i, i, matcher)
                self._next_j = i + 1
            return
        best_j, best = -1, MIN_SIMILARITY
        best_matcher: SequenceMatcher[str] | None = None
        words = self._words_of(i)
        for j in range(self._next_j, min(len(self._added), self._next_j + SEARCH_WINDOW)):
            matcher = self._matcher(j)
            matcher.set_seq1(words)
            # as pair_lines: a score > best wins; the first >= MIN_SIMILARITY wins a tie
            # while none has (a bound below what would win: its ratio cannot win either)
            if best_j < 0:
                if matcher.real_quick_ratio() < best or matcher.quick_ratio() < best:
                    continue
            elif matcher.real_quick_ratio() <= best or matcher.quick_ratio() <= best:
                continue
            score = matcher.ratio()
            if score > best or (best_j < 0 and score >= best):
                best_j, best, best_matcher = j, score, matcher
        if best_matcher is not None:  # (every candidate's matcher has these words)
            self._pair(i, best_j, best_matcher)
            self._next_j = best_j + 1

    def _pair(self, i: int, j: int, matcher: SequenceMatcher[str]) -> None:
        self._pairs.append((i, j))
        old, new = self._removed[i], self._added[j]
        if old == new or len(old) > MAX_LINE or len(new) > MAX_LINE:
            return
        if matcher.ratio() < MIN_SIMILARITY:
            return
        found = _spans_of(matcher, self._words_of(i), self._new_words[j])
        block = self.block
        self._spans[block.start + i] = [(s + 1, e + 1) for s, e in found[0]]
        self._spans[block.mid + j] = [(s + 1, e + 1) for s, e in found[1]]


def _spans_of(matcher: SequenceMatcher[str], a: list[str],
              b: list[str]) -> tuple[Spans, Spans]:
    """The character spans that differ, from a matcher over two lines' words (a, b)."""
    a_at = _offsets(a)
    b_at = _offsets(b)
    old_spans: Spans = []
    new_spans: Spans = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if i2 > i1:
            _add_span(old_spans, a_at[i1], a_at[i2])
        if j2 > j1:
            _add_span(new_spans, b_at[j1], b_at[j2])
    return old_spans, new_spans


def pair_lines(removed: Sequence[str], added: Sequence[str]) -> list[tuple[int, int]]:
    """Pairs (i, j) of a removed and an added line that are one line changed, in order:
    each removed line takes the most similar of the next few added lines after the last
    pair's (so an added line between two changed ones does not shift every pair)."""
    lines = [*("-" + r for r in removed), *("+" + a for a in added)]
    return BlockWords(lines, Block(0, len(removed), len(lines))).pairs()


def block_spans(lines: Sequence[str], block: Block) -> dict[int, Spans]:
    """The changed spans of each paired line of ``block``, by line index (offsets count
    the leading + or -); lines without a partner are not in it (all of them changed)."""
    words = BlockWords(lines, block)
    words.pairs()
    return dict(words._spans)


def next_start(starts: Sequence[int], row: int, step: int) -> int | None:
    """The first start after ``row`` (step 1) or the last before it (step -1); None when
    there is none that way."""
    if step > 0:
        at = bisect_right(starts, row)
        return starts[at] if at < len(starts) else None
    at = bisect_right(starts, row - 1) - 1
    while at >= 0 and starts[at] >= row:
        at -= 1
    return starts[at] if at >= 0 else None


# --- the viewed mark ----------------------------------------------------------------------

ViewMark = Literal["viewed", "changed", "unviewed"]


def file_digest(text: str) -> str:
    """What a viewed mark is kept with: the hash of a file's patch, header included (its
    ``index`` line names the new blob, so a binary file's content counts too)."""
    import hashlib  # here: the panel's first frame loads this module, and not hashlib

    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:20]


def view_mark(marks: Mapping[str, str], path: str, digest: str) -> ViewMark:
    """"viewed" while the file is as it was marked, "changed" once it changed since,
    "unviewed" when it was never marked (or the mark was taken off)."""
    seen = marks.get(path)
    if seen is None:
        return "unviewed"
    return "viewed" if seen == digest else "changed"


def toggle_viewed(marks: dict[str, str], path: str, digest: str) -> ViewMark:
    """Mark a file viewed (as it is now), or take a current mark off; a file that changed
    since it was marked is marked again. Returns the new mark."""
    if view_mark(marks, path, digest) == "viewed":
        del marks[path]
        return "unviewed"
    marks[path] = digest
    return "viewed"
