"""Benchmark 15: best of N — the evidence for 4 copies of a repository whose test command
takes 2 s, against running those test commands alone.

A real repository whose `.fleet-tui.toml` names a test command that takes TEST_SECONDS
(`sleep 2`: the time a small project's tests take), and 4 copies of one task as finished
workers leave them (real worktrees, each with its own uncommitted change; store rows of one
group). Measured, round by round, alternating which goes first:

- the subject: `Best.gather` from nothing (the stored evidence cleared first): each copy's
  diff, its conflict preview against the base's tip, its open review comments and the test
  command in its worktree through the merge gate's runner (`git.run_test_command`), the
  copies at once up to the worker cap (4), and the evidence written to the store;
- the baseline: the same 4 test commands alone, each run in its copy's worktree by the
  same gate runner, 4 at once (the work the evidence cannot do without).

Budget: the subject at most RANK_BUDGET times the baseline (median of the per-round
ratios); the issue asks for at most 1.3×.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import BenchResult, Figure, bench_env, make_repo

COPIES = 4
TEST_SECONDS = 2.0
# the figure. Seen 2026-12-05 on a 2-core machine at load 9 per core (no quiet one to
# be had): medians 1.01 and 1.03 (the copies' git work runs beside their commands; before
# it did, 1.46 at the same load)
RANK_BUDGET = 1.3


def _setup(root: Path, test_seconds: float) -> tuple[object, list[str], list[Path]]:
    from fleet_tui.core.states import TaskState
    from fleet_tui.engine.fleet import Fleet
    from fleet_tui.settings.config import load_settings
    from fleet_tui.store.db import Store
    from fleet_tui.vcs import git as fgit

    repo = make_repo(root / "repo", {
        "README.md": "# bench\n", "src/app.py": "def main():\n    return 1\n",
        ".fleet-tui.toml": f'test_command = "sleep {test_seconds:g}"\n'})
    store = Store(root / "fleet.db")
    ids, worktrees = [], []
    for n in range(COPIES):
        task_id = f"rank{n:02d}"
        info = fgit.create_worktree(repo, task_id, "main")
        (info.path / "notes.txt").write_text("".join(f"line {i}\n" for i in range(n + 1)))
        store.create_task(task_id=task_id, prompt="write notes", repo=repo,
                          title=f"Write notes ({n + 1}/{COPIES})", base_branch="main",
                          base_commit=info.base_commit, branch=info.branch,
                          worktree=info.path, state=TaskState.SUCCEEDED, verdict="ok",
                          group_id="benchgroup", finished_at=time.time())
        ids.append(task_id)
        worktrees.append(info.path)
    settings = load_settings(overrides={"max_workers": COPIES, "key_sources": "env"})
    fleet = Fleet(settings, store)
    fleet.spawn_queue_runners = False  # nothing ranked or landed in the background
    return fleet, ids, worktrees


def run(smoke: bool = False, runs: int | None = None) -> BenchResult:
    from fleet_tui.engine.fleet import Fleet
    from fleet_tui.vcs import git as fgit

    rounds = runs or (1 if smoke else 5)
    test_seconds = 0.2 if smoke else TEST_SECONDS
    command = f"sleep {test_seconds:g}"
    ours: list[float] = []
    bare: list[float] = []
    with bench_env("fleet-bench-rank-") as benv:
        made, ids, worktrees = _setup(benv.root, test_seconds)
        assert isinstance(made, Fleet)
        fleet = made

        def subject() -> float:
            with fleet.store.transaction() as conn:
                conn.execute("DELETE FROM copy_evidence")
            start = time.perf_counter()
            found = fleet.best.gather(ids[0])
            took = time.perf_counter() - start
            if len(found) != COPIES or not all(
                    ev.test is not None and ev.test.passed for ev in found.values()):
                raise RuntimeError(f"the evidence is not whole: {found}")
            return took

        def baseline() -> float:
            start = time.perf_counter()
            with ThreadPoolExecutor(COPIES) as pool:
                results = list(pool.map(lambda w: fgit.run_test_command(command, w),
                                        worktrees))
            took = time.perf_counter() - start
            if not all(passed for passed, _ in results):
                raise RuntimeError("a bare test command failed")
            return took

        for i in range(rounds):
            if i % 2:
                bare.append(baseline())
                ours.append(subject())
            else:
                ours.append(subject())
                bare.append(baseline())
    ratios = [o / b for o, b in zip(ours, bare, strict=True)]
    figures = [
        Figure("rank.evidence_ratio", f"evidence of {COPIES} copies ÷ their test commands "
               "alone", "×", ratios, budget=RANK_BUDGET, per="pair",
               baseline="rank.tests_alone",
               note=f"test command `{command}`; worker cap {COPIES}"),
        Figure("rank.tests_alone", f"{COPIES} test commands alone, at once", "s", bare),
        Figure("rank.evidence", f"evidence of {COPIES} copies (Best.gather)", "s", ours),
    ]
    return BenchResult("rank", "15. Best of N", figures,
                       notes=[f"{rounds} rounds, alternating which goes first"])
