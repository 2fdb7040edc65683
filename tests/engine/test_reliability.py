"""The standing reliability suite: chaos, ingest load, secret scan.

Each test has a fast form for the normal run and a long form, the soak: `FLEET_SOAK=1` or
`pytest --soak` (sizes one by one: FLEET_SOAK_ROUNDS, FLEET_SOAK_SEED, FLEET_SOAK_WORKERS,
FLEET_SOAK_RATE, FLEET_SOAK_SECONDS). `bash scripts/soak` runs the long forms (with the
fuzz and merge-race tests) and prints the figures as a table (see tests/support/soak_report.py).

Chaos (`test_chaos`): the real, pinned claude against the scripted endpoint runs tasks of
four turns, three of them Bash steps, through real engines, runners and git worktrees. In
each round one of four things is killed with SIGKILL at a random point (fixed seeds):

- the scheduler: an engine process running `Fleet.run` (tests/support/engine_child.py);
- the panel: the real `fleet-tui` control panel, in a pseudo-terminal, with its scheduler
  on (the tasks are submitted from outside; the panel's engine claims and starts them);
- a runner, or claude itself, while claude is between its first and its last turn.

Then a fresh engine (for the scheduler and the panel) or the surviving one finishes the
work, and each round is audited from outside the engine:

- double starts: claude started once per attempt (the wrapper logs each start), one init
  line per attempt's events.jsonl, never two live runners of one task (a thread samples
  /proc every 0.1 s), each turn of a task's conversation seen once by the endpoint;
- events lost: `claude` is a wrapper that runs the real binary with its stdout through
  `tee` into a capture of its own, the independent copy. events.jsonl must be byte-identical
  to it, and wholly ingested (the store's events_offset is its size). Only when the runner
  itself was killed may the file be shorter, and then it must be a prefix of the capture
  (what claude wrote after its runner died had no reader); that task ends failed or killed
  with a reason, never succeeded;
- processes left: once the engine is done, no process carries an attempt's
  FLEET_ATTEMPT_TOKEN (/proc/PID/environ, as `procs.with_env` reads it).

Ingest load (`test_ingest_load`): W workers each writing R stream-json events a second
for S seconds (fast 10 x 200 x 5, soak 50 x 200 x 60), through real runners and a real
engine process. The "claude" here is a STAND-IN (tests/support/standin_claude.py, stream mode): what
is measured is the engine's ingest, which no real claude run can drive at a fixed 200
events a second. Events dropped must be 0: events.jsonl byte-identical to the stand-in's own
copy, the store's events_offset its size, the stored turns and tokens those the lines add up
to (counted here with json, not fleet-tui's parser). The engine's peak resident size
(VmHWM) is the memory figure.

Chaos on an SSH host (`test_chaos_on_a_host`): the same rounds and audit with the tasks on
a real sshd on 127.0.0.1 (tests/support/sshd.py), the engines' host an SshHost: the runner or
claude SIGKILLed on the host, the ssh master cut mid-run, the controller SIGKILLed and a
fresh one re-adopting, the host's sshd stopped past the lease (every task lost, then swept:
0 processes left). See the section's comment below.

Secret scan (each test, on what it made): the key (a distinctive fake) must not be in the
store (fleet.db and its -wal), any attempt folder, the config dirs, the worktrees (a Bash
step dumps its environment into one), the captures, any argv seen during the run, the
environment of any process of a worker, the panel's screen, or what the engines and the
CLI (`ls`, `logs --raw`, `diff`) printed. The control: the harness's own engine configs,
which hold the key on purpose, must be found by the same scan, and the endpoint must have
received exactly that key.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import json
import os
import pty
import random
import select
import shlex
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from soak_report import knob, load_average, record
from ssh_support import host_config, master, start_sshd
from standin_claude import stream_wrapper

from fleet_tui.core import stream
from fleet_tui.demo.endpoint import RecordedRequest, ScriptedEndpoint, ToolResultRecord
from fleet_tui.engine.fleet import Fleet, TaskSpec
from fleet_tui.execution.worker.attemptlog import EVENTS_FILE, RUNNER_FILE, SPEC_FILE, read_json
from fleet_tui.execution.worker.runner import RUNNER_MODULE, TOKEN_ENV, RunSpec
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import FINISHED_STATES, Store, TaskState
from fleet_tui.system import paths, procs

TESTS = Path(__file__).resolve().parents[1] / "support"
ROOT = TESTS.parents[1]
KEY = "sk-reliability-SECRET-5f0c7a1e93"

ROUNDS = knob("FLEET_SOAK_ROUNDS", 1, 10)  # chaos rounds per target
SEED = knob("FLEET_SOAK_SEED", 9_100, 9_100)
WORKERS = knob("FLEET_SOAK_WORKERS", 10, 50)
RATE = knob("FLEET_SOAK_RATE", 200, 200)
SECONDS = knob("FLEET_SOAK_SECONDS", 5, 60)

TARGETS = ("scheduler", "panel", "runner", "claude")
TASKS_PER_ROUND = 2
STEP = 0.5  # seconds each Bash step sleeps
TOOL_TURNS = 3
# The scheduler and the panel die this long (at most) after their first claim: through the
# claims, the checkouts, the runner spawns, the runs and their ends (~2.7 s here; with 4 s,
# 20 of 50 soak rounds killed an engine whose tasks had all ended).
SPAN = 3.0
CHAOS_SCRIPT: dict[str, Any] = {
    "chaos": [
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": f"sleep {STEP}; env > env.txt; echo one >> steps.txt; seq 1 40",
                    "description": "step one"}}],
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": f"sleep {STEP}; echo two >> steps.txt; seq 41 80",
                    "description": "step two"}}],
        [{"type": "tool_use", "name": "Bash",
          "input": {"command": f"sleep {STEP}; echo three >> steps.txt",
                    "description": "step three"}}],
        "chaos done",
    ],
}
STEPS = "one\ntwo\nthree\n"


# --- harness ---------------------------------------------------------------------------------


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.name", "Fleet Test")
    git(path, "config", "user.email", "fleet@example.invalid")
    (path / "README.md").write_text("# reliability\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


def capture_wrapper(folder: Path, real: str, captures: Path) -> Path:
    """`claude` for the chaos rounds: logs its start, then execs the real binary (same pid,
    so the runner's record and its death signal still name claude) with stdout going through
    `tee -a` into captures/<FLEET_ATTEMPT_TOKEN>.stdout, the independent copy of the stream.
    The paths are in the script: the launcher passes claude only the environment it knows."""
    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / "claude"
    cap = shlex.quote(str(captures))
    wrapper.write_text(
        "#!/bin/bash\n"
        'if [ -n "$FLEET_ATTEMPT_TOKEN" ]; then\n'
        f'    echo "$FLEET_ATTEMPT_TOKEN $$" >> {cap}/starts\n'
        f'    exec > >(exec tee -a {cap}/"$FLEET_ATTEMPT_TOKEN".stdout)\n'
        "fi\n"
        f'exec {shlex.quote(real)} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


# The harness's claude is a wrapper that tees the stream into the test's captures folder,
# outside any worktree: a caged worker may not write there, so these workers run uncaged
# (the cage is tested in test_cage.py).
UNCAGED = "off"


def settings_for(url: str, claude: str, max_workers: int) -> dict[str, Any]:
    return {"base_url": url, "claude": claude, "sandbox": os.geteuid() == 0,
            "key_sources": "env", "kill_grace": 2.0, "max_workers": max_workers,
            "cage": UNCAGED}


def engine_env() -> dict[str, str]:
    return dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY, CLAUDE_CODE_MAX_RETRIES="0")


def make_fleet(settings: dict[str, Any]) -> Fleet:
    """The test's own engine object: it submits and reads, it never ticks."""
    return Fleet(load_settings(env=os.environ, overrides=settings), Store(paths.db_path()),
                 env=engine_env())


@dataclass
class Dirs:
    """Where one test keeps things. `harness` holds files with the key on purpose (the
    engines' configs): the control of the secret scan, and the one folder it skips."""

    base: Path
    harness: Path
    outputs: Path
    captures: Path

    @classmethod
    def under(cls, base: Path) -> Dirs:
        made = cls(base, base / "harness", base / "outputs", base / "captures")
        for folder in (made.harness, made.outputs, made.captures):
            folder.mkdir(parents=True, exist_ok=True)
        return made


def start_engine(dirs: Dirs, name: str, settings: dict[str, Any], ids: list[str], *,
                 report: Path | None = None, timeout: float = 240.0,
                 extra: dict[str, Any] | None = None) -> subprocess.Popen[bytes]:
    """tests/support/engine_child.py: a real engine in a process of its own, running `Fleet.run`
    until every task in ids has finished (`extra`: more of its config, e.g. its SSH
    host). Its output goes to outputs/<name>.log."""
    config = dirs.harness / f"{name}.json"
    config.write_text(json.dumps({
        "settings": settings, "env": engine_env(), "db": str(paths.db_path()),
        "until_settled": ids, "timeout": timeout,
        "report": str(report) if report is not None else None, **(extra or {})}))
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*inherited, str(ROOT), str(TESTS)]))
    log = open(dirs.outputs / f"{name}.log", "ab")  # noqa: SIM115 (the child holds it)
    try:
        return subprocess.Popen([sys.executable, str(TESTS / "engine_child.py"), str(config)],
                                env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    finally:
        log.close()


class Panel:
    """The real control panel (`python -m fleet_tui.cli`) in a pseudo-terminal of 120x40,
    its screen drained by a thread into outputs/<name>.screen."""

    def __init__(self, env: dict[str, str], cwd: Path, screen: Path) -> None:
        self.screen = screen
        pid, fd = pty.fork()
        if pid == 0:  # the child: the pty is its terminal
            try:
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
                os.chdir(cwd)
                os.execve(sys.executable, [sys.executable, "-m", "fleet_tui.cli"], env)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self.status: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        with open(self.screen, "ab") as out:
            while not self._stop.is_set():
                try:
                    ready = select.select([self.fd], [], [], 0.1)[0]
                    chunk = os.read(self.fd, 65536) if ready else None
                except OSError:  # EIO: the panel and everything on its terminal are gone
                    return
                if chunk == b"":
                    return
                if chunk:
                    out.write(chunk)

    def alive(self) -> bool:
        if self.status is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.status = status
        return self.status is None

    def kill(self) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
            self.status = os.waitpid(self.pid, 0)[1]

    def close(self) -> None:
        self.kill()
        self._stop.set()
        self._thread.join(timeout=10)
        with contextlib.suppress(OSError):
            os.close(self.fd)


class Monitor:
    """Samples /proc every 0.1 s while a round runs: the live runners of each task (their
    last argument is the attempt folder, whose parent is named after the task), every argv
    seen (for the secret scan), and the environment of every process of this test's
    workers (they carry an attempt token and work under base): the key must not be there."""

    def __init__(self, base: Path) -> None:
        self.base = str(base)
        self.max_runners: collections.Counter[str] = collections.Counter()
        self.argv_seen = 0
        self.argv_hits: list[str] = []
        self.worker_procs = 0
        self.environ_hits: list[str] = []
        self._seen: set[tuple[int, str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            self.sample()

    def sample(self) -> None:
        # a runner's own forks (the key handoff's writer, claude before its exec) show the
        # runner's argv: a runner is counted only when its parent is not one
        runners: dict[int, tuple[int, str]] = {}
        for st in procs.all_stats():
            if st.state in ("Z", "X", "x"):
                continue
            argv = procs.cmdline(st.pid)
            if (st.pid, st.start) not in self._seen:
                self._seen.add((st.pid, st.start))
                self.argv_seen += 1
                if KEY in " ".join(argv):
                    self.argv_hits.append(" ".join(argv)[:200])
                self._read_environ(st.pid, argv)
            if "fleet_tui.execution.worker.runner" in argv and argv[-1].startswith(self.base):
                runners[st.pid] = (st.ppid, Path(argv[-1]).parent.name)
        per_task = collections.Counter(task for ppid, task in runners.values()
                                       if ppid not in runners)
        for task_id, count in per_task.items():
            self.max_runners[task_id] = max(self.max_runners[task_id], count)

    def _read_environ(self, pid: int, argv: list[str]) -> None:
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:
            return
        if f"{TOKEN_ENV}=".encode() not in environ:
            return
        try:  # a worker of this test: it works in a worktree under base
            if not os.readlink(f"/proc/{pid}/cwd").startswith(self.base):
                return
        except OSError:
            return
        self.worker_procs += 1
        if KEY.encode() in environ:
            self.environ_hits.append(" ".join(argv)[:200])


def spec_token(adir: Path) -> str:
    try:
        return RunSpec.from_json((adir / SPEC_FILE).read_text(encoding="utf-8")).token
    except (OSError, ValueError, TypeError):
        return ""


def tokens_of(fleet: Fleet, ids: list[str]) -> dict[str, str]:
    """token -> task id, for every attempt of these tasks that has a folder."""
    out: dict[str, str] = {}
    for task_id in ids:
        for attempt in fleet.attempts(task_id):
            if attempt.dir is not None and (token := spec_token(Path(attempt.dir))):
                out[token] = task_id
    return out


def left_behind(tokens: list[str], grace: float = 3.0) -> list[int]:
    """Processes still carrying one of the tokens after `grace` seconds (a process being
    killed at the very moment gets that long to go)."""
    deadline = time.monotonic() + grace
    while True:
        stats = procs.all_stats()
        left = sorted({pid for token in tokens for pid in procs.with_env(TOKEN_ENV, token,
                                                                          stats=stats)})
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def kill_leftovers(tokens: list[str], base: Path) -> None:
    """Teardown: whatever carries the tokens, and runners working under base."""
    for token in tokens:
        for pid in procs.with_env(TOKEN_ENV, token):
            procs.signal_pid(pid, signal.SIGKILL)
    for st in procs.all_stats():
        argv = procs.cmdline(st.pid)
        if RUNNER_MODULE in argv and st.state != "Z" and argv[-1].startswith(str(base)):
            procs.signal_tree(st.pid, signal.SIGKILL)


def init_lines(data: bytes) -> int:
    """The stream's `system/init` lines: one per claude process that started."""
    return sum(isinstance(e, stream.Init) for e in stream.decode_all(data))


def common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s for {what}")
        time.sleep(0.02)


def cli(env: dict[str, str], cwd: Path, out: Path, *args: str) -> int:
    """A fleet-tui command as a user would run it; what it printed goes to `out`."""
    done = subprocess.run([sys.executable, "-m", "fleet_tui.cli", *args], cwd=cwd, env=env,
                          capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    with open(out, "ab") as fh:
        fh.write(f"$ fleet-tui {' '.join(args)}\n".encode() + done.stdout + done.stderr)
    return done.returncode


def cli_env(url: str, claude: str, max_workers: int) -> dict[str, str]:
    return dict(engine_env(), FLEET_WORKER_BASE_URL=url, FLEET_WORKER_CLAUDE=claude,
                FLEET_WORKER_KEY_SOURCES="env", FLEET_WORKER_KILL_GRACE="2",
                FLEET_WORKER_CAGE=UNCAGED,
                FLEET_WORKER_MAX_WORKERS=str(max_workers), TERM="xterm-256color",
                PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


# --- the secret scan -------------------------------------------------------------------------


@dataclass
class Scan:
    files: int = 0
    bytes: int = 0
    hits: list[str] = field(default_factory=list)


def scan_tree(roots: list[Path], skip: tuple[Path, ...] = ()) -> Scan:
    """Every regular file under roots (symlinks not followed), read whole, for the key."""
    needle = KEY.encode()
    scan = Scan()
    skipped = [str(s) for s in skip]
    for root in roots:
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if os.path.join(folder, d) not in skipped]
            for name in files:
                path = os.path.join(folder, name)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                try:
                    with open(path, "rb") as fh:
                        data = fh.read()
                except OSError:
                    continue
                scan.files += 1
                scan.bytes += len(data)
                if needle in data:
                    scan.hits.append(path)
    return scan


def secret_scan(suite: str, dirs: Dirs, monitor_list: list[Monitor], *,
                sent: list[str | None] | None, kept_in: Path | None = None) -> list[str]:
    """The scan of what one test made; returns its problems (and records its figures).
    `sent`: the key digests of the endpoint's requests (None: no endpoint was used).
    `kept_in`: a host's folder of key files (`--key-on-host`: the key there on purpose,
    each file private to its user)."""
    home = paths.home()
    roots = [home, Path(os.environ["HOME"]), dirs.base]
    scan = scan_tree(roots, skip=(dirs.harness,))
    kept = [h for h in scan.hits if kept_in is not None and Path(h).parent == kept_in]
    scan.hits = [h for h in scan.hits if h not in kept]
    loose = [h for h in kept if Path(h).stat().st_mode & 0o077]
    control = scan_tree([dirs.harness])
    argv_seen = sum(m.argv_seen for m in monitor_list)
    argv_hits = [h for m in monitor_list for h in m.argv_hits]
    worker_procs = sum(m.worker_procs for m in monitor_list)
    environ_hits = [h for m in monitor_list for h in m.environ_hits]
    problems = []
    if scan.hits:
        problems.append(f"the key is in {len(scan.hits)} file(s): {scan.hits[:5]}")
    if loose:
        problems.append(f"a host's key file is readable by others: {loose}")
    if argv_hits:
        problems.append(f"the key is in {len(argv_hits)} argv(s): {argv_hits[:3]}")
    if environ_hits:
        problems.append(f"the key is in the environment of {len(environ_hits)} worker "
                        f"process(es): {environ_hits[:3]}")
    # the controls: the scan finds the key where it is on purpose, and the key was used
    if not control.hits:
        problems.append(f"control: the scan missed the key in {dirs.harness}")
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    if sent is not None and (not sent or any(s != digest for s in sent)):
        problems.append(f"control: {len(sent)} requests, not all of them with the key")
    db = [p.name for p in home.glob("fleet.db*")]
    record(suite, "secret scan", len(scan.hits) + len(argv_hits) + len(environ_hits), "hits",
           f"{scan.files} files ({scan.bytes / 1e6:.1f} MB: {', '.join(sorted(db))}, "
           f"attempt folders, config dirs, worktrees, captures, outputs), {argv_seen} argv, "
           f"{worker_procs} worker environments; control found {len(control.hits)}")
    return problems


# --- chaos -----------------------------------------------------------------------------------


@dataclass
class Tally:
    rounds: int = 0
    tasks: int = 0
    double_starts: int = 0
    bytes_lost: int = 0
    bytes_captured: int = 0
    not_copied_after_runner_death: int = 0
    processes_left: int = 0
    problems: list[str] = field(default_factory=list)
    points: list[str] = field(default_factory=list)


@pytest.fixture
def chaos_endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(CHAOS_SCRIPT) as ep:
        yield ep


def _task_requests(endpoint: ScriptedEndpoint, worktree: str) -> list[RecordedRequest]:
    return [r for r in endpoint.message_requests("chaos")
            if r.cwd == worktree and r.turn is not None
            and not (r.prompt or "").startswith("<session>")]


def _turns_seen(endpoint: ScriptedEndpoint, worktree: str) -> collections.Counter[int]:
    return _turns_seen_in(_task_requests(endpoint, worktree))


def _turns_seen_in(requests: list[RecordedRequest]) -> collections.Counter[int]:
    return collections.Counter(r.turn for r in requests)


def turns_acted_on(requests: list[RecordedRequest]) -> collections.Counter[int]:
    """For each turn, how many of its answers the worker acted on: answers whose tool
    calls came back as tool results in a later request. A turn asked for again because its
    answer was cut on the way (the CLI retries; an SSH forward that died with the answer in
    flight did this) counts once; a turn two workers both ran counts twice. The last turn
    calls no tool: two workers reaching it are caught by the count of claude's starts."""
    acted = {result.tool_use_id for r in requests for result in r.tool_results}
    return collections.Counter(r.turn for r in requests if r.turn is not None
                               and r.tool_use_ids and acted & set(r.tool_use_ids))


def test_a_turn_asked_again_after_its_answer_was_cut_is_not_run_twice() -> None:
    """What the SSH-host chaos round with seed 11600 met: the forward died while turn 0's
    answer was on its way, the CLI asked again, and turn 0 was answered twice but run once;
    two workers each running turn 0 are still caught."""
    def asked(turn: int, ids: tuple[str, ...], results: tuple[str, ...] = ()) -> RecordedRequest:
        return RecordedRequest(method="POST", path="/v1/messages", status=200, turn=turn,
                               tool_use_ids=ids, tool_results=tuple(
                                   ToolResultRecord(i, False, "ok") for i in results))
    cut_then_retried = [asked(0, ("a",)), asked(0, ("b",)), asked(1, ("c",), ("b",)),
                        asked(2, (), ("c",))]
    assert _turns_seen_in(cut_then_retried) == {0: 2, 1: 1, 2: 1}
    assert turns_acted_on(cut_then_retried) == {0: 1, 1: 1}
    two_workers = [asked(0, ("a",)), asked(0, ("b",)), asked(1, ("c",), ("a",)),
                   asked(1, ("d",), ("b",))]
    assert turns_acted_on(two_workers) == {0: 2}  # turn 1's answers were never acted on


def _victim_pid(fleet: Fleet, task_id: str, which: str) -> int | None:
    attempts = fleet.attempts(task_id)
    if not attempts or attempts[-1].dir is None:
        return None
    rec = read_json(Path(attempts[-1].dir) / RUNNER_FILE) or {}
    pid = rec.get("claude_pid" if which == "claude" else "runner_pid")
    return pid if isinstance(pid, int) and rec.get("claude_pid") else None


def chaos_round(target: str, n: int, seed: int, dirs: Dirs, endpoint: ScriptedEndpoint,
                wrapper: Path, tally: Tally, monitors: list[Monitor], fleet: Fleet) -> None:
    rng = random.Random(seed)
    where = f"seed {seed}, round {n}, target {target}"
    settings = settings_for(endpoint.url, str(wrapper), 4)
    repo = make_repo(dirs.base / f"round-{n}" / "repo")
    ids = [t.id for t in fleet.submit(TaskSpec(prompt=f"[script:chaos] round {n}", repo=repo),
                                      copies=TASKS_PER_ROUND)]
    name = f"{target}-{n}"
    env = cli_env(endpoint.url, str(wrapper), 4)
    first: subprocess.Popen[bytes] | None = None
    panel: Panel | None = None
    fresh: subprocess.Popen[bytes] | None = None
    victim: str | None = None
    point = ""
    started = time.monotonic()
    monitor = Monitor(dirs.base)
    monitors.append(monitor)
    try:
        with monitor:
            if target == "panel":
                panel = Panel(env, repo, dirs.outputs / f"{name}.screen")
            else:
                first = start_engine(dirs, f"{name}-engine", settings, ids)

            def claimed() -> bool:
                return any(fleet.get_task(i).state != TaskState.QUEUED for i in ids)

            if target in ("scheduler", "panel"):
                wait_until(claimed, 90, f"the {target} to claim a task")
                delay = rng.uniform(0, SPAN)
                time.sleep(delay)
                states = {i: (fleet.get_task(i).state.value,
                              len(_turns_seen(endpoint, str(paths.worktree_path(repo, i)))))
                          for i in ids}
                point = (f"{target} killed {delay:.2f} s after its first claim; "
                         f"(state, turns) then: {states}")
                if panel is not None:
                    panel.kill()
                elif first is not None:
                    first.kill()
                    first.wait()
                fresh = start_engine(dirs, f"{name}-fresh", settings, ids)
                engine = fresh
            else:
                assert first is not None
                victim = ids[rng.randrange(len(ids))]
                turn = rng.randrange(-1, TOOL_TURNS)
                # before the next turn (a Bash step takes STEP at least): claude has not
                # printed its result, so the run cannot have succeeded
                delay = rng.uniform(0, 0.6 * STEP)
                worktree = str(paths.worktree_path(repo, victim))
                if turn < 0:
                    wait_until(lambda: _victim_pid(fleet, victim or "", target) is not None, 90,
                               "claude to start")
                else:
                    wait_until(lambda: _turns_seen(endpoint, worktree)[turn] > 0, 90,
                               f"turn {turn} of {victim}")
                time.sleep(delay)
                pid = _victim_pid(fleet, victim, target)
                assert pid is not None
                point = (f"{target} of {victim} (pid {pid}) killed {delay:.2f} s after "
                         + ("claude started" if turn < 0 else f"turn {turn} was served"))
                os.kill(pid, signal.SIGKILL)
                engine = first
            code = engine.wait(timeout=240)
            if code != 0:
                tally.problems.append(f"{where}: the finishing engine exited {code} "
                                      f"(see {dirs.outputs})")
        tally.points.append(f"{where}: {point}")
        audit(fleet, ids, {victim} if victim else set(), target, where, endpoint, dirs,
              tally, prefix_ok=target == "runner")
        # what a user would look at afterwards, for the secret scan
        cli(env, repo, dirs.outputs / f"{name}.cli", "ls", "--json")
        cli(env, repo, dirs.outputs / f"{name}.cli", "logs", victim or ids[0], "--raw")
        cli(env, repo, dirs.outputs / f"{name}.cli", "diff", victim or ids[0])
    except Exception as exc:  # this round's failure, with its seed; the next rounds go on
        tally.problems.append(f"{where}: {type(exc).__name__}: {exc}; "
                              f"point: {point or 'not reached'}")
    finally:
        for proc in (first, fresh):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        if panel is not None:
            panel.close()
        kill_leftovers(list(tokens_of(fleet, ids)), dirs.base)
        tally.rounds += 1
        record(f"chaos {target}", f"round {n} (seed {seed})",
               round(time.monotonic() - started, 1), "s", point, detail=True)


def audit(fleet: Fleet, ids: list[str], victims: set[str], target: str, where: str,
          endpoint: ScriptedEndpoint, dirs: Dirs, tally: Tally, *,
          prefix_ok: bool = False) -> None:
    """`victims`: the tasks the fault was aimed at (they must end failed or killed, with a
    reason); `prefix_ok`: their events.jsonl may be a prefix of the capture (their runner,
    or the whole host, was gone before claude's last line)."""
    starts = collections.Counter(
        line.split()[0] for line in (dirs.captures / "starts").read_text().splitlines()
        if line.strip()) if (dirs.captures / "starts").exists() else collections.Counter()
    tokens = tokens_of(fleet, ids)
    for task_id in ids:
        tally.tasks += 1
        task = fleet.get_task(task_id)
        killed_here = task_id in victims
        attempts = fleet.attempts(task_id)
        mine = [t for t, i in tokens.items() if i == task_id]
        # --- double starts
        doubles = sum(max(0, starts[t] - 1) for t in mine)
        if sum(starts[t] for t in mine) != 1:
            tally.problems.append(f"{where}: task {task_id}: claude started "
                                  f"{sum(starts[t] for t in mine)} times")
        worktree = str(task.worktree or paths.worktree_path(Path(task.repo), task_id))
        turns = turns_acted_on(_task_requests(endpoint, worktree))
        twice = {t: c for t, c in turns.items() if c > 1}
        if twice:
            doubles += sum(c - 1 for c in twice.values())
            tally.problems.append(f"{where}: task {task_id}: turns served more than once: "
                                  f"{twice}")
        for attempt in attempts:
            if attempt.dir is None:
                continue
            adir = Path(attempt.dir)
            events = (adir / EVENTS_FILE).read_bytes() if (adir / EVENTS_FILE).exists() \
                else b""
            inits = init_lines(events)
            if inits > 1:
                doubles += inits - 1
                tally.problems.append(f"{where}: task {task_id} attempt {attempt.n}: "
                                      f"{inits} init lines")
            # --- events lost
            token = spec_token(adir)
            cap_path = dirs.captures / f"{token}.stdout"
            capture = cap_path.read_bytes() if token and cap_path.exists() else b""
            tally.bytes_captured += len(capture)
            same = common_prefix(events, capture)
            if killed_here and prefix_ok:
                if same != len(events):
                    tally.bytes_lost += len(events) - same
                    tally.problems.append(f"{where}: task {task_id}: events.jsonl is not a "
                                          f"prefix of the capture (differs at byte {same})")
                tally.not_copied_after_runner_death += len(capture) - len(events)
            elif events != capture:
                tally.bytes_lost += max(len(capture), len(events)) - same
                tally.problems.append(f"{where}: task {task_id}: events.jsonl "
                                      f"({len(events)} B) and the capture ({len(capture)} B) "
                                      f"differ from byte {same}")
            if attempt.events_offset != len(events):
                tally.problems.append(f"{where}: task {task_id}: the engine ingested "
                                      f"{attempt.events_offset} of {len(events)} bytes")
        tally.double_starts += doubles
        # --- the ending
        if killed_here:
            if task.state not in (TaskState.FAILED, TaskState.KILLED) or not task.message \
                    or task.verdict not in ("crashed", "killed"):
                tally.problems.append(f"{where}: task {task_id} whose {target} was killed "
                                      f"ended {task.state.value}/{task.verdict}: "
                                      f"{task.message!r}")
        else:
            if task.state != TaskState.SUCCEEDED:
                tally.problems.append(f"{where}: task {task_id} ended {task.state.value}/"
                                      f"{task.verdict}: {task.message!r}")
            elif (Path(worktree) / "steps.txt").read_text() != STEPS:
                tally.problems.append(f"{where}: task {task_id}: steps.txt is "
                                      f"{(Path(worktree) / 'steps.txt').read_text()!r}")
            if len(attempts) != 1:
                tally.problems.append(f"{where}: task {task_id} has {len(attempts)} attempts")
    # --- processes left
    left = left_behind(list(tokens))
    if left:
        tally.processes_left += len(left)
        tally.problems.append(f"{where}: {len(left)} process(es) left: "
                              + "; ".join(" ".join(procs.cmdline(p))[:80] for p in left))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.timeout(60 + 90 * ROUNDS)
def test_chaos(target: str, claude_bin: str, chaos_endpoint: ScriptedEndpoint,
               tmp_path: Path) -> None:
    dirs = Dirs.under(tmp_path)
    wrapper = capture_wrapper(dirs.harness / "bin", claude_bin, dirs.captures)
    tally = Tally()
    monitors: list[Monitor] = []
    started = time.monotonic()
    load_before = load_average()
    base_seed = SEED + 1000 * TARGETS.index(target)
    # the test's own engine object: it submits and reads; its store stays open until the
    # scan, so the database's -wal file is there to be scanned
    fleet = make_fleet(settings_for(chaos_endpoint.url, str(wrapper), 4))
    for n in range(ROUNDS):
        chaos_round(target, n, base_seed + n, dirs, chaos_endpoint, wrapper, tally, monitors,
                    fleet)
    conclude(target, tally, monitors, dirs, chaos_endpoint, fleet,
             seeds=(base_seed, started, load_before))


def conclude(target: str, tally: Tally, monitors: list[Monitor], dirs: Dirs,
             endpoint: ScriptedEndpoint, fleet: Fleet, *,
             seeds: tuple[int, float, str], kept_in: Path | None = None) -> None:
    """A chaos test's figures and its verdict: the rounds' problems, two live runners of
    one task at once (the monitors), the secret scan."""
    base_seed, started, load_before = seeds
    for m in monitors:
        for task_id, count in m.max_runners.items():
            if count > 1:
                tally.double_starts += count - 1
                tally.problems.append(f"target {target}: task {task_id} had {count} live "
                                      "runners at once")
    note = (f"seeds {base_seed}..{base_seed + ROUNDS - 1}, {tally.tasks} tasks, "
            f"{time.monotonic() - started:.0f} s, load {load_before} -> {load_average()}")
    record(f"chaos {target}", "rounds", tally.rounds, "", note)
    record(f"chaos {target}", "double starts", tally.double_starts)
    record(f"chaos {target}", "bytes lost", tally.bytes_lost, "B",
           f"of {tally.bytes_captured} B captured")
    if target in ("runner", "host-runner", "sshd"):
        record(f"chaos {target}", "written after the runner died (no reader)",
               tally.not_copied_after_runner_death, "B")
    record(f"chaos {target}", "processes left", tally.processes_left)
    sent = [r.auth_sha256 for r in endpoint.message_requests()]
    tally.problems += secret_scan(f"chaos {target}", dirs, monitors, sent=sent,
                                  kept_in=kept_in)
    fleet.store.close()
    assert tally.rounds == ROUNDS and tally.tasks == ROUNDS * TASKS_PER_ROUND
    assert not tally.problems, "\n".join([*tally.problems, "kill points:", *tally.points])


# --- chaos on an SSH host ----------------------------------------------------------------------
#
# The same rounds, their tasks on a real sshd on 127.0.0.1 (tests/support/sshd.py, its data dir
# under
# the test's folder, so the secret scan reads the host's disk too), their engines
# tests/support/engine_child.py processes whose host is an SshHost, and the same audit. The faults:
# - host-runner / host-claude: the runner, or claude, SIGKILLed on the host (`kill` run there
#   over the host's master: host_kill) between claude's first and last turn;
# - connection: the host's ssh master SIGKILLed mid-run: the workers go on, the mirror
#   resumes from its offsets, every task succeeds with its events whole;
# - controller: the engine process SIGKILLed at a random point after its first claim, and a
#   fresh one started: it re-adopts the remote runners (one attempt each, claude started
#   once);
# - sshd: the host's sshd stopped (and the master cut) for longer than the lease: every task
#   ends lost with the reason; sshd started again, the engine sweeps the host: 0 processes
#   left with an attempt's token.

HOST_TARGETS = ("host-runner", "host-claude", "connection", "controller", "sshd")
HOST_LEASE = 3.0
HOST_SPAN = 5.0  # the controller dies this long (at most) after its first claim


@pytest.fixture
def chaos_host(tmp_path: Path) -> Iterator[Any]:
    """A test sshd under the test's folder (its HOME is scanned with the rest)."""
    server = start_sshd(tmp_path / "host", alias="fleet-chaos-host")
    try:
        yield server
    finally:
        if server.proc is not None:
            master(server).close()
        server.stop()


# The kill run on the host: over the host's master connection (a channel, ~10 ms). A
# connection of its own costs a handshake, 0.2-1 s on a loaded machine: after the last
# tool turn (the Bash step leaves 0.5 s) the kill landed at times once claude had printed
# its result (the task then succeeds: "finished ... the runner process died without an
# exit record") or had exited ("No such process"). A kill that comes too late is said,
# never taken for one in time: the runner is stopped first (it alone writes events.jsonl,
# in its cwd, the attempt folder) and killed only while no result line is there; claude's
# kill is late if the endpoint had its request for the last turn by then.
HOST_KILL = {
    "runner": ("kill -STOP {pid} 2>/dev/null || {{ echo 'runner gone'; exit 0; }}; "
               "if grep -q '\"type\": *\"result\"' /proc/{pid}/cwd/events.jsonl; then "
               "kill -CONT {pid}; echo 'the result was in events.jsonl already'; "
               "else kill -KILL {pid}; echo killed; fi"),
    "claude": "kill -KILL {pid} 2>/dev/null && echo killed || echo 'claude gone'",
}


def host_kill(server: Any, which: str, pid: int) -> str:
    """SIGKILL the runner or claude (`which`) on the host: "killed", or why not."""
    done = master(server).run(HOST_KILL[which].format(pid=int(pid)), timeout=30)
    return done.stdout.decode().strip()


def _worktree(fleet: Fleet, task_id: str) -> str:
    """The task's worktree on the host (known once the engine made it)."""
    return str(fleet.get_task(task_id).worktree or "")


def host_chaos_round(target: str, n: int, seed: int, dirs: Dirs, endpoint: ScriptedEndpoint,
                     wrapper: Path, tally: Tally, monitors: list[Monitor], fleet: Fleet,
                     server: Any) -> None:
    rng = random.Random(seed)
    where = f"seed {seed}, round {n}, target {target}"
    settings = settings_for(endpoint.url, str(wrapper), 4)
    repo = make_repo(dirs.base / f"round-{n}" / "repo")
    ids = [t.id for t in fleet.submit(TaskSpec(prompt=f"[script:chaos] round {n}", repo=repo),
                                      copies=TASKS_PER_ROUND)]
    name = f"{target}-{n}"
    release = dirs.base / f"round-{n}" / "release"
    # the host is this machine (the same-machine shortcut): the capturing wrapper is its claude
    extra: dict[str, Any] = {"ssh_host": host_config(
        server, lease=HOST_LEASE if target == "sshd" else 60.0, claude=str(wrapper))}
    if target == "sshd":
        extra["linger_until"] = str(release)  # the sweep happens once the host is back
    if target == "connection":
        # the endpoint is reached through a port forwarded over the master: a request made
        # before the mirror's reconnect forwards it again on a new master (its handshake:
        # 0.3-0.6 s here on a loaded machine) is refused and never reaches the endpoint; the
        # CLI retries it, as it does by default
        extra["env"] = {k: v for k, v in engine_env().items()
                        if k != "CLAUDE_CODE_MAX_RETRIES"}
    first = start_engine(dirs, f"{name}-engine", settings, ids, extra=extra)
    fresh: subprocess.Popen[bytes] | None = None
    victims: set[str] = set()
    point = ""
    started = time.monotonic()
    monitor = Monitor(dirs.base)
    monitors.append(monitor)

    def served(task_id: str, turn: int) -> bool:
        task = fleet.get_task(task_id)
        if task.state in FINISHED_STATES:
            raise RuntimeError(f"task {task_id} ended {task.state.value} before turn {turn}: "
                               f"{task.message}")
        worktree = _worktree(fleet, task_id)
        return bool(worktree) and _turns_seen(endpoint, worktree)[turn] > 0

    try:
        with monitor:
            engine = first
            if target == "controller":
                wait_until(lambda: any(fleet.get_task(i).state != TaskState.QUEUED
                                       for i in ids), 90, "the engine to claim a task")
                delay = rng.uniform(0, HOST_SPAN)
                time.sleep(delay)
                states = {i: fleet.get_task(i).state.value for i in ids}
                point = f"controller killed {delay:.2f} s after its first claim; states {states}"
                first.kill()
                first.wait()
                fresh = engine = start_engine(dirs, f"{name}-fresh", settings, ids, extra=extra)
            elif target == "sshd":
                wait_until(lambda: all(served(i, 0) for i in ids), 90, "turn 0 of every task")
                time.sleep(rng.uniform(0, 0.3 * STEP))
                cut = master(server).master_pid()
                assert cut is not None
                assert all(fleet.get_task(i).state == TaskState.RUNNING for i in ids)
                server.stop()
                os.kill(cut, signal.SIGKILL)
                victims = set(ids)
                point = "sshd stopped and the master cut while every task ran"
                wait_until(lambda: all(fleet.get_task(i).state in FINISHED_STATES
                                       for i in ids),
                           HOST_LEASE + 60, "the tasks to be lost")
                server.start()  # back, on its port: the engine sweeps what was lost
                left_behind(list(tokens_of(fleet, ids)), grace=60)
                release.touch()
            elif target == "connection":
                victim = ids[rng.randrange(len(ids))]
                turn = rng.randrange(0, TOOL_TURNS)
                wait_until(lambda: served(victim, turn), 90, f"turn {turn} of {victim}")
                delay = rng.uniform(0, 0.6 * STEP)
                time.sleep(delay)
                cut = master(server).master_pid()
                assert cut is not None
                point = f"the master (pid {cut}) killed {delay:.2f} s after turn {turn}"
                os.kill(cut, signal.SIGKILL)
            else:
                which = target.removeprefix("host-")
                victim = ids[rng.randrange(len(ids))]
                turn = rng.randrange(-1, TOOL_TURNS)
                delay = rng.uniform(0, 0.6 * STEP)
                if turn < 0:
                    wait_until(lambda: _victim_pid(fleet, victim, which) is not None, 90,
                               "claude to start")
                else:
                    wait_until(lambda: served(victim, turn), 90, f"turn {turn} of {victim}")
                time.sleep(delay)
                pid = _victim_pid(fleet, victim, which)  # the mirrored runner.json
                assert pid is not None
                point = (f"{which} of {victim} (pid {pid}) killed on the host {delay:.2f} s "
                         "after " + ("claude started" if turn < 0 else f"turn {turn}"))
                said = host_kill(server, which, pid)
                if said == "killed" and which == "claude" \
                        and _turns_seen(endpoint, _worktree(fleet, victim))[TOOL_TURNS]:
                    # asked for its last turn before it died: it may have had the answer
                    said = "claude asked for its last turn before the kill"
                if said != "killed":
                    raise RuntimeError(f"the kill came after the worker's end: {said}")
                victims = {victim}
            code = engine.wait(timeout=240)
            if code != 0:
                tally.problems.append(f"{where}: the finishing engine exited {code} "
                                      f"(see {dirs.outputs})")
        tally.points.append(f"{where}: {point}")
        audit(fleet, ids, victims, target, where, endpoint, dirs, tally,
              prefix_ok=target in ("host-runner", "sshd"))
        for task_id in victims:
            message = fleet.get_task(task_id).message or ""
            if target == "sshd" and not message.startswith("lost: host box unreachable"):
                tally.problems.append(f"{where}: task {task_id} ended {message!r}, not lost")
        env = cli_env(endpoint.url, str(wrapper), 4)
        cli(env, repo, dirs.outputs / f"{name}.cli", "ls", "--json")
        cli(env, repo, dirs.outputs / f"{name}.cli", "logs", ids[0], "--raw")
    except Exception as exc:  # this round's failure, with its seed; the next rounds go on
        tally.problems.append(f"{where}: {type(exc).__name__}: {exc}; "
                              f"point: {point or 'not reached'}")
    finally:
        release.touch()
        for proc in (first, fresh):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        if server.proc is None:
            server.start()
        kill_leftovers(list(tokens_of(fleet, ids)), dirs.base)
        tally.rounds += 1
        record(f"chaos {target}", f"round {n} (seed {seed})",
               round(time.monotonic() - started, 1), "s", point, detail=True)


@pytest.mark.parametrize("target", HOST_TARGETS)
@pytest.mark.timeout(90 + 120 * ROUNDS)
def test_chaos_on_a_host(target: str, claude_bin: str, chaos_endpoint: ScriptedEndpoint,
                         chaos_host: Any, tmp_path: Path) -> None:
    dirs = Dirs.under(tmp_path)
    wrapper = capture_wrapper(dirs.harness / "bin", claude_bin, dirs.captures)
    tally = Tally()
    monitors: list[Monitor] = []
    started = time.monotonic()
    load_before = load_average()
    base_seed = SEED + 500 + 1000 * HOST_TARGETS.index(target)
    fleet = make_fleet(settings_for(chaos_endpoint.url, str(wrapper), 4))
    for n in range(ROUNDS):
        host_chaos_round(target, n, base_seed + n, dirs, chaos_endpoint, wrapper, tally,
                         monitors, fleet, chaos_host)
    # the host keeps the key (its workers go straight to the endpoint, as the suite's do)
    conclude(target, tally, monitors, dirs, chaos_endpoint, fleet,
             seeds=(base_seed, started, load_before),
             kept_in=chaos_host.home / ".fleet-tui-host" / "keys")


# --- ingest load -----------------------------------------------------------------------------


def expected_summary(data: bytes) -> tuple[int, int, int, int]:
    """(lines, turns, input tokens, output tokens) of a stream, counted with json alone:
    turns are the distinct assistant message ids, tokens each message's usage once."""
    usage: dict[str, tuple[int, int]] = {}
    lines = 0
    for line in data.splitlines():
        lines += 1
        obj = json.loads(line)
        if obj.get("type") == "assistant":
            msg = obj["message"]
            usage[msg["id"]] = (msg["usage"]["input_tokens"], msg["usage"]["output_tokens"])
    return (lines, len(usage), sum(u[0] for u in usage.values()),
            sum(u[1] for u in usage.values()))


@pytest.mark.timeout(240 + 4 * SECONDS + 2 * WORKERS)
def test_ingest_load(tmp_path: Path) -> None:
    dirs = Dirs.under(tmp_path)
    count = RATE * SECONDS  # lines each worker writes
    wrapper = stream_wrapper(dirs.harness / "bin", RATE, count, dirs.captures)
    settings = settings_for("http://127.0.0.1:9", str(wrapper), WORKERS)
    repo = make_repo(dirs.base / "repo")
    fleet = make_fleet(settings)
    ids = [t.id for t in fleet.submit(TaskSpec(prompt="stream", repo=repo), copies=WORKERS)]
    report = dirs.outputs / "engine-report.json"
    load_before = load_average()
    started = time.monotonic()
    monitor = Monitor(dirs.base)
    engine = start_engine(dirs, "load-engine", settings, ids, report=report,
                          timeout=120 + 4 * SECONDS + 2 * WORKERS)
    problems: list[str] = []
    tokens: dict[str, str] = {}
    try:
        with monitor:
            code = engine.wait(timeout=180 + 4 * SECONDS + 2 * WORKERS)
        ended_at = time.time()
        elapsed = time.monotonic() - started
        if code != 0:
            problems.append(f"the engine exited {code} (see {dirs.outputs / 'load-engine.log'})")
        tokens = tokens_of(fleet, ids)
        dropped = mismatched = written = 0
        rates: list[float] = []
        last_write = 0.0
        for task_id in ids:
            task = fleet.get_task(task_id)
            (attempt,) = fleet.attempts(task_id)
            token = spec_token(Path(attempt.dir or ""))
            events = (Path(attempt.dir or "") / EVENTS_FILE).read_bytes()
            capture = (dirs.captures / f"{token}.stdout").read_bytes()
            timing = json.loads((dirs.captures / f"{token}.timing").read_text())
            lines, turns, in_tok, out_tok = expected_summary(capture)
            written += lines
            dropped += lines - events.count(b"\n")
            if events != capture:
                mismatched += 1
                problems.append(f"task {task_id}: events.jsonl ({len(events)} B) differs from "
                                f"what the stand-in wrote ({len(capture)} B) from byte "
                                f"{common_prefix(events, capture)}")
            if lines != count:
                problems.append(f"task {task_id}: the stand-in wrote {lines} lines, not {count}")
            if task.state != TaskState.SUCCEEDED:
                problems.append(f"task {task_id} ended {task.state.value}: {task.message!r}")
            if attempt.events_offset != len(events):
                problems.append(f"task {task_id}: the engine ingested {attempt.events_offset} "
                                f"of {len(events)} bytes")
            if (task.turns, task.input_tokens, task.output_tokens) != (turns, in_tok, out_tok):
                problems.append(f"task {task_id}: stored turns/tokens "
                                f"{(task.turns, task.input_tokens, task.output_tokens)}, the "
                                f"lines add up to {(turns, in_tok, out_tok)}")
            last_write = max(last_write, timing["last"])
            span = timing["last"] - timing["first"]
            rates.append((lines - 1) / span if span > 0 else float("inf"))
        left = left_behind(list(tokens))
        if left:
            problems.append(f"{len(left)} process(es) left: {left}")
        figures = json.loads(report.read_text()) if report.exists() else {}
        if not figures:
            problems.append("the engine wrote no report")
        ingested = figures.get("ingested_events")
        if ingested is not None and ingested != written:
            problems.append(f"the engine counted {ingested} events, the workers wrote {written}")
        note = (f"{WORKERS} workers x {RATE}/s x {SECONDS} s; {elapsed:.0f} s in all; "
                f"load {load_before} -> {load_average()}")
        record("ingest load", "events written", written, "", note)
        record("ingest load", "events dropped", dropped, "",
               f"{mismatched} files differ from the stand-in's copy")
        record("ingest load", "slowest worker's rate", round(min(rates), 1), "events/s",
               f"asked {RATE}/s (late lines go at once)", combine="min")
        record("ingest load", "events the engine counted", ingested, "",
               "Fleet.ingested_events")
        record("ingest load", "last write to engine done", round(ended_at - last_write, 1),
               "s", "the runs' ends, the last reads and the engine's exit", combine="max")
        record("ingest load", "engine peak memory (VmHWM)",
               round((figures.get("vm_hwm_kib") or 0) / 1024, 1), "MiB",
               f"final RSS {(figures.get('vm_rss_kib') or 0) / 1024:.1f} MiB", combine="max")
        record("ingest load", "processes left", len(left))
        problems += secret_scan("ingest load", dirs, [monitor], sent=None)
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
        kill_leftovers(list(tokens), dirs.base)
        fleet.store.close()
    assert not problems, "\n".join(problems[:20])
