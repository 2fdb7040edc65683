"""The key the workers get, as the engine knows it: for the diff's, the merge's and the
push's secret scan, and for redaction (once resolved, this process hides it wherever it
writes or shows what a worker said)."""

from __future__ import annotations

import time

from fleet_tui.core import redaction
from fleet_tui.engine.context import Part

__all__ = ["SecretCache"]


class SecretCache(Part):
    """The keys (every endpoint's), resolved as the workers resolve them and remembered
    for SECRET_TTL seconds."""

    # The key, as resolved for the diff's and the merge's scan: (when, values); see get.
    _secret_cache: tuple[float, tuple[str, ...]] | None = None
    _by_endpoint: tuple[float, dict[str, str]] | None = None
    SECRET_TTL = 30.0

    def cached(self) -> tuple[str, ...] | None:
        """The key as resolved less than SECRET_TTL seconds ago; None: look it up (`get`)."""
        cached = self._secret_cache
        if cached is not None and time.monotonic() - cached[0] < self.SECRET_TTL:
            return cached[1]
        return None

    def get(self, *, fresh: bool = False) -> tuple[str, ...]:
        """The API key workers get (resolved as they resolve it), for the diff's and the
        merge's scan; () when none can be resolved (then nothing is scanned for).

        Remembered for SECRET_TTL seconds: the panel reloads a running task's diff every
        2 s, and a keyring lookup costs more than the scan (the first one imports the
        keyring library: ~100 ms). The merge itself asks afresh (``fresh``)."""
        cached = None if fresh else self.cached()
        if cached is not None:
            return cached
        now = time.monotonic()
        # every endpoint's key: a worker on one may have read another's
        found = tuple(dict.fromkeys(self.by_endpoint(fresh=True).values()))
        self._secret_cache = (now, found)
        # hidden from now on wherever this process writes or shows what a worker said
        redaction.remember(found)
        return found

    def by_endpoint(self, *, fresh: bool = False) -> dict[str, str]:
        """Each endpoint's key by the endpoint's name, resolved as its workers resolve it
        (an endpoint whose key cannot be found is left out): what the gateway holds.
        Remembered for SECRET_TTL seconds, as `get`."""
        cached = self._by_endpoint
        if not fresh and cached is not None \
                and time.monotonic() - cached[0] < self.SECRET_TTL:
            return dict(cached[1])
        from fleet_tui.settings.credentials import LaunchError, endpoint_credential

        keys: dict[str, str] = {}
        for endpoint in self.settings.endpoints or (self.settings.endpoint(),):
            try:
                keys[endpoint.name] = endpoint_credential(self.settings, endpoint,
                                                          self.env).value
            except (LaunchError, OSError):
                continue
        self._by_endpoint = (time.monotonic(), keys)
        redaction.remember(tuple(keys.values()))
        return dict(keys)
