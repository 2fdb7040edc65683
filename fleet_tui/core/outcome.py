"""One verdict per finished run.

The CLI's own signals disagree with one another: `subtype` stays "success" on API
failures, `is_error` stays false when the run ran out of turns in some versions, and the
exit code is 1 for every kind of failure. So a verdict is built from all of them together:
the exit code (or signal), the result object (or its absence), and the stderr tail, and
each verdict comes with one line a person can act on. Retry policy is the engine's.

Everything here is total: `find_result` and `classify` never raise, whatever bytes, JSON
values or argument types they get (a result is untrusted data; so is an exit record read
back from disk), and an Outcome holds only what JSON, a terminal and the store take.
"""

from __future__ import annotations

import json
import math
import re
import signal as _signal
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from fleet_tui.core import providers
from fleet_tui.core.errors import EXIT_MISSING
from fleet_tui.core.lazyre import Lazy
from fleet_tui.core.states import StopReason
from fleet_tui.core.states import Verdict as Verdict  # re-exported: outcome.Verdict
from fleet_tui.core.stream import (
    MAX_INT,
    Result,
    has_surrogate_escape,
    one_line,
    scrub_surrogates,
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """A classified run: the verdict, its one-line message, and the result's key facts."""

    verdict: Verdict
    message: str
    is_error: bool | None = None
    api_error_status: int | None = None
    num_turns: int | None = None
    session_id: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    result_text: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    subtype: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.OK

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the verdict as its string value)."""
        out = asdict(self)
        out["verdict"] = str(self.verdict)
        return out


# --------------------------------------------------------------------------- messages

_AUTH_HINT = "check FLEET_WORKER_BASE_URL and the key; run fleet-doctor --live"
_TEXT_MAX = 160

# stderr lines that mean claude refused to start (nothing was sent to the endpoint)
_REFUSAL_PATTERNS = (
    Lazy(r"cannot be used with root/sudo privileges", re.I),
    Lazy(r"^error: (unknown|unexpected|missing|too many|option|required)", re.I | re.M),
    Lazy(r"^error: .*(option|argument)", re.I | re.M),
    Lazy(r"requires --verbose", re.I),
    Lazy(r"^Error: (When using|Invalid|Unknown|--)", re.M),
)
_API_STATUS_IN_TEXT = Lazy(r"API Error: (?:[^0-9\n]{0,40}\()?([0-9]{3})\b")
_TIMEOUT_TEXT = Lazy(r"\b(request )?timed out\b|\btimeout\b", re.I)
# claude's words when no connection could be made at all, against a closed port: CLI
# 2.1.197 "API Error: Unable to connect to API (ConnectionRefused)", 2.1.332 "API Error:
# Connection refused — a firewall or proxy may be blocking it (ECONNREFUSED)"; the SDK's
# own: "Connection error."
_UNREACHABLE_TEXT = Lazy(r"Unable to connect to API|\bConnection (error|refused)\b|"
                         r"\bECONNREFUSED\b|\bConnectionRefused\b")
# claude's words when a connection it had closed in the middle of an answer (CLI 2.1.197
# "API Error: Connection closed mid-response. The response above may be incomplete.";
# Node's and Bun's own for a socket reset): a gateway SIGKILLed, a proxy or the endpoint
# restarted. The CLI falls back to a request of its own only while no block of the answer
# has ended; later it gives up at once. Transient, as a refused connection is: the session
# is resumed once what was cut is back.
_CUT_TEXT = Lazy(r"Connection closed mid-response|\bsocket hang up\b|\bECONNRESET\b")


def _clip(text: str, limit: int = _TEXT_MAX) -> str:
    return one_line(text, limit)


def _last_line(text: str) -> str:
    for line in reversed(text.splitlines()):
        if line.strip():
            return _clip(line)
    return ""


# stderr lines that never say what went wrong: Bun's uncaught-error report puts a source
# excerpt and a caret above the error line and stack frames and its version banner below
# it ("Bun v1.4.0 (Linux x64 baseline)" is the last line); its crash report (a panic)
# wraps the panic line in a header and a link; minified code is one huge line.
_NOISE_LINE = Lazy(
    r"\s*$"
    r"|\s*at\s"                       # stack frame: `at fn (/$bunfs/root/src/cli.js:477:6)`
    r"|\s*\d+\s?\|"                   # source excerpt: `472 | function ...`
    r"|\s*\^+\s*$"                     # the caret under the excerpt
    r"|(?:Bun|Node\.js|Deno) v\d"      # version banner
    r"|=+\s*$"
    r"|(?:Linux Kernel|macOS|Windows|CPU|Args|Features|Builtins|Elapsed|RSS)\b.*[:|]"
    r"|oh no: Bun has crashed|To send a redacted crash report|please file a GitHub issue"
    r"|\s*https?://\S+\s*$",
)
_NOISE_LENGTH = 1000  # longer lines are code or data dumps, not a message
_ERROR_LINE = Lazy(
    r"(?i:\b\w*error\b|\bpanic\b|\buncaught\b|\bexception\b|\bfatal\b"
    r"|segmentation fault|out of memory|bubblewrap is required|permission denied"
    r"|no space left)"
    r"|\bE(?:NOSPC|ACCES|PERM|ROFS|NOENT|NOTDIR|ISDIR|EXIST|MFILE|NFILE|NOMEM|IO|PIPE"
    r"|CONNREFUSED|CONNRESET|TIMEDOUT|ADDRINUSE)\b",
)


def _crash_line(stderr_tail: str) -> str:
    """The stderr line that says what went wrong: the last error-like line that is not
    noise (see above), else the last line that is not noise, else the last line."""
    lines = [line for line in stderr_tail.splitlines()
             if len(line) <= _NOISE_LENGTH and not _NOISE_LINE.match(line)]
    for line in reversed(lines):
        if _ERROR_LINE.search(line):
            return _clip(line)
    return _clip(lines[-1]) if lines else _last_line(stderr_tail)


# signals that mean claude itself crashed (its runtime's crash report is on stderr), as
# opposed to being stopped from outside (SIGTERM, SIGKILL from the OOM killer, ...)
_CRASH_SIGNALS = frozenset({_signal.SIGSEGV, _signal.SIGBUS, _signal.SIGILL, _signal.SIGFPE,
                            _signal.SIGABRT, _signal.SIGTRAP, _signal.SIGSYS})


def _signal_name(num: int) -> str:
    try:
        return _signal.Signals(num).name
    except (ValueError, TypeError):
        return f"signal {num}"


def _as_int(value: Any) -> int | None:
    """An integer within `MAX_INT` from a JSON number or a string of ASCII digits, else None.

    `"²".isdigit()` and `"١٢٣".isdigit()` are true, so digits are checked as ASCII: int()
    refuses the first, and a status code is never written in the second.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -MAX_INT <= value <= MAX_INT else None
    if isinstance(value, float):
        if value.is_integer() and -MAX_INT <= value <= MAX_INT:
            return int(value)
        return None
    if isinstance(value, str):
        text = value.strip()
        if text.isascii() and text.isdigit() and len(text) <= 15:
            return int(text)
    return None


def _plain(value: Any, depth: int = 0) -> Any:
    """A JSON-safe, bounded copy of an untrusted value (the result's usage): at most 4
    levels and 64 items per container, finite numbers within MAX_INT, str keys."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if -MAX_INT <= value <= MAX_INT else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth >= 4:
        return None
    if isinstance(value, dict):
        return {k: _plain(v, depth + 1) for k, v in list(value.items())[:64]
                if isinstance(k, str)}
    if isinstance(value, list):
        return [_plain(v, depth + 1) for v in value[:64]]
    return None


def _clean(text: str | None) -> str | None:
    """`text` with any lone surrogate replaced, so that UTF-8 output takes it."""
    if text is None:
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return str(scrub_surrogates(text))
    return text


def _refusal(stderr_tail: str) -> str | None:
    """The stderr line saying claude refused to start, if there is one."""
    for pattern in _REFUSAL_PATTERNS:
        match = pattern.search(stderr_tail)
        if match:
            start = stderr_tail.rfind("\n", 0, match.start()) + 1
            end = stderr_tail.find("\n", match.end())
            return _clip(stderr_tail[start: end if end >= 0 else None])
    return None


def _refused_message(line: str) -> str:
    if "root/sudo" in line:
        return (f"claude refused to start: {line} (run as a non-root user, or set "
                "FLEET_WORKER_SANDBOX=1 inside a container or VM)")
    return f"claude refused to start: {line} (check the extra arguments given to claude)"


def _api_message(status: int, text: str) -> tuple[Verdict, str]:
    signal = providers.identify(text, status)
    if signal is not None and (signal.code.provider != "anthropic"
                               or signal.kind is providers.Kind.WINDOW):
        return _provider_message(status, signal)
    detail = f": {_clip(text)}" if text else ""
    if status in (401, 403):
        return Verdict.AUTH, f"{providers.REJECTED_KEY} ({status}): {_AUTH_HINT}"
    if status == 429:
        return Verdict.QUOTA, (f"the endpoint's rate limit or quota was hit (429){detail}; "
                               "wait for the quota window or lower max_workers")
    if status == 529 or 500 <= status <= 599:
        return Verdict.OVERLOAD, (f"the endpoint is overloaded or failing ({status}) even after "
                                  "claude's own retries; retry later or fall back to the small "
                                  "model (FLEET_WORKER_SMALL_MODEL)")
    if status == 408:
        return Verdict.TIMEOUT, ("the endpoint timed out the request (408); check the endpoint, "
                                 "then retry")
    if status in (404, 405):
        return Verdict.REFUSED, (f"the endpoint refused the request ({status}){detail}; check "
                                 "FLEET_WORKER_BASE_URL and FLEET_WORKER_MODEL")
    return Verdict.REFUSED, (f"the endpoint refused the request ({status}){detail}; check the "
                             "model name and the prompt size")


# what each kind of provider error is, as a verdict (fleet-doctor names it too)
KIND_VERDICT: dict[providers.Kind, Verdict] = {
    providers.Kind.WINDOW: Verdict.WINDOW, providers.Kind.RATE: Verdict.QUOTA,
    providers.Kind.CONCURRENCY: Verdict.CONCURRENCY, providers.Kind.ACCOUNT: Verdict.ACCOUNT,
    providers.Kind.AUTH: Verdict.AUTH, providers.Kind.MODEL_OVERLOAD: Verdict.MODEL_OVERLOAD,
    providers.Kind.OVERLOAD: Verdict.OVERLOAD, providers.Kind.TASK: Verdict.REFUSED,
}


def _provider_message(status: int, signal: providers.Signal) -> tuple[Verdict, str]:
    """A provider's refusal in its own words, what it is (code and meaning) and, for one
    the user must act on, what to do. The words are kept whole: the reset time of a
    window is read back from them (policy), by any engine, after a restart too."""
    verdict = KIND_VERDICT[signal.kind]
    said = f"{signal.code.provider} ({status}): {_clip(signal.sentence, 240)} " \
           f"({signal.describe()})"
    if verdict is Verdict.AUTH:
        return verdict, f"{providers.REJECTED_KEY}: {said} — {signal.code.advice}"
    if verdict in (Verdict.ACCOUNT, Verdict.REFUSED):
        return verdict, f"{said} — {signal.code.advice}"
    return verdict, said


def with_tool_calls(ending: Ending, tool_calls: int, tool_errors: int) -> Ending:
    """A success whose every tool call failed (the files it read were not there, each
    edit and command errored) is flagged in its message: the worker's own words say it
    did the work. The verdict stays ok: claude ended its turn as it should."""
    note = tools_note(tool_calls, tool_errors)
    if ending.verdict is not Verdict.OK or note is None:
        return ending
    return Ending(ending.verdict, f"{ending.message} [{note}]", ending.exit_code,
                  ending.signal)


def tools_note(tool_calls: int, tool_errors: int) -> str | None:
    """"all 3 tool calls failed" when the run called tools and each one failed, else None."""
    if tool_calls <= 0 or tool_errors < tool_calls:
        return None
    return ("its only tool call failed" if tool_calls == 1
            else f"all {tool_calls} tool calls failed")


def with_hints(ending: Ending, *, retry_after: float | None = None,
               rate_limit: tuple[float, str] | None = None) -> Ending:
    """An attempt's ending with what its events said beside the result: the wait the
    endpoint asked for (`retry-after`, as the CLI's last api_retry line shows it) and a
    rejected `rate_limit_event` (Anthropic's usage limits, with their reset time: a 429
    with one is a closed window, not a rate limit)."""
    verdict, message = ending.verdict, ending.message
    if rate_limit is not None and verdict in (Verdict.QUOTA, Verdict.CONCURRENCY):
        at, what = rate_limit
        stamp = datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")
        verdict = Verdict.WINDOW
        message = (f"{providers.USAGE_LIMIT} ({what}): {message}; it resets at {stamp}")
    elif retry_after is not None and retry_after > 0 and verdict in (
            Verdict.QUOTA, Verdict.OVERLOAD, Verdict.CONCURRENCY, Verdict.MODEL_OVERLOAD):
        message = f"{message}; {providers.retry_after_text(retry_after)}"
    if (verdict, message) == (ending.verdict, ending.message):
        return ending
    return Ending(verdict, message, ending.exit_code, ending.signal)


# --------------------------------------------------------------------------- the engine's own
# Verdicts the engine gives without a run to classify (or beside it): a start that failed, a
# kill before the runner existed, a runner that died without its exit record, one task's
# data the engine could not use. Written here so that every verdict has one home.

KILLED_BEFORE_START = "killed before it started"
KILLED_BY_USER = "killed by the user"
STOPPED_BY_ENGINE = "stopped by the engine"


def could_not_start(reason: str) -> str:
    """The message of a task whose attempt could not be started (verdict crashed)."""
    return f"could not start: {reason}"


def engine_gave_up(cause: str) -> str:
    """The message of a task the engine could not go on with (its data, its files)."""
    return f"the engine could not go on with this task: {cause}"


def no_exit_record(folder: str, *, write_problem: str | None, stray: str | None,
                   runner_log: str | None, stopped: int) -> str:
    """One sentence on why a dead runner left no exit record in `folder`: the folder
    cannot be written (`write_problem`), it died half way through writing it (`stray`: the
    temporary file it left), or it was killed from outside; then where its own log is and
    how many processes it had left behind were stopped."""
    if write_problem is not None:
        message = f"the runner could not write its exit record in {folder}: {write_problem}"
    elif stray is not None:
        message = (f"the runner died while writing its exit record in {folder} "
                   f"(it left {stray})")
    else:
        message = ("the runner process died without an exit record (killed from outside, "
                   "or the machine went down?)")
    if runner_log:
        message += f"; see {runner_log}"
    if stopped:
        message += f"; {stopped} process(es) it had started were stopped"
    return message


@dataclass(frozen=True, slots=True)
class Ending:
    """How one attempt ended, as the engine records it."""

    verdict: Verdict
    message: str
    exit_code: int | None = None
    signal: int | None = None


def judge_attempt(*, exit_record: dict[str, Any] | None, exit_problem: str | None,
                  exit_path: str, stop_reason: StopReason | None, stop_message: str | None,
                  result: dict[str, Any] | None, stderr_tail: str,
                  no_record: str = "") -> Ending:
    """The verdict of an attempt whose runner is gone, from everything it left: the exit
    record (None: missing, or unreadable for `exit_problem`), why a stop was asked
    (`stop_reason` and its message), the events' result and the
    stderr tail. `no_record`: why there is no exit record (see `no_exit_record`).

    A stop asked by the user or the engine decides the verdict (killed, crashed, timeout)
    whatever claude printed after it; a launcher's refusal recorded by the runner (no key,
    no claude) is an auth failure or a crash; else `classify` judges the run."""
    killed = stop_reason in (StopReason.KILL, StopReason.ERROR)
    timed_out = stop_reason in (StopReason.TIMEOUT, StopReason.STALL)
    if stop_reason == StopReason.ENDPOINT:
        return _stopped_for_the_endpoint(exit_record, stop_message, result, stderr_tail)
    if stop_reason in (StopReason.BUDGET_DAY, StopReason.NO_KEY):
        return _stopped_to_wait(Verdict.BUDGET if stop_reason == StopReason.BUDGET_DAY
                                else Verdict.KEY, exit_record, stop_message, result,
                                stderr_tail)
    if stop_reason == StopReason.BUDGET:  # the budget's figure is the whole story
        record = exit_record or {}
        return Ending(Verdict.KILLED, stop_message or "stopped: the task spent its budget",
                      _as_int(record.get("exit_code")), _as_int(record.get("signal")))
    if exit_record is None:
        if exit_problem is None:
            why = no_record
        else:
            why = (f"the exit record {exit_path} is unreadable ({exit_problem}); the verdict "
                   "comes from the events' result")
        if killed:
            return Ending(Verdict.KILLED if stop_reason == StopReason.KILL else Verdict.CRASHED,
                          stop_message or "killed")
        if timed_out:
            return Ending(Verdict.TIMEOUT, stop_message or "timed out")
        if result is None:
            if exit_problem is not None:
                why = (f"the exit record {exit_path} is unreadable ({exit_problem}) and the "
                       "events hold no result")
            return Ending(Verdict.CRASHED, why)
        out = classify(exit_code=None, result=result, stderr_tail=stderr_tail)
        return Ending(out.verdict, f"{out.message} ({why})")
    exit_code = _as_int(exit_record.get("exit_code"))
    sig = _as_int(exit_record.get("signal"))
    error = exit_record.get("error")
    if error and stop_reason is None:
        # the launcher refused (no key, no claude, bad settings), or the runner could not
        # record the run (a full disk): say that
        verdict = (Verdict.AUTH if exit_code == EXIT_MISSING and "key" in str(error).lower()
                   else Verdict.CRASHED)
        return Ending(verdict, str(error), exit_code, sig)
    if stop_reason == StopReason.ERROR:
        return Ending(Verdict.CRASHED, stop_message or STOPPED_BY_ENGINE, exit_code, sig)
    out = classify(exit_code=exit_code, signal=sig, result=result, stderr_tail=stderr_tail,
                   killed=killed, timed_out=timed_out)
    message = stop_message if timed_out and stop_message else out.message
    return Ending(out.verdict, message, exit_code, sig)


def _stopped_to_wait(verdict: Verdict, exit_record: dict[str, Any] | None,
                     stop_message: str | None, result: dict[str, Any] | None,
                     stderr_tail: str) -> Ending:
    """A run whose request the gateway answered itself: its endpoint's day budget was met
    (verdict budget, the figure its message), or the key of its route is no longer held
    (verdict key); it waits, unless the run finished first."""
    record = exit_record or {}
    exit_code, sig = _as_int(record.get("exit_code")), _as_int(record.get("signal"))
    out = classify(exit_code=exit_code, signal=sig, result=result, stderr_tail=stderr_tail)
    if out.verdict is Verdict.OK:
        return Ending(out.verdict, out.message, exit_code, sig)
    return Ending(verdict, stop_message or ("the endpoint's day budget was met"
                                            if verdict is Verdict.BUDGET else
                                            "the gateway no longer held the task's key"),
                  exit_code, sig)


def _stopped_for_the_endpoint(exit_record: dict[str, Any] | None, stop_message: str | None,
                              result: dict[str, Any] | None, stderr_tail: str) -> Ending:
    """A run the engine stopped while it retried what its endpoint refuses (a closed
    window, an account on hold): the endpoint's refusal, in the provider's words, is its
    verdict, unless the run finished first."""
    record = exit_record or {}
    exit_code, sig = _as_int(record.get("exit_code")), _as_int(record.get("signal"))
    out = classify(exit_code=exit_code, signal=sig, result=result, stderr_tail=stderr_tail)
    if out.verdict is Verdict.OK or not stop_message:
        return Ending(out.verdict, out.message, exit_code, sig)
    signal = providers.identify(stop_message)
    verdict = KIND_VERDICT[signal.kind] if signal is not None else Verdict.CRASHED
    return Ending(verdict, stop_message, exit_code, sig)


# --------------------------------------------------------------------------- classify


def _result_facts(result: dict[str, Any]) -> dict[str, Any]:
    """The Outcome's fields that come from the result object, each one checked: the
    object is read back from disk or from a stream, so any field may be of any type."""
    raw_text = result.get("result")
    usage = result.get("usage")
    subtype = result.get("subtype")
    session = result.get("session_id")
    return {
        "is_error": result.get("is_error") if isinstance(result.get("is_error"), bool)
        else None,
        "api_error_status": _as_int(result.get("api_error_status")),
        "num_turns": _as_int(result.get("num_turns")),
        "session_id": _clean(session) if isinstance(session, str) else None,
        "usage": _plain(usage) if isinstance(usage, dict) else {},
        "result_text": _clean(raw_text) if isinstance(raw_text, str) else None,
        "subtype": _clean(subtype) if isinstance(subtype, str) else None,
    }


def classify(*, exit_code: int | None, signal: int | None = None,
             result: dict[str, Any] | Result | None = None, stderr_tail: str = "",
             killed: bool = False, timed_out: bool = False,
             finished_before_stop: bool = False) -> Outcome:
    """The verdict of one finished run. Never raises, whatever the arguments hold.

    `exit_code` None means unknown (fleet-collect reads a saved result); a negative one
    means a signal, as subprocess reports it. `result` is the result object (a dict, or a
    stream `Result` event). `killed` / `timed_out` are the caller's own kill and wall-clock
    timeout: they decide the verdict whatever claude printed after the signal (CLI 2.1.197
    answers a SIGTERM during a Bash step with one more API turn, a clean `success` result
    and exit 0). Only a caller that knows the result line was complete before it asked
    for the stop passes `finished_before_stop`, and then the run's own verdict stands.
    `subtype` is never trusted alone: `is_error`, `api_error_status` and the exit code
    decide.
    """
    if isinstance(result, Result):
        result = result.data or {}
    if result is not None and not isinstance(result, dict):
        result = None
    # an exit record is read back from disk: anything that is not a number is unknown
    exit_code = _as_int(exit_code)
    signal = _as_int(signal)
    if signal is not None and signal <= 0:
        signal = None
    if signal is None and exit_code is not None and exit_code < 0:
        signal = -exit_code
    if isinstance(stderr_tail, (bytes, bytearray)):
        stderr_tail = bytes(stderr_tail).decode("utf-8", "replace")
    elif not isinstance(stderr_tail, str):
        stderr_tail = ""

    facts: dict[str, Any] = {"exit_code": exit_code, "signal": signal}
    if result is not None:
        facts.update(_result_facts(result))

    def out(verdict: Verdict, message: str) -> Outcome:
        return Outcome(verdict=verdict, message=_clean(message) or str(verdict), **facts)

    # a signal's exit code says nothing about the result the run printed before it
    code = exit_code if signal is None else None
    from_result = None if result is None else _result_verdict(result, code)
    finished_ok = from_result is not None and from_result[0] is Verdict.OK

    stopped_after_finish = finished_before_stop and finished_ok
    if killed and not stopped_after_finish:
        how = f" ({_signal_name(signal)})" if signal else ""
        return out(Verdict.KILLED, f"the run was killed on request{how}")
    if timed_out and not stopped_after_finish:
        return out(Verdict.TIMEOUT, "the run went past its wall-clock timeout and was stopped; "
                                    "raise timeout (FLEET_WORKER_TIMEOUT) or split the task")
    if signal and not finished_ok:
        if signal in _CRASH_SIGNALS:
            line = _crash_line(stderr_tail)
            detail = f": {line}" if line else " and printed nothing on stderr"
            return out(Verdict.CRASHED, f"claude crashed with {_signal_name(signal)}{detail}; "
                                        "see the run's stderr log")
        return out(Verdict.KILLED, f"claude was terminated by {_signal_name(signal)} before "
                                   "it finished (out of memory, or killed from outside?)")
    if from_result is None:
        refusal = _refusal(stderr_tail)
        if refusal is not None:
            return out(Verdict.REFUSED, _refused_message(refusal))
        how = "an unknown code" if exit_code is None else f"code {exit_code}"
        tail = _crash_line(stderr_tail)
        detail = f": {tail}" if tail else " and printed nothing on stderr"
        return out(Verdict.CRASHED, f"claude exited with {how} without a result line{detail}; "
                                    "see the run's stderr log")
    return out(*from_result)


def _result_verdict(result: dict[str, Any], exit_code: int | None) -> tuple[Verdict, str]:
    """Verdict from a result object (and the exit code when known)."""
    is_error = result.get("is_error") is True
    status = _as_int(result.get("api_error_status"))
    raw_subtype = result.get("subtype")
    subtype = raw_subtype if isinstance(raw_subtype, str) else ""
    terminal = result.get("terminal_reason")
    raw_text = result.get("result")
    text = raw_text if isinstance(raw_text, str) else ""
    turns = _as_int(result.get("num_turns"))

    if status is not None and (is_error or status >= 400):
        return _api_message(status, text)
    if subtype == "error_max_turns" or terminal == "max_turns":
        at = f" after {turns} turns" if turns is not None else ""
        return Verdict.MAX_TURNS, (f"the run stopped at its --max-turns limit{at} before it "
                                   "finished; raise --max-turns or split the task")
    if is_error:
        if _TIMEOUT_TEXT.search(text):
            return Verdict.TIMEOUT, ("the API request timed out (the endpoint did not answer); "
                                     "check the endpoint, or raise API_TIMEOUT_MS, then retry")
        found = _API_STATUS_IN_TEXT.search(text)
        if found:
            return _api_message(int(found.group(1)), text)
        if _UNREACHABLE_TEXT.search(text):
            return Verdict.UNREACHABLE, f"the endpoint could not be reached ({_clip(text)})"
        if _CUT_TEXT.search(text):
            return Verdict.UNREACHABLE, ("the connection to the endpoint (or the gateway) "
                                         f"closed mid-answer ({_clip(text)})")
        what = _clip(text) if text.strip() else (_clip(subtype, 60) or "no detail")
        return Verdict.CRASHED, f"claude reported an error: {what}; see the run's log"
    if subtype and subtype != "success":
        return Verdict.CRASHED, (f"claude ended with {_clip(subtype, 60)!r}"
                                 + (f": {_clip(text)}" if text.strip() else "")
                                 + "; see the run's log")
    if exit_code is not None and exit_code != 0:
        return Verdict.CRASHED, (f"claude exited with code {exit_code} although its result "
                                 "reports success; see the run's stderr log")
    if not text.strip():
        return Verdict.EMPTY, ("the run finished but returned no result text; read its log, "
                               "then retry or make the prompt ask for a final answer")
    done = f" in {turns} turns" if turns is not None else ""
    message = f"finished{done}: {_clip(text, 100)}"
    denials = result.get("permission_denials")
    if isinstance(denials, list) and denials:
        names = sorted({_clip(name, 40) if isinstance(name, str) else "?"
                        for name in (d.get("tool_name") for d in denials
                                     if isinstance(d, dict))})
        shown = ", ".join(names[:5]) + (", …" if len(names) > 5 else "")
        message += (f" ({len(denials)} tool call(s) denied by the permission mode: "
                    f"{shown}; check permission_mode)")
    return Verdict.OK, message


# --------------------------------------------------------------------------- find_result


def _is_result(obj: Any) -> bool:
    return isinstance(obj, dict) and (
        obj.get("type") == "result" or ("type" not in obj and "is_error" in obj))


def _from_document(obj: Any) -> dict[str, Any] | None:
    if _is_result(obj):
        return dict(obj)
    if isinstance(obj, list):  # `--output-format json --verbose` prints every message
        for item in reversed(obj):
            if _is_result(item):
                return dict(item)
    return None


def _loads(text: str) -> Any:
    """json.loads, with lone surrogates scrubbed; raises as json.loads does."""
    obj = json.loads(text)
    return scrub_surrogates(obj) if has_surrogate_escape(text) else obj


def find_result(data: bytes | str) -> dict[str, Any] | None:
    """The result object of `--output-format json` or stream-json output, else None.

    stream-json: the LAST line whose type is "result"; malformed lines (and lines nested
    too deep to decode) are skipped. Never raises.
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        text = bytes(data).decode("utf-8", "replace")
    elif isinstance(data, str):
        text = data
    else:
        return None
    stripped = text.strip()
    if not stripped:
        return None
    # one document (`--output-format json`, compact or indented, or its --verbose list);
    # stream-json has an object at the start of each line, and is read line by line below
    if stripped[0] == "[" or "\n{" not in stripped:
        try:
            found = _from_document(_loads(text))
        except Exception:  # ValueError (not one document, a huge int), RecursionError
            found = None
        if found is not None:
            return found
    end = len(text)
    while end > 0:
        start = text.rfind("\n", 0, end) + 1
        line = text[start:end].strip()
        end = start - 1
        if not line.startswith("{") or '"result"' not in line:
            continue
        try:
            obj = _loads(line)
        except Exception:  # not JSON or a huge int (ValueError), nested too deep
            continue
        if _is_result(obj):
            return dict(obj)
    return None
