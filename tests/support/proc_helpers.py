"""Finding a test's own processes: those that work under the test's folder.

Several test runs may share this machine (and run the same scripts, e.g. the same `sleep`),
so a test counts and kills only the processes whose working directory is inside its own
tmp_path. Read from /proc; zombies and this process are left out.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from fleet_tui.system import procs


def working_in(where: Path, argv: Callable[[list[str]], bool] | None = None) -> list[int]:
    """Live processes whose working directory is `where` or inside it, and whose argv
    passes `argv` (None: any)."""
    root = str(where.resolve())
    found = []
    for st in procs.all_stats():
        if st.state == "Z" or st.pid == os.getpid():
            continue
        if argv is not None and not argv(procs.cmdline(st.pid)):
            continue
        try:
            cwd = os.readlink(f"/proc/{st.pid}/cwd")
        except OSError:
            continue
        if cwd == root or cwd.startswith(root + os.sep):
            found.append(st.pid)
    return found


def commands_in(where: Path, *commands: str) -> list[int]:
    """The processes under `where` whose command line (argv joined by spaces) is one of
    `commands`, e.g. the scripted workers' `sleep 326`."""
    return working_in(where, lambda args: " ".join(args) in commands)
