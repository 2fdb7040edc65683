"""Benchmark 5: a 20,000-line diff across 200 files — first paint, and scrolling.

A real repository with 200 files and a real task worktree (git.create_worktree) in which
every file has an uncommitted rewrite of a block of lines, so `git.diff` returns ~100 patch
lines per file. Measured:

- `git.diff` alone and `PreparedDiff.build` alone (the engine and off-thread parts);
- first paint, end to end, in the real panel (FleetApp, headless, diff tab shown): from
  the key that moves the task list onto the task to the first frame whose diff view holds
  every line of the patch (git, preparation, message, layout, compositing and the terminal
  bytes of the frame). Budget: 300 ms.
- scrolling: `pagedown` keys in the focused diff, each from the key to the frame that shows
  the new position. Budget: 100 ms at the 99th percentile (the same as a key press).
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from pathlib import Path

from bench.common import BenchEnv, BenchResult, Figure, bench_env, make_repo, ms

FILES = 200
FILE_LINES = 120
CHANGED_LINES = 45  # 3 + 45 + 45 + 3 context/changes + @@ + 4 header lines ≈ 101 per file


def _file_text(index: int, lines: int, tag: str) -> str:
    return "".join(f"def function_{index}_{n}(value):  # {tag} line {n} of module {index}\n"
                   for n in range(lines))


def build_diff_repo(root: Path, files: int = FILES, changed: int = CHANGED_LINES) -> tuple[
        Path, Path, str]:
    """(repo, worktree, base commit): a task worktree with `files` rewritten files."""
    from fleet_tui import git

    originals = {f"pkg/mod_{i:03d}.py": _file_text(i, FILE_LINES, "original")
                 for i in range(files)}
    repo = make_repo(root / "repo", originals)
    info = git.create_worktree(repo, "bdiff1")
    start = 10
    for i in range(files):
        path = info.path / f"pkg/mod_{i:03d}.py"
        lines = path.read_text().splitlines(keepends=True)
        lines[start:start + changed] = [
            f"def function_{i}_{n}(value, extra=None):  # rewritten by the task\n"
            for n in range(start, start + changed)]
        path.write_text("".join(lines))
    return repo, info.path, info.base_commit


def _store_tasks(benv: BenchEnv, repo: Path, worktree: Path, base: str) -> tuple[str, str]:
    """Two finished tasks: a newer one without changes (first row) and the big diff."""
    from fleet_tui import git
    from fleet_tui.store import Store, TaskState

    store = Store(benv.fleet_home / "fleet.db")
    now = time.time()
    big = store.create_task(prompt="rewrite every module", repo=repo, task_id="bdiff1",
                            title="big diff", state=TaskState.SUCCEEDED, worktree=worktree,
                            base_commit=base, base_branch="main", started_at=now - 60,
                            finished_at=now - 1, now=now - 60)
    empty_info = git.create_worktree(repo, "bdiff0")
    small = store.create_task(prompt="nothing to change", repo=repo, task_id="bdiff0",
                              title="no changes", state=TaskState.SUCCEEDED,
                              worktree=empty_info.path, base_commit=base, base_branch="main",
                              started_at=now - 30, finished_at=now, now=now - 30)
    store.close()
    return small.id, big.id


def _moved(before: float, seen: tuple[int, float]) -> bool:
    return seen[1] != before


async def _measure_app(benv: BenchEnv, repo: Path, presses: int, scroll_steps: int,
                       expect_lines: int) -> tuple[list[float], list[float], int]:
    from bench.apphelp import FrameProbe, send_key, wait_until
    from fleet_tui.config import load_settings
    from fleet_tui.fleet import Fleet
    from fleet_tui.store import Store
    from fleet_tui.ui.app import FleetApp
    from fleet_tui.ui.widgets.diff_view import DiffLines
    from fleet_tui.ui.widgets.task_table import TaskTable

    fleet = Fleet(load_settings(), Store(benv.fleet_home / "fleet.db"))
    app = FleetApp(fleet, repo=repo, default_base="main", run_scheduler=False, bell=False)
    first_paint: list[float] = []
    scroll: list[float] = []
    async with app.run_test(size=(160, 50)) as pilot:
        await wait_until(lambda: app.main.query_one(TaskTable).row_count == 2)
        app.main.action_show_tab("tab-diff")
        lines_view = app.main.query_one(DiffLines)
        table = app.main.query_one(TaskTable)
        probe = FrameProbe(app, lambda: (len(lines_view.lines), lines_view.scroll_y)).install()
        await pilot.pause()
        for _ in range(presses):
            if table.cursor_row != 0:
                send_key(app, "up")
                await wait_until(lambda: table.cursor_row == 0 and not lines_view.lines)
                await pilot.pause()
            t0 = send_key(app, "down")
            frame = await probe.wait_frame(t0, lambda seen: seen[0] >= expect_lines)
            first_paint.append(ms(frame.at - t0))
            await pilot.pause()
        lines_view.focus()
        await pilot.pause()
        for _ in range(scroll_steps):
            before = lines_view.scroll_y
            if lines_view.is_vertical_scroll_end:
                lines_view.scroll_to(y=0, animate=False, immediate=True)
                await pilot.pause()
                before = lines_view.scroll_y
            t0 = send_key(app, "pagedown")
            frame = await probe.wait_frame(t0, partial(_moved, before))
            scroll.append(ms(frame.at - t0))
        bytes_out = probe.bytes_out
        await app.action_quit()
    return first_paint, scroll, bytes_out


def run(smoke: bool = False, runs: int | None = None) -> BenchResult:
    from fleet_tui import git
    from fleet_tui.ui.widgets.diff_view import PreparedDiff

    runs = runs or (2 if smoke else 7)
    files = 10 if smoke else FILES
    scroll_steps = 5 if smoke else 40
    with bench_env() as benv:
        repo, worktree, base = build_diff_repo(benv.root, files=files)
        diff = git.diff(worktree, base)
        patch_lines = len(diff.patch.splitlines())
        git_ms: list[float] = []
        build_ms: list[float] = []
        for _ in range(runs):
            t0 = time.perf_counter()
            diff = git.diff(worktree, base)
            t1 = time.perf_counter()
            PreparedDiff.build(diff)
            t2 = time.perf_counter()
            git_ms.append(ms(t1 - t0))
            build_ms.append(ms(t2 - t1))
        _store_tasks(benv, repo, worktree, base)
        first_paint, scroll, bytes_out = asyncio.run(
            _measure_app(benv, repo, runs, scroll_steps, patch_lines))
    figures = [
        Figure("diff.first_paint", "first paint of the diff, key → frame (panel)", "ms",
               first_paint, budget=300.0,
               note=f"{patch_lines:,} patch lines in {len(diff.files)} files"),
        Figure("diff.scroll", "page down in the diff, key → frame", "ms", scroll,
               budget=100.0, per="step", stat="p99"),
        Figure("diff.git", "git.diff (engine part of the first paint)", "ms", git_ms),
        Figure("diff.prepare", "PreparedDiff.build (off-thread part)", "ms", build_ms),
    ]
    notes = [f"terminal bytes rendered for all measured frames: {bytes_out:,}"]
    return BenchResult("diff", "5. Diff", figures, notes)
