"""The Ray host's side: one Ray job per attempt, `python -m fleet_tui.execution.worker.job`.

The job's entrypoint on the node the cluster chose (by the host's resources). It runs from
the package shipped in the job's runtime_env (`py_modules`), with the node's python and only
the standard library (as the SSH host's agent: the attempt folder's format, the spec, the
process layer), and reads `order.json` from its working dir (`working_dir`, shipped with
the job: the spec as the node runs it, the repository as a git bundle, the included files
as a tar; the attempt's gateway token and nothing else of a credential: the key is never
in the job, its runtime_env, its metadata or its logs).

What it does, in order:
1. The repository: a bare mirror per repository under the node's data dir, the bundle
   fetched into it (`refs/fleet/base/ID`; a bundle cut against commits the mirror lacks
   refused with `lacks`, for the controller to send it whole; no bundle: the mirror holds
   the base), the released tasks' worktrees and config dirs removed, the mirror's tips
   said back; the task's worktree made from it (new, reset, re-attached or kept as it
   is: a resume or a follow-up on the node that holds it; `restore`: from the collected
   branch, with claude's transcripts unpacked into the config dir, its node being gone).
2. The attempt folder `DATA/attempts/ID/N`: the spec written, the included files unpacked
   into a worktree not set up yet (the runner runs the setup command itself).
3. The runner (`fleet_tui.execution.worker.runner`, a child subreaper) started in a session
   of its own, the key variables (the token, or the key the cluster holds in the variable
   the host's settings name) through an inherited pipe, never its environment or argv.
4. The folder streamed back as framed lines on stdout, which is the job's log: each line
   `FRAME_PREFIX {head} {base64 body}`, the SSH agent's frames (a file appended at an
   offset, a whole record, the runner's state each second) cut to at most PIECE bytes, so
   the controller rebuilds the folder byte for byte from the job's logs wherever the node
   is. The task's branch comes back the same way (a bundle of its commits past the base)
   each time its tip moves and at the end, after the worker's uncommitted work is
   committed; then claude's transcripts (`session` frames), the mirror's tips, exit.json,
   the end frame.

Steering: a thread beside the runner long-polls the controller's gateway for the
attempt's mailbox (`/fleet/mailbox`, the attempt's token) and hands each message to the
runner's own input channel under its id, saying back queued, taken or closed.

Stopping: Ray's `stop_job` sends SIGTERM to the entrypoint and every descendant present;
the entrypoint then ends the runner's tree (SIGKILL after STOP_GRACE: Ray kills what is
left 3 s after its SIGTERM) and sweeps whatever carries the attempt's token (a
double-forked daemon Ray's own stop leaves), before the folder's last bytes go out. A node
whose raylet died leaves its entrypoint orphaned (the job's supervisor dies with the
raylet, the processes do not): the entrypoint sees its parent change and does the same.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

from fleet_tui.execution.worker import frames as follow_frames
from fleet_tui.execution.worker import (
    hostcage,
    hostclaude,
    prepare,
    runs,
    unpack,
    update,
    worktrees,
)
from fleet_tui.execution.worker.attemptlog import AttemptLog, InputClosed
from fleet_tui.system import procs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

ORDER_FILE = "order.json"
BUNDLE_FILE = "base.bundle"
INCLUDED_FILE = "included.tar"
RESTORE_BRANCH = "branch.bundle"  # the task's branch as the controller collected it
RESTORE_SESSION = "session.tar"  # claude's transcripts of the task, as its last job sent them
FRAME_PREFIX = "FLEET-FRAME"
PIECE = 24 * 1024  # bytes of a file in one log line (a line of ~32 kB once in base64)
STOP_GRACE = 1.0  # seconds between the runner's SIGTERM and the SIGKILL of its tree
BRANCH_POLL = 2.0  # seconds between two looks at the task's branch while the worker runs
PARENT_POLL = 0.5  # seconds between two looks at the entrypoint's parent (the supervisor)
RUNNER_START = 30.0  # seconds for the runner to take its lock
MAILBOX_PATH = "/fleet/mailbox"  # the gateway's (gateway/server.py MAILBOX_PATH)
MAILBOX_WAIT = 15.0  # seconds one fetch of the mailbox waits for a message (a long poll)
MAILBOX_TAKEN_POLL = 0.2  # seconds a fetch waits while a message is not taken yet
GATEWAY_TOKEN_PREFIX = "fleet-gw-"  # store/meter.py TOKEN_PREFIX (stdlib only here)
MIRROR_TIPS = 100  # the newest tips of the node's mirror said back


def encode_frame(head: dict[str, Any], body: bytes = b"") -> str:
    """One frame as a log line (no newline)."""
    return f"{FRAME_PREFIX} {json.dumps(head, separators=(',', ':'))} " \
           f"{base64.b64encode(body).decode('ascii')}"


def decode_frame(line: str) -> tuple[dict[str, Any], bytes] | None:
    """A log line's frame (None: a line that is not one of ours)."""
    if not line.startswith(FRAME_PREFIX + " "):
        return None
    rest = line[len(FRAME_PREFIX) + 1:].rstrip("\r\n")
    head_text, _, body_text = rest.rpartition(" ")
    try:
        head = json.loads(head_text)
        body = base64.b64decode(body_text, validate=True)
    except ValueError:
        return None
    return (head, body) if isinstance(head, dict) else None


class Frames(io.RawIOBase):
    """Where the SSH agent's follower writes its binary frames (one write a frame): each
    becomes framed lines on stdout, cut to PIECE bytes. exit.json and the end frame are
    held back until `finish`, so the branch goes out before them."""

    def __init__(self, out: Any) -> None:
        super().__init__()
        self.out = out
        self.lock = threading.Lock()
        self.held: list[tuple[dict[str, Any], bytes]] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        raw = bytes(data)
        head_line, _, body = raw.partition(b"\n")
        head = json.loads(head_line)
        head.pop("n", None)
        if head.get("f") == follow_frames.EXIT or head.get("end"):
            self.held.append((head, body))
        else:
            self.send(head, body)
        return len(raw)

    def send_file(self, head: dict[str, Any], body: bytes, digest: str | None = None) -> None:
        """`body` whole, as frames of PIECE bytes at their offsets, each with the size and
        sha256 of the whole (the controller puts them together and checks it)."""
        self.send(dict(head, o=0, size=len(body),
                       sha256=digest or hashlib.sha256(body).hexdigest()), body)

    def send(self, head: dict[str, Any], body: bytes = b"") -> None:
        lines = []
        if "o" in head and len(body) > PIECE:
            at = int(head["o"])
            for i in range(0, len(body), PIECE):
                lines.append(encode_frame(dict(head, o=at + i), body[i:i + PIECE]))
        else:
            lines.append(encode_frame(head, body))
        with self.lock:
            for line in lines:
                self.out.write(line + "\n")
            self.out.flush()

    def flush(self) -> None:
        with self.lock:
            self.out.flush()

    def finish(self, **end: Any) -> None:
        for head, body in self.held:
            if head.get("end"):
                head.update(end)
            self.send(head, body)
        self.held = []


class _Out:
    """A stand-in stdout whose `buffer` is the frames."""

    def __init__(self, frames: Frames) -> None:
        self.buffer = frames

    def write(self, text: str) -> int:  # nothing else writes there meanwhile; if it did
        _log(f"(stdout) {text.rstrip()}")
        return len(text)

    def flush(self) -> None:
        self.buffer.flush()


def _log(text: str) -> None:
    sys.stderr.write(f"fleet-tui ray job: {text}\n")
    sys.stderr.flush()


def _quiet(fn: Any, *args: Any) -> int:
    """One of the SSH agent's commands, its JSON answer kept off stdout (the frames')."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = int(fn(*args))
    if code != 0:
        answer = buf.getvalue().strip().splitlines()
        raise RuntimeError(json.loads(answer[-1]).get("error") if answer else "failed")
    return code


class Lacks(RuntimeError):
    """The node's mirror lacks a commit the job's bundle was cut against (its mirror wiped,
    or the cluster chose another node than the one the controller knew): the controller
    sends the job again with a whole bundle."""


_TASK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,80}$")


def fetch_base(order: dict[str, Any], here: Path, ref: str, commit: str) -> None:
    """`commit` into the node's mirror as `ref`: from the job's bundle (whole, or cut
    against commits the node's mirror held, as its last job reported them), or, with no
    bundle, the mirror holding it already. Lacks when the mirror does not have what the
    bundle needs."""
    mirror = str(order["mirror"])
    Path(mirror).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not (Path(mirror) / "HEAD").exists():
        worktrees.git("init", "-q", "--bare", mirror)
    bundle = here / BUNDLE_FILE
    if bundle.exists():
        missing = [c for c in _prerequisites(bundle) if subprocess.run(
            ["git", "-C", mirror, "cat-file", "-e", f"{c}^{{commit}}"], capture_output=True,
            check=False).returncode != 0]
        if missing:
            raise Lacks(f"the node's mirror lacks {len(missing)} of the commits its bundle "
                        f"was cut against ({', '.join(c[:12] for c in missing[:3])})")
        worktrees.git("-C", mirror, "fetch", "-q", "--no-tags", str(bundle), f"+{ref}:{ref}")
        return
    held = subprocess.run(["git", "-C", mirror, "cat-file", "-e", f"{commit}^{{commit}}"],
                          capture_output=True, check=False)
    if held.returncode != 0:
        raise Lacks(f"the node's mirror lacks the commit {commit[:12]} it was said to hold")
    worktrees.git("-C", mirror, "update-ref", ref, commit)


def _prerequisites(bundle: Path) -> list[str]:
    """The commits a bundle was cut against (its header's `-` lines)."""
    found = []
    with open(bundle, "rb") as fh:
        for raw in fh:
            if raw == b"\n":
                break
            if raw.startswith(b"-"):
                found.append(raw[1:].split()[0].decode("ascii"))
    return found


def mirror_tips(frames: Frames, mirror: str) -> None:
    """What the node's mirror holds (the tips of its refs, newest first), for the
    controller to cut the next job's bundle against."""
    done = subprocess.run(["git", "-C", mirror, "for-each-ref", "--sort=-committerdate",
                           "--format=%(objectname)", "refs/heads", "refs/fleet"],
                          capture_output=True, text=True, check=False)
    tips = list(dict.fromkeys(done.stdout.split()))[:MIRROR_TIPS]
    frames.send({"mirror": mirror, "tips": tips})


def release(frames: Frames, order: dict[str, Any]) -> None:
    """The worktrees and config dirs of tasks the controller released (merged or
    discarded) removed from this node, if they are here (a worktree through its own
    mirror: `git worktree remove --force`), their refs in it deleted; said back as
    removed (found here) or absent."""
    ids = [str(t) for t in order.get("released") or []]
    if not ids:
        return
    root = Path(str(order["data_dir"]))
    removed: list[str] = []
    absent: list[str] = []
    for task_id in ids:
        if not _TASK_ID.match(task_id) or task_id == order.get("task_id"):
            continue
        work, config = root / "work" / task_id, root / "config" / task_id
        found = work.exists() or config.exists()
        mirror = _mirror_of(work)
        if mirror is not None:
            with worktrees.mirror_lock(mirror):
                subprocess.run(["git", "-C", mirror, "worktree", "remove", "--force",
                                "--force", str(work)], capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(config, ignore_errors=True)
        for m in {mirror, str(order.get("mirror") or "")} - {None, ""}:
            with worktrees.mirror_lock(str(m)):
                subprocess.run(["git", "-C", str(m), "worktree", "prune"],
                               capture_output=True, check=False)
            for ref in (f"refs/fleet/base/{task_id}", f"refs/fleet/base/update/{task_id}"):
                subprocess.run(["git", "-C", str(m), "update-ref", "-d", ref],
                               capture_output=True, check=False)
        (removed if found else absent).append(task_id)
    frames.send({"released": {"removed": removed, "absent": absent}})


def _mirror_of(worktree: Path) -> str | None:
    """The bare mirror a worktree of this node belongs to (its .git file names it)."""
    try:
        text = (worktree / ".git").read_text()
    except OSError:
        return None
    if not text.startswith("gitdir: "):
        return None
    gitdir = Path(text[len("gitdir: "):].strip())
    return str(gitdir.parent.parent) if gitdir.parent.name == "worktrees" else None


def prepare_repo(order: dict[str, Any], here: Path, frames: Frames | None = None) -> str:
    """The repository's bare mirror on the node with the base commit in it; the task's
    worktree made from it (as the order's mode says). Its path."""
    mirror = Path(order["mirror"])
    fetch_base(order, here, f"refs/fleet/base/{order['task_id']}", str(order["base"]))
    if frames is not None:
        release(frames, order)
        mirror_tips(frames, str(mirror))
    worktree, branch, base = order["worktree"], order["branch"], order["base"]
    Path(worktree).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = order.get("mode") or "keep"
    if order.get("restore"):  # the node that held it is gone: from the collected branch
        restore_branch(order, here)
        mode = "reattach"
    if mode == "keep":  # as it is; its folder gone: the branch checked out again
        mode = "reattach"
    if mode == "reattach" and not Path(worktree).is_dir():
        exists = subprocess.run(["git", "-C", str(mirror), "rev-parse", "--verify", "-q",
                                 f"refs/heads/{branch}"], capture_output=True, check=False)
        if exists.returncode != 0:
            mode = "new"  # the branch never lived on this node: from the base
    _quiet(worktrees.cmd_worktree, str(mirror), worktree, branch, base, mode)
    if mode == "reattach":
        _quiet(worktrees.cmd_check_worktree, worktree, branch)
    return str(worktree)


def restore_branch(order: dict[str, Any], here: Path) -> None:
    """The task's branch in this node's mirror as the controller collected it (a bundle
    past its base), a worktree this node had of it removed first; no bundle: the branch
    at the base (no commits came back)."""
    mirror, worktree, branch = str(order["mirror"]), str(order["worktree"]), order["branch"]
    with worktrees.mirror_lock(mirror):
        if Path(worktree).exists():
            subprocess.run(["git", "-C", mirror, "worktree", "remove", "--force", "--force",
                            worktree], capture_output=True, check=False)
            shutil.rmtree(worktree, ignore_errors=True)
        worktrees.git("-C", mirror, "worktree", "prune")
    bundle = here / RESTORE_BRANCH
    if bundle.exists():
        worktrees.git("-C", mirror, "fetch", "-q", "--no-tags", str(bundle),
                   f"+refs/heads/{branch}:refs/heads/{branch}")
    else:
        worktrees.git("-C", mirror, "update-ref", f"refs/heads/{branch}", str(order["base"]))


def restore_session(order: dict[str, Any], here: Path) -> None:
    """claude's transcripts of the task into its config dir on this node (the same path
    as on the node that held them: the project's folder name is the worktree's path)."""
    tar = here / RESTORE_SESSION
    if not tar.exists():
        return
    config = Path(order["config_dir"])
    config.mkdir(parents=True, exist_ok=True, mode=0o700)
    with tarfile.open(tar) as archive:
        unpack.extract(archive, config)


def send_session(frames: Frames, config_dir: str) -> None:
    """claude's transcripts (the config dir's projects/) as session frames: what a
    follow-up on another node resumes from when this node is gone."""
    projects = Path(config_dir) / "projects"
    if not projects.is_dir():
        return
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as archive:
        archive.add(projects, arcname="projects")
    body = buf.getvalue()
    digest = hashlib.sha256(body).hexdigest()
    frames.send_file({"session": digest}, body, digest)


def stage(order: dict[str, Any], here: Path) -> AttemptLog:
    folder = AttemptLog(order["attempt_dir"])
    folder.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    Path(order["config_dir"]).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if folder.lock_held():
        raise RuntimeError(f"a runner holds {folder.lock_path} already")
    spec = order["spec"]
    node_claude(spec, order)  # none: the job fails here, before its spec or its runner
    node_cage(spec, order)  # the same for the cage of a caged attempt
    if order.get("restore"):
        restore_session(order, here)
    folder.clear_run_records()
    folder.write_spec(spec)
    for path in (folder.events, folder.runner_log):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    cwd = str(spec["cwd"])
    tar = here / INCLUDED_FILE
    if tar.exists() and not prepare.is_set_up(cwd):
        old = os.umask(0o022)  # the worktree's files are the user's, as git made them
        try:
            with tarfile.open(tar) as archive:
                unpack.extract(archive, cwd)
        finally:
            os.umask(old)
        if order.get("set_up_after"):
            prepare.mark_set_up(cwd, {"at": time.time(), "attempt": spec.get("attempt"),
                                      "setup": None, "by": "ray host"})
    return folder


def node_claude(spec: dict[str, Any], order: dict[str, Any]) -> None:
    """The node's own claude into the attempt's spec (the host's `claude` setting, else
    the node's: execution/worker/hostclaude.py); RuntimeError saying so when it has none."""
    settings = spec.setdefault("settings", {})
    data_dir = str(order.get("data_dir") or Path(str(order["attempt_dir"])).parents[2])
    claude, looked = hostclaude.find(data_dir, settings.get("claude") or None)
    if claude is None:
        raise RuntimeError(f"no claude on node {_node_name()}: " + "; ".join(looked)
                           + " (set `claude` in the host's [hosts] table to its path there)")
    settings["claude"] = claude
    found = hostclaude.version(claude, data_dir)
    wanted = order.get("claude_version")
    if wanted and found != wanted:
        _log(f"claude at {claude} on this node is {found or 'of no known version'}, "
             f"fleet-tui is tested with {wanted}")


def node_cage(spec: dict[str, Any], order: dict[str, Any]) -> None:
    """A caged attempt's spec given the node's own srt (the host's `srt` setting, else the
    node's: execution/worker/hostcage.py); RuntimeError saying what the node lacks."""
    data_dir = str(order.get("data_dir") or Path(str(order["attempt_dir"])).parents[2])
    why = hostcage.into_spec(spec, data_dir, order.get("srt") or None)
    if why:
        raise RuntimeError(f"node {_node_name()}: {why} (`fleet-tui host check HOST --probe` "
                           "says what; or set cage = \"off\" in the host's [hosts] table to "
                           "run its workers uncaged)")


def _node_name() -> str:
    return os.environ.get("RAY_NODE_IP_ADDRESS") or socket.gethostname()


def start_runner(folder: AttemptLog, order: dict[str, Any]) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SSH_"))}
    env.update({k: str(v) for k, v in (order.get("env") or {}).items()})
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])
    keys = dict(order.get("keys") or {})
    key_env = order.get("key_env")
    if key_env:  # the key the cluster holds for its workers: read here, never sent
        value = os.environ.get(str(key_env))
        if not value:
            raise RuntimeError(f"the node has no {key_env} in its environment (the host's "
                               "key_env): the cluster's admin provisions it")
        keys[str(order.get("key_variable") or "ANTHROPIC_AUTH_TOKEN")] = value  # HANDED_KEY
    return runs.start_runner(folder, env, keys, RUNNER_START)


def end_tree(folder: AttemptLog, proc: subprocess.Popen[bytes], grace: float) -> int:
    """SIGTERM to the runner (it passes it on to claude), SIGKILL to its tree after
    `grace`, then whatever carries the attempt's token. How many processes were swept."""
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            rec = folder.runner_record() or {}
            claude = rec.get("claude_pid")
            groups = [g for g in (proc.pid, claude) if isinstance(g, int) and g > 0]
            procs.signal_tree(proc.pid, signal.SIGKILL, groups=groups)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
    return sweep(folder)


def sweep(folder: AttemptLog) -> int:
    """The SSH agent's: the attempt's token and its cgroup."""
    return runs.sweep(folder)


class Branch:
    """The task's branch sent back as a bundle of its commits past the base, each time
    its tip moves (the diff of a running task) and at the end."""

    def __init__(self, frames: Frames, order: dict[str, Any]) -> None:
        self.frames = frames
        self.worktree = order["worktree"]
        self.branch = order["branch"]
        self.base = order["base"]
        self.identity = order.get("identity") or {}
        self.task_id = order["task_id"]
        self.host = order.get("host") or "ray"
        self.sent: str | None = None
        self.lock = threading.Lock()

    def tip(self) -> str | None:
        done = subprocess.run(["git", "-C", self.worktree, "rev-parse", "--verify", "-q",
                               f"refs/heads/{self.branch}"], capture_output=True, text=True,
                              check=False)
        return done.stdout.strip() or None if done.returncode == 0 else None

    def commit_work(self) -> None:
        name, email = self.identity.get("name"), self.identity.get("email")
        if not name or not email:
            return
        try:
            _quiet(worktrees.cmd_commit_work, self.worktree,
                   f"The worker's uncommitted work (task {self.task_id}, on host "
                   f"{self.host})", name, email)
        except (RuntimeError, OSError) as exc:
            _log(f"could not commit the worker's work: {exc}")

    def send(self) -> None:
        with self.lock:
            tip = self.tip()
            if tip is None or tip == self.sent:
                return
            body = b""
            if tip != self.base:
                with tempfile.TemporaryDirectory(prefix="fleet-bundle-") as tmp:
                    path = Path(tmp) / "branch.bundle"
                    done = subprocess.run(
                        ["git", "-C", self.worktree, "-c", "pack.threads=1", "bundle",
                         "create", "-q", str(path), f"refs/heads/{self.branch}",
                         f"^{self.base}"], capture_output=True, check=False)
                    if done.returncode != 0:
                        _log("git bundle failed: "
                             + done.stderr.decode("utf-8", "replace").strip()[-300:])
                        return
                    body = path.read_bytes()
            self.frames.send_file({"bundle": tip}, body)
            self.sent = tip


class Mailbox:
    """The attempt's mailbox at the controller's gateway (`/fleet/mailbox`, with the
    attempt's token): each message fetched (a long poll) is handed to the runner's own
    input channel here, under the id it has there, and its verdict said back (queued,
    taken once the runner took it, or closed with the runner's reason)."""

    def __init__(self, folder: AttemptLog, url: str, token: str) -> None:
        self.folder = folder
        self.url = url
        self.token = token
        self.seen: set[str] = set()
        self.queued: list[str] = []
        self.failures = 0

    @staticmethod
    def of(folder: AttemptLog, order: dict[str, Any]) -> Mailbox | None:
        """None: the worker goes to its endpoint without this machine's gateway."""
        base = ((order.get("spec") or {}).get("settings") or {}).get("base_url")
        token = next((str(v) for v in (order.get("keys") or {}).values()
                      if str(v).startswith(GATEWAY_TOKEN_PREFIX)), None)
        if not isinstance(base, str) or token is None:
            return None
        parts = urllib.parse.urlsplit(base)
        url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, MAILBOX_PATH, "", ""))
        return Mailbox(folder, url, token)

    def _call(self, method: str, query: str = "", body: dict[str, Any] | None = None,
              timeout: float = 10.0) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + query, data=data, method=method,
                                         headers={"x-api-key": self.token,
                                                  "content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            answer = json.loads(resp.read() or b"{}")
        return answer if isinstance(answer, dict) else {}

    def _say(self, message_id: str, status: str, reason: str = "") -> None:
        self._call("POST", body={"id": message_id, "status": status, "reason": reason})

    def once(self, wait: float) -> None:
        """Verdicts of the messages queued before, then one fetch."""
        for mid in list(self.queued):
            if not self.folder.input_waiting(mid):
                self._say(mid, "taken")
                self.queued.remove(mid)
        answer = self._call("GET", f"?wait={wait:g}", timeout=wait + 15)
        for item in answer.get("messages") or []:
            mid, text = str(item.get("id")), item.get("text")
            if mid in self.seen or not isinstance(text, str):
                continue
            self.seen.add(mid)
            try:
                self.folder.send_input(text, by=str(item.get("by") or ""), message_id=mid)
            except InputClosed as exc:
                self._say(mid, "closed", str(exc))
                continue
            except ValueError as exc:
                self._say(mid, "closed", f"not taken: {exc}")
                continue
            self._say(mid, "queued")
            self.queued.append(mid)

    def serve(self, done: threading.Event) -> None:
        while not done.is_set():
            try:
                self.once(MAILBOX_WAIT if not self.queued else MAILBOX_TAKEN_POLL)
                self.failures = 0
            except (OSError, ValueError) as exc:  # the gateway away: again, a little later
                self.failures += 1
                if self.failures in (1, 10, 100):
                    _log(f"the mailbox at the controller's gateway: {type(exc).__name__}")
                done.wait(min(5.0, 0.5 * self.failures))


def run(order: dict[str, Any], here: Path) -> int:
    frames = Frames(sys.stdout)
    prepare_repo(order, here, frames)
    folder = stage(order, here)
    proc = start_runner(folder, order)
    branch = Branch(frames, order)
    stopping = threading.Event()
    parent = os.getppid()
    swept = [0]

    def on_term(_sig: int, _frame: Any) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGHUP, on_term)

    def watch() -> None:
        """Stopped by Ray, or orphaned (the supervisor died with its raylet): end the
        attempt's tree; else the branch each time it moves."""
        last_branch = 0.0
        while proc.poll() is None:
            if stopping.wait(PARENT_POLL) or os.getppid() != parent:
                why = "stopped" if stopping.is_set() else "orphaned (the node's raylet died)"
                _log(f"{why}: ending the attempt's processes")
                swept[0] += end_tree(folder, proc, STOP_GRACE)
                return
            if time.monotonic() - last_branch >= BRANCH_POLL:
                last_branch = time.monotonic()
                try:
                    branch.send()
                except Exception as exc:
                    _log(f"could not send the branch: {exc}")

    watcher = threading.Thread(target=watch, name="fleet-ray-watch", daemon=True)
    watcher.start()
    box = Mailbox.of(folder, order)
    runner_done = threading.Event()
    if box is not None:
        threading.Thread(target=box.serve, args=(runner_done,), name="fleet-ray-mailbox",
                         daemon=True).start()
    real_stdout = sys.stdout
    # the SSH agent's follower writes its frames to sys.stdout.buffer, one write a frame:
    # they go through `frames`
    sys.stdout = _Out(frames)  # type: ignore[assignment]
    try:
        follow_frames.cmd_follow(folder, json.dumps({}))
    finally:
        sys.stdout = real_stdout
    proc.wait()
    runner_done.set()
    watcher.join(timeout=5)
    swept[0] += sweep(folder)
    branch.commit_work()
    try:
        branch.send()
    except Exception as exc:
        _log(f"could not send the branch: {exc}")
    try:
        send_session(frames, str(order["config_dir"]))
    except (OSError, tarfile.TarError) as exc:
        _log(f"could not send claude's session: {exc}")
    frames.out = real_stdout
    with contextlib.suppress(OSError):
        mirror_tips(frames, str(order["mirror"]))  # the branch's commits are there now
    frames.finish(swept=swept[0])
    return 0


def run_update(order: dict[str, Any], here: Path) -> int:
    """A short job on the node that holds a finished task's worktree: its base brought up
    to date (the SSH agent's `update`: merge or rebase, the worker's uncommitted work
    committed first, left mid-merge on conflicts), the answer as a frame, then the branch
    as bundle frames. With `abort` in the order: the update that stopped on conflicts
    undone there instead (the SSH agent's `abort-update`)."""
    frames = Frames(sys.stdout)
    mirror = str(order["mirror"])
    if not order.get("abort"):
        fetch_base(order, here, str(order["ref"]), str(order["update_base"]))
    release(frames, order)
    worktree, branch = order["worktree"], order["branch"]
    if not Path(worktree).is_dir():
        _quiet(worktrees.cmd_worktree, mirror, worktree, branch, order["base"], "reattach")
    if order.get("abort"):
        frames.send({"update": update.abort_update(worktree,
                                                  order.get("conflicted") or [])})
        return 0
    ident = order.get("identity") or {}
    worktrees.ident(str(ident.get("name") or ""), str(ident.get("email") or ""))
    try:
        answer = update.update(worktree, order["update_base"], order["strategy"],
                               order["message"], order.get("conflicted"))
    except RuntimeError as exc:
        answer = {"error": str(exc)}
    frames.send({"update": answer})
    if answer.get("status") != "conflicts":
        Branch(frames, order).send()
        mirror_tips(frames, mirror)
    return 0


def main(argv: list[str] | None = None) -> int:
    here = Path(argv[0] if argv else ".").resolve()
    os.umask(0o077)
    try:
        order = json.loads((here / ORDER_FILE).read_text())
    except (OSError, ValueError) as exc:
        _log(f"no order in {here}: {exc}")
        return 2
    # the order holds the attempt's gateway token: read once, gone from the node's disk
    with contextlib.suppress(OSError):
        (here / ORDER_FILE).unlink()
    try:
        if order.get("update"):
            return run_update(order, here)
        return run(order, here)
    except Exception as exc:  # said in a frame: the controller records why
        _log(repr(exc))
        head: dict[str, Any] = {"error": str(exc)}
        if isinstance(exc, Lacks):
            head["lacks"] = True
        sys.stdout.write(encode_frame(head) + "\n")
        sys.stdout.flush()
        return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
