"""`python -m bench`: run every benchmark and write bench/RESULTS.md (and RESULTS.json).

    .venv/bin/python -m bench                 # everything, full sizes
    .venv/bin/python -m bench parser launch   # some of them
    .venv/bin/python -m bench --smoke         # tiny sizes (what the tests run)
    .venv/bin/python -m bench --runs 3        # fewer runs per figure

Exit status: 0 when every budget is met, 1 when one is missed, 2 when a benchmark broke.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

from bench.common import BenchResult, machine_info, render_report

# run order: the cheap, finished-module ones first
BENCHMARKS: dict[str, str] = {
    "parser": "1. Parser",
    "panel": "2. Panel under load",
    "memory": "3. Memory",
    "startup": "4. Start-up",
    "diff": "5. Diff",
    "launch": "6. Launcher",
    "engine": "7. Engine",
}
ORDER = ["parser", "launch", "diff", "engine", "startup", "panel", "memory"]
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"benchmarks to run ({', '.join(ORDER)})")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one or two runs")
    parser.add_argument("--runs", type=int, default=None, help="runs per figure")
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
    broken: list[str] = []
    for name in names:
        print(f"bench: {name} …", file=sys.stderr, flush=True)
        try:
            result = run_one(name, smoke=args.smoke, runs=args.runs)
        except Exception:
            broken.append(name)
            traceback.print_exc()
            continue
        results.append(result)
        for fig in result.figures:
            verdict = {None: "", True: "pass", False: "FAIL"}[fig.passed]
            print(f"  {fig.title}: {fig.median:.4g} {fig.unit} "
                  f"[{fig.minimum:.4g}–{fig.maximum:.4g}] {verdict}", file=sys.stderr)
    machine["load average at end"] = _load()

    command = "python -m bench" + (" --smoke" if args.smoke else "") + (
        f" --runs {args.runs}" if args.runs else "") + (
        " " + " ".join(args.names) if args.names else "")
    report = render_report(results, machine, command=command, smoke=args.smoke)
    if broken:
        report += "\n## Broken\n\n" + "".join(
            f"- `{name}` raised; see the run's stderr\n" for name in broken)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    args.out.with_suffix(".json").write_text(json.dumps(
        {"machine": machine, "command": command, "smoke": args.smoke,
         "results": [{"name": r.name, "title": r.title, "seconds": r.seconds, "notes": r.notes,
                      "figures": [f.to_json() for f in r.figures]} for r in results],
         "broken": broken}, indent=2))
    print(f"bench: wrote {args.out}", file=sys.stderr)
    if broken:
        return 2
    return 1 if any(f.passed is False for r in results for f in r.figures) else 0


if __name__ == "__main__":
    sys.exit(main())
