"""Benchmark 3: resident memory of the panel after 1,000,000 events across 50 tasks.

Each run is a fresh process (so nothing else inflates its memory) that opens the real panel
headless (FleetApp.run_test, scheduler on) on a store of 50 running tasks whose events
files already hold 20,000 real stream-json lines each (their runner is a stand-in process
that stays alive, so the engine follows them as running work). Once the engine has read
every file to its end and the stream view has caught up with the selected task, the process
reports VmRSS and VmHWM (the peak). The same process with the same 50 tasks and empty
files is the baseline, measured in the same run just before, so the delta is what the
events cost. Budget: VmRSS at most RSS_BUDGET times the baseline's (median of the per-run
ratios; the absolute sizes are context).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import REPO_ROOT, BenchResult, Figure, bench_env, make_repo
from bench.fleetfix import make_running_tasks, session_lines, start_writer, stop_writer

CHILD = "from bench.memory import child_main; child_main()"
RSS_BUDGET = 1.5  # quiet: 1.10 (62.3 ÷ 56.7 MB, old RESULTS.md)


def _status_kib(name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return 0


async def _child(db: Path, repo: Path, total_bytes: int, tasks: int) -> dict[str, Any]:
    from bench.apphelp import wait_until
    from bench.panel import engine_offsets
    from fleet_tui.engine.fleet import Fleet
    from fleet_tui.settings.config import load_settings
    from fleet_tui.store.db import Store
    from fleet_tui.ui.app import FleetApp
    from fleet_tui.ui.widgets.stream_view import StreamView
    from fleet_tui.ui.widgets.task_table import TaskTable

    fleet = Fleet(load_settings(), Store(db))
    app = FleetApp(fleet, repo=repo, default_base="main", run_scheduler=True, bell=False)
    t0 = time.perf_counter()
    async with app.run_test(size=(160, 50)) as pilot:
        table = app.main.query_one(TaskTable)
        view = app.main.query_one(StreamView)
        await wait_until(lambda: table.row_count == tasks, timeout=60)
        await wait_until(lambda: engine_offsets(fleet) >= total_bytes, timeout=900, poll=0.05)
        ingest_s = time.perf_counter() - t0
        rows = -1
        # the selected task's stream view: wait until it stops growing
        while rows != view.total_rows:
            rows = view.total_rows
            await asyncio.sleep(0.5)
        await pilot.pause()
        rss = _status_kib("VmRSS")
        hwm = _status_kib("VmHWM")
        await app.action_quit()
    return {"rss_kib": rss, "hwm_kib": hwm, "ingest_s": ingest_s, "stream_rows": rows}


def child_main() -> None:
    args = json.loads(sys.argv[1])
    result = asyncio.run(_child(Path(args["db"]), Path(args["repo"]), int(args["bytes"]),
                                int(args["tasks"])))
    sys.stdout.write(json.dumps(result) + "\n")


def _measure(tasks: int, per_task: int) -> dict[str, Any]:
    with bench_env() as benv:
        repo = make_repo(benv.root / "repo")
        benv.fleet_home.mkdir(parents=True, exist_ok=True)
        runner = start_writer(benv.env)  # idle: it only stands in as the live runner
        try:
            db = benv.fleet_home / "fleet.db"
            files = make_running_tasks(db, repo, tasks, runner.pid)
            if per_task:
                blob = b"".join(line + b"\n" for line in session_lines(per_task))
                for path in files:
                    path.write_bytes(blob)
            total = sum(os.path.getsize(f) for f in files)
            arg = json.dumps({"db": str(db), "repo": str(repo), "bytes": total,
                              "tasks": tasks})
            done = subprocess.run([sys.executable, "-c", CHILD, arg], env=benv.env,
                                  cwd=REPO_ROOT, capture_output=True, timeout=1800,
                                  check=False)
        finally:
            stop_writer(runner)
    if done.returncode != 0:
        raise RuntimeError(f"memory child failed: {done.stderr.decode(errors='replace')[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    result["bytes"] = total
    return result


def run(smoke: bool = False, runs: int | None = None) -> BenchResult:
    runs = runs or (1 if smoke else 3)
    tasks, per_task = (3, 200) if smoke else (50, 20_000)
    rss: list[float] = []
    hwm: list[float] = []
    base: list[float] = []
    delta: list[float] = []
    ingest: list[float] = []
    gb = 0.0
    for _ in range(runs):
        empty = _measure(tasks, 0)
        full = _measure(tasks, per_task)
        rss.append(full["rss_kib"] / 1024)
        hwm.append(full["hwm_kib"] / 1024)
        base.append(empty["rss_kib"] / 1024)
        delta.append((full["rss_kib"] - empty["rss_kib"]) / 1024)
        ingest.append(tasks * per_task / full["ingest_s"])
        gb = full["bytes"] / 1e9
    figures = [
        Figure("memory.ratio", "resident size after every event ÷ with empty files", "×",
               [r / b for r, b in zip(rss, base, strict=True)], budget=RSS_BUDGET,
               per="pair", baseline="memory.baseline"),
        Figure("memory.rss", "resident size after ingesting every event", "MB", rss,
               note=f"{tasks} tasks × {per_task:,} events ({gb:.2f} GB of events files)"),
        Figure("memory.hwm", "peak resident size (VmHWM)", "MB", hwm),
        Figure("memory.baseline", "same panel, same tasks, empty files (baseline)", "MB",
               base),
        Figure("memory.delta", "what the events cost (rss − baseline)", "MB", delta),
        Figure("memory.ingest", "ingest rate of the backlog at start-up", "events/s",
               ingest, better="higher", note="from app start, so it includes start-up"),
    ]
    return BenchResult("memory", "3. Memory", figures,
                       ["MB = MiB (VmRSS / 1024 from /proc/self/status of the panel "
                        "process)"])
