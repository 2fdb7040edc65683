"""How endpoints say "no": the one table of provider error codes, and reading them.

A provider answers a refused request with an HTTP status and, for z.ai (and BigModel,
the same codes), a business code in the body: `{"error": {"code": "1308", "message":
"..."}}`. The Claude Code CLI does not print the code (2.1.197 and 2.1.332 both print
`API Error: Request rejected (429) · <message>`), so a code is known by its number when
the text carries one (an older CLI printed the raw body; some proxies write `[1310][...]`)
and otherwise by its message. Every code a fleet must act on is in `CODES`, with what it
means (`Kind`), the words that name it, what the user should do, and for a usage window
its length; `identify` turns a result text into a `Signal`. Another provider is one more
block of rows.

A window error names its reset time without a zone (`Your limit will reset at 2026-12-01
00:14:10`). `read_reset` tries the readings that make sense (the provider's own zone, the
local one, UTC) and keeps one that falls inside the window the code names: the provider's
zone when it does, else the latest. A time that has passed, lies outside the window, or is
not a time gives no reset, and says why.

Pure and cheap: standard library only, no clock of its own (callers pass `now`), so the
policy and the CLI can use it and tests are tables; its patterns are compiled at their first
use (core/lazyre.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from enum import StrEnum

from fleet_tui.core.lazyre import Lazy

__all__ = ["CODES", "REJECTED_KEY", "USAGE_LIMIT", "Code", "Kind", "Reading", "Signal",
           "clock_text", "identify", "rate_limit_signal", "read_reset", "retry_after",
           "retry_after_text"]

MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0
WEEK = 7 * DAY
MONTH = 31 * DAY

# The first words of the engine's own verdict message for a key the endpoint refused
# (outcome writes it, policy recognises it): the endpoint answered, so it is held.
REJECTED_KEY = "the endpoint rejected the key"

# The first words of the engine's verdict message for a rejected `rate_limit_event`
USAGE_LIMIT = "the endpoint's usage limit was reached"

# How far a reset time may lie in the past and still count (the clocks of two machines)
SKEW = 60.0
# How far past the window's length a reset may lie (the window started a little before
# the request that failed, and clocks differ)
SLACK = 600.0


class Kind(StrEnum):
    """What an error asks of a fleet."""

    WINDOW = "window"  # a usage window closed: park the endpoint until it resets
    RATE = "rate"  # too many requests: back off (the quota cooldown)
    CONCURRENCY = "concurrency"  # too many at once: fewer workers on the endpoint
    ACCOUNT = "account"  # the account, plan or model cannot be used: stop the endpoint
    AUTH = "auth"  # the key was refused: stop the endpoint
    MODEL_OVERLOAD = "model_overload"  # this model is busy: use another model
    OVERLOAD = "overload"  # the endpoint is busy or failing: back off, retry
    TASK = "task"  # this request cannot be served (its prompt): fail the task only


@dataclass(frozen=True, slots=True)
class Code:
    """One row of the table."""

    provider: str
    code: str
    kind: Kind
    what: str  # a few words: "5-hour window", "account in arrears"
    advice: str = ""  # what the user should do (stops), or what the fleet does
    window: float | None = None  # a window code: its length in seconds
    patterns: tuple[Lazy, ...] = ()  # the message's words (en, zh), compiled at first use
    zones: tuple[float, ...] = ()  # the provider's own UTC offsets, in hours

    @property
    def name(self) -> str:
        """"code 1308" for a business code, "HTTP 429" for a status, else what it is."""
        if self.code.isdigit():
            return f"code {self.code}" if len(self.code) == 4 else f"HTTP {self.code}"
        return self.what


def _rx(*patterns: str) -> tuple[Lazy, ...]:
    return tuple(Lazy(p, re.I) for p in patterns)


Z = "z.ai"
_ZAI_ZONES = (8.0,)  # the platform is in China: its times are Beijing time (UTC+8)
_KEY = "check the API key for this endpoint (`fleet-tui key set`), then retry the task"
_ACCOUNT = "the account cannot be used as it is: check it on the provider's site"

CODES: tuple[Code, ...] = (
    # --- z.ai / BigModel (docs.z.ai "API error codes"; the same numbers on bigmodel.cn)
    Code(Z, "1000", Kind.AUTH, "authentication failed", _KEY,
         patterns=_rx(r"^Authentication Failed\b", r"身份验证失败")),
    Code(Z, "1001", Kind.AUTH, "no key sent", _KEY,
         patterns=_rx(r"Authentication parameter not received", r"未收到 ?Authentication")),
    Code(Z, "1002", Kind.AUTH, "invalid key", _KEY,
         patterns=_rx(r"(Authentication|Authorization) Token is invalid",
                      r"Invalid Authentication Token", r"Token 非法")),
    Code(Z, "1003", Kind.AUTH, "key expired", _KEY,
         patterns=_rx(r"Authentication Token expired", r"Token 已过期")),
    Code(Z, "1004", Kind.AUTH, "key refused", _KEY,
         patterns=_rx(r"Authentication failed with the provided", r"Token 的验证失败")),
    Code(Z, "1110", Kind.ACCOUNT, "account inactive", _ACCOUNT,
         patterns=_rx(r"account is currently inactive", r"账户当前处于非活动状态")),
    Code(Z, "1111", Kind.ACCOUNT, "account does not exist", _ACCOUNT,
         patterns=_rx(r"account does not exist", r"账户不存在")),
    Code(Z, "1112", Kind.ACCOUNT, "account locked",
         "the account is locked: ask the provider's support to unlock it",
         patterns=_rx(r"account has been locked", r"账户已被锁定")),
    Code(Z, "1113", Kind.ACCOUNT, "account in arrears",
         "recharge the account; a coding-plan key sent to the pay-as-you-go endpoint gets "
         "this too, so check base_url (the coding plan's is https://api.z.ai/api/anthropic)",
         patterns=_rx(r"\bin arrears\b", r"balance is insufficient", r"Insufficient balance",
                      r"no resource package", r"已欠费", r"余额不足")),
    Code(Z, "1121", Kind.ACCOUNT, "account locked for irregular activity",
         "the account is locked: ask the provider's support to unlock it",
         patterns=_rx(r"irregular activit", r"违规行为")),
    Code(Z, "1211", Kind.ACCOUNT, "unknown model",
         "the endpoint does not know this model: check model and small_model",
         patterns=_rx(r"Model does not exist", r"模型不存在")),
    Code(Z, "1261", Kind.TASK, "prompt too long",
         "the prompt and its context are too long for the model: shorten or split the task",
         patterns=_rx(r"Prompt 超长")),
    Code(Z, "1301", Kind.TASK, "content refused",
         "the provider refused the content of this task: rephrase the prompt",
         patterns=_rx(r"unsafe or sensitive content", r"不安全或敏感内容")),
    Code(Z, "1302", Kind.CONCURRENCY, "too many requests at once",
         "fewer workers at once on this endpoint",
         patterns=_rx(r"High concurrency", r"reduce concurrency", r"并发数过高",
                      r"^Rate limit reached for requests?\b",
                      r"^API request rate limit reached")),
    Code(Z, "1303", Kind.RATE, "requests too frequent", "back off, then retry",
         patterns=_rx(r"High frequency usage", r"reduce frequency", r"频率过高")),
    Code(Z, "1304", Kind.WINDOW, "daily call limit", "wait for the next day",
         window=DAY, patterns=_rx(r"Daily call limit", r"今日调用次数限额")),
    Code(Z, "1305", Kind.RATE, "traffic limit", "back off, then retry",
         patterns=_rx(r"traffic limit", r"触发流量限制")),
    Code(Z, "1308", Kind.WINDOW, "usage window", "wait for the window to reset",
         window=5 * HOUR, zones=_ZAI_ZONES,
         patterns=_rx(r"Usage limit reached for", r"的使用上限")),
    Code(Z, "1309", Kind.ACCOUNT, "coding plan expired",
         "renew the GLM Coding Plan (https://z.ai/subscribe)",
         patterns=_rx(r"Coding Plan\b.{0,30}\bexpired", r"套餐已到期")),
    Code(Z, "1310", Kind.WINDOW, "weekly/monthly limit", "wait for the limit to reset",
         window=MONTH, zones=_ZAI_ZONES,
         patterns=_rx(r"Weekly/Monthly Limit", r"每周/每月使用上限")),
    Code(Z, "1311", Kind.ACCOUNT, "model not in the plan",
         "choose a model the plan includes (model, small_model)",
         patterns=_rx(r"(subscription|plan)\b.{0,40}\b(does not|doesn't|not yet)\b.{0,20}"
                      r"\b(include|access|support)", r"暂未开放")),
    Code(Z, "1312", Kind.MODEL_OVERLOAD, "model overloaded",
         "falls back to the small model",
         patterns=_rx(r"model is (currently )?(experiencing high traffic|overloaded)",
                      r"high traffic.{0,40}(another|other) model", r"访问量过大")),
    Code(Z, "1313", Kind.ACCOUNT, "fair-use restriction",
         "the provider restricted the account under its fair-use policy: ask it to lift "
         "the restriction (z.ai: personal center, coding plan overview)",
         patterns=_rx(r"fair.?use", r"公平使用")),
    Code(Z, "1234", Kind.OVERLOAD, "network error at the provider", "retry later",
         patterns=_rx(r"^Network error, error id", r"网络错误")),
    # --- Anthropic's API and any endpoint that answers like it (by HTTP status)
    Code("anthropic", "401", Kind.AUTH, "key refused", _KEY,
         patterns=_rx(re.escape(REJECTED_KEY), r"authentication_error", r"Invalid API key",
                      r"Failed to authenticate", r"Not logged in")),
    Code("anthropic", "usage", Kind.WINDOW, "usage limit", "wait for the limit to reset",
         window=WEEK, patterns=_rx(r"usage limit reached\|\d{10}", re.escape(USAGE_LIMIT))),
    Code("anthropic", "429", Kind.RATE, "rate limit", "back off, then retry",
         patterns=_rx(r"rate_limit_error", r"rate limit")),
)

_BY_CODE = {c.code: c for c in CODES if c.provider == Z}
_ANTHROPIC = {c.code: c for c in CODES if c.provider == "anthropic"}

# a business code written into the text: `"code":"1308"`, `[1308]`, `code 1308`
_CODE_IN_TEXT = Lazy(r'"code"\s*:\s*"?(1\d{3})"?|\[(1\d{3})\]|\bcode[ :=#]+(1\d{3})\b',
                     re.I)
_CLI_PREFIX = Lazy(r"^\s*(?:Failed to authenticate\.\s*)?API Error:\s*"
                   r"(?:Request rejected \(\d{3}\)\s*·\s*|\d{3}\s+)?")
_CLI_SUFFIX = Lazy(r"\.?\s*This is a server-side issue, usually temporary.*$", re.S)
_RESET = Lazy(r"(?:reset|resets)\s+(?:at|on)\s+(\S+(?:[ T]\d{1,2}:\d{2}(?::\d{2})?"
              r"(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)"
              r"|限额将在\s*(\d{4}-\d{2}-\d{2}[ T]\d{1,2}:\d{2}(?::\d{2})?)\s*重置"
              r"|usage limit reached\|(\d{10,13})", re.I)
_WINDOW_LEN = Lazy(r"(?:limit reached for|达到)\s*(\d{1,3})\s*"
                   r"(minute|hour|day|week|month|分钟|小时|天|周|月)", re.I)
_UNITS = {"minute": MINUTE, "hour": HOUR, "day": DAY, "week": WEEK, "month": MONTH,
          "分钟": MINUTE, "小时": HOUR, "天": DAY, "周": WEEK, "月": MONTH}
_UNIT_WORDS = {MINUTE: "minute", HOUR: "hour", DAY: "day", WEEK: "week", MONTH: "month"}
_RETRY_AFTER = Lazy(r"asked to wait (\d+(?:\.\d+)?) s \(retry-after\)")


def retry_after_text(seconds: float) -> str:
    """How a message says the endpoint asked for a wait (`retry_after` reads it back)."""
    return f"the endpoint asked to wait {seconds:g} s (retry-after)"


def retry_after(text: str | None) -> float | None:
    """The wait a message says the endpoint asked for, if it says one."""
    found = _RETRY_AFTER.search(text or "")
    return float(found.group(1)) if found else None
_STATUS = Lazy(r"\((\d{3})\)|API Error:\s*(\d{3})\b|\bHTTP (\d{3})\b")


@dataclass(frozen=True, slots=True)
class Signal:
    """What a refusal says, once identified: its row, the provider's own sentence, the
    reset time as written (a window) and the window's length, and a retry-after."""

    code: Code
    sentence: str
    reset: str | None = None
    window: float | None = None
    retry_after: float | None = None
    label: str = field(default="")

    @property
    def kind(self) -> Kind:
        return self.code.kind

    def describe(self) -> str:
        """"5-hour window, code 1308" (what the status line and the messages say)."""
        return f"{self.label or self.code.what}, {self.code.name}"


def _sentence(text: str) -> tuple[str, str | None]:
    """The provider's own words in a result text, and a business code written in it."""
    body = _CLI_SUFFIX.sub("", _CLI_PREFIX.sub("", text.strip(), 1)).strip()
    code = None
    start = body.find("{")
    if start >= 0:  # a raw JSON body: {"error": {"code": ..., "message": ...}}
        try:
            data = json.JSONDecoder().raw_decode(body[start:])[0]
        except ValueError:
            data = None
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            raw = error.get("code")
            code = str(raw) if isinstance(raw, (str, int)) and not isinstance(raw, bool) \
                else None
            body = error["message"].strip()
    bracket = re.fullmatch(r"\[(1\d{3})\]\[(.*?)\](?:\[[^\]]*\])?", body, re.S)
    if bracket:  # "[1310][Weekly/Monthly Limit Exhausted. ...][request id]"
        code, body = bracket.group(1), bracket.group(2).strip()
    return " ".join(body.split()), code


def _window_of(code: Code, sentence: str) -> tuple[float | None, str]:
    """The window's length and its label: the message's own ("for 5 hour"), else the
    code's."""
    found = _WINDOW_LEN.search(sentence)
    if found and code.kind is Kind.WINDOW:
        number = int(found.group(1))
        unit = _UNITS[found.group(2).lower()]
        if number > 0:
            return number * unit, f"{number}-{_UNIT_WORDS[unit]} window"
    if code.code == "1310":
        return code.window, "weekly/monthly limit"
    if code.code == "1304":
        return code.window, "daily limit"
    return code.window, code.what


def identify(text: str | None, status: int | None = None) -> Signal | None:
    """The row a refusal's text names (a result text, a verdict message, an error body's
    message), or None when it names none. `status`: the HTTP status when known (a 401,
    403 or 429 with no business code is Anthropic's kind of refusal)."""
    if not isinstance(text, str) or not text.strip():
        return None
    sentence, code_text = _sentence(text)
    row: Code | None = None
    if code_text is not None:
        row = _BY_CODE.get(code_text)
    if row is None:
        found = _CODE_IN_TEXT.search(text)
        if found:
            row = _BY_CODE.get(next(g for g in found.groups() if g))
    if row is None:
        row = next((c for c in CODES if c.provider == Z
                    and any(p.search(sentence) for p in c.patterns)), None)
    if row is None:
        row = next((c for c in CODES if c.provider != Z
                    and any(p.search(text) for p in c.patterns)), None)
    if row is None and status is None:
        found = _STATUS.search(text)
        status = int(next(g for g in found.groups() if g)) if found else None
    if row is None and status in (401, 403):
        row = _ANTHROPIC["401"]
    if row is None and status == 429:
        row = _ANTHROPIC["429"]
    if row is None:
        return None
    reset = None
    found_reset = _RESET.search(text)
    if found_reset:
        reset = next(g for g in found_reset.groups() if g).rstrip(".,;)")
    window, label = _window_of(row, sentence)
    if row.code == "usage":
        rejected = re.search(r"\((5-hour window|weekly[^)]*limit|usage limit)\)", text)
        if rejected:
            label = rejected.group(1)
            window = 5 * HOUR if label.startswith("5-hour") else WEEK
    return Signal(code=row, sentence=sentence, reset=reset, window=window,
                  retry_after=retry_after(text), label=label)


_RATE_LIMIT_WINDOWS = {"five_hour": (5 * HOUR, "5-hour window"),
                       "seven_day": (WEEK, "weekly limit"),
                       "seven_day_opus": (WEEK, "weekly Opus limit"),
                       "seven_day_sonnet": (WEEK, "weekly Sonnet limit")}


def rate_limit_signal(info: object) -> tuple[float, str] | None:
    """(reset time, what) from a `rate_limit_event`'s info when it says the request was
    rejected (Anthropic's usage limits: the CLI prints these for a claude.ai login), else
    None. The reset is epoch seconds (or milliseconds)."""
    if not isinstance(info, dict) or info.get("status") != "rejected":
        return None
    raw = info.get("resetsAt", info.get("resets_at"))
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw <= 0:
        return None
    at = float(raw) / 1000 if raw > 1e11 else float(raw)
    kind = info.get("rateLimitType", info.get("rate_limit_type"))
    what = _RATE_LIMIT_WINDOWS.get(kind, (WEEK, "usage limit"))[1] \
        if isinstance(kind, str) else "usage limit"
    return at, what


# --- reading a reset time -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reading:
    """A reset time read: `at` (epoch seconds) and the zone it was read in, or None and
    why it could not be used."""

    at: float | None
    zone: str = ""
    why: str = ""


def _offset_name(offset: timedelta | None) -> str:
    if offset is None:
        return "UTC"
    minutes = int(offset.total_seconds() // 60)
    if minutes == 0:
        return "UTC"
    sign = "+" if minutes > 0 else "-"
    hours, rest = divmod(abs(minutes), 60)
    return f"UTC{sign}{hours}" + (f":{rest:02d}" if rest else "")


def _parse_time(text: str) -> tuple[datetime | None, bool]:
    """A datetime from the reset text, and whether it carried its zone."""
    stamp = text.strip()
    if re.fullmatch(r"\d{10}(\.\d+)?|\d{13}", stamp):
        seconds = float(stamp) / (1000 if len(stamp) == 13 else 1)
        return datetime.fromtimestamp(seconds, UTC), True
    stamp = stamp.replace("Z", "+00:00").replace("z", "+00:00")
    stamp = re.sub(r"([+-]\d{2})(\d{2})$", r"\1:\2", stamp)
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}([ T]\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?)?"
                        r"([+-]\d{2}:\d{2})?", stamp):
        return None, False
    try:
        when = datetime.fromisoformat(stamp.replace(" ", "T", 1) if "T" not in stamp
                                      else stamp)
    except ValueError:
        return None, False
    return when, when.tzinfo is not None


def read_reset(text: str | None, window: float | None, now: float, *,
               zones: tuple[float, ...] = (), local: tzinfo | None = None) -> Reading:
    """The instant a reset time names. `text`: the time as written (`2026-12-01 00:14:10`,
    ISO with a zone, epoch seconds or milliseconds). `window`: the length of the window
    the error names (None: any time up to a month). `zones`: the provider's own UTC
    offsets in hours, tried first; then `local` (None: this machine's zone), then UTC.

    A time with its zone has one reading. A time without has one per zone; those that
    fall inside the window (from `SKEW` before `now` to `window` after it, give or take
    `SLACK`) are plausible. Of the plausible readings still ahead, the provider's zone is
    taken when it is one of them (z.ai writes Beijing time), else the latest (a late
    resume costs time, an early one a request into a closed window); a reading that
    passed a moment ago means it resets now. None, with the reason, when no reading is
    plausible: the text is not a time, every reading has passed, or none lies within
    the window."""
    if not text or not text.strip():
        return Reading(None, why="it names no reset time")
    when, zoned = _parse_time(text)
    if when is None:
        return Reading(None, why=f"{text.strip()[:40]!r} is not a time")
    horizon = (window if window is not None else MONTH) + SLACK
    try:
        readings = _readings(when, zoned, zones, local)
    except (OverflowError, OSError, ValueError):
        return Reading(None, why=f"{text.strip()[:40]!r} is not a usable time")
    plausible = [(at, name) for at, name in readings if now - SKEW <= at <= now + horizon]
    ahead = [(at, name) for at, name in plausible if at > now]
    if ahead:
        # the provider's own zone when it is plausible (its one probe, if it was wrong,
        # finds the same time passed and the next reading ahead), else the latest
        own = [(at, name) for at, name in ahead if name.endswith(_OWN_ZONE)]
        at, name = own[0] if own else max(ahead)
        return Reading(at, zone=name)
    if plausible:  # passed a moment ago (the clocks differ): it resets now
        at, name = max(plausible)
        return Reading(at, zone=name)
    if all(at < now - SKEW for at, _ in readings):
        return Reading(None, why=f"{text.strip()} has passed already")
    span = _span(window) if window is not None else "a month"
    return Reading(None, why=f"{text.strip()} lies outside the {span} window in every "
                             "reading (UTC, local time, the provider's zone)")


_OWN_ZONE = ", the provider's zone"


def _readings(when: datetime, zoned: bool, zones: tuple[float, ...],
              local: tzinfo | None) -> list[tuple[float, str]]:
    """Every instant `when` can mean, each with the zone it is read in, without repeats."""
    if zoned:
        return [(when.timestamp(), _offset_name(when.utcoffset()))]
    found: list[tuple[float, str]] = []
    for hours in zones:
        tz = timezone(timedelta(hours=hours))
        found.append((when.replace(tzinfo=tz).timestamp(),
                      f"{_offset_name(timedelta(hours=hours))}{_OWN_ZONE}"))
    # a naive datetime's astimezone() reads it as this machine's local time
    aware = when.replace(tzinfo=local) if local is not None else when.astimezone()
    found.append((aware.timestamp(), f"local time, {_offset_name(aware.utcoffset())}"))
    found.append((when.replace(tzinfo=UTC).timestamp(), "UTC"))
    unique: list[tuple[float, str]] = []
    for at, name in found:
        if all(at != seen for seen, _ in unique):
            unique.append((at, name))
    return unique


def _span(seconds: float) -> str:
    for unit, word in ((MONTH, "month"), (WEEK, "week"), (DAY, "day"), (HOUR, "hour")):
        if seconds >= unit and seconds % unit == 0:
            n = int(seconds // unit)
            return f"{n}-{word}" if n != 1 else word
    return f"{seconds:g} s"


def clock_text(at: float, now: float, tz: tzinfo | None = None) -> str:
    """A time for a person: `14:05` within the next 20 hours, else `Dec 03 14:05`
    (`tz`: None for this machine's zone)."""
    when = datetime.fromtimestamp(at, tz) if tz is not None \
        else datetime.fromtimestamp(at).astimezone()
    if abs(at - now) < 20 * HOUR:
        return when.strftime("%H:%M")
    return when.strftime("%b %d %H:%M")
