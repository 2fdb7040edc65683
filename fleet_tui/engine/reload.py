"""Settings that change while the panel runs: config.toml (when watched) and each
repository's `.fleet-tui.toml` read again on change; a file that no longer reads keeps the
previous settings in use, and each change is said once."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from fleet_tui.engine.context import Part
from fleet_tui.settings.config import ConfigError, Settings
from fleet_tui.settings.watch import Stamp, file_stamp, settled

__all__ = ["SettingsNotice", "SettingsWatch"]


@dataclass(frozen=True)
class SettingsNotice:
    """What `Fleet.check_settings` found: settings reloaded, or an edit that is not used
    (the previous settings stay); said once per change of the file."""

    severity: str  # "information" | "error"
    title: str
    message: str


class SettingsWatch(Part):
    """Watching config.toml and the repositories' settings."""

    _settings_file: str | None = None
    _settings_loader: Callable[[], Settings] | None = None
    _settings_stamp: Stamp | None = None

    def watch_settings(self, config_file: str | os.PathLike[str] | None = None,
                       loader: Callable[[], Settings] | None = None) -> None:
        """Reload the settings whenever config.toml changes (`check_settings`): `loader`
        makes them again (default: load_settings with this engine's environment). Only a
        caller whose settings come from that file alone asks for this (the panel)."""
        from fleet_tui.settings.config import config_file_path, load_settings

        self._settings_file = os.fspath(config_file or config_file_path(self.env))
        self._settings_loader = loader or (lambda: load_settings(env=self.env))
        self._settings_stamp = file_stamp(self._settings_file)

    def apply_settings(self, settings: Settings) -> None:
        """Use new settings from now on (the scheduler's next pass, the next launch)."""
        self.ctx.settings = settings
        self.supervisor.apply_settings(settings)
        self.follower.settings = settings

    def check_settings(self, repos: Iterable[Path] = ()) -> list[SettingsNotice]:
        """Read again what changed since the last look: config.toml (when watched) and
        the `.fleet-tui.toml` (and `.worktreeinclude`) of `repos`. A file that no longer
        reads is reported and its previous settings stay in use; each change is said
        once. Cheap when nothing changed (a stat per file)."""
        notices: list[SettingsNotice] = []
        config_changed = False
        if self._settings_file is not None and self._settings_loader is not None:
            stamp = file_stamp(self._settings_file)
            # an edit is read once it rests (watch.SETTLE): a look between a writer's
            # truncate and its write would apply the empty file
            if stamp != self._settings_stamp and settled(stamp):
                config_changed = True
                self._settings_stamp = stamp
                try:
                    settings = self._settings_loader()
                except ConfigError as exc:
                    notices.append(SettingsNotice(
                        "error", "Settings not reloaded",
                        f"{exc}. The previous settings stay in use until the file reads."))
                else:
                    if settings != self.settings:
                        self.apply_settings(settings)
                        notices.append(SettingsNotice(
                            "information", "Settings reloaded",
                            f"{self._settings_file} changed; the new settings are in use."))
        for repo in sorted(set(repos)):
            outcome_, problem = self.repo_settings.check(Path(repo))
            if outcome_ == "reloaded" and not config_changed:  # (config.toml said so)
                notices.append(SettingsNotice(
                    "information", "Repository settings reloaded",
                    f"{Path(repo) / '.fleet-tui.toml'} changed; the new settings are in "
                    "use."))
            elif problem is not None:
                notices.append(SettingsNotice(
                    "error", "Repository settings not reloaded",
                    f"{problem}. " + ("The previous settings stay in use until the file "
                                      "reads." if outcome_ == "bad" else
                                      "Its tasks cannot start until the file reads.")))
        return notices
