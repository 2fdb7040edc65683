"""The price table: what a request costs, from the tokens the gateway metered.

USD per million tokens of each model: input, cached input (a cache read), cache write and
output. The table ships with the public prices below; an endpoint's `prices` in config.toml
(settings/endpoints.py) overrides them model by model. A model neither knows is unpriced:
its requests are counted, their cost is None, and every figure that leaves them out says
so (`fleet-tui cost`, `ls --json`'s `unpriced`). A guessed price would make a budget lie.

Sources, read 2026-12-02:
- GLM (z.ai pay-as-you-go): the project's provider reference (provider-errors.md,
  "Prices"); where it gives two figures the higher is kept (a budget should not be met
  late), and an unknown cached-input price is the input price. z.ai publishes no separate
  cache-write price: a cache write is billed as input. GLM-4.5-Air, the default small
  model, from z.ai's published list (0.20 / 0.03 / 1.10).
- Claude (Anthropic's pricing page, platform.claude.com/docs/en/about-claude/pricing):
  base input, 5-minute cache write (1.25x input), cache hit (0.1x input), output. Opus 4 and
  4.1 are the old $15/$75 tier; Opus 4.5 and later $5/$25; every Sonnet 4.x $3/$15; Haiku
  4.5 $1/$5. A 4.x id this table does not name takes its family's newest price.

Imports nothing of the settings (core is the bottom layer): `Rate` is the shape a price
has, which `settings.endpoints.Price` has too, so an endpoint's overrides are used as they
are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

__all__ = ["FAMILIES", "PRICES", "Rate", "TablePrice", "cost_of", "normalize", "price_for"]


class Rate(Protocol):
    """USD per million tokens of one model (settings.endpoints.Price has these fields)."""

    @property
    def input(self) -> float: ...
    @property
    def cached_input(self) -> float: ...
    @property
    def cache_write(self) -> float: ...
    @property
    def output(self) -> float: ...


@dataclass(frozen=True, slots=True)
class TablePrice:
    """A price of the shipped table."""

    input: float
    cached_input: float
    cache_write: float
    output: float


def _claude(input_: float, output: float) -> TablePrice:
    """Anthropic's rule: a cache write costs 1.25x the input, a cache read 0.1x."""
    return TablePrice(input_, round(input_ * 0.1, 6), round(input_ * 1.25, 6), output)


_OPUS_OLD = _claude(15.0, 75.0)
_OPUS = _claude(5.0, 25.0)
_SONNET = _claude(3.0, 15.0)
_HAIKU = _claude(1.0, 5.0)

# model id (normalized: lower case, dots as dashes, no date) -> price
PRICES: dict[str, TablePrice] = {
    "glm-5-3": TablePrice(1.40, 0.26, 1.40, 4.40),
    "glm-5-2": TablePrice(1.40, 0.26, 1.40, 4.40),
    "glm-5-1": TablePrice(1.40, 1.40, 1.40, 4.40),
    "glm-5": TablePrice(1.00, 1.00, 1.00, 3.20),
    "glm-4-7": TablePrice(0.60, 0.60, 0.60, 2.20),
    "glm-4-5-air": TablePrice(0.20, 0.03, 0.20, 1.10),
    "claude-opus-4": _OPUS_OLD,
    "claude-opus-4-0": _OPUS_OLD,
    "claude-opus-4-1": _OPUS_OLD,
    "claude-opus-4-5": _OPUS,
    "claude-opus-4-6": _OPUS,
    "claude-opus-4-7": _OPUS,
    "claude-opus-4-8": _OPUS,
    "claude-sonnet-4": _SONNET,
    "claude-sonnet-4-0": _SONNET,
    "claude-sonnet-4-5": _SONNET,
    "claude-sonnet-4-6": _SONNET,
    "claude-haiku-4-5": _HAIKU,
}
# a family's price for an id of it the table does not name (its newest members' price)
FAMILIES: dict[str, TablePrice] = {
    "claude-opus-4-": _OPUS,
    "claude-sonnet-4-": _SONNET,
    "claude-haiku-4-": _HAIKU,
}

_DATE = re.compile(r"-(?:\d{8}|latest)$")  # claude-sonnet-4-5-20250929, ...-latest
_CONTEXT = re.compile(r"\[[^\]]*\]$")  # claude-sonnet-4-5[1m]


def normalize(model: str) -> str:
    """The id the table is keyed by: lower case, a provider's prefix ("anthropic/") and a
    context tag ("[1m]") left out, dots as dashes ("claude-opus-4.5"), no date suffix."""
    text = model.strip().lower().rsplit("/", 1)[-1]
    text = _CONTEXT.sub("", text).replace(".", "-").replace("_", "-")
    return _DATE.sub("", text)


def price_for(model: str | None, overrides: Mapping[str, Rate] | None = None
              ) -> Rate | None:
    """The model's price: the endpoint's override first (its model names compared case-
    insensitively, dated ids finding the override of their undated name too), then the
    table; an id with a suffix the table does not know takes the price of the id it extends,
    or its family's; None when nothing prices it."""
    if not model:
        return None
    wanted = normalize(model)
    if overrides:
        exact = model.strip().lower()
        for name, price in overrides.items():
            if name.strip().lower() == exact:
                return price
        named = {normalize(name): price for name, price in overrides.items()}
        found = named.get(wanted) or _by_prefix(wanted, named, {})
        if found is not None:
            return found
    return PRICES.get(wanted) or _by_prefix(wanted, PRICES, FAMILIES)


def _by_prefix(wanted: str, ids: Mapping[str, Rate], families: Mapping[str, Rate]
               ) -> Rate | None:
    """The price of the longest id `wanted` extends ("glm-5-2-0901": glm-5-2), or of its
    family; a family wins a tie (claude-opus-4-9 is a new Opus 4.x, not Opus 4)."""
    best: tuple[int, int, Rate] | None = None
    for key, price in ids.items():
        if wanted.startswith(key + "-") and (best is None or len(key) + 1 > best[0]):
            best = (len(key) + 1, 0, price)
    for prefix, price in families.items():
        if wanted.startswith(prefix) and (best is None or len(prefix) >= best[0]):
            best = (len(prefix), 1, price)
    return best[2] if best is not None else None


def cost_of(price: Rate | None, *, input_tokens: int = 0, output_tokens: int = 0,
            cache_read_tokens: int = 0, cache_write_tokens: int = 0) -> float | None:
    """USD for one request's usage at `price` (None when unpriced). Input tokens are the
    uncached ones, as the Messages API counts them (cache reads and writes apart)."""
    if price is None:
        return None
    return (max(0, input_tokens) * price.input
            + max(0, cache_read_tokens) * price.cached_input
            + max(0, cache_write_tokens) * price.cache_write
            + max(0, output_tokens) * price.output) / 1_000_000
