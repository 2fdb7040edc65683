"""The gateway's file names and its control socket's address: what its server and the
engines' side of it (control.py) share. Apart from the server so that finding a gateway
does not import the server's aiohttp: every `fleet-tui` command that reads the store
reaches control.py, and aiohttp was a third of such a command's start."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CONTROL_FILE", "INFO_FILE", "LOCK_FILE", "LOG_FILE", "SERVER_MODULE",
           "STATUS_FILE", "unix_address"]

SERVER_MODULE = "fleet_tui.gateway.server"
LOCK_FILE = "gateway.lock"
INFO_FILE = "gateway.json"
STATUS_FILE = "status.json"
LOG_FILE = "gateway.log"
CONTROL_FILE = "control.sock"  # the engines hand the endpoints and keys over again here


def unix_address(path: Path) -> tuple[str, int | None]:
    """An address for the Unix socket `path` that fits AF_UNIX's 108 bytes: the path itself,
    or (a deep home, as a test's) its folder opened and named through /proc/self/fd (the
    descriptor returned: the caller closes it once bound or connected)."""
    if len(os.fsencode(path)) < 100:
        return str(path), None
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{path.name}", fd
