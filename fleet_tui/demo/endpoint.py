"""A scripted Anthropic-compatible endpoint on 127.0.0.1, for the demo and the tests.

The real `claude` binary talks to it exactly as it would to the real API: `POST
/v1/messages?beta=true` with `"stream": true`, answered with the standard SSE sequence.
What it answers is a *script*: a list of turns, each a list of content blocks (`text`,
`tool_use`, `thinking`) or a final text. Which turn to play is read from the request (the
number of assistant messages already in `messages`), so the endpoint keeps no per-session
state and any number of workers can play at once. Each worker picks its script with a
`[script:NAME]` marker in its prompt (no marker: the default script).

`{cwd}` in a script is replaced by the worker's working directory. The CLI states it in
its system prompt (`Primary working directory: /path`, checked against CLI 2.1.197); we
look there first, then in the messages (system reminders), and leave `.` when neither
says it.

A value `{"$from_results": REGEX}` in a tool call's input is taken from the tool results
the conversation holds (see `_from_results`): a script plays an orchestrator that passes
on the ids an earlier tool call made.

Faults (HTTP errors for the first N requests, a hang, a connection dropped mid-stream) and
a per-event delay make the failure paths and a human-speed demo reproducible. Provider
modes answer as z.ai does (HTTP 429 and `{"error": {"code": "1308", "message": ...}}`):
`zai` (one business code), `window` (a usage window that closes after N successful
answers and opens again at a given time, its reset time written without a zone, in
Beijing time by default) and `concurrency` (code 1302 while more than N answers are in
flight); any fault can start only after N successful answers (`after_ok`). Every request
is recorded (never a credential: only whether one came, its kind, and its sha256), and
every CONNECT is refused and recorded, so a second instance can stand as `HTTPS_PROXY` and
prove that nothing tries to leave the machine.

Observed with CLI 2.1.197, and mirrored here: the CLI sends `HEAD /` once before its first
call (answered 200, kept in `.probes`, not `.requests`); it honours `x-should-retry` (a 401
without `x-should-retry: false` is retried like a 5xx, so error faults send the header the
real API sends); after a stream cut mid-way it retries once with a non-streaming request
(the JSON form below); with HTTP(S)_PROXY set it sends absolute-form requests for http://
and CONNECT for https://, both of which a second instance refuses and records.

Standard library only; the server runs in a background thread so that sync and async code
can both use it.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import http.server
import json
import math
import os
import re
import selectors
import shlex
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Literal, cast
from urllib.parse import urlsplit

from fleet_tui.core.errors import EXIT_USAGE, FleetTuiError

__all__ = [
    "DEFAULT_SCRIPT",
    "Fault",
    "RecordedRequest",
    "Script",
    "ScriptError",
    "ScriptedEndpoint",
    "ToolResultRecord",
    "edit_and_commit_turns",
    "find_cwd",
    "find_script_marker",
    "load_scripts",
    "main",
    "parse_fault",
    "resolve_conflict_turns",
    "resolve_rebase_turns",
]

DEFAULT_SCRIPT = "default"
MARKER_RE = re.compile(r"\[script:([A-Za-z0-9_.\-]+)\]")
# The CLI's system prompt has "Primary working directory: /path" (2.1.x); older builds
# said "Working directory: /path". Both end at the line break.
_CWD_RES = (
    re.compile(r"Primary working directory:\s*(\S[^\n]*)"),
    re.compile(r"(?<![A-Za-z])Working directory:\s*(\S[^\n]*)"),
)

ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    529: "overloaded_error",
}
ERROR_MESSAGES: dict[int, str] = {
    401: "invalid x-api-key",
    403: "permission denied",
    429: "Number of request tokens has exceeded your per-minute rate limit",
    500: "Internal server error",
    529: "Overloaded",
}


class ScriptError(FleetTuiError, ValueError):
    """A script or fault description is malformed; the message says where and how. A usage
    error (exit 2); still a ValueError for the callers that read a value with it."""

    exit_code = EXIT_USAGE
    title = "Bad script"


# --------------------------------------------------------------------------- scripts


Block = dict[str, Any]
Turn = list[Block]


def _normalize_block(raw: object, where: str) -> Block:
    if isinstance(raw, str):
        return {"type": "text", "text": raw}
    if not isinstance(raw, dict):
        raise ScriptError(f"{where}: a content block must be an object or a string, "
                          f"not {type(raw).__name__}")
    kind = raw.get("type")
    if kind == "text":
        if not isinstance(raw.get("text"), str):
            raise ScriptError(f"{where}: a text block needs a string \"text\"")
        return {"type": "text", "text": raw["text"]}
    if kind == "tool_use":
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise ScriptError(f"{where}: a tool_use block needs a \"name\" (e.g. \"Bash\")")
        tool_input = raw.get("input", {})
        if not isinstance(tool_input, dict):
            raise ScriptError(f"{where}: tool_use \"input\" must be an object")
        return {"type": "tool_use", "name": name, "input": tool_input}
    if kind == "thinking":
        if not isinstance(raw.get("thinking"), str):
            raise ScriptError(f"{where}: a thinking block needs a string \"thinking\"")
        return {"type": "thinking", "thinking": raw["thinking"]}
    raise ScriptError(f"{where}: unknown block type {kind!r} "
                      "(use \"text\", \"tool_use\" or \"thinking\")")


def _normalize_turn(raw: object, where: str) -> Turn:
    if isinstance(raw, str):
        return [{"type": "text", "text": raw}]
    if isinstance(raw, dict):
        return [_normalize_block(raw, where)]
    if not isinstance(raw, list) or not raw:
        raise ScriptError(f"{where}: a turn is a final text or a non-empty list of blocks")
    return [_normalize_block(b, f"{where}, block {j + 1}") for j, b in enumerate(raw)]


@dataclass(frozen=True)
class Fault:
    """One injected failure, applied to the next `times` requests it matches.

    kind: "error" (HTTP `status` with an Anthropic error body), "hang" (no answer until
    the client gives up or the endpoint stops; with `after_events`, hangs mid-stream),
    "drop" (closes the connection after `after_events` SSE events).
    `times` None means every matching request; `turn` limits it to one turn.
    `should_retry` sets the `x-should-retry` header (default: like the real API, true
    for 408/409/429/5xx, false otherwise).

    Provider modes, answered with z.ai's body `{"error": {"code", "message"}}` and HTTP
    `status` (default 429), no x-should-retry (z.ai sends none): "zai" (business `code`,
    its message the docs' words unless `message` is given), "window" (code 1308 unless
    told: closed from the moment it has `after_ok` answers behind it, until `until` or
    for `seconds`; its message names the reset time as z.ai does, without a zone, in
    UTC`zone`; `{reset}` in a `message` is that time) and "concurrency" (code 1302 while
    `limit` answers are in flight already; with `hold` seconds, each answer it lets
    through waits until it has refused one request, at most that long, so that a test
    meets it whatever the load: the answers are in flight together). Their `times`
    default to every request.
    """

    kind: Literal["error", "hang", "drop", "zai", "window", "concurrency"]
    status: int = 0
    times: int | None = 1
    retry_after: float | None = None
    message: str | None = None
    after_events: int | None = None
    turn: int | None = None
    should_retry: bool | None = None
    # provider modes (z.ai's body); a fault of any kind may wait for `after_ok` answers
    code: str | None = None  # zai, window, concurrency: the business code
    after_ok: int | None = None  # applies only once this many requests were answered 200
    seconds: float | None = None  # window: how long it stays closed once it closes
    until: float | None = None  # window: when it opens again (epoch seconds)
    zone: float = 8.0  # window: the UTC offset (hours) its reset time is written in
    limit: int | None = None  # concurrency: answers in flight allowed at once
    hold: float | None = None  # concurrency: answers wait (up to this) until it fired


def parse_fault(raw: object, where: str = "fault") -> Fault:
    """A fault from a script file or the command line.

    Accepts an object (`{"status": 529, "times": 2}`, `{"kind": "hang"}`,
    `{"kind": "drop", "after_events": 3}`), a status number, or a short string:
    `529`, `529x2`, `429x3`, `hang`, `drop`, `dropx2`.
    """
    if isinstance(raw, Fault):
        return raw
    if isinstance(raw, bool):
        raise ScriptError(f"{where}: expected a fault, got {raw!r}")
    if isinstance(raw, int):
        return Fault(kind="error", status=raw)
    if isinstance(raw, str) and raw.strip().startswith("{"):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise ScriptError(f"{where}: cannot read fault {raw!r} as JSON: {exc}") from None
        return parse_fault(raw, where)
    if isinstance(raw, str):
        m = re.fullmatch(r"\s*(\d{3}|hang|drop)\s*(?:[x*]\s*(\d+|inf))?\s*", raw)
        if not m:
            raise ScriptError(f"{where}: cannot read fault {raw!r} "
                              "(examples: 529, 529x2, 429x3, hang, drop)")
        head, count = m.group(1), m.group(2)
        times = None if count == "inf" else int(count or 1)
        if head.isdigit():
            return Fault(kind="error", status=int(head), times=times)
        return Fault(kind=cast(Literal["hang", "drop"], head), times=times)
    if not isinstance(raw, dict):
        raise ScriptError(f"{where}: a fault is an object, a status code or a string")
    known = {"kind", "status", "times", "retry_after", "message", "after_events", "turn",
             "should_retry", "code", "after_ok", "seconds", "until", "zone", "limit",
             "hold"}
    unknown = set(raw) - known
    if unknown:
        raise ScriptError(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
    kind = raw.get("kind", "error" if "status" in raw else None)
    if kind in PROVIDER_KINDS:
        return _parse_provider_fault(raw, kind, where)
    if kind not in ("error", "hang", "drop"):
        raise ScriptError(f"{where}: \"kind\" must be error, hang, drop, zai, window or "
                          f"concurrency (got {kind!r})")
    status = raw.get("status", 0)
    if kind == "error" and (not isinstance(status, int) or not 400 <= status <= 599):
        raise ScriptError(f"{where}: an error fault needs an HTTP \"status\" 400-599")
    times = raw.get("times", 1)
    if times is not None and (not isinstance(times, int) or times < 0):
        raise ScriptError(f"{where}: \"times\" must be a count >= 0 or null (always)")
    for key in ("after_events", "turn"):
        val = raw.get(key)
        if val is not None and (not isinstance(val, int) or val < 0):
            raise ScriptError(f"{where}: \"{key}\" must be a whole number >= 0")
    retry_after = raw.get("retry_after")
    if retry_after is not None and not isinstance(retry_after, int | float):
        raise ScriptError(f"{where}: \"retry_after\" must be seconds")
    should_retry = raw.get("should_retry")
    if should_retry is not None and not isinstance(should_retry, bool):
        raise ScriptError(f"{where}: \"should_retry\" must be true or false")
    message = raw.get("message")
    if message is not None and not isinstance(message, str):
        raise ScriptError(f"{where}: \"message\" must be a string")
    after_ok = raw.get("after_ok")
    if after_ok is not None and (isinstance(after_ok, bool) or not isinstance(after_ok, int)
                                 or after_ok < 0):
        raise ScriptError(f"{where}: \"after_ok\" must be a whole number >= 0")
    return Fault(kind=kind, status=status, times=times,
                 retry_after=None if retry_after is None else float(retry_after),
                 message=message, after_events=raw.get("after_events"), turn=raw.get("turn"),
                 should_retry=should_retry, after_ok=after_ok)


PROVIDER_KINDS = ("zai", "window", "concurrency")
# z.ai's messages for the codes the provider modes play (docs.z.ai, "API error codes";
# 1310-1313 as clients have recorded them); {reset} is a window's reset time
ZAI_MESSAGES: dict[str, str] = {
    "1002": "Authorization Token is invalid, please ensure that the Authorization Token is "
            "correctly provided.",
    "1113": "Your account is in arrears, please recharge and try again",
    "1302": "High concurrency usage of this API, please reduce concurrency or contact "
            "customer service to increase limits",
    "1303": "High frequency usage of this API, please reduce frequency or contact customer "
            "service to increase limits",
    "1308": "Usage limit reached for 5 hour. Your limit will reset at {reset}",
    "1309": "Your GLM Coding Plan package has expired and is temporarily unavailable. You "
            "can resume using it after renewing the subscription on the official website. "
            "https://z.ai/subscribe",
    "1310": "Weekly/Monthly Limit Exhausted. Your limit will reset at {reset}",
    "1311": "The current subscription plan does not yet include access to this model",
    "1312": "The model is currently experiencing high traffic. Please try again later or "
            "switch to another model.",
    "1313": "Your account's current usage pattern does not comply with the Fair Use "
            "Policy, and its request frequency has been restricted.",
}


def _parse_provider_fault(raw: Mapping[str, Any], kind: str, where: str) -> Fault:
    """A zai, window or concurrency fault from its object (see Fault)."""
    default_code = {"zai": None, "window": "1308", "concurrency": "1302"}[kind]
    code = raw.get("code", default_code)
    if isinstance(code, int) and not isinstance(code, bool):
        code = str(code)
    if not isinstance(code, str) or not re.fullmatch(r"\d{4}", code):
        raise ScriptError(f"{where}: a {kind} fault needs a 4-digit business \"code\" "
                          "(e.g. \"1308\")")
    message = raw.get("message")
    if message is None and code not in ZAI_MESSAGES:
        raise ScriptError(f"{where}: no message known for code {code}; give \"message\"")
    if message is not None and not isinstance(message, str):
        raise ScriptError(f"{where}: \"message\" must be a string")
    status = raw.get("status", 429)
    if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
        raise ScriptError(f"{where}: \"status\" must be an HTTP error status 400-599")
    times = raw.get("times")
    if times is not None and (isinstance(times, bool) or not isinstance(times, int)
                              or times < 0):
        raise ScriptError(f"{where}: \"times\" must be a count >= 0 or null (always)")
    numbers: dict[str, float | None] = {}
    for key in ("seconds", "until", "zone", "hold"):
        value = raw.get(key)
        if value is not None and (isinstance(value, bool)
                                  or not isinstance(value, int | float)):
            raise ScriptError(f"{where}: \"{key}\" must be a number")
        numbers[key] = None if value is None else float(value)
    for key in ("after_ok", "limit", "turn"):
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            raise ScriptError(f"{where}: \"{key}\" must be a whole number >= 0")
    if kind == "window" and numbers["seconds"] is None and numbers["until"] is None:
        raise ScriptError(f"{where}: a window fault needs \"seconds\" or \"until\" (when "
                          "it opens again)")
    if kind == "concurrency" and raw.get("limit") is None:
        raise ScriptError(f"{where}: a concurrency fault needs \"limit\" (answers in "
                          "flight allowed at once)")
    return Fault(kind=cast(Literal["zai", "window", "concurrency"], kind), status=status,
                 times=times, message=message, code=code, after_ok=raw.get("after_ok"),
                 seconds=numbers["seconds"], until=numbers["until"],
                 zone=8.0 if numbers["zone"] is None else numbers["zone"],
                 limit=raw.get("limit"), turn=raw.get("turn"), hold=numbers["hold"])


@dataclass(frozen=True)
class Listen:
    """A script's wait for the user's message (Script.listen)."""

    at: int
    wait: Turn
    heard: list[Turn]
    times: int = 12
    seconds: float = 10.0

    @classmethod
    def from_data(cls, name: str, raw: object) -> Listen:
        where = f"script {name!r}, listen"
        if not isinstance(raw, dict) or set(raw) - {"at", "wait", "heard", "times",
                                                    "seconds"}:
            raise ScriptError(f"{where}: expected an object with at, wait, heard, times, "
                              "seconds")
        at, times, seconds = raw.get("at"), raw.get("times", 12), raw.get("seconds", 10.0)
        if isinstance(at, bool) or not isinstance(at, int) or at < 0 \
                or isinstance(times, bool) or not isinstance(times, int) or times < 1:
            raise ScriptError(f"{where}: \"at\" is a turn index >= 0, \"times\" >= 1")
        if not isinstance(seconds, int | float) or seconds < 0:
            raise ScriptError(f"{where}: \"seconds\" must be >= 0")
        heard = raw.get("heard")
        if not isinstance(heard, list):
            raise ScriptError(f"{where}: \"heard\" must be a list of turns")
        return cls(at=at, wait=_normalize_turn(raw.get("wait"), f"{where}, wait"),
                   heard=[_normalize_turn(t, f"{where}, heard {i + 1}")
                          for i, t in enumerate(heard)],
                   times=times, seconds=float(seconds))

    def place(self, turn: int, heard_at: int | None) -> tuple[str, int]:
        """What answer `turn` (assistant messages so far) plays: ("wait", n), ("heard", i)
        or ("turn", index into the script's turns and follow-up); `heard_at`: the number
        of assistant messages before the user's message, None while there is none."""
        if turn < self.at:
            return "turn", turn
        waits = self.times if heard_at is None else max(0, min(heard_at - self.at,
                                                               self.times))
        if turn < self.at + waits:
            return "wait", turn - self.at
        past = turn - self.at - waits
        if heard_at is not None:
            if past < len(self.heard):
                return "heard", past
            past -= len(self.heard)
        return "turn", self.at + past


@dataclass
class Script:
    """A named list of turns, with its own faults and optional per-event delay."""

    name: str
    turns: list[Turn]
    faults: list[Fault] = field(default_factory=list)
    delay: float | None = None
    # Played after the script's own turns, when the session is resumed with a new prompt
    # (a follow-up). `{prompt}` in them is that prompt's first line.
    followup: list[Turn] = field(default_factory=list)
    # Count only the turns this endpoint answered: CLI 2.1.197 puts a filler answer of its
    # own ("No response requested.") into a session it resumes after an interrupted turn,
    # which would otherwise count as one (2.1.332 does not).
    real_turns: bool = False
    # A worker that waits for the user's message (`fleet-tui say`, `s` in the panel): from
    # turn `at` on, it plays `wait` (each answer held `seconds`, paced) until a message of
    # the user's is in the conversation, at most `times` turns; then the `heard` turns
    # (`{message}`: the message's first line), then the rest of its turns.
    listen: Listen | None = None

    @classmethod
    def from_data(cls, name: str, data: object) -> Script:
        """Build from a bare list of turns or `{"turns", "faults", "delay"}`."""
        if isinstance(data, Script):
            return data
        faults: list[Fault] = []
        delay: float | None = None
        followup: list[Turn] = []
        real_turns = False
        listen: Listen | None = None
        if isinstance(data, dict):
            unknown = set(data) - {"turns", "faults", "delay", "description", "followup",
                                   "real_turns", "listen"}
            if unknown:
                raise ScriptError(f"script {name!r}: unknown key(s) {sorted(unknown)}; "
                                  "known: turns, faults, delay, followup, real_turns, "
                                  "listen, description")
            if data.get("listen") is not None:
                listen = Listen.from_data(name, data["listen"])
            real_turns = data.get("real_turns", False)
            if not isinstance(real_turns, bool):
                raise ScriptError(f"script {name!r}: \"real_turns\" must be true or false")
            raw_followup = data.get("followup", [])
            if not isinstance(raw_followup, list):
                raise ScriptError(f"script {name!r}: \"followup\" must be a list of turns")
            followup = [_normalize_turn(t, f"script {name!r}, followup turn {i + 1}")
                        for i, t in enumerate(raw_followup)]
            raw_faults = data.get("faults", [])
            if not isinstance(raw_faults, list):
                raise ScriptError(f"script {name!r}: \"faults\" must be a list")
            faults = [parse_fault(f, f"script {name!r}, fault {i + 1}")
                      for i, f in enumerate(raw_faults)]
            raw_delay = data.get("delay")
            if raw_delay is not None:
                if not isinstance(raw_delay, int | float) or raw_delay < 0:
                    raise ScriptError(f"script {name!r}: \"delay\" must be seconds >= 0")
                delay = float(raw_delay)
            data = data.get("turns")
        if not isinstance(data, list) or not data:
            raise ScriptError(f"script {name!r}: expected a non-empty list of turns "
                              "(or an object with \"turns\")")
        turns = [_normalize_turn(t, f"script {name!r}, turn {i + 1}")
                 for i, t in enumerate(data)]
        return cls(name=name, turns=turns, faults=faults, delay=delay, followup=followup,
                   real_turns=real_turns, listen=listen)


def edit_and_commit_turns(path: str, content: str, commit: str, *,
                          done: str | None = None) -> list[Any]:
    """Turns of a worker that reads a file, writes it anew and commits: `Read`, `Write`
    (both on `{cwd}/path`), then `Bash` with ``commit`` (the git command that commits), and
    a final text. For a script's "followup": answers the merge queue's "fix the failing
    test" follow-up, or (with ``resolve_conflict_turns``) a conflict-resolution one."""
    target = "{cwd}/" + path
    return [
        [{"type": "tool_use", "name": "Read", "input": {"file_path": target}}],
        [{"type": "tool_use", "name": "Write",
          "input": {"file_path": target, "content": content}}],
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": commit, "description": f"commit {path}"}}],
        done or f"Rewrote {path} and committed it.",
    ]


def resolve_conflict_turns(path: str, content: str) -> list[Any]:
    """Turns of a worker asked to resolve an update's merge conflict in `path`: it reads
    the conflicted file, writes it resolved (``content``, free of conflict markers), stages
    it and concludes the merge with `git commit --no-edit`. For a script's "followup" (the
    follow-up fleet-tui sends with `update --resolve worker` and from the merge queue)."""
    return edit_and_commit_turns(
        path, content, f"git add -- {shlex.quote(path)} && git commit --no-edit -q && "
        "git log -1 --format=%s",
        done=f"Resolved the conflict in {path} and concluded the merge.")


def resolve_rebase_turns(path: str, content: str) -> list[Any]:
    """Turns of a worker asked to resolve a rebase that stopped on a conflict in `path`
    (update_strategy = "rebase"): it reads the file, writes it resolved, stages it and
    continues the rebase (`git rebase --continue`, the editor kept shut), as the
    follow-up asks."""
    return edit_and_commit_turns(
        path, content, f"git add -- {shlex.quote(path)} && "
        "git -c core.editor=true rebase --continue && git log -1 --format=%s",
        done=f"Resolved the conflict in {path} and continued the rebase.")


def _load_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScriptError(f"cannot read script {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ScriptError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    except UnicodeDecodeError:
        raise ScriptError(f"{path}: not UTF-8 text") from None


def load_scripts(path: str | Path) -> dict[str, Script]:
    """Scripts from a JSON file (named `default`) or a directory of `*.json` (by stem)."""
    p = Path(path).expanduser()
    if p.is_dir():
        files = sorted(p.glob("*.json"))
        if not files:
            raise ScriptError(f"{p}: no *.json scripts in this directory")
        return {f.stem: Script.from_data(f.stem, _load_json(f)) for f in files}
    if not p.exists():
        raise ScriptError(f"script file not found: {p}")
    return {DEFAULT_SCRIPT: Script.from_data(DEFAULT_SCRIPT, _load_json(p))}


def _coerce_scripts(scripts: object) -> dict[str, Script]:
    if isinstance(scripts, str | Path):
        return load_scripts(scripts)
    if isinstance(scripts, Script):
        return {scripts.name: scripts}
    if isinstance(scripts, Mapping):
        return {str(k): Script.from_data(str(k), v) for k, v in scripts.items()}
    return {DEFAULT_SCRIPT: Script.from_data(DEFAULT_SCRIPT, scripts)}


# ------------------------------------------------------------------- request reading


@dataclass(frozen=True)
class ToolResultRecord:
    """A tool_result the worker sent back (what its tool did with our tool_use)."""

    tool_use_id: str
    is_error: bool
    text: str


@dataclass(frozen=True)
class RecordedRequest:
    """What one request looked like, minus anything secret."""

    method: str
    path: str
    status: int
    model: str | None = None
    turn: int | None = None
    script: str | None = None
    stream: bool | None = None
    cwd: str | None = None
    prompt: str | None = None
    tool_results: tuple[ToolResultRecord, ...] = ()
    has_auth: bool = False
    auth_kind: str | None = None
    auth_sha256: str | None = None
    fault: str | None = None
    proxied: bool = False
    tool_use_ids: tuple[str, ...] = ()
    time: float = 0.0
    # every user and system text of the conversation, in order (the CLI's system reminders
    # and tool results left out): the prompt, and each message sent to the running worker
    # (in a user message, or, sent during a turn, in the system note the CLI relays it in)
    conversation_texts: tuple[str, ...] = ()


def _texts(content: object) -> Iterator[str]:
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for block in content:
            if isinstance(block, dict):
                if isinstance(block.get("text"), str):
                    yield block["text"]
                elif block.get("type") == "tool_result":
                    yield from _texts(block.get("content"))


def find_cwd(body: Mapping[str, Any]) -> str | None:
    """The worker's working directory as the CLI states it in the request, if it does."""
    sources: list[str] = list(_texts(body.get("system")))
    for msg in body.get("messages") or []:
        if isinstance(msg, dict) and msg.get("role") in ("user", "system"):
            sources.extend(_texts(msg.get("content")))
    for regex in _CWD_RES:
        for text in sources:
            m = regex.search(text)
            if m:
                return m.group(1).strip().rstrip("/") or "/"
    return None


def _first_user_text(body: Mapping[str, Any]) -> str:
    for msg in body.get("messages") or []:
        if isinstance(msg, dict) and msg.get("role") == "user":
            return "\n".join(_texts(msg.get("content")))
    return ""


def find_script_marker(body: Mapping[str, Any]) -> str | None:
    """The NAME of a `[script:NAME]` marker in the first user message."""
    m = MARKER_RE.search(_first_user_text(body))
    return m.group(1) if m else None


def _prompt_of(body: Mapping[str, Any]) -> str:
    """The user's own prompt: the first user message minus the CLI's system reminders."""
    for msg in body.get("messages") or []:
        if isinstance(msg, dict) and msg.get("role") == "user":
            parts = [t for t in _texts(msg.get("content"))
                     if not t.lstrip().startswith("<system-reminder>")]
            return "\n".join(parts).strip()
    return ""


def _latest_prompt(body: Mapping[str, Any]) -> str:
    """First line of the newest user prompt (a follow-up's text), tool results and the
    CLI's system reminders left out."""
    whole = latest_prompt_whole(body)
    return whole.splitlines()[0] if whole else ""


def latest_prompt_whole(body: Mapping[str, Any]) -> str:
    """The newest user prompt whole (`{prompt_b64}` in a script: base64, for a tool call
    that reads it, a review's comments say)."""
    for msg in reversed(body.get("messages") or []):
        if not isinstance(msg, dict) or msg.get("role") != "user":
            continue
        content = msg.get("content")
        blocks = content if isinstance(content, list) else [content]
        texts = [t for b in blocks if not (isinstance(b, dict) and b.get("type") == "tool_result")
                 for t in _texts([b] if isinstance(b, dict) else b)
                 if not t.lstrip().startswith("<system-reminder>")]
        text = "\n".join(texts).strip()
        if text:
            return text
    return ""


def conversation_texts(body: Mapping[str, Any]) -> tuple[str, ...]:
    """Every user and system text of a request's conversation, in order, without the CLI's
    system reminders and without tool results: a message sent to a running worker shows
    here (CLI 2.1.197 relays one sent during a turn in a `system` message: "The user sent a
    new message while you were working: ...")."""
    found: list[str] = []
    for msg in body.get("messages") or []:
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "system"):
            continue
        content = msg.get("content")
        blocks = content if isinstance(content, list) else [content]
        for block in blocks:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                continue
            for text in _texts([block] if isinstance(block, dict) else block):
                if text.strip() and not text.lstrip().startswith("<system-reminder>"):
                    found.append(text.strip())
    return tuple(found)


def user_message_after_prompt(body: Mapping[str, Any]) -> tuple[int, str] | None:
    """The first message of the user's after the prompt (sent to the running worker: a
    user text, or the system note the CLI relays it in) as (assistant messages before it,
    its first line); None when there is none."""
    assistants = 0
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    first = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
    for index, msg in enumerate(messages):
        if msg.get("role") == "assistant":
            assistants += 1
            continue
        if first is None or index <= first:
            continue  # the prompt (its text blocks and the CLI's notes with it)
        content = msg.get("content")
        blocks = content if isinstance(content, list) else [content]
        for block in blocks:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                continue
            for text in _texts([block] if isinstance(block, dict) else block):
                if not text.strip() or text.lstrip().startswith("<system-reminder>"):
                    continue
                relayed = text.split(RELAYED, 1)
                if len(relayed) == 2:
                    said = relayed[1]
                elif msg.get("role") == "user":
                    said = text
                else:
                    continue  # the CLI's own notes ("Available agent types ...")
                return assistants, (said.strip().splitlines() or [""])[0]
    return None


# how CLI 2.1.197 relays a message the user sent while the worker was in a turn
RELAYED = "The user sent a new message while you were working:"


def _count_turn(body: Mapping[str, Any]) -> int:
    return sum(1 for m in body.get("messages") or []
               if isinstance(m, dict) and m.get("role") == "assistant")


CLI_FILLER = "No response requested."  # CLI 2.1.197's own answer in a resumed session


def _count_real_turns(body: Mapping[str, Any]) -> int:
    """Assistant messages, the CLI's filler answers left out (Script.real_turns)."""
    return sum(1 for m in body.get("messages") or []
               if isinstance(m, dict) and m.get("role") == "assistant"
               and "\n".join(_texts(m.get("content"))).strip() != CLI_FILLER)


def _new_tool_results(body: Mapping[str, Any]) -> tuple[ToolResultRecord, ...]:
    """tool_results after the last assistant message: the ones this turn answers."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    last_assistant = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"),
                         default=-1)
    found: list[ToolResultRecord] = []
    for msg in messages[last_assistant + 1:]:
        content = msg.get("content")
        if msg.get("role") != "user" or not isinstance(content, list):
            continue
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                found.append(ToolResultRecord(
                    tool_use_id=str(block.get("tool_use_id", "")),
                    is_error=bool(block.get("is_error", False)),
                    text="\n".join(_texts(block.get("content")))))
    return tuple(found)


def _auth_of(headers: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(kind, sha256 of the value) of the credential header; never the value itself."""
    authz = headers.get("authorization")
    api_key = headers.get("x-api-key")
    if authz:
        scheme, _, value = authz.partition(" ")
        kind = "bearer" if scheme.lower() == "bearer" else scheme.lower() or "authorization"
        if api_key:
            kind += "+x-api-key"
        return kind, hashlib.sha256((value or authz).strip().encode()).hexdigest()
    if api_key:
        return "x-api-key", hashlib.sha256(api_key.strip().encode()).hexdigest()
    return None, None


FROM_RESULTS = "$from_results"


def _tool_result_texts(body: Mapping[str, Any]) -> list[str]:
    """The text of every tool_result in the conversation, oldest first."""
    found: list[str] = []
    for msg in body.get("messages") or []:
        content = msg.get("content") if isinstance(msg, dict) else None
        if not isinstance(msg, dict) or msg.get("role") != "user" \
                or not isinstance(content, list):
            continue
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                found.append("\n".join(_texts(block.get("content"))))
    return found


def _from_results(spec: Mapping[str, Any], results: Sequence[str]) -> Any:
    """A value taken from what the tools answered earlier, so that a script can use what
    only the run knows (the ids a tool made): `{"$from_results": REGEX}` is the first match
    in the newest tool result that has one: its group `"group"` (default 1, or the whole
    match when the pattern has no group); with `"all": true`, every match in that result,
    as a list. No match: a text saying so (the tool then answers with an error the test
    sees)."""
    pattern = re.compile(str(spec[FROM_RESULTS]))
    group = spec.get("group", 1 if pattern.groups else 0)
    for text in reversed(results):
        found = [m.group(group) for m in pattern.finditer(text)]
        if found:
            return found if spec.get("all") else found[0]
    return f"(no earlier tool result matches {pattern.pattern!r})"


def _substitute(value: Any, cwd: str, prompt: str = "", whole: str = "",
                results: Sequence[str] = ()) -> Any:
    if isinstance(value, str):
        if "{prompt_b64}" in value:
            value = value.replace("{prompt_b64}",
                                  base64.b64encode(whole.encode()).decode("ascii"))
        return value.replace("{cwd}", cwd).replace("{prompt}", prompt)
    if isinstance(value, list):
        return [_substitute(v, cwd, prompt, whole, results) for v in value]
    if isinstance(value, dict):
        if FROM_RESULTS in value:
            return _from_results(value, results)
        return {k: _substitute(v, cwd, prompt, whole, results) for k, v in value.items()}
    return value


def _chunks(text: str, size: int) -> list[str]:
    """Split text into pieces of about `size` characters, at spaces where possible."""
    if len(text) <= size:
        return [text]
    out: list[str] = []
    start = 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text):
            space = text.rfind(" ", start + 1, end)
            if space > start:
                end = space + 1
        out.append(text[start:end])
        start = end
    return out


def _json_pieces(text: str) -> list[str]:
    """input_json_delta chunks: the real API sends partial JSON in several pieces."""
    if len(text) < 4:
        return [text]
    n = max(3, len(text) // 40)
    step = -(-len(text) // n)
    return [text[i:i + step] for i in range(0, len(text), step)]


# --------------------------------------------------------------------------- server


class _Dropped(Exception):
    """Raised inside a handler to cut the connection (fault or client gone)."""


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as the providers' servers: the headers and the first event go out at
    # once (with Nagle, a kept-alive client's delayed ACK held the first event ~40 ms)
    disable_nagle_algorithm = True
    server_version = "fleet-tui-scripted-endpoint"
    sys_version = ""
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the endpoint records requests itself; access logs would be noise."""

    # -- plumbing
    def _endpoint(self) -> ScriptedEndpoint:
        return self.server.endpoint

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            data = bytearray()
            while True:
                size_line = self.rfile.readline(65537)
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(data)
                data += self.rfile.read(size)
                self.rfile.readline(65537)
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send_json(self, status: int, payload: Mapping[str, Any],
                   extra: Mapping[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("request-id", _new_id("req_"))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.wfile.flush()

    def _send_error_json(self, status: int, message: str,
                         extra: Mapping[str, str] | None = None) -> None:
        self._send_json(status, {
            "type": "error",
            "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message},
            "request_id": _new_id("req_"),
        }, extra)

    # -- verbs
    def do_CONNECT(self) -> None:
        self._endpoint()._record_connect(self.path)
        self.close_connection = True
        self._send_error_json(403, "CONNECT refused: this scripted endpoint is a trap; "
                                   "nothing may leave the machine", {"connection": "close"})

    def do_HEAD(self) -> None:
        # The CLI probes `HEAD /` before its first call; answer it, count it apart.
        self._endpoint()._record_probe(self.command, self.path)
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self._not_found()

    def do_PUT(self) -> None:
        self._not_found()

    def do_DELETE(self) -> None:
        self._not_found()

    def do_PATCH(self) -> None:
        self._not_found()

    def do_OPTIONS(self) -> None:
        self._not_found()

    def do_POST(self) -> None:
        try:
            self._post()
        except (_Dropped, BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _not_found(self, body: bytes | None = None) -> None:
        if body is None and self.command in ("POST", "PUT", "PATCH"):
            self._read_body()
        split = urlsplit(self.path)
        proxied = bool(split.scheme)
        kind, digest = _auth_of({k.lower(): v for k, v in self.headers.items()})
        status = 403 if proxied else 404
        self._endpoint()._record(RecordedRequest(
            method=self.command, path=self.path, status=status, proxied=proxied,
            has_auth=kind is not None, auth_kind=kind, auth_sha256=digest, time=time.time()))
        if proxied:
            self.close_connection = True
            self._send_error_json(403, "proxy request refused: this scripted endpoint is a "
                                       "trap; nothing may leave the machine",
                                  {"connection": "close"})
        else:
            self._send_error_json(404, f"no such endpoint: {self.command} {split.path}")

    def _post(self) -> None:
        split = urlsplit(self.path)
        if split.scheme or split.path.rstrip("/") != "/v1/messages":
            self._read_body()
            self._not_found(b"")
            return
        raw = self._read_body()
        ep = self._endpoint()
        headers = {k.lower(): v for k, v in self.headers.items()}
        kind, digest = _auth_of(headers)
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError:
            ep._record(RecordedRequest(method="POST", path=self.path, status=400,
                                       has_auth=kind is not None, auth_kind=kind,
                                       auth_sha256=digest, time=time.time()))
            self._send_error_json(400, "request body must be a JSON object")
            return
        turn = _count_turn(body)
        model = body.get("model") if isinstance(body.get("model"), str) else None
        stream = bool(body.get("stream", False))
        cwd = find_cwd(body)
        marker = find_script_marker(body)
        script, problem = ep._pick_script(marker)
        if script is not None and script.real_turns:
            turn = _count_real_turns(body)
        base = RecordedRequest(
            method="POST", path=self.path, status=0, model=model, turn=turn,
            script=script.name if script else marker, stream=stream, cwd=cwd,
            prompt=_prompt_of(body), tool_results=_new_tool_results(body),
            has_auth=kind is not None, auth_kind=kind, auth_sha256=digest, time=time.time(),
            conversation_texts=conversation_texts(body))
        if script is None:
            ep._record(replace(base, status=400))
            self._send_error_json(400, problem)
            return
        fault, reserved = ep._take_fault(script, turn)
        try:
            self._respond(ep, base, script, turn, body, raw, model, stream, cwd, fault)
        finally:
            if reserved:
                ep._answering(-1)

    def _respond(self, ep: ScriptedEndpoint, base: RecordedRequest, script: Script,
                 turn: int, body: dict[str, Any], raw: bytes, model: str | None,
                 stream: bool, cwd: str | None, fault: Fault | None) -> None:
        fault_name = None
        if fault is not None:
            fault_name = (f"error:{fault.status}" if fault.kind == "error" else fault.kind)
        if fault is not None and fault.kind in PROVIDER_KINDS:
            code = fault.code or "1308"
            ep._record(replace(base, status=fault.status, fault=f"{fault.kind}:{code}"))
            self._send_json(fault.status, {"error": {
                "code": code, "message": ep._provider_message(fault, code)}})
            return
        if fault is not None and fault.kind == "error":
            ep._record(replace(base, status=fault.status, fault=fault_name))
            extra: dict[str, str] = {}
            if fault.status == 429 or fault.retry_after is not None:
                extra["retry-after"] = _fmt_seconds(
                    1.0 if fault.retry_after is None else fault.retry_after)
            # Like the real API: tells the client whether a retry can help. The CLI
            # honours it (a 401 without it is retried; with "false" it fails at once).
            extra["x-should-retry"] = "true" if _should_retry(fault) else "false"
            self._send_error_json(fault.status, fault.message
                                  or ERROR_MESSAGES.get(fault.status, "scripted error"), extra)
            return
        if fault is not None and fault.kind == "hang" and fault.after_events is None:
            ep._record(replace(base, status=0, fault=fault_name))
            ep._hang()
            raise _Dropped
        if script.listen is not None:
            blocks = self._listening(ep, script, script.listen, turn, body, cwd or ".")
        else:
            blocks = self._build_blocks(script, turn, cwd or ".", _latest_prompt(body),
                                        latest_prompt_whole(body), _tool_result_texts(body))
        ids = tuple(b["id"] for b in blocks if b["type"] == "tool_use")
        stop_reason = "tool_use" if ids else "end_turn"
        ep._record(replace(base, status=200, fault=fault_name, tool_use_ids=ids))
        message_id = _new_id("msg_")
        input_tokens = max(1, len(raw) // 4)
        output_tokens = max(1, len(json.dumps(blocks)) // 4)
        delay = script.delay if script.delay is not None else ep.event_delay
        ep._hold_answer(script)
        self._answer(stream, model, message_id, blocks, stop_reason, input_tokens,
                     output_tokens, delay, fault)

    def _answer(self, stream: bool, model: str | None, message_id: str,
                blocks: list[Block], stop_reason: str, input_tokens: int,
                output_tokens: int, delay: float, fault: Fault | None) -> None:
        ep = self._endpoint()
        if stream:
            self._stream(model or "scripted", message_id, blocks, stop_reason,
                         input_tokens, output_tokens, delay, fault)
        else:
            if fault is not None:  # drop / hang mid-answer: nothing useful is sent
                if fault.kind == "hang":
                    ep._hang()
                raise _Dropped
            if delay:
                ep._sleep(delay)
            self._send_json(200, {
                "id": message_id, "type": "message", "role": "assistant",
                "model": model or "scripted", "content": blocks,
                "stop_reason": stop_reason, "stop_sequence": None,
                "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens,
                          "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
            })
            ep._serve_usage(message_id, model or "scripted", input_tokens, output_tokens)

    def _listening(self, ep: ScriptedEndpoint, script: Script, listen: Listen, turn: int,
                   body: dict[str, Any], cwd: str) -> list[Block]:
        """The answer of a script that waits for the user's message (Script.listen)."""
        heard = user_message_after_prompt(body)
        kind, index = listen.place(turn, heard[0] if heard is not None else None)
        if kind == "wait":
            ep._sleep(listen.seconds)  # paced: tests set FLEET_ENDPOINT_PACE=0
            left = round((listen.times - index - 1) * listen.seconds)
            return self._blocks_of(listen.wait, cwd, "{left}", f"{left} s")
        if kind == "heard":
            return self._blocks_of(listen.heard[index], cwd, "{message}",
                                   heard[1] if heard is not None else "")
        return self._build_blocks(script, index, cwd, _latest_prompt(body),
                                  latest_prompt_whole(body))

    def _blocks_of(self, template: Turn, cwd: str, name: str, value: str) -> list[Block]:
        """A listen turn's blocks, `name` (`{left}`: the wait's seconds left, `{message}`:
        the user's message) replaced by `value`."""
        fixed = json.loads(json.dumps(template).replace(name, json.dumps(value)[1:-1]))
        return self._build_blocks(Script(name="listen", turns=[fixed]), 0, cwd)

    def _build_blocks(self, script: Script, turn: int, cwd: str,
                      prompt: str = "", whole: str = "",
                      results: Sequence[str] = ()) -> list[Block]:
        extra = turn - len(script.turns)
        if turn < len(script.turns):
            template = script.turns[turn]
        elif extra < len(script.followup):
            template = script.followup[extra]
        else:
            template = [{"type": "text",
                         "text": f"(script {script.name!r} has only {len(script.turns)} "
                                 f"turn(s); nothing more to do)"}]
        blocks: list[Block] = []
        for block in _substitute(template, cwd, prompt, whole, results):
            if block["type"] == "tool_use":
                block = {"type": "tool_use", "id": _new_id("toolu_"), "name": block["name"],
                         "input": block["input"]}
            elif block["type"] == "thinking":
                block = {"type": "thinking", "thinking": block["thinking"],
                         "signature": _new_id("sig_")}
            blocks.append(block)
        return blocks

    def _stream(self, model: str, message_id: str, blocks: list[Block], stop_reason: str,
                input_tokens: int, output_tokens: int, delay: float,
                fault: Fault | None) -> None:
        ep = self._endpoint()
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("request-id", _new_id("req_"))
        self.end_headers()
        sent = 0

        def emit(event: str, data: Mapping[str, Any]) -> None:
            nonlocal sent
            if fault is not None and fault.kind in ("drop", "hang"):
                limit = fault.after_events if fault.after_events is not None else 2
                if sent >= limit:
                    if fault.kind == "hang":
                        ep._hang()
                    self._abort()
            if delay and sent:
                ep._sleep(delay)
            payload = f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
            self.wfile.flush()
            sent += 1
            # what the answer states it served, as far as it was sent
            if event == "message_start":
                ep._serve_usage(message_id, model, input_tokens, 1)
            elif event == "message_delta":
                ep._serve_usage(message_id, model, input_tokens, output_tokens)

        emit("message_start", {"type": "message_start", "message": {
            "id": message_id, "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}})
        for index, block in enumerate(blocks):
            kind = block["type"]
            if kind == "text":
                emit("content_block_start", {"type": "content_block_start", "index": index,
                                             "content_block": {"type": "text", "text": ""}})
                for piece in _chunks(block["text"], 24 if delay else 400):
                    emit("content_block_delta", {"type": "content_block_delta", "index": index,
                                                 "delta": {"type": "text_delta",
                                                           "text": piece}})
            elif kind == "thinking":
                emit("content_block_start", {"type": "content_block_start", "index": index,
                                             "content_block": {"type": "thinking",
                                                               "thinking": "",
                                                               "signature": ""}})
                for piece in _chunks(block["thinking"], 24 if delay else 400):
                    emit("content_block_delta", {"type": "content_block_delta", "index": index,
                                                 "delta": {"type": "thinking_delta",
                                                           "thinking": piece}})
                emit("content_block_delta", {"type": "content_block_delta", "index": index,
                                             "delta": {"type": "signature_delta",
                                                       "signature": block["signature"]}})
            else:
                emit("content_block_start", {"type": "content_block_start", "index": index,
                                             "content_block": {"type": "tool_use",
                                                               "id": block["id"],
                                                               "name": block["name"],
                                                               "input": {}}})
                for piece in _json_pieces(json.dumps(block["input"])):
                    emit("content_block_delta", {"type": "content_block_delta", "index": index,
                                                 "delta": {"type": "input_json_delta",
                                                           "partial_json": piece}})
            emit("content_block_stop", {"type": "content_block_stop", "index": index})
        emit("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                               "usage": {"output_tokens": output_tokens}})
        emit("message_stop", {"type": "message_stop"})
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _abort(self) -> None:
        """Cut the connection mid-stream, as a crashed proxy or server would."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)
        raise _Dropped


def _should_retry(fault: Fault) -> bool:
    if fault.should_retry is not None:
        return fault.should_retry
    return fault.status in (408, 409, 429) or fault.status >= 500


def _fmt_seconds(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False
    request_queue_size = 64  # a fleet of workers may connect at the same moment

    def __init__(self, address: tuple[str, int], endpoint: ScriptedEndpoint) -> None:
        self.endpoint = endpoint
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.endpoint._track(request, add=True)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        self.endpoint._track(request, add=False)
        super().shutdown_request(request)


# ------------------------------------------------------------------------- endpoint


PACE_ENV = "FLEET_ENDPOINT_PACE"


def _pace(raw: str | None) -> float:
    """FLEET_ENDPOINT_PACE as a factor >= 0 (unset or unreadable: 1, the scripts' pace)."""
    try:
        value = float(raw) if raw else 1.0
    except ValueError:
        return 1.0
    return value if math.isfinite(value) and value >= 0 else 1.0


class ScriptedEndpoint:
    """The scripted endpoint; use as a (sync or async) context manager.

    `scripts`: a list of turns (the default script), a `Script`, a mapping of name to
    turns / script object, or a path to a JSON file or a directory of them.
    `faults`: global faults, consumed before a script's own faults.
    """

    def __init__(self, scripts: object = None, *, event_delay: float = 0.0, port: int = 0,
                 host: str = "127.0.0.1", faults: Iterable[object] = ()) -> None:
        self.scripts: dict[str, Script] = (
            {} if scripts is None else _coerce_scripts(scripts))
        self.event_delay = float(event_delay)
        # FLEET_ENDPOINT_PACE scales every per-event delay (the demo's pacing); tests of the
        # demo's scripts set 0. The events stay the same (chunking follows the unscaled
        # delay); only the waits between them shrink.
        self.pace = _pace(os.environ.get(PACE_ENV))
        self.host = host
        self._port = port
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._changed = threading.Condition(self._lock)
        self._global_faults: list[Fault] = [parse_fault(f) for f in faults]
        self._remaining: dict[int, int | None] = {}
        self._requests: list[RecordedRequest] = []
        # message id -> the usage its answer stated in what was sent of it
        self._served: dict[str, dict[str, Any]] = {}
        self._connects: list[str] = []
        self._probes: list[tuple[str, str]] = []
        self._sockets: set[socket.socket] = set()
        self._quiet_since = time.monotonic()  # when the last connection closed
        self._ok = 0  # message requests answered 200 (a fault's after_ok counts these)
        self._in_flight = 0  # answers being sent now (a concurrency fault counts these)
        self._fired: set[int] = set()  # faults that have met a request (a hold waits on it)
        self._closed_at: dict[int, float] = {}  # window faults: when each one closed
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        for fault in self._global_faults:
            self._remaining[id(fault)] = fault.times
        for script in self.scripts.values():
            for fault in script.faults:
                self._remaining[id(fault)] = fault.times

    # -- lifecycle
    def start(self) -> ScriptedEndpoint:
        """Bind (port 0 = a free one) and serve in a daemon thread."""
        if self._server is not None:
            return self
        self._stop.clear()
        self._server = _Server((self.host, self._port), self)
        self._port = self._server.server_address[1]
        self._wake = wake = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, args=(self._server, wake[0]),
                                        name=f"scripted-endpoint:{self._port}", daemon=True)
        self._thread.start()
        return self

    def _serve(self, server: _Server, wake: socket.socket) -> None:
        """serve_forever without its poll: stop() wakes the select at once (a 100 ms poll
        was the time of every stop, hundreds of times in the suite)."""
        with selectors.DefaultSelector() as selector:
            selector.register(server, selectors.EVENT_READ)
            selector.register(wake, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _ in selector.select():
                    if key.fileobj is server and not self._stop.is_set():
                        # what serve_forever calls: accept one, hand it to a thread
                        server._handle_request_noblock()  # type: ignore[attr-defined]
                server.service_actions()

    def stop(self) -> None:
        """Stop serving, release hanging handlers, close open connections."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stop.set()
        wake, self._wake = self._wake, None
        if wake is not None:
            with contextlib.suppress(OSError):
                wake[1].send(b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        server.server_close()
        for end in wake or ():
            end.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> ScriptedEndpoint:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    async def __aenter__(self) -> ScriptedEndpoint:
        return self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        import asyncio

        await asyncio.to_thread(self.stop)

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT`, the value for ANTHROPIC_BASE_URL (and a proxy URL)."""
        if self._server is None:
            raise RuntimeError("the endpoint is not started; use it as a context manager")
        return f"http://{self.host}:{self._port}"

    # -- configuration at runtime
    def set_faults(self, faults: Iterable[object], *, script: str | None = None) -> None:
        """Replace the global faults (or one script's) with fresh counters."""
        parsed = [parse_fault(f) for f in faults]
        with self._lock:
            if script is None:
                self._global_faults = parsed
            else:
                if script not in self.scripts:
                    raise KeyError(f"no script named {script!r}")
                self.scripts[script].faults = parsed
            for fault in parsed:
                self._remaining[id(fault)] = fault.times

    def clear_faults(self) -> None:
        with self._lock:
            self._global_faults = []
            for s in self.scripts.values():
                s.faults = []

    # -- what happened
    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every recorded request (HEAD probes and CONNECTs apart)."""
        with self._lock:
            return list(self._requests)

    @property
    def connects(self) -> list[str]:
        """Targets of refused CONNECTs (`host:port`)."""
        with self._lock:
            return list(self._connects)

    @property
    def probes(self) -> list[tuple[str, str]]:
        """(method, path) of HEAD probes the CLI sends before its first call."""
        with self._lock:
            return list(self._probes)

    def _serve_usage(self, message_id: str, model: str, input_tokens: int,
                     output_tokens: int) -> None:
        with self._lock:
            self._served[message_id] = {"model": model, "input_tokens": input_tokens,
                                        "output_tokens": output_tokens}

    def served(self) -> list[dict[str, Any]]:
        """The usage each answer stated in what was sent of it (a stream cut after its
        `message_start`: the input and 1 output token), in the order they began: what a
        provider bills, to compare with a meter."""
        with self._lock:
            return [dict(v) for v in self._served.values()]

    def message_requests(self, script: str | None = None) -> list[RecordedRequest]:
        """Recorded `POST /v1/messages` requests, optionally of one script."""
        return [r for r in self.requests
                if r.method == "POST" and not r.proxied
                and urlsplit(r.path).path.rstrip("/") == "/v1/messages"
                and (script is None or r.script == script)]

    def wait_for(self, count: int, timeout: float = 10.0) -> list[RecordedRequest]:
        """Wait until at least `count` requests were recorded; raise TimeoutError if not."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(self._requests)} request(s) recorded, "
                                       f"wanted {count} within {timeout} s")
                self._changed.wait(left)
            return list(self._requests)

    # -- used by the handler
    def _pick_script(self, marker: str | None) -> tuple[Script | None, str]:
        with self._lock:
            if marker is not None:
                found = self.scripts.get(marker)
                if found is None:
                    return None, (f"unknown script {marker!r} in the [script:NAME] marker; "
                                  f"known: {', '.join(sorted(self.scripts)) or 'none'}")
                return found, ""
            if DEFAULT_SCRIPT in self.scripts:
                return self.scripts[DEFAULT_SCRIPT], ""
            if self.scripts:
                return next(iter(self.scripts.values())), ""
            return None, "the scripted endpoint has no scripts loaded"

    def _take_fault(self, script: Script, turn: int) -> tuple[Fault | None, bool]:
        """The fault this request meets (None: it is answered as scripted), and whether it
        holds a place among the answers in flight (then the caller gives it back with
        `_answering(-1)` once the answer is sent). Taken under one lock with the
        concurrency check, so two requests arriving together never both see a free
        place that only one of them has."""
        with self._lock:
            fault = self._find_fault(script, turn)
            answered = fault is None or not (
                fault.kind in PROVIDER_KINDS or fault.kind == "error"
                or (fault.kind == "hang" and fault.after_events is None))
            if answered:
                self._in_flight += 1
            return fault, answered

    def _hold_answer(self, script: Script) -> None:
        """A concurrency fault with `hold`: wait until it has refused a request (each
        refusal notifies), at most `hold` seconds, or until the endpoint stops."""
        holds = [f for f in [*self._global_faults, *script.faults]
                 if f.kind == "concurrency" and f.hold]
        if not holds:
            return
        deadline = time.monotonic() + max(f.hold or 0.0 for f in holds)
        with self._changed:
            while not self._stop.is_set() and not all(id(f) in self._fired for f in holds):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._changed.wait(min(left, 0.5))

    def _find_fault(self, script: Script, turn: int) -> Fault | None:
        """(Under the lock.)"""
        for fault in [*self._global_faults, *script.faults]:
            if fault.turn is not None and fault.turn != turn:
                continue
            if fault.after_ok is not None and self._ok < fault.after_ok:
                continue
            if fault.kind == "window" and not self._window_closed(fault):
                continue
            if fault.kind == "concurrency" and self._in_flight < (fault.limit or 0):
                continue
            left = self._remaining.get(id(fault), fault.times)
            if left is None or left > 0:
                if left is not None:
                    self._remaining[id(fault)] = left - 1
                self._fired.add(id(fault))
                self._changed.notify_all()
                return fault
        return None

    def _record(self, request: RecordedRequest) -> None:
        with self._changed:
            self._requests.append(request)
            if request.status == 200 and request.method == "POST":
                self._ok += 1
            self._changed.notify_all()

    def _window_closed(self, fault: Fault) -> bool:
        """A window fault is closed from the request that first finds its `after_ok`
        answers behind it, until `until` (or for `seconds`). Called with the lock held."""
        now = time.time()
        closed = self._closed_at.setdefault(id(fault), now)
        return now < self._window_end(fault, closed)

    @staticmethod
    def _window_end(fault: Fault, closed: float) -> float:
        """When the window opens again: `until`, else `seconds` after it closed, on a whole
        second (the reset time is written to the second)."""
        end = fault.until if fault.until is not None else closed + (fault.seconds or 0.0)
        return float(math.ceil(end))

    def window_reset(self, fault_index: int = 0) -> float | None:
        """When the `fault_index`-th global window fault opens again (None: not closed
        yet), for tests that wait for it."""
        with self._lock:
            windows = [f for f in self._global_faults if f.kind == "window"]
            if fault_index >= len(windows) or id(windows[fault_index]) not in self._closed_at:
                return None
            fault = windows[fault_index]
            return self._window_end(fault, self._closed_at[id(fault)])

    def _provider_message(self, fault: Fault, code: str) -> str:
        """The message of a provider fault: its own, or z.ai's words for the code, with a
        window's reset time written as z.ai writes it (no zone, in UTC`zone`)."""
        text = fault.message if fault.message is not None else ZAI_MESSAGES.get(code, "")
        if "{reset}" not in text:
            return text
        with self._lock:
            closed = self._closed_at.get(id(fault), time.time())
        end = self._window_end(fault, closed) if fault.kind == "window" \
            else time.time() + 5 * 3600
        zone = timezone(timedelta(hours=fault.zone))
        return text.replace("{reset}", datetime.fromtimestamp(end, zone).strftime(
            "%Y-%m-%d %H:%M:%S"))

    def _answering(self, delta: int) -> None:
        with self._changed:
            self._in_flight += delta
            self._changed.notify_all()

    def wait_answered(self, timeout: float = 10.0) -> bool:
        """Wait until no answer is being sent (a client may have read an answer's last
        bytes before its handler has let go of its place in flight); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def _record_connect(self, target: str) -> None:
        with self._lock:
            self._connects.append(target)

    def _record_probe(self, method: str, path: str) -> None:
        with self._lock:
            self._probes.append((method, path))

    def _track(self, sock: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._sockets.add(sock)
            else:
                self._sockets.discard(sock)
            self._quiet_since = time.monotonic()

    def idle_for(self) -> float:
        """Seconds since the last client connection closed; 0 while any is open."""
        with self._lock:
            return 0.0 if self._sockets else time.monotonic() - self._quiet_since

    def _hang(self) -> None:
        """Block until the endpoint stops (a hung upstream, for client timeouts)."""
        self._stop.wait()

    def _sleep(self, seconds: float) -> None:
        if self._stop.wait(seconds * self.pace):
            raise _Dropped


# ------------------------------------------------------------------------------ CLI


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m fleet_tui.demo.endpoint",
        description="Serve a scripted Anthropic-compatible endpoint on 127.0.0.1. Prints "
                    "its URL, then serves until interrupted (Ctrl-C or SIGTERM).")
    parser.add_argument("--script", required=True, metavar="FILE",
                        help="a JSON script, or a directory of *.json scripts (by name)")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument("--delay", type=float, default=0.0, metavar="SECONDS",
                        help="pause between SSE events, for a human-speed demo")
    parser.add_argument("--fault", action="append", default=[], metavar="SPEC",
                        help="global fault: 529, 529x2, 429x3, 401, hang, drop, or a JSON "
                             "object such as '{\"kind\": \"window\", \"seconds\": 60}' "
                             "(repeatable)")
    parser.add_argument("--port-file", type=Path, default=None, metavar="FILE",
                        help="once listening, write the URL to FILE (atomically; removed "
                             "again on exit), for a parent that started it detached")
    parser.add_argument("--idle-exit", type=float, default=0.0, metavar="SECONDS",
                        help="exit once no client has been connected for SECONDS "
                             "(default: serve until stopped)")
    return parser.parse_args(list(argv))


def _write_port_file(path: Path, url: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(url + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _remove_port_file(path: Path, url: str) -> None:
    """Remove the port file if it is still ours (a newer instance may have replaced it)."""
    with contextlib.suppress(OSError):
        if path.read_text(encoding="utf-8").strip() == url:
            path.unlink()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m fleet_tui.demo.endpoint`."""
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    if not 0 <= args.port <= 65535:
        print(f"endpoint: --port must be 0-65535 (got {args.port})", file=sys.stderr)
        return 2
    try:
        endpoint = ScriptedEndpoint(args.script, event_delay=max(0.0, args.delay),
                                    port=args.port, faults=args.fault)
    except FleetTuiError as exc:  # a malformed script or fault: its message and code
        print(f"endpoint: {exc}", file=sys.stderr)
        return exc.exit_code
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            endpoint.start()
        except OSError as exc:
            print(f"endpoint: cannot listen on 127.0.0.1:{args.port}: {exc.strerror or exc}",
                  file=sys.stderr)
            return 2
        url = endpoint.url
        if args.port_file is not None:
            try:
                _write_port_file(args.port_file, url)
            except OSError as exc:
                print(f"endpoint: cannot write --port-file {args.port_file}: "
                      f"{exc.strerror or exc}", file=sys.stderr)
                return 2
        print(url, flush=True)
        print(f"endpoint: scripts {', '.join(sorted(endpoint.scripts))}; "
              "stop with Ctrl-C", file=sys.stderr, flush=True)
        while not done.wait(0.5):
            if args.idle_exit > 0 and endpoint.idle_for() >= args.idle_exit:
                print(f"endpoint: no client for {_fmt_seconds(args.idle_exit)} s; exiting",
                      file=sys.stderr, flush=True)
                break
    finally:
        if args.port_file is not None and endpoint.port:
            _remove_port_file(args.port_file, f"http://{endpoint.host}:{endpoint.port}")
        endpoint.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
