"""The endpoints the gateway forwards to, as the settings name them, and each attempt's route.

`_endpoint(settings, name)` is the one lookup, over the settings' named endpoints
(settings/endpoints.py; "default" is the top-level settings).
A route never holds a key: the key travels beside it, only into the gateway's stdin or its
control socket, under the route's `id`.

A route is fixed when an attempt starts (the engine that starts it records it with the
attempt's token in the store): its endpoint, its base URL and where its key comes from
(`source`). A key from the keyring is the fleet's (`owner` empty: any process resolves the
same entry, and so may the gateway itself); a key from a variable of the environment is the
starting process's own (`owner`: its pid and start time), so that a fleet-tui process of
another shell, with another value there, never changes the key of a task it did not start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT", "UNLIMITED", "Route", "_endpoint", "name_for", "routes_of"]

DEFAULT = "default"


@dataclass(frozen=True)
class Route:
    """One endpoint: where its requests go, how many may be in flight at once, and the key
    of its row in the store's `endpoints` table (what the engine parks and holds); for an
    attempt's route also where its key comes from: `source` ("keyring SERVICE/ENTRY",
    "$VAR"; "" unknown), `keyring` (service and entry, for a keyring key) and `owner` (the
    process whose environment holds the key: "pid:start:seq"; "" for a shared key)."""

    name: str
    base_url: str
    max_requests: int
    store_key: str
    source: str = ""
    keyring: tuple[str, str] | None = None
    owner: str = ""

    @property
    def id(self) -> str:
        """What the gateway keys the route's key by: the same endpoint, URL and key source
        (and owner) are one route, whoever hands it over."""
        import hashlib  # here, as store.meter's

        ident = json.dumps([self.name, self.base_url, self.source, self.owner])
        return hashlib.sha256(ident.encode()).hexdigest()[:20]

    def owner_pid(self) -> tuple[int, str | None] | None:
        """The owning process's pid and start time, or None (a shared key)."""
        pid, _, rest = self.owner.partition(":")
        if not pid.isdigit():
            return None
        start = rest.partition(":")[0]
        return int(pid), (start if start and start != "0" else None)

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"name": self.name, "base_url": self.base_url,
                                  "max_requests": self.max_requests,
                                  "store_key": self.store_key, "id": self.id}
        if self.source:
            record["source"] = self.source
        if self.keyring is not None:
            record["keyring"] = list(self.keyring)
        if self.owner:
            record["owner"] = self.owner
        return record

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Route:
        ring = data.get("keyring")
        keyring = (str(ring[0]), str(ring[1])) if isinstance(ring, list | tuple) \
            and len(ring) == 2 else None
        return cls(str(data["name"]), str(data["base_url"]), max(1, int(data["max_requests"])),
                   str(data["store_key"]), str(data.get("source") or ""), keyring,
                   str(data.get("owner") or ""))


UNLIMITED = 1_000_000  # max_requests unset: no line forms


def _route(endpoint: Any) -> Route:
    # the engine keys a task's endpoint (and its row in `endpoints`) by its name (v8)
    return Route(str(endpoint.name), str(endpoint.base_url),
                 int(endpoint.max_requests or UNLIMITED), str(endpoint.name))


def _endpoints(settings: Any) -> tuple[Any, ...]:
    from fleet_tui.settings import endpoints

    return tuple(settings.endpoints) or (endpoints.default_endpoint(settings),)


def _endpoint(settings: Any, name: str) -> Route | None:
    """The endpoint called `name` in these settings (settings/endpoints.py), or None."""
    from fleet_tui.settings.config_core import ConfigError

    try:
        return _route(settings.endpoint(name))
    except ConfigError:
        return None


def routes_of(settings: Any) -> dict[str, Route]:
    """Every endpoint of the settings, by name."""
    return {str(e.name): _route(e) for e in _endpoints(settings)}


def name_for(settings: Any, task_endpoint: str) -> str | None:
    """The name of the endpoint a task runs on (its `endpoint` column: the base_url it was
    submitted with, or an endpoint's name), or None when no endpoint of the settings is it
    (then it runs direct)."""
    routes = routes_of(settings)
    if task_endpoint in routes:
        return task_endpoint
    if task_endpoint == "":
        return DEFAULT if DEFAULT in routes else None
    for route in routes.values():  # a row from before names (v8 reads those "default")
        if task_endpoint == route.base_url:
            return route.name
    return None
