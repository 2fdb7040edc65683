"""Watching a settings file for edits: its stamp, and whether an edit has settled.

A file is seen changed when its stamp (modification time in ns, size) differs from the one
last looked at. An edit is taken only once the file has not been modified for SETTLE
seconds: a writer truncates the file and writes it again (Python's write_text, most
editors without an atomic rename), and a look in between would read an empty or half file
and apply the defaults for a moment (seen in a test on a loaded machine: the reload said
"Settings reloaded" for the empty file, then again for the full one).
"""

from __future__ import annotations

import os
import time

SETTLE = 0.5  # seconds a changed file must rest before it is read

Stamp = tuple[int, int]


def file_stamp(path: str | os.PathLike[str]) -> Stamp | None:
    """(mtime_ns, size), or None when there is no such file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def settled(stamp: Stamp | None, now: float | None = None) -> bool:
    """The file was last modified at least SETTLE seconds ago (or is gone)."""
    if stamp is None:
        return True
    now = time.time() if now is None else now
    return now - stamp[0] / 1e9 >= SETTLE


__all__ = ["SETTLE", "Stamp", "file_stamp", "settled"]
