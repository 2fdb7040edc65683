"""Benchmark 5: a 20,000-line diff across 200 files — first paint, and scrolling.

A real repository with 200 files and a real task worktree (git.create_worktree) in which
every file has an uncommitted rewrite of a block of lines, so `git.diff` returns ~100 patch
lines per file. Measured:

- `git.diff` alone and `PreparedDiff.build` alone (the engine and off-thread parts);
- first paint, end to end, in the real panel (FleetApp, headless, diff tab shown): from
  the key that moves the task list onto the task to the first frame whose diff view holds
  every line of the patch (git, preparation, message, layout, compositing and the terminal
  bytes of the frame).
- scrolling: `pagedown` keys in the focused diff, each from the key to the frame that shows
  the new position.

The baseline of both, round by round in the same run (alternating which goes first; the
panel waits idle meanwhile): the bare work of the same rows — the bare git commands that
make the same patch (`git ls-files -o`, `git add -N` of those into a copy of the index,
`git diff BASE`) and a bare Textual app that shows the patch's lines in Textual's own
`Log` widget (write them all → the first frame that holds them, then the same `pagedown`
steps). Budgets: first paint at most PAINT_BUDGET times (bare git + bare render), the p99
of a round's page-down steps at most SCROLL_BUDGET times the bare `Log`'s p99 (median
over the rounds).

With colours on, as the panel paints: the files are Python, so every painted
line is lexed (pygments, one line at a time, when painted) and each changed line's words
are compared with its removed partner's; the lexers are looked up in PreparedDiff.build
(off the UI thread). The run checks that the panel's diff view has them on.

Two more, kept from the unit tests (which now check only the behaviour), each against
its bare counterpart, alternating:

- the diff view on its own: a prepared 20,000-line diff shown, to the end of the next
  refresh, against the same lines written to a bare `Log` (tests/ui/test_ui_views.py).
- `git.diff` of a mixed worktree: 100 modified files (+50 −50 each), 50 committed new files
  and 50 untracked ones (100 lines each), 20,000 changed lines in 200 files, against the
  bare git commands of the same patch (tests/vcs/test_git.py).
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import time
from functools import partial
from pathlib import Path
from typing import Any

from bench.apphelp import bare_log
from bench.common import BenchEnv, BenchResult, Figure, bench_env, make_repo, ms, quantile

FILES = 200
FILE_LINES = 120
CHANGED_LINES = 45  # 3 + 45 + 45 + 3 context/changes + @@ + 4 header lines ≈ 101 per file
# medians seen (bench/RESULTS.md; 2026-12-01, a machine 2-5x busier than quiet, whose
# other ratios matched their quiet values): first paint 2.6, scroll 0.96, view 0.76, git 2.3
PAINT_BUDGET = 4.0
SCROLL_BUDGET = 2.0
VIEW_BUDGET = 1.5
GIT_BUDGET = 3.5


def bare_git_diff(worktree: Path, base: str) -> float:
    """Seconds for the bare git commands that make the same patch git.diff makes."""
    import os
    import shutil
    import tempfile

    real = Path(subprocess.run(["git", "rev-parse", "--git-path", "index"], cwd=worktree,
                               capture_output=True, text=True, check=True).stdout.strip())
    if not real.is_absolute():
        real = worktree / real
    fd, index = tempfile.mkstemp(prefix="bench-index-")
    os.close(fd)
    shutil.copyfile(real, index)
    env = {**os.environ, "GIT_INDEX_FILE": index}
    try:
        t0 = time.perf_counter()
        others = subprocess.run(["git", "ls-files", "-o", "--exclude-standard", "-z"],
                                cwd=worktree, env=env, capture_output=True, check=True).stdout
        names = [n for n in others.decode().split("\0") if n]
        if names:
            subprocess.run(["git", "add", "-N", "--", *names], cwd=worktree, env=env,
                           capture_output=True, check=True)
        out = subprocess.run(["git", "diff", base, "--"], cwd=worktree, env=env,
                             capture_output=True, check=True).stdout
        took = time.perf_counter() - t0
    finally:
        os.unlink(index)
    if not out:
        raise RuntimeError("the bare git diff is empty")
    return took


def _file_text(index: int, lines: int, tag: str) -> str:
    return "".join(f"def function_{index}_{n}(value):  # {tag} line {n} of module {index}\n"
                   for n in range(lines))


def build_diff_repo(root: Path, files: int = FILES, changed: int = CHANGED_LINES) -> tuple[
        Path, Path, str]:
    """(repo, worktree, base commit): a task worktree with `files` rewritten files."""
    from fleet_tui.vcs import git

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
    from fleet_tui.store.db import Store, TaskState
    from fleet_tui.vcs import git

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
    from fleet_tui.vcs import git

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
    """A one-file `git.Diff` of `lines` added lines (made up; a .py file, so the view lexes
    what it paints)."""
    from fleet_tui.vcs.git import Diff, FileDiff

    body = [f"+line {i} " + "x" * (i % 70) for i in range(lines)]
    patch = "\n".join(["diff --git a/big.py b/big.py", "new file mode 100644",
                       "--- /dev/null", "+++ b/big.py", f"@@ -0,0 +1,{lines} @@", *body])
    return Diff(files=[FileDiff(path="big.py", status="added", added=lines, deleted=0,
                                patch=patch)], patch=patch)


async def view_paint(lines: int) -> float:
    """Seconds from `DiffView.show` of a prepared `lines`-line diff to the first frame that
    holds its rows, in a bare app that shows only the view: measured as the baseline
    (`bare_log`) is, by the frame painted (the end of `pilot.pause()` measured Textual's
    idle wait too: 107 ms against the bare Log's 42 ms on a quiet machine, 171 against 230
    on a busy one, a ratio that followed the machine, not the view)."""
    from textual.css.query import NoMatches

    from bench.apphelp import FrameProbe, WidgetApp
    from fleet_tui.ui.widgets.diff_view import DiffLines, DiffView, PreparedDiff

    prepared = PreparedDiff.build(big_diff(lines))
    view = DiffView()
    app = WidgetApp(view)

    def rows() -> int:
        try:
            return view.query_one(DiffLines).row_count()
        except NoMatches:
            return 0

    async with app.run_test(size=(160, 48)) as pilot:
        probe = FrameProbe(app, rows).install()
        await pilot.pause()
        start = time.perf_counter()
        view.show("t1", prepared)
        frame = await probe.wait_frame(start, lambda seen: seen >= lines)
        took = frame.at - start
        shown = rows()
    if shown < lines:
        raise RuntimeError(f"the diff view shows {shown} rows of a {lines}-line diff")
    return took


def _moved(before: float, seen: tuple[int, float]) -> bool:
    return seen[1] != before


async def _measure_app(benv: BenchEnv, repo: Path, presses: int, scroll_steps: int,
                       patch_lines: list[str], worktree: Path, base: str) -> dict[str, Any]:
    from bench.apphelp import FrameProbe, bare_log_in_thread, send_key, wait_until
    from fleet_tui.engine.fleet import Fleet
    from fleet_tui.settings.config import load_settings
    from fleet_tui.store.db import Store
    from fleet_tui.ui.app import FleetApp
    from fleet_tui.ui.widgets.diff_view import DiffLines
    from fleet_tui.ui.widgets.task_table import TaskTable

    fleet = Fleet(load_settings(), Store(benv.fleet_home / "fleet.db"))
    # as the panel command starts it: the collector paused for the start-up, and what the
    # start-up made frozen once the first frame is out (a full collection then walks only
    # what came after: the diff, its rows)
    thresholds = gc.get_threshold()
    gc.disable()
    app = FleetApp(fleet, repo=repo, default_base="main", run_scheduler=False, bell=False,
                   resume_gc=True)
    expect_lines = len(patch_lines)
    first_paint: list[float] = []
    scroll: list[float] = []
    bare_git: list[float] = []
    bare_paint: list[float] = []
    bare_scroll: list[float] = []
    scroll_ratio: list[float] = []

    async def bare_round() -> None:
        bare_git.append(ms(bare_git_diff(worktree, base)))
        paint, steps = await asyncio.to_thread(bare_log_in_thread, patch_lines, scroll_steps)
        bare_paint.append(ms(paint))
        bare_scroll.extend(ms(x) for x in steps)
        round_bare.append(quantile([ms(x) for x in steps], 0.99))

    round_bare: list[float] = []
    async with app.run_test(size=(160, 50)) as pilot:
        await wait_until(lambda: app.main.query_one(TaskTable).row_count == 2)
        app.main.detail.show_tab("tab-diff")
        lines_view = app.main.query_one(DiffLines)
        table = app.main.query_one(TaskTable)
        probe = FrameProbe(app, lambda: (len(lines_view.lines), lines_view.scroll_y)).install()
        await pilot.pause()
        for i in range(presses):
            if i % 2:
                await bare_round()
            table.focus()
            await pilot.pause()
            if table.cursor_row != 0:
                send_key(app, "up")
                await wait_until(lambda: table.cursor_row == 0 and not lines_view.lines)
                await pilot.pause()
            t0 = send_key(app, "down")
            frame = await probe.wait_frame(t0, lambda seen: seen[0] >= expect_lines)
            first_paint.append(ms(frame.at - t0))
            painter = lines_view.renderer
            if painter is None or not painter.colours or not any(painter.file_lexers):
                raise RuntimeError("the diff is painted without its colours")
            await pilot.pause()
            lines_view.focus()
            await pilot.pause()
            steps: list[float] = []
            for _ in range(scroll_steps):
                before = lines_view.scroll_y
                if lines_view.is_vertical_scroll_end:
                    lines_view.scroll_to(y=0, animate=False, immediate=True)
                    await pilot.pause()
                    before = lines_view.scroll_y
                t0 = send_key(app, "pagedown")
                frame = await probe.wait_frame(t0, partial(_moved, before))
                steps.append(ms(frame.at - t0))
            scroll.extend(steps)
            if not i % 2:
                await bare_round()
            scroll_ratio.append(quantile(steps, 0.99) / round_bare[-1])
        bytes_out = probe.bytes_out
        await app.action_quit()
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    gc.enable()
    return {"first_paint": first_paint, "scroll": scroll, "bytes_out": bytes_out,
            "bare_git": bare_git, "bare_paint": bare_paint, "bare_scroll": bare_scroll,
            "scroll_ratio": scroll_ratio}


def run(smoke: bool = False, runs: int | None = None) -> BenchResult:
    from fleet_tui.ui.widgets.diff_view import PreparedDiff
    from fleet_tui.vcs import git

    runs = runs or (2 if smoke else 7)
    files = 10 if smoke else FILES
    scroll_steps = 3 if smoke else 10  # per round
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
        app_res = asyncio.run(_measure_app(benv, repo, runs, scroll_steps,
                                           diff.patch.splitlines(), worktree, base))
        sizes = (10, 5, 5) if smoke else (100, 50, 50)
        mixed_wt, mixed_base = build_mixed_worktree(benv.root, *sizes)
        mixed_ms: list[float] = []
        mixed_bare: list[float] = []
        mixed = None
        for i in range(runs):
            if i % 2:
                mixed_bare.append(ms(bare_git_diff(mixed_wt, mixed_base)))
            t0 = time.perf_counter()
            mixed = git.diff(mixed_wt, mixed_base)
            mixed_ms.append(ms(time.perf_counter() - t0))
            if not i % 2:
                mixed_bare.append(ms(bare_git_diff(mixed_wt, mixed_base)))
        assert mixed is not None
        if len(mixed.files) != sum(sizes):
            raise RuntimeError(f"git.diff found {len(mixed.files)} files of {sum(sizes)}")
    view_lines = 2_000 if smoke else 20_000
    view_text = big_diff(view_lines).patch.splitlines()
    view_ms: list[float] = []
    view_bare: list[float] = []
    for i in range(runs):
        if i % 2:
            view_bare.append(ms(asyncio.run(bare_log(view_text, 0))[0]))
        view_ms.append(ms(asyncio.run(view_paint(view_lines))))
        if not i % 2:
            view_bare.append(ms(asyncio.run(bare_log(view_text, 0))[0]))
    first_paint = app_res["first_paint"]
    bare_first = [g + p for g, p in zip(app_res["bare_git"], app_res["bare_paint"],
                                        strict=True)]
    figures = [
        Figure("diff.first_paint_ratio", "first paint ÷ bare git diff + bare render", "×",
               [f / b for f, b in zip(first_paint, bare_first, strict=True)],
               budget=PAINT_BUDGET, per="pair", baseline="diff.bare_first",
               note=f"{patch_lines:,} patch lines in {len(diff.files)} files"),
        Figure("diff.first_paint", "first paint of the diff, key → frame (panel)", "ms",
               first_paint),
        Figure("diff.bare_first", "bare git diff + bare `Log` render of the rows (baseline)",
               "ms", bare_first, note="git " + ", ".join(
                   f"{x:.0f}" for x in app_res["bare_git"]) + " ms"),
        Figure("diff.scroll_ratio", "page down p99 ÷ bare `Log` page down p99", "×",
               app_res["scroll_ratio"], budget=SCROLL_BUDGET, per="pair",
               baseline="diff.bare_scroll", note=f"{scroll_steps} steps per round"),
        Figure("diff.scroll", "page down in the diff, key → frame", "ms", app_res["scroll"],
               per="step"),
        Figure("diff.bare_scroll", "page down in the bare `Log` (baseline)", "ms",
               app_res["bare_scroll"], per="step"),
        Figure("diff.git", "git.diff (engine part of the first paint)", "ms", git_ms),
        Figure("diff.prepare", "PreparedDiff.build (off-thread part)", "ms", build_ms),
        Figure("diff.view_ratio", "diff view alone ÷ bare `Log` of the same lines", "×",
               [v / b for v, b in zip(view_ms, view_bare, strict=True)], budget=VIEW_BUDGET,
               per="pair", baseline="diff.view_bare"),
        Figure("diff.view_paint", "diff view alone: show a prepared diff → next refresh",
               "ms", view_ms,
               note=f"{view_lines:,} lines in one file, a bare app showing the view"),
        Figure("diff.view_bare", "bare `Log`: write the same lines → frame (baseline)", "ms",
               view_bare),
        Figure("diff.git_mixed_ratio", "git.diff (mixed) ÷ bare git commands", "×",
               [m / b for m, b in zip(mixed_ms, mixed_bare, strict=True)],
               budget=GIT_BUDGET, per="pair", baseline="diff.git_mixed_bare"),
        Figure("diff.git_mixed", "git.diff: modified, committed and untracked files", "ms",
               mixed_ms,
               note=f"{sum(sizes)} files, {mixed.added + mixed.deleted:,} changed lines "
                    f"({sizes[0]} modified, {sizes[1]} committed new, {sizes[2]} untracked)"),
        Figure("diff.git_mixed_bare", "bare ls-files -o, add -N, git diff (baseline)", "ms",
               mixed_bare),
    ]
    notes = [f"terminal bytes rendered for all measured frames: {app_res['bytes_out']:,}"]
    return BenchResult("diff", "5. Diff", figures, notes)
