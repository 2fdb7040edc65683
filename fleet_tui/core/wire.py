"""The stream-json line shapes as msgspec decodes them (core/stream.py turns them into events).

Only the keys the events need: msgspec skips every other key without building it, which is
what makes a line's decode faster than `json.loads`. A module of its own, loaded by the
stream decoder at its first line: msgspec (with what its package loads: its inspection
module, typing_extensions, uuid, decimal) is ~6 % of a command's start, and most commands
(`ls` over finished tasks, `show`, `merge`) never decode a line.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Usage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None


class Block(msgspec.Struct):
    type: str = ""
    text: str | None = None
    thinking: str | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None
    content: Any = None
    is_error: bool | None = None


class Message(msgspec.Struct):
    id: str | None = None
    model: str | None = None
    content: list[Block] | str | None = None
    usage: Usage | None = None


class System(msgspec.Struct, tag="system", tag_field="type"):
    # Any, and checked when used: a system line is rare, and one odd value must not turn
    # an init or a retry into an Unknown
    subtype: Any = None
    parent_tool_use_id: Any = None
    session_id: Any = None
    cwd: Any = None
    model: Any = None
    permissionMode: Any = None  # the wire name
    claude_code_version: Any = None
    tools: Any = None
    attempt: Any = None
    max_retries: Any = None
    retry_delay_ms: Any = None
    error_status: Any = None
    error: Any = None
    status: Any = None
    # fleet_setup (fleet-tui's own setup step)
    phase: Any = None
    command: Any = None
    exit_code: Any = None
    output: Any = None
    copied: Any = None
    skipped: Any = None
    seconds: Any = None
    # fleet_blocked (what the cage refused)
    action: Any = None
    target: Any = None
    detail: Any = None


class Assistant(msgspec.Struct, tag="assistant", tag_field="type"):
    message: Message
    parent_tool_use_id: str | None = None
    error: Any = None


class User(msgspec.Struct, tag="user", tag_field="type"):
    message: Message
    parent_tool_use_id: str | None = None
    isReplay: Any = None  # the wire name: claude echoes a user message it took in


class Result(msgspec.Struct, tag="result", tag_field="type"):
    pass


class StreamEvent(msgspec.Struct, tag="stream_event", tag_field="type"):
    event: Any = None
    parent_tool_use_id: str | None = None


class RateLimitEvent(msgspec.Struct, tag="rate_limit_event", tag_field="type"):
    rate_limit_info: Any = None
    parent_tool_use_id: str | None = None


Line = System | Assistant | User | Result | StreamEvent | RateLimitEvent
DECODER = msgspec.json.Decoder(Line)
decode_any = msgspec.json.Decoder().decode  # untyped: the whole object as dicts and lists


def convert(data: Any) -> Any:
    """An already parsed line as its shape (msgspec.ValidationError: another shape)."""
    return msgspec.convert(data, Line)


def as_dict(block: Block) -> dict[str, Any]:
    return msgspec.structs.asdict(block)


def encode(value: Any) -> bytes:
    return msgspec.json.encode(value)
