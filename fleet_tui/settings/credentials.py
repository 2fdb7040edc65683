"""Where the workers' key comes from: the environment, the OS keyring, an endpoint's own
variable or entry; never the value in what is reported about it.

Settings-level: the engine (to hide the key in what it writes and shows), the CLI (`key`,
`doctor`, `run`'s early refusal) and the launcher all read the key's sources here. Kept
as cheap to import as the launcher (fleet-worker imports it on every launch): only `os`
at the top; `keyring` only when the keyring is consulted.
"""

from __future__ import annotations

import os

from fleet_tui.core.errors import FleetTuiError

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: these imports cost start-up time
    from collections.abc import Mapping, Sequence

    from fleet_tui.settings.config_core import SettingsLike as Settings
    from fleet_tui.settings.endpoints import Endpoint


class LaunchError(FleetTuiError):
    """Why claude cannot be launched, and the exit code fleet-worker uses for it.
    Messages never contain the key."""

    exit_code = 1
    title = "Cannot launch claude"

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message, exit_code=exit_code)


class NoCredentialError(LaunchError):
    """No API key in any allowed source (exit 5, as the original)."""

    exit_code = 5


class Credential:
    """An API key and where it came from. `value` stays out of repr/str so a stray log
    line or traceback of a Credential cannot show it. (Plain class, not a dataclass:
    generating dataclass methods costs fleet-worker startup time.)"""

    __slots__ = ("kind", "source", "value")

    def __init__(self, source: str, value: str, kind: str = "") -> None:
        self.source = source  # human-readable: "ANTHROPIC_AUTH_TOKEN", "keyring svc/key"
        self.value = value
        self.kind = kind  # one of config.KEY_SOURCES: env, keyring, zhipu, glm

    def __repr__(self) -> str:
        return f"Credential(source={self.source!r}, kind={self.kind!r}, value=<redacted>)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Credential) and
                (self.source, self.value, self.kind) == (other.source, other.value, other.kind))

    def __hash__(self) -> int:
        return hash((self.source, self.kind))


class SourceCheck:
    """What one credential source held (never the value): for messages and `key status`."""

    __slots__ = ("found", "kind", "label", "reason")

    def __init__(self, kind: str, label: str, found: bool, reason: str) -> None:
        self.kind = kind
        self.label = label
        self.found = found
        self.reason = reason  # "set", "not set", "no entry", "no usable OS keyring ...", ...

    def __repr__(self) -> str:
        return (f"SourceCheck(kind={self.kind!r}, label={self.label!r}, found={self.found!r}, "
                f"reason={self.reason!r})")


_ENV_SOURCES = {"env": "ANTHROPIC_AUTH_TOKEN", "zhipu": "ZHIPU_API_KEY", "glm": "GLM_API_KEY"}


def source_label(kind: str, settings: Settings) -> str:
    """The name a user recognises for one key source."""
    if kind == "keyring":
        return f"keyring {settings.keyring_service}/{settings.keyring_key}"
    return _ENV_SOURCES[kind]


def _clean(value: str | None) -> str:
    """Keys pasted or read from a keyring often carry a trailing CR/LF (spec §5)."""
    return (value or "").strip()


def read_keyring(service: str, key: str) -> tuple[str | None, str]:
    """(value or None, reason) from the OS keyring through the keyring library.

    Any backend failure (no backend at all, a locked or broken one) counts as "not
    found there", with the reason kept for the message; never a traceback.
    """
    try:
        import keyring
    except ImportError:
        return None, "the keyring library is not installed"
    try:
        value = keyring.get_password(service, key)
    except Exception as exc:  # every backend raises its own types
        return None, keyring_failure_reason(exc)
    if value is None:
        return None, "no entry"
    if not _clean(value):
        return None, "entry is empty"
    return value, "set"


def keyring_failure_reason(exc: BaseException) -> str:
    """A short reason for a keyring backend failure (shared by `fleet-tui key`)."""
    if type(exc).__name__ == "NoKeyringError":
        return "no usable OS keyring backend on this machine"
    text = " ".join(str(exc).split())[:160]
    return f"keyring backend failed ({type(exc).__name__}{': ' + text if text else ''})"


def check_sources(settings: Settings, env: Mapping[str, str] | None = None, *,
                  stop_at_first: bool = True) -> tuple[Credential | None, list[SourceCheck]]:
    """Look through the allowed key sources in order; return the first credential found and
    what each source consulted held. With stop_at_first=False every source is looked at
    (for `key status` and `fleet-doctor`), which may import keyring."""
    env = os.environ if env is None else env
    found: Credential | None = None
    checks: list[SourceCheck] = []
    for kind in settings.key_sources:
        label = source_label(kind, settings)
        if kind == "keyring":
            raw, reason = read_keyring(settings.keyring_service, settings.keyring_key)
        else:
            raw = env.get(_ENV_SOURCES[kind])
            reason = "set" if _clean(raw) else ("empty" if raw is not None else "not set")
        value = _clean(raw)
        checks.append(SourceCheck(kind, label, bool(value), reason))
        if value and found is None:
            found = Credential(source=label, value=value, kind=kind)
            if stop_at_first:
                break
    return found, checks


def no_credential_message(settings: Settings, checks: Sequence[SourceCheck],
                          env: Mapping[str, str]) -> str:
    """Each place looked at, why nothing was there, and how to set a key."""
    lines = ["no API key found. Looked in, in this order:"]
    lines += [f"  - {c.label}: {c.reason}" for c in checks]
    ignored = [kind for kind in ("env", "zhipu", "glm")
               if kind not in settings.key_sources and _clean(env.get(_ENV_SOURCES[kind]))]
    if ignored:
        lines.append("  (ignored because FLEET_WORKER_KEY_SOURCES="
                     + ",".join(settings.key_sources) + " leaves them out: "
                     + ", ".join(_ENV_SOURCES[k] for k in ignored) + ")")
    lines += [
        "Set one:",
        "  fleet-tui key set            store it in the OS keyring (prompted, not echoed)",
        "  export ZHIPU_API_KEY=...     or GLM_API_KEY / ANTHROPIC_AUTH_TOKEN",
    ]
    if tuple(settings.key_sources) != ("env", "keyring", "zhipu", "glm"):
        lines.append("  or widen FLEET_WORKER_KEY_SOURCES (env,keyring,zhipu,glm)")
    return "\n".join(lines)


def resolve_credential(settings: Settings, env: Mapping[str, str] | None = None) -> Credential:
    """The API key: ANTHROPIC_AUTH_TOKEN, the keyring entry, ZHIPU_API_KEY, GLM_API_KEY
    (restricted and ordered by settings.key_sources); surrounding whitespace stripped."""
    env = os.environ if env is None else env
    credential, checks = check_sources(settings, env)
    if credential is None:
        raise NoCredentialError(no_credential_message(settings, checks, env))
    return credential


def endpoint_sources(settings: Settings, endpoint: Endpoint,
                     env: Mapping[str, str] | None = None, *, stop_at_first: bool = True
                     ) -> tuple[Credential | None, list[SourceCheck]]:
    """`check_sources` for a named endpoint: a key_env endpoint looks only at
    its variable, a key_keyring one only at its entry under keyring_service; neither: the
    usual sources. Never the value in what it reports."""
    env = os.environ if env is None else env
    if endpoint.key_env is not None:
        raw = env.get(endpoint.key_env)
        value = _clean(raw)
        reason = "set" if value else ("empty" if raw is not None else "not set")
        label = f"${endpoint.key_env}"
        return (Credential(source=label, value=value, kind="env") if value else None,
                [SourceCheck("env", label, bool(value), reason)])
    if endpoint.key_keyring is not None:
        label = f"keyring {settings.keyring_service}/{endpoint.key_keyring}"
        found, reason = read_keyring(settings.keyring_service, endpoint.key_keyring)
        value = _clean(found)
        return (Credential(source=label, value=value, kind="keyring") if value else None,
                [SourceCheck("keyring", label, bool(value), reason)])
    return check_sources(settings, env, stop_at_first=stop_at_first)


def endpoint_credential(settings: Settings, endpoint: Endpoint,
                        env: Mapping[str, str] | None = None) -> Credential:
    """The key a runner of `endpoint` gets (NoCredentialError: where it looked, why
    nothing was there, how to set it)."""
    env = os.environ if env is None else env
    if not endpoint.own_key:
        return resolve_credential(settings, env)
    credential, checks = endpoint_sources(settings, endpoint, env)
    if credential is not None:
        return credential
    (check,) = checks
    how = (f"export {endpoint.key_env}=... where fleet-tui runs" if endpoint.key_env
           else f"fleet-tui key set --endpoint {endpoint.name}")
    raise NoCredentialError(f"no API key for the endpoint {endpoint.name!r}: {check.label}: "
                            f"{check.reason}. Set it: {how}")
