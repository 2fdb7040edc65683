"""Which host an engine runs its attempts on, for an engine that was given none.

The engine knows only the seam (`execution.host`); this is the one place that names a
host's code, so that nothing above `execution/` imports `execution.local` (an import
contract says so). Remote hosts (SSH, a Ray cluster) will be chosen here by name.
"""

from __future__ import annotations

from collections.abc import Mapping

from fleet_tui.execution.host import Host


def default_host(*, env: Mapping[str, str], python: str) -> Host:
    """This machine: each attempt a detached runner process."""
    from fleet_tui.execution.local.host import LocalHost

    return LocalHost(env=env, python=python)


__all__ = ["default_host"]
