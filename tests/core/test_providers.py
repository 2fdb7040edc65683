"""The table of provider codes and the reading of a reset time: tables, no claude, no clock.

What the real CLI prints is in /work/shared/reference (stream-json/zai_1308_window) and was
checked against 2.1.197 and 2.1.332: both print `API Error: Request rejected (429) · <the
provider's message>` for a 429, `API Error: 400 <message>` for a 400, `Failed to
authenticate. API Error: 401 <message>` for a 401/403, and `API Error: 5xx <message>. This
is a server-side issue, ...` for a 5xx, and never the business code.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from fleet_tui.core import providers
from fleet_tui.core.providers import HOUR, MONTH, Kind

# the machine's clock in these tables: 2026-12-01 02:00:00 UTC
NOW = datetime(2026, 12, 1, 2, 0, tzinfo=UTC).timestamp()
ZAI = (8.0,)
SAMPLE = Path("/work/shared/reference/stream-json/zai_1308_window/stdout.jsonl")


def at(text: str, offset_hours: float = 0.0) -> float:
    """The instant of a wall-clock time in a zone."""
    zone = timezone(timedelta(hours=offset_hours))
    return datetime.fromisoformat(text).replace(tzinfo=zone).timestamp()


# --- which code a text names -------------------------------------------------------------------


@pytest.mark.parametrize(("text", "status", "code", "kind"), [
    # what the CLI prints for z.ai's bodies (2.1.197 and 2.1.332 alike)
    ("API Error: Request rejected (429) · Usage limit reached for 5 hour. Your limit will "
     "reset at 2026-12-01 00:14:10", 429, "1308", Kind.WINDOW),
    ("API Error: Request rejected (429) · Weekly/Monthly Limit Exhausted. Your limit will "
     "reset at 2026-10-02 11:25:23", 429, "1310", Kind.WINDOW),
    ("API Error: Request rejected (429) · High concurrency usage of this API, please "
     "reduce concurrency or contact customer service to increase limits", 429, "1302",
     Kind.CONCURRENCY),
    ("API Error: Request rejected (429) · Rate limit reached for requests", 429, "1302",
     Kind.CONCURRENCY),
    ("API Error: Request rejected (429) · Your account is in arrears, please recharge and "
     "try again", 429, "1113", Kind.ACCOUNT),
    ("API Error: Request rejected (429) · Insufficient balance or no resource package. "
     "Please recharge.", 429, "1113", Kind.ACCOUNT),
    ("API Error: Request rejected (429) · Your GLM Coding Plan package has expired and is "
     "temporarily unavailable.", 429, "1309", Kind.ACCOUNT),
    ("API Error: 400 The current subscription plan does not yet include access to GLM-5.2",
     400, "1311", Kind.ACCOUNT),
    ("API Error: Request rejected (429) · The model is currently experiencing high traffic. "
     "Please try again later or switch to another model.", 429, "1312",
     Kind.MODEL_OVERLOAD),
    ("API Error: Request rejected (429) · Your account's current usage pattern does not "
     "comply with the Fair Use Policy", 429, "1313", Kind.ACCOUNT),
    ("Failed to authenticate. API Error: 401 Authorization Token is invalid, please ensure "
     "that the Authorization Token is correctly provided.", 401, "1002", Kind.AUTH),
    ("API Error: Request rejected (429) · High frequency usage of this API", 429, "1303",
     Kind.RATE),
    # the code written into the text wins over the words: a raw body (older CLIs), a
    # proxy's [code][message][request id], a message in Chinese
    ('API Error: 429 {"error":{"code":"1302","message":"Rate limit reached for requests"},'
     '"request_id":"20260212064144579f5b8f457f4e06"}', 429, "1302", Kind.CONCURRENCY),
    ("API Error: Request rejected (429) · [1310][Weekly/Monthly Limit Exhausted. Your limit "
     "will reset at 2026-08-01 10:03:40][202607280616391a9088331cb844d2]", 429, "1310",
     Kind.WINDOW),
    ('API Error: 429 {"error":{"code":"1113","message":"something new"}}', 429, "1113",
     Kind.ACCOUNT),
    ("已达到 5 小时的使用上限。您的限额将在 2026-08-25 07:41:44 重置。", 429, "1308",
     Kind.WINDOW),
    # Anthropic's API: by status and its words
    ("API Error: Request rejected (429) · Number of request tokens has exceeded your "
     "per-minute rate limit", 429, "429", Kind.RATE),
    ("Failed to authenticate. API Error: 401 invalid x-api-key", 401, "401", Kind.AUTH),
    ("Claude AI usage limit reached|1796104800", None, "usage", Kind.WINDOW),
])
def test_identify(text: str, status: int | None, code: str, kind: Kind) -> None:
    signal = providers.identify(text, status)
    assert signal is not None
    assert (signal.code.code, signal.kind) == (code, kind)
    assert "API Error" not in signal.sentence  # the provider's own words only


@pytest.mark.parametrize("text", [
    "", "   ", "finished in 3 turns: all done",
    "API Error: 529 Overloaded. This is a server-side issue, usually temporary",
    "API Error: 400 prompt is too long for this model's context",
])
def test_identify_names_nothing_it_does_not_know(text: str) -> None:
    assert providers.identify(text) is None


def test_the_real_cli_output_of_a_1308_is_a_5_hour_window() -> None:
    lines = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    result = next(line for line in lines if line.get("type") == "result")
    signal = providers.identify(result["result"], result["api_error_status"])
    assert signal is not None and signal.code.code == "1308"
    assert signal.describe() == "5-hour window, code 1308"
    assert signal.reset == "2026-12-01 00:14:10" and signal.window == 5 * HOUR


@pytest.mark.parametrize(("sentence", "window", "label"), [
    ("Usage limit reached for 5 hour. Your limit will reset at 2026-12-01 10:00:00",
     5 * HOUR, "5-hour window"),
    ("Usage limit reached for 1 day. Your limit will reset at 2026-12-02 10:00:00",
     24 * HOUR, "1-day window"),
    ("Usage limit reached for . Your limit will reset at 2026-12-01 10:00:00",  # the docs'
     5 * HOUR, "usage window"),                                                # template
    ("Weekly/Monthly Limit Exhausted. Your limit will reset at 2026-12-07 10:00:00",
     MONTH, "weekly/monthly limit"),
])
def test_a_window_is_as_long_as_its_message_says(sentence: str, window: float,
                                                  label: str) -> None:
    signal = providers.identify(f"API Error: Request rejected (429) · {sentence}", 429)
    assert signal is not None and (signal.window, signal.label) == (window, label)


def test_the_wait_an_endpoint_asked_for_is_read_back() -> None:
    text = "rate limited; " + providers.retry_after_text(7.5)
    assert providers.retry_after(text) == 7.5
    assert providers.retry_after("rate limited") is None


def test_a_rejected_rate_limit_event_gives_its_reset() -> None:
    assert providers.rate_limit_signal({"status": "rejected", "resetsAt": 1796104800,
                                        "rateLimitType": "five_hour"}) == (1796104800.0,
                                                                           "5-hour window")
    assert providers.rate_limit_signal({"status": "rejected", "resetsAt": 1796104800000,
                                        "rateLimitType": "seven_day"}) == (1796104800.0,
                                                                           "weekly limit")
    for info in ({"status": "allowed", "resetsAt": 1796104800}, {"status": "rejected"},
                 {"status": "rejected", "resetsAt": "soon"}, None, [1, 2]):
        assert providers.rate_limit_signal(info) is None


# --- the reset time: which reading --------------------------------------------------------------


@pytest.mark.parametrize(("text", "window", "zones", "local", "expected", "zone"), [
    # Beijing time: the only reading inside the 5-hour window (UTC would be 8 h 50 ahead)
    ("2026-12-01 10:50:00", 5 * HOUR, ZAI, 0.0, at("2026-12-01 02:50:00"), "UTC+8"),
    # a time that is only plausible as UTC (as Beijing time it passed yesterday)
    ("2026-12-01 04:30:00", 5 * HOUR, ZAI, 0.0, at("2026-12-01 04:30:00"), "local time"),
    # on a machine at UTC+2 with no provider zone: local (03:00 UTC) and UTC (05:00) both
    # fall inside the window: the later one, never an early request
    ("2026-12-01 05:00:00", 5 * HOUR, (), 2.0, at("2026-12-01 05:00:00"), "UTC"),
    # the same with the provider's zone plausible too: the provider's zone
    ("2026-12-01 10:30:00", 10 * HOUR, ZAI, 0.0, at("2026-12-01 02:30:00"), "UTC+8"),
    # a weekly/monthly limit: Beijing time, days ahead
    ("2026-12-05 10:00:00", MONTH, ZAI, 0.0, at("2026-12-05 02:00:00"), "UTC+8"),
    # a time with its zone, or an epoch, has one reading
    ("2026-12-01T03:00:00Z", 5 * HOUR, ZAI, 0.0, at("2026-12-01 03:00:00"), "UTC"),
    ("2026-12-01T05:00:00+02:00", 5 * HOUR, ZAI, 0.0, at("2026-12-01 03:00:00"), "UTC+2"),
    ("1796104800", 5 * HOUR, (), 0.0, 1796104800.0, "UTC"),
    ("1796104800000", 5 * HOUR, (), 0.0, 1796104800.0, "UTC"),
    # passed a moment ago (the clocks differ): it resets now
    ("2026-12-01 01:59:30", 5 * HOUR, (), 0.0, at("2026-12-01 01:59:30"), "local time"),
])
def test_read_reset_takes_the_reading_inside_the_window(
        text: str, window: float, zones: tuple[float, ...], local: float, expected: float,
        zone: str) -> None:
    reading = providers.read_reset(text, window, NOW, zones=zones,
                                   local=timezone(timedelta(hours=local)))
    assert reading.at == expected, reading
    assert reading.zone.startswith(zone) and reading.why == ""


@pytest.mark.parametrize(("text", "window", "why"), [
    # every reading has passed (Beijing: 12:00 yesterday UTC; UTC: 6 h ago)
    ("2026-11-30 20:00:00", 5 * HOUR, "has passed already"),
    # two days ahead: outside a 5-hour window in every reading
    ("2026-12-03 10:00:00", 5 * HOUR, "outside the 5-hour window"),
    # ... and outside a month
    ("2027-03-01 10:00:00", MONTH, "outside the"),
    # not a time at all
    ("tomorrow morning", 5 * HOUR, "is not a time"),
    ("2026-13-45 25:61:00", 5 * HOUR, "is not a time"),
    ("2026-12-01 10:50:00; DROP TABLE", 5 * HOUR, "is not a time"),
    ("", 5 * HOUR, "names no reset time"),
    (None, 5 * HOUR, "names no reset time"),
    ("9999-12-31 23:59:59", MONTH, "outside the"),
    ("0001-01-01 00:00:00", MONTH, ""),
])
def test_read_reset_refuses_what_is_not_a_usable_reset(text: str | None, window: float,
                                                       why: str) -> None:
    reading = providers.read_reset(text, window, NOW, zones=ZAI, local=UTC)
    assert reading.at is None
    assert why in reading.why
    assert reading.why  # always says why


def test_read_reset_in_this_machines_own_zone() -> None:
    """With no zone given, the local reading is this machine's (whatever TZ says)."""
    wall = datetime.fromtimestamp(NOW + HOUR).strftime("%Y-%m-%d %H:%M:%S")
    reading = providers.read_reset(wall, 5 * HOUR, NOW)
    assert reading.at == NOW + HOUR


def test_clock_text() -> None:
    assert providers.clock_text(at("2026-12-01 07:14:00"), NOW, UTC) == "07:14"
    assert providers.clock_text(at("2026-12-05 07:14:00"), NOW, UTC) == "Dec 05 07:14"
    assert providers.clock_text(at("2026-12-01 07:14:00"), NOW,
                                timezone(timedelta(hours=8))) == "15:14"


def test_a_rejected_rate_limit_event_makes_a_429_a_window_that_parks() -> None:
    """Anthropic's usage limits: the CLI prints a rate_limit_event (status rejected, the
    reset in epoch seconds) before the 429 (only for a claude.ai login, which a scripted
    endpoint cannot give: this chain is checked here, piece by piece)."""
    from fleet_tui.core import outcome

    reset = NOW + 2 * HOUR
    hint = providers.rate_limit_signal({"status": "rejected", "resetsAt": int(reset),
                                        "rateLimitType": "five_hour"})
    ending = outcome.Ending(outcome.Verdict.QUOTA, "the endpoint's rate limit or quota was "
                            "hit (429): API Error: Request rejected (429) · limited")
    judged = outcome.with_hints(ending, rate_limit=hint)
    assert judged.verdict == outcome.Verdict.WINDOW
    assert judged.message.startswith(f"{providers.USAGE_LIMIT} (5-hour window): ")
    signal = providers.identify(judged.message)
    assert signal is not None and signal.kind is Kind.WINDOW
    assert signal.describe() == "5-hour window, usage limit"
    reading = providers.read_reset(signal.reset, signal.window, NOW)
    assert reading.at == reset
    # a retry-after is kept in the message, for policy to read back
    waited = outcome.with_hints(ending, retry_after=12.0)
    assert waited.verdict == outcome.Verdict.QUOTA
    assert providers.retry_after(waited.message) == 12.0
    ok = outcome.Ending(outcome.Verdict.OK, "finished")
    assert outcome.with_hints(ok, retry_after=3.0, rate_limit=hint) is ok
