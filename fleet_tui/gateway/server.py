"""The gateway process: `python -m fleet_tui.gateway.server --keys-fd N --db DB --folder DIR`.

Detached (control.ensure starts it; any engine starts it again when it died). It reads its
endpoints and their keys once from an inherited pipe (never argv, never its environment:
a worker's Bash step can read /proc/PID/environ of a process of its user), binds
127.0.0.1 (the port of the gateway before it when it can: workers keep their base URL
across a restart), and serves `/e/<endpoint>/<rest>`:

- the worker's token (`x-api-key` or `Authorization: Bearer`, as claude's apiKeyHelper
  sends both) is checked against the store on every request: unknown, revoked, or minted
  for another endpoint is a 401 with `x-should-retry: false`, and nothing goes upstream;
  a valid one maps to the route recorded with it when its attempt started (routes.Route:
  its base URL, where its key comes from), whatever was handed over since;
- while the endpoint is parked or held (the store's `endpoints` row) the gateway answers
  by itself, 429 in the provider's words the engine kept (`park_message`), so the verdict
  reads as it did direct; `x-should-retry: false` keeps the CLI from retrying into it;
- otherwise the request waits for one of the endpoint's slots (`slots.Slots`), goes
  upstream with the real key in the headers claude would send it (`x-api-key` and
  `Authorization: Bearer`), and the answer comes back as the provider sent it: status,
  headers (hop-by-hop ones aside), bytes (compressed ones too: nothing is decoded);
- each request's usage is read as it passes (`usage.UsageReader`) and stored in the meter.

It never logs a key, a token, a header or a body. Its records (folder): `gateway.lock`
(held while it lives), `gateway.json` (pid, port, start), `status.json` (per endpoint: in
flight, waiting and by which tasks, served, gated, refused, slot waits and holds),
`gateway.log`; and `control.sock` (0600), where an engine hands it the routes of its
attempts and their keys (`_control`: added, `Gateway.attach`; never another process's
replaced). Every WATCH_EVERY s it reads config.toml again when it changed
(`reload_settings`: budgets, prices) and revokes the tokens of attempts that ended, their
runner's exit or death included (`watch_attempts`), with no engine needed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import logging
import os
import re
import signal
import socket
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

from fleet_tui.core import policy
from fleet_tui.core.model import EndpointState
from fleet_tui.core.states import StopReason
from fleet_tui.execution import mailbox
from fleet_tui.execution.worker.attemptlog import AttemptLog
from fleet_tui.gateway import guard as guarding
from fleet_tui.gateway.files import (
    CONTROL_FILE,
    INFO_FILE,
    LOCK_FILE,
    LOG_FILE,
    SERVER_MODULE,
    STATUS_FILE,
    unix_address,
)
from fleet_tui.gateway.guard import CappedLog, Guard
from fleet_tui.gateway.routes import UNLIMITED, Route
from fleet_tui.gateway.shut import Shut, error_code, read_refusal
from fleet_tui.gateway.slots import Slots
from fleet_tui.gateway.usage import Pending, UsageReader, request_model
from fleet_tui.settings.config import ConfigError, Settings, config_file_path, load_settings
from fleet_tui.settings.watch import Stamp, file_stamp, settled
from fleet_tui.store import budgets
from fleet_tui.store.db import Store, StoreError
from fleet_tui.store.meter import Meter, TokenInfo, Usage
from fleet_tui.system import paths, procs
from fleet_tui.system.files import read_and_close, write_json_atomic

__all__ = ["CONTROL_FILE", "INFO_FILE", "LOCK_FILE", "LOG_FILE", "MAILBOX_PATH", "SERVER_MODULE",
           "STATUS_FILE",
           "Gateway", "main", "parse_handover", "unix_address"]

HANDOVER_MAX = 60_000  # what a handover may weigh (system.spawn.HANDOVER_LIMIT's figure)
STATUS_EVERY = 0.2  # seconds between two writes of status.json (when something changed)
MAILBOX_PATH = "/fleet/mailbox"  # a remote worker's messages (execution/mailbox.py)
MAILBOX_POLL = 0.1  # seconds between two looks at a mailbox while a fetch waits
KEY_WAIT = 15.0  # seconds a request waits for the process owning its route to hand its key
WATCH_EVERY = 0.5  # seconds between two looks at the runners of the attempts with a token
PENDING_DIR = "pending"  # answers in flight (usage.Pending): metered by the next gateway
ERROR_BODY_MAX = 1 << 20  # an error answer is read whole (up to this) before it goes on
DRAIN_MAX = 900.0  # seconds an answer cut downstream is read on upstream, at most

log = logging.getLogger("fleet_tui.gateway")

# never passed on, either way (RFC 9110 7.6.1), and what the gateway sets itself
_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                  "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"})
_UP_DROP = _HOP | {"host", "content-length", "authorization", "x-api-key"}
_DOWN_DROP = _HOP | {"content-length"}
_CODE = re.compile(r"\bcode (\d{3,5})\b")


@dataclass
class Counters:
    served: int = 0  # answered by the provider
    gated: int = 0  # answered by the gateway: the endpoint parked or held
    refused: int = 0  # no token, a revoked one, one of another endpoint
    rejected: int = 0  # error answers of the provider (a 1302, a 1308, a 529...)
    rejected_codes: dict[str, int] = field(default_factory=dict)  # by code ("1302", "529")
    failed: int = 0  # the provider could not be reached, or the stream broke
    cut: int = 0  # answers cut downstream (the worker gone) and read on to their end
    waits: int = 0  # requests that waited for a slot
    waited: float = 0.0  # seconds they waited, in all
    held: float = 0.0  # seconds the slots were held, in all (each request's from its slot on)
    last_gated: str | None = None
    waiting_since: dict[str, float] = field(default_factory=dict)


def _error(status: int, kind: str, message: str, *, retry: bool = False,
           code: str | None = None) -> web.Response:
    """An answer of the gateway's own: Anthropic's error shape (z.ai's `code` beside it
    when the refusal was a z.ai code), `x-should-retry` saying whether the CLI retries."""
    error: dict[str, Any] = {"type": kind, "message": message}
    if code is not None:
        error["code"] = code
    return web.Response(status=status, content_type="application/json",
                        text=json.dumps({"type": "error", "error": error}),
                        headers={"x-should-retry": "true" if retry else "false",
                                 "x-fleet-gateway": "answered"})


class _Downstream:
    """The worker's side of an answer: a write that fails (the worker gone, its connection
    cut) marks it gone instead of raising, so that the answer is read on upstream."""

    def __init__(self, request: web.Request, response: web.StreamResponse) -> None:
        self.request = request
        self.response = response
        self.gone = False
        self.prepared = False

    async def _do(self, step: Any) -> None:
        if self.gone:
            return
        try:
            await step
        except (ConnectionError, ClientError, RuntimeError, OSError):
            self.gone = True

    async def prepare(self) -> None:
        if self.request.transport is None or self.request.transport.is_closing():
            self.gone = True
            return
        await self._do(self.response.prepare(self.request))
        self.prepared = not self.gone

    async def write(self, data: bytes) -> None:
        if not self.gone:
            await self._do(self.response.write(data))

    async def write_eof(self) -> None:
        if not self.gone:
            await self._do(self.response.write_eof())


def token_of(request: web.Request) -> str | None:
    key = request.headers.get("x-api-key", "").strip()
    if key:
        return key
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return None


def gate_answer(state: EndpointState | None, now: float) -> web.Response | None:
    """The gateway's own answer while the endpoint is held or parked, else None."""
    if state is None:
        return None
    # a day's budget met holds the queue, not the runs in progress: they go on
    if state.held is not None and not policy.budget_held(state):
        return _error(403, "permission_error", f"held: {state.held}")
    if state.parked_until is not None and state.parked_until > now:
        found = _CODE.search(state.park_reason or "")
        until = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state.parked_until))
        message = state.park_message or (
            f"the endpoint is parked until {until}"
            + (f" ({state.park_reason})" if state.park_reason else ""))
        return _error(429, "rate_limit_error", message, code=found.group(1) if found else None)
    return None


class Gateway:
    """One gateway's state: its routes and keys, slots, counters and the store."""

    def __init__(self, store: Store, routes: dict[str, Route], keys: dict[str, str],
                 folder: Path, *, clock: Any = time.time,
                 settings: Settings | None = None) -> None:
        self.store = store
        self.settings = settings  # budgets and prices (None: neither is applied)
        self.meter = Meter(store)
        # each endpoint's latest route by name (its slots, and a token minted without a
        # route), every route by id (Route.id), and the keys by route id
        self.routes: dict[str, Route] = {}
        self.by_id: dict[str, Route] = {}
        self._keys: dict[str, str] = {}
        self._key_at: dict[str, float] = {}  # when each key came (monotonic): see prune
        self.folder = folder
        self.clock = clock
        self.slots: dict[str, Slots] = {}
        self.counters: dict[str, Counters] = {}
        self.attach(routes.values(), keys)
        self.started = time.time()
        self.port = 0
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gateway-store")
        self._session: ClientSession | None = None
        self._changed = True
        self.handed_at = self.started  # when its endpoints and keys were last handed over
        # config.toml, read again when it changes (`reload_settings`), as the engine does
        self.config_file: Path | None = None
        self._config_stamp: Stamp | None = None
        self.guard = Guard()  # the listener's connections (guard.py)
        self.shut: dict[str, Shut] = {}  # endpoints the gateway holds shut (shut.py)
        self.pending = Pending(folder / PENDING_DIR)
        self._answers: set[asyncio.Future[web.StreamResponse]] = set()

    def attach(self, routes: Iterable[Route], keys: Mapping[str, str]) -> bool:
        """Routes and keys an engine handed over (at an attempt's start, or again for its
        running attempts): the routes are added, and the keys of routes handed now or
        before replaced (a `key set` reaches the running workers of that route). Nothing
        is dropped for a handover's sake: a route is fixed for its attempts' lives, so a
        process that handed other routes (another shell's key or base URL) changes none of
        them; a route's key goes once no live token maps to it (`prune`). A key given
        under an endpoint's name is the key of the route of that name handed with it.
        The slots of an endpoint follow its latest route's max_requests. True when
        anything changed."""
        routes = list(routes)
        changed = False
        for route in routes:
            if self.by_id.get(route.id) != route or self.routes.get(route.name) != route:
                changed = True
            self.by_id[route.id] = route
            self._adopt(route)
        named = {r.name: r.id for r in routes}
        for ident, key in keys.items():
            ident = ident if ident in self.by_id else named.get(ident, ident)
            if ident in self.by_id and key:
                self._key_at[ident] = time.monotonic()
                if self._keys.get(ident) != key:
                    self._keys[ident] = key
                    changed = True
        if changed:
            self.handed_at = time.time()
            self._changed = True
        return changed

    def _adopt(self, route: Route) -> None:
        """The endpoint of `route` served from now (its slots sized by it)."""
        self.routes[route.name] = route
        if route.name in self.slots:
            self.slots[route.name].resize(route.max_requests)
        else:
            self.slots[route.name] = Slots(route.max_requests)
            self.counters[route.name] = Counters()

    def _route_of(self, info: TokenInfo | None, name: str) -> Route | None:
        """The route a token maps to (recorded with it when its attempt started: learned
        from the store by a gateway started since), else the endpoint's latest one."""
        record = info.route if info is not None else None
        if record is not None:
            try:
                route = Route.from_record(record)
            except (KeyError, TypeError, ValueError):
                route = None
            if route is not None and route.name == name:
                found = self.by_id.get(route.id)
                if found is None:
                    self.by_id[route.id] = found = route
                    if name not in self.routes:
                        self._adopt(route)
                return found
        return self.routes.get(name)

    async def _await_key(self, route: Route) -> str | None:
        """None once the route's key is held, else why it cannot be. A keyring key (the
        fleet's) the gateway reads itself; a key of a process's environment is that
        process's to hand over (its engine does on its next pass, KEY_WAIT at most) while it
        lives; never another process's value."""
        if self._keys.get(route.id):
            return None
        if route.keyring is not None:
            value, reason = await self._in_pool(_read_keyring, *route.keyring)
            if value:
                self._keys[route.id] = value
                self._key_at[route.id] = time.monotonic()
                return None
            return (f"the fleet-tui gateway has no key for endpoint {route.name!r}: "
                    f"{route.source or 'its keyring entry'}: {reason}; once it is set "
                    "(`fleet-tui key set`), a fleet-tui starts the task again")
        owner = route.owner_pid()
        deadline = time.monotonic() + KEY_WAIT
        while not self._keys.get(route.id):
            alive = owner is not None and procs.is_alive(*owner)
            if not alive or time.monotonic() > deadline:
                where = route.source or "its key"
                who = (f"the fleet-tui process that started the attempt (pid {owner[0]})"
                       if owner is not None else "the process that started the attempt")
                return (f"the fleet-tui gateway does not hold the key of endpoint "
                        f"{route.name!r} for this attempt: it came from {where} of {who}, "
                        + ("which has ended" if not alive else "which did not hand it over")
                        + f"; a fleet-tui where {where} is set starts it again (a key in "
                        "the keyring, `fleet-tui key set`, outlives the shell)")
            await asyncio.sleep(0.05)
        return None

    def prune(self, live: set[str], since: float) -> None:
        """Forget the keys of attempts' routes no live token maps to any more (their
        attempts ended), each handed before `since` (when `live` was read: one handed
        with a token minted after it stays). A route that names no key source (handed by
        a caller of before routes per attempt) keeps its key. On the event loop."""
        for ident in [i for i in self._keys if i not in live
                      and self._key_at.get(i, 0.0) < since
                      and (self.by_id[i].source or self.by_id[i].owner)]:
            del self._keys[ident]
            self._key_at.pop(ident, None)

    # --- the store, off the event loop ------------------------------------------------------

    async def _in_pool(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _look(self, token: str, route: Route) -> tuple[TokenInfo | None, EndpointState | None]:
        """The token's owner and the endpoint's gate: two reads by primary key, on the event
        loop (in WAL mode a reader never waits for a writer; a hop to a thread cost more
        than the reads)."""
        return self.meter.check(token), self.store.get_endpoint(route.store_key)

    # --- serving ----------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/e/{endpoint}", self.handle)
        app.router.add_route("*", "/e/{endpoint}/{rest:.*}", self.handle)
        app.router.add_get(MAILBOX_PATH, self.mailbox_fetch)
        app.router.add_post(MAILBOX_PATH, self.mailbox_verdict)
        app.router.add_route("*", "/{rest:.*}", self.unrouted)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _app: web.Application) -> None:
        self._session = ClientSession(
            connector=TCPConnector(limit=0), auto_decompress=False,
            timeout=ClientTimeout(total=None, sock_connect=30),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"))

    async def _stop(self, _app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()
        self._pool.shutdown(wait=False)

    # --- a remote worker's mailbox (execution/mailbox.py): `say` to a Ray job ----------

    def _mailbox_of(self, request: web.Request) -> AttemptLog | web.Response:
        """The local attempt folder of the request's token (valid, bound to an attempt),
        or the 401/404 answer."""
        token = token_of(request)
        info = self.meter.check(token) if token else None
        if info is None or not info.valid or info.attempt_id is None:
            return _error(401, "authentication_error",
                          "no valid gateway token for an attempt: no mailbox")
        try:
            found = self.store.get_attempt(int(info.attempt_id))
        except StoreError:
            found = None
        if found is None or found.dir is None:
            return _error(404, "not_found_error", "the token's attempt has no folder")
        return AttemptLog(found.dir)

    async def mailbox_fetch(self, request: web.Request) -> web.Response:
        """The messages waiting for the token's worker; waits up to `wait` seconds
        (LONG_POLL at most) for one."""
        folder = await self._in_pool(self._mailbox_of, request)
        if isinstance(folder, web.Response):
            return folder
        self.guard.prove(request.transport)  # a worker's long poll, not a flood's
        try:
            wait = min(max(float(request.query.get("wait", "0")), 0.0), mailbox.LONG_POLL)
        except ValueError:
            wait = 0.0
        deadline = time.monotonic() + wait
        while True:
            messages = await self._in_pool(mailbox.pending, folder)
            if messages or time.monotonic() >= deadline:
                return web.json_response({"messages": messages})
            await asyncio.sleep(MAILBOX_POLL)

    async def mailbox_verdict(self, request: web.Request) -> web.Response:
        """What the node side says became of a message (queued, taken, closed)."""
        folder = await self._in_pool(self._mailbox_of, request)
        if isinstance(folder, web.Response):
            return folder
        self.guard.prove(request.transport)  # a worker's long poll, not a flood's
        try:
            data = json.loads(await request.read())
            await self._in_pool(mailbox.verdict, folder, str(data["id"]),
                                str(data["status"]), str(data.get("reason") or ""))
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, "invalid_request_error", f"not a verdict: {exc}")
        return web.json_response({"ok": True})

    async def unrouted(self, request: web.Request) -> web.Response:
        return _error(404, "not_found_error",
                      "the fleet-tui gateway serves /e/<endpoint>/...; known endpoints: "
                      + (", ".join(sorted(self.routes)) or "none"))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["endpoint"]
        route = self.routes.get(name)
        if route is None:  # a gateway started since: the token's route, from the store
            token = token_of(request)
            route = self._route_of(self.meter.check(token) if token else None, name)
        if route is None:
            return _error(404, "not_found_error",
                          f"the fleet-tui gateway has no endpoint {name!r} (known: "
                          + (", ".join(sorted(self.routes)) or "none") + ")")
        counters = self.counters[name]
        slots = self.slots[name]  # this request's, should a handover drop the endpoint
        if request.method == "HEAD":  # claude's reachability probe: nothing goes upstream
            return web.Response(status=200)
        token = token_of(request)
        if token is None:
            counters.refused += 1
            self._changed = True
            return _error(401, "authentication_error",
                          "no gateway token: a worker of fleet-tui sends its attempt's token "
                          "(x-api-key or Authorization: Bearer)")
        info, state = self._look(token, route)
        refusal = self._refusal(info, name)
        if refusal is not None:
            counters.refused += 1
            self._changed = True
            return _error(401, "authentication_error", refusal)
        assert info is not None
        route = self._route_of(info, name) or route  # the attempt's own, for its life
        self.guard.prove(request.transport)  # a worker's: no longer one of the flood's
        gated = self._shut_answer(name) or gate_answer(state, self.clock())
        if gated is not None:
            return self._gated(counters, gated)
        missing = await self._await_key(route)
        if missing is not None:
            await self._in_pool(self._stop_attempt, info, missing)
            return self._gated(counters, _error(403, "permission_error", missing))
        over = self._over_budget(info, name)
        if over is not None:
            return self._gated(counters, _error(403, "permission_error", over))
        day = await self._in_pool(self._day_over, info, name) \
            if self._day_budget(name) else None
        if day is not None:
            return self._gated(counters, _error(403, "permission_error", day))
        try:
            body = await asyncio.wait_for(request.read(), guarding.BODY_TIMEOUT)
        except TimeoutError:
            return _error(408, "invalid_request_error", "the request's body came too slowly "
                          f"(more than {guarding.BODY_TIMEOUT:g} s)")
        waiter = f"{info.task_id}#{id(request):x}"
        waits = slots.in_flight >= slots.size or slots.waiting > 0
        if waits:
            counters.waiting_since[waiter] = time.time()
            self._changed = True
        try:
            await slots.acquire(info.task_id)
        finally:
            since = counters.waiting_since.pop(waiter, None)
        # the slot is ours: from here on it is given back by the answer's own task (no
        # await until that task holds it, so a cancellation cannot lose it)
        if waits:
            if since is not None:
                counters.waits += 1
                counters.waited += time.time() - since
            self._changed = True
            # revoked, parked, held or shut while it waited: still nothing goes upstream
            info, state = self._look(token, route)
            refusal = self._refusal(info, name)
            if refusal is not None:
                slots.release()
                counters.refused += 1
                return _error(401, "authentication_error", refusal)
            assert info is not None
            gated = self._shut_answer(name) or gate_answer(state, self.clock())
            if gated is not None:
                slots.release()
                return self._gated(counters, gated)
        answer = asyncio.ensure_future(self._answer(request, route, info, body, counters,
                                                    slots))
        self._answers.add(answer)
        answer.add_done_callback(self._answers.discard)
        # a worker that goes away (its connection cut: the handler is cancelled) does not
        # end the answer: it is read on upstream to its end, its slot held until then (the
        # provider counts it in flight until it ends), and metered whole
        return await asyncio.shield(answer)

    async def _answer(self, request: web.Request, route: Route, info: TokenInfo, body: bytes,
                      counters: Counters, slots: Slots) -> web.StreamResponse:
        took = time.monotonic()
        try:
            return await self._forward(request, route, info, body, counters)
        finally:
            counters.held += time.monotonic() - took
            slots.release()
            self._changed = True

    def _shut_answer(self, name: str) -> web.Response | None:
        """The gateway's own answer while it holds the endpoint shut (a window or an
        account the provider said closed), else None."""
        shut = self.shut.get(name)
        if shut is None:
            return None
        if shut.open(self.clock()):
            del self.shut[name]
            self._changed = True
            log.info("endpoint %s: the gate opens again (%s)", name, shut.reason)
            return None
        return _error(shut.status, "rate_limit_error", shut.message, code=shut.code)

    def reload_settings(self) -> bool:
        """Read the settings again when config.toml changed and has rested (a raised
        budget or a new price reaches the next request, no restart). True when read."""
        if self.config_file is None:
            return False
        stamp = file_stamp(self.config_file)
        if stamp == self._config_stamp or not settled(stamp):
            return False
        self._config_stamp = stamp
        found = _settings()
        if found is not None:
            self.settings = found
            log.info("settings read again (%s changed)", self.config_file.name)
        return True

    def _day_budget(self, name: str) -> bool:
        """Has the endpoint a budget_per_day (a look at the settings, no store read)?"""
        if self.settings is None:
            return False
        found = budgets.endpoint_settings(self.settings, name)
        return found is not None and bool(found.budget_per_day)

    def _day_over(self, info: TokenInfo, name: str) -> str | None:
        """The endpoint's budget_per_day met: why (the gateway answers for it, nothing goes
        upstream); the endpoint held (as the engine's pass would) and the attempt stopped
        for the day (StopReason.BUDGET_DAY: the task waits and resumes in its session when
        the budget lifts, at local midnight or raised). None while budget is left. In the
        gateway's thread pool (store writes)."""
        if self.settings is None:
            return None
        now = self.clock()
        try:
            refusal = budgets.endpoint_refusal(self.store, self.settings, name, now)
        except Exception as exc:  # a budget that cannot be read never stops the work
            log.warning("could not check the day budget of %s: %s", name, type(exc).__name__)
            return None
        if refusal is None:
            return None

        def hold(state: EndpointState) -> dict[str, Any] | None:
            if state.held is not None:
                return None
            return {"held": refusal, "held_task": None,
                    "held_settings": f"{policy.BUDGET_HOLD}{budgets.day_start(now)}",
                    "event": "hold", "event_at": now}

        try:
            self.store.change_endpoint(name, hold, now)
            if info.attempt_id is not None:
                folder = self.store.get_attempt(info.attempt_id).dir
                if folder is not None:
                    AttemptLog(folder).request_stop(StopReason.BUDGET_DAY, refusal, at=now,
                                                    by="gateway")
        except Exception as exc:  # the engine's own pass holds it then
            log.warning("could not hold %s for its day budget: %s", name, type(exc).__name__)
        return refusal

    def _stop_attempt(self, info: TokenInfo, why: str) -> None:
        """The attempt cannot go on through the gateway (no key for its route): its stop
        asked for (StopReason.NO_KEY: the task waits for a fleet-tui that can start it
        again, `why` its words; not a refusal of the provider's: no endpoint is held). In
        the gateway's thread pool."""
        if info.attempt_id is not None:
            try:
                folder = self.store.get_attempt(info.attempt_id).dir
                if folder is not None:  # the first reason asked stands
                    AttemptLog(folder).request_stop(StopReason.NO_KEY, why, at=self.clock(),
                                                    by="gateway")
            except Exception as exc:
                log.warning("could not mark an attempt stopped: %s", type(exc).__name__)

    def watch_attempts(self) -> set[str]:
        """Revoke the tokens of attempts that have ended: finished in the store, or their
        runner on this machine gone (its attempt folder's lock no longer held: an exit or a
        SIGKILL), with no engine needed. The ids of the routes the live tokens map to
        (`prune`). In the gateway's thread pool."""
        ended: list[int] = []
        live: set[str] = set()
        for attempt_id, route in self.meter.live_attempts():
            try:
                attempt = self.store.get_attempt(attempt_id)
            except StoreError:  # no row (a token of another kind of caller): its minter's
                attempt = None
            if attempt is not None and (attempt.finished_at is not None
                                        or _runner_gone(attempt)):
                ended.append(attempt_id)
            elif route is not None and "id" in route:
                live.add(str(route["id"]))
        if ended:
            self.meter.revoke(attempt_ids=ended)
            log.info("revoked the tokens of %d ended attempt(s)", len(ended))
        return live

    def _over_budget(self, info: TokenInfo, name: str) -> str | None:
        """The task's budget met: nothing more goes upstream for it, and its attempt is
        marked stopped for the budget first (so that the CLI's failed request reads as
        that stop, not as a refused key; the engine stops the run on its next look). An
        endpoint's day budget is the engine's: it holds the queue while the running tasks
        finish."""
        if self.settings is None:
            return None
        try:
            refusal = budgets.task_refusal(self.store, self.settings, info.task_id, name)
        except Exception as exc:  # a budget that cannot be read never stops the work
            log.warning("could not check the budget of a task of %s: %s", name,
                        type(exc).__name__)
            return None
        if refusal is not None and info.attempt_id is not None:
            try:
                folder = self.store.get_attempt(info.attempt_id).dir
                if folder is not None:
                    AttemptLog(folder).request_stop(StopReason.BUDGET, refusal,
                                                    at=self.clock(), by="gateway")
            except Exception as exc:  # the engine's own look stops it then
                log.warning("could not mark a task's attempt stopped for its budget: %s",
                            type(exc).__name__)
        return refusal

    def _cost(self, endpoint: str, model: str, counts: dict[str, int]) -> float | None:
        if self.settings is None or not model:
            return None
        try:
            return budgets.request_cost(self.settings, endpoint, model, **counts)
        except Exception as exc:
            log.warning("could not price a request of %s: %s", endpoint, type(exc).__name__)
            return None

    def _refusal(self, info: TokenInfo | None, name: str) -> str | None:
        if info is None:
            return "unknown gateway token: it was not minted by this fleet-tui"
        if not info.valid:
            return "this gateway token was revoked: its attempt has ended"
        if info.endpoint != name:
            return f"this gateway token is for endpoint {info.endpoint!r}, not {name!r}"
        return None

    def _gated(self, counters: Counters, answer: web.Response) -> web.Response:
        counters.gated += 1
        counters.last_gated = time.strftime("%Y-%m-%d %H:%M:%S")
        self._changed = True
        return answer

    async def _forward(self, request: web.Request, route: Route, info: TokenInfo, body: bytes,
                       counters: Counters) -> web.StreamResponse:
        """One answer, upstream to the worker. It never raises: it runs in a task of its
        own, which outlives a worker gone in the middle (read on to the end, metered)."""
        assert self._session is not None
        # the route and its key of one handover (one may have come while it waited)
        current = self.by_id.get(route.id)
        if current is None:
            counters.failed += 1
            return _error(404, "not_found_error", f"the fleet-tui gateway no longer has "
                          f"endpoint {route.name!r} (the settings changed)")
        route = current
        rest = request.match_info.get("rest", "")
        url = route.base_url.rstrip("/") + ("/" + rest if rest else "")
        if request.query_string:
            url += "?" + request.query_string
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _UP_DROP]
        key = self._keys.get(route.id)
        if not key:  # pruned while it waited: the attempt ended
            counters.failed += 1
            return _error(401, "authentication_error", "this gateway token's attempt has "
                          "ended: its key is no longer held")
        headers += [("x-api-key", key), ("Authorization", f"Bearer {key}")]
        streamed = b'"stream"' in body[:4096] or b'"stream": true' in body
        reader = UsageReader(streamed=streamed, model=request_model(body))
        try:
            upstream = await self._session.request(request.method, url, headers=headers,
                                                   data=body, allow_redirects=False)
        except (ClientError, OSError, TimeoutError) as exc:
            counters.failed += 1
            log.warning("endpoint %s unreachable: %s", route.name, type(exc).__name__)
            return _error(502, "api_error", f"the fleet-tui gateway could not reach endpoint "
                          f"{route.name!r} ({type(exc).__name__})", retry=True)
        except asyncio.CancelledError:
            counters.failed += 1
            raise  # the gateway stops
        status = upstream.status
        error: str | None = None
        pending: str | None = None
        response = web.StreamResponse(status=status, reason=upstream.reason)
        down = _Downstream(request, response)
        try:
            reader.streamed = "text/event-stream" in upstream.headers.get("content-type", "")
            for k, v in upstream.headers.items():
                if k.lower() not in _DOWN_DROP:
                    response.headers.add(k, v)
            if upstream.content_length is not None \
                    and "chunked" not in upstream.headers.get("transfer-encoding", ""):
                response.content_length = upstream.content_length
            head = b""
            if status >= 400 and not reader.streamed:
                # an error is small: read whole, so that a closed window shuts the gate
                # before the worker's CLI can retry into it
                while len(head) < ERROR_BODY_MAX:
                    piece = await upstream.content.read(ERROR_BODY_MAX - len(head))
                    if not piece:
                        break
                    head += piece
                reader.feed(head)
                error = self._refused_upstream(route.name, status, head, counters)
            await down.prepare()
            if head:
                await down.write(head)
            async with asyncio.timeout(None) as limit:
                async for chunk in upstream.content.iter_any():
                    reader.feed(chunk)
                    if not down.gone:
                        await down.write(chunk)
                        if down.gone:  # read on to the end, not forever
                            limit.reschedule(asyncio.get_running_loop().time() + DRAIN_MAX)
                    if pending is None and reader.started:
                        # on disk from its input on: metered should the gateway die
                        pending = self.pending.name()
                        await self._in_pool(self.pending.write, pending,
                                            self._usage(info, route, reader, status,
                                                        error).__dict__)
            await down.write_eof()
            counters.served += 1
            if down.gone:
                counters.cut += 1
                log.info("endpoint %s: an answer cut downstream was read on to its end",
                         route.name)
        except (ClientError, OSError, TimeoutError) as exc:
            counters.failed += 1
            log.info("endpoint %s: a stream ended early (%s)", route.name, type(exc).__name__)
        except asyncio.CancelledError:
            counters.failed += 1
            raise  # the gateway stops
        finally:
            upstream.release()
            reader.finish()
            self._changed = True
            usage = self._usage(info, route, reader, status, error)
            with contextlib.suppress(Exception):
                await asyncio.shield(self._in_pool(self._record, usage, pending))
        if not down.prepared:
            return _error(502, "api_error", f"the answer of endpoint {route.name!r} broke "
                          "before it began", retry=True)
        return response

    def _usage(self, info: TokenInfo, route: Route, reader: UsageReader, status: int | None,
               error: str | None) -> Usage:
        """The meter's row of an answer as far as it went: an error answer is an error of
        its code, priced at what it states (nothing, mostly), never an unpriced request."""
        cost = self._cost(route.name, reader.model, reader.counts)
        if cost is None and error is not None and not any(reader.counts.values()):
            cost = 0.0
        return Usage(at=self.clock(), task_id=info.task_id, attempt_id=info.attempt_id,
                     endpoint=route.name, model=reader.model, status=status,
                     cost=cost, error=error, **reader.counts)

    def _refused_upstream(self, name: str, status: int, body: bytes,
                          counters: Counters) -> str:
        """An error answer of the provider: counted by its code; a window or an account
        it says closed shuts the endpoint in the gateway from now on. Its code."""
        code = error_code(status, body)
        counters.rejected += 1
        counters.rejected_codes[code] = counters.rejected_codes.get(code, 0) + 1
        self._changed = True
        shut = read_refusal(status, body, self.clock())
        if shut is not None and name not in self.shut:
            self.shut[name] = shut
            log.warning("endpoint %s shut by the gateway until %s: %s", name,
                        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(shut.until)),
                        shut.reason)
        return code

    def _record(self, usage: Usage, pending: str | None = None) -> None:
        try:
            self.meter.record(usage)
        except Exception as exc:  # the answer went through: a lost row is logged
            log.error("could not store a meter row: %s", type(exc).__name__)
        if pending is not None:
            self.pending.remove(pending)

    def record_left_behind(self) -> int:
        """The answers a gateway before this one was in the middle of when it died:
        metered as far as they went (their first usage: at least the input)."""
        count = 0
        for record in self.pending.take():
            try:
                self.meter.record(Usage(**record))
                count += 1
            except (TypeError, ValueError) as exc:
                log.warning("a pending meter row could not be read: %s", type(exc).__name__)
            except Exception as exc:
                log.error("could not store a pending meter row: %s", type(exc).__name__)
        if count:
            log.info("%d answers cut by the last gateway's end metered as far as they went",
                     count)
        return count

    # --- its records ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now = time.time()
        endpoints: dict[str, Any] = {}
        for name, slots in self.slots.items():
            c = self.counters[name]
            waiting_tasks: dict[str, int] = {}
            for waiter in c.waiting_since:
                task = waiter.rsplit("#", 1)[0]
                waiting_tasks[task] = waiting_tasks.get(task, 0) + 1
            endpoints[name] = {
                "max_requests": None if slots.size >= UNLIMITED else slots.size,
                "in_flight": slots.in_flight,
                "waiting": len(c.waiting_since), "waiting_tasks": waiting_tasks,
                "longest_wait": round(now - min(c.waiting_since.values()), 3)
                if c.waiting_since else 0.0,
                "served": c.served, "gated": c.gated, "refused": c.refused,
                "rejected": c.rejected, "rejected_codes": dict(c.rejected_codes),
                "shut": self.shut[name].to_status() if name in self.shut else None,
                "failed": c.failed, "cut": c.cut, "last_gated": c.last_gated,
                "waits": c.waits, "waited": round(c.waited, 3),
                "held": round(c.held, 3)}
        return {"pid": os.getpid(), "port": self.port, "started_at": self.started,
                "handed_at": self.handed_at, "written_at": now, "endpoints": endpoints,
                "connections": self.guard.status()}

    async def keep_status(self) -> None:
        seen = -1
        while True:
            if self._changed or self.guard.accepted != seen:
                seen = self.guard.accepted
                self._changed = False
                try:
                    write_json_atomic(self.folder / STATUS_FILE, self.status(), sync=False)
                except OSError as exc:
                    log.warning("could not write %s: %s", STATUS_FILE, exc.strerror)
            await asyncio.sleep(STATUS_EVERY)


def _runner_gone(attempt: Any) -> bool:
    """Has the runner of this machine's attempt ended (its folder's lock not held, once it
    had one)? Another host's runner is its engine's to judge."""
    if attempt.host != "local" or attempt.dir is None:
        return False
    if attempt.runner_pid is None:  # not spawned yet (its token comes before its runner)
        return False
    held = AttemptLog(attempt.dir).lock_held()
    return held is False  # None: no lock file (an attempt from before locks)


def _read_keyring(service: str, entry: str) -> tuple[str | None, str]:
    """A keyring entry (the fleet's shared key), as a runner reads it."""
    from fleet_tui.settings.credentials import read_keyring

    value, reason = read_keyring(service, entry)
    return (value.strip() if value else None), reason


async def watch_attempts(gateway: Gateway) -> None:
    """Every WATCH_EVERY s: the tokens of ended attempts revoked (Gateway.watch_attempts)."""
    while True:
        try:
            await gateway._in_pool(gateway.reload_settings)
            since = time.monotonic()
            live = await gateway._in_pool(gateway.watch_attempts)
            gateway.prune(live, since)
        except Exception as exc:  # the store busy for a moment: the next look
            log.warning("could not look at the attempts: %s", type(exc).__name__)
        await asyncio.sleep(WATCH_EVERY)


IDLE_ENV = "FLEET_TUI_GATEWAY_IDLE"
IDLE_EXIT = 120.0  # seconds with no live token and nothing in flight: the gateway exits


def idle_exit() -> float:
    """How long the gateway stays with nothing to serve (FLEET_TUI_GATEWAY_IDLE seconds)."""
    try:
        return max(0.5, float(os.environ.get(IDLE_ENV) or IDLE_EXIT))
    except ValueError:
        return IDLE_EXIT


async def watch_idle(gateway: Gateway, stop: asyncio.Event, limit: float) -> None:
    """Set `stop` once the gateway has had no live token (no attempt running through it)
    and no request in flight or waiting for `limit` seconds: it is not left behind when the
    work is done; an engine starts it again with its next attempt."""
    idle_since: float | None = None
    while not stop.is_set():
        await asyncio.sleep(min(5.0, limit / 4))
        busy = any(slots.in_flight or slots.waiting for slots in gateway.slots.values())
        try:
            live = busy or gateway.meter.any_valid()
        except Exception:  # the store busy or gone for a moment: not idle on that word
            live = True
        now = time.monotonic()
        if live:
            idle_since = None
        elif idle_since is None:
            idle_since = now
        elif now - idle_since >= limit:
            log.info("idle for %.0f s (no attempt goes through it): exiting", limit)
            stop.set()


def parse_handover(data: bytes) -> tuple[dict[str, Route], dict[str, str]]:
    """The routes and keys of a handover (the pipe's at start, the control socket's
    later). Raises ValueError (or KeyError, TypeError) when it is not one."""
    found = json.loads(data or b"{}")
    if not isinstance(found, dict):
        raise ValueError("the handover is not a JSON object")
    routes = {(route := Route.from_record(r)).id: route for r in found.get("routes", [])}
    keys = {str(k): str(v) for k, v in dict(found.get("keys", {})).items()}
    return routes, keys


def _peer_is_us(writer: asyncio.StreamWriter) -> bool:
    """The peer runs as this user (the folder is private already: a second look)."""
    sock = writer.get_extra_info("socket")
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return True
    import struct

    try:
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except OSError:
        return False
    return bool(uid == os.getuid())


async def _read_all(reader: asyncio.StreamReader) -> bytes:
    data = b""
    while chunk := await reader.read(65536):
        data += chunk
        if len(data) > HANDOVER_MAX:
            raise ValueError("the handover is too long")
    return data


async def _control(gateway: Gateway, reader: asyncio.StreamReader,
                   writer: asyncio.StreamWriter) -> None:
    """One handover on the control socket: the engine writes the endpoints and keys (as
    into the start's pipe) and closes its side; the answer says whether anything changed.
    Nothing of it is logged but the endpoints' names."""
    answer: dict[str, Any]
    try:
        if not _peer_is_us(writer):
            answer = {"ok": False, "error": "not this user's"}
        else:
            routes, keys = parse_handover(await asyncio.wait_for(_read_all(reader), 10))
            changed = gateway.attach(routes.values(), keys)
            if changed:
                gateway.settings = await gateway._in_pool(_settings)
            names = sorted({route.name for route in routes.values()})
            if changed:
                log.info("endpoints and keys handed over again: %s", ", ".join(names))
            answer = {"ok": True, "changed": changed, "endpoints": names}
    except Exception as exc:  # its kind only: a message could quote what was handed
        log.warning("a handover on %s could not be read: %s", CONTROL_FILE,
                    type(exc).__name__)
        answer = {"ok": False, "error": type(exc).__name__}
    with contextlib.suppress(OSError):
        writer.write(json.dumps(answer).encode())
        await writer.drain()
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


def _control_socket(folder: Path) -> socket.socket:
    path = folder / CONTROL_FILE
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # the last gateway's (we hold the lock: no other one listens)
    address, fd = unix_address(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket is created 0600
    try:
        sock.bind(address)
    finally:
        os.umask(old)
        if fd is not None:
            os.close(fd)
    sock.listen(16)
    sock.setblocking(False)
    return sock


def _bind(port: int) -> socket.socket:
    """127.0.0.1:port (the previous gateway's, so running workers find us again), else
    any free port."""
    for want in ([port] if port else []) + [0]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", want))
        except OSError:
            sock.close()
            continue
        sock.listen(512)
        sock.setblocking(False)
        return sock
    raise OSError("no port to bind on 127.0.0.1")


async def _serve(gateway: Gateway, sock: socket.socket, control_sock: socket.socket) -> None:
    # the idle timeout of a kept-alive connection (aiohttp's own is an hour)
    runner = web.AppRunner(gateway.app(), access_log=None, handler_cancellation=True,
                           keepalive_timeout=guarding.IDLE_TIMEOUT)
    await runner.setup()
    assert runner.server is not None
    # each connection seen by the guard (guard.py): the ones that show no valid token are
    # closed after the header timeout, and at most the cap of them are kept
    listener = await asyncio.get_running_loop().create_server(
        gateway.guard.factory(runner.server), sock=sock, backlog=512)
    guard_task = asyncio.create_task(gateway.guard.keep())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    control = await asyncio.start_unix_server(
        lambda r, w: _control(gateway, r, w), sock=control_sock)
    status_task = asyncio.create_task(gateway.keep_status())
    watch_task = asyncio.create_task(watch_attempts(gateway))
    idle_task = asyncio.create_task(watch_idle(gateway, stop, idle_exit()))
    try:
        await stop.wait()
    finally:
        status_task.cancel()
        watch_task.cancel()
        idle_task.cancel()
        guard_task.cancel()
        control.close()
        listener.close()
        await runner.cleanup()


def _settings() -> Settings | None:
    """The settings the budgets and prices come from: config.toml's, the fleet's shared
    ones (not the FLEET_WORKER_* of whichever shell happened to start the gateway: they are
    that shell's tasks' alone); None, and said in the log, when they cannot be read."""
    try:
        return load_settings(env={k: v for k, v in os.environ.items()
                                  if not k.startswith("FLEET_WORKER_")})
    except (ConfigError, OSError) as exc:
        log.warning("settings unreadable, no budgets or prices applied: %s",
                    type(exc).__name__)
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=SERVER_MODULE)
    parser.add_argument("--keys-fd", type=int, required=True)
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    # the log is stderr (the spawner's gateway.log): rate-limited and rotated, whatever
    # floods it (guard.CappedLog)
    handler = CappedLog(Path(args.folder) / LOG_FILE)
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s gateway[{os.getpid()}] %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    try:
        routes, keys = parse_handover(read_and_close(args.keys_fd))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.error("cannot read the endpoints handed over: %s", type(exc).__name__)
        return 2
    folder = paths.private_dir(args.folder)
    lock_fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, paths.PRIVATE_FILE)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        log.info("another gateway runs for %s", folder)
        return 0
    guarding.raise_fd_limit()  # room for the connections the guard keeps, and the workers'
    gateway = Gateway(Store(args.db), routes, keys, folder, settings=_settings())
    with contextlib.suppress(ConfigError, OSError):
        gateway.config_file = Path(config_file_path())
        gateway._config_stamp = file_stamp(gateway.config_file)
    gateway.record_left_behind()  # a killed gateway's answers in flight
    try:
        sock = _bind(args.port)
    except OSError as exc:
        log.error("cannot listen: %s", exc)
        return 1
    gateway.port = int(sock.getsockname()[1])
    # listening before gateway.json says it runs: an engine that finds it can hand over
    control_sock = _control_socket(folder)
    write_json_atomic(folder / INFO_FILE, {
        "pid": os.getpid(), "start": procs.start_time(os.getpid()), "port": gateway.port,
        "started_at": gateway.started, "endpoints": sorted(gateway.routes)}, sync=False)
    log.info("listening on 127.0.0.1:%d for %s", gateway.port,
             ", ".join(sorted(gateway.routes)) or "no endpoint yet")
    asyncio.run(_serve(gateway, sock, control_sock))
    log.info("stopped")
    return 0


if __name__ == "__main__":  # pragma: no cover - the detached gateway
    raise SystemExit(main())

