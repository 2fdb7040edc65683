"""What of the engine's environment and settings a host's runner gets (the ssh and the
Ray host alike): the key variables apart (its pipe, never its environment), this machine's
paths never (they mean nothing there)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleet_tui.execution.remote.base import KEY_VARIABLES

# what of the engine's environment reaches the host's runner (paths of this machine do not)
FORWARD_PREFIXES = ("FLEET_WORKER_", "ANTHROPIC_", "CLAUDE_", "GIT_AUTHOR_", "GIT_COMMITTER_",
                    "LC_")
FORWARD_NAMES = ("LANG", "TZ", "IS_SANDBOX", "DISABLE_AUTOUPDATER", "GIT_CONFIG_NOSYSTEM",
                 "FLEET_TUI_PORTABLE_PROCS")
# settings that name a path of this machine: never sent to a host
LOCAL_ONLY = ("FLEET_WORKER_CLAUDE", "FLEET_WORKER_CONFIG_DIR")


def forwarded(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The runner's environment split into what the host's runner gets in its environment
    and the key variables it gets through its pipe. This machine's paths stay here: the
    settings naming one (FLEET_WORKER_CLAUDE, FLEET_WORKER_CONFIG_DIR) and any value under
    this machine's HOME or starting with `~`."""
    keys = {k: v for k, v in env.items() if k in KEY_VARIABLES}
    rest = {k: v for k, v in env.items() if k not in KEY_VARIABLES
            and (k.startswith(FORWARD_PREFIXES) or k in FORWARD_NAMES)
            and k not in LOCAL_ONLY and not _local_path(v, env.get("HOME"))}
    return rest, keys


def _local_path(value: str, home: str | None) -> bool:
    if value.startswith("~"):
        return True
    home = (home or "").rstrip("/")
    return bool(home) and (value == home or value.startswith(home + "/"))


def host_settings(settings: Mapping[str, Any], claude: str | None) -> dict[str, Any]:
    """The launcher's settings as a host's runner gets them: this machine's paths taken
    out (its claude, its config dir: the host's are its own), `claude` the host's when
    its settings name one (else the host finds its own: execution/worker/hostclaude.py)."""
    out = {k: v for k, v in settings.items() if k not in ("claude", "config_dir")}
    if claude:
        out["claude"] = claude
    return out


__all__ = ["FORWARD_NAMES", "FORWARD_PREFIXES", "LOCAL_ONLY", "forwarded", "host_settings"]
