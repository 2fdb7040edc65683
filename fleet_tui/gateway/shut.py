"""The gateway's own gate: shut on the first answer that says the window or the account is
closed, before and independently of the engine's park.

A provider that closes a usage window answers every request after it the same way (z.ai's
1308 in a 429, which says nothing against retrying), and each worker's CLI retries it
(3 to 10 times) before its task ends and the engine parks the endpoint; with several
workers in flight, many requests reach the closed window, and a window that reopens before
a CLI gives up is never parked at all. So the gateway reads each error answer as it passes
(the body of an error is small and read whole before it goes on): when the provider's
words name a closed window (a `Kind.WINDOW` code: z.ai's 1304, 1308, 1310, Anthropic's
usage limit) or a closed account (`Kind.ACCOUNT`: 1110-1113, 1121, 1211, 1309, 1311, 1313),
the endpoint is shut in the gateway: until the reset time the words name (read as the
engine reads it), else for `NO_RESET` seconds; an account for `ACCOUNT_SHUT`. Meanwhile the
gateway answers that endpoint's requests itself, 429 in the provider's own words and code,
with `x-should-retry: false`: the CLI gives up at once and its verdict reads as the
provider's refusal did (the engine parks or holds the endpoint from it, as before). At
most the requests already in flight when the first refusal came reach the closed window.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

from fleet_tui.core import providers

__all__ = ["ACCOUNT_SHUT", "NO_RESET", "Shut", "error_code", "read_refusal"]

NO_RESET = 60.0  # seconds shut for a closed window whose reset time cannot be read
ACCOUNT_SHUT = 300.0  # seconds shut for a closed account (the engine holds it meanwhile)
_SHUTS = (providers.Kind.WINDOW, providers.Kind.ACCOUNT)
_PLAIN = re.compile(r"[A-Za-z0-9_.-]{1,24}")


@dataclass(frozen=True)
class Shut:
    """An endpoint shut by the gateway: until when, the provider's words and code."""

    until: float
    message: str
    code: str | None
    reason: str  # "5-hour window, code 1308"
    status: int = 429

    def open(self, now: float) -> bool:
        return now >= self.until

    def to_status(self) -> dict[str, object]:
        return {"until": self.until, "reason": self.reason,
                "until_text": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.until))}


def _error_of(body: bytes) -> tuple[str, str | None]:
    """(the error's message, its business code) of an error body, as well as they read."""
    try:
        data = json.loads(body)
    except ValueError:
        return body[:2000].decode("utf-8", "replace"), None
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return body[:2000].decode("utf-8", "replace"), None
    message = error.get("message")
    raw = error.get("code")
    code = str(raw) if isinstance(raw, (str, int)) and not isinstance(raw, bool) else None
    return (message if isinstance(message, str) else ""), code


def error_code(status: int, body: bytes) -> str:
    """What the meter and the status call an error answer: its business code when the
    body names one (z.ai's "1308"), else its HTTP status ("429")."""
    _message, code = _error_of(body)
    # the provider's text: only a plain code is kept (it reaches a terminal and the store)
    return code if code and _PLAIN.fullmatch(code) else str(status)


def read_refusal(status: int, body: bytes, now: float) -> Shut | None:
    """The shut an error answer asks for (its window or account closed), else None."""
    if status < 400:
        return None
    message, code = _error_of(body)
    text = json.dumps({"error": {"code": code, "message": message}}) if code else message
    signal = providers.identify(text, status)
    if signal is None or signal.kind not in _SHUTS:
        return None
    if signal.kind is providers.Kind.ACCOUNT:
        until = now + ACCOUNT_SHUT
    else:
        reading = providers.read_reset(signal.reset, signal.window, now,
                                       zones=signal.code.zones)
        until = max(reading.at, now) if reading.at is not None else now + NO_RESET
    return Shut(until=until, message=message or signal.sentence, code=code,
                reason=signal.describe(), status=status)
