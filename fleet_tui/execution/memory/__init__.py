"""The in-memory host (host.py): attempts with no process, no git and no claude behind
them, for fast engine tests. Its names are reached through this package (the kind's
config.py is read by settings/ without the host being imported)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleet_tui.execution.memory.host import BASE_COMMIT, PID_BASE, MemoryHost, MemoryRun


def __getattr__(name: str) -> Any:
    import importlib

    host = importlib.import_module(f"{__name__}.host")
    try:
        return getattr(host, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


__all__ = ["BASE_COMMIT", "PID_BASE", "MemoryHost", "MemoryRun"]
