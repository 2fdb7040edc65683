"""The endpoints the gateway forwards to, as the settings name them.

`_endpoint(settings, name)` is the one lookup, over the settings' named endpoints
(settings/endpoints.py; "default" is the top-level settings).
A route never holds a key: the key travels beside it, only into the gateway's stdin."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT", "UNLIMITED", "Route", "_endpoint", "name_for", "routes_of"]

DEFAULT = "default"


@dataclass(frozen=True)
class Route:
    """One endpoint: where its requests go, how many may be in flight at once, and the key
    of its row in the store's `endpoints` table (what the engine parks and holds)."""

    name: str
    base_url: str
    max_requests: int
    store_key: str

    def to_record(self) -> dict[str, Any]:
        return {"name": self.name, "base_url": self.base_url,
                "max_requests": self.max_requests, "store_key": self.store_key}

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Route:
        return cls(str(data["name"]), str(data["base_url"]), max(1, int(data["max_requests"])),
                   str(data["store_key"]))


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
