"""Reading a diff, the pure part: the patch's layout, the pairing of removed and
added lines and the words that changed, the viewed mark's rule, and the painter of a
line (syntax classes from the file's type, made only for the lines asked for)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from fleet_tui.core.diffwords import (
    Block,
    block_spans,
    file_digest,
    layout_of,
    line_spans,
    next_start,
    pair_lines,
    toggle_viewed,
    view_mark,
)
from fleet_tui.ui.diff_render import DiffRenderer, lexer_for, syntax_class
from fleet_tui.ui.formatting import ALL_FILES, PreparedDiff
from fleet_tui.vcs.git import Diff, FileDiff

PATCH = """\
diff --git a/inventory.py b/inventory.py
index 48aba78..cecaf2e 100644
--- a/inventory.py
+++ b/inventory.py
@@ -9,5 +9,8 @@ def add_item(stock, name, count):
 def remove_item(stock, name, count):
-    stock[name] = stock.get(name, 0) - count
+    have = stock.get(name, 0)
+    if count > have:
+        raise ValueError("not enough")
+    stock[name] = have - count
     return stock
@@ -30,3 +33,3 @@ def report(stock):
-    return len(stock)
+    return len(stock) + 1
--- a/removed.sql comment inside the hunk
diff --git a/notes.txt b/notes.txt
new file mode 100644
index 0000000..1111111
--- /dev/null
+++ b/notes.txt
@@ -0,0 +1,2 @@
+first
+second
""".splitlines()


def _changed(text: str, spans: list[tuple[int, int]]) -> list[str]:
    return [text[s:e] for s, e in spans]


def test_the_layout_finds_files_hunks_and_change_blocks() -> None:
    layout = layout_of(PATCH)
    assert layout.file_starts == [0, 16]
    assert layout.hunk_starts == [4, 12, 21]
    # removed lines then added ones; the run of added lines of a new file is no block
    assert layout.blocks == [Block(6, 7, 11), Block(13, 14, 15)]
    assert layout.block_at(8) == Block(6, 7, 11) and layout.block_at(5) is None
    assert layout.block_at(15) is None  # the lone removed line after the second block
    assert layout.file_at(3) == 0 and layout.file_at(22) == 1


def test_a_changed_line_marks_only_the_words_that_changed() -> None:
    spans = line_spans("    return len(stock)", "    return len(stock) + 1")
    assert spans is not None
    old, new = spans
    assert old == []  # nothing of the old line went
    assert _changed("    return len(stock) + 1", new) == [" + 1"]
    spans = line_spans("total = price * count", "total = cost * count")
    assert spans is not None
    assert _changed("total = price * count", spans[0]) == ["price"]
    assert _changed("total = cost * count", spans[1]) == ["cost"]


def test_lines_too_different_are_not_a_changed_line() -> None:
    assert line_spans("import os", "class Inventory(Base):") is None
    assert line_spans("same", "same") is None


def test_each_removed_line_pairs_with_its_most_similar_added_line_in_order() -> None:
    removed = ["    total = price * count"]
    added = ["    print('checking')", "    if count > 0:", "    total = cost * count"]
    assert pair_lines(removed, added) == [(0, 2)]  # not the first added line
    # an added line between two changed ones does not shift the pairs after it
    assert pair_lines(["alpha = 1", "beta = 2"],
                      ["alpha = 10", "inserted_line()", "beta = 20"]) == [(0, 0), (1, 2)]


def test_block_spans_count_the_leading_sign() -> None:
    layout = layout_of(PATCH)
    found = block_spans(PATCH, layout.blocks[1])
    assert set(found) == {13, 14}
    assert _changed(PATCH[14], found[14]) == [" + 1"]
    assert found[13] == []


def test_next_start_moves_to_the_next_or_previous_start() -> None:
    starts = [4, 12, 21]
    assert next_start(starts, 0, 1) == 4
    assert next_start(starts, 4, 1) == 12
    assert next_start(starts, 21, 1) is None
    assert next_start(starts, 12, -1) == 4
    assert next_start(starts, 13, -1) == 12
    assert next_start(starts, 4, -1) is None


def test_a_viewed_mark_holds_while_the_file_is_as_it_was_marked() -> None:
    marks: dict[str, str] = {}
    first = file_digest("patch one")
    assert view_mark(marks, "a.py", first) == "unviewed"
    assert toggle_viewed(marks, "a.py", first) == "viewed"
    assert view_mark(marks, "a.py", first) == "viewed"
    # the worker changed the file again: the mark says so until it is marked again
    second = file_digest("patch two")
    assert view_mark(marks, "a.py", second) == "changed"
    assert toggle_viewed(marks, "a.py", second) == "viewed"
    assert view_mark(marks, "a.py", second) == "viewed"
    assert toggle_viewed(marks, "a.py", second) == "unviewed"
    assert marks == {}


def _diff(patch: list[str]) -> Diff:
    text = "\n".join(patch)
    first, second = text.split("diff --git a/notes.txt")
    return Diff(files=[FileDiff("inventory.py", "modified", 5, 2, first),
                       FileDiff("notes.txt", "untracked", 2, 0, "diff --git a/notes.txt"
                                + second)], patch=text)


def test_the_digest_follows_a_file_s_own_part_of_the_patch() -> None:
    before = PreparedDiff.build(_diff(PATCH))
    changed = [line.replace("second", "2nd") for line in PATCH]
    after = PreparedDiff.build(_diff(changed))
    assert before.digests["inventory.py"] == after.digests["inventory.py"]
    assert before.digests["notes.txt"] != after.digests["notes.txt"]


def test_rows_carry_kinds_syntax_classes_and_changed_words() -> None:
    prepared = PreparedDiff.build(_diff(PATCH))
    painter = prepared.renderer(ALL_FILES)
    assert painter.row(0) == (("header", PATCH[0]),)
    assert painter.row(4) == (("hunk", PATCH[4]),)
    assert painter.row(15)[0][0] == "del"  # "--- " inside a hunk is a removed line
    added = painter.row(14)  # "+    return len(stock) + 1"
    assert "".join(text for _, text in added) == PATCH[14]
    names = {name for name, _ in added}
    assert "add syn-kw" in names  # `return`, coloured as a keyword on an added line
    assert "".join(text for name, text in added if "word" in name) == " + 1"
    assert ("add syn-num word", "1") in added  # a changed word keeps its syntax colour
    assert added[-1] == ("add", "")  # the row's fill is the added line's own style
    context = painter.row(5)  # " def remove_item(...)"
    assert (" syn-kw", "def") in context
    # a text file has no lexer: its lines are painted by kind only
    assert painter.row(22) == (("add", "+first"),)


def test_nothing_is_painted_before_it_is_asked_for() -> None:
    lines = PATCH * 500
    painter = DiffRenderer(lines, layout_of(lines), [lexer_for("x.py")] * 1000)
    for index in range(40, 60):
        painter.row(index)
    assert sorted(painter._rows) == list(range(40, 60))
    assert len(painter._words) <= 3  # only the blocks of those lines were compared


def test_colours_off_paints_kinds_only() -> None:
    prepared = PreparedDiff.build(_diff(PATCH))
    painter = prepared.renderer(ALL_FILES, colours=False)
    assert painter.row(14) == (("add", PATCH[14]),)


def test_token_types_map_to_a_few_classes() -> None:
    from pygments.token import Token

    assert syntax_class(Token.Keyword.Namespace) == "kw"
    assert syntax_class(Token.Literal.String.Double) == "str"
    assert syntax_class(Token.Comment.Single) == "com"
    assert syntax_class(Token.Name) == ""
    assert lexer_for("README") is None and lexer_for("notes.txt") is None
    assert lexer_for("src/app.py") is lexer_for("other.py")  # one per file type


def test_the_diff_sees_a_change_made_in_the_second_its_index_was_written(
        git_repo: Path) -> None:
    """git trusts an index entry whose stat (seconds) matches the file unless the entry is
    "racy" (the file not older than the index file): the diff's copy of the index must keep
    the index's mtime, or a same-size edit made in the second of the checkout reads as no
    change once that second is over (a fast worker's first edit)."""
    from fleet_tui.vcs import git

    for attempt in range(5):  # the edit must land in the checkout's second (it nearly
        info = git.create_worktree(git_repo, f"racy0{attempt}")  # always does)
        app = info.path / "src" / "app.py"
        app.write_text("def main():\n    return 2\n")  # the same size as "return 1"
        debug = subprocess.run(["git", "ls-files", "--debug", "src/app.py"], cwd=info.path,
                               capture_output=True, text=True, check=True).stdout
        entry = {key: int(debug.split(f"{key}: ")[1].split(":")[0])
                 for key in ("ctime", "mtime")}
        index = Path(subprocess.run(["git", "rev-parse", "--path-format=absolute",
                                     "--git-path", "index"], cwd=info.path, check=True,
                                    capture_output=True, text=True).stdout.strip())
        stat = app.stat()
        second = entry["mtime"]
        if (int(stat.st_mtime), int(stat.st_ctime), entry["ctime"],
                int(index.stat().st_mtime)) == (second,) * 4:
            break
    else:
        pytest.skip("the edit never landed in the checkout's second")
    deadline = time.monotonic() + 5
    while time.time() < second + 1.05:  # a copy made now looks newer than the edit
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert [f.path for f in git.diff(info.path, info.base_commit).files] == ["src/app.py"]


def test_a_file_s_layout_is_its_part_of_the_whole_patch_s() -> None:
    whole = layout_of(PATCH)
    for start, end in ((0, 16), (16, len(PATCH))):
        assert whole.part(start, end) == layout_of(PATCH[start:end])
    prepared = PreparedDiff.build(_diff(PATCH))
    assert prepared.layouts["inventory.py"] == layout_of(prepared.lines["inventory.py"])
    assert prepared.layouts["notes.txt"] == layout_of(prepared.lines["notes.txt"])


def test_a_line_past_the_paint_s_budget_is_coloured_by_the_next_paint() -> None:
    prepared = PreparedDiff.build(_diff(PATCH))
    painter = prepared.renderer(ALL_FILES)
    painter.lex_until = 0.0  # the budget is spent
    plain = painter.row(14)
    assert not any("syn-" in name for name, _ in plain)
    assert "".join(t for n, t in plain if "word" in n) == " + 1"  # the words still show
    assert painter.pending and 14 not in painter._rows
    painter.lex_until = None
    assert ("add syn-kw", "return") in painter.row(14) and 14 in painter._rows


def test_block_words_pair_only_as_far_as_asked_and_agree_with_the_whole_block() -> None:
    """Painting a long block's first lines pairs those lines, not the block (bench 5's
    first paint); asked in any order, each line's spans are block_spans' own."""
    from fleet_tui.core.diffwords import Block, BlockWords

    removed = [f"-def step_{n}(value):  # line {n}" for n in range(40)]
    added = [f"+def step_{n}(value, extra=None):  # line {n}" for n in range(40)]
    lines = [*removed, *added]
    block = Block(0, 40, 80)
    whole = block_spans(lines, block)
    words = BlockWords(lines, block)
    assert words.spans(2) == whole[2]
    assert len(words._pairs) == 3 and not words.done  # lines 0-2 only
    for index in (79, 41, 0, 40, 39):
        assert words.spans(index) == whole.get(index)
    assert words.done and words.pairs() == [(n, n) for n in range(40)]
