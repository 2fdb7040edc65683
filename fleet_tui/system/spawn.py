"""Detached processes: the one way fleet-tui starts a process that must outlive it.

An attempt's runner (`supervisor`) and a repository's merge queue runner (`merge_queue`)
are both started so that closing the panel or the CLI loses nothing: a session of their
own (no terminal's signals reach them), stdin from /dev/null, output appended to a log
file, no descriptor inherited but those named, and this package importable by the child
whatever the parent's working directory (the package root first on PYTHONPATH).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence

from fleet_tui.system import paths

__all__ = ["package_env", "package_root", "spawn_detached"]


def package_root() -> str:
    """The folder that holds the `fleet_tui` package (what `python -m fleet_tui...` needs
    on its path): paths.package_root, as text."""
    return str(paths.package_root())


def package_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with the package root first on PYTHONPATH (once: an entry already there is
    kept where it is)."""
    out = dict(env)
    root = package_root()
    parts = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        parts.insert(0, root)
    out["PYTHONPATH"] = os.pathsep.join(parts)
    return out


def spawn_detached(argv: Sequence[str], *, cwd: str | os.PathLike[str],
                   env: Mapping[str, str], log_path: str | os.PathLike[str],
                   pass_fds: Sequence[int] = ()) -> subprocess.Popen[bytes]:
    """Start `argv` in a new session with `env` (the package put on its PYTHONPATH), its
    stdout and stderr appended to `log_path`, stdin /dev/null, and only `pass_fds` kept
    open. The caller reaps it (or not: it runs on by itself)."""
    with open(os.devnull, "rb") as devnull, open(log_path, "ab") as log:
        return subprocess.Popen(list(argv), cwd=str(cwd), env=package_env(env),
                                stdin=devnull, stdout=log, stderr=log,
                                start_new_session=True, close_fds=True,
                                pass_fds=tuple(pass_fds))


HANDOVER_LIMIT = 60_000  # below a pipe's buffer: written whole before the child starts


def pipe_holding(data: bytes) -> int:
    """A pipe's read end holding `data` (its write end closed), for a child to inherit:
    how a secret reaches a detached process without its argv or environment. The caller
    checks `data` against HANDOVER_LIMIT first, with its own words."""
    read_end, write_end = os.pipe()
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(write_end, view):]
    except OSError:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return read_end
