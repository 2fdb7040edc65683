"""`python -m bench`: run every benchmark and write bench/RESULTS.md (and RESULTS.json).

    .venv/bin/python -m bench                 # everything, full sizes
    .venv/bin/python -m bench parser launch   # some of them
    .venv/bin/python -m bench --smoke         # tiny sizes (what the tests run)
    .venv/bin/python -m bench --runs 3        # fewer runs per figure
    .venv/bin/python -m bench --judge-anyway  # judge the budgets even on a busy machine

A benchmark run while other processes took more than a quarter of the machine's CPU, or
with a load average above one per core before it, is not judged: its budget rows say
"machine busy (...): not judged". Figures measured on a busy machine say nothing either
way (a miss may be the load, a pass may hide one).

Exit status: 0 when every budget was judged and met; 1 when a budget was missed or a
figure with a budget measured nothing; 2 when a benchmark crashed (or on a usage error);
3 when nothing failed but the machine was too busy to judge.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from bench.common import (
    BenchResult,
    Crash,
    LoadReading,
    LoadSample,
    judge_run,
    machine_info,
    render_report,
)

# run order: the cheap, finished-module ones first
BENCHMARKS: dict[str, str] = {
    "parser": "1. Parser",
    "panel": "2. Panel under load",
    "memory": "3. Memory",
    "startup": "4. Start-up",
    "diff": "5. Diff",
    "launch": "6. Launcher",
    "engine": "7. Engine",
    "endpoint": "8. Scripted endpoint",
    "serve": "9. The panel in a browser",
    "gateway": "10. Gateway",
    "slots": "11. Request slots",
    "ssh": "12. SSH host",
    "ray": "13. Ray host",
    "gatewayblows": "14. Gateway under blows",
    "rank": "15. Best of N",
    "cage": "16. The cage",
}
ORDER = ["parser", "launch", "diff", "engine", "endpoint", "gateway", "slots", "startup",
         "panel", "memory", "serve", "ssh", "ray", "gatewayblows", "rank", "cage"]
HERE = Path(__file__).resolve().parent


def run_one(name: str, *, smoke: bool, runs: int | None) -> BenchResult:
    module = importlib.import_module(f"bench.{name}")
    start = time.perf_counter()
    result: BenchResult = module.run(smoke=smoke, runs=runs)
    result.seconds = time.perf_counter() - start
    return result


def _load() -> str:
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f} (1 min), {five:.2f} (5 min)"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if len(text) > 200:
        text = text[:199] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _fmt(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.4g}"


def main(argv: list[str] | None = None, *,
         sample_load: Callable[[], LoadSample] = LoadSample.take) -> int:
    """`sample_load` reads the machine's load before and after each benchmark (the tests
    pass a fixed reading, to check the judging of a busy machine)."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"benchmarks to run ({', '.join(ORDER)})")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one or two runs")
    parser.add_argument("--runs", type=_positive, default=None, help="runs per figure")
    parser.add_argument("--judge-anyway", action="store_true",
                        help="judge the budgets even when the machine was too busy")
    parser.add_argument("--out", type=Path, default=HERE / "RESULTS.md",
                        help="where to write the report (default bench/RESULTS.md)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(ORDER)}")
    names = [n for n in ORDER if n in args.names] if args.names else ORDER

    machine = machine_info()
    machine["load average at start"] = _load()
    results: list[BenchResult] = []
    crashed: list[Crash] = []
    for name in names:
        print(f"bench: {name} …", file=sys.stderr, flush=True)
        before = sample_load()
        try:
            result = run_one(name, smoke=args.smoke, runs=args.runs)
        except Exception as exc:
            crashed.append(Crash(name, BENCHMARKS[name], _one_line(exc)))
            traceback.print_exc()
            continue
        after = sample_load()
        # CPU of the benchmark's processes that no children's times hold (bench/ray.py:
        # a raylet's children, which no one reaps) is its own too
        unreaped = getattr(sys.modules.get(f"bench.{name}"), "unreaped_cpu", None)
        if callable(unreaped):
            after = dataclasses.replace(after, own=after.own + float(unreaped()))
        result.load = LoadReading.between(before, after)
        results.append(result)
        for fig in result.figures:
            word = {None: "", True: "pass", False: "FAIL"}[fig.passed]
            if not fig.measured:
                word += " (no measurement)"
            print(f"  {fig.title}: {_fmt(fig.median)} {fig.unit} "
                  f"[{_fmt(fig.minimum)}–{_fmt(fig.maximum)}] {word}", file=sys.stderr)
        print(f"  ({result.load.describe()})", file=sys.stderr)
    machine["load average at end"] = _load()

    command = "python -m bench" + (" --smoke" if args.smoke else "") + (
        f" --runs {args.runs}" if args.runs else "") + (
        " --judge-anyway" if args.judge_anyway else "") + (
        " " + " ".join(args.names) if args.names else "")
    verdict = judge_run(results, crashed, judge_anyway=args.judge_anyway)
    report = render_report(results, machine, command=command, smoke=args.smoke,
                           crashed=crashed, judge_anyway=args.judge_anyway)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    args.out.with_suffix(".json").write_text(json.dumps(
        {"machine": machine, "command": command, "smoke": args.smoke,
         "exit_status": verdict.code, "summary": verdict.summary,
         "results": [{"name": r.name, "title": r.title, "seconds": r.seconds, "notes": r.notes,
                      "load": r.load.to_json() if r.load is not None else None,
                      "not_judged": verdict.busy.get(r.name),
                      "figures": [f.to_json() for f in r.figures]} for r in results],
         "crashed": [{"name": c.name, "title": c.title, "error": c.error} for c in crashed]},
        indent=2))
    for line in verdict.summary:
        print(f"bench: {line}", file=sys.stderr)
    print(f"bench: wrote {args.out}", file=sys.stderr)
    return verdict.code


if __name__ == "__main__":
    sys.exit(main())
