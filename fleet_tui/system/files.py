"""Files written whole: a reader sees the old record or the new one, never half of one."""

from __future__ import annotations

import contextlib
import json
import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # loaded by every runner (through attemptlog): typing costs each ~5 ms
    from collections.abc import Mapping
    from pathlib import Path
    from typing import Any

__all__ = ["read_and_close", "write_json_atomic"]


def write_json_atomic(path: Path, data: Mapping[str, Any], *, mode: int = 0o600,
                      sync: bool = True, indent: int | None = None,
                      sort_keys: bool = False) -> None:
    """Write `data` as JSON to a temporary file beside `path` (created with `mode`), then
    rename it over `path`. The temporary name is this writer's own (pid and random), so two
    processes writing the same record at once cannot rename each other's half-written
    file; on failure (a full disk) it is removed and the error raised. `sync`: fsync
    before the rename, for a record that must survive a power cut."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(3).hex()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        with open(fd, "w", encoding="utf-8") as fh:
            json.dump(dict(data), fh, indent=indent, sort_keys=sort_keys)
            fh.write("\n")
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_and_close(fd: int) -> bytes:
    """Everything a pipe's writer sends until it closes its end (a handover of keys or
    variables kept out of argv and the environment); `fd` is closed whatever happens."""
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)
