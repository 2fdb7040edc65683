"""Durations as people type them: `90`, `90s`, `15m`, `1h30m`, `1.5h` -> seconds.

One parser for every place a time limit is typed (`fleet-tui run --timeout`, the launch
form), so that they accept the same text. It is total: anything that is not a finite
duration of 0 or more is refused with a ValueError whose message says what is expected, in
words that complete "expected ..." (the form shows "Expected <message>.", the CLI
"--timeout: '<text>': expected <message>"). Nothing here imports more than `re`.
"""

from __future__ import annotations

import math
import re

__all__ = ["EXPECTED", "parse_duration"]

EXPECTED = "a number of seconds, or a duration such as 90s, 15m or 1h30m"
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0}
_PART = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([hms])", re.IGNORECASE)
_WHOLE = re.compile(r"(?:\s*(?:\d+(?:\.\d*)?|\.\d+)\s*[hms])+\s*", re.IGNORECASE)


def parse_duration(text: str, *, allow_zero: bool = True) -> float:
    """Seconds in `text`: a plain number of seconds (`90`, `2.5`) or numbers with units h,
    m and s, largest first, each at most once (`1h30m`, `90s`, `1.5h`). ValueError for
    anything else: empty text, a negative or non-finite number (`nan`, `inf`), units out of
    order or repeated, and 0 when `allow_zero` is false."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(EXPECTED)
    stripped = text.strip()
    try:
        seconds = float(stripped)
    except ValueError:
        seconds = _with_units(stripped)
    if not math.isfinite(seconds):
        raise ValueError(f"a finite duration ({EXPECTED})")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        least = "0 or more" if allow_zero else "more than 0"
        raise ValueError(f"{least} seconds, or a duration such as 90s, 15m or 1h30m")
    return seconds


def _with_units(text: str) -> float:
    if not _WHOLE.fullmatch(text):
        raise ValueError(EXPECTED)
    total = 0.0
    order = "hms"
    last = -1
    for number, unit in _PART.findall(text):
        at = order.index(unit.lower())
        if at <= last:
            raise ValueError(f"units largest first, each once ({EXPECTED})")
        last = at
        total += float(number) * _UNITS[unit.lower()]
    return total
