"""The stream pane: one task's attempt as it runs, its caption, and the workers that read it.

The pane owns the whole "follow a stream" state machine, so the main screen only says
which task is selected (``show``) and which attempt to prefer (``choose_attempt``):

- A thread worker reads the end of the attempt's events file (the last ``TAIL_BYTES``,
  through the engine's ``Fleet.attempt_log``: the folder its host left), formats it off
  the event loop and posts batches; it keeps following while the attempt runs, and moves
  to a new attempt when the task gets one. A selection must settle (``STREAM_SETTLE``)
  before it reads.
- Older history is read a chunk at a time when the view scrolls to its top (``home``: all
  of it), by a second worker.
- Every restart bumps a generation; batches of an older generation are dropped.

The view flags are reactives of the pane: ``raw`` (JSON lines instead of readable rows),
``tools_only`` and ``follow`` (bound down to the view); the caption shows all three.
"""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widget import Widget
from textual.worker import Worker, get_current_worker

from fleet_tui.core.states import PENDING_STATES
from fleet_tui.ui.formatting import (
    SETUP_REF,
    StreamFormatter,
    StreamRow,
    raw_rows,
    setup_detail,
    tool_call_detail,
)
from fleet_tui.ui.messages import StreamBatch, StreamOlder, ToolCallLoaded, report_failure
from fleet_tui.ui.widgets.line_view import LineView, SearchBar
from fleet_tui.ui.widgets.stream_view import MAX_ROWS, StreamView

TYPE_CHECKING = False
if TYPE_CHECKING:
    from fleet_tui.core.model import Attempt, Task
    from fleet_tui.engine.fleet import Fleet
    from fleet_tui.execution.worker.attemptlog import AttemptLog

READ_CHUNK = 4 * 1024 * 1024  # bytes of events per batch; bigger backlogs take several
TAIL_BYTES = 128 * 1024  # a newly selected attempt shows its last events first ...
OLDER_CHUNK = 1024 * 1024  # ... and reads older ones, a chunk at a time, on scrolling up
STREAM_SETTLE = 0.08  # seconds a selection must stay before its events file is read
DEFAULT_HINTS = "t: tools/all  J: raw  a: attempt  F: follow  x: expand  ctrl+f: search"


def worker_sleep(worker: Any, seconds: float) -> None:
    """Sleep in small steps so a cancelled worker stops quickly."""
    end = time.monotonic() + seconds
    while not worker.is_cancelled and time.monotonic() < end:
        time.sleep(min(0.05, max(0.0, end - time.monotonic())))


def _finished(attempt: Attempt, log: AttemptLog) -> bool:
    """The attempt has ended (the store says so, or its runner wrote the exit record):
    then a last line without its newline is part of the stream (AttemptLog's one rule)."""
    return attempt.finished_at is not None or log.exited


class CaptionLine(Widget):
    """One line: what is shown (the head), then the view's keys, each whole while it fits;
    the keys that do not fit are left to `?` (help), never cut in a word."""

    DEFAULT_CSS = "CaptionLine { height: 1; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._head = Text()
        self._hints: list[str] = []

    def show(self, head: Text, hints: list[str]) -> None:
        self._head, self._hints = head, hints
        self.refresh()

    def render(self) -> Text:
        width = self.size.width
        text = self._head.copy()
        text.no_wrap, text.overflow = True, "ellipsis"
        shown = [f"   {self._hints[0]}"] if self._hints else []
        shown += [f"  {hint}" for hint in self._hints[1:]]
        more = "  ?: more"
        used = text.cell_len
        for n, part in enumerate(shown):
            rest = more if n < len(shown) - 1 else ""
            if width and used + len(part) + len(rest) > width:
                if used + len(more) <= width:
                    text.append(more)
                break
            text.append(part)
            used += len(part)
        return text


class StreamPane(Vertical):
    """The caption line and the stream view of the selected task."""

    raw: reactive[bool] = reactive(False, init=False)
    """Show the events file's lines as they are (JSON) instead of readable rows."""
    tools_only: reactive[bool] = reactive(False, init=False)
    """Only tool calls, their results, retries and errors."""
    follow: reactive[bool] = reactive(True, init=False)
    """Stick to the end as rows arrive (scrolling up turns it off, `end` on)."""

    def __init__(self, *, interval: float = 0.1, hints: str = DEFAULT_HINTS,
                 id: str | None = None) -> None:
        """``interval``: seconds between reads of a running attempt's file; ``hints``: the
        keys of the view flags, for the caption."""
        super().__init__(id=id)
        self.fleet: Fleet | None = None  # set by the screen once the engine is ready
        self.interval = interval
        self.hints = hints
        self.selected: Task | None = None
        self.slot_waits = 0  # the selected task's requests waiting at the gateway
        self.host_wait: str | None = None  # why it waits for its host
        self.attempt_choice: dict[str, int] = {}  # task id -> attempt chosen with `a`
        self.attempt: Attempt | None = None  # the attempt shown, once its tail arrived
        self.attempts = 0  # how many the task had then
        self._reading: tuple[str, int, int | None, bool] | None = None  # what the reader reads
        self._generation = 0
        self._older = 0  # bytes of the attempt's events before what the view holds
        self._older_loading = False
        self._label = CaptionLine(id="stream-caption")
        self._view = StreamView(id="stream")
        self._search = SearchBar(self._view, id="stream-search")

    def compose(self) -> ComposeResult:
        yield self._label
        yield self._view.data_bind(StreamPane.tools_only, StreamPane.follow)
        # the search bar is mounted when first asked for: an Input costs the first frame

    @property
    def view(self) -> StreamView:
        return self._view

    # --- what the screen says ----------------------------------------------------------------
    def show(self, task: Task | None) -> None:
        """Show ``task``'s stream (None: no task selected). The screen calls this on every
        selection and with every fresh read of the selected task; the reader starts again
        only when what it reads changed: another task, a new attempt, another chosen
        attempt, raw lines instead of events."""
        self.selected = task
        key = None if task is None else (task.id, task.attempt_count,
                                         self.attempt_choice.get(task.id), self.raw)
        if key != self._reading:
            self._reading = key
            self._restart()

    def reread(self) -> None:
        """Read the stream afresh at the next ``show`` (after an engine action)."""
        self._reading = None

    def choose_attempt(self, task_id: str, n: int, latest: int) -> None:
        """Show attempt ``n`` of the task (the latest: follow the newest again)."""
        if n == latest:
            self.attempt_choice.pop(task_id, None)
        else:
            self.attempt_choice[task_id] = n
        if self.selected is not None and self.selected.id == task_id:
            self.show(self.selected)

    def watch_raw(self) -> None:
        self.show(self.selected)

    def watch_tools_only(self) -> None:
        self._caption()

    def watch_follow(self) -> None:
        self._caption()

    @on(LineView.FollowChanged)
    def _view_follow_changed(self) -> None:
        self.follow = self._view.follow  # the view turned it off (scrolled up) or on (end)

    # --- search and the whole tool call -----------------------------------------------------
    async def mount_search(self) -> None:
        """Mount the search bar (after the first frame: an Input costs it)."""
        if self._search.parent is None:
            await self.mount(self._search)

    def open_search(self) -> None:
        """Show the search bar and type in it (`/` in the view, ctrl+f anywhere)."""
        if self._search.parent is None:
            self.mount(self._search)
            self.call_after_refresh(self._search.open)
            return
        self._search.open()

    @on(LineView.SearchAsked)
    def _search_asked(self, event: LineView.SearchAsked) -> None:
        event.stop()
        self.open_search()

    @on(LineView.SearchMoved)
    def _search_moved(self, event: LineView.SearchMoved) -> None:
        event.stop()
        if self._search.parent is not None:
            self._search.sync()

    def expand_tool_call(self) -> None:
        """Show the whole tool call of the cursor's line (x / enter)."""
        self._expand(self._view.ref_at())

    @on(StreamView.ExpandAsked)
    def _expand_asked(self, event: StreamView.ExpandAsked) -> None:
        event.stop()
        self._expand(event.ref)

    def _expand(self, ref: str | None) -> None:
        attempt, task = self.attempt, self.selected
        if task is None or attempt is None:
            return
        if ref is None or self.raw:
            self.notify("Move the stream's cursor (↑ ↓) to a tool call or its result, then "
                        "press x or enter." if not self.raw else
                        "Raw JSON lines show everything already; J goes back to readable "
                        "rows, where x shows a whole tool call.",
                        title="No tool call on this line", severity="warning")
            return
        self._load_tool_call(task.id, attempt, ref,
                             str(task.worktree) if task.worktree else None)

    @work(thread=True, exclusive=True, exit_on_error=False, group="stream-detail",
          description="reading the tool call")
    def _load_tool_call(self, task_id: str, attempt: Attempt, ref: str,
                        cwd: str | None) -> None:
        """Find the call and its result in the events file and lay them out (the screen
        shows them: ToolCallLoaded)."""
        log = self.fleet.attempt_log(attempt) if self.fleet is not None else None
        if log is None:
            return
        if ref == SETUP_REF:
            try:
                text = log.setup_log.read_text(encoding="utf-8", errors="replace")
            except OSError:
                text = ""
            self.post_message(ToolCallLoaded(task_id, ref, setup_detail(log.setup_steps(),
                                                                        text)))
            return
        use, result = log.tool_call(ref)
        self.post_message(ToolCallLoaded(task_id, ref, tool_call_detail(use, result, cwd)))

    # --- reading --------------------------------------------------------------------------
    def _restart(self) -> None:
        task = self.selected
        self._generation += 1
        view = self._view
        view.clear_rows()
        self.attempt = None
        self.attempts = 0
        self._older = 0
        self._older_loading = False
        view.has_older = False
        self._caption()
        if task is None or self.fleet is None:
            return
        self._follow(self.fleet, self._generation, task.id, self.attempt_choice.get(task.id),
                     self.raw)

    @work(thread=True, exclusive=True, exit_on_error=False, group="stream",
          description="reading the attempt's events")
    def _follow(self, fleet: Fleet, generation: int, task_id: str, attempt_no: int | None,
                raw: bool) -> None:
        """Read the end of one attempt's events file and keep following it while it runs;
        older history is read when the view scrolls up to it (``_load_older``). One
        message per batch, so a fast stream costs few messages."""
        worker = get_current_worker()
        worker_sleep(worker, STREAM_SETTLE)  # a key held down has moved on: read nothing
        if worker.is_cancelled:
            return
        task = fleet.get_task(task_id)
        cwd = str(task.worktree) if task.worktree else None
        formatter = StreamFormatter(cwd=cwd)
        attempt: Attempt | None = None
        log: AttemptLog | None = None
        announce: tuple[Attempt, int, int] | None = None
        offset = 0
        last_check = 0.0
        while not worker.is_cancelled:
            if attempt is None or time.monotonic() - last_check > 1.0:
                last_check = time.monotonic()
                attempts = fleet.attempts(task_id)
                chosen = [a for a in attempts if a.n == attempt_no] if attempt_no else []
                current = chosen[0] if chosen else (attempts[-1] if attempts else None)
                if current is None:
                    task = fleet.get_task(task_id)
                    if task.state not in PENDING_STATES:
                        return
                    worker_sleep(worker, 0.5)
                    continue
                if attempt is None or current.n != attempt.n or (
                        log is None and current.dir is not None):
                    # a new attempt, or its folder is recorded now (an attempt is in the
                    # store a moment before its folder: the starter records it when it
                    # has the folder's lock)
                    log = fleet.attempt_log(current)
                    offset = log.tail_start(TAIL_BYTES) if log is not None else 0
                    formatter = StreamFormatter(cwd=cwd)
                    # said with the tail's rows, so the view knows what it holds at once
                    announce = (current, len(attempts), offset)
                attempt = current
            rows: list[StreamRow] = []
            more = False
            if log is not None and raw:
                lines, offset, more = log.read_lines(offset, READ_CHUNK,
                                                     finished=_finished(attempt, log))
                rows = raw_rows(lines)
            elif log is not None:
                before = offset
                events, offset = log.read_events(offset, READ_CHUNK,
                                                 finished=_finished(attempt, log))
                more = offset - before >= READ_CHUNK // 2
                rows = formatter.rows(events)
            if announce is not None:
                self.post_message(StreamBatch(generation, rows, announce[0], announce[1],
                                              older=announce[2]))
                announce = None
            elif rows:
                self.post_message(StreamBatch(generation, rows))
            if more:
                time.sleep(0.001)  # between big batches, let the event loop have the GIL
                continue
            if attempt.finished_at is not None and time.monotonic() - last_check < 1.0 \
                    and not rows:
                # Finished and read to the end: one last look after the check above.
                return
            worker_sleep(worker, self.interval)

    @work(thread=True, exclusive=True, exit_on_error=False, group="stream-older",
          description="reading older events")
    def _load_older(self, generation: int, attempt: Attempt, end: int, everything: bool,
                    raw: bool, cwd: str | None) -> None:
        """Rows of the attempt's events from before ``end`` (a line start): the previous
        chunk, or everything (``home``), posted as one StreamOlder."""
        log = self.fleet.attempt_log(attempt) if self.fleet is not None else None
        if log is None:  # (never announced with older bytes; said for the record)
            self.post_message(StreamOlder(generation, [], 0, everything))
            return
        start = 0 if everything else log.tail_start(OLDER_CHUNK, end=end)
        formatter = StreamFormatter(cwd=cwd)
        rows: list[StreamRow] = []
        offset = start
        worker = get_current_worker()
        while offset < end and not worker.is_cancelled:
            want = min(READ_CHUNK, end - offset)
            # [start, end) holds whole lines only: whether the attempt finished does not
            # matter here
            if raw:
                lines, new, _ = log.read_lines(offset, want, finished=False)
                rows += raw_rows(lines)
            else:
                events, new = log.read_events(offset, want, finished=False)
                rows += formatter.rows(events)
            if new <= offset:
                break
            offset = new
            del rows[:-MAX_ROWS]
        if not worker.is_cancelled:
            self.post_message(StreamOlder(generation, rows, start, everything))

    def on_stream_batch(self, message: StreamBatch) -> None:
        message.stop()
        if message.generation != self._generation:
            return
        view = self._view
        if message.attempt is not None:
            self.attempt = message.attempt
            self.attempts = message.attempts
            self._older = message.older or 0
            view.clear_rows()
            view.has_older = self._older > 0
            self._caption()
        view.append_rows(message.rows)
        self._fill()

    def on_stream_older(self, message: StreamOlder) -> None:
        message.stop()
        if message.generation != self._generation:
            return
        self._older_loading = False
        self._older = message.older
        view = self._view
        view.has_older = message.older > 0
        view.prepend_rows(message.rows, to_top=message.everything)
        self._fill()

    @on(StreamView.WantsOlder)
    def _wants_older(self, message: StreamView.WantsOlder) -> None:
        self._read_older(everything=message.everything)

    def _read_older(self, *, everything: bool = False) -> None:
        attempt = self.attempt
        task = self.selected
        if attempt is None or task is None or self._older <= 0:
            return
        if self._older_loading and not everything:
            return
        self._older_loading = True
        self._load_older(self._generation, attempt, self._older, everything, self.raw,
                         str(task.worktree) if task.worktree else None)

    def _fill(self) -> None:
        """Fewer rows than the view is high (a short tail, tool calls only): read on back."""
        view = self._view
        if self._older > 0 and not self._older_loading \
                and view.row_count() < max(1, view.size.height):
            self._read_older()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        report_failure(self, event)

    # --- the caption ------------------------------------------------------------------------
    def _caption(self) -> None:
        attempt = self.attempt
        task = self.selected
        text = Text()
        if task is None:
            text.append("No task selected.")
        elif attempt is None:
            if task.state in PENDING_STATES and self.host_wait:
                text.append(self.host_wait[:1].upper() + self.host_wait[1:] + "…")
            else:
                text.append("Waiting for a free slot…" if task.state in PENDING_STATES
                            else "No attempt yet.")
        else:
            text.append(f"attempt {attempt.n}/{self.attempts} ({attempt.kind})", style="bold")
            if attempt.verdict:
                text.append(f" · {attempt.verdict}")
            elif self.slot_waits:
                text.append(" · waiting for a request slot", style="bold")
        text.append("   ")
        text.append("following" if self.follow else "paused (end: follow)")
        text.append(" · JSON lines" if self.raw else (
            " · tool calls only" if self.tools_only else " · everything"))
        self._label.show(text, [h for h in self.hints.split("  ") if h.strip()])

    def show_slot_waits(self, waits: int) -> None:
        """The selected task's requests waiting for a request slot at the gateway (issue
        19): said in the caption while there are any."""
        if waits != self.slot_waits:
            self.slot_waits = waits
            self._caption()

    def show_host_wait(self, why: str | None) -> None:
        """Why the selected task waits for its host, said in the caption instead of "a
        free slot"."""
        if why != self.host_wait:
            self.host_wait = why
            self._caption()

    @property
    def caption(self) -> str:
        """The caption as plain text (tests)."""
        return str(self._label.render())
