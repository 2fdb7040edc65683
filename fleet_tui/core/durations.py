"""Durations as people type them: `90`, `90s`, `15m`, `1h30m`, `1.5h` -> seconds.

One parser and one rule for every time typed or stored: `fleet-tui run --timeout`, the
launch form, a task's spec and config.toml's seconds settings (`timeout`, `stall_seconds`,
`kill_grace`, ...) accept the same text and the same numbers. It is total: anything that is
not a finite duration of 0 or more (more than 0 where 0 means nothing), and at most
MAX_SECONDS (7 days: a longer limit is a typo, `1000h` for `100h`), is refused with a
ValueError whose message says what is expected, in words that complete "expected ..." (the
form shows "Expected <message>.", the CLI "--timeout: '<text>': expected <message>").
Nothing here imports more than `math` at the top (config_core reads settings with it for
every `fleet-worker` launch); `re` is imported for text with units only.

A time limit of 0 means no limit (a task's `timeout`, config's `timeout`); no text means
"the setting" where there is one (the form's empty box, no `--timeout`).
"""

from __future__ import annotations

import math

__all__ = ["EXPECTED", "MAX_SECONDS", "check_seconds", "parse_duration", "parse_seconds"]

EXPECTED = "a number of seconds, or a duration such as 90s, 15m or 1h30m"
MAX_SECONDS = 7 * 24 * 3600.0  # 7 days
_MAX_WORDS = f"at most 7 days ({MAX_SECONDS:.0f} s or 168h)"
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0}
_PART = r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([hms])"
_WHOLE = r"(?:\s*(?:\d+(?:\.\d*)?|\.\d+)\s*[hms])+\s*"


def parse_duration(text: str, *, allow_zero: bool = True) -> float:
    """Seconds in `text`: a plain number of seconds (`90`, `2.5`) or numbers with units h,
    m and s, largest first, each at most once (`1h30m`, `90s`, `1.5h`). ValueError for
    anything else: empty text, a negative or non-finite number (`nan`, `inf`), units out of
    order or repeated, more than MAX_SECONDS, and 0 when `allow_zero` is false."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(EXPECTED)
    stripped = text.strip()
    try:
        seconds = float(stripped)
    except ValueError:
        seconds = _with_units(stripped)
    return check_seconds(seconds, allow_zero=allow_zero)


def check_seconds(seconds: float, *, allow_zero: bool = True) -> float:
    """`seconds` as a float if it is a duration this module accepts (finite, 0 or more, or
    more than 0 without `allow_zero`, at most MAX_SECONDS), else ValueError saying what is
    expected. For numbers that arrive as numbers (a TOML number, a TaskSpec's timeout)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError(EXPECTED)
    value = float(seconds)
    if not math.isfinite(value):
        raise ValueError(f"a finite duration ({EXPECTED})")
    if value < 0 or (value == 0 and not allow_zero):
        least = "0 or more" if allow_zero else "more than 0"
        raise ValueError(f"{least} seconds, or a duration such as 90s, 15m or 1h30m")
    if value > MAX_SECONDS:
        raise ValueError(f"{_MAX_WORDS}, not {value:g} s")
    return value


def parse_seconds(raw: object, *, allow_zero: bool = True) -> float:
    """A duration given as a number of seconds or as text (`"15m"`): what config.toml and
    the environment hold. ValueError as parse_duration and check_seconds."""
    if isinstance(raw, str):
        return parse_duration(raw, allow_zero=allow_zero)
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ValueError(EXPECTED)
    return check_seconds(raw, allow_zero=allow_zero)


def _with_units(text: str) -> float:
    import re

    if not re.fullmatch(_WHOLE, text, re.IGNORECASE):
        raise ValueError(EXPECTED)
    total = 0.0
    order = "hms"
    last = -1
    for number, unit in re.findall(_PART, text, re.IGNORECASE):
        at = order.index(unit.lower())
        if at <= last:
            raise ValueError(f"units largest first, each once ({EXPECTED})")
        last = at
        total += float(number) * _UNITS[unit.lower()]
    return total
