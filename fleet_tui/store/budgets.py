"""Budgets: what an endpoint may spend in a local day, and a task in its life.

The meter (store/meter.py) has a row per request with its cost; this module turns the rows
into the one answer every process needs: may this task, on this endpoint, send another
request? The engine asks before it claims a task for an endpoint (a day's budget met holds
the endpoint's queue) and on every pass for the running tasks (a task's budget met stops
it); the gateway asks before it passes a request on (`budget_refusal`), so a worker cannot
overspend between two passes. Here, in the store's layer, because the gateway sits between
the engine and the hosts and imports nothing of the engine.

An endpoint is named as the tasks and the meter name it (`tasks.endpoint`,
`usage.endpoint`): an endpoint's name, or, for tasks from before named endpoints, the
default endpoint's base URL; both find the endpoint's settings (`endpoint_settings`) and
both are counted as its spend.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from fleet_tui.core import prices
from fleet_tui.core.policy import BUDGET_HOLD
from fleet_tui.settings.config_core import ConfigError
from fleet_tui.store.meter import Meter

if TYPE_CHECKING:
    from datetime import tzinfo

    from fleet_tui.settings.config import Settings
    from fleet_tui.settings.endpoints import Endpoint
    from fleet_tui.store.db import Store

__all__ = ["BUDGET_HOLD", "DEFAULT_NAME", "budget_refusal", "day_start", "endpoint_keys",
           "endpoint_refusal", "endpoint_settings", "next_day",
           "price_for_request", "request_cost", "spent_today", "task_budget", "task_refusal",
           "usd"]

DEFAULT_NAME = "default"


def usd(amount: float) -> str:
    """$0.42, $12.30; a fraction of a cent with 4 decimals ($0.0031), so it is not $0.00."""
    if 0 < abs(amount) < 0.01:
        return f"${amount:.4f}"
    return f"${amount:,.2f}"


# --- the endpoint's settings and names --------------------------------------------------


def endpoint_settings(settings: Settings, endpoint: str | None) -> Endpoint | None:
    """The settings of the endpoint a task or a meter row names (its name, or the default
    endpoint's base URL); None for one config.toml no longer has."""
    name = endpoint or DEFAULT_NAME
    try:
        return settings.endpoint(name)
    except ConfigError:
        pass
    if name == settings.base_url:
        return settings.endpoint(None)
    return None


def endpoint_keys(settings: Settings, endpoint: str) -> tuple[str, ...]:
    """Every name the store may know this endpoint by (its spend is theirs together)."""
    keys = [endpoint]
    found = endpoint_settings(settings, endpoint)
    if found is not None:
        keys.append(found.name)
        if found.name == DEFAULT_NAME:
            keys.append(settings.base_url)
    return tuple(dict.fromkeys(keys))


def _label(settings: Settings, endpoint: str) -> str:
    found = endpoint_settings(settings, endpoint)
    return found.name if found is not None else endpoint


def _setting(endpoint: Endpoint, key: str) -> str:
    """Where a budget is set, in config.toml's words."""
    if endpoint.name == DEFAULT_NAME:
        return f"{key} (config.toml)"
    return f"[endpoints.{endpoint.name}] {key} (config.toml)"


def price_for_request(settings: Settings, endpoint: str, model: str) -> prices.Rate | None:
    """The gateway's price lookup: the endpoint's override, else the shipped table."""
    found = endpoint_settings(settings, endpoint)
    return prices.price_for(model, found.prices if found is not None else None)


def request_cost(settings: Settings, endpoint: str, model: str, *, input_tokens: int = 0,
                 output_tokens: int = 0, cache_read_tokens: int = 0,
                 cache_write_tokens: int = 0) -> float | None:
    """USD of one request (the Usage row's `cost`), None when its model is unpriced."""
    return prices.cost_of(price_for_request(settings, endpoint, model),
                          input_tokens=input_tokens, output_tokens=output_tokens,
                          cache_read_tokens=cache_read_tokens,
                          cache_write_tokens=cache_write_tokens)


# --- the local day -----------------------------------------------------------------------


def day_start(now: float, tz: tzinfo | None = None) -> float:
    """The start of `now`'s local day (midnight; `tz`: the machine's zone when None)."""
    moment = datetime.fromtimestamp(now, tz).astimezone(tz)
    return moment.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()


def next_day(now: float, tz: tzinfo | None = None) -> float:
    """The start of the next local day (a budget hold lifts then)."""
    moment = datetime.fromtimestamp(day_start(now, tz), tz).astimezone(tz)
    # a day is not always 24 hours (summer time): midnight of the date after
    after = (moment + timedelta(hours=36)).replace(hour=0, minute=0, second=0,
                                                   microsecond=0)
    return after.timestamp()


# --- what is spent, what is left -------------------------------------------------------


def spent_today(store: Store, settings: Settings, endpoint: str, now: float | None = None,
                tz: tzinfo | None = None) -> float:
    """USD the endpoint spent since its local day began (priced requests)."""
    now = time.time() if now is None else now
    meter = Meter(store)
    since = day_start(now, tz)
    return sum(meter.spent(endpoint=key, since=since)
               for key in endpoint_keys(settings, endpoint))


def endpoint_refusal(store: Store, settings: Settings, endpoint: str,
                     now: float | None = None, tz: tzinfo | None = None) -> str | None:
    """Why the endpoint may start nothing more today (its spend has met its day's budget),
    with the figure; None when it has no budget or some of it is left."""
    found = endpoint_settings(settings, endpoint)
    budget = found.budget_per_day if found is not None else None
    if found is None or not budget:
        return None
    spent = spent_today(store, settings, endpoint, now, tz)
    if spent < budget:
        return None
    return (f"the endpoint {found.name} spent {usd(spent)} of its {usd(budget)} budget "
            f"today; its tasks start again at midnight (local time), or when "
            f"{_setting(found, 'budget_per_day')} is raised")


def task_budget(settings: Settings, endpoint: str) -> float | None:
    """The budget of one task on this endpoint (None: none)."""
    found = endpoint_settings(settings, endpoint)
    return found.budget_per_task if found is not None else None


def task_refusal(store: Store, settings: Settings, task_id: str, endpoint: str) -> str | None:
    """Why the task may send no more requests (its spend has met budget_per_task), with
    the figure; None when it has no budget or some of it is left."""
    budget = task_budget(settings, endpoint)
    if not budget:
        return None
    spent = Meter(store).spent(task_id=task_id)
    if spent < budget:
        return None
    found = endpoint_settings(settings, endpoint)
    where = _setting(found, "budget_per_task") if found is not None else "budget_per_task"
    return (f"stopped: task {task_id} spent {usd(spent)} of its {usd(budget)} budget; "
            f"raise {where} and retry it to go on")


def budget_refusal(store: Store, settings: Settings, task_id: str, endpoint: str,
                   now: float | None = None, tz: tzinfo | None = None) -> str | None:
    """Why a request of this task on this endpoint must not be sent (the task's budget or
    the endpoint's day's budget met), or None. The gateway's check before each request."""
    return task_refusal(store, settings, task_id, endpoint) \
        or endpoint_refusal(store, settings, endpoint, now, tz)
