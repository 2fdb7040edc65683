"""This machine as a host: what the CLI and the demo ask of it before anything runs.

`fleet-tui run` refuses before anything is queued when this machine's claude or key is
missing, `fleet-doctor` checks this machine's claude and cage, and the demo finds (or
installs) claude and the sandbox runtime here. They ask the launch every host runs
(execution/worker/launch.py) here, so that nothing above the host seam names the local
host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fleet_tui.settings.config_core import SettingsLike
    from fleet_tui.settings.endpoints import Endpoint

#: the kind that runs workers on the machine the engine runs on
LOCAL = "local"


def launcher() -> Any:
    """The launch's module (finding claude, the config dir, the cage's and the sandbox's
    checks, the launch plan), imported when first asked; its attributes are read when
    used, so a test's monkeypatch of the module is seen."""
    from fleet_tui.execution.worker import launch

    return launch


def check_launch(settings: SettingsLike, *, permission_mode: str | None = None,
                 endpoint: Endpoint | None = None) -> None:
    """What a launch on this machine would refuse (LaunchError: a setup claude would
    refuse, exit 2; claude or the key missing, exit 5)."""
    launcher().check_launch(settings, permission_mode=permission_mode, endpoint=endpoint)


def find_claude_named(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """This machine's claude of that name or path, None where there is none."""
    found = launcher()
    try:
        path: str = found.find_claude_named(name, env)
    except found.ClaudeNotFoundError:
        return None
    return path


def cage_problems(env: Mapping[str, str] | None = None) -> str:
    """Why workers cannot be caged here ("" when they can)."""
    problem: str = launcher().cage_problems(env)
    return problem


def srt_install_command(env: Mapping[str, str] | None = None) -> list[str]:
    """How the pinned sandbox runtime is installed here."""
    command: list[str] = launcher().srt_install_command(env)
    return command


__all__ = ["LOCAL", "cage_problems", "check_launch", "find_claude_named", "launcher",
           "srt_install_command"]
