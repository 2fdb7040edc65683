"""Reading a request's usage from the answer as it passes (the bytes are never changed).

A streamed answer (SSE) states the input side in `message_start` (input, cache read,
cache write, the model) and the output in `message_delta` (cumulative: the last one
counts); a plain JSON answer (the CLI's retry after a cut stream) states all of it in its
`usage`. Every count is the largest stated (cumulative counts; z.ai states the input in
`message_delta` only). Lines are read whole as they complete; nothing is kept but the numbers."""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any

__all__ = ["Pending", "UsageReader", "request_model"]

_FIELDS = {"input_tokens": "input_tokens", "output_tokens": "output_tokens",
           "cache_read_input_tokens": "cache_read_tokens",
           "cache_creation_input_tokens": "cache_write_tokens"}
_MODEL = re.compile(rb'"model"\s*:\s*"([^"\\]{1,200})"')
_LINE_LIMIT = 1 << 20  # a line longer than this is no usage line: dropped, not buffered


def request_model(body: bytes) -> str:
    """The model a request asks for (the CLI writes it first; a body that is no JSON of
    ours: read whole, once), "" when it names none: an error answer states no model."""
    found = _MODEL.search(body[:4096])
    if found:
        return found.group(1).decode("utf-8", "replace")
    if len(body) > _LINE_LIMIT:
        return ""
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else ""


class UsageReader:
    def __init__(self, *, streamed: bool, model: str = "") -> None:
        self.streamed = streamed
        self.model = model
        self.counts = dict.fromkeys(_FIELDS.values(), 0)
        self._partial = b""
        self._body: list[bytes] = []
        self._body_size = 0
        self.started = False  # a stream's message_start was read (its input is known)

    def feed(self, chunk: bytes) -> None:
        if not self.streamed:
            if self._body_size < _LINE_LIMIT:
                self._body.append(chunk)
                self._body_size += len(chunk)
            return
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > _LINE_LIMIT:
            self._partial = b""
        for line in lines:
            if line.startswith(b"data:"):
                self._event(line[5:])

    def finish(self) -> None:
        if self.streamed:
            if self._partial.startswith(b"data:"):
                self._event(self._partial[5:])
            self._partial = b""
            return
        try:
            body = json.loads(b"".join(self._body))
        except ValueError:
            return
        if isinstance(body, dict):
            self._take(body.get("usage"))
            if isinstance(body.get("model"), str):
                self.model = body["model"]

    def _event(self, raw: bytes) -> None:
        if b"usage" not in raw and b"message_start" not in raw:
            return
        try:
            event = json.loads(raw)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if event.get("type") == "message_start" and isinstance(event.get("message"), dict):
            message = event["message"]
            if isinstance(message.get("model"), str):
                self.model = message["model"]
            self._take(message.get("usage"))
            self.started = True
        elif event.get("type") == "message_delta":
            self._take(event.get("usage"))

    def _take(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        for wire, ours in _FIELDS.items():
            value = usage.get(wire)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                # cumulative, and some providers state the input only at the end
                self.counts[ours] = max(self.counts[ours], value)


class Pending:
    """Answers in flight, on disk: a file per answer from its first usage on (a stream's
    `message_start`: the input and the output so far), removed once its meter row is
    stored. A gateway SIGKILLed in the middle of answers leaves their files; the next one
    stores them in the meter at its start (`take`), so that what the provider served up to
    the cut is metered: at least the request's input. Small writes, no fsync (a machine
    that crashes loses the rows of the answers it was in the middle of)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._n = 0

    def name(self) -> str:
        self._n += 1
        return f"{os.getpid()}-{self._n}.json"

    def write(self, name: str, record: dict[str, Any]) -> None:
        try:
            self.folder.mkdir(mode=0o700, exist_ok=True)
            path = self.folder / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, json.dumps(record).encode())
            finally:
                os.close(fd)
        except OSError:
            pass  # the row is stored at the answer's end anyway

    def remove(self, name: str) -> None:
        with contextlib.suppress(OSError):
            (self.folder / name).unlink()

    def take(self) -> list[dict[str, Any]]:
        """The records a gateway before this one left (each file removed as read)."""
        out: list[dict[str, Any]] = []
        try:
            paths = sorted(self.folder.glob("*.json"))
        except OSError:
            return out
        for path in paths:
            try:
                record = json.loads(path.read_bytes())
            except (OSError, ValueError):
                record = None
            with contextlib.suppress(OSError):
                path.unlink()
            if isinstance(record, dict):
                out.append(record)
        return out
