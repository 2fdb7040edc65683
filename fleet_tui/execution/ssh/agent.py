"""The SSH host's side: `python3 -m fleet_tui.execution.ssh.agent COMMAND ...`, run on the
host by the controller over its SSH connection, one short command at a time (the follower
excepted: `follow` streams an attempt folder until its runner is gone).

It runs from the package copied into the host's data dir (the same version as the
controller's), with the host's own python and only the standard library: it imports the
attempt folder's format, the spec, the process layer's Linux part and the git plumbing
of vcs (run, commits, merging: an update's checks are a local worktree's), never a module
that needs a third-party package. Every answer is one JSON line on stdout (`follow`: frames).

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
import fcntl
import io
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from fleet_tui.core.states import StopReason
from fleet_tui.execution import hostcage, hostclaude
from fleet_tui.execution.attemptlog import AttemptLog, InputClosed
from fleet_tui.execution.local import prepare
from fleet_tui.execution.spec import LEFTOVER_GRACE, TOKEN_ENV
from fleet_tui.system import cgroups, procs
from fleet_tui.vcs.commits import _snapshot_commit
from fleet_tui.vcs.merging import _in_the_way, _merge_tree, _tree_changes
from fleet_tui.vcs.merging import _with_markers as _marked
from fleet_tui.vcs.run import GitError, _put_index_back, _shown

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any, BinaryIO

RUNNER_MODULE = "fleet_tui.execution.local.runner"
EX_LOCKED = 75
EX_NO_CLAUDE = 3  # the host has no claude (said in the answer: where it was looked for)
EX_NO_CAGE = 4  # a caged attempt, and the host cannot cage (said in the answer: what it lacks)
# the folder's files a runner appends to (mirrored by offset) and those it writes whole
APPENDED = ("events.jsonl", "stderr.log", "runner.log", "setup.log", "input.jsonl")
WHOLE = ("runner.json", "kill.json", "cage.json")  # cage.json: the attempt ran caged
EXIT = "exit.json"  # sent last, once the runner is gone and every appended byte is out
FOLLOW_POLL = 0.02  # seconds between two looks at the folder without inotify
INOTIFY_IDLE = 0.1  # with inotify: a look this often even when nothing changed (the lock)
HEARTBEAT = 1.0  # a frame at least this often (the controller knows the link lives)
CHUNK = 256 * 1024
SPAWN_WAIT = 10.0  # seconds for a new runner to take its lock


def _answer(data: Any) -> None:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


def _stdin_json() -> Any:
    return json.loads(sys.stdin.buffer.read() or b"null")


def runner_state(folder: AttemptLog) -> str:
    """alive | dead | never, as the local host says it (the lock, else the records)."""
    held = folder.lock_held()
    if held:
        return "alive"
    if held is None and folder.has_runner_record() and not folder.exited:
        rec = folder.runner_record() or {}
        pid = rec.get("runner_pid")
        start = rec.get("runner_start")
        if isinstance(pid, int) and procs.is_alive(pid, str(start) if start else None):
            return "alive"
    return "dead" if folder.has_run() or folder.exited else "never"


def _pids(folder: AttemptLog) -> tuple[int | None, str | None, int | None]:
    rec = folder.runner_record() or {}
    pid, start, claude = rec.get("runner_pid"), rec.get("runner_start"), rec.get("claude_pid")
    return (pid if isinstance(pid, int) and pid > 0 else None,
            str(start) if start is not None else None,
            claude if isinstance(claude, int) and claude > 0 else None)


def sweep(folder: AttemptLog) -> int:
    """The processes carrying the attempt's token and those of its cgroup, stopped."""
    token = folder.spec_token()
    found = procs.with_env(TOKEN_ENV, token) if token is not None else []
    if found:
        procs.stop(found, LEFTOVER_GRACE)
    cgroup = cgroups.recorded(folder.runner_record())
    contained = cgroups.end(cgroup, LEFTOVER_GRACE) if cgroup is not None else []
    return len(set(found) | set(contained))


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
        _answer({"error": f"a runner holds {folder.lock_path} already"})
        return EX_LOCKED
    found: dict[str, Any] = {}
    if order.get("data_dir"):  # the host's own claude, never a path of the controller's
        data_dir = str(order["data_dir"])
        settings = spec.setdefault("settings", {})
        claude, looked = hostclaude.find(data_dir, settings.get("claude") or None)
        if claude is None:
            _answer({"error": "no claude there: " + "; ".join(looked), "no_claude": True})
            return EX_NO_CLAUDE
        settings["claude"] = claude
        found = {"claude": claude, "claude_version": hostclaude.version(claude, data_dir)}
        why = hostcage.into_spec(spec, data_dir)  # the host's own srt, for a caged attempt
        if why:
            _answer({"error": why, "no_cage": True})
            return EX_NO_CAGE
    folder.clear_run_records()
    folder.write_spec(spec)
    for path in (folder.events, folder.runner_log):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.close(fd)
    cwd = str(spec["cwd"])
    if tar and not prepare.is_set_up(cwd):
        os.umask(0o022)  # the worktree's files are the user's, as git made them
        with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
            archive.extractall(cwd, filter="data")
        if order.get("set_up_after"):
            prepare.mark_set_up(cwd, {"at": time.time(), "attempt": spec.get("attempt"),
                                      "setup": None, "by": "ssh host"})
    _answer({"staged": str(folder.dir), **found})
    return 0


def cmd_spawn(folder: AttemptLog) -> int:
    order = _stdin_json()
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
            _answer({"error": f"the host's key file {order['key_file']} is unreadable "
                              f"({exc.__class__.__name__}); `fleet-tui host check` writes "
                              "it again"})
            return 1
    proc = start_runner(folder, env, keys, SPAWN_WAIT)
    _answer({"pid": proc.pid, "start": procs.start_time(proc.pid)})
    return 0


def start_runner(folder: AttemptLog, env: dict[str, str], keys: dict[str, str],
                 wait: float) -> subprocess.Popen[bytes]:
    """The runner started detached (its own session, stdin /dev/null, its output in
    runner.log), the key variables through a pipe it inherits (`--env-fd`), never its
    environment or argv; returned once it took its lock (or ended, or `wait` passed)."""
    # started as this process was: without the site module (-S), the host's installed
    # packages are never on the runner's path either (the package copy alone is)
    argv = [sys.executable, *(["-S"] if sys.flags.no_site else []), "-m", RUNNER_MODULE]
    with contextlib.suppress(OSError):  # a caged attempt: the host's srt, as stage found it
        env = hostcage.runner_env(folder.read_spec(), dict(env))
    pass_fds: tuple[int, ...] = ()
    read_fd: int | None = None
    if keys:
        read_fd, write_fd = os.pipe()
        with os.fdopen(write_fd, "wb") as fh:
            fh.write(json.dumps(keys).encode())  # a pipe's buffer holds 64 KiB: enough
        argv += ["--env-fd", str(read_fd)]
        pass_fds = (read_fd,)
    argv.append(str(folder.dir))
    with open(folder.runner_log, "ab") as out:
        proc = subprocess.Popen(argv, cwd=folder.dir, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                pass_fds=pass_fds, close_fds=True)
    if read_fd is not None:
        os.close(read_fd)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None or folder.has_runner_record():
            break
        time.sleep(0.01)
    return proc


KEY_FILE_IDLE = 86_400.0
"""Seconds a key file may go unused before put-key removes it (a rotated key's old file)."""


def cmd_put_key(path: str) -> int:
    """The key variables on stdin, kept at `path` (0600), written aside and renamed."""
    keys = _stdin_json()
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
    _answer({"kept": str(target)})
    return 0


def cmd_state(folder: AttemptLog) -> int:
    pid, start, _claude = _pids(folder)
    _answer({"state": runner_state(folder), "pid": pid, "start": start})
    return 0


def cmd_stop(folder: AttemptLog) -> int:
    req = _stdin_json()
    folder.request_stop(StopReason(req["reason"]), str(req.get("message") or ""),
                        at=float(req["at"]), by=str(req.get("by") or ""))
    pid, start, _claude = _pids(folder)
    sent = bool(pid and procs.is_alive(pid, start) and procs.signal_pid(pid, signal.SIGTERM))
    _answer({"signalled": sent})
    return 0


def cmd_kill(folder: AttemptLog) -> int:
    pid, start, claude = _pids(folder)
    groups = [g for g in (pid, claude) if g]
    if pid and procs.is_alive(pid, start):
        procs.signal_tree(pid, signal.SIGKILL, groups=groups)
    elif claude:
        procs.signal_group(claude, signal.SIGKILL)
    _answer({"swept": sweep(folder)})
    return 0


def cmd_sweep(folder: AttemptLog) -> int:
    _answer({"swept": sweep(folder)})
    return 0


def cmd_say(folder: AttemptLog, by: str) -> int:
    text = sys.stdin.buffer.read().decode("utf-8")
    try:
        _answer({"id": folder.send_input(text, by=by)})
    except InputClosed as exc:
        _answer({"closed": str(exc)})
    return 0


def cmd_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        _answer({"port": int(sock.getsockname()[1])})
    return 0


def _git(*args: str, cwd: str | None = None) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines()
        verb = next((a for a in args[2:] if not a.startswith("-")), args[0]) \
            if args[0] == "-C" else args[0]
        raise RuntimeError(f"git {verb} failed on the host: {lines[-1] if lines else ''}")
    return out.stdout.strip()


MIRROR_LOCK = "fleet-worktrees.lock"  # in the mirror (the host's data dir): see mirror_lock


@contextlib.contextmanager
def mirror_lock(mirror: str) -> Iterator[None]:
    """The mirror's worktrees made, removed and pruned one at a time, by every task's
    agent and every Ray job on this host: a prune removes a half-made `worktrees/<id>/`
    of another task's `worktree add` (it has no `gitdir` yet), which then fails."""
    try:
        fd = os.open(Path(mirror) / MIRROR_LOCK, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC,
                     0o600)
    except OSError:  # no mirror (git says so) or a read-only one: nothing to guard
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def cmd_worktree(mirror: str, path: str, branch: str, base: str, mode: str) -> int:
    """`mode`: new (made at `base`, replacing what a failed start left), reset, reattach."""
    try:
        with mirror_lock(mirror):
            head = _make_worktree(mirror, path, branch, base, mode)
    except RuntimeError as exc:
        _answer({"error": str(exc)})
        return 1
    _answer({"path": path, "branch": branch, "head": head})
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
    _answer({"released": task_id})
    return 0


def _make_worktree(mirror: str, path: str, branch: str, base: str, mode: str) -> str:
    if mode == "reattach":
        if not Path(path).is_dir():
            _git("-C", mirror, "worktree", "prune")
            _git("-C", mirror, "worktree", "add", path, branch)
    else:
        if Path(path).exists():
            _git("-C", mirror, "worktree", "remove", "--force", path)
        _git("-C", mirror, "worktree", "prune")
        _git("-C", mirror, "worktree", "add", "-B", branch, path, base)
    return _git("-C", path, "rev-parse", "HEAD")


def cmd_check_worktree(path: str, branch: str) -> int:
    try:
        on = _git("-C", path, "symbolic-ref", "--short", "HEAD")
    except RuntimeError as exc:
        _answer({"error": str(exc)})
        return 1
    _answer({"branch": on, "ok": on == branch})
    return 0


def cmd_commit_work(path: str, message: str, name: str, email: str) -> int:
    """Commit what the worker left uncommitted in its worktree (untracked files too,
    ignored ones not) as the controller's user, so that fetching the branch brings all
    of its work."""
    for role in ("AUTHOR", "COMMITTER"):
        os.environ[f"GIT_{role}_NAME"] = name
        os.environ[f"GIT_{role}_EMAIL"] = email
    try:
        if not _git("-C", path, "status", "--porcelain", "--untracked-files=all"):
            _answer({"committed": None})
            return 0
        _git("-C", path, "add", "-A", "--", ".")
        _git("-C", path, "commit", "--no-verify", "-q", "-m", message)
        _answer({"committed": _git("-C", path, "rev-parse", "HEAD")})
    except RuntimeError as exc:
        _answer({"error": str(exc)})
        return 1
    return 0


def _ident(name: str, email: str) -> None:
    for role in ("AUTHOR", "COMMITTER"):
        os.environ[f"GIT_{role}_NAME"] = name
        os.environ[f"GIT_{role}_EMAIL"] = email


def cmd_snapshot(path: str, ref: str) -> int:
    """The worktree as it is (tracked and untracked files, ignored ones not) as a commit
    on top of HEAD, built in a temporary index: the worker's files, index and branch do
    not change. HEAD itself when nothing is uncommitted."""
    import shutil
    import tempfile

    try:
        head = _git("-C", path, "rev-parse", "HEAD")
        commit = head
        if _git("-C", path, "status", "--porcelain", "--untracked-files=all"):
            index = _git("-C", path, "rev-parse", "--path-format=absolute", "--git-path",
                         "index")
            with tempfile.TemporaryDirectory(prefix="fleet-snapshot-") as tmp:
                temp_index = os.path.join(tmp, "index")
                if os.path.exists(index):
                    shutil.copyfile(index, temp_index)
                os.environ["GIT_INDEX_FILE"] = temp_index
                _git("-C", path, "add", "-A", "--", ".")
                tree = _git("-C", path, "write-tree")
                del os.environ["GIT_INDEX_FILE"]
            _ident("fleet-tui", "fleet-tui@localhost")
            commit = _git("-C", path, "commit-tree", tree, "-p", head, "-m",
                          "fleet-tui snapshot")
        _git("-C", path, "update-ref", ref, commit)
    except RuntimeError as exc:
        _answer({"error": str(exc)})
        return 1
    _answer({"commit": commit, "head": head})
    return 0


def _operation(path: str) -> str | None:
    """"merge" or "rebase" while one is stopped in the worktree, else None."""
    for name, what in (("rebase-merge", "rebase"), ("rebase-apply", "rebase"),
                       ("MERGE_HEAD", "merge")):
        found = _git("-C", path, "rev-parse", "--path-format=absolute", "--git-path", name)
        if os.path.exists(found):
            return what
    return None


def _unmerged(path: str) -> list[str]:
    out = _git("-C", path, "diff", "--name-only", "--diff-filter=U")
    return sorted({line for line in out.splitlines() if line})


def _is_ancestor(path: str, ancestor: str, commit: str) -> bool:
    return subprocess.run(["git", "-C", path, "merge-base", "--is-ancestor", ancestor, commit],
                          capture_output=True, check=False).returncode == 0


def _with_markers(path: str, names: list[str]) -> list[str]:
    """The files among `names` that still hold conflict markers."""
    return _marked(Path(path), sorted(set(names)))


def _ignored_in_the_way(path: Path, uncommitted: bool, base: str) -> list[str]:
    """The files an update from `base` would write over that are ignored in the worktree
    (`git merge` overwrites them without a word): worked out before anything changes, on a
    snapshot of the uncommitted work, the same check as a local worktree's update."""
    try:
        side = _snapshot_commit(path) if uncommitted else _git("-C", str(path), "rev-parse",
                                                                "HEAD")
        tree, _ = _merge_tree(path, side, base)
        return _in_the_way(path, _tree_changes(path, side, tree))
    except GitError as exc:
        raise RuntimeError(str(exc)) from exc


def _update(path: str, base: str, strategy: str, message: str,
            conflicted: list[str] | None = None) -> dict[str, Any]:
    """`conflicted`: the files an earlier update of this worktree stopped on (the engine
    keeps them): a file the worker staged, or committed, with its markers still in is not
    resolved."""
    conflicted = conflicted or []
    operation = _operation(path)
    if operation is not None:  # stopped on conflicts before: concluded once resolved
        unmerged = _unmerged(path)
        if unmerged:
            return {"status": "conflicts", "conflicts": unmerged, "operation": operation}
        changed = _git("-C", path, "diff", "--name-only", "HEAD").splitlines()
        marked = _with_markers(path, conflicted + changed)
        if marked:
            return {"status": "conflicts", "conflicts": marked, "operation": operation}
        _git("-C", path, "add", "-A", "--", ".")
        if operation == "merge":
            _git("-C", path, "commit", "--no-verify", "-q", "--no-edit")
        else:
            _git("-C", path, "-c", "core.editor=true", "rebase", "--continue")
        _drop_record(path)
        return {"status": "updated", "resolved": True,
                "head": _git("-C", path, "rev-parse", "HEAD")}
    if conflicted:  # the worker concluded it itself: with the markers still in?
        marked = _with_markers(path, conflicted)
        if marked:
            return {"status": "conflicts", "conflicts": marked, "operation": None,
                    "concluded": True}
    uncommitted = bool(_git("-C", path, "status", "--porcelain", "--untracked-files=all"))
    head = _git("-C", path, "rev-parse", "HEAD")
    if not _is_ancestor(path, base, head):
        blocked = _ignored_in_the_way(Path(path), uncommitted, base)
        if blocked:
            many = "file" if len(blocked) == 1 else "files"
            return {"status": "refused", "error": (
                f"bringing {_git('-C', path, 'branch', '--show-current') or 'the branch'} "
                f"up to date would overwrite {len(blocked)} ignored {many} of its worktree "
                f"{path}: {_shown(blocked)}; move them away, then update again")}
    if not _is_ancestor(path, base, head):
        _save_record(path, head)
    committed = None
    if uncommitted:
        _git("-C", path, "add", "-A", "--", ".")
        _git("-C", path, "commit", "--no-verify", "-q", "-m", message)
        committed = _git("-C", path, "rev-parse", "HEAD")
    head = _git("-C", path, "rev-parse", "HEAD")
    if _is_ancestor(path, base, head):
        _drop_record(path)  # an earlier update the worker concluded: nothing to abort now
        return {"status": "current", "head": head, "committed": committed}
    if strategy == "rebase":
        args = ["-c", "core.editor=true", "rebase", base]
    else:
        args = ["merge", "--no-verify", "--no-edit", "-m", message, base]
    done = subprocess.run(["git", "-C", path, *args], capture_output=True, text=True,
                          check=False)
    if done.returncode == 0:
        _drop_record(path)
        return {"status": "updated", "head": _git("-C", path, "rev-parse", "HEAD"),
                "committed": committed}
    operation = _operation(path)
    unmerged = _unmerged(path)
    if operation is not None and unmerged:
        return {"status": "conflicts", "conflicts": unmerged, "operation": operation,
                "committed": committed}
    if operation is not None:
        _git("-C", path, operation, "--abort")
    _restore_record(path)
    lines = (done.stderr or done.stdout).strip().splitlines()
    return {"status": "refused", "error": lines[-1] if lines else f"git {args[0]} failed"}


# The worktree as it was before an update (its HEAD, and its index copied byte for byte),
# kept in its git dir until the update is done, so that aborting it puts the worker's
# uncommitted work back as it was, as a local worktree's abort does (vcs/update.py).
_RECORD = "fleet-tui-update.json"
_RECORD_INDEX = "fleet-tui-update.index"


def _git_path(path: str, name: str) -> Path:
    return Path(_git("-C", path, "rev-parse", "--path-format=absolute", "--git-path", name))


def _save_record(path: str, head: str) -> None:
    index = _git_path(path, "index")
    had_index = index.exists()
    if had_index:
        shutil.copyfile(index, _git_path(path, _RECORD_INDEX))
    record = _git_path(path, _RECORD)
    tmp = record.with_name(record.name + ".tmp")
    tmp.write_text(json.dumps({"head": head, "index": had_index}))
    os.replace(tmp, record)


def _drop_record(path: str) -> None:
    for name in (_RECORD, _RECORD_INDEX):
        _git_path(path, name).unlink(missing_ok=True)


def _restore_record(path: str) -> bool:
    """Back to the HEAD and index of before the update (its merge or rebase aborted
    already); the files of the worktree are the worker's as they were. False without a
    record."""
    try:
        before = json.loads(_git_path(path, _RECORD).read_text())
    except (OSError, ValueError):
        return False
    _git("-C", path, "reset", "-q", "--soft", str(before["head"]))
    _put_index_back(_git_path(path, "index"), _git_path(path, _RECORD_INDEX),
                    bool(before.get("index")))
    _drop_record(path)
    return True


def cmd_update(path: str, base: str, strategy: str, message: str, name: str,
               email: str) -> int:
    _ident(name, email)
    order = _stdin_json() or {}
    try:
        _answer(_update(path, base, strategy, message, order.get("conflicted")))
    except RuntimeError as exc:
        _answer({"error": str(exc)})
        return 1
    return 0


def _abort_update(path: str, conflicted: list[str]) -> dict[str, Any]:
    """The merge or rebase an update stopped on undone (`git merge --abort`), then the HEAD
    and index of before the update put back from its record: the worktree at the task's
    tip, the worker's uncommitted work as it was. {"error": ...} when the update was
    concluded with conflict markers still in (a commit, nothing to abort) or git failed.
    A Ray node's abort job runs it too."""
    try:
        operation = _operation(path)
        marked = _with_markers(path, conflicted) if operation is None else []
        if marked:  # concluded with the markers in: a commit, not an update to abort
            return {"error": "the update was concluded with conflict markers still in "
                             f"{', '.join(marked)}: there is nothing to abort; resolve them "
                             "there (or let its worker: update --resolve worker)"}
        if operation is not None:
            _git("-C", path, operation, "--abort")
        restored = _restore_record(path)
        return {"aborted": operation, "restored": restored,
                "head": _git("-C", path, "rev-parse", "HEAD")}
    except RuntimeError as exc:
        return {"error": str(exc)}


def cmd_abort_update(path: str) -> int:
    order = _stdin_json() or {}
    answer = _abort_update(path, order.get("conflicted") or [])
    _answer(answer)
    return 1 if "error" in answer else 0


# --- following: the attempt folder streamed by offset ----------------------------------------


def _frame(out: BinaryIO, head: dict[str, Any], body: bytes = b"") -> None:
    head["n"] = len(body)
    out.write(json.dumps(head).encode() + b"\n" + body)


def _send_new(folder: AttemptLog, out: BinaryIO, offsets: dict[str, int],
              stamps: dict[str, Any]) -> bool:
    """What was appended since `offsets`, and the whole records that changed; True when
    anything was sent."""
    sent = False
    for name in APPENDED:
        path = folder.dir / name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            continue
        at = offsets.get(name, 0)
        if size <= at:
            continue
        with open(path, "rb") as fh:
            fh.seek(at)
            while at < size:
                body = fh.read(min(CHUNK, size - at))
                if not body:
                    break
                _frame(out, {"f": name, "o": at}, body)
                at += len(body)
                sent = True
        offsets[name] = at
    for name in WHOLE:
        path = folder.dir / name
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamps.get(name) == stamp:
            continue
        body = path.read_bytes()
        stamps[name] = stamp
        _frame(out, {"f": name, "whole": True}, body)
        sent = True
    return sent


class _Changes:
    """Wakes the follower when a file of the folder changes (Linux's inotify, through
    libc); elsewhere a plain poll every FOLLOW_POLL seconds."""

    # modify, moved_to, create, delete (not close_write: our own look at the lock opens it
    # for writing, and would wake us at once)
    MASK = 0x2 | 0x80 | 0x100 | 0x200

    def __init__(self, folder: Path) -> None:
        self.fd: int | None = None
        try:
            import ctypes
            import ctypes.util

            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd >= 0 and libc.inotify_add_watch(fd, os.fsencode(folder), self.MASK) >= 0:
                self.fd = fd
            elif fd >= 0:
                os.close(fd)
        except (OSError, AttributeError):
            self.fd = None

    def wait(self) -> None:
        if self.fd is None:
            time.sleep(FOLLOW_POLL)
            return
        ready, _, _ = select.select([self.fd], [], [], INOTIFY_IDLE)
        if ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(self.fd, 65536):
                    pass


def cmd_follow(folder: AttemptLog, given: str) -> int:
    """Stream the folder from the offsets given (JSON: file name -> bytes mirrored) until
    the runner is gone: frames of a JSON head line and its bytes; a state frame first and
    whenever HEARTBEAT passed without a frame (a controller gone ends it: the write
    fails); exit.json last."""
    offsets = {k: int(v) for k, v in (json.loads(given) or {}).items()}
    stamps: dict[str, Any] = {}
    out = sys.stdout.buffer
    beat_at: float | None = None
    changes = _Changes(folder.dir)
    while True:
        state = runner_state(folder)  # first: once it is gone, what follows is complete
        sent = _send_new(folder, out, offsets, stamps)
        now = time.monotonic()
        if state != "alive":
            exit_rec = folder.dir / EXIT
            if exit_rec.exists():
                _frame(out, {"f": EXIT, "whole": True}, exit_rec.read_bytes())
            _frame(out, {"state": state, "end": True})
            out.flush()
            return 0
        # the state first, then only when HEARTBEAT passed without a frame: a data frame
        # is the beat (no state frame beside each event: the controller's CPU per worker)
        if beat_at is None or (not sent and now - beat_at >= HEARTBEAT):
            _frame(out, {"state": state})
            beat_at = now
        elif sent:
            beat_at = now
        out.flush()
        changes.wait()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write("usage: python3 -m fleet_tui.execution.ssh.agent COMMAND ...\n")
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
