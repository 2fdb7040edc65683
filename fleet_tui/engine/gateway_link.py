"""The engine's hook into the gateway: an attempt goes through it.

With the `gateway` setting on, a starting attempt gets the gateway's URL for its endpoint
as its base URL and a token minted for it as its key (`through`): the key variables of the
runner's environment are replaced by `ANTHROPIC_AUTH_TOKEN=<token>` (handed to the runner
through its pipe, `--env-fd`, as the key was) and its key sources narrowed to that one
variable, so nothing in the worker's reach holds the provider's key. The token is revoked
when the attempt ends or is killed (`revoke`). While attempts run through it, every pass
keeps the gateway alive (`keep_alive`: one started again after a crash, on the port it had,
so running workers find it after their CLI's retry) and its keys current: when the keys or
endpoints this engine resolves differ from those it last handed the gateway (a `key set`, a
key_env's value, an endpoint of config.toml changed), they are handed over again through the
gateway's control socket (`control.hand_over`), at an attempt's start (keys resolved afresh)
and on a pass (keys as the engine remembers them: SecretCache.SECRET_TTL).

The gateway is this machine's: only the local host's attempts go through it (a memory
host runs nothing; a remote host would need the gateway reachable from there).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fleet_tui.core.errors import FleetError
from fleet_tui.core.model import Attempt, Task
from fleet_tui.gateway import control
from fleet_tui.gateway.routes import Route, name_for, routes_of
from fleet_tui.settings.config import Settings
from fleet_tui.store.db import Store
from fleet_tui.store.meter import Meter
from fleet_tui.system import procs

__all__ = ["KEY_VARIABLES", "GatewayLink", "weak_keys"]

log = logging.getLogger("fleet_tui.engine.fleet")

# where a runner may find a key: none of them reaches a worker of the gateway but the token
KEY_VARIABLES = ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY", "ZHIPU_API_KEY", "GLM_API_KEY")
KEEP_ALIVE_EVERY = 0.5  # seconds between two looks at the gateway while attempts use it
# the variables of the usual key sources (execution.worker.launch's, by kind)
_SOURCE_VARIABLES = {"env": "ANTHROPIC_AUTH_TOKEN", "zhipu": "ZHIPU_API_KEY",
                     "glm": "GLM_API_KEY"}
_SEQ = itertools.count(1)


Keys = Callable[..., dict[str, str]]  # keys(fresh=False): each endpoint's key by its name


def weak_keys(get: Keys) -> Keys:
    """`get` (a bound method) without holding its object: no keys once it is gone."""
    ref = weakref.WeakMethod(get)  # type: ignore[arg-type]

    def keys(*, fresh: bool = False) -> dict[str, str]:
        method = ref()
        return method(fresh=fresh) if method is not None else {}

    return keys


class GatewayLink:
    """Tokens for attempts and the gateway they go through, for one engine."""

    def __init__(self, store: Store, *, env: Mapping[str, str], python: str,
                 keys: Keys | None = None) -> None:
        self.store = store
        self.meter = Meter(store)
        self.env = env
        self.python = python
        # each endpoint's key as the engine resolves it (Fleet gives SecretCache.by_endpoint)
        self.keys = keys
        self._checked = 0.0
        # who owns the routes whose key comes from this engine's environment
        self.owner = f"{os.getpid()}:{procs.start_time(os.getpid()) or 0}:{next(_SEQ)}"
        # the routes of this engine's attempts and their keys, by route id: what it hands
        # the gateway (again when one was started since)
        self._mine: dict[str, tuple[Route, str]] = {}
        # the gateway (pid, start) this engine last handed its routes and keys, and a
        # digest of them (in this process only): what is handed over again when it changes
        self._handed: tuple[int, float, bytes] | None = None

    def endpoint_of(self, settings: Settings, task: Task, host_name: str, *,
                    remote_ok: bool = False) -> str | None:
        """The gateway endpoint an attempt of `task` goes through, or None: direct
        (`remote_ok`: a host other than this machine reaches the gateway, by a port
        forwarded over its connection)."""
        if not settings.gateway or (host_name != "local" and not remote_ok) \
                or self.keys is None:
            return None
        return name_for(settings, task.endpoint)

    def cannot_start(self, settings: Settings, task_endpoint: str) -> str | None:
        """Why this engine starts no task of the endpoint through the gateway (its
        `key_env` variable is not set in this engine's environment: the key is the
        environment's of the fleet-tui that starts a task, so the tasks wait for one that
        has it, saying so), or None."""
        if not settings.gateway or self.keys is None:
            return None
        name = name_for(settings, task_endpoint)
        if name is None:
            return None
        variable = settings.endpoint(name).key_env
        if variable is None or (self.env.get(variable) or "").strip():
            return None
        return (f"waits: the key of endpoint {name} is ${variable}, which is not set where "
                "this fleet-tui runs; a fleet-tui started where it is set starts it")

    def route_for(self, settings: Settings, name: str, key: str) -> Route:
        """The route of an attempt of endpoint `name` started by this engine with `key`:
        the endpoint's base URL in this engine's settings, and where the key came from (a
        keyring entry: the fleet's; a variable of this engine's environment: this
        engine's own, `owner`)."""
        route = routes_of(settings)[name]
        endpoint = settings.endpoint(name)
        service = settings.keyring_service
        keyring: tuple[str, str] | None = None
        if endpoint.key_env is not None:
            source = f"${endpoint.key_env}"
        elif endpoint.key_keyring is not None:
            source, keyring = (f"keyring {service}/{endpoint.key_keyring}",
                               (service, endpoint.key_keyring))
        else:
            source = next((f"${_SOURCE_VARIABLES[kind]}" for kind in settings.key_sources
                           if kind in _SOURCE_VARIABLES
                           and (self.env.get(_SOURCE_VARIABLES[kind]) or "").strip() == key),
                          "")
            if not source and "keyring" in settings.key_sources:
                source, keyring = (f"keyring {service}/{settings.keyring_key}",
                                   (service, settings.keyring_key))
        return dataclasses.replace(route, source=source, keyring=keyring,
                                   owner="" if keyring is not None else self.owner)

    def _ensure(self, *, force: bool = False) -> control.GatewayInfo:
        """The running gateway, holding this engine's routes and their keys: started with
        them when none runs, handed them when they changed since this engine last handed
        it any (or it is not the gateway this engine handed them to), or `force`d (an
        attempt's start: the gateway forgets a route's key once no live token maps to it,
        so a route used again is handed again)."""
        import hashlib  # here: a command that never hands the gateway keys never loads it

        routes = [route for route, _key in self._mine.values()]
        keys = {ident: key for ident, (_route, key) in self._mine.items()}
        data = control.handover(routes, keys)
        digest = hashlib.sha256(data).digest()
        db = Path(self.store.path)
        found = control.read_info(self.env, db)
        if found is None:  # started with these, or found started by another engine (the
            # handover below then changes nothing, or gives it ours)
            found = control.ensure(routes, keys, db=db, python=self.python, env=self.env)
        if routes and (force or self._handed != (found.pid, found.started_at, digest)):
            try:
                if control.hand_over(data, env=self.env, db=db):
                    log.info("the gateway was handed new keys or endpoints")
            except FleetError as exc:  # one of an older version has no control socket:
                # its workers keep the keys it has (`fleet-tui gateway stop` renews them)
                log.warning("%s", exc)
        self._handed = (found.pid, found.started_at, digest)
        return found

    def through(self, settings: Settings, task: Task, attempt: Attempt, host_name: str,
                overrides: dict[str, Any], env: dict[str, str], *,
                remote_ok: bool = False) -> str | None:
        """Send the attempt through the gateway: the runner's settings and environment
        changed in place; the token minted (None: the attempt goes direct)."""
        name = self.endpoint_of(settings, task, host_name, remote_ok=remote_ok)
        if name is None:
            return None
        assert self.keys is not None
        # afresh, as a runner going direct resolves its key at its start: a key set since
        # the last attempt reaches this one
        keys = self.keys(fresh=True)
        if name not in keys:  # no key: direct, where the launcher says where it looked
            return None
        route = self.route_for(settings, name, keys[name])
        # the token first: a gateway about to exit for want of work sees it and stays
        token = self.meter.mint(task.id, attempt.id, name, route=route.to_record())
        self._mine[route.id] = (route, keys[name])
        try:
            info = self._ensure(force=True)
        except BaseException:
            self.revoke_token(token)
            raise
        overrides["base_url"] = control.url_for(info, name)
        overrides["key_sources"] = ["env"]
        for variable in KEY_VARIABLES:
            env.pop(variable, None)
        env["ANTHROPIC_AUTH_TOKEN"] = token
        return token

    def revoke(self, attempt: Attempt) -> None:
        """The attempt's tokens work no more (it ended, was killed, or never started)."""
        try:
            self.meter.revoke(attempt_ids=[attempt.id])
        except Exception as exc:  # never stops finishing an attempt
            log.warning("could not revoke the gateway token of task %s: %s",
                        attempt.task_id, exc)

    def revoke_token(self, token: str) -> None:
        """One token works no more (its start failed)."""
        try:
            self.meter.revoke(token=token)
        except Exception as exc:
            log.warning("could not revoke a gateway token: %s", exc)

    def keep_alive(self, settings: Settings, running: bool) -> None:
        """While attempts run through it (a token not revoked): a gateway that died is
        started again (by any process), and this engine's routes with live tokens are
        handed to it again, with a keyring key changed since (it reaches their running
        workers within SecretCache.SECRET_TTL). Another process's routes are never
        touched."""
        if not running or not settings.gateway or self.keys is None:
            return
        now = time.monotonic()
        if now - self._checked < KEEP_ALIVE_EVERY:
            return
        self._checked = now
        try:
            if not self.meter.any_valid():
                return
            if self._mine:
                live = self.meter.live_routes()
                self._mine = {i: v for i, v in self._mine.items() if i in live}
            if any(route.keyring is not None for route, _key in self._mine.values()):
                keys = self.keys()
                for ident, (route, key) in list(self._mine.items()):
                    new = keys.get(route.name)
                    if route.keyring is not None and new and new != key \
                            and self.route_for(settings, route.name, new).id == ident:
                        self._mine[ident] = (route, new)
            self._ensure()
        except Exception as exc:  # the next pass tries again; the workers retry meanwhile
            log.warning("the gateway could not be started again: %s", exc)
