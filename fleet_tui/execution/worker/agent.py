"""The SSH host's side: `python3 -m fleet_tui.execution.worker.agent COMMAND ...`, run on the
host by the controller over its SSH connection, one short command at a time (the follower
excepted: `follow` streams an attempt folder until its runner is gone).

It runs from the package copied into the host's data dir (the same version as the
controller's), with the host's own python and only the standard library: the host-side
parts it shares with the Ray job are execution/remote/ (runs, worktrees, update, frames);
it imports nothing that needs a third-party package. Every answer is one JSON line on
stdout (`follow`: frames).

Commands (the attempt folder DIR is on the host):
- `stage DIR` (the spec on stdin): refuse (exit 75) when a runner holds DIR's lock, else
  clear the run records and write spec.json.
- `spawn DIR` (on stdin: {"env": ..., "keys": ...}): the runner started detached in a
  session of its own (nohup-like: stdin /dev/null, output to runner.log), the key variables
  through an inherited pipe (`--env-fd`), never its environment or argv; answers its pid
  once it holds the lock (or has ended).
- `put-key FILE` (the key variables on stdin): a host kept its key (`--key-on-host`):
  written to FILE in the data dir, private (0600), replaced whole; key files not used for
  a day are removed. `spawn`'s order then names the file (`key_file`) instead of holding
  the key.
- `state DIR`, `stop DIR` (the request on stdin), `kill DIR`, `sweep DIR`, `say DIR BY`
  (the text on stdin), `port`, `follow DIR` (the offsets already mirrored on stdin).
- `worktree ...`, `check-worktree WT BRANCH`: the task's worktree from the host's mirror
  (made, removed and pruned under the mirror's lock, `mirror_lock`: one at a time);
  `release ROOT ID`: a closed task's worktree and config dir removed, the mirrors' records
  and refs of it too;
  `commit-work WT MESSAGE`: the worker's uncommitted work committed before a fetch;
  `snapshot WT REF`: the worktree as it is now as an unreferenced commit, kept at REF (the
  worktree, its index and its branch untouched); `update WT BASE STRATEGY MESSAGE NAME
  EMAIL` (on stdin: {"conflicted": the files an earlier update stopped on}) and
  `abort-update WT`: bringing the worktree up to date with BASE there (left mid-merge on
  conflicts, for its worker; a file staged or committed with conflict markers still in is
  not resolved), and undoing that.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from fleet_tui.core.states import StopReason
from fleet_tui.execution.worker import hostcage, hostclaude, prepare, unpack
from fleet_tui.execution.worker.attemptlog import AttemptLog, InputClosed
from fleet_tui.execution.worker.frames import cmd_follow
from fleet_tui.execution.worker.runs import (
    SPAWN_WAIT,
    answer,
    pids,
    runner_state,
    start_runner,
    stdin_json,
    sweep,
)
from fleet_tui.execution.worker.update import cmd_abort_update, cmd_update
from fleet_tui.execution.worker.worktrees import (
    cmd_check_worktree,
    cmd_commit_work,
    cmd_worktree,
    git,
    ident,
    mirror_lock,
)
from fleet_tui.system import procs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

EX_LOCKED = 75
EX_NO_CLAUDE = 3  # the host has no claude (said in the answer: where it was looked for)
EX_NO_CAGE = 4  # a caged attempt, and the host cannot cage (said in the answer: what it lacks)
# the folder's files a runner appends to (mirrored by offset) and those it writes whole
def cmd_stage(folder: AttemptLog) -> int:
    """On stdin: a JSON line ({"spec", "config_dir", "set_up_after"}) and a tar of the
    repository's included files, unpacked into a worktree not set up yet."""
    data = sys.stdin.buffer.read()
    head, _, tar = data.partition(b"\n")
    order = json.loads(head)
    spec = order["spec"]
    folder.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    Path(order["config_dir"]).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if folder.lock_held():
        answer({"error": f"a runner holds {folder.lock_path} already"})
        return EX_LOCKED
    found: dict[str, Any] = {}
    if order.get("data_dir"):  # the host's own claude, never a path of the controller's
        data_dir = str(order["data_dir"])
        settings = spec.setdefault("settings", {})
        claude, looked = hostclaude.find(data_dir, settings.get("claude") or None)
        if claude is None:
            answer({"error": "no claude there: " + "; ".join(looked), "no_claude": True})
            return EX_NO_CLAUDE
        settings["claude"] = claude
        found = {"claude": claude, "claude_version": hostclaude.version(claude, data_dir)}
        why = hostcage.into_spec(spec, data_dir)  # the host's own srt, for a caged attempt
        if why:
            answer({"error": why, "no_cage": True})
            return EX_NO_CAGE
    folder.clear_run_records()
    folder.write_spec(spec)
    for path in (folder.events, folder.runner_log):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.close(fd)
    cwd = str(spec["cwd"])
    if tar and not prepare.is_set_up(cwd):
        os.umask(0o022)  # the worktree's files are the user's, as git made them
        try:
            with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
                unpack.extract(archive, cwd)
        except (tarfile.TarError, OSError) as exc:
            answer({"error": f"could not unpack the included files into {cwd}: {exc}"})
            return 1
        if order.get("set_up_after"):
            prepare.mark_set_up(cwd, {"at": time.time(), "attempt": spec.get("attempt"),
                                      "setup": None, "by": "ssh host"})
    answer({"staged": str(folder.dir), **found})
    return 0


def cmd_spawn(folder: AttemptLog) -> int:
    order = stdin_json()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSH_")}
    env.update({k: str(v) for k, v in (order.get("env") or {}).items()})
    package = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = package
    keys = order.get("keys") or {}
    if order.get("key_file"):  # the host keeps its key: read where put-key wrote it
        try:
            keys = json.loads(Path(order["key_file"]).read_bytes())
            os.utime(order["key_file"])  # in use: not pruned
        except (OSError, ValueError) as exc:
            answer({"error": f"the host's key file {order['key_file']} is unreadable "
                              f"({exc.__class__.__name__}); `fleet-tui host check` writes "
                              "it again"})
            return 1
    proc = start_runner(folder, env, keys, SPAWN_WAIT)
    answer({"pid": proc.pid, "start": procs.start_time(proc.pid)})
    return 0


KEY_FILE_IDLE = 86_400.0
"""Seconds a key file may go unused before put-key removes it (a rotated key's old file)."""


def cmd_put_key(path: str) -> int:
    """The key variables on stdin, kept at `path` (0600), written aside and renamed."""
    keys = stdin_json()
    target = Path(path)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    aside = target.with_name(f".{target.name}.{os.getpid()}")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(json.dumps(keys).encode())
    os.replace(aside, target)
    now = time.time()
    for other in target.parent.glob("*.json"):
        with contextlib.suppress(OSError):
            if other != target and now - other.stat().st_mtime > KEY_FILE_IDLE:
                other.unlink()
    answer({"kept": str(target)})
    return 0


def cmd_state(folder: AttemptLog) -> int:
    pid, start, _claude = pids(folder)
    answer({"state": runner_state(folder), "pid": pid, "start": start})
    return 0


def cmd_stop(folder: AttemptLog) -> int:
    req = stdin_json()
    folder.request_stop(StopReason(req["reason"]), str(req.get("message") or ""),
                        at=float(req["at"]), by=str(req.get("by") or ""))
    pid, start, _claude = pids(folder)
    sent = bool(pid and procs.is_alive(pid, start) and procs.signal_pid(pid, signal.SIGTERM))
    answer({"signalled": sent})
    return 0


def cmd_kill(folder: AttemptLog) -> int:
    pid, start, claude = pids(folder)
    groups = [g for g in (pid, claude) if g]
    if pid and procs.is_alive(pid, start):
        procs.signal_tree(pid, signal.SIGKILL, groups=groups)
    elif claude:
        procs.signal_group(claude, signal.SIGKILL)
    answer({"swept": sweep(folder)})
    return 0


def cmd_sweep(folder: AttemptLog) -> int:
    answer({"swept": sweep(folder)})
    return 0


def cmd_say(folder: AttemptLog, by: str) -> int:
    text = sys.stdin.buffer.read().decode("utf-8")
    try:
        answer({"id": folder.send_input(text, by=by)})
    except InputClosed as exc:
        answer({"closed": str(exc)})
    return 0


def cmd_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        answer({"port": int(sock.getsockname()[1])})
    return 0


def cmd_release(root: str, task_id: str) -> int:
    """A released task's worktree and config dir removed, and every mirror of the data
    dir `root` forgets it (its worktree record pruned, its refs deleted); the attempt
    folders stay (mirrored on the controller already)."""
    shutil.rmtree(Path(root) / "config" / task_id, ignore_errors=True)
    shutil.rmtree(Path(root) / "work" / task_id, ignore_errors=True)
    for mirror in sorted((Path(root) / "repos").glob("*.git")):
        if not mirror.is_dir():
            continue
        with mirror_lock(str(mirror)):
            subprocess.run(["git", "-C", str(mirror), "worktree", "prune"],
                           capture_output=True, check=False)
        for ref in (f"refs/fleet/base/{task_id}", f"refs/fleet/base/update/{task_id}",
                    f"refs/fleet/snapshot/{task_id}"):
            subprocess.run(["git", "-C", str(mirror), "update-ref", "-d", ref],
                           capture_output=True, check=False)
    answer({"released": task_id})
    return 0


def cmd_snapshot(path: str, ref: str) -> int:
    """The worktree as it is (tracked and untracked files, ignored ones not) as a commit
    on top of HEAD, built in a temporary index: the worker's files, index and branch do
    not change. HEAD itself when nothing is uncommitted."""
    import shutil
    import tempfile

    try:
        head = git("-C", path, "rev-parse", "HEAD")
        commit = head
        if git("-C", path, "status", "--porcelain", "--untracked-files=all"):
            index = git("-C", path, "rev-parse", "--path-format=absolute", "--git-path",
                         "index")
            with tempfile.TemporaryDirectory(prefix="fleet-snapshot-") as tmp:
                temp_index = os.path.join(tmp, "index")
                if os.path.exists(index):
                    shutil.copyfile(index, temp_index)
                os.environ["GIT_INDEX_FILE"] = temp_index
                git("-C", path, "add", "-A", "--", ".")
                tree = git("-C", path, "write-tree")
                del os.environ["GIT_INDEX_FILE"]
            ident("fleet-tui", "fleet-tui@localhost")
            commit = git("-C", path, "commit-tree", tree, "-p", head, "-m",
                          "fleet-tui snapshot")
        git("-C", path, "update-ref", ref, commit)
    except RuntimeError as exc:
        answer({"error": str(exc)})
        return 1
    answer({"commit": commit, "head": head})
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write("usage: python3 -m fleet_tui.execution.worker.agent COMMAND ...\n")
        return 2
    command, rest = args[0], args[1:]
    os.umask(0o077)
    if command == "port":
        return cmd_port()
    if command == "worktree":
        return cmd_worktree(*rest)
    if command == "check-worktree":
        return cmd_check_worktree(*rest)
    if command == "commit-work":
        return cmd_commit_work(*rest)
    if command == "snapshot":
        return cmd_snapshot(*rest)
    if command == "update":
        return cmd_update(*rest)
    if command == "abort-update":
        return cmd_abort_update(*rest)
    if command == "put-key":
        return cmd_put_key(*rest)
    if command == "release":
        return cmd_release(*rest)
    folder = AttemptLog(rest[0])
    simple = {"stage": cmd_stage, "spawn": cmd_spawn, "state": cmd_state, "stop": cmd_stop,
              "kill": cmd_kill, "sweep": cmd_sweep}
    if command == "follow":
        return cmd_follow(folder, rest[1] if len(rest) > 1 else "{}")
    if command in simple:
        return simple[command](folder)
    if command == "say":
        return cmd_say(folder, rest[1] if len(rest) > 1 else "")
    sys.stderr.write(f"unknown command {command}\n")
    return 2


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        raise SystemExit(main())
