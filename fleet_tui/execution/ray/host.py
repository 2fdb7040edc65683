"""The Ray host: each attempt one Ray job on a team's cluster, through the Jobs API.

A second remote implementation of the host seam beside the SSH host, reached only by the
cluster's Jobs address (`http://head:8265`, the dashboard's): this machine needs the
`ray[default]` client (`pip install 'fleet-tui[ray]'`), a node needs git, python 3.11 and
the pinned claude, and nothing of fleet-tui (its package goes with each job).

What goes where:
- The job (one per attempt, `submission_id` = `fleet-ID-N-<digest of the attempt's
  token>`, written to `ray.json` in the attempt folder here before it is submitted: a
  restarted controller finds the job by it, and Ray refuses a second job of the same id,
  so an attempt never runs twice; the submitter holds the folder's submit lock until the
  job is taken, so no follower takes a job still being uploaded for one never
  submitted): its entrypoint is `execution/worker/job.py`; fleet-tui's
  package goes as its runtime_env's `py_modules` (content-addressed by Ray: uploaded once
  per version), its `working_dir` holds the order (the spec as the node runs it; the
  attempt's gateway token), the repository as a git bundle of what the node lacks of the
  base commit (cut against the tips the node's mirror reported at its last job, kept in
  `HOME/ray/<host>.json`, the NodeBook; none when it holds the commit; whole when nothing
  is known; a node that lacks a prerequisite gets the job again whole under
  `<id>-whole`) and the included files. Placed by `entrypoint_resources` (the host's
  `resources`).
- On the node, under the host's `data_dir`: `repos/<name>-<hash>.git` (a bare mirror the
  bundle is fetched into), `work/ID` the worktree, `config/ID`, `attempts/ID/N`.
- Here: the attempt folder (`Placement.attempt_dir`), rebuilt byte for byte from the job's
  logs (framed lines, `job.encode_frame`), followed by one thread per run through
  `tail_job_logs` (replayed from byte 0 after a restart: every write is by offset, so a
  replay changes nothing); `branch.bundle` and `branch.json` there hold the task's commits
  as the node last sent them (`collect` fetches them as `fleet/ID`), `session.tar`
  claude's transcripts as the attempt's end sent them.

Stop and kill: the local stop request is written first (the engine's verdict reads it),
then `stop_job`; the entrypoint ends the runner's tree and sweeps the attempt's token on
the node before the folder's last bytes go out. A job that ends (FAILED: its node lost,
its raylet dead) without the end of its folder coming back is lost: the reason goes into
the local stop request, and the entrypoint, orphaned on its node, ends what it started.

Steering: `say` leaves the message in the attempt's mailbox here (execution/mailbox.py);
the job's entrypoint fetches it from this machine's gateway with the attempt's token and
hands it to its runner's own input channel. A resume or a follow-up is pinned to the node
its task's last job ran on (`ray.io/node-id`, recorded in ray.json by the follower): the
worktree and claude's session are there. That node gone, it runs where the cluster puts
it, restored: the worktree from the collected branch, the transcripts into its config
dir (refused at the start when none came back). The merge queue's update of a task whose
base moved is a short job pinned to that node (job.py `run_update`: the SSH agent's
`update`), its answer and the branch back in its log; so is `abort_update`. `release`
notes the task; the next job on its node removes its worktree and config dir there.

The key: never in the job (entrypoint, runtime_env, metadata, logs). With the gateway on,
a worker reaches this machine's gateway with its attempt's token (`reaches_gateway`; the
base URL's host rewritten to `gateway_host` when the cluster reaches this machine by
another name); or, with `key_env`, it takes the key from that variable of its node's
environment (a secret the cluster's admin provisioned), which fleet-tui never sends. A
start that would send the key is refused.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import fleet_tui
from fleet_tui.core.errors import FleetError
from fleet_tui.core.states import StopReason
from fleet_tui.execution import mailbox
from fleet_tui.execution.host import Host, LostLedger, Placement, RunnerState
from fleet_tui.execution.ray import config as kind_config
from fleet_tui.execution.ray.shortjob import ShortJobs
from fleet_tui.execution.remote.base import LOOPBACK, RemoteHost, RemoteRun, update_result, write_at
from fleet_tui.execution.remote.forwarding import forwarded, host_settings
from fleet_tui.execution.worker import job
from fleet_tui.execution.worker.attemptlog import AttemptLog, InputClosed
from fleet_tui.execution.worker.spec import RunSpec
from fleet_tui.settings.endpoints import HANDED_KEY
from fleet_tui.store.meter import TOKEN_PREFIX
from fleet_tui.system import paths
from fleet_tui.system.files import write_json_atomic
from fleet_tui.vcs import git

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    from fleet_tui.core.model import Attempt, Task
    from fleet_tui.settings.config import Settings
    from fleet_tui.settings.hosts import HostConfig

log = logging.getLogger("fleet_tui.engine.fleet")

DEFAULT_DATA_DIR = "/var/tmp/fleet-tui-ray"
RAY_FILE = "ray.json"  # the job's submission id, written before it is submitted
SUBMIT_LOCK = ".submit.lock"  # flock'ed by the process submitting the attempt's job
RECORD_LOCK = ".ray.lock"  # flock'ed by whoever edits ray.json
SUBMIT_SETTLE = 3.0  # seconds a job Ray does not know must stay unknown, its submitter gone
BRANCH_BUNDLE = "branch.bundle"  # the task's commits past its base, as the node sent them
BRANCH_FILE = "branch.json"  # their tip (the base itself: no commits)
SESSION_FILE = "session.tar"  # claude's transcripts of the task, as the node sent them last
ENTRYPOINT_MODULE = "fleet_tui.execution.worker.job"
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
STATUS_EVERY = 5.0  # seconds between two looks at a followed job's status
WHOLE_LOG_WAIT = 10.0  # seconds for an ended job's whole log (its node may be gone)
TAIL_DRAIN = 3.0  # seconds the tail gets to bring the rest of an ended job's log
POLL = 1.0  # seconds between two looks at a job that waits for its node (or a broken tail)
LEASE = 60.0  # seconds without an answer of the cluster before its runs are lost
FIRST_STATE_WAIT = 0.25  # how long state() waits for a new follower's first answer
MAILBOX_ANSWER = 20.0  # seconds for the job to fetch a message and say what became of it
EXCLUDES = ["__pycache__", "*.pyc", ".mypy_cache"]
RELEASED_PER_JOB = 50  # released tasks a job removes from its node before its own work


NODE_LABEL = "ray.io/node-id"  # every Ray node's own label: a job pinned to one node


def ray_nodes(address: str, *, timeout: float = 15.0) -> list[dict[str, Any]]:
    """The cluster's alive nodes (the state API), each with its id and resources."""
    import urllib.request

    with urllib.request.urlopen(f"{address}/api/v0/nodes?detail=1&limit=1000",
                                timeout=timeout) as resp:
        data: Any = json.load(resp)
    for key in ("data", "result", "result"):
        data = data.get(key, {}) if isinstance(data, dict) else {}
    nodes = data if isinstance(data, list) else []
    return [n for n in nodes if isinstance(n, dict) and n.get("state") == "ALIVE"]


PROBE_TIMEOUT = 180.0  # seconds a probe job may take (placed, run, its log read)
# Seconds for the cluster's dashboard to accept a connection, then to answer: a look (GET)
# and a submit or an upload (which it stores before it answers). Ray's Jobs client sets
# none, so a dashboard that accepts and never answers (hung, or another service on that
# port) held `fleet-tui run` and the engine's pass for ever, the task left running.
ANSWER_WAIT = (10.0, 30.0)
STORE_WAIT = (10.0, 300.0)


def jobs_client(address: str) -> Any:
    """Ray's Jobs client of the cluster at `address`, each of its requests given a time to
    answer (ANSWER_WAIT, STORE_WAIT). Making it asks the cluster's version: OSError (what
    the requests library raises, its timeouts included) or RuntimeError when it does not
    answer; ImportError without ray."""
    from ray.job_submission import JobSubmissionClient

    class _Client(JobSubmissionClient):  # type: ignore[misc]
        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", ANSWER_WAIT if method == "GET" else STORE_WAIT)
            return super()._do_request(method, endpoint, **kwargs)

    return _Client(address)


# Ray's head hands each submitted job to a job agent; one not registered yet (a cluster just
# started, or a loaded machine's) is waited for 10 s, then the submit is answered 500 "No
# available agent to submit job, please try again later." That answer is asked again, every
# AGENT_RETRY seconds for AGENT_WAIT at most (Ray's 10 s each included); any other at once.
NO_AGENT = "No available agent to submit job"
AGENT_WAIT = 60.0
AGENT_RETRY = 2.0


def submit_job(client: Any, *, give_up: Callable[[], bool] | None = None,
               **job_args: Any) -> None:
    """`client.submit_job(**job_args)`, asked again while Ray's head has no job agent to
    hand it to (NO_AGENT), until AGENT_WAIT has passed (its refusal then says how long it
    was asked) or `give_up()` says so (the attempt stopped meanwhile); on any other refusal
    at once, the exception as raised."""
    deadline = time.monotonic() + AGENT_WAIT
    while True:
        try:
            client.submit_job(**job_args)
            return
        except RuntimeError as exc:
            if NO_AGENT not in str(exc) or (give_up is not None and give_up()):
                raise
            if time.monotonic() + AGENT_RETRY > deadline:
                raise RuntimeError(f"{exc} (asked for {AGENT_WAIT:g} s)") from exc
            log.info("the Ray cluster has no job agent for %s yet; asked again in %g s",
                     job_args.get("submission_id"), AGENT_RETRY)
        time.sleep(AGENT_RETRY)


def no_answer(exc: BaseException, waited: tuple[float, float] = ANSWER_WAIT) -> str:
    """What a failed request to the cluster says: the time it was given when it timed out
    (the requests library's own text names its connection pool), else the error's text."""
    import requests

    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return f"no connection within {waited[0]:g} s"
    if isinstance(exc, requests.exceptions.Timeout):
        return f"connected, and no answer within {waited[1]:g} s"
    return str(exc)


def probe_job(address: str, script: str, *, resources: Mapping[str, float] | None,
              env: Mapping[str, str], timeout: float = PROBE_TIMEOUT
              ) -> tuple[str, str, str | None]:
    """One short job (`sh -c script`) on a node with `resources`, as an attempt's job
    would be placed: (its end status, its log, its node's id). RayError when the cluster
    does not take it; a job not ended within `timeout` is stopped ("TIMEOUT")."""
    import secrets

    try:
        import ray.job_submission  # noqa: F401 (the client jobs_client makes)
    except ImportError:
        raise RayError("this machine has no ray: pip install 'fleet-tui[ray]'") from None
    ray_logs_to_file(env)
    try:
        client = jobs_client(address)
        sid = f"fleet-probe-{secrets.token_hex(6)}"
        submit_job(client, entrypoint=f"sh -c {shlex.quote(script)}", submission_id=sid,
                   entrypoint_resources=dict(resources) if resources else None,
                   metadata={"fleet-tui-probe": "1"})
    except Exception as exc:
        raise RayError(f"the Ray cluster at {address} did not take the probe job: "
                       f"{no_answer(exc, STORE_WAIT)[-300:]}") from None
    deadline = time.monotonic() + timeout
    status = "PENDING"
    while time.monotonic() < deadline:
        try:
            info = client.get_job_info(sid)
        except (OSError, RuntimeError) as exc:
            raise RayError(f"the Ray cluster at {address} stopped answering about the probe "
                           f"job {sid}: {no_answer(exc)[-300:]}") from None
        status = str(getattr(info.status, "value", info.status))
        if status in TERMINAL:
            break
        time.sleep(0.5)
    else:
        with contextlib.suppress(Exception):
            client.stop_job(sid)
        status = "TIMEOUT"
    try:
        text = client.get_job_logs(sid)
        node = getattr(client.get_job_info(sid), "driver_node_id", None)
    except Exception:
        text, node = "", None
    return status, text, str(node) if node else None


_RAY_LOGS = threading.Lock()


def ray_logs_to_file(env: Mapping[str, str]) -> None:
    """Ray's own log lines (its client's "Uploading package ...", "Creating a file
    package ...") into fleet-tui's log file: the `ray` logger writes to stderr, the
    user's terminal, from its import on."""
    logger = logging.getLogger("ray")
    with _RAY_LOGS:
        if any(getattr(h, "fleet_tui", False) for h in logger.handlers):
            return
        path = paths.log_file(env)
        try:
            paths.private_file(paths.private_dir(path.parent) / path.name)
            handler: logging.Handler = logging.FileHandler(path, encoding="utf-8")
        except OSError:
            handler = logging.NullHandler()  # never the terminal
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: "
                                               "%(message)s"))
        handler.fleet_tui = True  # type: ignore[attr-defined]
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.propagate = False


class NodeBook:
    """What the controller knows of the nodes, in a small JSON of this machine's
    (`HOME/ray/<host>.json`, shared by the engine and the merge queue's process, edited
    under a lock): per node, the tips each repository's mirror there held at its last
    job (the next job's bundle is cut against them); the node each task's last job ran
    on; the tasks released (merged, discarded) whose worktree and config dir a job on
    their node has not removed yet."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    @contextlib.contextmanager
    def edit(self) -> Iterator[dict[str, Any]]:
        paths.private_dir(self.path.parent)
        fd = os.open(self.path.with_name(self.path.name + ".lock"),
                     os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            data = self.read()
            yield data
            write_json_atomic(self.path, data, sync=False)
        finally:
            os.close(fd)

    def tips(self, node: str, mirror: str) -> list[str]:
        found = ((self.read().get("mirrors") or {}).get(node) or {}).get(mirror) or {}
        tips = found.get("tips") if isinstance(found, dict) else None
        return [str(t) for t in tips] if isinstance(tips, list) else []

    def set_tips(self, node: str, mirror: str, tips: list[str]) -> None:
        with self.edit() as data:
            mirrors = data.setdefault("mirrors", {}).setdefault(node, {})
            mirrors[mirror] = {"tips": [str(t) for t in tips][:job.MIRROR_TIPS],
                               "at": time.time()}

    def set_node(self, task_id: str, node: str) -> None:
        with self.edit() as data:
            data.setdefault("tasks", {})[task_id] = node

    def release(self, task_id: str) -> None:
        with self.edit() as data:
            node = (data.get("tasks") or {}).pop(task_id, None)
            data.setdefault("released", {})[task_id] = {"node": node, "at": time.time()}

    def released(self) -> list[str]:
        return sorted(self.read().get("released") or {})[:RELEASED_PER_JOB]

    def cleaned(self, node: str | None, removed: list[str], absent: list[str]) -> None:
        """A job's report: the ones it removed are done; the ones absent on the node that
        held them (or on any node, for one whose node was never known) are too."""
        with self.edit() as data:
            released = data.setdefault("released", {})
            for task_id in removed:
                released.pop(task_id, None)
            for task_id in absent:
                rec = released.get(task_id) or {}
                if rec.get("node") in (None, node):
                    released.pop(task_id, None)


@contextlib.contextmanager
def submit_lock(folder: AttemptLog) -> Iterator[None]:
    """Held while the attempt's job is submitted (ray.json written, the package and the
    working dir uploaded, the job taken or refused): a follower that finds the job unknown
    meanwhile waits for the submit to settle instead of judging it never submitted."""
    fd = os.open(folder.dir / SUBMIT_LOCK, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def edit_record(folder: AttemptLog, **changes: Any) -> None:
    """ray.json changed by these fields, its others as they are (the engines, the merge
    queue and `run` processes record into it: one at a time)."""
    fd = os.open(folder.dir / RECORD_LOCK, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        rec = dict(folder.record(RAY_FILE) or {})
        rec.update(changes)
        folder.write_record(RAY_FILE, rec)
    finally:
        os.close(fd)


def submitting(folder: AttemptLog) -> bool:
    """A process (this one included) submits the attempt's job now."""
    try:
        fd = os.open(folder.dir / SUBMIT_LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class RayError(FleetError):
    """The cluster refused or did not answer (said with the host's name)."""


def submission_id(spec: RunSpec) -> str:
    """The attempt's job id: the same for the same attempt (a second submit is refused by
    Ray), never the token itself."""
    digest = hashlib.sha256(spec.token.encode()).hexdigest()[:10]
    return f"fleet-{spec.task_id}-{spec.attempt}-{digest}"


def _package_dir() -> str:
    return str(Path(fleet_tui.__file__).resolve().parent)


class RayStaged:
    """The order made (the job's working dir, here); nothing is submitted yet."""

    def __init__(self, host: RayHost, placement: Placement, spec: RunSpec, staging: Path,
                 order: dict[str, Any], restore: Path | None = None) -> None:
        self.host = host
        self.placement = placement
        self.spec = spec
        self.staging = staging
        self.order = order
        self.restore = restore  # the attempt folder here whose session the job restores
        self.done = False

    def spawn(self, env: dict[str, str]) -> int:
        assert not self.done, "spawned or abandoned already"
        self.done = True
        try:
            self.host.submit(self, env)
        finally:
            shutil.rmtree(self.staging, ignore_errors=True)
        return 0  # the runner's pid on its node comes back in runner.json

    def abandon(self) -> None:
        self.done = True
        shutil.rmtree(self.staging, ignore_errors=True)


class Follow:
    """One job followed into its local attempt folder until its end came back (or the job
    ended without it: lost)."""

    def __init__(self, host: RayHost, run: RayRun, sid: str) -> None:
        self.host = host
        self.run = run
        self.sid = sid
        self.folder = run.log.dir
        self.state: str | None = None  # alive | dead | never
        self.status: str | None = None  # the job's, as Ray last said
        self.ended = threading.Event()
        self.first = threading.Event()
        self.stopping = threading.Event()
        self.started_at = time.monotonic()
        self.reached_at = 0.0  # the cluster's last answer (monotonic)
        self.swept = 0
        self.error: str | None = None
        self.first_frame_at: float | None = None
        self.node_id: str | None = (run.log.record(RAY_FILE) or {}).get("node_id")
        self.tails = 0
        self.other: collections.deque[str] = collections.deque(maxlen=20)
        self._task: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._bundle_seq = -1
        self.lacks = False  # the job said its node's mirror lacks what its bundle needs
        self.sids = {sid}  # this one and, when it was sent again whole, the first
        self.unknown_since: float | None = None  # Ray said it does not know the job
        self.thread = threading.Thread(target=self._main, name=f"ray-follow {sid}",
                                       daemon=True)

    def start(self) -> Follow:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)

    def wait_first(self, timeout: float = FIRST_STATE_WAIT) -> bool:
        return self.first.wait(timeout) or self.ended.is_set()

    def _main(self) -> None:
        try:
            while not self.stopping.is_set() and not self.ended.is_set():
                try:
                    self._once()
                except Exception as exc:  # the cluster away, the tail broken: again
                    log.info("following the Ray job %s: %s; again", self.sid, exc)
                if not self.ended.is_set():
                    self.stopping.wait(POLL)
        finally:
            self.host._ended.set()

    def _info(self) -> Any | None:
        """The job's details (None: Ray does not know the job)."""
        try:
            info = self.host.client().get_job_info(self.sid)
        except RuntimeError as exc:
            if "404" in str(exc) or "does not exist" in str(exc):
                self.reached_at = time.monotonic()
                return None
            raise
        self.reached_at = time.monotonic()
        self.status = str(getattr(info.status, "value", info.status))
        node = getattr(info, "driver_node_id", None)
        if node and node != self.node_id:
            self.node_id = str(node)
            self.host.record_node(self.run.log, self.node_id)
        return info

    def _once(self) -> None:
        info = self._info()
        if info is None:
            self._unknown()
            return
        self.unknown_since = None
        if self.status == "PENDING":  # waiting for its node's resources
            self.state = "alive"
            self.first.set()
            return
        if self.status not in TERMINAL:
            self.state = self.state or "alive"
            self.first.set()
            self.tails += 1
            asyncio.run(self._tail())
            if self.ended.is_set():
                return
            info = self._info()
        if self.status in TERMINAL and not self.ended.is_set():
            # all of it once more (the tail may have missed the end): every write is by
            # offset; not waited for past WHOLE_LOG_WAIT (a lost node's logs never come)
            text = self._whole_log()
            if text is not None:
                self._take_text(text)
            if not self.ended.is_set():
                if self.lacks and self.host.resubmit_whole(self):
                    return  # followed on as the job sent again with the whole bundle
                self._lose(info)

    def _unknown(self) -> None:
        """Ray does not know the job. While a process submits it (the submit lock held:
        the upload comes first) or the submit just ended, it is on its way: alive, asked
        again. Settled only once the job stayed unknown SUBMIT_SETTLE seconds with nobody
        submitting it: recorded as taken (ray.json's `submitted`), the cluster lost it;
        else it never got there (the submit failed, or its process died before Ray had
        it). Never "never" from one look: a requeue on that word ran an attempt twice."""
        record = self.run.log.record(RAY_FILE) or {}
        if submitting(self.run.log):
            self.unknown_since = None
            self.state = self.state or "alive"
            self.first.set()
            return
        now = time.monotonic()
        if self.unknown_since is None:
            self.unknown_since = now
        if now - self.unknown_since < SUBMIT_SETTLE:
            self.state = self.state or "alive"
            self.first.set()
            return
        if record.get("submitted"):
            reason = (f"lost: the Ray job {self.sid} on host {self.host.name} was taken by "
                      "the cluster, which does not know it any more (the cluster restarted "
                      "without its jobs?)")
            self.run.log.request_stop(StopReason.ERROR, reason, at=time.time(),
                                      by=f"host {self.host.name}")
            log.warning("task %s attempt %d: %s", self.run.attempt.task_id,
                        self.run.attempt.n, reason)
            self.state = "dead"
        else:
            self.state = "never"  # recorded, never submitted
        self.first.set()
        self.ended.set()

    def _whole_log(self) -> str | None:
        got: list[str] = []

        def read() -> None:
            with contextlib.suppress(Exception):
                got.append(self.host.client().get_job_logs(self.sid))

        reader = threading.Thread(target=read, name=f"ray-logs {self.sid}", daemon=True)
        reader.start()
        reader.join(WHOLE_LOG_WAIT)
        return got[0] if got else None

    async def _tail(self) -> None:
        """The job's log followed until it ends; the job's status asked every
        STATUS_EVERY meanwhile (a tail whose node is gone may neither send nor close)."""
        self._loop = asyncio.get_running_loop()
        if self.stopping.is_set():
            return
        consumer = asyncio.ensure_future(self._consume())
        self._task = consumer
        while not consumer.done():
            finished, _ = await asyncio.wait({consumer}, timeout=STATUS_EVERY)
            if finished:
                break
            try:
                await asyncio.to_thread(self._info)
            except Exception as exc:  # the cluster away: the lease counts
                log.info("the Ray job %s: %s", self.sid, exc)
                continue
            if self.status in TERMINAL:  # what is left of the log, then the end
                await asyncio.wait({consumer}, timeout=TAIL_DRAIN)
                consumer.cancel()
                break
        with contextlib.suppress(asyncio.CancelledError):
            await consumer

    async def _consume(self) -> None:
        pending = ""
        async for chunk in self.host.client().tail_job_logs(self.sid):
            self.reached_at = time.monotonic()
            pending += chunk
            lines = pending.split("\n")
            pending = lines.pop()
            for line in lines:
                self._take(line)
            if self.ended.is_set() or self.stopping.is_set():
                return
        if pending:
            self._take(pending)

    def _take_text(self, text: str) -> None:
        for line in text.split("\n"):
            if self.ended.is_set():
                return
            self._take(line)

    def _take(self, line: str) -> None:
        frame = job.decode_frame(line)
        if frame is None:
            if line.strip():
                self.other.append(line.strip()[-500:])
            return
        head, body = frame
        if self.first_frame_at is None:
            self.first_frame_at = time.monotonic()
        if "f" in head:
            self._write(str(head["f"]), head, body)
        elif "bundle" in head:
            self._bundle(head, body)
        elif "session" in head:
            self._session(head, body)
        elif "mirror" in head:
            if self.node_id:
                self.host.book.set_tips(self.node_id, str(head["mirror"]),
                                        list(head.get("tips") or []))
        elif "released" in head:
            said = head["released"] if isinstance(head["released"], dict) else {}
            self.host.book.cleaned(self.node_id, list(said.get("removed") or []),
                                   list(said.get("absent") or []))
        elif "error" in head:
            self.error = str(head["error"])
            self.lacks = bool(head.get("lacks"))
        if "state" in head:
            self.state = str(head["state"])
            self.first.set()
            if head.get("end"):
                self.swept = int(head.get("swept") or 0)
                self.ended.set()

    def _write(self, name: str, head: dict[str, Any], body: bytes) -> None:
        if "/" in name or name.startswith("."):
            raise ValueError(f"the job named a file outside the attempt folder: {name!r}")
        path = self.folder / name
        if head.get("whole"):
            try:
                data = json.loads(body)
            except ValueError:
                return  # a record caught mid-write on the node: a later frame has it
            if isinstance(data, dict):  # the node's very bytes, replaced atomically
                tmp = path.with_name(f".{name}.{os.getpid()}.{threading.get_ident()}")
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(body)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, path)
            return
        write_at(path, int(head["o"]), body, sender="the job")

    def _bundle(self, head: dict[str, Any], body: bytes) -> None:
        """A piece of the branch's bundle; the whole one (its digest checked) replaces the
        last, and branch.json names its tip."""
        seq = int(head.get("seq") or 0)
        if seq < self._bundle_seq:
            return  # a replay of an older one
        part = self._piece(BRANCH_BUNDLE, head, body)
        if part is None:
            return
        size = int(head["size"])
        if size:
            os.replace(part, self.folder / BRANCH_BUNDLE)
        else:
            part.unlink(missing_ok=True)
        self._bundle_seq = seq
        write_json_atomic(self.folder / BRANCH_FILE, {"tip": head["bundle"], "seq": seq,
                                                      "bundle": bool(size)})

    def _session(self, head: dict[str, Any], body: bytes) -> None:
        """A piece of claude's transcripts (a tar); the whole one, its digest checked,
        replaces the last."""
        part = self._piece(SESSION_FILE, head, body)
        if part is not None:
            os.replace(part, self.folder / SESSION_FILE)

    def _piece(self, name: str, head: dict[str, Any], body: bytes) -> Path | None:
        """A piece of a file the job sends in frames, written at its offset into
        `name.part` (a piece at 0 starts it anew); the part once it is whole and its
        digest matches, else None."""
        part = self.folder / (name + ".part")
        at, size = int(head["o"]), int(head["size"])
        if at == 0:
            part.unlink(missing_ok=True)
        fd = os.open(part, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, body, at)
        finally:
            os.close(fd)
        if at + len(body) < size \
                or hashlib.sha256(part.read_bytes()).hexdigest() != head.get("sha256"):
            return None
        return part

    def _node_gone(self) -> bool:
        """Whether the job's node is no longer alive in the cluster (False: unknown)."""
        if not self.node_id:
            return False
        try:
            alive = ray_nodes(self.host.address, timeout=10.0)
        except (OSError, ValueError):
            return False
        return all(n.get("node_id") != self.node_id for n in alive)

    def _lose(self, info: Any) -> None:
        """The job ended and its folder's end never came: lost (or failed before its runner
        started), the reason in the local stop request."""
        message = getattr(info, "message", None) or "no reason given"
        if self.error:
            reason = (f"the Ray job {self.sid} on host {self.host.name} failed before its "
                      f"runner started: {self.error}")
        elif self.status == "STOPPED":
            reason = (f"the Ray job {self.sid} on host {self.host.name} was stopped before "
                      "its runner's end came back")
        else:
            tail = f"; its last words: {self.other[-1]}" if self.other else ""
            # Ray's own word on such a job can be SUCCEEDED (its driver's exit as seen
            # from a node that is gone): said as what happened, the status only quoted
            what = (f"its node {(self.node_id or '')[:12]} is gone" if self._node_gone()
                    else "it ended")
            reason = (f"lost: the Ray job {self.sid} on host {self.host.name}: {what} "
                      f"before its runner's end came back (Ray reports the job "
                      f"{self.status}: {message}); the attempt's processes there end with "
                      f"its entrypoint{tail}")
        self.run.log.request_stop(StopReason.ERROR, reason[:2000], at=time.time(),
                                  by=f"host {self.host.name}")
        log.warning("task %s attempt %d: %s", self.run.attempt.task_id, self.run.attempt.n,
                    reason)
        self.state = "dead"
        self.first.set()
        self.ended.set()


class RayRun(RemoteRun):
    """One attempt's job, followed through its Follow."""

    def __init__(self, host: RayHost, attempt: Attempt) -> None:
        super().__init__(attempt)
        self.host = host

    def submission_id(self) -> str | None:
        rec = self._log.record(RAY_FILE)
        sid = rec.get("submission_id") if rec else None
        return sid if isinstance(sid, str) and sid else None

    runner_first = True

    def state(self) -> RunnerState:
        """The follower's last word, within FIRST_STATE_WAIT (never a round trip of the
        engine's pass); "dead" once the job's end came back, or it ended without it."""
        if self._log.exited:  # written last by the follower: the folder is whole
            return "dead"
        sid = self.submission_id()
        if sid is None:
            return "never"
        follow = self.host.follow(self, sid)
        if not follow.ended.is_set():
            follow.wait_first()
        if follow.state in ("dead", "never"):
            return follow.state  # type: ignore[return-value]
        if follow.ended.is_set():
            return "dead"
        if self.host.lose_if_silent(self, follow):
            return "dead"
        return "alive"

    def _stop_job(self) -> None:
        sid = self.submission_id()
        if sid is None:
            return
        try:
            self.host.client().stop_job(sid)
        except RuntimeError as exc:
            if submitting(self._log):
                return  # its submitter stops it once Ray has it (the stop request read)
            raise RayError(f"host {self.host.name}: could not stop the Ray job {sid}: "
                           f"{exc}") from None

    def request_stop(self, reason: StopReason, message: str, *, at: float, by: str) -> None:
        self._log.request_stop(reason, message, at=at, by=by)
        self._stop_job()

    def kill(self) -> None:
        self._stop_job()  # the entrypoint kills the runner's tree and sweeps the token

    def sweep(self) -> int:
        """Done on the node by the job's entrypoint, after its runner is gone: how many
        processes it swept (as its end frame said)."""
        sid = self.submission_id()
        follow = self.host.followed(self.key) if sid else None
        return follow.swept if follow is not None else 0

    def send_input(self, text: str, *, by: str = "") -> str:
        """Left in the attempt's mailbox (execution/mailbox.py) for the job to fetch
        through the gateway and hand to its runner's own input channel; returned once the
        node said it is queued there (or taken), InputClosed with the runner's reason when
        it refused it, or when the job did not fetch it within MAILBOX_ANSWER."""
        if not self.host.reaches_gateway:
            raise InputClosed(f"its worker on the Ray host {self.host.name} reaches its "
                              "endpoint without this machine's gateway (key_env), and its "
                              "mailbox is served by the gateway")
        if self._log.exited or self.state() != "alive":
            raise InputClosed("its worker is not taking messages")
        if not (self._log.runner_record() or {}).get("claude_pid"):
            raise InputClosed("its worker is not taking messages")
        message_id = mailbox.post(self._log, text, by=by)
        deadline = time.monotonic() + MAILBOX_ANSWER
        while True:
            status, reason = mailbox.state(self._log, message_id)
            if status in ("queued", "taken"):
                return message_id
            if status == "closed":
                mailbox.drop(self._log, message_id)
                raise InputClosed(reason)
            if time.monotonic() >= deadline:
                if mailbox.withdraw(self._log, message_id):
                    raise InputClosed(
                        f"its worker on the Ray host {self.host.name} did not fetch the "
                        f"message within {MAILBOX_ANSWER:g} s (does its node reach this "
                        "machine's gateway?)")
                deadline = time.monotonic() + MAILBOX_ANSWER  # fetched: its verdict comes
            time.sleep(0.05)


class RayHost(RemoteHost):
    """A Ray cluster reached by its Jobs address; thread-safe for the engine's start threads."""

    def __init__(self, *, name: str, address: str, env: Mapping[str, str],
                 resources: Mapping[str, float] | None = None, python: str = "python3",
                 data_dir: str = DEFAULT_DATA_DIR, claude: str | None = None,
                 key_env: str | None = None, key_variable: str = HANDED_KEY,
                 gateway_host: str | None = None, num_cpus: float | None = None,
                 lease: float = LEASE, cage: str | None = None,
                 srt: str | None = None) -> None:
        self.name, self.address = name, address
        self.cage, self.srt = cage, srt  # "off": uncaged there; the nodes' srt (None: theirs)
        self.env = env
        self.resources = dict(resources or {})
        self.python = python  # the node's python (3.11 or newer)
        self.data_dir = data_dir.rstrip("/") or "/"
        # the node's claude (None: the node finds its own, execution/worker/hostclaude.py; this
        # machine's `claude` setting is never sent)
        self.claude = claude
        self.key_env = key_env
        self.key_variable = key_variable
        self.gateway_host = gateway_host
        self.num_cpus = num_cpus
        self.lease = lease
        # through this machine's gateway, with the attempt's token, unless the cluster
        # holds the key for its workers
        self.reaches_gateway = key_env is None
        self._client: Any = None
        self._lock = threading.Lock()
        self._follows: dict[tuple[str, int], Follow] = {}
        self._lost: dict[tuple[str, int], str] = {}
        self._modes: dict[str, str] = {}  # task -> how its job makes the worktree
        self._ended = threading.Event()
        self.submitted: list[str] = []  # the submission ids this object submitted
        self.short_jobs = ShortJobs(self)  # a task's update or abort on its node
        slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        self.book = NodeBook(paths.home(env) / "ray" / f"{slug}.json")
        # the orders of the jobs followed now (their keys too: in memory only), to send a
        # job again with a whole bundle when its node lacked what its bundle needed
        self._orders: dict[str, tuple[RayStaged, dict[str, Any]]] = {}

    # --- the cluster ---------------------------------------------------------------------

    def client(self) -> Any:
        """The Jobs client (made once; RayError when the cluster does not answer, or this
        build has no ray)."""
        with self._lock:
            if self._client is not None:
                return self._client
        try:
            import ray.job_submission  # noqa: F401 (the client jobs_client makes)
        except ImportError:
            raise RayError(f"host {self.name} is a Ray host and this machine has no ray: "
                           "pip install 'fleet-tui[ray]'") from None
        ray_logs_to_file(self.env)
        try:
            client = jobs_client(self.address)
        except (OSError, RuntimeError, ValueError) as exc:
            raise RayError(f"host {self.name}: the Ray cluster at {self.address} does not "
                           f"answer: {no_answer(exc)}") from None
        with self._lock:
            if self._client is None:
                self._client = client
            return self._client

    def submit(self, staged: RayStaged, env: Mapping[str, str]) -> str:
        """The attempt's job, its id recorded here first; a job of that id there already
        (a submit whose answer was lost) is the attempt's."""
        rest, keys = forwarded(env)
        if self.key_env is not None:
            keys = {}  # the node's own variable holds the key: nothing of it is sent
        else:
            plain = sorted(k for k, v in keys.items() if v and not v.startswith(TOKEN_PREFIX))
            if plain:
                raise self._sends_the_key(f"this start would send the key ({', '.join(plain)})")
        order = dict(staged.order, env=rest, keys=keys)
        sid = submission_id(staged.spec)
        folder = AttemptLog(staged.placement.attempt_dir)
        with submit_lock(folder):
            record = {"submission_id": sid, "address": self.address, "host": self.name,
                      "at": time.time(), "pinned": staged.order.get("pin"),
                      "bundle": staged.order.get("bundle_sent"),
                      "restored": staged.order.get("restore") or None, "submitted": False}
            folder.write_record(RAY_FILE, record)
            self._submit_job(staged, order, sid)
            self._mark_submitted(folder)
        if folder.stop_request():  # killed while it was being submitted: stopped now
            with contextlib.suppress(Exception):
                self.client().stop_job(sid)
        if staged.order.get("bundle") != "whole":
            with self._lock:
                self._orders[sid] = (staged, order)
        self.submitted.append(sid)
        return sid

    def _sends_the_key(self, what: str) -> RayError:
        return RayError(
            f"host {self.name} is a Ray host and {what} to the cluster: turn the gateway on "
            f"(gateway = true) so its workers get a token of their own, or set key_env in "
            f"[hosts.{self.name}] to the variable the cluster's nodes hold the key in")

    def check_setup(self, settings: Settings, env: Mapping[str, str], *,
                    args: Sequence[str] = (), permission_mode: str | None = None) -> None:
        """The remote refusals, and a start that would send the key (the gateway off and no
        key_env) refused before the task is made: `submit` would refuse each start."""
        super().check_setup(settings, env, args=args, permission_mode=permission_mode)
        if not settings.gateway and self.key_env is None:
            raise self._sends_the_key("with the gateway off (gateway = false) each start "
                                      "would send the key")

    def _submit_job(self, staged: RayStaged, order: dict[str, Any], sid: str) -> None:
        order_path = staged.staging / job.ORDER_FILE
        fd = os.open(order_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(order, fh)
        client = self.client()
        metadata = {"fleet-tui-task": staged.spec.task_id,
                    "fleet-tui-attempt": str(staged.spec.attempt), "fleet-tui-host": self.name}
        pin = staged.order.get("pin")
        folder = AttemptLog(staged.placement.attempt_dir)
        try:
            submit_job(
                client, give_up=lambda: bool(folder.stop_request()),
                entrypoint=f"{shlex.quote(self.python)} -m {ENTRYPOINT_MODULE}",
                submission_id=sid,
                runtime_env={"working_dir": str(staged.staging),
                             "py_modules": [_package_dir()], "excludes": EXCLUDES},
                metadata=metadata, entrypoint_resources=self.resources or None,
                entrypoint_num_cpus=self.num_cpus,
                entrypoint_label_selector={NODE_LABEL: pin} if pin else None)
        except Exception as exc:
            try:
                client.get_job_info(sid)
            except Exception:
                raise RayError(f"host {self.name}: the Ray cluster did not take the job: "
                               f"{no_answer(exc, STORE_WAIT)[-500:]}") from None
            log.info("host %s: the job %s was taken already", self.name, sid)

    def _mark_submitted(self, folder: AttemptLog) -> None:
        """The job is Ray's: ray.json says so (its other fields as they are now)."""
        edit_record(folder, submitted=True)

    def resubmit_whole(self, follow: Follow) -> bool:
        """The job whose node lacked the commits its bundle was cut against (it failed
        before anything of the attempt ran there) sent again under a new id, with the
        base's whole history; what this controller knew of that node's mirror forgotten.
        False: its order is not here (a controller restarted since): the attempt fails."""
        with self._lock:
            kept = self._orders.pop(follow.sid, None)
        if kept is None:
            return False
        staged, order = kept
        spec = staged.spec
        if follow.node_id:
            self.book.set_tips(follow.node_id, str(order["mirror"]), [])
        staging = Path(tempfile.mkdtemp(prefix="fleet-ray-job-"))
        try:
            sent = self._bundle(Path(spec.repo), str(order["base"]), spec.task_id,
                                staging / job.BUNDLE_FILE, [])
            included = self.included_tar(spec)
            if included:
                (staging / job.INCLUDED_FILE).write_bytes(included)
            if staged.restore is not None:
                self._stage_restore(Path(spec.repo), spec.task_id, staged.restore, staging)
            again = RayStaged(self, staged.placement, spec, staging,
                              dict(staged.order, bundle="whole", bundle_sent=sent),
                              staged.restore)
            sid = f"{follow.sid}-whole"
            with self._lock:
                follow.sids.add(sid)
                follow.sid = sid
                follow.lacks = False
                follow.error = None
            folder = AttemptLog(staged.placement.attempt_dir)
            rec = dict(folder.record(RAY_FILE) or {})
            rec.update(submission_id=sid, bundle=sent, lacked=sorted(follow.sids - {sid}),
                       submitted=False)
            rec.pop("node_id", None)
            log.info("host %s: the node of job %s lacked what its bundle needed; sent "
                     "again whole as %s", self.name, sorted(follow.sids - {sid}), sid)
            with submit_lock(folder):
                folder.write_record(RAY_FILE, rec)
                self._submit_job(again, dict(order, bundle="whole"), sid)
                self._mark_submitted(folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self.submitted.append(sid)
        return True

    def _job_exists(self, folder: AttemptLog) -> bool:
        sid = (folder.record(RAY_FILE) or {}).get("submission_id")
        try:
            self.client().get_job_info(str(sid))
        except RuntimeError as exc:
            if "404" in str(exc) or "does not exist" in str(exc):
                return False
            raise RayError(f"host {self.name}: {exc}") from None
        return True

    def follow(self, run: RayRun, sid: str) -> Follow:
        with self._lock:
            found = self._follows.get(run.key)
            if found is not None and sid in found.sids:
                return found
            follow = Follow(self, run, sid)
            self._follows[run.key] = follow
        return follow.start()

    def followed(self, key: tuple[str, int]) -> Follow | None:
        with self._lock:
            return self._follows.get(key)

    def lose_if_silent(self, run: RayRun, follow: Follow) -> bool:
        """The cluster silent past the lease (counted from the follower's start at the
        earliest): the run is lost, the reason in the local stop request."""
        silent = time.monotonic() - max(follow.reached_at, follow.started_at)
        if silent <= self.lease:
            return False
        reason = (f"lost: the Ray cluster of host {self.name} ({self.address}) unreachable "
                  f"for {silent:.0f} s, longer than its lease of {self.lease:g} s; the "
                  "job's entrypoint ends what the attempt started on its node when its "
                  "node loses the cluster")
        with self._lock:
            if run.key in self._lost:
                return True
            self._lost[run.key] = reason
            self._follows.pop(run.key, None)
        follow.stop()
        run.log.request_stop(StopReason.ERROR, reason, at=time.time(), by=f"host {self.name}")
        log.warning("task %s attempt %d: %s", run.key[0], run.key[1], reason)
        return True

    # --- placing -----------------------------------------------------------------------

    def free_port(self) -> int:
        """A port free on this machine (a node's ports cannot be probed before its job
        runs; the worker's FLEET_PORT is a hint there, as anywhere)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])

    def remote_root(self) -> str:
        return self.data_dir

    def worktree_path(self, task_id: str) -> str:
        return f"{self.data_dir}/work/{task_id}"

    def make_worktree(self, task: Task, *, reattach: bool, reset: bool) -> git.WorktreeInfo:
        """The worktree's place on the node (made there by the job: nothing runs on the
        cluster before the job does); how the job makes it is remembered for the stage."""
        repo = Path(task.repo)
        if task.base_commit:
            base, base_branch = task.base_commit, task.base_branch
        else:
            found = git.resolve_base(repo, task.base_ref)
            base, base_branch = found.commit, found.branch
        branch = task.branch or f"fleet/{task.id}"
        with self._lock:
            self._modes[task.id] = "reattach" if reattach else "new"
        return git.WorktreeInfo(Path(self.worktree_path(task.id)), branch, base, base_branch)

    def check_worktree(self, task: Task, worktree: Path) -> None:
        """Never the main checkout; the job checks the worktree's branch on the node."""
        if str(worktree) == str(task.repo) or str(worktree) != self.worktree_path(task.id):
            raise FleetError(f"refusing to run task {task.id} in {worktree}: its worktree "
                             f"on host {self.name} is {self.worktree_path(task.id)}")

    def _bundle(self, repo: Path, commit: str, task_id: str, into: Path,
                have: list[str] | None = None) -> dict[str, Any]:
        """The base commit as a git bundle (its ref refs/fleet/base/ID, made for the
        bundle and removed) of what the node lacks: its history past `have` (the commits
        the node's mirror held, as its last job said; those this repository does not know
        left out). No file at all when the node holds the commit already; the whole
        history when `have` is empty. What was sent: its bytes, its prerequisites."""
        q = ["git", "-C", str(repo)]
        have = list(have or [])
        if have:
            known = subprocess.run([*q, "cat-file", "--batch-check=%(objectname) %(objecttype)"],
                                   input="\n".join(have) + "\n", capture_output=True,
                                   text=True, check=False).stdout.split("\n")
            have = [line.split()[0] for line in known if line.endswith(" commit")]
        if have:
            past = subprocess.run([*q, "rev-list", "-1", commit, "--stdin"],
                                  input="".join(f"^{t}\n" for t in have), capture_output=True,
                                  text=True, check=False)
            if past.returncode == 0 and not past.stdout.strip():
                return {"bytes": 0, "held": True}  # the node's mirror has it
        ref = f"refs/fleet/base/{task_id}"
        subprocess.run([*q, "update-ref", ref, commit], check=True, capture_output=True)
        try:
            done = subprocess.run([*q, "-c", "pack.threads=1", "bundle", "create", "-q",
                                   str(into), "--stdin"],
                                  input="".join([f"{ref}\n", *(f"^{t}\n" for t in have)]),
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RayError(f"host {self.name}: could not bundle the repository: "
                               f"{done.stderr.strip()[-300:]}")
        finally:
            subprocess.run([*q, "update-ref", "-d", ref], check=False, capture_output=True)
        return {"bytes": into.stat().st_size, "prerequisites": job._prerequisites(into)}

    def _have(self, mirror: str, pin: str | None) -> list[str]:
        """The commits the node the job will run on holds in `mirror` (as its last job
        said): the pinned node's; unpinned, those of the one alive node the host's
        resources fit, or those every fitting node holds (the same tip recorded on each);
        none (a whole bundle) when no record says."""
        if pin:
            return self.book.tips(pin, mirror)
        try:
            nodes = ray_nodes(self.address)
        except (OSError, ValueError):
            return []
        fits = [str(n.get("node_id")) for n in nodes if all(
            float((n.get("resources_total") or {}).get(k) or 0) >= v
            for k, v in {**self.resources, "CPU": self.num_cpus or 0}.items())]
        common: list[str] | None = None
        for node in fits:
            tips = self.book.tips(node, mirror)
            common = tips if common is None else [t for t in common if t in set(tips)]
        return common or []

    def _base_url_there(self, url: str) -> str:
        """A base URL on this machine's loopback as the cluster reaches this machine
        (`gateway_host`; unset: as it is, for a cluster on this machine)."""
        parts = urlsplit(url)
        if self.gateway_host is None or parts.hostname not in LOOPBACK:
            return url
        port = f":{parts.port}" if parts.port else ""
        return urlunsplit(parts._replace(netloc=f"{self.gateway_host}{port}"))

    def stage(self, placement: Placement, spec: RunSpec) -> RayStaged:
        folder = AttemptLog(placement.attempt_dir)
        if folder.record(RAY_FILE) is not None and self._job_exists(folder):
            # this attempt went to the cluster before: its job is the attempt, never a second
            raise_not_started(self.name, folder)
        folder.clear_run_records()
        folder.write_spec(asdict(spec))
        paths.private_file(folder.events)
        for name in (BRANCH_BUNDLE, BRANCH_FILE, SESSION_FILE):
            (folder.dir / name).unlink(missing_ok=True)
        remote_dir = f"{self.data_dir}/attempts/{spec.task_id}/{spec.attempt}"
        remote = replace(spec, include=[], repo=spec.cwd,
                         settings=host_settings(spec.settings, self.claude))
        if isinstance(remote.settings.get("base_url"), str):
            remote.settings["base_url"] = self._base_url_there(remote.settings["base_url"])
        with self._lock:
            mode = self._modes.pop(spec.task_id, "keep")
        pin, restore = self._pin(spec, mode)
        staging = Path(tempfile.mkdtemp(prefix="fleet-ray-job-"))
        try:
            if restore is not None:
                self._stage_restore(Path(spec.repo), spec.task_id, restore, staging)
            base = placement.base_commit or git.resolve_base(Path(spec.repo), None).commit
            mirror = self.mirror_path(Path(spec.repo))
            have = self._have(mirror, pin)
            sent = self._bundle(Path(spec.repo), base, spec.task_id,
                                staging / job.BUNDLE_FILE, have)
            included = self.included_tar(spec)
            if included:
                (staging / job.INCLUDED_FILE).write_bytes(included)
            found = self.git_identity(Path(spec.repo))
            ident = {"name": found[0], "email": found[1]} if found else {}
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        order = {"task_id": spec.task_id, "attempt": spec.attempt, "host": self.name,
                 "mirror": mirror, "worktree": spec.cwd,
                 "branch": placement.branch, "base": base, "mode": mode,
                 "attempt_dir": remote_dir, "config_dir": spec.config_dir,
                 "spec": asdict(remote), "set_up_after": not spec.setup,
                 "identity": ident, "key_env": self.key_env,
                 "key_variable": self.key_variable, "pin": pin,
                 "bundle": "thin" if have else "whole", "bundle_sent": sent,
                 "data_dir": self.data_dir, "released": self.book.released(),
                 "claude_version": fleet_tui.CLAUDE_CODE_VERSION, "srt": self.srt,
                 "restore": restore is not None}
        return RayStaged(self, placement, spec, staging, order, restore)

    def _stage_restore(self, repo: Path, task_id: str, session: Path, staging: Path) -> None:
        """What a job on another node needs to go on with a task whose node is gone: the
        branch as it last came back (its bundle past the base) and claude's transcripts."""
        shutil.copyfile(session / SESSION_FILE, staging / job.RESTORE_SESSION)
        for _n, folder in self._attempt_folders(repo, task_id):
            rec = AttemptLog(folder).record(BRANCH_FILE)
            if rec and isinstance(rec.get("tip"), str):
                if rec.get("bundle"):
                    shutil.copyfile(folder / BRANCH_BUNDLE, staging / job.RESTORE_BRANCH)
                return

    def _pin(self, spec: RunSpec, mode: str) -> tuple[str | None, Path | None]:
        """The node a resume or a follow-up must run on: the one whose job held the
        task's worktree and claude's session last (its `ray.io/node-id` label). None for a
        fresh start. When that node is gone from the cluster: unpinned, with the attempt
        folder here that holds what came back of the session (its transcripts, sent at
        each attempt's end): the job restores the worktree from the collected branch and
        the transcripts into the new node's config dir. RayError when nothing of the
        session came back (its attempt did not end on its node)."""
        if mode == "new":
            return None, None
        found = self.node_of(Path(spec.repo), spec.task_id, before=spec.attempt)
        if found is None:
            return None, None
        try:
            alive = {str(n.get("node_id")) for n in ray_nodes(self.address)}
        except (OSError, ValueError) as exc:
            raise RayError(f"host {self.name}: the Ray cluster at {self.address} does not "
                           f"answer: {exc}") from None
        if found in alive:
            return found, None
        for n, folder in self._attempt_folders(Path(spec.repo), spec.task_id):
            if n < spec.attempt and (folder / SESSION_FILE).is_file():
                return None, folder
        raise RayError(self._session_lost(spec.task_id, found))

    def _session_lost(self, task_id: str, node: str) -> str:
        return (f"task {task_id}: the Ray node that held its worktree and claude's session "
                f"({node[:12]}) is gone from host {self.name}'s cluster, and its session "
                "never came back (its last attempt did not end there): it cannot be resumed "
                f"or followed up; `fleet-tui retry {task_id}` starts it afresh (its work as "
                f"collected stays on its branch until then: `fleet-tui diff {task_id}`)")

    def session_problem(self, task: Task) -> str | None:
        """Asked when a resume or a follow-up is queued, so that one which cannot run is
        refused then, nothing queued (`_pin` says the same at the start, should the node go
        in between). A cluster that does not answer is no refusal: the start will say."""
        found = self.node_of(Path(task.repo), task.id)
        if found is None:
            return None
        try:
            alive = {str(n.get("node_id")) for n in ray_nodes(self.address, timeout=5.0)}
        except (OSError, ValueError):
            return None
        if found in alive or any((folder / SESSION_FILE).is_file() for _n, folder
                                 in self._attempt_folders(Path(task.repo), task.id)):
            return None
        return self._session_lost(task.id, found)

    @staticmethod
    def _attempt_folders(repo: Path, task_id: str) -> list[tuple[int, Path]]:
        """The task's attempt folders here, newest first."""
        root = paths.logs_dir(repo) / task_id
        try:
            numbers = sorted((int(p.name) for p in root.iterdir() if p.name.isdigit()),
                             reverse=True)
        except FileNotFoundError:
            return []
        return [(n, root / str(n)) for n in numbers]

    def node_of(self, repo: Path, task_id: str, *, before: int | None = None) -> str | None:
        """The node the task's newest job (before attempt `before`) ran on."""
        for n, folder in self._attempt_folders(repo, task_id):
            if before is not None and n >= before:
                continue
            node = (AttemptLog(folder).record(RAY_FILE) or {}).get("node_id")
            if isinstance(node, str) and node:
                return node
        return None

    def record_node(self, folder: AttemptLog, node_id: str) -> None:
        """The node the attempt's job runs on, beside its submission id."""
        if (folder.record(RAY_FILE) or {}).get("node_id") == node_id:
            return
        # Ray placed it: taken, whoever writes this first
        edit_record(folder, node_id=node_id, submitted=True)
        task_id = folder.dir.parent.name
        with contextlib.suppress(OSError):
            self.book.set_node(task_id, node_id)

    # --- running -------------------------------------------------------------------------

    def runner_env(self) -> dict[str, str]:
        """The engine's environment; only a few named variables and the attempt's token
        reach the node (`forwarded`, then `submit`)."""
        return dict(self.env)

    def attach(self, attempt: Attempt) -> RayRun:
        return RayRun(self, attempt)

    def collect(self, task: Task) -> str:
        """The task's branch as its node last sent it (at the end of each attempt, and
        each time its tip moved), fetched into the main repository as fleet/ID."""
        branch = task.branch or f"fleet/{task.id}"
        found = self._newest_branch(task)
        if found is None:
            raise RayError(f"task {task.id}: no commits came back from host {self.name} yet "
                           "(its job has not sent its branch)")
        folder, rec = found
        tip = str(rec["tip"])
        q = ["git", "-C", str(task.repo)]
        if rec.get("bundle"):
            done = subprocess.run([*q, "fetch", "--no-tags", "--quiet",
                                   str(folder / BRANCH_BUNDLE), f"refs/heads/{branch}"],
                                  capture_output=True, env=dict(self.env), check=False)
            if done.returncode != 0:
                raise RayError(f"host {self.name}: could not fetch {branch} from its bundle: "
                               f"{done.stderr.decode('utf-8', 'replace').strip()[-300:]}")
        subprocess.run([*q, "update-ref", f"refs/heads/{branch}", tip], check=True,
                       capture_output=True)
        return branch

    def _newest_branch(self, task: Task) -> tuple[Path, dict[str, Any]] | None:
        for _n, folder in self._attempt_folders(Path(task.repo), task.id):
            rec = AttemptLog(folder).record(BRANCH_FILE)
            if rec and isinstance(rec.get("tip"), str):
                return folder, rec
        return None

    # --- the worktrees on the nodes (the seam's RemoteWorktrees) ----------------------

    def remote_worktrees(self) -> RayHost:
        return self  # a task's worktree is on a node: never a folder of this machine

    def has_worktree(self, task: Task) -> bool:
        """A job of the task reached a node (the worktree is there, with its session:
        a resume or a follow-up is pinned to that node)."""
        return bool(task.worktree) and self.node_of(Path(task.repo), task.id) is not None

    def snapshot(self, task: Task) -> str:
        """The branch as its node last sent it (each time its tip moved, and at each
        attempt's end with the worker's uncommitted work committed), no round trip: a
        running task's uncommitted files are not in it. Nothing sent yet: the base."""
        if not task.worktree:
            raise FleetError(f"task {task.id} has no worktree yet")
        if self._newest_branch(task) is None:
            tip = task.base_commit or git.resolve_base(Path(task.repo), None).commit
        else:
            tip = git.branch_tip(Path(task.repo), self.collect(task))
        subprocess.run(["git", "-C", str(task.repo), "update-ref", self.snapshot_ref(task),
                        tip], check=True, capture_output=True, env=dict(self.env))
        return tip

    def update_worktree(self, task: Task, *, base_commit: str, base_branch: str,
                        strategy: str, message: str) -> git.UpdateResult:
        """"current" when the branch as the node sent it holds the base's tip already;
        else a short job pinned to the node that holds the worktree runs the SSH agent's
        `update` there (the base sent as a bundle; on conflicts the worktree is left
        mid-merge there, for its worker) and sends the branch back. Refused while a job of
        the task is followed, or when its node is gone."""
        branch = task.branch or f"fleet/{task.id}"
        tip = self.snapshot(task)
        done = subprocess.run(["git", "-C", str(task.repo), "merge-base", "--is-ancestor",
                               base_commit, tip], capture_output=True, check=False)
        if done.returncode == 0 and not task.conflicts:
            return git.UpdateResult("current", f"{branch} is up to date with {base_branch} "
                                    f"({base_commit[:10]}) already", base_tip=base_commit,
                                    head=tip)
        node = self.node_of(Path(task.repo), task.id)
        alive = {str(n.get("node_id")) for n in ray_nodes(self.address)}
        if node is None or node not in alive:
            return git.UpdateResult(
                "refused", f"{branch} is behind {base_branch} and the Ray node that held its "
                f"worktree is gone from host {self.name}'s cluster: merge it here with "
                f"`fleet-tui merge {task.id}` (its collected branch)")
        with self._lock:
            busy = any(k[0] == task.id and not f.ended.is_set()
                       for k, f in self._follows.items())
        if busy:
            return git.UpdateResult("refused", f"a job of task {task.id} runs on host "
                                    f"{self.name}: its worktree is updated once it ends")
        answer = self.short_jobs.update(task, node, base_commit, strategy, message)
        return update_result(answer, branch=branch, base_branch=base_branch,
                             base_commit=base_commit, strategy=strategy,
                             host=f"the Ray host {self.name}")

    def abort_update(self, task: Task) -> str:
        """The update that stopped on conflicts in the task's worktree on its node undone
        there by a short job pinned to that node (`git merge --abort`, or the rebase's:
        the worktree back at the task's tip); refused when the update was concluded with
        conflict markers still in, when its node is gone, or while a job of the task
        runs."""
        node = self.node_of(Path(task.repo), task.id)
        try:
            alive = {str(n.get("node_id")) for n in ray_nodes(self.address)}
        except (OSError, ValueError) as exc:
            raise RayError(f"host {self.name}: the Ray cluster at {self.address} does not "
                           f"answer: {exc}") from None
        if node is None or node not in alive:
            raise RayError(f"task {task.id}: the Ray node that held its worktree is gone "
                           f"from host {self.name}'s cluster, and the update with it: "
                           f"retry the task fresh (`fleet-tui retry {task.id}`)")
        with self._lock:
            busy = any(k[0] == task.id and not f.ended.is_set()
                       for k, f in self._follows.items())
        if busy:
            raise RayError(f"a job of task {task.id} runs on host {self.name}: its update "
                           "is aborted once it ends")
        answer = self.short_jobs.run(task, node, {"abort": True}, bundle=None)
        if "error" in answer:
            raise RayError(f"host {self.name}: {answer['error']}")
        what = answer.get("aborted")
        back = " (the worker's uncommitted work put back as it was)" \
            if answer.get("restored") else ""
        return (f"the {what} was aborted in its worktree on the Ray host {self.name}{back}"
                if what else
                f"nothing was stopped in its worktree on the Ray host {self.name}{back}")

    def keep_lost_in(self, ledger: LostLedger) -> None:
        """Nothing recorded: what a lost job started is ended on its node by the job's own
        entrypoint (orphaned when its raylet dies), never swept from here."""

    def release(self, task_id: str) -> None:
        """The task's worktree and config dir on its node removed by the next job of this
        host (an attempt's, an update's), before its own work: the released ids go in
        every job's order, the job removes those it finds on its node (`git worktree
        remove --force` from the mirror they belong to, the config dir, their refs there)
        and says which it removed or did not find; an id is forgotten once it was removed,
        or not found on the node that held it. Not a job of its own: a job's start costs
        a JobSupervisor and seconds of the cluster, for disk that the next job frees as
        well; a node that never runs another job of this host keeps them."""
        try:
            self.book.release(task_id)
        except OSError as exc:
            log.warning("host %s: could not note task %s as released: %s", self.name,
                        task_id, exc)

    def reap(self) -> None:
        with self._lock:
            for key, follow in list(self._follows.items()):
                if follow.ended.is_set():
                    for sid in follow.sids:
                        self._orders.pop(sid, None)
                if follow.ended.is_set() and not follow.thread.is_alive() \
                        and AttemptLog(follow.folder).exited:
                    del self._follows[key]

    def close(self) -> None:
        """Stop following (the jobs go on)."""
        with self._lock:
            follows = list(self._follows.values())
            self._follows.clear()
        for follow in follows:
            follow.stop()


if TYPE_CHECKING:
    def _a_host(host: RayHost) -> Host:  # mypy: the seam, whole
        return host


def raise_not_started(name: str, folder: AttemptLog) -> None:
    from fleet_tui.execution.host import NotStarted

    rec = folder.record(RAY_FILE) or {}
    raise NotStarted(f"host {name}: attempt {folder.dir.name} went to the cluster already as "
                     f"the job {rec.get('submission_id')}; following adopts it")


__all__ = ["RayError", "RayHost", "RayRun", "RayStaged", "submission_id"]


def build(config: HostConfig, *, env: Mapping[str, str], python: str) -> RayHost:
    """The ray kind's host of one `[hosts.NAME]` table (the kinds table's entry);
    HostUnavailable when this machine has no ray (the extra)."""
    import importlib.util

    from fleet_tui.execution.hosts import HostUnavailable

    if importlib.util.find_spec("ray") is None:
        raise HostUnavailable(
            f"the host {config.name!r} is a Ray cluster, and this machine has no ray: "
            "pip install 'fleet-tui[ray]' (the Jobs client), or run the task on `local` "
            "(--host local)")
    own = kind_config.options(config)
    options: dict[str, Any] = {}
    for key in (*kind_config.TEXTS, "cage"):
        if getattr(own, key) is not None:
            options[key] = getattr(own, key)
    return RayHost(name=config.name, address=own.ray, env=env, resources=own.resources,
                   **options)
