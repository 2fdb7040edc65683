"""`fleet-tui host check NAME`: can this host run workers?

The engine's front over the kinds' checks: a host's kind (settings/kinds.py) gives its
checks (its folder's check.py: `CHECKS`, a `KindChecks`) and how a shell is started there;
what the checks are made of (the probe script, each check with its fix, the pinned
claude's install with npm, the host's record of its claude) is execution/probe.py. Nothing
here names a kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, cast

from fleet_tui.execution import probe
from fleet_tui.execution.probe import (
    CLAUDE_PACKAGE,
    Check,
    Installed,
    KindChecks,
    Ran,
    claude_dir,
    claude_record,
    install_script,
    minutes,
    probe_script,
    record_script,
    srt_install_script,
    srt_lacking,
    srt_record_script,
)
from fleet_tui.settings import kinds

if TYPE_CHECKING:
    from fleet_tui.settings.hosts import HostConfig

SRT_WHAT = probe.SRT_WHAT  # what `host check --yes` installs for the cage
INSTALL_LIMIT = probe.INSTALL_LIMIT  # seconds `host check --yes` gives npm
PROGRESS_EVERY = probe.PROGRESS_EVERY  # seconds between two progress lines of an install


def checks_of(host: HostConfig) -> KindChecks:
    """The host's kind's checks."""
    return cast("KindChecks", kinds.kind(host.kind).part("check").CHECKS)


def probing() -> list[str]:
    """The labels of the kinds `--probe` means something for."""
    found = []
    for kind in kinds.KINDS:
        if cast("KindChecks", kind.part("check").CHECKS).probes:
            found.append(kind.schema().label)
    return found


def run_on(host: HostConfig, script: str, *, timeout: float = 60.0,
           env: Mapping[str, str] | None = None) -> Ran:
    """Run a shell script on the host (`sh -s`, the script on stdin) through its kind's
    shell; a kind without one reads as exit 255 with the reason."""
    argv = checks_of(host).shell(host)
    if argv is None:
        return Ran(255, "", f"{host.name}: no shell there to run a script in")
    return probe.run_script(argv, script, timeout=timeout, env=env)


def install(host: HostConfig, where: str | None = None, *, limit: float | None = None,
            every: float | None = None, progress: Callable[[float, str], None] | None = None,
            env: Mapping[str, str] | None = None, script: str | None = None) -> Installed:
    """The pinned claude (or what `script` installs) installed with npm on the host
    (execution/probe.py's `install` through the kind's shell)."""
    argv = checks_of(host).shell(host)
    if argv is None:
        return Installed(False, f"{host.name}: no shell there to install with")
    return probe.install(argv, where, limit=INSTALL_LIMIT if limit is None else limit,
                         every=PROGRESS_EVERY if every is None else every,
                         progress=progress, env=env, remote=not host.is_local, script=script)


def check_host(host: HostConfig, *, env: Mapping[str, str] | None = None,
               claude: tuple[str, ...] = (), install_to: str | None = None,
               probe: bool = False) -> tuple[list[Check], dict[str, str]]:
    """Every check of the host, in order, and what its probe read (`claude_path`, `npm`):
    its kind's."""
    return checks_of(host).run(host, claude=claude, install_to=install_to, probe=probe,
                               env=env)


__all__ = ["CLAUDE_PACKAGE", "Check", "Installed", "Ran", "check_host", "checks_of",
           "claude_dir", "claude_record", "install", "install_script", "minutes",
           "probe_script", "probing", "record_script", "run_on", "srt_install_script",
           "srt_lacking", "srt_record_script"]
