"""A remote worker's mailbox, kept in its local attempt folder (`say` to a Ray job).

A host with no channel of its own to a running worker (Ray has no stdin to a job) leaves
each message here, in the local attempt folder's `input/`, as `<id>.json` (the format the
runner's own channel uses, so `AttemptLog.input_waiting(id)` reads it the same way). The
worker's side fetches it through this machine's gateway with its attempt's token (the
gateway serves `/fleet/mailbox`: `pending`, then `verdict`), hands it to its runner's own
input channel on its node (so the FIFO's rules stay the runner's: a message is taken, or
refused once the turn has ended, and logged in input.jsonl, mirrored back), and says what
became of it:

- `<id>.sent`: claimed. By the gateway ("gateway": served, maybe again, until a verdict;
  the node side takes each id once) or by the sender withdrawing it ("withdrawn": never
  served). Made with O_EXCL, so a message is either served or withdrawn, never both.
- `<id>.queued`: in the node's input channel, not taken by its runner yet.
- `<id>.closed`: refused there, with the runner's reason (its turn is over).
- taken: every file of the id gone (`input_waiting` is False).

Nothing here is secret: the message is the user's text, kept as the local channel keeps
it; it never goes into the job's entrypoint, runtime_env or metadata.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from fleet_tui.execution.worker.attemptlog import INPUT_DIR, MESSAGE_ID, AttemptLog, new_message_id
from fleet_tui.system.files import write_json_atomic

SERVED = "gateway"
WITHDRAWN = "withdrawn"
LONG_POLL = 20.0  # seconds a fetch of the node's waits for a message at most


def _box(folder: AttemptLog) -> Path:
    return folder.dir / INPUT_DIR


def post(folder: AttemptLog, text: str, *, by: str = "") -> str:
    """Leave a message for the worker's side to fetch; its id."""
    box = _box(folder)
    box.mkdir(mode=0o700, exist_ok=True)
    message_id = new_message_id()
    write_json_atomic(box / f"{message_id}.json", {"text": text, "at": time.time(), "by": by},
                      sync=False)
    return message_id


def _claim(path: Path, who: str) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(who)
    return True


def _claimed_by(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def pending(folder: AttemptLog) -> list[dict[str, Any]]:
    """The messages with no verdict yet, oldest first, each claimed as served (again: the
    node side takes an id once); a withdrawn one is never served."""
    box = _box(folder)
    try:
        names = sorted(n for n in os.listdir(box) if n.endswith(".json"))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        mid = name.removesuffix(".json")
        if not MESSAGE_ID.fullmatch(mid) or (box / f"{mid}.queued").exists() \
                or (box / f"{mid}.closed").exists():
            continue
        sent = box / f"{mid}.sent"
        if not _claim(sent, SERVED) and _claimed_by(sent) != SERVED:
            continue  # withdrawn (or being withdrawn) by its sender
        try:
            data = json.loads((box / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("text"), str):
            out.append({"id": mid, "text": data["text"], "by": str(data.get("by") or "")})
    return out


def _forget(box: Path, mid: str) -> None:
    for suffix in (".json", ".sent", ".queued", ".closed"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(box / f"{mid}{suffix}")


def verdict(folder: AttemptLog, message_id: str, status: str, reason: str = "") -> None:
    """What the node side says became of a message: queued, taken or closed."""
    if not MESSAGE_ID.fullmatch(message_id):
        raise ValueError(f"not a message id: {message_id!r}")
    box = _box(folder)
    if not (box / f"{message_id}.json").exists():
        return  # taken (or never posted here): nothing to say
    if status == "taken":
        _forget(box, message_id)
    elif status == "queued":
        write_json_atomic(box / f"{message_id}.queued", {"at": time.time()}, sync=False)
    elif status == "closed":
        write_json_atomic(box / f"{message_id}.closed",
                          {"at": time.time(), "reason": reason[:500]}, sync=False)
    else:
        raise ValueError(f"not a verdict: {status!r}")


def state(folder: AttemptLog, message_id: str) -> tuple[str, str]:
    """("waiting" | "queued" | "taken" | "closed", the reason when closed)."""
    box = _box(folder)
    if not (box / f"{message_id}.json").exists():
        return "taken", ""
    closed = box / f"{message_id}.closed"
    if closed.exists():
        try:
            reason = str(json.loads(closed.read_text()).get("reason") or "")
        except (OSError, ValueError):
            reason = ""
        return "closed", reason or "its worker is not taking messages"
    if (box / f"{message_id}.queued").exists():
        return "queued", ""
    return "waiting", ""


def withdraw(folder: AttemptLog, message_id: str) -> bool:
    """Take back a message the node side never fetched (True), or find it fetched
    already (False: its verdict will come)."""
    box = _box(folder)
    if not _claim(box / f"{message_id}.sent", WITHDRAWN):
        return _claimed_by(box / f"{message_id}.sent") == WITHDRAWN
    _forget(box, message_id)
    return True


def drop(folder: AttemptLog, message_id: str) -> None:
    """A refused message forgotten (its sender was told why)."""
    _forget(_box(folder), message_id)


__all__ = ["LONG_POLL", "drop", "pending", "post", "state", "verdict", "withdraw"]
