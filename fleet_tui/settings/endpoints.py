"""Named endpoints: `[endpoints.NAME]` tables of config.toml.

Users run several providers side by side (z.ai, Anthropic, a team's LiteLLM gateway...).
Each named endpoint has its base URL, where its key comes from, its models, its limits
(workers at once, requests in flight through the gateway), its budgets and its price
overrides. Today's top-level settings are the endpoint "default", so an existing config
keeps working unchanged; a top-level `[prices."MODEL"]` table holds the default endpoint's
price overrides.

    [endpoints.zai]
    base_url = "https://api.z.ai/api/anthropic"
    key_env = "ZAI_KEY"             # or key_keyring = "zai"; absent: the usual sources
    model = "GLM-5.2"
    small_model = "GLM-4.5-Air"
    max_workers = 8
    max_requests = 2
    budget_per_day = 5.0            # USD
    [endpoints.zai.prices."GLM-5.2"]  # USD per million tokens
    input = 1.40
    cached_input = 0.26
    cache_write = 1.40
    output = 4.40

What a named endpoint leaves out comes from the top-level settings (its models, its worker
cap), except its key: absent, the usual sources; and its limits on requests and money:
absent, none.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from fleet_tui.settings.config_core import (
    ConfigError,
    _line_of_key,
    _read_toml,
    check_length,
)

DEFAULT = "default"
TABLE = "endpoints"
PRICES_TABLE = "prices"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PRICE_FIELDS = ("input", "cached_input", "cache_write", "output")
FIELDS = ("base_url", "key_env", "key_keyring", "model", "small_model", "max_workers",
          "max_requests", "budget_per_day", "budget_per_task", "prices")


@dataclass(frozen=True)
class Price:
    """USD per million tokens of one model."""

    input: float
    cached_input: float
    cache_write: float
    output: float

    def cost(self, *, input_tokens: int, output_tokens: int, cache_read_tokens: int = 0,
             cache_write_tokens: int = 0) -> float:
        return (input_tokens * self.input + cache_read_tokens * self.cached_input
                + cache_write_tokens * self.cache_write
                + output_tokens * self.output) / 1_000_000


@dataclass(frozen=True)
class Endpoint:
    """One endpoint workers can be sent to."""

    name: str
    base_url: str
    model: str
    small_model: str
    max_workers: int
    key_env: str | None = None  # the environment variable holding its key
    key_keyring: str | None = None  # its keyring entry (under keyring_service)
    max_requests: int | None = None  # requests in flight through the gateway (None: any)
    budget_per_day: float | None = None  # USD (None: no budget)
    budget_per_task: float | None = None
    prices: Mapping[str, Price] = field(default_factory=dict)  # overrides, per model

    @property
    def own_key(self) -> bool:
        """Does it take its key from a source of its own (else the usual sources)?"""
        return self.key_env is not None or self.key_keyring is not None


class _Top:
    """What endpoints read of the top-level settings (`Settings` has these fields)."""

    base_url: str
    model: str
    small_model: str
    max_workers: int
    max_requests: int
    budget_per_day: float
    budget_per_task: float


def default_endpoint(settings: object, prices: Mapping[str, Price] | None = None
                     ) -> Endpoint:
    """The top-level settings as the endpoint "default"."""
    top: _Top = settings  # type: ignore[assignment]
    return Endpoint(DEFAULT, top.base_url, top.model, top.small_model, top.max_workers,
                    max_requests=top.max_requests or None,
                    budget_per_day=top.budget_per_day or None,
                    budget_per_task=top.budget_per_task or None,
                    prices=dict(prices or {}))


def read_endpoints(config_file: str, settings: object) -> tuple[Endpoint, ...]:
    """The default endpoint, then every `[endpoints.NAME]` of config.toml in file order.
    ConfigError (file, line, what is accepted) for any bad table or value."""
    data, text = _read_toml(config_file)
    top_prices = _prices(data.get(PRICES_TABLE), config_file, text, f"[{PRICES_TABLE}]")
    found = [default_endpoint(settings, top_prices)]
    tables = data.get(TABLE)
    if tables is None:
        return tuple(found)
    if not isinstance(tables, dict):
        raise ConfigError(f"{_where(config_file, text, TABLE)}: {TABLE} must be tables: "
                          f"[{TABLE}.NAME]", path=config_file, key=TABLE)
    top: _Top = settings  # type: ignore[assignment]
    for name, table in tables.items():
        where = f"{config_file}: [{TABLE}.{name}]"
        if name == DEFAULT:
            raise ConfigError(f"{where}: the top-level settings are the endpoint "
                              f"{DEFAULT!r}; give this one another name", path=config_file)
        if not NAME_RE.fullmatch(name):
            raise ConfigError(f"{where}: an endpoint's name is letters, digits, '-', '_' "
                              "or '.' (at most 40), starting with a letter or digit",
                              path=config_file)
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: must be a table of settings", path=config_file)
        unknown = sorted(set(table) - set(FIELDS))
        if unknown:
            raise ConfigError(f"{where}: unknown setting {unknown[0]!r}; an endpoint takes "
                              + ", ".join(FIELDS), path=config_file, key=unknown[0])
        if "base_url" not in table:
            raise ConfigError(f"{where}: base_url is missing (the endpoint's http(s) URL)",
                              path=config_file, key="base_url")
        found.append(Endpoint(
            name=name,
            base_url=_url(table["base_url"], where),
            model=_text(table.get("model", top.model), where, "model"),
            small_model=_text(table.get("small_model", top.small_model), where,
                              "small_model"),
            max_workers=_count(table.get("max_workers", top.max_workers), where,
                               "max_workers"),
            key_env=_env_name(table.get("key_env"), where),
            key_keyring=_optional_text(table.get("key_keyring"), where, "key_keyring"),
            max_requests=_optional_count(table.get("max_requests"), where, "max_requests"),
            budget_per_day=_money(table.get("budget_per_day"), where, "budget_per_day"),
            budget_per_task=_money(table.get("budget_per_task"), where, "budget_per_task"),
            prices=_prices(table.get("prices"), config_file, text, f"{where} prices"),
        ))
    return tuple(found)


def launch_overrides(endpoint: Endpoint) -> dict[str, object]:
    """The launcher's settings a worker of `endpoint` sees beside the top-level ones (a
    runner's, `fleet-worker --endpoint NAME`'s): its base URL and models, and for a key of
    its own where to read it (a key_env endpoint's key is handed as the "env" source's
    variable: `runner_env`)."""
    out: dict[str, object] = {"base_url": endpoint.base_url, "model": endpoint.model,
                              "small_model": endpoint.small_model}
    if endpoint.key_env is not None:
        out["key_sources"] = ("env",)
    elif endpoint.key_keyring is not None:
        out["key_sources"], out["keyring_key"] = ("keyring",), endpoint.key_keyring
    return out


def find(endpoints: tuple[Endpoint, ...], name: str | None) -> Endpoint:
    """The endpoint of that name (None: the default); ConfigError naming the known ones."""
    wanted = name or DEFAULT
    for endpoint in endpoints:
        if endpoint.name == wanted:
            return endpoint
    known = ", ".join(e.name for e in endpoints)
    raise ConfigError(f"unknown endpoint {wanted!r}; the endpoints are: {known} (add "
                      f"[{TABLE}.{wanted}] to config.toml to define it)", key="endpoint")


def _where(path: str, text: str, key: str) -> str:
    line = _line_of_key(text, key)
    return f"{path}, line {line}" if line else path


def _text(raw: object, where: str, key: str) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError(f"{where}: {key}: expected a non-empty string", key=key)
    try:
        check_length(raw.strip())
    except ValueError as exc:
        raise ConfigError(f"{where}: {key}: {exc}", key=key) from None
    return raw.strip()


def _optional_text(raw: object, where: str, key: str) -> str | None:
    return None if raw is None else _text(raw, where, key)


def _url(raw: object, where: str) -> str:
    text = _text(raw, where, "base_url")
    if not text.startswith(("http://", "https://")):
        raise ConfigError(f"{where}: base_url: {text!r} is not an http(s) URL",
                          key="base_url")
    return text.rstrip("/")


def _env_name(raw: object, where: str) -> str | None:
    if raw is None:
        return None
    text = _text(raw, where, "key_env")
    if not ENV_NAME_RE.fullmatch(text):
        raise ConfigError(f"{where}: key_env: {text!r} is not an environment variable's "
                          "name (the name of the variable that holds the key, not the key)",
                          key="key_env")
    return text


def _count(raw: object, where: str, key: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise ConfigError(f"{where}: {key}: expected a whole number >= 1, got {raw!r}",
                          key=key)
    return raw


def _optional_count(raw: object, where: str, key: str) -> int | None:
    return None if raw is None else _count(raw, where, key)


def _number(raw: object, where: str, key: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw != raw \
            or raw in (float("inf"), float("-inf")) or raw < 0:
        raise ConfigError(f"{where}: {key}: expected a number >= 0, got {raw!r}", key=key)
    return float(raw)


def _money(raw: object, where: str, key: str) -> float | None:
    if raw is None:
        return None
    value = _number(raw, where, key)
    return value or None  # 0: no budget


def _prices(raw: object, path: str, text: str, where: str) -> dict[str, Price]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: {where} must be tables: [...prices.\"MODEL\"] with "
                          + ", ".join(PRICE_FIELDS), path=path, key=PRICES_TABLE)
    out: dict[str, Price] = {}
    for model, table in raw.items():
        at = f"{where} \"{model}\""
        if not isinstance(table, dict):
            raise ConfigError(f"{at}: must be a table of " + ", ".join(PRICE_FIELDS)
                              + " (USD per million tokens)", path=path, key=model)
        unknown = sorted(set(table) - set(PRICE_FIELDS))
        if unknown:
            raise ConfigError(f"{at}: unknown price {unknown[0]!r}; a price table takes "
                              + ", ".join(PRICE_FIELDS), path=path, key=unknown[0])
        for needed in ("input", "output"):
            if needed not in table:
                raise ConfigError(f"{at}: {needed} is missing (USD per million tokens)",
                                  path=path, key=needed)
        given = {k: _number(v, at, k) for k, v in table.items()}
        out[str(model)] = Price(input=given["input"],
                                cached_input=given.get("cached_input", given["input"]),
                                cache_write=given.get("cache_write", given["input"]),
                                output=given["output"])
    return out


def to_data(endpoints: tuple[Endpoint, ...]) -> list[dict[str, object]]:
    """The endpoints as JSON-ready data (a detached process's spec carries them)."""
    return [{**{k: v for k, v in vars(e).items() if k != "prices"},
             "prices": {m: vars(p) for m, p in e.prices.items()}} for e in endpoints]


def from_data(data: object) -> tuple[Endpoint, ...]:
    """Back from `to_data` (anything else: none)."""
    if not isinstance(data, list):
        return ()
    out = []
    for item in data:
        if isinstance(item, dict):
            prices = {str(m): Price(**p) for m, p in dict(item.get("prices") or {}).items()}
            out.append(Endpoint(**{**item, "prices": prices}))
    return tuple(out)


# --- a task's endpoint, and what its runner is given -----------------------------------------

# The variables a runner may take the key from (the launcher's env sources). A named
# endpoint with a key of its own gets none of the engine's: its key, and only its key.
KEY_VARIABLES = ("ANTHROPIC_AUTH_TOKEN", "ZHIPU_API_KEY", "GLM_API_KEY")
HANDED_KEY = "ANTHROPIC_AUTH_TOKEN"  # how a key_env endpoint's key reaches its runner


def lookup(endpoints: tuple[Endpoint, ...], name: str | None) -> Endpoint:
    """A stored task's endpoint, for its settings (cap, models): the one `name_of` names,
    else the default. A task row holds its endpoint's name (the store's migration read the
    base URLs of older rows as "default"); the supervisor refuses to start a task whose
    name config.toml no longer has (`missing`), so this fallback only sets its limits."""
    wanted = name_of(endpoints, name)
    for endpoint in endpoints:
        if endpoint.name == wanted:
            return endpoint
    return endpoints[0]


def missing(endpoints: tuple[Endpoint, ...], name: str | None) -> str | None:
    """Why a task on endpoint `name` cannot start (its name is gone from config.toml), or
    None. A base URL (a row from before names, or a test's) is not a name: it reads as
    `name_of` says."""
    if not name or name == DEFAULT or "://" in name or any(e.name == name for e in endpoints):
        return None
    known = ", ".join(e.name for e in endpoints) or DEFAULT
    return (f"its endpoint {name!r} is not in config.toml any more (the endpoints are: "
            f"{known}); add [{TABLE}.{name}] back and retry it, or run it again on another")


def name_of(endpoints: tuple[Endpoint, ...], value: str | None) -> str:
    """The name an endpoint is known by in the store, from a name or a base URL (the
    default's first, then in file order); anything else: the default."""
    if not value:
        return DEFAULT
    for endpoint in endpoints:
        if endpoint.name == value:
            return value
    wanted = value.rstrip("/")
    for endpoint in endpoints:
        if endpoint.base_url.rstrip("/") == wanted:
            return endpoint.name
    return DEFAULT


def key_env_names(endpoints: tuple[Endpoint, ...]) -> set[str]:
    """The variables named endpoints take their keys from (never in a runner's
    environment: a worker's Bash step can read it)."""
    return {e.key_env for e in endpoints if e.key_env is not None}


class MissingKey(ConfigError):
    """A key_env endpoint whose variable the engine's environment does not hold."""


def runner_env(endpoint: Endpoint, endpoints: tuple[Endpoint, ...],
               env: Mapping[str, str], keys_from: Mapping[str, str] | None = None
               ) -> dict[str, str]:
    """The environment a runner of `endpoint` starts with, from `env` (the host's for its
    runners): no endpoint's key_env variable; for an endpoint with a key of its own, none
    of the key variables either, and a key_env endpoint's key, read from `keys_from` (the
    engine's environment; default `env`), as HANDED_KEY (the host hands the key variables
    over through a pipe, never the runner's environment). MissingKey when a key_env
    endpoint's variable is not set."""
    out = {k: v for k, v in env.items() if k not in key_env_names(endpoints)}
    if not endpoint.own_key:
        return out
    for name in KEY_VARIABLES:
        out.pop(name, None)
    if endpoint.key_env is not None:
        source = env if keys_from is None else keys_from
        value = (source.get(endpoint.key_env) or "").strip()
        if not value:
            raise MissingKey(f"the endpoint {endpoint.name!r} takes its key from "
                             f"${endpoint.key_env}, which is "
                             f"{'empty' if endpoint.key_env in source else 'not set'} in the "
                             "engine's environment; export it where fleet-tui runs",
                             key="key_env")
        out[HANDED_KEY] = value
    return out
