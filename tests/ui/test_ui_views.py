"""The stream formatter and the virtual views: readable rows, no markup, big inputs fast."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_ui_support import wait_until
from textual.app import App, ComposeResult

from fleet_tui.core import stream
from fleet_tui.execution.worker.attemptlog import AttemptLog
from fleet_tui.ui.formatting import (
    PreparedDiff,
    StreamFormatter,
    clean,
    human_duration,
    human_tokens,
)
from fleet_tui.ui.screens.launch import FormValues, parse_duration, parse_positive_int
from fleet_tui.ui.widgets.diff_view import DiffLines, DiffView
from fleet_tui.ui.widgets.stream_view import StreamView
from fleet_tui.vcs.git import Diff, FileDiff

FIXTURES = Path(__file__).resolve().parents[1] / "support" / "fixtures" / "stream-json"


def _decode(path: Path) -> list[stream.Event]:
    decoder = stream.StreamDecoder()
    return decoder.feed(path.read_bytes()) + decoder.finish()


def _plain(rows: list[Any]) -> list[str]:
    return ["".join(chunk for _, chunk in r.row) for r in rows]


def test_a_real_run_reads_as_one_line_per_tool_call() -> None:
    rows = StreamFormatter().rows(_decode(FIXTURES / "root_529_then_ok" / "stdout.jsonl"))
    text = _plain(rows)
    assert text[0].startswith("● session started")
    assert any(line.startswith("⚠ API retry 1/") and "529" in line for line in text)
    assert "✎ Write hello.txt" in text  # the worktree prefix is dropped
    assert any(line.startswith("$ Bash ls") for line in text)
    assert any(line.startswith("  └ ") for line in text)
    assert text[-1].startswith("■ done in")
    # the result repeats the last message: shown once
    assert sum("Created hello.txt" in line for line in text) == 1
    kinds = {r.kind for r in rows}
    assert {"tool", "result", "retry", "text", "done", "info"} <= kinds


def test_failed_run_is_highlighted_as_error() -> None:
    rows = StreamFormatter().rows(_decode(FIXTURES / "root_529_retries2" / "stdout.jsonl"))
    errors = [r for r in rows if r.kind == "error"]
    assert errors and all(span[0] == "error" for r in errors for span in r.row)
    assert any("HTTP 529" in "".join(c for _, c in r.row) for r in errors)


def test_sub_agent_calls_are_indented_under_their_task() -> None:
    events: list[stream.Event] = [
        stream.ToolUse(line_no=1, id="t1", name="Task", input={}, summary="Task explore"),
        stream.ToolUse(line_no=2, parent_tool_use_id="t1", id="t2", name="Read", input={},
                       summary="Read a.py"),
        stream.ToolResult(line_no=3, parent_tool_use_id="t1", tool_use_id="t2",
                          first_line="x = 1"),
        stream.ToolUse(line_no=4, id="t3", name="Bash", input={}, summary="Bash ls"),
    ]
    text = _plain(StreamFormatter().rows(events))
    assert text == ["⤷ Task explore", "  ◱ Read a.py", "    └ x = 1", "$ Bash ls"]


def test_agent_text_is_never_markup_or_control_codes() -> None:
    hostile = "[bold red]boom[/] \x1b[31mred\x1b[0m [link=http://x]y[/link]"
    rows = StreamFormatter().rows([stream.Text(line_no=1, text=hostile)])
    shown = _plain(rows)[0]
    assert "[bold red]boom[/]" in shown and "\x1b" not in shown
    assert clean("a\tb\x07") == "a   b\ufffd"


def test_numbers_for_humans() -> None:
    assert human_tokens(999) == "999" and human_tokens(12_345) == "12.3k"
    assert human_tokens(2_500_000) == "2.5M"
    assert human_duration(59) == "59s" and human_duration(61) == "1m01s"
    assert human_duration(3 * 3600 + 120) == "3h02m"


def test_form_parsers_and_memory(tmp_path: Path) -> None:
    assert parse_duration("") is None and parse_duration("90") == 90
    assert parse_duration("15m") == 900 and parse_duration("2h") == 7200
    assert parse_duration("0") == 0  # no limit, as --timeout 0 and config's timeout = 0
    for bad in ("soon", "-3", "8d", "200h"):
        try:
            parse_duration(bad)
        except ValueError:
            continue
        raise AssertionError(bad)
    assert parse_positive_int("3") == 3 and parse_positive_int("") is None
    for bad in ("0", "x", "21"):
        try:
            parse_positive_int(bad, maximum=20)
        except ValueError:
            continue
        raise AssertionError(bad)
    path = tmp_path / "form.json"
    FormValues(base_ref="dev", timeout="30m").save(path)
    assert FormValues.load(path) == FormValues(base_ref="dev", timeout="30m")
    assert FormValues.load(path).carried() == ["base ref dev", "timeout 30m"]
    assert FormValues().carried() == []
    # a file from before copies were forgotten: the count is not carried
    path.write_text('{"copies": "2", "model": "small"}')
    assert FormValues.load(path) == FormValues(model="small")
    path.write_text("{not json")
    assert FormValues.load(path) == FormValues()  # a broken file is ignored, not fatal


def test_raw_lines_only_whole_lines(tmp_path: Path) -> None:
    """The raw view's reads (AttemptLog.read_lines): a line without its newline is shown
    only once the attempt has finished (a running claude may be writing it)."""
    log = AttemptLog(tmp_path)
    log.events.write_bytes(b'{"a":1}\n{"b":2}\n{"c":')
    lines, offset, more = log.read_lines(0, 1 << 20, finished=False)
    assert lines == ['{"a":1}', '{"b":2}'] and offset == 16 and not more
    lines, offset, _ = log.read_lines(0, 1 << 20, finished=True)
    assert lines[-1] == '{"c":' and offset == 21
    assert AttemptLog(tmp_path / "missing").read_lines(0, 10, finished=False) == ([], 0, False)


class _ViewApp(App[None]):
    def __init__(self, widget: Any) -> None:
        super().__init__()
        self.widget = widget

    def compose(self) -> ComposeResult:
        yield self.widget


def _big_diff(lines: int) -> Diff:
    body = [f"+line {i} " + "x" * (i % 70) for i in range(lines)]
    patch = "\n".join(["diff --git a/big.txt b/big.txt", "new file mode 100644",
                       "--- /dev/null", "+++ b/big.txt", f"@@ -0,0 +1,{lines} @@", *body])
    return Diff(files=[FileDiff(path="big.txt", status="added", added=lines, deleted=0,
                                patch=patch)], patch=patch)


async def test_twenty_thousand_line_diff_renders_only_what_is_on_screen() -> None:
    """(Its speed budget is bench/diff.py's diff.view_paint.)"""
    prepared = PreparedDiff.build(_big_diff(20_000))
    view = DiffView()
    app = _ViewApp(view)
    async with app.run_test(size=(160, 48)) as pilot:
        view.show("t1", prepared)
        await pilot.pause()
        lines = view.query_one(DiffLines)
        assert lines.row_count() == 20_005
        assert len(lines._cache) < 200  # only what is on screen was rendered
        lines.focus()
        await pilot.press("end")
        await pilot.pause()
        assert lines.scroll_y > 19_000


async def test_the_pages_either_side_are_made_while_idle_so_a_page_key_builds_nothing(
        ) -> None:
    """A coloured row costs ~0.3 ms to build (its syntax, its changed words, its strip):
    a page of them made when the key comes was ~40 ms of a page down. Once a frame is out
    the view builds the page below and the page above in slices of a few ms, so the frame
    after the key only shows rows already made."""
    prepared = PreparedDiff.build(_big_diff(20_000))
    view = DiffView()
    app = _ViewApp(view)
    async with app.run_test(size=(160, 48)) as pilot:
        view.show("t1", prepared)
        lines = view.query_one(DiffLines)
        lines.focus()
        await pilot.press("pagedown", "pagedown")
        height = lines.size.height
        top = int(lines.scroll_y)
        assert top > 0 and height > 10
        below = range(top + height, top + 2 * height)
        above = range(max(0, top - height), top)
        await wait_until(pilot, lambda: all(i in lines._cache for i in [*below, *above]),
                         what="the pages either side of the view made")
        made: list[int] = []
        get_row = lines.get_row

        def counting(index: int) -> Any:
            made.append(index)
            return get_row(index)

        lines.get_row = counting  # type: ignore[method-assign]
        await pilot.press("pagedown")
        await wait_until(pilot, lambda: int(lines.scroll_y) > top, what="the page turned")
        await pilot.pause()
        shown = range(int(lines.scroll_y), int(lines.scroll_y) + height)
        assert shown.start > top and shown.stop <= below.stop
        assert not set(made) & set(shown), "rows built for the frame after the key"


async def test_stream_view_takes_a_flood_in_batches() -> None:
    """(Its speed budget is bench/panel.py's panel.stream_flood.)"""
    view = StreamView()
    app = _ViewApp(view)
    events: list[stream.Event] = []
    for i in range(25_000):
        events.append(stream.ToolUse(line_no=2 * i, id=f"t{i}", name="Bash", input={},
                                     summary=f"Bash echo {i}"))
        events.append(stream.ToolResult(line_no=2 * i + 1, tool_use_id=f"t{i}",
                                        first_line=str(i)))
    formatter = StreamFormatter()
    async with app.run_test(size=(120, 40)) as pilot:
        for chunk in range(0, len(events), 5_000):
            view.append_rows(formatter.rows(events[chunk:chunk + 5_000]))
            await pilot.pause()
        assert view.row_count() == 50_000
        assert view.is_vertical_scroll_end  # following
        view.tools_only = True
        assert view.row_count() == 50_000
        await pilot.press("home")
        assert not view.follow  # scrolling back stops following
        await pilot.press("end")
        assert view.follow


def test_raw_json_rows_stay_verbatim() -> None:
    line = json.dumps({"type": "assistant", "text": "[b]x[/b]"})
    from fleet_tui.ui.formatting import raw_rows

    assert _plain(raw_rows([line])) == [line]
