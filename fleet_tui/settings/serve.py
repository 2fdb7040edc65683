"""The `[serve]` table of config.toml: what `fleet-tui serve` is told beyond its flags.

    [serve]
    token = "a long random string"   # the link's secret; absent: a new one each start
    port = 8421                      # absent: 8421; --port wins
    origins = ["https://panel.example.com"]   # behind a reverse proxy: the page's address

The websocket and every request that could change something answer only a page of the
server's own origin (the scheme, host and port the request came to); a reverse proxy that
gives the server another Host than the browser's address names the browser's origins here.

A token kept in config.toml lets a bookmark on the phone survive a restart of the server;
without one, every start makes a new token and the old links stop working. The table is
read here and only by `fleet-tui serve`: the token never enters `Settings`, which the
engine and the panel carry everywhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fleet_tui.settings.tables import read_own_table

TABLE = "serve"
DEFAULT_PORT = 8421
MIN_TOKEN = 16  # characters: a guessable token is no gate
_ORIGIN_RE = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+/?")
KEYS = ("token", "port", "origins")


@dataclass(frozen=True, slots=True)
class ServeSettings:
    token: str | None = None
    port: int = DEFAULT_PORT
    origins: tuple[str, ...] = ()

    def __repr__(self) -> str:  # the token stays out of any log or traceback
        return f"ServeSettings(token={'set' if self.token else None}, port={self.port})"


def read_serve_settings(config_file: str) -> ServeSettings:
    """The `[serve]` table of ``config_file`` (absent: the defaults); ConfigError naming
    the file, the line and what is accepted when a value cannot be used (never the value
    of the token itself)."""
    table = read_own_table(config_file, TABLE, KEYS, example='[serve] token = "..."')
    if table is None:
        return ServeSettings()
    token = table.values.get("token")
    if token is not None and (not isinstance(token, str) or len(token) < MIN_TOKEN
                              or not token.isprintable() or " " in token):
        raise table.error("token", f"[serve] token: expected a string of at least {MIN_TOKEN} "
                          "printable characters without spaces (e.g. the output of "
                          "`python -c 'import secrets; print(secrets.token_urlsafe())'`)")
    port = table.values.get("port", DEFAULT_PORT)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise table.error("port", f"[serve] port: expected a whole number from 1 to 65535, "
                                  f"got {port!r}")
    origins = table.values.get("origins", [])
    if not isinstance(origins, list) or not all(
            isinstance(o, str) and _ORIGIN_RE.fullmatch(o) for o in origins):
        raise table.error("origins", "[serve] origins: expected a list of origins as a "
                          "browser sends them, scheme, host and port without a path "
                          "(e.g. [\"https://panel.example.com\"])")
    return ServeSettings(token=token, port=port,
                         origins=tuple(o.lower().rstrip("/") for o in origins))
