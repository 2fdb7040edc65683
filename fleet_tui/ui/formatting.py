"""Plain-Python formatting for the panel: stream events to rows, diffs to lines, numbers.

The bottom layer of the panel: no Textual here (and nothing of the panel above it), so the
heavy part of ingesting a stream or a diff (turning thousands of events or lines into rows)
runs in a thread worker and is unit-tested without a terminal. A row is plain data: spans of
(style name, text), where the style name is a component class the widget that paints it
maps to a theme colour. What a task state looks like (badge, order, style) is not here but
in `fleet_tui.core.states`, the one table of states.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from rich.cells import cell_len

from fleet_tui.core.states import CLOSED_STATES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from fleet_tui.core import stream
    from fleet_tui.core.diffwords import DiffLayout
    from fleet_tui.core.model import Task
    from fleet_tui.ui.diff_render import DiffRenderer
    from fleet_tui.vcs.git import Diff

Span = tuple[str, str]
"""(style name, text): the style name is a component class suffix, "" for plain."""
Row = tuple[Span, ...]

# the controls (and, as `core.terminal.visible` does for a terminal, the bidi controls that
# would show a line in another order than it is)
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f\x80-\x9f\u061c\u200e\u200f\u202a-\u202e"
                      "\u2066-\u2069]")


def clean(text: str) -> str:
    """Untrusted text made safe to paint: no control characters, tabs expanded."""
    return _CONTROL.sub("\ufffd", text).expandtabs(4)


def count(n: int, word: str) -> str:
    """"1 turn", "2 turns": a count with its noun in the number it takes."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def attempt_label(n: int, kind: str, verdict: str | None, turns: int,
                  model: str | None) -> str:
    """One attempt as the attempts list shows it: "2. fresh attempt: killed after 1 turn
    (glm-4.6)"; a running one "3. follow-up: running, 4 turns so far"."""
    what = "follow-up" if kind == "followup" else f"{kind} attempt"
    if verdict is None:
        told = f"running, {count(turns, 'turn')} so far"
    else:
        told = f"{verdict} after {count(turns, 'turn')}"
    return f"{n}. {what}: {told}" + (f" ({model})" if model else "")


def row_width(row: Row) -> int:
    return sum(cell_len(chunk) for _, chunk in row)

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
TOOL_KINDS = frozenset({"tool", "result", "retry", "error", "done", "blocked"})

MAX_TEXT_LINES = 400  # one assistant message never floods the view
MAX_USER_LINES = 20  # a long prompt shows its start (the whole is in `fleet-tui show`)
SETUP_REF = "fleet-setup"  # the `ref` of the setup step's rows (x shows it whole)


@dataclass(slots=True)
class StreamRow:
    """One displayed line of a stream and the kind the filter looks at; `ref` is the id
    of the tool call the row belongs to (its call or its result), for expanding it."""

    kind: str
    row: Row
    ref: str | None = None


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
        from fleet_tui.core import stream

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

    def _setup(self, event: stream.Setup, add: Callable[..., None]) -> None:
        _setup_row(event, add)

    def rows(self, events: list[stream.Event]) -> list[StreamRow]:
        out: list[StreamRow] = []
        for event in events:
            self._format(event, out)
        return out

    def _format(self, event: stream.Event, out: list[StreamRow]) -> None:
        depth = self._depth(event)
        pad = ("", "  " * depth) if depth else None

        def add(kind: str, *spans: tuple[str, str], ref: str | None = None) -> None:
            row: Row = ((pad, *spans) if pad else tuple(spans))
            out.append(StreamRow(kind, row, ref))

        if isinstance(event, stream.Setup):
            self._setup(event, add)
        elif isinstance(event, stream.Blocked):
            add("blocked", ("error", clean(event.text)))
        elif isinstance(event, stream.UserMessage):
            lines = event.text.splitlines() or [""]
            for i, line in enumerate(lines[:MAX_USER_LINES]):
                add("user", ("user", "» you: " if i == 0 else "       "),
                    ("user", clean(line)))
            if len(lines) > MAX_USER_LINES:
                add("user", ("dim", f"       … {len(lines) - MAX_USER_LINES} more lines"))
        elif isinstance(event, stream.ToolUse):
            if event.name in ("Task", "Agent"):
                self.depth_of[event.id] = depth
            icon = TOOL_ICONS.get(event.name, DEFAULT_ICON)
            summary = clean(self._relative(event.summary or event.name))
            name, _, rest = summary.partition(" ")
            add("tool", ("icon", f"{icon} "), ("tool", name),
                ("", f" {rest}" if rest else ""), ref=event.id or None)
        elif isinstance(event, stream.ToolResult):
            first = clean(self._relative(event.first_line or ""))
            ref = event.tool_use_id or None
            more = _more_lines(event.content)
            hint = ("dim", f"  (+{more} line{'s' if more != 1 else ''}: x)") if more \
                else ("", "")
            if event.is_error:
                add("result", ("error", "  └ ✗ "), ("error", first or "(error)"), hint,
                    ref=ref)
            else:
                add("result", ("dim", "  └ "), ("dim", first or "(no output)"), hint,
                    ref=ref)
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
                head = f"■ failed after {count(turns, 'turn')}"
                if event.api_error_status:
                    head += f" (HTTP {event.api_error_status})"
                text = clean((str(event.result or event.subtype or "")).splitlines()[0]
                             if (event.result or event.subtype) else "")
                add("error", ("error", head), ("error", f": {text}" if text else ""))
            else:
                add("done", ("ok", f"■ done in {count(turns, 'turn')}"))
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


def _setup_row(event: stream.Setup, add: Callable[..., None]) -> None:
    """The setup step: its command, then how it ended (the included files said too)."""
    if event.phase == "start":
        what = f" {event.command}" if event.command else " (copying the included files)"
        add("tool", ("icon", "⚙ "), ("tool", "setup"), ("", clean(what)), ref=SETUP_REF)
        return
    files = f" · copied {', '.join(event.copied)}" if event.copied else ""
    if event.skipped:
        files += f" · skipped {'; '.join(event.skipped)}"
    took = f" in {event.seconds:.1f} s" if event.seconds is not None else ""
    more = _more_lines(event.output)
    hint = ("dim", f"  (+{more} line{'s' if more != 1 else ''}: x)") if more else ("", "")
    if event.exit_code == 0:
        add("result", ("dim", "  └ "), ("ok", "✔ ready"), ("dim", clean(took + files)), hint,
            ref=SETUP_REF)
    else:
        lines = [line for line in event.output.splitlines() if line.strip()]
        last = f": {lines[-1].strip()}" if lines else ""
        code = f"exit {event.exit_code}" if event.exit_code is not None else "did not run"
        add("error", ("error", "  └ ✗ "), ("error", clean(f"setup failed ({code}){last}")),
            ("dim", clean(files)), hint, ref=SETUP_REF)


def _more_lines(text: str) -> int:
    """How many non-blank lines a tool result has beyond the first one shown."""
    if "\n" not in text:
        return 0
    return max(0, sum(1 for line in text[:1 << 20].splitlines() if line.strip()) - 1)


MAX_DETAIL_LINES = 200_000  # a tool's output beyond this is in `fleet-tui logs --full`


@dataclass(frozen=True)
class ToolCallDetail:
    """What the detail view shows of one tool call: a title, its status and its rows
    (style name, text): the whole input, then the whole output."""

    title: str
    status: str
    rows: list[tuple[str, str]]


def tool_call_detail(use: stream.ToolUse | None, result: stream.ToolResult | None,
                     cwd: str | None = None) -> ToolCallDetail:
    """The detail view of a tool call (plain Python: built in a thread)."""
    from fleet_tui.core import stream as stream_mod

    name = use.name if use is not None else (result.tool_name if result else None) or "tool"
    summary = use.summary if use is not None and use.summary else name
    if cwd:
        summary = summary.replace(cwd.rstrip("/") + "/", "")
    rows: list[tuple[str, str]] = [("head", "── input ──")]
    if use is None:
        rows.append(("dim", "(the call is not in the events file)"))
    else:
        rows += [("", clean(line)) for line in
                 stream_mod.tool_input_text(use.name, use.input).splitlines()[:MAX_DETAIL_LINES]]
    rows.append(("", ""))
    rows.append(("head", "── output ──"))
    if result is None:
        status = "running (no result yet)"
        rows.append(("dim", "(no result yet: the tool is still running)"))
    else:
        status = stream_mod.result_status(result)
        lines = result.content.splitlines() or ["(no output)"]
        style = "error" if result.is_error else ""
        rows += [(style, clean(line)) for line in lines[:MAX_DETAIL_LINES]]
        if len(lines) > MAX_DETAIL_LINES:
            rows.append(("dim", f"… {len(lines) - MAX_DETAIL_LINES} more lines "
                                "(fleet-tui logs ID --full)"))
        count = len(result.content.splitlines())
        status += f" · {count} line{'s' if count != 1 else ''} of output"
    return ToolCallDetail(clean(f"{summary}"), status, rows)


def setup_detail(steps: list[stream.Setup], log_text: str) -> ToolCallDetail:
    """The detail view of the setup step: the command and the include patterns, then its
    whole output (setup.log) and what was copied or skipped."""
    start = next((e for e in steps if e.phase == "start"), None)
    end = next((e for e in reversed(steps) if e.phase == "end"), None)
    first = start or end
    command = first.command if first is not None else None
    rows: list[tuple[str, str]] = [("head", "── setup ──")]
    rows.append(("", clean(f"$ {command}" if command else "(no setup command)")))
    if end is not None and (end.copied or end.skipped):
        rows.append(("", ""))
        rows.append(("head", "── included files ──"))
        rows += [("", clean(f"copied  {path}")) for path in end.copied]
        rows += [("error", clean(f"skipped {why}")) for why in end.skipped]
    rows.append(("", ""))
    rows.append(("head", "── output ──"))
    text = log_text or (end.output if end is not None else "")
    failed = end is not None and end.exit_code != 0
    rows += [("error" if failed else "", clean(line))
             for line in (text.splitlines() or ["(no output)"])[:MAX_DETAIL_LINES]]
    if end is None:
        status = "running"
    else:
        status = f"exit {end.exit_code}" if end.exit_code is not None else "did not run"
        if end.seconds is not None:
            status += f" · {end.seconds:.1f} s"
    return ToolCallDetail("setup" + (f" {clean(command)}" if command else ""), status, rows)


def raw_rows(lines: list[str]) -> list[StreamRow]:
    """Raw JSON lines, one row each (shown as they are, never interpreted)."""
    return [StreamRow("raw", (("", clean(line)),)) for line in lines]


# --- diffs ------------------------------------------------------------------------------

ALL_FILES = "\x00all"  # the diff view's "all files" entry


class _OnDemand(dict[str, Any]):
    """A dict whose listed keys are made when first read (``get`` or ``[]``): a file's own
    lines are cleaned when the file is chosen, not for every file of a diff before its
    first paint (the "all files" view, shown first, has its lines already)."""

    def __init__(self, ready: dict[str, Any], make: dict[str, Callable[[], Any]]) -> None:
        super().__init__(ready)
        self._make = make

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        maker = self._make.get(key)
        if maker is None:
            return default
        value = self[key] = maker()
        return value

    def __getitem__(self, key: str) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or key in self._make


_MISSING = object()


@dataclass(frozen=True)
class PreparedDiff:
    """A diff split into lines off the UI thread, with the widest line measured, where its
    files, hunks and change blocks start (core.diffwords.layout_of), each file's lexer
    (looked up here, off the UI thread) and each file's digest (what a viewed mark is kept
    with). Nothing is tokenised here: lines are coloured when painted (ui/diff_render.py).
    A file's own lines (and their width) are made when it is first shown."""

    diff: Diff
    lines: dict[str, list[str]]  # path (or ALL_FILES) -> lines
    widths: dict[str, int]
    layouts: dict[str, DiffLayout] = field(default_factory=dict)  # as lines
    lexers: dict[str, Any] = field(default_factory=dict)  # path -> pygments lexer or None
    digests: dict[str, str] = field(default_factory=dict)  # path -> file_digest

    @classmethod
    def build(cls, diff: Diff) -> PreparedDiff:
        from fleet_tui.core.diffwords import file_digest, layout_of
        from fleet_tui.ui.diff_render import lexers_for

        whole = clean_lines(diff.patch)
        lines = _OnDemand({ALL_FILES: whole},
                          {f.path: partial(clean_lines, f.patch) for f in diff.files})
        widths = _OnDemand({ALL_FILES: max((len(x) for x in whole), default=0)},
                           {f.path: partial(_widest, lines, f.path) for f in diff.files})
        layouts = {ALL_FILES: layout_of(whole)}
        starts = layouts[ALL_FILES].file_starts
        aligned = len(starts) == len(diff.files)
        digests: dict[str, str] = {}
        for n, f in enumerate(diff.files):
            if aligned:  # the file's own part of the patch: its index line names the blob
                end = starts[n + 1] if n + 1 < len(starts) else len(whole)
                text = "\n".join(whole[starts[n]:end])
                if f.patch:  # (a binary file has no patch of its own)
                    layouts[f.path] = layouts[ALL_FILES].part(starts[n], end)
            else:  # (its layout is made with its lines, when it is shown)
                text = f.patch
            digests[f.path] = file_digest(f"{f.status}\0{f.old_path}\0{text}")
        return cls(diff, lines, widths, layouts, lexers_for(f.path for f in diff.files),
                   digests)

    def renderer(self, key: str, *, colours: bool = True) -> DiffRenderer:
        """The painter of ``key``'s lines (a path, or ALL_FILES)."""
        from fleet_tui.core.diffwords import layout_of
        from fleet_tui.ui.diff_render import DiffRenderer

        lines = self.lines.get(key, [])
        layout = self.layouts.get(key) or layout_of(lines)
        if key == ALL_FILES:
            paths = [f.path for f in self.diff.files]
            lexers = [self.lexers.get(p) for p in paths] \
                if len(layout.file_starts) == len(paths) else []
        else:
            lexers = [self.lexers.get(key)]
        return DiffRenderer(lines, layout, lexers, colours=colours)


def clean_lines(patch: str) -> list[str]:
    return [clean(line) for line in patch.splitlines()]


def _widest(lines: dict[str, list[str]], key: str) -> int:
    return max((len(x) for x in lines.get(key) or []), default=0)


# --- numbers ----------------------------------------------------------------------------


def human_tokens(count: int) -> str:
    if count < 1000:
        return str(count)
    if count < 1_000_000:
        return f"{count / 1000:.1f}k"
    return f"{count / 1_000_000:.1f}M"


def human_cost(amount: float, unpriced: int = 0) -> str:
    """USD as the list and the status line show it: $0.42, <$0.01, $1.2k; a * when some
    requests had no price (their cost is not in the figure)."""
    if 0 < amount < 0.01:
        text = "<$0.01"
    elif amount < 1000:
        text = f"${amount:.2f}"
    else:
        text = f"${amount / 1000:.1f}k"
    return text + ("*" if unpriced else "")


def human_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def describe_error(error: BaseException) -> str:
    """A user-facing message for an engine failure; never a traceback, never the key.
    Errors written for the user (fleet-tui's own) are said as they are; anything else names
    its type."""
    from fleet_tui.core.errors import FleetTuiError
    from fleet_tui.core.redaction import redact

    if isinstance(error, FleetTuiError):
        return redact(str(error)) or type(error).__name__
    text = redact(str(error).strip())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


# --- landing ------------------------------------------------------------------------------

# where a task is on its way to the base branch, as the list shows it before its title:
# (text, style name of the task table)
_LAND_STYLES = {"waiting": "waiting", "updating": "running", "testing": "running",
                "merging": "running", "fixing": "stalled", "stopped": "failed"}


def change_label(task: Task) -> str | None:
    """"no change" for a task that succeeded without changing anything (policy.no_change:
    the rule the CLI shows too), for the list's +/- column and the finish notification."""
    from fleet_tui.core import policy  # here: the panel's first frame loads no engine module

    return policy.NO_CHANGE if policy.no_change(task) else None


def landing_label(task: Task) -> tuple[str, str] | None:
    """The task's landing news for the list: its place in the merge queue ("⇡testing"),
    an update stopped on conflicts ("⚠conflicts"), or a push ("↑pushed"); None for none."""
    if task.conflicts:
        return "⚠conflicts", "failed"
    state = task.land_state
    closed = task.state in CLOSED_STATES  # history: its queue news is old
    if state is not None and state in _LAND_STYLES and not closed:
        return f"⇡{state}", _LAND_STYLES[state]
    if task.pushed:
        return "↑pushed", "muted"
    return None


def pushed_label(task: Task) -> str | None:
    """Where a task was pushed ("origin/fleet/abc @ 1a2b3c4d5e"), or None."""
    if not task.pushed:
        return None
    parts = task.pushed.split()
    if len(parts) != 3:
        return task.pushed
    return f"{parts[0]}/{parts[1]} @ {parts[2][:10]}"


def open_comments_words(count: int) -> str:
    """"1 review comment is open", "2 review comments are open" (the merge
    dialog, its queue mode and pick ask with these words)."""
    return f"{count} review comment{'s are' if count > 1 else ' is'} open"
