"""Where fleet-tui keeps its files. One place, so every layer agrees."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import platformdirs

APP_NAME = "fleet-tui"
WORK_DIR_NAME = ".fleet-work"
LOGS_DIR_NAME = ".logs"


def home(env: Mapping[str, str] | None = None) -> Path:
    """fleet-tui's data folder: FLEET_TUI_HOME, else the platform's user data dir."""
    env = os.environ if env is None else env
    override = env.get("FLEET_TUI_HOME")
    if override:
        return Path(override).expanduser()
    return platformdirs.user_data_path(APP_NAME)


def db_path(env: Mapping[str, str] | None = None) -> Path:
    return home(env) / "fleet.db"


def task_config_dir(task_id: str, env: Mapping[str, str] | None = None) -> Path:
    """The CLAUDE_CONFIG_DIR of one task (kept while the task lives, for --resume)."""
    return home(env) / "config" / task_id


def cli_install_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where `fleet-tui --demo` installs the pinned Claude Code CLI when it is missing."""
    return home(env) / "claude-cli"


def work_dir(repo: Path) -> Path:
    return repo / WORK_DIR_NAME


def worktree_path(repo: Path, task_id: str) -> Path:
    return work_dir(repo) / task_id


def attempt_dir(repo: Path, task_id: str, attempt_no: int) -> Path:
    return work_dir(repo) / LOGS_DIR_NAME / task_id / str(attempt_no)
