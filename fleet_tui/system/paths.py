"""Where fleet-tui keeps its files. One place, so every layer agrees."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

APP_NAME = "fleet-tui"
WORK_DIR_NAME = ".fleet-work"
LOGS_DIR_NAME = ".logs"


def home(env: Mapping[str, str] | None = None) -> Path:
    """fleet-tui's data folder: FLEET_TUI_HOME, else the platform's user data dir."""
    env = os.environ if env is None else env
    override = env.get("FLEET_TUI_HOME")
    if override:
        return Path(override).expanduser()
    if sys.platform.startswith("linux"):
        # What platformdirs computes on Linux (XDG), with the standard library alone: the
        # runner on a host (the distribution's python3, nothing installed) reaches this
        # module, and platformdirs is this machine's package, not the host's.
        # platformdirs reads the process's own environment, not `env`: so does this
        xdg = os.environ.get("XDG_DATA_HOME", "").strip()
        return Path(xdg or os.path.expanduser("~/.local/share")) / APP_NAME
    import platformdirs

    return platformdirs.user_data_path(APP_NAME)


def db_path(env: Mapping[str, str] | None = None) -> Path:
    return home(env) / "fleet.db"


def log_file(env: Mapping[str, str] | None = None) -> Path:
    """fleet-tui's log file: what libraries it uses say (Ray's Jobs client), never the
    user's terminal."""
    return home(env) / "fleet-tui.log"


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


# --- privacy ----------------------------------------------------------------------------------
# Prompts, transcripts and task history are the user's alone: every folder of ours is 0700 and
# every file 0600, made so on creation and fixed when an older install is opened.

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def make_private(path: Path, mode: int) -> bool:
    """chmod path to mode when it differs (a symlink is left alone). True when changed;
    a missing path or one we may not change is left as it is."""
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) or stat.S_IMODE(st.st_mode) == mode:
            return False
        os.chmod(path, mode)
    except OSError:
        return False
    return True


def private_dir(path: Path) -> Path:
    """Create path (and missing parents) if needed and make path itself 0700."""
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    make_private(path, PRIVATE_DIR)
    return path


def private_file(path: Path) -> Path:
    """Create an empty file 0600 if missing; make an existing one 0600. Nothing is truncated."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, PRIVATE_FILE)
    os.close(fd)
    make_private(path, PRIVATE_FILE)
    return path


def secure_tree_top(folder: Path) -> None:
    """Make folder 0700 and its direct entries private: dirs 0700, files lose every group
    and other bit (0644 -> 0600; an owner's execute bit is kept)."""
    make_private(folder, PRIVATE_DIR)
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                make_private(Path(entry.path), PRIVATE_DIR)
            else:
                mode = stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode)
                make_private(Path(entry.path), mode & 0o700)
        except OSError:
            continue


def secure_home(env: Mapping[str, str] | None = None) -> None:
    """Make the data folder private: itself and config/ 0700, the files in it (fleet.db and
    its -wal/-shm) 0600. Each task's config dir is 0700 from its creation; they are fixed
    too when config/ itself was found open (an install from before this was done)."""
    root = home(env)
    if not root.is_dir():
        return
    config = root / "config"
    try:
        config_open = stat.S_IMODE(os.lstat(config).st_mode) != PRIVATE_DIR
    except OSError:
        config_open = False
    secure_tree_top(root)
    if config_open:
        secure_tree_top(config)


def logs_dir(repo: Path) -> Path:
    """Where the attempt folders of a repository's tasks live (private: prompts, events)."""
    return work_dir(repo) / LOGS_DIR_NAME


def update_dir(repo: Path, task_id: str) -> Path:
    """What an update from base that stopped on conflicts keeps to undo it (the index as it
    was, HEAD): next to the task's attempt folders, private like them."""
    return logs_dir(repo) / task_id / "update"


def queue_dir(repo: Path) -> Path:
    """The merge queue runner's folder of a repository: its spec and its log."""
    return logs_dir(repo) / ".queue"


def package_root() -> Path:
    """The folder that holds the fleet_tui package: put on a detached child's PYTHONPATH
    (the runner, the queue runner, the test gate's boot) so that it imports this very
    code, installed or not. Found from the package itself, wherever the caller lives."""
    import fleet_tui

    return Path(fleet_tui.__file__).resolve().parent.parent
