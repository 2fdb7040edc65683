"""Benchmark 11: request slots (issue 19) — more workers than the account allows requests.

The same 8 tasks, run by the real claude through the gateway against the scripted
endpoint, twice per round in alternating order: with 8 workers sharing `max_requests = 2`
(the account's 2 requests in flight), and with 2 workers on the same 2 slots (what a user
without slots sets to avoid 1302s). Each task's script alternates a model turn and a tool
step that take about as long (the endpoint paces each answer's events; the tool sleeps
that long): a worker spends half its time running tools, and with slots the other workers'
requests use the account meanwhile. The ideal is half the time; the budget: the 8 workers
finish in at most 0.6 of the 2 workers' wall time (median of the rounds' ratios). The wall
times are context.

Needs the pinned claude (FLEET_TEST_CLAUDE, else .claude-cli/ of the checkout, as
scripts/test installs it).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from bench.common import BenchResult, Figure, bench_env, make_repo

BUDGET = 0.6
KEY = "sk-bench-slots-key"
ROOT = Path(__file__).resolve().parent.parent
EVENTS = 7  # SSE events of a tool turn's answer: the endpoint sleeps `delay` before each


def _claude() -> str:
    found = os.environ.get("FLEET_TEST_CLAUDE") or str(
        ROOT / ".claude-cli" / "node_modules" / ".bin" / "claude")
    if not os.access(found, os.X_OK):
        raise RuntimeError(f"claude not found at {found}: run `bash scripts/test --co -q` "
                           "once (it installs the pinned CLI), or set FLEET_TEST_CLAUDE")
    return found


def _script(step: float, steps: int) -> dict[str, Any]:
    tool = {"type": "tool_use", "name": "Bash",
            "input": {"command": f"sleep {step:.2f}", "description": "a tool step"}}
    return {"delay": step / EVENTS, "real_turns": True,
            "turns": [[dict(tool)] for _ in range(steps)] + ["done"]}


def _wall(ep: Any, repo: Path, env: dict[str, str], claude: str, *, workers: int,
          tasks: int, timeout: float) -> float:
    """Seconds from submitting `tasks` tasks to the last one finished (all must succeed)."""
    from fleet_tui.engine.fleet import Fleet, TaskSpec
    from fleet_tui.gateway import control
    from fleet_tui.settings.config import load_settings
    from fleet_tui.store.db import FINISHED_STATES, Store, TaskState

    settings = load_settings(env=env, overrides={
        "base_url": ep.url, "claude": claude, "sandbox": os.geteuid() == 0,
        "key_sources": "env", "gateway": True, "max_requests": 2, "max_workers": workers,
        "max_attempts": 1})
    store = Store(Path(env["FLEET_TUI_HOME"]) / f"slots-{workers}.db")
    fleet = Fleet(settings, store, env=dict(env, ANTHROPIC_AUTH_TOKEN=KEY,
                                            CLAUDE_CODE_MAX_RETRIES="0"))
    try:
        t0 = time.monotonic()
        submitted = fleet.submit(TaskSpec(prompt="[script:default] go", repo=repo),
                                 copies=tasks)
        ids = [t.id for t in submitted]
        while True:
            fleet.tick()
            done = [fleet.get_task(i) for i in ids]
            if all(t.state in FINISHED_STATES for t in done):
                break
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"{workers} workers: not done after {timeout:.0f} s")
            time.sleep(0.05)
        took = time.monotonic() - t0
        failed = [(t.id, t.message) for t in done if t.state != TaskState.SUCCEEDED]
        if failed:
            raise RuntimeError(f"{workers} workers: tasks failed: {failed}")
        refused = [r for r in ep.message_requests() if r.status != 200]
        if refused:
            raise RuntimeError(f"{workers} workers: the endpoint refused {len(refused)} "
                               "request(s): the slots let too many through")
        return took
    finally:
        control.stop(fleet.env, db=store.path)
        store.close()


def run(smoke: bool = False, runs: int | None = None) -> BenchResult:
    from fleet_tui.demo.endpoint import ScriptedEndpoint

    claude = _claude()
    rounds = runs or (1 if smoke else 3)
    tasks = 4 if smoke else 8
    # a script ends on a model turn (the answer), one more than its tool steps: the ideal
    # ratio is (steps + 1) / (2 steps + 1), 0.54 with 6 steps (0.57 with 3)
    step = 0.3 if smoke else 1.0
    steps = 1 if smoke else 6
    many: list[float] = []
    few: list[float] = []
    with bench_env("fleet-bench-slots-") as benv:
        repo = make_repo(benv.root / "repo")
        for index in range(rounds):
            order = [tasks, 2] if index % 2 == 0 else [2, tasks]
            for workers in order:
                # a fresh endpoint a run: its request log is that run's alone
                with ScriptedEndpoint({"default": _script(step, steps)},
                                      faults=[{"kind": "concurrency", "limit": 2}]) as ep:
                    took = _wall(ep, repo, benv.env, claude, workers=workers, tasks=tasks,
                                 timeout=600)
                (many if workers == tasks else few).append(took)
    figures = [
        Figure("slots.ratio", f"{tasks} workers on 2 request slots ÷ 2 workers on 2", "×",
               [m / f for m, f in zip(many, few, strict=True)], budget=BUDGET,
               baseline="slots.two_workers",
               note=f"{tasks} tasks of {steps} tool step(s) of {step:g} s and as long a "
                    f"model turn each, and a last answer: the ideal is "
                    f"{(steps + 1) / (2 * steps + 1):.2f}"),
        Figure("slots.many_workers", f"{tasks} tasks with {tasks} workers, 2 slots", "s",
               many),
        Figure("slots.two_workers", f"{tasks} tasks with 2 workers, 2 slots (baseline)", "s",
               few),
    ]
    return BenchResult("slots", "11. Request slots", figures)
