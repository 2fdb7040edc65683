"""Benchmark 2: the panel under load — 20 workers' event files growing as fast as they can,
100,000 events in all, into the running app (FleetApp, headless, scheduler on).

The store holds 20 running tasks whose runner is one stand-in process (bench.fleetfix) that
appends real stream-json lines to the 20 `events.jsonl` files, one line per write, round
robin, as fast as it can. In the app, the engine's scheduler thread (`Fleet.run`, as the
panel starts it) follows every attempt and the stream view follows the selected one.

- Drain rate: events ingested by the app per second, from the writer's start to the moment
  the engine has read every file to its end. Baseline, in the same run right after the
  drain: a bare read of the same files, `json.loads` of every line. Budget: at least
  DRAIN_BUDGET times the bare rate (median of the per-run ratios).
- Key latency while it drains: `down`/`up` sent every 50 ms the way a terminal driver sends
  them, each timed to the first painted frame that shows the table cursor moved. The
  baseline: the same presses on the idle panel of the same run, half before the drain and
  half after it. Budget: the run's p99 while draining at most KEY_BUDGET times the run's
  idle p99 (median over the runs). A run in which no press came back before the end of
  the drain has no sample: "no measurement", a failure.
- The stream view on its own taking a flood: 50,000 rows appended in batches of 5,000,
  against the same rows' text written in the same batches to Textual's own `Log` in a
  bare app, alternating. Budget: at most FLOOD_BUDGET times the bare `Log`
  (tests/ui/test_ui_views.py checks the behaviour).

The ingestion counter is the engine's own (`Fleet.ingested_bytes`: the bytes of events files
it has folded in; the attempts here never finish, so it is the sum of their read offsets);
the stream view's `total_rows` is public.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from bench.apphelp import FrameProbe, WidgetApp, send_key
from bench.common import BenchResult, Figure, bench_env, make_repo, ms, quantile
from bench.fleetfix import make_running_tasks, send_job, start_writer, stop_writer, wait_done

PRESS_EVERY = 0.05
FLOOD_ROWS, FLOOD_BATCH = 50_000, 5_000
# medians seen (bench/RESULTS.md; 2026-12-01, a busy machine): drain 0.34, key 1.8 (3.2 on
# a quiet machine: 152 ÷ 48 ms), flood 1.67
DRAIN_BUDGET = 0.15
KEY_BUDGET = 5.0
FLOOD_BUDGET = 3.0


def _flood_events(rows: int) -> list[Any]:
    from fleet_tui.core import stream

    events: list[stream.Event] = []
    for i in range(rows // 2):
        events.append(stream.ToolUse(line_no=2 * i, id=f"t{i}", name="Bash", input={},
                                     summary=f"Bash echo {i}"))
        events.append(stream.ToolResult(line_no=2 * i + 1, tool_use_id=f"t{i}",
                                        first_line=str(i)))
    return events


async def bare_flood(rows: int, batch: int) -> float:
    """Seconds for a bare `Log` to take the same rows' text in the same batches."""
    from textual.widgets import Log

    events = _flood_events(rows)
    texts = [getattr(e, "summary", "") or getattr(e, "first_line", "") for e in events]
    log = Log()
    app = WidgetApp(log)
    async with app.run_test(size=(120, 40)) as pilot:
        start = time.perf_counter()
        for chunk in range(0, len(texts), batch):
            log.write_lines(texts[chunk:chunk + batch])
            await pilot.pause()
        took = time.perf_counter() - start
        if log.line_count < len(texts):
            raise RuntimeError(f"the bare Log holds {log.line_count} of {len(texts)} lines")
    return took


def bare_read(files: list[Path]) -> tuple[int, float]:
    """(lines, seconds) for a bare read of `files`, `json.loads` of every line."""
    import json

    loads = json.loads
    n = 0
    t0 = time.perf_counter()
    for path in files:
        with open(path, "rb") as fh:
            for line in fh:
                if line.strip():
                    loads(line)
                    n += 1
    return n, time.perf_counter() - t0


async def stream_flood(rows: int, batch: int) -> float:
    """Seconds for the stream view to take `rows` rows (half tool calls, half their results)
    in batches of `batch`: each batch formatted, appended, and the app given a turn."""
    from fleet_tui.ui.formatting import StreamFormatter
    from fleet_tui.ui.widgets.stream_view import StreamView

    events = _flood_events(rows)
    formatter = StreamFormatter()
    view = StreamView()
    app = WidgetApp(view)
    async with app.run_test(size=(120, 40)) as pilot:
        start = time.perf_counter()
        for chunk in range(0, len(events), batch):
            view.append_rows(formatter.rows(events[chunk:chunk + batch]))
            await pilot.pause()
        took = time.perf_counter() - start
        if view.row_count() != len(events) or not view.is_vertical_scroll_end:
            raise RuntimeError(f"the stream view holds {view.row_count()} rows of "
                               f"{len(events)}, or stopped following")
    return took


def engine_offsets(fleet: Any) -> int:
    """Bytes of events the engine has read, over every followed attempt."""
    return int(fleet.ingested_bytes)


async def _press(app: Any, probe: FrameProbe, key: str, expect: int) -> float:
    t0 = send_key(app, key)
    frame = await probe.wait_frame(t0, lambda seen: bool(seen == expect), timeout=10.0)
    return frame.at - t0


async def _press_loop(app: Any, probe: FrameProbe, table: Any, until: Any, out: list[float],
                      limit: int | None = None) -> None:
    """Alternate down/up every PRESS_EVERY seconds until `until()` (or `limit` presses)."""
    n = 0
    while not until() and (limit is None or n < limit):
        started = time.perf_counter()
        down = table.cursor_row == 0
        took = await _press(app, probe, "down" if down else "up",
                            table.cursor_row + (1 if down else -1))
        out.append(ms(took))
        n += 1
        await asyncio.sleep(max(0.0, PRESS_EVERY - (time.perf_counter() - started)))


async def _one_run(workers: int, per_file: int, idle_presses: int) -> dict[str, Any]:
    from bench.apphelp import wait_until
    from fleet_tui.engine.fleet import Fleet
    from fleet_tui.settings.config import load_settings
    from fleet_tui.store.db import Store
    from fleet_tui.ui.app import FleetApp
    from fleet_tui.ui.widgets.stream_view import StreamView
    from fleet_tui.ui.widgets.task_table import TaskTable

    with bench_env() as benv:
        repo = make_repo(benv.root / "repo")
        benv.fleet_home.mkdir(parents=True, exist_ok=True)
        writer = start_writer(benv.env)
        try:
            files = make_running_tasks(benv.fleet_home / "fleet.db", repo, workers,
                                       writer.pid)
            fleet = Fleet(load_settings(), Store(benv.fleet_home / "fleet.db"))
            app = FleetApp(fleet, repo=repo, default_base="main", run_scheduler=True,
                           bell=False)
            async with app.run_test(size=(160, 50)) as pilot:
                table = app.main.query_one(TaskTable)
                view = app.main.query_one(StreamView)
                await wait_until(lambda: table.row_count == workers, timeout=30)
                probe = FrameProbe(app, lambda: table.cursor_row).install()
                await pilot.pause()
                idle: list[float] = []
                await _press_loop(app, probe, table, lambda: False, idle,
                                  limit=idle_presses // 2)

                t_go = time.perf_counter()
                send_job(writer, files, per_file)
                report_task = asyncio.create_task(asyncio.to_thread(wait_done, writer))
                total: list[int] = []  # set once the writer reports

                def drained() -> bool:
                    if report_task.done() and not total:
                        total.append(sum(os.path.getsize(f) for f in files))
                    return bool(total) and engine_offsets(fleet) >= total[0]

                loaded: list[float] = []
                await _press_loop(app, probe, table, drained, loaded)
                t_drained = await wait_until(drained, timeout=600, poll=0.002)
                report = await report_task
                stream_rows_at_drain = view.total_rows
                await _press_loop(app, probe, table, lambda: False, idle,
                                  limit=idle_presses - idle_presses // 2)
                await app.action_quit()
            bare_lines, bare_s = bare_read([Path(f) for f in files])
        finally:
            stop_writer(writer)
    events = workers * per_file
    return {"events": events, "drain_s": t_drained - t_go, "write_s": report["seconds"],
            "bytes": report["bytes"], "idle": idle, "loaded": loaded,
            "stream_rows": stream_rows_at_drain, "files": [Path(f).name for f in files][:1],
            "bare_rate": bare_lines / bare_s}


def run(smoke: bool = False, runs: int | None = None) -> BenchResult:
    runs = runs or (1 if smoke else 5)
    workers, per_file = (2, 100) if smoke else (20, 5_000)
    idle_presses = 4 if smoke else 40
    rates: list[float] = []
    bare_rates: list[float] = []
    key_ratio: list[float] = []
    write_rates: list[float] = []
    idle: list[float] = []
    loaded: list[float] = []
    p99s: list[float] = []
    mb = 0.0
    for _ in range(runs):
        res = asyncio.run(_one_run(workers, per_file, idle_presses))
        rates.append(res["events"] / res["drain_s"])
        bare_rates.append(res["bare_rate"])
        write_rates.append(res["events"] / res["write_s"])
        idle.extend(res["idle"])
        loaded.extend(res["loaded"])
        if res["loaded"]:
            p99s.append(quantile(res["loaded"], 0.99))
            key_ratio.append(p99s[-1] / quantile(res["idle"], 0.99))
        mb = res["bytes"] / 1e6
    # No press came back while draining: the figure stays empty, which the report shows
    # as "no measurement" and counts as a failure (never as a 0 ms pass).
    flood_rows, flood_batch = (2_000, 500) if smoke else (FLOOD_ROWS, FLOOD_BATCH)
    flood: list[float] = []
    flood_bare: list[float] = []
    for i in range(runs):
        if i % 2:
            flood_bare.append(ms(asyncio.run(bare_flood(flood_rows, flood_batch))))
        flood.append(ms(asyncio.run(stream_flood(flood_rows, flood_batch))))
        if not i % 2:
            flood_bare.append(ms(asyncio.run(bare_flood(flood_rows, flood_batch))))
    figures = [
        Figure("panel.drain_ratio", "drain rate ÷ bare read + json.loads of the same files",
               "×", [r / b for r, b in zip(rates, bare_rates, strict=True)],
               budget=DRAIN_BUDGET, better="higher", per="pair", baseline="panel.drain_bare"),
        Figure("panel.drain", "events drained into the app", "events/s", rates,
               better="higher",
               note=f"{workers} workers × {per_file:,} events ({mb:.0f} MB); writer start → "
                    "engine read to the end of every file"),
        Figure("panel.drain_bare", "bare read + json.loads of the same files (baseline)",
               "events/s", bare_rates, better="higher"),
        Figure("panel.key_ratio", "key → frame p99 while draining ÷ idle p99", "×",
               key_ratio, budget=KEY_BUDGET, per="pair", baseline="panel.key_idle",
               note="per run; loaded p99s: " + ", ".join(f"{x:.0f}" for x in p99s) + " ms"),
        Figure("panel.key_loaded", "key → frame while draining", "ms", loaded,
               per="press", note="pooled over runs"),
        Figure("panel.key_idle", "key → frame, idle panel (baseline)", "ms", idle,
               per="press", note="half before the drain, half after it"),
        Figure("panel.writer", "writer speed (how fast the files grew)", "events/s",
               write_rates, better="higher"),
        Figure("panel.flood_ratio", "stream view flood ÷ bare `Log` of the same rows", "×",
               [f / b for f, b in zip(flood, flood_bare, strict=True)], budget=FLOOD_BUDGET,
               per="pair", baseline="panel.flood_bare"),
        Figure("panel.stream_flood", "stream view takes a flood, rows appended in batches",
               "ms", flood,
               note=f"{flood_rows:,} rows (tool calls and results) in batches of "
                    f"{flood_batch:,}, each batch formatted, appended and laid out; the view "
                    "alone, no engine"),
        Figure("panel.flood_bare", "bare `Log` takes the same rows' text (baseline)", "ms",
               flood_bare),
    ]
    return BenchResult("panel", "2. Panel under load", figures,
                       [f"keys every {PRESS_EVERY * 1000:.0f} ms alternating down/up (each "
                        "moves the selection, so the stream view restarts on the new task)"])
