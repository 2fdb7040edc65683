"""Finding the gateway, and starting it when none runs (the engine's side of it).

One gateway per store: its folder is beside it, `<home>/gateway` for the default store
(`gateway-<name>` for a store file of another name), so that it checks the tokens of the
store whose engines minted them. It lives while
it holds `gateway.lock`; `gateway.json` says its pid and port. `ensure` starts one when
none lives, as the merge queue's runner is started (system.spawn: a session of its own, no
inherited descriptor but the one named), handing it the endpoints and their keys through
a pipe it inherits, and waits until it listens. Two engines that ensure at once start one
gateway: they take turns on `start.lock`, and a second gateway would exit at once anyway.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_tui.core.errors import FleetError
from fleet_tui.gateway.files import (
    CONTROL_FILE,
    INFO_FILE,
    LOCK_FILE,
    LOG_FILE,
    SERVER_MODULE,
    STATUS_FILE,
    unix_address,
)
from fleet_tui.gateway.routes import Route
from fleet_tui.system import paths, procs, spawn
from fleet_tui.system.spawn import spawn_detached

__all__ = ["START_TIMEOUT", "GatewayInfo", "ensure", "folder", "hand_over", "handover",
           "read_info", "read_status", "stop", "url_for"]

START_TIMEOUT = 15.0
# never in the gateway's environment (a process of the user can read it): where keys live
_KEY_PREFIXES = ("ANTHROPIC_",)
_KEY_NAMES = frozenset({"ZHIPU_API_KEY", "GLM_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN"})


@dataclass(frozen=True)
class GatewayInfo:
    pid: int
    port: int
    started_at: float

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def folder(env: Mapping[str, str] | None = None, db: Path | None = None) -> Path:
    """The gateway's folder for the store `db` (default: the home's fleet.db)."""
    store = Path(db) if db is not None else paths.db_path(env)
    default = store.name == paths.db_path(env).name
    return store.parent / ("gateway" if default else f"gateway-{store.stem}")


def url_for(info: GatewayInfo, endpoint: str) -> str:
    """The base URL a worker of `endpoint` is given."""
    return f"{info.url}/e/{endpoint}"


def _alive(where: Path) -> bool:
    """Does a gateway hold the folder's lock now?"""
    try:
        fd = os.open(where / LOCK_FILE, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops a lock we took
    return False


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return _loads(path.read_bytes())
    except OSError:
        return None


def _info(where: Path) -> GatewayInfo | None:
    data = _read_json(where / INFO_FILE)
    if data is None:
        return None
    try:
        return GatewayInfo(int(data["pid"]), int(data["port"]), float(data["started_at"]))
    except (KeyError, TypeError, ValueError):
        return None


def read_info(env: Mapping[str, str] | None = None, db: Path | None = None
              ) -> GatewayInfo | None:
    """The gateway of the store `db` that runs now, or None."""
    where = folder(env, db)
    if not _alive(where):
        return None
    info = _info(where)
    if info is None or not procs.is_alive(info.pid, None):
        return None
    return info


def read_status(env: Mapping[str, str] | None = None, db: Path | None = None
                ) -> dict[str, Any] | None:
    """What the running gateway last wrote of its endpoints (status.json), or None."""
    if read_info(env, db) is None:
        return None
    return _read_json(folder(env, db) / STATUS_FILE)


@contextlib.contextmanager
def _start_lock(where: Path, timeout: float) -> Iterator[None]:
    fd = os.open(where / "start.lock", os.O_RDWR | os.O_CREAT, paths.PRIVATE_FILE)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise FleetError("another fleet-tui process has been starting the "
                                     f"gateway for {timeout:.0f} s; see "
                                     f"{where / LOG_FILE}") from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)


def handover(routes: Sequence[Route], keys: Mapping[str, str]) -> bytes:
    """What a gateway is handed (the start's pipe, the control socket): routes and the keys
    of those whose key the hander holds, by route id (`Route.id`). The gateway adds them to
    what it holds; it never drops a route or a key for a handover's sake."""
    return json.dumps({"routes": [r.to_record() for r in routes], "keys": dict(keys)},
                      sort_keys=True).encode()


def hand_over(data: bytes, *, env: Mapping[str, str] | None = None, db: Path | None = None,
              timeout: float = 5.0) -> bool:
    """Hand the running gateway `data` (`handover`): its routes are added, and the keys
    of these routes replaced (a key set since), for the requests it passes on from now
    (those waiting for a slot or for the key too). True when anything changed. Through its
    control socket, in its private folder: never argv, the environment or a file. Raises
    FleetError when it cannot be told."""
    import socket

    if len(data) > spawn.HANDOVER_LIMIT:
        raise FleetError("the endpoints and keys handed to the gateway are too long")
    where = folder(env, db)
    address, fd = unix_address(where / CONTROL_FILE)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(address)
        finally:
            if fd is not None:
                os.close(fd)
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise FleetError(f"the gateway could not be handed the new keys ({why}); "
                         "`fleet-tui gateway stop` makes the next worker start one with "
                         "them") from None
    finally:
        sock.close()
    answer = _loads(b"".join(chunks))
    if answer is None or not answer.get("ok"):
        why = (answer or {}).get("error", "no answer")
        raise FleetError(f"the gateway refused the new keys ({why}); see "
                         f"{where / LOG_FILE}")
    return bool(answer.get("changed"))


def _loads(data: bytes) -> dict[str, Any] | None:
    try:
        found = json.loads(data)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _pipe_holding(data: bytes) -> int:
    """A pipe's read end holding `data` (its write end closed), to be inherited."""
    if len(data) > spawn.HANDOVER_LIMIT:
        raise FleetError("the endpoints and keys handed to the gateway are too long")
    return spawn.pipe_holding(data)


def gateway_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment the gateway starts with: no key variable in it."""
    return {k: v for k, v in env.items()
            if not k.startswith(_KEY_PREFIXES) and k not in _KEY_NAMES}


def _last_lines(path: Path, n: int = 5) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def ensure(routes: Sequence[Route], keys: Mapping[str, str], *, db: Path, python: str,
           env: Mapping[str, str], timeout: float = START_TIMEOUT) -> GatewayInfo:
    """The running gateway; one is started (and waited for) when none runs. Raises
    FleetError, saying where its log is, when it does not come up in `timeout` s."""
    where = paths.private_dir(folder(env, db))
    found = read_info(env, db)
    if found is not None:
        return found
    with _start_lock(where, timeout):
        found = read_info(env, db)
        if found is not None:
            return found
        before = _info(where)  # the gateway before this one: its port, if free again
        fd = _pipe_holding(handover(routes, keys))
        try:
            proc = spawn_detached(
                [python, "-m", SERVER_MODULE, "--keys-fd", str(fd), "--db", str(db),
                 "--folder", str(where), "--port", str(before.port if before else 0)],
                cwd=where, env=gateway_env(env),
                log_path=paths.private_file(where / LOG_FILE), pass_fds=(fd,))
        finally:
            os.close(fd)
        deadline = time.monotonic() + timeout
        while True:
            info = _info(where)
            if info is not None and info.pid == proc.pid and _alive(where):
                return info
            code = proc.poll()
            if code is not None:
                # exit 0: another gateway took the lock first (started by hand?)
                found = read_info(env, db)
                if code == 0 and found is not None:
                    return found
                raise FleetError(f"the gateway did not start (exit {code}); its log "
                                 f"{where / LOG_FILE} ends:\n{_last_lines(where / LOG_FILE)}")
            if time.monotonic() > deadline:
                raise FleetError(f"the gateway did not listen within {timeout:.0f} s; see "
                                 f"{where / LOG_FILE}")
            time.sleep(0.01)


def stop(env: Mapping[str, str] | None = None, timeout: float = 5.0, *,
         db: Path | None = None) -> bool:
    """Stop the running gateway (SIGTERM, then its end awaited); False when none ran."""
    import signal

    info = read_info(env, db)
    if info is None:
        return False
    procs.signal_pid(info.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(folder(env, db)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return True
