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

Two budgets kept from the unit tests (which now check only the behaviour):

- the diff view on its own: a prepared 20,000-line diff shown, to the end of the next
  refresh. Budget: 300 ms (tests/test_ui_views.py).
- `git.diff` of a mixed worktree: 100 modified files (+50 −50 each), 50 committed new files
  and 50 untracked ones (100 lines each), 20,000 changed lines in 200 files. Budget: 5 s
  (tests/test_git.py).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from functools import partial
from pathlib import Path
from typing import Any

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


def build_mixed_worktree(root: Path, modified: int = 100, new: int = 50,
                         untracked: int = 50) -> tuple[Path, str]:
    """(worktree, base commit): `modified` files rewritten (50 lines out, 50 in), `new`
    committed new files and `untracked` files of 100 lines."""
    from fleet_tui import git

    originals = {f"mod{i:03}.txt": "".join(f"orig {i} {j}\n" for j in range(50))
                 for i in range(modified)}
    repo = make_repo(root / "mixed", originals)
    info = git.create_worktree(repo, "bmixed")
    wt = info.path
    for i in range(modified):
        (wt / f"mod{i:03}.txt").write_text("".join(f"new {i} {j}\n" for j in range(50)))
    for i in range(new):
        (wt / f"new{i:03}.py").write_text("".join(f"x_{j} = {j}\n" for j in range(100)))
    subprocess.run(["git", "add", "-A"], cwd=wt, check=True, capture_output=True)
    subprocess.run(["git", "commit", "-q", "-m", "worker"], cwd=wt, check=True,
                   capture_output=True)
    for i in range(untracked):
        (wt / f"untracked{i:03}.md").write_text("".join(f"- item {j}\n" for j in range(100)))
    return wt, info.base_commit


def big_diff(lines: int) -> Any:
    """A one-file `git.Diff` of `lines` added lines (made up; the view does not care)."""
    from fleet_tui.git import Diff, FileDiff

    body = [f"+line {i} " + "x" * (i % 70) for i in range(lines)]
    patch = "\n".join(["diff --git a/big.txt b/big.txt", "new file mode 100644",
                       "--- /dev/null", "+++ b/big.txt", f"@@ -0,0 +1,{lines} @@", *body])
    return Diff(files=[FileDiff(path="big.txt", status="added", added=lines, deleted=0,
                                patch=patch)], patch=patch)


async def view_paint(lines: int) -> float:
    """Seconds from `DiffView.show` of a prepared `lines`-line diff to the end of the next
    refresh, in a bare app that shows only the view."""
    from bench.apphelp import WidgetApp
    from fleet_tui.ui.widgets.diff_view import DiffLines, DiffView, PreparedDiff

    prepared = PreparedDiff.build(big_diff(lines))
    view = DiffView()
    app = WidgetApp(view)
    async with app.run_test(size=(160, 48)) as pilot:
        start = time.perf_counter()
        view.show("t1", prepared)
        await pilot.pause()
        took = time.perf_counter() - start
        shown = view.query_one(DiffLines).row_count()
    if shown < lines:
        raise RuntimeError(f"the diff view shows {shown} rows of a {lines}-line diff")
    return took


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
        sizes = (10, 5, 5) if smoke else (100, 50, 50)
        mixed_wt, mixed_base = build_mixed_worktree(benv.root, *sizes)
        mixed_ms: list[float] = []
        mixed = None
        for _ in range(runs):
            t0 = time.perf_counter()
            mixed = git.diff(mixed_wt, mixed_base)
            mixed_ms.append(ms(time.perf_counter() - t0))
        assert mixed is not None
        if len(mixed.files) != sum(sizes):
            raise RuntimeError(f"git.diff found {len(mixed.files)} files of {sum(sizes)}")
    view_lines = 2_000 if smoke else 20_000
    view_ms = [ms(asyncio.run(view_paint(view_lines))) for _ in range(runs)]
    figures = [
        Figure("diff.first_paint", "first paint of the diff, key → frame (panel)", "ms",
               first_paint, budget=300.0,
               note=f"{patch_lines:,} patch lines in {len(diff.files)} files"),
        Figure("diff.scroll", "page down in the diff, key → frame", "ms", scroll,
               budget=100.0, per="step", stat="p99"),
        Figure("diff.git", "git.diff (engine part of the first paint)", "ms", git_ms),
        Figure("diff.prepare", "PreparedDiff.build (off-thread part)", "ms", build_ms),
        Figure("diff.view_paint", "diff view alone: show a prepared diff → next refresh",
               "ms", view_ms, budget=300.0,
               note=f"{view_lines:,} lines in one file, a bare app showing the view"),
        Figure("diff.git_mixed", "git.diff: modified, committed and untracked files", "ms",
               mixed_ms, budget=5000.0,
               note=f"{sum(sizes)} files, {mixed.added + mixed.deleted:,} changed lines "
                    f"({sizes[0]} modified, {sizes[1]} committed new, {sizes[2]} untracked)"),
    ]
    notes = [f"terminal bytes rendered for all measured frames: {bytes_out:,}"]
    return BenchResult("diff", "5. Diff", figures, notes)
