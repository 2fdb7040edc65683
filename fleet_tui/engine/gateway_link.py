"""The engine's hook into the gateway (issue 19): an attempt goes through it.

With the `gateway` setting on, a starting attempt gets the gateway's URL for its endpoint
as its base URL and a token minted for it as its key (`through`): the key variables of the
runner's environment are replaced by `ANTHROPIC_AUTH_TOKEN=<token>` (handed to the runner
through its pipe, `--env-fd`, as the key was) and its key sources narrowed to that one
variable, so nothing in the worker's reach holds the provider's key. The token is revoked
when the attempt ends or is killed (`revoke`). While attempts run through it, every pass
keeps the gateway alive (`keep_alive`: one started again after a crash, on the port it had,
so running workers find it after their CLI's retry).

The gateway is this machine's: only the local host's attempts go through it (a memory
host runs nothing; a remote host would need the gateway reachable from there).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fleet_tui.core.errors import FleetError
from fleet_tui.gateway import control
from fleet_tui.gateway.routes import name_for, routes_of
from fleet_tui.settings.config import Settings
from fleet_tui.store.db import Attempt, Store, Task
from fleet_tui.store.meter import Meter

__all__ = ["KEY_VARIABLES", "GatewayLink", "weak_keys"]

log = logging.getLogger("fleet_tui.engine.fleet")

# where a runner may find a key: none of them reaches a worker of the gateway but the token
KEY_VARIABLES = ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY", "ZHIPU_API_KEY", "GLM_API_KEY")
KEEP_ALIVE_EVERY = 0.5  # seconds between two looks at the gateway while attempts use it


def weak_keys(get: Callable[[], dict[str, str]]) -> Callable[[], dict[str, str]]:
    """`get` (a bound method) without holding its object: no keys once it is gone."""
    ref = weakref.WeakMethod(get)  # type: ignore[arg-type]

    def keys() -> dict[str, str]:
        method = ref()
        return method() if method is not None else {}

    return keys


class GatewayLink:
    """Tokens for attempts and the gateway they go through, for one engine."""

    def __init__(self, store: Store, *, env: Mapping[str, str], python: str,
                 keys: Callable[[], dict[str, str]] | None = None) -> None:
        self.store = store
        self.meter = Meter(store)
        self.env = env
        self.python = python
        # each endpoint's key as the engine resolves it (Fleet gives SecretCache.by_endpoint)
        self.keys = keys
        self._checked = 0.0

    def endpoint_of(self, settings: Settings, task: Task, host_name: str, *,
                    remote_ok: bool = False) -> str | None:
        """The gateway endpoint an attempt of `task` goes through, or None: direct
        (`remote_ok`: a host other than this machine reaches the gateway, by a port
        forwarded over its connection)."""
        if not settings.gateway or (host_name != "local" and not remote_ok) \
                or self.keys is None:
            return None
        return name_for(settings, task.endpoint)

    def _ensure(self, settings: Settings) -> control.GatewayInfo:
        found = control.read_info(self.env, Path(self.store.path))
        if found is not None:
            return found
        assert self.keys is not None
        keys = self.keys()
        if not keys:  # a gateway without a key would only get 401s for its workers
            raise FleetError("the gateway cannot start: no API key was found (see "
                             "`fleet-tui key status`)")
        routes = routes_of(settings)
        # each endpoint's key as its workers would resolve it (key_env, its keyring entry,
        # or the usual sources); one with none is refused by the gateway, saying so
        return control.ensure(list(routes.values()), keys, db=Path(self.store.path),
                              python=self.python, env=self.env)

    def through(self, settings: Settings, task: Task, attempt: Attempt, host_name: str,
                overrides: dict[str, Any], env: dict[str, str], *,
                remote_ok: bool = False) -> str | None:
        """Send the attempt through the gateway: the runner's settings and environment
        changed in place; the token minted (None: the attempt goes direct)."""
        name = self.endpoint_of(settings, task, host_name, remote_ok=remote_ok)
        if name is None:
            return None
        assert self.keys is not None
        if name not in self.keys():  # no key: direct, where the launcher says where it looked
            return None
        # the token first: a gateway about to exit for want of work sees it and stays
        token = self.meter.mint(task.id, attempt.id, name)
        try:
            info = self._ensure(settings)
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
        started again."""
        if not running or not settings.gateway or self.keys is None:
            return
        now = time.monotonic()
        if now - self._checked < KEEP_ALIVE_EVERY:
            return
        self._checked = now
        try:
            if not self.meter.any_valid():
                return
            self._ensure(settings)
        except Exception as exc:  # the next pass tries again; the workers retry meanwhile
            log.warning("the gateway could not be started again: %s", exc)
