"""The attempt folder's one reader: the partial-line rule, offsets, tails."""

from __future__ import annotations

from pathlib import Path

from fleet_tui.core import stream
from fleet_tui.execution.worker.attemptlog import AttemptLog, usable_end

INIT = b'{"type":"system","subtype":"init","session_id":"s-1","cwd":"/w","tools":[]}\n'
TEXT = (b'{"type":"assistant","message":{"id":"m1","role":"assistant","content":'
        b'[{"type":"text","text":"hello"}]},"session_id":"s-1"}\n')


def folder(tmp_path: Path, data: bytes) -> AttemptLog:
    (tmp_path / "events.jsonl").write_bytes(data)
    return AttemptLog(tmp_path)


def test_a_line_without_newline_counts_only_once_finished(tmp_path: Path) -> None:
    log = folder(tmp_path, INIT + TEXT[:-1])
    events, end = log.read_events(finished=False)
    assert [type(e) for e in events] == [stream.Init] and end == len(INIT)
    events, end = log.read_events(finished=True)
    assert [type(e) for e in events] == [stream.Init, stream.Text]
    assert end == len(INIT) + len(TEXT) - 1
    assert usable_end(b"a\nb", at_eof=False, finished=True) == 2


def test_reading_in_small_chunks_moves_past_a_line_longer_than_the_chunk(
        tmp_path: Path) -> None:
    log = folder(tmp_path, INIT + TEXT + INIT)
    offset, seen = 0, []
    for _ in range(10):
        lines, offset, _more = log.read_lines(offset, 16, finished=True)
        seen += lines
        if offset == log.size():
            break
    assert seen == [INIT.decode().strip(), TEXT.decode().strip(), INIT.decode().strip()]


def test_tail_start_is_a_line_start(tmp_path: Path) -> None:
    log = folder(tmp_path, INIT * 50)
    start = log.tail_start(len(INIT) * 3 + 5)
    assert start == len(INIT) * 47  # the first line start inside the window
    assert log.tail_start(10**6) == 0
    assert AttemptLog(tmp_path / "missing").tail_start(10) == 0


def test_missing_files_read_as_empty(tmp_path: Path) -> None:
    log = AttemptLog(tmp_path / "nothing")
    assert log.read_events(5, finished=True) == ([], 5)
    assert log.stderr_tail() == "" and log.record("exit.json") is None and log.size() == 0
