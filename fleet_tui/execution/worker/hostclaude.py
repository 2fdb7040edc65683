"""Which claude a remote host's runner runs: the host's own, found on the host.

Nothing of this machine decides it (its `claude` setting, FLEET_WORKER_CLAUDE, its PATH
or HOME are this machine's): on the host, in order,
1. the path the host's settings give (a Ray host's `claude`), else
2. the one `fleet-tui host check` found or installed there, recorded in the host's data
   dir (`RECORD`, one path a line), while it is still an executable file, else
3. the copy `host check --yes` installs into the data dir (`INSTALLED`), else
4. `claude` on the PATH the host's commands get.

Runs on the host (the SSH agent's `stage`, the Ray job's entrypoint) with the host's
python and the standard library only. The version is read with `claude --version` once
per binary (kept in the data dir by the binary's size and mtime: a start pays a stat).
"""

from __future__ import annotations

import json
import os
import re
import subprocess

RECORD = "claude-path"  # in the host's data dir, written by `fleet-tui host check`
INSTALLED = "claude-cli/node_modules/.bin/claude"  # where `host check --yes` installs it
VERSIONS = "claude-versions.json"  # path -> [size, mtime_ns, version]
VERSION_TIMEOUT = 60.0


def _runnable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _on_path(name: str, search: str) -> str | None:
    for folder in search.split(os.pathsep):
        candidate = os.path.join(folder or os.curdir, name)
        if _runnable(candidate):
            return os.path.abspath(candidate)
    return None


def find(data_dir: str, given: str | None = None,
         path: str | None = None) -> tuple[str | None, list[str]]:
    """(the host's claude, or None; where it was looked for, in words)."""
    search = os.environ.get("PATH", os.defpath) if path is None else path
    looked: list[str] = []
    if given:
        expanded = os.path.expanduser(given)
        if os.sep in expanded:
            if _runnable(expanded):
                return os.path.abspath(expanded), looked
            looked.append(f"{given} (the host's setting) is not an executable file")
            return None, looked
        found = _on_path(expanded, search)
        if found:
            return found, looked
        looked.append(f"{given!r} (the host's setting) is not on PATH ({search})")
        return None, looked
    try:
        with open(os.path.join(data_dir, RECORD), encoding="utf-8") as fh:
            recorded = fh.readline().strip()
    except OSError:
        recorded = ""
    if recorded:
        if _runnable(recorded):
            return recorded, looked
        looked.append(f"{recorded} (recorded by `host check`) is gone")
    installed = os.path.join(data_dir, INSTALLED)
    if _runnable(installed):
        return installed, looked
    looked.append(f"not in {os.path.join(data_dir, 'claude-cli')}")
    found = _on_path("claude", search)
    if found:
        return found, looked
    looked.append(f"'claude' is not on PATH ({search})")
    return None, looked


def version(claude: str, data_dir: str) -> str | None:
    """claude's version (e.g. "2.1.197"), None when it does not say one; read once per
    binary and kept in the data dir."""
    try:
        info = os.stat(claude)
    except OSError:
        return None
    stamp = [info.st_size, info.st_mtime_ns]
    cache = os.path.join(data_dir, VERSIONS)
    try:
        with open(cache, encoding="utf-8") as fh:
            known = json.load(fh)
        if not isinstance(known, dict):
            known = {}
    except (OSError, ValueError):
        known = {}
    entry = known.get(claude)
    if isinstance(entry, list) and len(entry) == 3 and entry[:2] == stamp:
        return str(entry[2]) if entry[2] else None
    try:
        done = subprocess.run([claude, "--version"], capture_output=True, text=True,
                              timeout=VERSION_TIMEOUT, stdin=subprocess.DEVNULL, check=False)
        match = re.search(r"(\d+\.\d+\.\d+)", done.stdout)
        found = match.group(1) if done.returncode == 0 and match else None
    except (OSError, subprocess.SubprocessError):
        found = None
    known[claude] = [*stamp, found]
    tmp = f"{cache}.{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(known, fh)
        os.replace(tmp, cache)
    except OSError:
        pass
    return found


__all__ = ["INSTALLED", "RECORD", "find", "version"]
