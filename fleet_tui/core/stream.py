"""stream-json bytes -> typed events.

`claude -p --output-format stream-json --verbose` prints one JSON object per line. The engine
tails that output from a file while the run is still writing it, so the decoder is
incremental (feed chunks of any size, get the same events whatever the chunking), bounded
(a line over `MAX_LINE_BYTES` becomes one `Malformed` event without being buffered whole)
and total: no input makes it raise, and what it gives out is safe to store and show (no
lone surrogates in its strings, counts within `MAX_COUNT`, numbers that are numbers).

Lines are decoded with msgspec into small typed structs (unknown keys are skipped without
being built, which is what makes this faster than `json.loads`); a line that msgspec cannot
fit to those structs is retried with the standard library so that valid JSON of an
unexpected shape becomes `Unknown` rather than `Malformed`.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import operator
import re
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType

    from fleet_tui.core import wire


MAX_LINE_BYTES = 16 * 1024 * 1024
"""Longest line decoded; a longer one becomes a single Malformed event."""

RAW_KEEP_BYTES = 4096
"""How much of a bad line a Malformed event keeps."""

SUMMARY_MAX = 120
"""Longest one-line tool summary, in characters."""

FIRST_LINE_MAX = 200
"""Longest first line of a tool result, in characters."""

SYNTHETIC_MODEL = "<synthetic>"
"""Model name the CLI puts on the assistant line it makes up for an API failure."""

MAX_NESTING = 512
"""Deepest nesting of arrays and objects the generic (slow-path) decoder accepts; deeper
lines become one Malformed event instead of a RecursionError at Python's stack limit. (The
typed fast path is not checked, to keep it fast: msgspec stops at the recursion limit, so a
line nested ~1000 deep is Malformed there too, and one nested just under it may decode in
one caller and not in a deeper one; the same caller always gets the same events.)"""

MAX_COUNT = 2**40
"""Largest token count taken from one message; anything else counts as 0 (a count must stay
storable: SQLite holds 63 bits, and a summary adds many messages up)."""

MAX_INT = 2**53
"""Largest magnitude of a number field (status, turns, retry attempt) taken as given."""


# --------------------------------------------------------------------------- events


@dataclass(slots=True, kw_only=True)
class Event:
    """One thing that happened in a run; `line_no` is the 1-based stream-json line."""

    kind: ClassVar[str] = "event"
    line_no: int
    parent_tool_use_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the event (with its kind), for logs and `--json` output."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in fields(self):
            out[f.name] = getattr(self, f.name)
        return out


@dataclass(slots=True, kw_only=True)
class Init(Event):
    """The `system/init` line: what the CLI runs with."""

    kind: ClassVar[str] = "init"
    session_id: str | None = None
    cwd: str | None = None
    model: str | None = None
    permission_mode: str | None = None
    claude_code_version: str | None = None
    tools: list[str] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class AssistantEvent(Event):
    """Common part of the events cut from one assistant line (one content block each).

    Several lines share one `message_id` (one API message, one turn); `usage` is the
    message's usage as of this line. `synthetic` marks the line the CLI makes up for an
    API failure, whose top-level `error` (e.g. `authentication_failed`) is kept.
    """

    kind: ClassVar[str] = "assistant"
    message_id: str | None = None
    synthetic: bool = False
    error: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(slots=True, kw_only=True)
class Text(AssistantEvent):
    kind: ClassVar[str] = "text"
    text: str = ""


@dataclass(slots=True, kw_only=True)
class Thinking(AssistantEvent):
    kind: ClassVar[str] = "thinking"
    text: str = ""


@dataclass(slots=True, kw_only=True)
class ToolUse(AssistantEvent):
    """A tool call; `summary` is one short line for people (`Write src/app.py`)."""

    kind: ClassVar[str] = "tool_use"
    id: str = ""
    name: str = ""
    input: Any = None
    summary: str = ""


@dataclass(slots=True, kw_only=True)
class ToolResult(Event):
    """A tool's result, paired with its call by id (`tool_name` is None if never seen).
    `content` is the whole result as text (what the tool printed, or its error);
    `exit_code` is a Bash step's exit status (None for other tools, or when unknown)."""

    kind: ClassVar[str] = "tool_result"
    tool_use_id: str = ""
    tool_name: str | None = None
    is_error: bool = False
    first_line: str = ""
    content: str = ""
    exit_code: int | None = None


@dataclass(slots=True, kw_only=True)
class UserMessage(Event):
    """A user message claude took in, as it echoes it (`--replay-user-messages`): the
    prompt, or a message sent to the running worker (`fleet-tui say`)."""

    kind: ClassVar[str] = "user_message"
    text: str = ""


@dataclass(slots=True, kw_only=True)
class Setup(Event):
    """The repository's setup step, which the runner runs in a new worktree before claude
    starts (fleet-tui writes these lines, `system/fleet_setup`): `phase` "start" (the
    command, the include patterns) or "end" (its exit code, the end of its output, the
    files copied in and those skipped, with why)."""

    kind: ClassVar[str] = "setup"
    phase: str = ""
    command: str | None = None
    exit_code: int | None = None
    output: str = ""
    copied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    seconds: float | None = None


@dataclass(slots=True, kw_only=True)
class Blocked(Event):
    """Something the worker's cage refused (fleet-tui writes these lines,
    `system/fleet_blocked`): `action` connect, write, read or signal, and its `target`
    (host:port, a path with the home as ~, a pid)."""

    kind: ClassVar[str] = "blocked"
    action: str = ""
    target: str = ""
    detail: str = ""

    @property
    def text(self) -> str:
        """`⊘ blocked: connect pypi.example:443` (untrusted: clean it before showing)."""
        return f"⊘ blocked: {self.action} {self.target}".rstrip()


@dataclass(slots=True, kw_only=True)
class ApiRetry(Event):
    """One retry the CLI makes by itself after an API error."""

    kind: ClassVar[str] = "api_retry"
    attempt: int | None = None
    max_retries: int | None = None
    retry_delay_ms: float | None = None
    error_status: int | None = None
    error: str | None = None


@dataclass(slots=True, kw_only=True)
class Status(Event):
    """A `system/status` line (with `--include-partial-messages`)."""

    kind: ClassVar[str] = "status"
    status: str | None = None


@dataclass(slots=True, kw_only=True)
class Partial(Event):
    """A raw SSE event (`stream_event`); `text` is the delta text when there is one."""

    kind: ClassVar[str] = "partial"
    event_type: str = ""
    text: str | None = None
    data: Any = None


@dataclass(slots=True, kw_only=True)
class RateLimit(Event):
    """A `rate_limit_event` line from newer CLIs."""

    kind: ClassVar[str] = "rate_limit"
    status: str | None = None
    resets_at: Any = None
    rate_limit_type: str | None = None
    data: Any = None


@dataclass(slots=True, kw_only=True)
class Result(Event):
    """The final `result` line; `data` is the whole object."""

    kind: ClassVar[str] = "result"
    subtype: str | None = None
    is_error: bool = False
    api_error_status: int | None = None
    result: str | None = None
    num_turns: int | None = None
    session_id: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    stop_reason: str | None = None
    terminal_reason: str | None = None
    permission_denials: list[Any] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True, kw_only=True)
class Unknown(Event):
    """Valid JSON the parser has no event for (new line types, new block types)."""

    kind: ClassVar[str] = "unknown"
    type: str = ""
    data: Any = None


@dataclass(slots=True, kw_only=True)
class Malformed(Event):
    """A line that is not JSON (or over the size cap); `raw` is its bounded head."""

    kind: ClassVar[str] = "malformed"
    raw: str = ""
    error: str = ""


# --------------------------------------------------------------------------- summaries

# C0 controls and DEL become spaces, so a summary is one printable line.
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")

# tool name -> input keys tried in order for its one-line detail
_DETAIL_KEYS: dict[str, tuple[str, ...]] = {
    "Write": ("file_path",),
    "Edit": ("file_path",),
    "MultiEdit": ("file_path",),
    "Read": ("file_path",),
    "NotebookEdit": ("notebook_path",),
    "NotebookRead": ("notebook_path",),
    "Bash": ("command",),
    "BashOutput": ("bash_id", "shell_id"),
    "KillBash": ("shell_id", "bash_id"),
    "KillShell": ("shell_id", "bash_id"),
    "Task": ("description", "subagent_type", "prompt"),
    "Agent": ("description", "subagent_type", "prompt"),
    "WebFetch": ("url",),
    "WebSearch": ("query",),
    "Skill": ("skill", "command", "name"),
    "SlashCommand": ("command",),
    "TaskCreate": ("subject", "description", "title"),
    "TaskUpdate": ("taskId", "task_id", "status"),
    "TaskGet": ("taskId", "task_id"),
    "TaskOutput": ("task_id", "taskId"),
    "TaskStop": ("task_id", "taskId"),
}


def one_line(text: str, limit: int) -> str:
    """Collapse whitespace and control characters; cut to `limit` characters with '…'."""
    if len(text) > limit * 4:  # do not scan megabytes of a Write's content
        text = text[: limit * 4]
    if not text.isprintable():
        text = _CONTROL_RE.sub(" ", text)
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text


def _relative(text: str, cwd: str | None) -> str:
    """Show paths inside the run's cwd relative to it."""
    if not cwd or cwd == "/":
        return text
    root = cwd.rstrip("/")
    if text == root:
        return "."
    return text.replace(root + "/", "")


def _str(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def _todo_detail(todos: Any) -> str | None:
    if not isinstance(todos, list):
        return None
    items = [t for t in todos if isinstance(t, dict)]
    done = sum(1 for t in items if t.get("status") == "completed")
    detail = f"{done}/{len(items)} done"
    current = next((t for t in items if t.get("status") == "in_progress"), None)
    if current is not None:
        name = _str(current.get("activeForm")) or _str(current.get("content"))
        if name:
            detail += f" · {name}"
    return detail


def _detail(name: str, data: dict[str, Any]) -> str | None:
    if name == "TodoWrite":
        return _todo_detail(data.get("todos"))
    if name in ("Grep", "Glob"):
        pattern = _str(data.get("pattern"))
        if pattern is None:
            return None
        where = _str(data.get("path"))
        return f"{pattern} in {where}" if where else pattern
    for key in _DETAIL_KEYS.get(name, ()):
        value = _str(data.get(key))
        if value is not None:
            return value
    # an unlisted tool (new built-in, MCP): its first short string argument
    for value in data.values():
        text = _str(value)
        if text is not None:
            return text
    return None


def summarize_tool(name: str, input: Any, cwd: str | None = None) -> str:
    """One short line for a tool call: `Write src/app.py`, `Bash pytest -q`.

    Paths inside `cwd` are shown relative to it. Never raises, whatever `input` holds.
    """
    label = one_line(name if isinstance(name, str) and name else "tool", 40)
    try:
        detail = _detail(label, input) if isinstance(input, dict) else None
    except Exception:  # a defensive net: a summary must never break the stream
        detail = None
    if not detail:
        return label
    detail = _relative(one_line(detail, SUMMARY_MAX * 2), cwd)
    return one_line(f"{label} {detail}", SUMMARY_MAX)


_EXIT_CODE_PREFIX = "Exit code "


def result_text(content: Any) -> str:
    """A tool result's whole content as text: a string as it is, a block list's texts one
    after the other (an image as `[image]`), anything else as JSON."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for block in content:
            if isinstance(block, dict):
                if block.get("type") == "text" and isinstance(block.get("text"), str):
                    parts.append(block["text"])
                elif block.get("type") == "image":
                    parts.append("[image]")
            elif isinstance(block, str):
                parts.append(block)
        return "\n".join(parts)
    if content is None:
        return ""
    if isinstance(content, (int, float)):
        return str(content)
    return _bounded_json(content, 1 << 24)


def bash_exit_code(text: str, is_error: bool) -> int | None:
    """A Bash step's exit status from its result: 0 when it succeeded, N from the
    "Exit code N" first line claude writes for a failure (2.1.197 and 2.1.332), None when
    it does not say (a step that was refused or interrupted)."""
    if not is_error:
        return 0
    if text.startswith(_EXIT_CODE_PREFIX):
        number = text[len(_EXIT_CODE_PREFIX):].split("\n", 1)[0].strip()
        if number.isdigit() and len(number) < 10:
            return int(number)
    return None


def tool_input_text(name: str, data: Any) -> str:
    """A tool call's whole input for people: a Bash command as it is, anything else as
    indented JSON."""
    if name == "Bash" and isinstance(data, dict) and isinstance(data.get("command"), str):
        rest = {k: v for k, v in data.items() if k != "command"}
        extra = ""
        if rest:
            extra = "\n" + json.dumps(rest, indent=2, ensure_ascii=False, default=str)
        return f"$ {data['command']}{extra}"
    try:
        return json.dumps(data, indent=2, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return one_line(repr(data), 4000)


def result_status(ev: ToolResult) -> str:
    """"ok", "error", or with a Bash step's exit status ("exit 0", "error, exit 3")."""
    if ev.exit_code is None:
        return "error" if ev.is_error else "ok"
    return f"error, exit {ev.exit_code}" if ev.is_error else f"exit {ev.exit_code}"


def _first_line(content: Any) -> str:
    """The first non-blank line of a tool result's content (a string or a block list)."""
    text = ""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        for block in content:
            if isinstance(block, dict):
                if block.get("type") == "text" and isinstance(block.get("text"), str):
                    text = block["text"]
                    break
                if block.get("type") == "image":
                    text = "[image]"
                    break
    elif isinstance(content, dict):
        text = _bounded_json(content, FIRST_LINE_MAX * 8)
    elif isinstance(content, (int, float)):  # bool included
        text = str(content)
    if len(text) > FIRST_LINE_MAX * 8:
        text = text[: FIRST_LINE_MAX * 8]
    start = 0
    while True:
        end = text.find("\n", start)
        line = text[start:] if end < 0 else text[start:end]
        if line.strip():
            return one_line(line, FIRST_LINE_MAX)
        if end < 0:
            return ""
        start = end + 1


# --------------------------------------------------------------------------- decoding helpers


def _as_int(value: Any) -> int | None:
    """An integral JSON number within `MAX_INT`, else None (bools, NaN, 1e300, strings)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -MAX_INT <= value <= MAX_INT else None
    if isinstance(value, float) and value.is_integer() and -MAX_INT <= value <= MAX_INT:
        return int(value)
    return None


def _as_float(value: Any) -> float | None:
    """A finite JSON number within `MAX_INT`, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        return float(value) if -MAX_INT <= value <= MAX_INT else None
    return value if math.isfinite(value) and -MAX_INT <= value <= MAX_INT else None


def _as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _count(value: int | None) -> int:
    """A token count as given, or 0 when it is absent, negative or absurd."""
    return value if value is not None and 0 <= value <= MAX_COUNT else 0


def _bounded_json(value: Any, limit: int) -> str:
    """JSON text of a decoded value, cut to `limit` characters ('' if it cannot be written)."""
    try:
        encoded: bytes = _wire().encode(value)
        return encoded[:limit * 4].decode("utf-8", "replace")[:limit]
    except Exception:  # too deep, or a lone surrogate: there is nothing worth a first line
        return ""


_SURROGATE_RE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE_RE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def has_surrogate_escape(text: str) -> bool:
    """True when JSON text may decode to a lone surrogate (a `\\udXXX` escape)."""
    return _SURROGATE_ESCAPE_RE.search(text) is not None


def scrub_surrogates(value: Any) -> Any:
    """`value` (a decoded JSON value) with every lone surrogate in its strings and keys
    replaced by U+FFFD: `json.loads` keeps `"\\ud800"` as a str that no UTF-8 file,
    database or terminal takes. Containers are fixed in place; iterative, so any depth."""
    if isinstance(value, str):
        return _SURROGATE_RE.sub("\ufffd", value)
    sub = _SURROGATE_RE.sub
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            items = list(node.items())
            node.clear()
            for key, item in items:
                if isinstance(key, str):
                    key = sub("\ufffd", key)
                if isinstance(item, str):
                    item = sub("\ufffd", item)
                elif isinstance(item, (dict, list)):
                    stack.append(item)
                node[key] = item
        elif isinstance(node, list):
            for i, item in enumerate(node):
                if isinstance(item, str):
                    node[i] = sub("\ufffd", item)
                elif isinstance(item, (dict, list)):
                    stack.append(item)
    return value


_JSON_STRING_RE = re.compile(rb'"(?:[^"\\]++|\\.)*+"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_STEPS = bytes.maketrans(b"[]{}", b"\x02\x00\x02\x00")  # opener 2, closer 0
_OVER_LIMIT = functools.partial(operator.lt, MAX_NESTING)  # depth -> MAX_NESTING < depth


def too_deep(line: bytes) -> bool:
    """True when arrays and objects in a JSON text nest deeper than `MAX_NESTING` (brackets
    inside strings do not count). Cheap unless the line has that many brackets at all."""
    if line.count(b"[") + line.count(b"{") <= MAX_NESTING:
        return False
    # strings out (without a backslash, they are the odd pieces between quotes)
    bare = _JSON_STRING_RE.sub(b"", line) if b"\\" in line else b"".join(line.split(b'"')[::2])
    steps = bare.translate(_BRACKET_STEPS, _NOT_BRACKETS)
    # after k brackets, (2 * openers so far) - k is the depth; stop at the first one over
    # the limit (C-level iteration throughout)
    depths = map(operator.sub, itertools.accumulate(steps), itertools.count(1))
    return next(filter(_OVER_LIMIT, depths), None) is not None


def _raw_head(line: bytes) -> str:
    return line[:RAW_KEEP_BYTES].decode("utf-8", "replace")


def _result_event(data: dict[str, Any], line_no: int) -> Result:
    usage = data.get("usage")
    denials = data.get("permission_denials")
    return Result(
        line_no=line_no,
        parent_tool_use_id=_as_str(data.get("parent_tool_use_id")),
        subtype=_as_str(data.get("subtype")),
        is_error=data.get("is_error") is True,
        api_error_status=_as_int(data.get("api_error_status")),
        result=_as_str(data.get("result")),
        num_turns=_as_int(data.get("num_turns")),
        session_id=_as_str(data.get("session_id")),
        usage=usage if isinstance(usage, dict) else {},
        stop_reason=_as_str(data.get("stop_reason")),
        terminal_reason=_as_str(data.get("terminal_reason")),
        permission_denials=denials if isinstance(denials, list) else [],
        data=data,
    )


def _partial_text(event: Any) -> tuple[str, str | None]:
    if not isinstance(event, dict):
        return "", None
    etype = event.get("type")
    text = None
    delta = event.get("delta")
    if isinstance(delta, dict):
        text = _as_str(delta.get("text")) or _as_str(delta.get("thinking"))
    return (etype if isinstance(etype, str) else ""), text


# --------------------------------------------------------------------------- decoder


_WIRE: Any = None  # core/wire.py once a line was decoded (msgspec loads with it)


def _wire() -> ModuleType:
    """The wire shapes' module, loaded at the first use (see core/wire.py for why)."""
    global _WIRE
    if _WIRE is None:
        from fleet_tui.core import wire

        _WIRE = wire
    return _WIRE  # type: ignore[no-any-return]


class StreamDecoder:
    """Incremental stream-json decoder: `feed(bytes)` any chunks, then `finish()`.

    The same bytes give the same events however they are split into chunks. Tool results
    carry the name of the tool call they answer. `cwd` (else the init line's cwd) makes
    tool summaries show paths relative to the run's directory.
    """

    __slots__ = ("_line_no", "_over_head", "_over_size", "_pending", "_pending_len",
                 "_tool_names", "cwd")

    def __init__(self, cwd: str | None = None) -> None:
        self.cwd = cwd
        self._line_no = 0
        self._pending: list[bytes] = []
        self._pending_len = 0
        self._over_head: bytes = b""
        self._over_size = -1  # >= 0 while discarding the rest of an over-cap line
        self._tool_names: dict[str, str] = {}

    @property
    def line_no(self) -> int:
        """Number of complete lines seen so far."""
        return self._line_no

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an unfinished line held in memory (never more than the line cap)."""
        return self._pending_len

    def feed(self, chunk: bytes) -> list[Event]:
        """Decode every line completed by `chunk`; hold an unfinished last line."""
        out: list[Event] = []
        if not chunk:
            return out
        chunk = bytes(chunk)
        nl = chunk.find(b"\n")
        if nl < 0:
            self._hold(chunk)
            return out
        start = 0
        if self._pending_len or self._over_size >= 0:
            self._hold(chunk[:nl])
            self._line_no += 1
            # _decode is called from here as for every other line: the same stack depth,
            # so a line near msgspec's nesting limit decodes the same whatever the chunking
            held = self._take_pending(out)
            if held:
                self._decode(held, out)
            start = nl + 1
        lines = chunk[start:].split(b"\n") if start else chunk.split(b"\n")
        tail = lines.pop()
        decode = self._decode
        for line in lines:
            self._line_no += 1
            if line:
                decode(line, out)
        if tail:
            self._hold(tail)
        return out

    def finish(self) -> list[Event]:
        """Decode a last line that had no newline (a run that died mid-line)."""
        out: list[Event] = []
        if self._pending_len or self._over_size >= 0:
            self._line_no += 1
            held = self._take_pending(out)
            if held:
                self._decode(held, out)
        return out

    # ---- buffering

    def _hold(self, piece: bytes) -> None:
        if self._over_size >= 0:
            self._over_size += len(piece)
            return
        self._pending.append(piece)
        self._pending_len += len(piece)
        if self._pending_len > MAX_LINE_BYTES:
            joined = b"".join(self._pending)
            self._over_head = joined[:RAW_KEEP_BYTES]
            self._over_size = len(joined)
            self._pending = []
            self._pending_len = 0

    def _take_pending(self, out: list[Event]) -> bytes:
        """The held line, now complete (b"" when it was over the cap: reported to `out`)."""
        if self._over_size >= 0:
            out.append(self._too_long(self._over_head, self._over_size))
            self._over_head = b""
            self._over_size = -1
            return b""
        line = b"".join(self._pending)
        self._pending = []
        self._pending_len = 0
        return line

    def _too_long(self, head: bytes, size: int) -> Malformed:
        return Malformed(line_no=self._line_no, raw=_raw_head(head),
                         error=f"line is {size} bytes, over the {MAX_LINE_BYTES} byte limit")

    # ---- one line

    def _decode(self, line: bytes, out: list[Event]) -> None:
        if len(line) > MAX_LINE_BYTES:
            out.append(self._too_long(line, len(line)))
            return
        try:
            obj: Any = (_WIRE or _wire()).DECODER.decode(line)
        except Exception:  # DecodeError/ValidationError; RecursionError for deep nesting
            self._decode_slow(line, out)
            return
        try:
            w = _WIRE
            cls = type(obj)  # the two commonest kinds first, without a further call
            if cls is w.Assistant:
                self._assistant(obj, self._line_no, out)
            elif cls is w.User:
                self._user(obj, self._line_no, out)
            else:
                self._emit(obj, line, None, out)
        except Exception as exc:  # a defensive net: never let one odd line stop a stream
            out.append(Malformed(line_no=self._line_no, raw=_raw_head(line),
                                 error=f"could not interpret the line: {exc!r}"))

    def _decode_slow(self, line: bytes, out: list[Event]) -> None:
        """The line did not fit the typed shapes: parse it generically."""
        if not line.strip():
            return
        if too_deep(line):
            out.append(Malformed(line_no=self._line_no, raw=_raw_head(line),
                                 error=f"JSON nested deeper than the limit of {MAX_NESTING} "
                                       "levels"))
            return
        try:
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                text = line.decode("utf-8", "replace")
            data = json.loads(text)
        except Exception as exc:  # ValueError (incl. a huge int), RecursionError
            out.append(Malformed(line_no=self._line_no, raw=_raw_head(line),
                                 error=f"not JSON: {one_line(str(exc), SUMMARY_MAX)}"))
            return
        if has_surrogate_escape(text):
            data = scrub_surrogates(data)
        try:
            obj = _wire().convert(data)
        except Exception:  # ValidationError: valid JSON of another shape
            kind = data.get("type") if isinstance(data, dict) else None
            out.append(Unknown(line_no=self._line_no, type=kind if isinstance(kind, str) else "",
                               data=data))
            return
        try:
            self._emit(obj, line, data, out)
        except Exception as exc:  # a defensive net, as in _decode
            out.append(Malformed(line_no=self._line_no, raw=_raw_head(line),
                                 error=f"could not interpret the line: {exc!r}"))

    def _emit(self, obj: Any, line: bytes, data: Any, out: list[Event]) -> None:
        line_no = self._line_no
        w = _wire()
        cls = type(obj)
        if cls is w.Assistant:
            self._assistant(obj, line_no, out)
        elif cls is w.User:
            self._user(obj, line_no, out)
        elif cls is w.System:
            self._system(obj, line, data, line_no, out)
        elif cls is w.Result:
            if data is None:
                data = w.decode_any(line)  # raises only on a line nested too deep: Malformed
            out.append(_result_event(data, line_no))
        elif cls is w.StreamEvent:
            etype, text = _partial_text(obj.event)
            out.append(Partial(line_no=line_no, parent_tool_use_id=obj.parent_tool_use_id,
                               event_type=etype, text=text, data=obj.event))
        elif cls is w.RateLimitEvent:
            info = obj.rate_limit_info
            info_d = info if isinstance(info, dict) else {}
            out.append(RateLimit(
                line_no=line_no, parent_tool_use_id=obj.parent_tool_use_id,
                status=_as_str(info_d.get("status")),
                resets_at=info_d.get("resetsAt", info_d.get("resets_at")),
                rate_limit_type=_as_str(info_d.get("rateLimitType",
                                                   info_d.get("rate_limit_type"))),
                data=info))

    def _assistant(self, obj: wire.Assistant, line_no: int, out: list[Event]) -> None:
        msg = obj.message
        parent = obj.parent_tool_use_id
        usage = msg.usage
        in_tok = _count(usage.input_tokens) if usage is not None else 0
        out_tok = _count(usage.output_tokens) if usage is not None else 0
        synthetic = msg.model == SYNTHETIC_MODEL
        error = obj.error if isinstance(obj.error, str) else None
        content = msg.content
        if isinstance(content, str):
            out.append(Text(line_no=line_no, parent_tool_use_id=parent, message_id=msg.id,
                            synthetic=synthetic, error=error, input_tokens=in_tok,
                            output_tokens=out_tok, text=content))
            return
        if not content:
            return
        for block in content:
            btype = block.type
            if btype == "text":
                out.append(Text(line_no=line_no, parent_tool_use_id=parent, message_id=msg.id,
                                synthetic=synthetic, error=error, input_tokens=in_tok,
                                output_tokens=out_tok, text=block.text or ""))
            elif btype in ("tool_use", "server_tool_use", "mcp_tool_use"):
                tool_id = block.id or ""
                name = block.name or ""
                if tool_id:
                    self._tool_names[tool_id] = name
                out.append(ToolUse(line_no=line_no, parent_tool_use_id=parent,
                                   message_id=msg.id, synthetic=synthetic, error=error,
                                   input_tokens=in_tok, output_tokens=out_tok, id=tool_id,
                                   name=name, input=block.input,
                                   summary=summarize_tool(name, block.input, self.cwd)))
            elif btype in ("thinking", "redacted_thinking"):
                out.append(Thinking(line_no=line_no, parent_tool_use_id=parent,
                                    message_id=msg.id, synthetic=synthetic, error=error,
                                    input_tokens=in_tok, output_tokens=out_tok,
                                    text=block.thinking or ""))
            else:
                out.append(Unknown(line_no=line_no, parent_tool_use_id=parent,
                                   type=f"assistant/{btype}",
                                   data=_wire().as_dict(block)))

    def _user(self, obj: wire.User, line_no: int, out: list[Event]) -> None:
        content = obj.message.content
        cwd = self.cwd
        if obj.isReplay is True and obj.parent_tool_use_id is None:
            text = content if isinstance(content, str) else "\n".join(
                b.text for b in content or () if b.type == "text" and b.text)
            out.append(UserMessage(line_no=line_no, text=text))
            return
        if not isinstance(content, list):
            return  # a prompt (e.g. a sub-agent's): nothing new to show
        for block in content:
            if block.type != "tool_result":
                continue
            tool_id = block.tool_use_id or ""
            name = self._tool_names.pop(tool_id, None)
            is_error = block.is_error is True
            text = result_text(block.content)
            out.append(ToolResult(line_no=line_no, parent_tool_use_id=obj.parent_tool_use_id,
                                  tool_use_id=tool_id, tool_name=name, is_error=is_error,
                                  first_line=_relative(_first_line(block.content), cwd),
                                  content=text,
                                  exit_code=bash_exit_code(text, is_error)
                                  if name == "Bash" else None))

    def _system(self, obj: wire.System, line: bytes, data: Any, line_no: int,
                out: list[Event]) -> None:
        subtype = obj.subtype
        parent = _as_str(obj.parent_tool_use_id)
        if subtype == "init":
            cwd = _as_str(obj.cwd)
            if self.cwd is None and cwd:
                self.cwd = cwd
            tools = obj.tools if isinstance(obj.tools, list) else []
            out.append(Init(line_no=line_no, parent_tool_use_id=parent,
                            session_id=_as_str(obj.session_id), cwd=cwd,
                            model=_as_str(obj.model),
                            permission_mode=_as_str(obj.permissionMode),
                            claude_code_version=_as_str(obj.claude_code_version),
                            tools=[t for t in tools if isinstance(t, str)]))
        elif subtype == "api_retry":
            out.append(ApiRetry(line_no=line_no, parent_tool_use_id=parent,
                                attempt=_as_int(obj.attempt),
                                max_retries=_as_int(obj.max_retries),
                                retry_delay_ms=_as_float(obj.retry_delay_ms),
                                error_status=_as_int(obj.error_status),
                                error=obj.error if isinstance(obj.error, str) else None))
        elif subtype == "status":
            out.append(Status(line_no=line_no, parent_tool_use_id=parent,
                              status=_as_str(obj.status)))
        elif subtype == "fleet_setup":
            copied = obj.copied if isinstance(obj.copied, list) else []
            skipped = obj.skipped if isinstance(obj.skipped, list) else []
            out.append(Setup(line_no=line_no, phase=_as_str(obj.phase) or "",
                             command=_as_str(obj.command), exit_code=_as_int(obj.exit_code),
                             output=_as_str(obj.output) or "",
                             copied=[c for c in copied if isinstance(c, str)],
                             skipped=[c for c in skipped if isinstance(c, str)],
                             seconds=_as_float(obj.seconds)))
        elif subtype == "fleet_blocked":
            out.append(Blocked(line_no=line_no, action=_as_str(obj.action) or "",
                               target=_as_str(obj.target) or "",
                               detail=_as_str(obj.detail) or ""))
        else:
            if data is None:
                try:
                    data = _wire().decode_any(line)
                except Exception:  # RecursionError: a key the typed shape skipped nests deep
                    data = None
            out.append(Unknown(line_no=line_no, parent_tool_use_id=parent,
                               type="system", data=data))


def decode_all(data: bytes) -> list[Event]:
    """Every event of a complete stream-json text (a finished run's events file)."""
    decoder = StreamDecoder()
    events = decoder.feed(data)
    events.extend(decoder.finish())
    return events


# --------------------------------------------------------------------------- summary


@dataclass(slots=True)
class RunSummary:
    """What a person wants at a glance about one attempt, kept up to date event by event.

    Turns are the distinct API messages of the main agent (synthetic failure messages do
    not count); tokens add up every message's latest usage, and the result's usage, when it
    arrives, is taken as the final word. `last_activity` is set by the caller (the time it
    read the event), since events carry no trustworthy clock.
    """

    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    api_retries: int = 0
    last_tool: str | None = None
    last_text: str | None = None
    session_id: str | None = None
    model: str | None = None
    last_activity: float | None = None
    finished: bool = False
    _messages: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)
    _turn_ids: set[str] = field(default_factory=set, repr=False)

    def update(self, event: Event, at: float | None = None) -> None:
        """Fold one event in; `at` (a timestamp) becomes `last_activity` when given."""
        if at is not None:
            self.last_activity = at
        if isinstance(event, AssistantEvent):
            self._count_message(event)
            if isinstance(event, ToolUse):
                self.tool_calls += 1
                self.last_tool = event.summary
            elif isinstance(event, Text) and event.text and event.parent_tool_use_id is None:
                self.last_text = one_line(event.text, FIRST_LINE_MAX)
        elif isinstance(event, ToolResult):
            if event.is_error:
                self.tool_errors += 1
        elif isinstance(event, ApiRetry):
            self.api_retries += 1
        elif isinstance(event, Init):
            self.session_id = event.session_id or self.session_id
            self.model = event.model or self.model
        elif isinstance(event, Result):
            self.finished = True
            self.session_id = event.session_id or self.session_id
            usage = event.usage
            in_tok = _as_int(usage.get("input_tokens"))
            out_tok = _as_int(usage.get("output_tokens"))
            if in_tok is not None and in_tok >= self.input_tokens:
                self.input_tokens = in_tok
            if out_tok is not None and out_tok >= self.output_tokens:
                self.output_tokens = out_tok
            if event.num_turns is not None and event.num_turns > self.turns:
                self.turns = event.num_turns

    def _count_message(self, event: AssistantEvent) -> None:
        mid = event.message_id
        if not mid:
            return
        new = (event.input_tokens, event.output_tokens)
        old = self._messages.get(mid)
        if old != new:
            if old is not None:
                self.input_tokens -= old[0]
                self.output_tokens -= old[1]
            self.input_tokens += new[0]
            self.output_tokens += new[1]
            self._messages[mid] = new
        if (not event.synthetic and event.parent_tool_use_id is None
                and mid not in self._turn_ids):
            self._turn_ids.add(mid)
            self.turns += 1

    def to_json(self) -> dict[str, Any]:
        """The public fields as a JSON-ready dict (for the store and `--json` output)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if not f.name.startswith("_")}
