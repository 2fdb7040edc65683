"""Plain-Python formatting for the panel: stream events to rows, states to badges, numbers.

No Textual here, so the heavy part of ingesting a stream (turning thousands of events into
rows) runs in a thread worker and is unit-tested without a terminal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleet_tui.store import TaskState
from fleet_tui.ui.widgets.line_view import Row, clean

TYPE_CHECKING = False
if TYPE_CHECKING:
    from fleet_tui import stream

# One icon per tool: single-cell symbols so columns stay aligned in every terminal.
TOOL_ICONS: dict[str, str] = {
    "Bash": "$",
    "Read": "◱",
    "Write": "✎",
    "Edit": "✎",
    "MultiEdit": "✎",
    "NotebookEdit": "✎",
    "Glob": "⌕",
    "Grep": "⌕",
    "LS": "⌕",
    "Task": "⤷",
    "Agent": "⤷",
    "WebFetch": "⇣",
    "WebSearch": "⌕",
    "TodoWrite": "☐",
}
DEFAULT_ICON = "•"

# Row kinds; the "tools only" filter keeps these.
TOOL_KINDS = frozenset({"tool", "result", "retry", "error", "done"})

MAX_TEXT_LINES = 400  # one assistant message never floods the view


@dataclass(slots=True)
class StreamRow:
    """One displayed line of a stream and the kind the filter looks at."""

    kind: str
    row: Row


@dataclass
class StreamFormatter:
    """Turns stream events into rows, remembering what it needs across batches.

    It keeps the depth of every Task/Agent call, so that a sub-agent's calls are
    indented under their parent.
    """

    cwd: str | None = None
    depth_of: dict[str, int] = field(default_factory=dict)
    last_text: str = ""

    def __post_init__(self) -> None:
        # The event classes, imported with the first formatter (in a worker thread) rather
        # than with the panel: the stream decoder costs the first frame ~10 ms to import.
        global stream
        from fleet_tui import stream

    def _relative(self, text: str) -> str:
        """Paths inside the worktree shown relative to it (they are long and all alike)."""
        if self.cwd:
            text = text.replace(self.cwd.rstrip("/") + "/", "")
        return text

    def _depth(self, event: stream.Event) -> int:
        parent = event.parent_tool_use_id
        if not parent:
            return 0
        return self.depth_of.get(parent, 0) + 1

    def rows(self, events: list[stream.Event]) -> list[StreamRow]:
        out: list[StreamRow] = []
        for event in events:
            self._format(event, out)
        return out

    def _format(self, event: stream.Event, out: list[StreamRow]) -> None:
        depth = self._depth(event)
        pad = ("", "  " * depth) if depth else None

        def add(kind: str, *spans: tuple[str, str]) -> None:
            row: Row = ((pad, *spans) if pad else tuple(spans))
            out.append(StreamRow(kind, row))

        if isinstance(event, stream.ToolUse):
            if event.name in ("Task", "Agent"):
                self.depth_of[event.id] = depth
            icon = TOOL_ICONS.get(event.name, DEFAULT_ICON)
            summary = clean(self._relative(event.summary or event.name))
            name, _, rest = summary.partition(" ")
            add("tool", ("icon", f"{icon} "), ("tool", name),
                ("", f" {rest}" if rest else ""))
        elif isinstance(event, stream.ToolResult):
            first = clean(self._relative(event.first_line or ""))
            if event.is_error:
                add("result", ("error", "  └ ✗ "), ("error", first or "(error)"))
            else:
                add("result", ("dim", "  └ "), ("dim", first or "(no output)"))
        elif isinstance(event, stream.Text) and (event.synthetic or event.error):
            first = (event.text.strip().splitlines() or [event.error or "API error"])[0]
            add("error", ("error", "✗ API error: "), ("error", clean(first)))
        elif isinstance(event, stream.Text):
            self.last_text = event.text.strip()
            lines = event.text.splitlines() or [""]
            for i, line in enumerate(lines[:MAX_TEXT_LINES]):
                add("text", ("say", "▌ " if i == 0 else "  "), ("", clean(line)))
            if len(lines) > MAX_TEXT_LINES:
                add("text", ("dim", f"  … {len(lines) - MAX_TEXT_LINES} more lines"))
        elif isinstance(event, stream.Thinking):
            first = (event.text.strip().splitlines() or [""])[0]
            add("thinking", ("dim", "∴ "), ("dim", clean(first)))
        elif isinstance(event, stream.ApiRetry):
            status = event.error_status if event.error_status is not None else "?"
            delay = (event.retry_delay_ms or 0) / 1000
            add("retry", ("warn", "⚠ API retry "),
                ("warn", f"{event.attempt}/{event.max_retries} after {status} "),
                ("warn", clean(str(event.error or ""))), ("dim", f" (waiting {delay:.1f} s)"))
        elif isinstance(event, stream.Result):
            turns = event.num_turns if event.num_turns is not None else 0
            if event.is_error:
                head = f"■ failed after {turns} turns"
                if event.api_error_status:
                    head += f" (HTTP {event.api_error_status})"
                text = clean((str(event.result or event.subtype or "")).splitlines()[0]
                             if (event.result or event.subtype) else "")
                add("error", ("error", head), ("error", f": {text}" if text else ""))
            else:
                add("done", ("ok", f"■ done in {turns} turns"))
                final = str(event.result or "").strip()
                if final and final != self.last_text:  # usually the last message again
                    for line in final.splitlines()[:MAX_TEXT_LINES]:
                        add("text", ("say", "  "), ("", clean(line)))
        elif isinstance(event, stream.Init):
            if event.cwd and not self.cwd:
                self.cwd = event.cwd
            detail = f" · model {event.model}" if event.model else ""
            add("info", ("dim", f"● session started{detail}"))
        elif isinstance(event, stream.RateLimit):
            add("retry", ("warn", "⚠ rate limit notice"))
        elif isinstance(event, stream.Malformed):
            add("error", ("error", "✗ unreadable line: "), ("dim", clean(event.raw[:200])))
        # Status, Partial and Unknown lines carry nothing a reader needs; raw mode shows them.


def raw_rows(lines: list[str]) -> list[StreamRow]:
    """Raw JSON lines, one row each (shown as they are, never interpreted)."""
    return [StreamRow("raw", (("", clean(line)),)) for line in lines]


# --- task list formatting ---------------------------------------------------------------

STATE_BADGES: dict[TaskState, str] = {
    TaskState.QUEUED: "· queued",
    TaskState.RUNNING: "▶ running",
    TaskState.STALLED: "‼ stalled",
    TaskState.WAITING: "… waiting",
    TaskState.SUCCEEDED: "✔ done",
    TaskState.FAILED: "✗ failed",
    TaskState.KILLED: "■ killed",
    TaskState.MERGED: "⇢ merged",
    TaskState.DISCARDED: "⌫ discarded",
}

# Lower sorts first: what needs the user, then what runs, then what waits, then history.
STATE_ORDER: dict[TaskState, int] = {
    TaskState.STALLED: 0,
    TaskState.FAILED: 1,
    TaskState.SUCCEEDED: 2,
    TaskState.KILLED: 3,
    TaskState.RUNNING: 4,
    TaskState.WAITING: 5,
    TaskState.QUEUED: 6,
    TaskState.MERGED: 7,
    TaskState.DISCARDED: 8,
}

ATTENTION_STATES = frozenset({TaskState.STALLED, TaskState.FAILED, TaskState.SUCCEEDED,
                              TaskState.KILLED})


def human_tokens(count: int) -> str:
    if count < 1000:
        return str(count)
    if count < 1_000_000:
        return f"{count / 1000:.1f}k"
    return f"{count / 1_000_000:.1f}M"


def human_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
