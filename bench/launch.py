"""Benchmark 6: what `fleet-worker` adds before claude starts.

Both arms spawn a process and read the CLOCK_MONOTONIC stamp the stand-in claude writes at
its first instruction: once through `fleet-worker -p PROMPT` (settings, credential from the
environment, config dir prepared, exec), once the stand-in directly. The pairs alternate,
so drift on the machine hits both arms alike. Budget: a ratio to the floor any Python
launcher pays, measured in the same rounds (the same interpreter started with `python -c`
that only execs the stand-in): spawn → claude start through fleet-worker at most
LAUNCH_BUDGET times that (median of the per-round ratios). The difference in ms is context.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import BenchResult, Figure, bench_env, build_standin, ms, read_stamps

LAUNCH_BUDGET = 2.6  # quiet: 1.9 (16.8 ÷ 8.85 ms, old RESULTS.md); 1.86 busy


def _worker_command() -> list[str]:
    script = Path(sys.executable).parent / "fleet-worker"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from fleet_tui.cli import worker_main; "
            "sys.exit(worker_main())"]


def _spawn_to_start(argv: list[str], env: dict[str, str], stamp: Path) -> float:
    """Seconds from just before the spawn to the stand-in's first instruction."""
    stamp.unlink(missing_ok=True)
    env = {**env, "BENCH_STAMP_FILE": str(stamp)}
    start = time.monotonic_ns()
    done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          check=False, timeout=60)
    stamps = read_stamps(stamp)
    if done.returncode != 0 or not stamps:
        raise RuntimeError(f"{argv[0]} failed ({done.returncode}): "
                           f"{done.stderr.decode(errors='replace').strip()[:500]}")
    return (stamps[0] - start) / 1e9


def run(smoke: bool = False, runs: int | None = None) -> BenchResult:
    runs = runs or (3 if smoke else 40)
    with bench_env() as benv:
        standin = build_standin(benv.root / "bin")
        kind = "Python -S" if standin.read_bytes()[:2] == b"#!" else "compiled C"
        env = dict(benv.env)
        env.update({
            "FLEET_WORKER_CLAUDE": str(standin),
            "FLEET_WORKER_CONFIG_DIR": str(benv.root / "cfg"),
            "ANTHROPIC_AUTH_TOKEN": "bench-not-a-real-key",
        })
        stamp = benv.root / "stamp"
        worker = [*_worker_command(), "-p", "say hello"]
        direct = [str(standin), "-p", "--model", "sonnet", "--", "say hello"]
        # the floor for any launcher written in Python: start the same interpreter (with
        # its site-packages), exec the stand-in, nothing else
        floor = [sys.executable, "-c", "import os, sys; os.execv(sys.argv[1], sys.argv[1:])",
                 *direct]
        # one untimed round each: page cache, pyc files (written even where the caller's
        # environment says PYTHONDONTWRITEBYTECODE, as an installed fleet-tui has them:
        # without, every timed start compiled the modules no run had cached yet, 3.3x)
        _spawn_to_start(worker, {k: v for k, v in env.items()
                                 if k != "PYTHONDONTWRITEBYTECODE"}, stamp)
        _spawn_to_start(direct, env, stamp)
        via_worker: list[float] = []
        via_direct: list[float] = []
        via_floor: list[float] = []
        added: list[float] = []
        over_floor: list[float] = []
        ratio: list[float] = []
        arms = [worker, direct, floor]
        for i in range(runs):
            order = arms[i % 3:] + arms[:i % 3]  # rotate so no arm always goes first
            took = {tuple(a): _spawn_to_start(a, env, stamp) for a in order}
            w, d, f = took[tuple(worker)], took[tuple(direct)], took[tuple(floor)]
            via_worker.append(ms(w))
            via_direct.append(ms(d))
            via_floor.append(ms(f))
            added.append(ms(w - d))
            over_floor.append(ms(w - f))
            ratio.append(w / f)
    figures = [
        Figure("launcher.ratio", "fleet-worker ÷ bare Python start (`python -c execv`)", "×",
               ratio, budget=LAUNCH_BUDGET, per="pair", baseline="launcher.python_floor",
               note="spawn → stand-in start, per round"),
        Figure("launcher.added", "fleet-worker overhead (paired difference)", "ms", added,
               per="pair", note="spawn → stand-in start, through fleet-worker minus direct"),
        Figure("launcher.worker", "spawn → claude start via fleet-worker", "ms", via_worker),
        Figure("launcher.direct", "spawn → claude start, direct (baseline)", "ms", via_direct),
        Figure("launcher.python_floor", "spawn → claude start via `python -c execv`",
               "ms", via_floor, note="what any Python launcher pays: interpreter + site"),
        Figure("launcher.over_floor", "fleet-worker minus the Python floor", "ms",
               over_floor, per="pair", note="fleet_tui's own imports and work"),
    ]
    direct_ratio = statistics.median(via_worker) / max(statistics.median(via_direct), 1e-9)
    notes = [f"stand-in: {kind}"
             f" that stamps CLOCK_MONOTONIC first; fleet-worker via {worker[0]}; "
             f"median ratio worker/direct {direct_ratio:.1f}×"]
    return BenchResult("launch", "6. Launcher", figures, notes)
