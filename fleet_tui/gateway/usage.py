"""Reading a request's usage from the answer as it passes (the bytes are never changed).

A streamed answer (SSE) states the input side in `message_start` (input, cache read,
cache write, the model) and the output in `message_delta` (cumulative: the last one
counts); a plain JSON answer (the CLI's retry after a cut stream) states all of it in its
`usage`. Every count is the largest stated (cumulative counts; z.ai states the input in
`message_delta` only). Lines are read whole as they complete; nothing is kept but the numbers."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["UsageReader"]

_FIELDS = {"input_tokens": "input_tokens", "output_tokens": "output_tokens",
           "cache_read_input_tokens": "cache_read_tokens",
           "cache_creation_input_tokens": "cache_write_tokens"}
_LINE_LIMIT = 1 << 20  # a line longer than this is no usage line: dropped, not buffered


class UsageReader:
    def __init__(self, *, streamed: bool, model: str = "") -> None:
        self.streamed = streamed
        self.model = model
        self.counts = dict.fromkeys(_FIELDS.values(), 0)
        self._partial = b""
        self._body: list[bytes] = []
        self._body_size = 0

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
