"""Running tasks for the panel and memory benchmarks, and the process that writes them.

The store gets tasks in the `running` state, each with one attempt whose directory holds
the files a runner leaves (`spec.json` is not needed by the panel; `launch.json` names the
runner) and whose `events.jsonl` is appended to by a stand-in runner: one process, named in
every attempt as its runner, that writes real stream-json lines (bench.parser.build_mix) to
every file as fast as it can once told to go. The engine in the panel follows these
attempts exactly as it follows real ones (by runner pid and /proc start time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import REPO_ROOT

WRITER_CODE = "from bench.fleetfix import writer_main; writer_main()"


def make_running_tasks(db: Path, repo: Path, count: int, runner_pid: int) -> list[Path]:
    """`count` running tasks with one attempt each; returns their events.jsonl paths."""
    from fleet_tui.execution.worker.attemptlog import write_json_atomic
    from fleet_tui.store.db import Store, TaskState
    from fleet_tui.system import paths, procs

    store = Store(db)
    now = time.time()
    start = procs.start_time(runner_pid)
    events: list[Path] = []
    for i in range(count):
        tid = f"run{i:03d}"
        store.create_task(prompt=f"worker {i}: implement feature {i}", repo=repo, task_id=tid,
                          title=f"streaming worker {i:03d}", state=TaskState.RUNNING,
                          base_commit="0" * 40, base_branch="main", started_at=now,
                          endpoint="https://api.z.ai/api/anthropic", now=now + i * 1e-3)
        adir = paths.attempt_dir(repo, tid, 1)
        adir.mkdir(parents=True, exist_ok=True)
        path = adir / "events.jsonl"
        path.touch()
        write_json_atomic(adir / "launch.json", {"runner_pid": runner_pid,
                                                 "runner_start": start, "started_at": now,
                                                 "owner": "bench"})
        store.add_attempt(tid, kind="fresh", prompt="go", now=now, model="GLM-5.2",
                          runner_pid=runner_pid, dir=adir, events_path=path,
                          stderr_path=adir / "stderr.log", exit_path=adir / "exit.json")
        events.append(path)
    store.close()
    return events


def session_lines(n: int) -> list[bytes]:
    """n real stream-json lines in session order (see bench.parser.build_mix)."""
    from bench.parser import build_mix

    return build_mix(n)


def start_writer(env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The stand-in runner process; it waits for a job on stdin (see writer_main)."""
    return subprocess.Popen([sys.executable, "-c", WRITER_CODE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env={**env, "PYTHONPATH": str(REPO_ROOT)},
                            cwd=REPO_ROOT)


def send_job(proc: subprocess.Popen[bytes], files: list[Path], per_file: int,
             lines_per_write: int = 1) -> None:
    assert proc.stdin is not None
    job = {"files": [str(f) for f in files], "per_file": per_file,
           "lines_per_write": lines_per_write}
    proc.stdin.write((json.dumps(job) + "\n").encode())
    proc.stdin.flush()


def wait_done(proc: subprocess.Popen[bytes], timeout: float = 300.0) -> dict[str, float]:
    """The writer's report once it has written everything (it stays alive: it is the
    runner of every attempt, and a dead runner would end them)."""
    assert proc.stdout is not None
    import select

    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise TimeoutError("the writer did not finish in time")
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the writer died ({proc.poll()})")
    report: dict[str, float] = json.loads(line)
    return report


def stop_writer(proc: subprocess.Popen[bytes]) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def writer_main() -> None:
    """Stand-in runner: for each JSON job on stdin, append `per_file` real lines to every
    file, round-robin, `lines_per_write` lines per write(2), as fast as it can; then print
    {"seconds": …, "bytes": …}. Exits when stdin closes."""
    for raw in sys.stdin:
        job = json.loads(raw)
        files = job["files"]
        per_file = int(job["per_file"])
        step = max(1, int(job.get("lines_per_write", 1)))
        lines = session_lines(per_file)
        fds = [os.open(f, os.O_WRONLY | os.O_APPEND) for f in files]
        chunks = [b"".join(line + b"\n" for line in lines[i:i + step])
                  for i in range(0, len(lines), step)]
        t0 = time.perf_counter()
        written = 0
        for chunk in chunks:
            for fd in fds:
                written += os.write(fd, chunk)
        took = time.perf_counter() - t0
        for fd in fds:
            os.close(fd)
        sys.stdout.write(json.dumps({"seconds": took, "bytes": written}) + "\n")
        sys.stdout.flush()
