"""`python -m bench`: run the benchmarks and write bench/RESULTS.md (and RESULTS.json).

    .venv/bin/python -m bench                 # all but the long ones, full sizes
    .venv/bin/python -m bench --long          # the long ones too (ssh, ray, gatewayblows)
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
3 when nothing failed but the machine was too busy to judge; 128 + the signal when stopped
from outside (SIGTERM, SIGHUP, ctrl-c), after stopping every process the run started.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib
import inspect
import json
import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.common import (
    BenchResult,
    Crash,
    LoadReading,
    LoadSample,
    RunVerdict,
    history_entry,
    judge_run,
    machine_info,
    render_report,
)


@dataclass(frozen=True)
class Bench:
    """One benchmark: its module `bench/<name>.py` (whose `run(smoke=, runs=)` returns a
    BenchResult), its title in the report, and whether it is long: a long one runs only
    when named or with `--long`, so that `python -m bench` stays within 10 minutes on a
    quiet 2-core machine. Adding a benchmark is one entry here, in run order."""

    name: str
    title: str
    long: str = ""  # why it is long (its time on a quiet 2-core machine); "" = not long


# run order: the cheap, finished-module ones first
BENCHES: list[Bench] = [
    Bench("parser", "1. Parser"),
    Bench("launch", "6. Launcher"),
    Bench("diff", "5. Diff"),
    Bench("engine", "7. Engine"),
    Bench("endpoint", "8. Scripted endpoint"),
    Bench("gateway", "10. Gateway"),
    Bench("slots", "11. Request slots"),
    Bench("startup", "4. Start-up"),
    Bench("panel", "2. Panel under load"),
    Bench("memory", "3. Memory"),
    Bench("serve", "9. The panel in a browser"),
    Bench("ssh", "12. SSH host",
          long="244 s at load 1 per core: a local sshd, 3 rounds of a 50 MB push"),
    Bench("ray", "13. Ray host", long="~4½ min: a two-node Ray cluster of its own"),
    Bench("gatewayblows", "14. Gateway under blows",
          long="343 s at load 10 per core: three 30 s floods of 20,000 connections"),
    Bench("rank", "15. Best of N"),
    Bench("cage", "16. The cage"),
]
BENCHMARKS: dict[str, str] = {b.name: b.title for b in BENCHES}
ORDER = [b.name for b in BENCHES]
LONG: dict[str, str] = {b.name: b.long for b in BENCHES if b.long}
HERE = Path(__file__).resolve().parent


class Stopped(BaseException):
    """The run was stopped from outside (SIGTERM, SIGHUP): raised in the main thread so
    that every benchmark's own `finally` stops what it started (a Ray cluster, an sshd,
    the gateway), as ctrl-c's KeyboardInterrupt does."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop_on_signals() -> Callable[[], None]:
    """Turn SIGTERM and SIGHUP into `Stopped` (SIGINT already raises KeyboardInterrupt),
    once: a second signal while the first unwinds is ignored, so it cannot cut the
    clean-up short. Returns what puts the old handlers back."""
    fired: list[int] = []

    def handler(signum: int, _frame: object) -> None:
        if fired:
            return
        fired.append(signum)
        raise Stopped(signum)

    def quiet_int(signum: int, frame: object) -> None:
        if fired:
            return
        fired.append(signum)
        raise KeyboardInterrupt

    old = {sig: signal.signal(sig, h) for sig, h in (
        (signal.SIGTERM, handler), (signal.SIGHUP, handler), (signal.SIGINT, quiet_int))}

    def restore() -> None:
        for sig, was in old.items():
            signal.signal(sig, was)
    return restore


def _stop_leftovers(grace: float = 5.0, deadline: float = 60.0) -> list[int]:
    """Stop every process this run started that still lives: its descendants, those it
    adopted as a child subreaper among them (a Ray node's daemons, a detached worker):
    SIGTERM to each, SIGKILL after `grace` to those still alive, then reap them; and again,
    until none is left (for `deadline` seconds at most, then SIGKILL to what is left): a
    process born or orphaned while the others stop is not in the first look. A caged
    worker's bubblewrap, just started by its cage host as the stop came, was one: the
    SIGTERM ended bwrap's outer process before the namespace's init (cloned after that
    look) had armed its parent-death signal, and that init, deaf to a SIGTERM from outside
    its namespace, outlived the runner (SIGKILLed here at the grace, when its own SIGKILL of
    it was due) and was adopted here. Returns the pids stopped."""
    from fleet_tui.system import procs

    procs.set_child_subreaper()  # whatever a benchmark did with it: the orphans come here
    stopped: dict[int, None] = {}
    give_up = time.monotonic() + deadline
    while left := procs.descendants(os.getpid()):
        stopped.update(dict.fromkeys(left))
        if time.monotonic() >= give_up:
            for pid in left:
                procs.signal_pid(pid, signal.SIGKILL)
            break
        procs.stop(left, grace)
        procs.reap_children()
    procs.reap_children()
    return list(stopped)


def run_one(name: str, *, smoke: bool, runs: int | None, long: bool = False
            ) -> BenchResult:
    """Run one benchmark; `long` goes to a `run` that takes it (its full rounds, which
    only `--long` pays for)."""
    module = importlib.import_module(f"bench.{name}")
    start = time.perf_counter()
    kwargs: dict[str, object] = {"smoke": smoke, "runs": runs}
    if "long" in inspect.signature(module.run).parameters:
        kwargs["long"] = long
    result: BenchResult = module.run(**kwargs)
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
         sample_load: Callable[[], LoadSample] = LoadSample.take,
         as_program: bool = False) -> int:
    """`sample_load` reads the machine's load before and after each benchmark (the tests
    pass a fixed reading, to check the judging of a busy machine). `as_program`: this
    process is `python -m bench` itself, so it may take its signals and adopt orphans
    (not when a test calls main() inside pytest)."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"benchmarks to run ({', '.join(ORDER)}); without names, "
                             "every one but the long ones "
                             f"({', '.join(n for n in ORDER if n in LONG)})")
    parser.add_argument("--long", action="store_true",
                        help="the long benchmarks too, and each at its full rounds")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one or two runs")
    parser.add_argument("--runs", type=_positive, default=None, help="runs per figure")
    parser.add_argument("--judge-anyway", action="store_true",
                        help="judge the budgets even when the machine was too busy")
    parser.add_argument("--out", type=Path, default=HERE / "RESULTS.md",
                        help="where to write the report (default bench/RESULTS.md; the "
                             "run's summary is added to HISTORY.md beside it)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(ORDER)}")
    if args.names:
        names = [n for n in ORDER if n in args.names]
    else:
        names = [n for n in ORDER if args.long or n not in LONG]
    if not as_program:
        return _run(args, names, sample_load, adopt=False)
    restore = _stop_on_signals()
    try:
        return _run(args, names, sample_load, adopt=True)
    except (Stopped, KeyboardInterrupt) as exc:
        left = _stop_leftovers()
        signum = exc.signum if isinstance(exc, Stopped) else signal.SIGINT
        print(f"bench: stopped by {signal.Signals(signum).name}; every benchmark's "
              f"processes stopped ({len(left)} left by its own clean-up); the report holds "
              "the benchmarks that finished before it", file=sys.stderr)
        return 128 + int(signum)
    finally:
        restore()


def _earlier(out: Path, smoke: bool) -> dict[str, BenchResult]:
    """The results of the last runs (RESULTS.json beside the report), by benchmark: a run
    of some benchmarks keeps the others' rows. A smoke run's and a full run's never mix."""
    try:
        data = json.loads(out.with_suffix(".json").read_text())
        if bool(data.get("smoke")) != smoke:
            return {}
        found = {r["name"]: BenchResult.from_json(r) for r in data.get("results", [])}
        for res in found.values():  # a report from before rows carried their own run
            res.date = res.date or str(data.get("machine", {}).get("date", ""))
            res.command = res.command or str(data.get("command", ""))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
    return {name: res for name, res in found.items() if name in BENCHMARKS}


def _run(args: argparse.Namespace, names: list[str],
         sample_load: Callable[[], LoadSample], *, adopt: bool) -> int:
    """Run `names` in order and write the report; `adopt`: this process adopts the
    orphans of each benchmark (a child subreaper, set again before each: bench/ray.py's
    own adoption turns it off when it ends)."""
    from fleet_tui.system import procs

    command = "python -m bench" + (" --smoke" if args.smoke else "") + (
        " --long" if args.long else "") + (
        f" --runs {args.runs}" if args.runs else "") + (
        " --judge-anyway" if args.judge_anyway else "") + (
        " " + " ".join(args.names) if args.names else "")
    machine = machine_info()
    machine["load average at start"] = _load()
    results: list[BenchResult] = []
    crashed: list[Crash] = []
    earlier = _earlier(args.out, args.smoke)
    for index, name in enumerate(names):
        if index:  # what is done so far, in case the run is stopped
            _write(args, machine, command, results, crashed, earlier, pending=names[index:])
        print(f"bench: {name} …", file=sys.stderr, flush=True)
        if adopt:
            # the processes a benchmark starts that leave their parent (a Ray node's
            # daemons, a detached worker) are adopted here, so that a stop finds them
            procs.set_child_subreaper()
        before = sample_load()
        try:
            result = run_one(name, smoke=args.smoke, runs=args.runs, long=args.long)
        except Exception as exc:
            crashed.append(Crash(name, BENCHMARKS[name], _one_line(exc)))
            traceback.print_exc()
            continue
        finally:
            # what it adopted and has ended counts in this process's children's CPU
            procs.reap_children()
        after = sample_load()
        # CPU of the benchmark's processes that no children's times hold (bench/ray.py:
        # a raylet's children, which no one reaps) is its own too
        unreaped = getattr(sys.modules.get(f"bench.{name}"), "unreaped_cpu", None)
        if callable(unreaped):
            after = dataclasses.replace(after, own=after.own + float(unreaped()))
        result.load = LoadReading.between(before, after)
        result.date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        result.command = command
        result.judged_anyway = args.judge_anyway
        results.append(result)
        for fig in result.figures:
            word = {None: "", True: "pass", False: "FAIL"}[fig.passed]
            if not fig.measured:
                word += " (no measurement)"
            print(f"  {fig.title}: {_fmt(fig.median)} {fig.unit} "
                  f"[{_fmt(fig.minimum)}–{_fmt(fig.maximum)}] {word}", file=sys.stderr)
        print(f"  ({result.load.describe()}; {result.seconds:.0f} s)", file=sys.stderr)
    machine["load average at end"] = _load()
    verdict = _write(args, machine, command, results, crashed, earlier, pending=[])
    if not args.smoke:
        history = args.out.with_name("HISTORY.md")
        entry = history_entry(results, crashed, command=command, verdict=verdict,
                              started=machine.get("date", ""))
        old = history.read_text() if history.exists() else HISTORY_HEAD
        head, sep, rest = old.partition("\n## ")
        history.write_text(head.rstrip() + "\n\n" + entry + ("\n## " + rest if sep else ""))
    for line in verdict.summary:
        print(f"bench: {line}", file=sys.stderr)
    print(f"bench: wrote {args.out}", file=sys.stderr)
    return verdict.code


def _write(args: argparse.Namespace, machine: dict[str, str], command: str,
           results: list[BenchResult], crashed: list[Crash],
           earlier: dict[str, BenchResult], pending: list[str]) -> RunVerdict:
    """Write RESULTS.md and RESULTS.json: this run's results so far, and the rows of the
    benchmarks it has not run (yet) from the earlier runs. Written after each benchmark,
    so a run stopped from outside keeps what it finished."""
    verdict = judge_run(results, crashed, judge_anyway=args.judge_anyway)
    ran = {r.name: r for r in results}
    failed = {c.name for c in crashed}
    table = [ran.get(n) or earlier[n] for n in ORDER
             if n in ran or (n in earlier and n not in failed)]
    shown = command + (f" (in progress: {', '.join(pending)} still to run)"
                       if pending else "")
    have = {r.name for r in table} | failed
    missing = [BENCHMARKS[n] + (" (long: `--long`)" if n in LONG else "")
               for n in ORDER if n not in have]
    report = render_report(results, machine, command=shown, smoke=args.smoke,
                           crashed=crashed, judge_anyway=args.judge_anyway, table=table,
                           missing=missing)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    _replace(args.out, report)
    _replace(args.out.with_suffix(".json"), json.dumps(
        {"machine": machine, "command": shown, "smoke": args.smoke,
         "exit_status": verdict.code, "summary": verdict.summary,
         "results": [r.to_json(verdict.busy.get(r.name) if r.name in ran else None)
                     for r in table],
         "crashed": [{"name": c.name, "title": c.title, "error": c.error} for c in crashed]},
        indent=2))
    return verdict


def _replace(path: Path, text: str) -> None:
    """Write whole or not at all: a stop may come in the middle of a write."""
    part = path.with_name(path.name + ".part")
    part.write_text(text)
    os.replace(part, path)


HISTORY_HEAD = """# fleet-tui benchmarks: history

Each `python -m bench` run (not `--smoke`) adds its summary at the top: the budget figures
of the benchmarks it ran, with their verdicts, date and load. The current figures are in
RESULTS.md.
"""


if __name__ == "__main__":
    sys.exit(main(as_program=True))
