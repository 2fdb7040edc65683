"""Benchmark 4: `fleet-tui` to its first frame, with 1,000 tasks in three repositories and
10,000 attempts stored, against a bare Textual app that shows one label — in the same run,
on a real terminal.

Both programs run in a pseudo-terminal (160×50, TERM=xterm-256color), exactly as a user
starts them: `fleet-tui` is the installed console script, the bare app `python -c` with the
same interpreter. The time is taken from just before the spawn to the moment the terminal
receives the frame: for the bare app its label; for fleet-tui the first frame of the main
screen (the task table's header "last tool") and, separately, the first
frame that shows stored task titles (the list is read in a thread after the first frame).
Budget: first frame at most 1.4 times the bare app (median of the per-pair ratios).

Also, from the same store: `Store.list_tasks()` of all 1,000 tasks, as the panel's first
read does, against the bare query it runs (`sqlite3`, the same SELECT, rows left as
tuples), alternating. Budget: at most LIST_BUDGET times the bare query (tests/store/test_store.py
checks the behaviour).

Both programs start from compiled bytecode, as they do after any install (pip compiles
what it installs): before timing, `python -m compileall` runs over the fleet_tui package
and the interpreter's site-packages (Textual, Rich, GitPython, ...), and the children run
without PYTHONDONTWRITEBYTECODE (a development shell may set it; then fleet_tui's own
modules, which live in the checkout, would be compiled again on every start while
Textual's came precompiled — a cost no installed copy pays).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import select
import signal
import sqlite3
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from bench.common import BenchEnv, BenchResult, Figure, bench_env, make_repo, ms

COLS, ROWS = 160, 50
BARE_APP = """\
from textual.app import App
from textual.widgets import Label

class Bare(App):
    def compose(self):
        yield Label("bench-ready")

Bare().run()
"""
TITLE_PREFIX = "benchtask"
STARTUP_BUDGET = 1.4
LIST_BUDGET = 12.0  # 7.0 on a busy machine (bench/RESULTS.md)


def populate_store(db: Path, repos: list[Path], tasks: int, attempts_per_task: int) -> None:
    """Fill a real fleet-tui database (created and migrated by Store) with finished tasks
    and their attempts, in one transaction (the Store API commits per row, which would
    make the setup slower than the benchmark). The tasks take turns among ``repos`` (more
    than one: the list shows its repository column)."""
    from fleet_tui.store.db import (
        ATTEMPT_COLUMNS,
        TASK_COLUMNS,
        Attempt,
        Store,
        Task,
        TaskState,
        to_db,
    )

    Store(db).close()  # schema, migrations, WAL
    states = [TaskState.MERGED, TaskState.MERGED, TaskState.DISCARDED, TaskState.SUCCEEDED,
              TaskState.FAILED, TaskState.MERGED, TaskState.KILLED, TaskState.MERGED]
    now = time.time()
    task_cols = list(TASK_COLUMNS)
    att_cols = [name for name in ATTEMPT_COLUMNS if name != "id"]
    task_rows = []
    att_rows = []
    for i in range(tasks):
        tid = f"t{i:05d}"
        repo = repos[i % len(repos)]
        created = now - (tasks - i) * 60
        state = states[i % len(states)]
        task = Task(id=tid, prompt=f"{TITLE_PREFIX} {i}: refactor module {i} and add tests",
                    repo=repo, title=f"{TITLE_PREFIX} {i:04d} refactor module {i}",
                    base_branch="main", base_commit="0" * 40, branch=f"fleet/{tid}",
                    endpoint="https://api.z.ai/api/anthropic", model="main", state=state,
                    verdict="ok" if state != TaskState.FAILED else "crashed",
                    message="done", created_at=created, updated_at=created + 50,
                    started_at=created + 1, finished_at=created + 50,
                    attempt_count=attempts_per_task, session_id=f"session-{i}", turns=12,
                    input_tokens=12000 + i, output_tokens=3400 + i,
                    last_tool=f"Bash pytest -q tests/test_mod_{i}.py",
                    added_lines=i % 300, deleted_lines=i % 70)
        task_rows.append([to_db(name, getattr(task, name)) for name in task_cols])
        for n in range(1, attempts_per_task + 1):
            adir = repo / ".fleet-work" / ".logs" / tid / str(n)
            att = Attempt(id=0, task_id=tid, n=n, kind="fresh" if n == 1 else "resume",
                          prompt="continue", model="GLM-5.2", runner_pid=100000 + n,
                          dir=adir, events_path=adir / "events.jsonl",
                          stderr_path=adir / "stderr.log", exit_path=adir / "exit.json",
                          started_at=created + n, finished_at=created + n + 5, exit_code=0,
                          verdict="ok", message="done", turns=3, input_tokens=3000,
                          output_tokens=800, session_id=f"session-{i}",
                          last_tool="Edit src/app.py", events_offset=4096)
            att_rows.append([to_db(c, getattr(att, c)) for c in att_cols])
    conn = sqlite3.connect(db)
    with conn:
        conn.executemany(f"INSERT INTO tasks ({', '.join(task_cols)}) VALUES "
                         f"({', '.join('?' for _ in task_cols)})", task_rows)
        conn.executemany(f"INSERT INTO attempts ({', '.join(att_cols)}) VALUES "
                         f"({', '.join('?' for _ in att_cols)})", att_rows)
    conn.close()


def time_to_marks(argv: list[str], env: dict[str, str], cwd: Path, marks: list[bytes],
                  timeout: float = 60.0) -> list[float]:
    """Seconds from spawn until each of `marks` has reached the terminal, in order."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd,
                            start_new_session=True, close_fds=True)
    os.close(slave)
    seen = b""
    found: list[float] = []
    try:
        deadline = t0 + timeout
        while len(found) < len(marks):
            left = deadline - time.perf_counter()
            if left <= 0:
                raise TimeoutError(f"{argv[0]} painted no {marks[len(found)]!r} in {timeout} s;"
                                   f" last output {seen[-400:]!r}")
            ready, _, _ = select.select([master], [], [], min(left, 0.05))
            if not ready:
                if proc.poll() is not None:
                    raise RuntimeError(f"{argv[0]} exited ({proc.returncode}): "
                                       f"{seen[-800:].decode(errors='replace')}")
                continue
            try:
                data = os.read(master, 1 << 16)
            except OSError:
                data = b""
            if not data:
                raise RuntimeError(f"{argv[0]} closed the terminal: {seen[-800:]!r}")
            now = time.perf_counter()
            seen = seen[-4096:] + data
            while len(found) < len(marks) and marks[len(found)] in seen:
                found.append(now - t0)
    finally:
        # our own child, by its process group: it is a full-screen app waiting for keys
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        os.close(master)
    return found


BARE_LIST = "SELECT * FROM tasks WHERE archived_at IS NULL ORDER BY created_at DESC, id"


def _bare_list(db: Path, expect: int) -> float:
    """Seconds for the bare query list_tasks runs, its connection opened first."""
    conn = sqlite3.connect(db)
    try:
        conn.execute(BARE_LIST + " LIMIT 1").fetchall()
        t0 = time.perf_counter()
        rows = conn.execute(BARE_LIST).fetchall()
        took = time.perf_counter() - t0
    finally:
        conn.close()
    if len(rows) != expect:
        raise RuntimeError(f"the bare query returned {len(rows)} rows of {expect}")
    return took


def time_list_tasks(db: Path, runs: int, expect: int) -> tuple[list[float], list[float]]:
    """(ms for `Store.list_tasks()` of the whole store, ms for the bare query), alternating
    (a Store or connection per run, opened by a one-row read before the timed one)."""
    from fleet_tui.store.db import Store

    out: list[float] = []
    bare: list[float] = []
    for i in range(runs):
        if i % 2:
            bare.append(ms(_bare_list(db, expect)))
        store = Store(db)
        try:
            store.list_tasks(limit=1)
            t0 = time.perf_counter()
            got = store.list_tasks()
            out.append(ms(time.perf_counter() - t0))
        finally:
            store.close()
        if len(got) != expect:
            raise RuntimeError(f"list_tasks returned {len(got)} tasks of {expect}")
        if not i % 2:
            bare.append(ms(_bare_list(db, expect)))
    return out, bare


def _fleet_tui_command() -> list[str]:
    script = Path(sys.executable).parent / "fleet-tui"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from fleet_tui.cli import main; sys.exit(main())"]


def precompile() -> None:
    """Compile fleet_tui and site-packages to bytecode (up-to-date files are skipped)."""
    import sysconfig

    package = Path(__file__).resolve().parent.parent / "fleet_tui"
    dirs = [str(package), sysconfig.get_paths()["purelib"]]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *dirs], check=True,
                   stdout=subprocess.DEVNULL, timeout=300)


REPOSITORIES = 3  # a long list of several repositories (hide, sort, repo column)


def _setup(benv: BenchEnv, tasks: int, attempts: int) -> Path:
    """The store's tasks in REPOSITORIES repositories; the panel starts in the first."""
    repos = [make_repo(benv.root / ("repo" if n == 0 else f"repo{n + 1}"))
             for n in range(REPOSITORIES)]
    benv.fleet_home.mkdir(parents=True, exist_ok=True)
    populate_store(benv.fleet_home / "fleet.db", repos, tasks, attempts)
    return repos[0]


def run(smoke: bool = False, runs: int | None = None) -> BenchResult:
    runs = runs or (1 if smoke else 9)
    tasks, per_task = (20, 2) if smoke else (1000, 10)
    with bench_env() as benv:
        repo = _setup(benv, tasks, per_task)
        env = {**benv.env, "TERM": "xterm-256color", "COLUMNS": str(COLS),
               "LINES": str(ROWS)}
        env.pop("NO_COLOR", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # see the module docstring
        precompile()
        fleet_cmd = _fleet_tui_command()
        bare_cmd = [sys.executable, "-c", BARE_APP]
        fleet_marks = [b"last tool", TITLE_PREFIX.encode()]
        if not smoke:  # one untimed start of each: page cache, pyc files
            time_to_marks(fleet_cmd, env, repo, fleet_marks)
            time_to_marks(bare_cmd, env, repo, [b"bench-ready"])
        list_ms, bare_list_ms = time_list_tasks(benv.fleet_home / "fleet.db", runs, tasks)
        first: list[float] = []
        listed: list[float] = []
        bare: list[float] = []
        ratio: list[float] = []
        for i in range(runs):
            if i % 2 == 0:
                f = time_to_marks(fleet_cmd, env, repo, fleet_marks)
                b = time_to_marks(bare_cmd, env, repo, [b"bench-ready"])[0]
            else:
                b = time_to_marks(bare_cmd, env, repo, [b"bench-ready"])[0]
                f = time_to_marks(fleet_cmd, env, repo, fleet_marks)
            first.append(ms(f[0]))
            listed.append(ms(f[1]))
            bare.append(ms(b))
            ratio.append(f[0] / b)
    figures = [
        Figure("startup.ratio", "fleet-tui first frame ÷ bare Textual app", "×", ratio,
               budget=STARTUP_BUDGET, per="pair", baseline="startup.bare",
               note=f"{tasks:,} tasks in {REPOSITORIES} repositories, {tasks * per_task:,} "
                    "attempts"),
        Figure("startup.first_frame", "fleet-tui: spawn → first frame", "ms", first),
        Figure("startup.listed", "fleet-tui: spawn → task titles on screen", "ms", listed,
               note="the task list is read in a thread after the first frame; closed "
               "tasks hidden, a repository column"),
        Figure("startup.bare", "bare Textual app: spawn → its label (baseline)", "ms", bare),
        Figure("startup.list_ratio", "Store.list_tasks() ÷ the bare sqlite3 query", "×",
               [t / b for t, b in zip(list_ms, bare_list_ms, strict=True)],
               budget=LIST_BUDGET, per="pair", baseline="startup.list_bare",
               note="Task objects from the rows, against the rows as tuples"),
        Figure("startup.list_tasks", "Store.list_tasks() of every stored task", "ms",
               list_ms, note=f"{tasks:,} tasks, {tasks * per_task:,} attempts"),
        Figure("startup.list_bare", "bare sqlite3 SELECT of the same rows (baseline)", "ms",
               bare_list_ms),
    ]
    return BenchResult("startup", "4. Start-up", figures,
                       [f"terminal {COLS}×{ROWS} (a pty); fleet-tui run as {fleet_cmd[0]} in "
                        "a git repository, scheduler on (nothing to schedule)"])
