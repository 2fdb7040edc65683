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
        from fleet_tui.execution.local.launcher import LaunchError, endpoint_credential

        keys: list[str] = []
        # every endpoint's key (issue 19): a worker on one may have read another's
        for endpoint in self.settings.endpoints or (self.settings.endpoint(),):
            try:
                value = endpoint_credential(self.settings, endpoint, self.env).value
            except (LaunchError, OSError):
                continue
            if value not in keys:
                keys.append(value)
        found = tuple(keys)
        self._secret_cache = (now, found)
        # hidden from now on wherever this process writes or shows what a worker said
        redaction.remember(found)
        return found
