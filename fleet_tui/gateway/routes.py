"""The endpoints the gateway forwards to, as the settings name them.

`_endpoint(settings, name)` is the one lookup: today only "default" (the top-level
`base_url`); named endpoints (settings/endpoints.py) replace its body with their table.
A route never holds a key: the key travels beside it, only into the gateway's stdin."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT", "Route", "_endpoint", "name_for", "routes_of"]

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


def _max_requests(settings: Any) -> int:
    """The top-level `max_requests`; unset, as many as the workers (no line forms)."""
    value = getattr(settings, "max_requests", 0) or 0
    return int(value) if value > 0 else max(1, int(settings.max_workers))


def _endpoint(settings: Any, name: str) -> Route | None:
    """The endpoint called `name` in these settings, or None."""
    if name != DEFAULT:
        return None
    # the engine keys a task's endpoint (and its row in `endpoints`) by its base_url today
    return Route(DEFAULT, str(settings.base_url), _max_requests(settings),
                 str(settings.base_url))


def routes_of(settings: Any) -> dict[str, Route]:
    """Every endpoint of the settings, by name."""
    found = _endpoint(settings, DEFAULT)
    return {} if found is None else {found.name: found}


def name_for(settings: Any, task_endpoint: str) -> str | None:
    """The name of the endpoint a task runs on (its `endpoint` column, the base_url it was
    submitted with), or None when no endpoint of the settings is it (then it runs direct)."""
    for route in routes_of(settings).values():
        if task_endpoint in ("", route.store_key, route.name):
            return route.name
    return None
