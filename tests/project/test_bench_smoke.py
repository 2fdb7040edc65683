"""The benchmarks and their judge.

Every benchmark runs in smoke mode (tiny sizes): its figures must be real measurements —
finite, positive where the quantity cannot be anything else, as many samples as runs were
asked for — and each budget must show up in the report. Budgets are not asserted here
(figures at smoke sizes mean nothing); `python -m bench` judges them. What is asserted is
the judging: a crashed benchmark, a missed budget, a figure with no sample and a machine
too busy to judge each end the run with their own exit status and a true summary.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import bench.__main__ as bench_main
from bench.__main__ import BENCHMARKS, ORDER, main
from bench.common import (
    EXIT_CRASHED,
    EXIT_MET,
    EXIT_MISSED,
    EXIT_NOT_JUDGED,
    BenchResult,
    Crash,
    Figure,
    LoadReading,
    LoadSample,
    judge_load,
    judge_run,
    quantile,
    render_report,
)

RUNS = 2
# The costly ones (a Ray cluster; sshd and controllers following streams; real claude runs;
# a browser; the workers' memory) run one round: a second round makes the same calls (with
# the two arms in the other order where they alternate), and the figures' checks below are
# per figure, not per round. The others run RUNS rounds, which shows a benchmark gives as
# many samples as asked for (the cage too: one round against its smoke default of two).
ONE_ROUND = {"ray", "ssh", "cage", "slots", "serve", "memory"}
# ~25-40 s of wall each (mostly waiting): handed out early, spread (tests/support/suite_order.py)
LONG = {"ssh", "gatewayblows", "serve", "cage"}

# Samples each figure must hold after run(smoke=True, runs=...); None: at least the runs
# (key presses during a drain: as many as fit, at least one per run).
FIXED = {"diff.scroll": 3 * RUNS, "diff.bare_scroll": 3 * RUNS, "engine.worktree_ratio": 3,
         "engine.worktree": 3, "engine.worktree_bare": 3, "panel.key_idle": 4 * RUNS,
         "panel.key_loaded": None, "serve.key_frame": None, "serve.bare": None,
         "gateway.ttfb_ratio": None, "gateway.ttfb_through": None,
         "gateway.ttfb_direct": None, "gateway.ttfb_added": None,
         # gatewayblows: a token-holder's asks per round; the log and the kills once
         "gatewayblows.ttfb_quiet": None, "gatewayblows.ttfb_flooded": None,
         "gatewayblows.log_bytes": 1, "gatewayblows.kills_ok": 1,
         "gatewayblows.meter_diff": 1,
         # ray: the controller per followed job is one round in a smoke run (each round
         # is two controllers of their own following jobs on the cluster)
         **{f"ray.{k}": 1 for k in (
             "job_mem_ratio", "job_cpu_ratio", "local_mem", "local_cpu", "ray_mem",
             "ray_cpu", "job_mem", "job_uss", "job_cpu", "job_threads", "local_job_mem",
             "local_job_cpu", "client_mem", "local_job_threads")}}
# Differences of two timings: these may be zero or negative; every other figure is a
# duration, a rate, a size or a ratio, and must be above zero.
SIGNED = {"launcher.added", "launcher.over_floor", "engine.overhead", "memory.delta",
          "gateway.ttfb_added", "slots.wait_3",  # slots: 3 tasks in a smoke run
          # engine: (a merge past its 0.5 s timeout - the same merge failing at once) / bare;
          # 2 suites at once made the failing merge the slower by more than the timeout
          "engine.test_gate_ratio",
          "gatewayblows.meter_diff",  # metered against served: 0 when they agree
          # gateway: CPU in 10 ms ticks over a smoke burst of 10 streams (~20 ms in all): a
          # round read 0.0 ticks on a loaded machine ([2.0, 0.0] ms per stream)
          "gateway.cpu_per_stream",
          # cage: caged - uncaged of one pair (a loaded machine can make the caged one faster)
          "cage.start_added", "cage.worker_start_added",
          # ssh: per worker is a difference of two steps (CPU in 10 ms ticks over a short
          # smoke window: the local controller's may be no tick at all)
          "ssh.worker_mem", "ssh.worker_uss", "ssh.worker_ssh_uss", "ssh.worker_cpu",
          "ssh.local_worker_mem", "ssh.local_worker_cpu", "ssh.local_cpu",
          # ray: the same, per followed job (threads: the difference of two counts)
          "ray.job_mem", "ray.job_uss", "ray.job_cpu", "ray.job_threads",
          "ray.local_job_mem", "ray.local_job_cpu", "ray.local_job_threads"}

QUIET = LoadReading(before=0.1, after=0.2, others=0.02)


def _prefix(name: str) -> str:
    return {"launch": "launcher."}.get(name, f"{name}.")


def _smoke_param(name: str) -> Any:
    if name == "ray":  # a local cluster of its own: with the Ray tests, one at a time
        return pytest.param(name, marks=[pytest.mark.xdist_group("ray-host"),
                                         pytest.mark.timeout(420)])
    if name in LONG:
        return pytest.param(name, marks=pytest.mark.long)
    return name


@pytest.mark.parametrize("name", [_smoke_param(n) for n in ORDER])
def test_benchmark_smoke(name: str) -> None:
    if name == "ray":
        from ray_cluster import ray_missing

        why = ray_missing()
        if why is not None:  # the ray extra is optional; CI installs it
            if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
                pytest.fail(why)
            pytest.skip(why)
    module = importlib.import_module(f"bench.{name}")
    runs = 1 if name in ONE_ROUND else RUNS
    result = module.run(smoke=True, runs=runs)
    assert isinstance(result, BenchResult)
    assert result.name == name and result.title == BENCHMARKS[name]
    result.check()  # samples finite and non-empty, at least one budget
    keys = [f.key for f in result.figures]
    assert len(set(keys)) == len(keys)
    assert {k for k in [*FIXED, *SIGNED] if k.startswith(_prefix(name))} <= set(keys)
    for fig in result.figures:
        assert fig.key.startswith(_prefix(name))
        expected = FIXED.get(fig.key, runs)
        if expected is None:
            assert len(fig.samples) >= runs, fig.key
        else:
            assert len(fig.samples) == expected, (fig.key, len(fig.samples))
        assert all(math.isfinite(x) for x in fig.samples), fig.key
        if fig.key not in SIGNED:
            assert min(fig.samples) > 0, (fig.key, fig.samples)
    result.load = QUIET
    report = render_report([result], {"cpu": "x"}, command="test", smoke=True)
    for fig in result.figures:  # each figure's row, with its budget and a verdict
        row = next(line for line in report.splitlines()
                   if line.startswith(f"| {result.title} | {fig.title} |"))
        if fig.budget is None:
            assert row.endswith("| — | — | (context) |") or (
                fig.no_baseline and row.endswith(f"(context; no budget: {fig.no_baseline}) |")
            ), row
        else:
            # a ratio to a baseline of the same run, the baseline's figure beside it
            base = next(f for f in result.figures if f.key == fig.baseline)
            op = "≥" if fig.better == "higher" else "≤"
            assert fig.unit == "×" and f"| {op} " in row, row
            assert f"| {base.title}: " in row and base.budget is None, row
            assert row.endswith("| **pass** |") or row.endswith("| **FAIL** |"), row


def test_a_budget_is_a_ratio_to_a_baseline_of_the_same_run() -> None:
    """An absolute budget passes or fails with the machine's speed, so every
    budget is a ratio (×) to a baseline figure the same result holds (one without a
    budget); a figure with no honest baseline has no budget and says why."""
    base = Figure("x.base", "bare thing (baseline)", "ms", [10.0, 12.0])
    ratio = Figure("x.ratio", "thing ÷ bare thing", "×", [1.1, 1.2], budget=1.5,
                   per="pair", baseline="x.base")
    BenchResult("x", "X", [ratio, base]).check()
    absolute = Figure("x.abs", "thing", "ms", [11.0], budget=300.0)
    with pytest.raises(ValueError, match="ratio"):
        BenchResult("x", "X", [absolute, base]).check()
    for bad in ("", "x.missing", "x.ratio"):
        orphan = Figure("x.ratio", "thing ÷ ?", "×", [1.1], budget=1.5, baseline=bad)
        with pytest.raises(ValueError, match="baseline"):
            BenchResult("x", "X", [orphan, base]).check()
    judged_base = Figure("x.base", "bare", "×", [1.0], budget=2.0, baseline="x.ratio")
    with pytest.raises(ValueError, match="baseline"):
        BenchResult("x", "X", [ratio, judged_base]).check()
    why = Figure("x.ctx", "stop()", "ms", [100.0], no_baseline="a fixed poll, not a speed")
    result = BenchResult("x", "X bench", [ratio, base, why], load=QUIET)
    result.check()
    text = render_report([result], {}, command="t", smoke=False)
    assert "| ≤ 1.50 × | bare thing (baseline): 11.0 ms | **pass** |" in text
    assert "| — | — | (context; no budget: a fixed poll, not a speed) |" in text
    assert "(baseline: bare thing (baseline), median 11.0 ms)" in text
    assert "budgets that travel" in text  # the rule is written at the top of the report
    assert ratio.to_json()["baseline"] == "x.base"
    assert why.to_json()["no_baseline"] == "a fixed poll, not a speed"


def test_every_benchmark_is_listed() -> None:
    here = Path(__file__).resolve().parents[2] / "bench"
    modules = {p.stem for p in here.glob("*.py")} - {"__init__", "__main__", "common",
                                                     "apphelp", "fleetfix",
                                                     "sshload", "sshbytes", "flood"}
    assert set(ORDER) == set(BENCHMARKS) == modules
    assert len(ORDER) == len(set(ORDER))


def test_figure_statistics_and_budget() -> None:
    fig = Figure("x.y", "a figure", "ms", [5.0, 1.0, 3.0, 2.0, 4.0], budget=3.0)
    assert (fig.median, fig.minimum, fig.maximum, fig.q1, fig.q3) == (3.0, 1.0, 5.0, 2.0, 4.0)
    assert fig.passed is True
    fig.budget = 2.9
    assert fig.passed is False
    higher = Figure("x.z", "rate", "events/s", [10.0, 30.0], budget=25.0, better="higher")
    assert higher.passed is False  # median 20
    p99 = Figure("x.p", "latency", "ms", [float(i) for i in range(1, 101)], budget=99.5,
                 per="press", stat="p99")
    assert math.isclose(p99.value, quantile(p99.samples, 0.99))
    assert p99.passed is True
    with pytest.raises(ValueError):
        Figure("x.bad", "bad", "ms", [float("nan")]).check()
    with pytest.raises(ValueError):
        Figure("x.empty", "empty", "ms", []).check()


def test_a_figure_with_no_sample_never_passes() -> None:
    empty = Figure("x.none", "key → frame", "ms", [], budget=100.0, per="press", stat="p99")
    assert not empty.measured and empty.passed is False and math.isnan(empty.value)
    assert Figure("x.ctx", "context", "ms", []).passed is None
    result = BenchResult("x", "X bench", [empty], seconds=1.0, load=QUIET)
    verdict = judge_run([result])
    assert verdict.code == EXIT_MISSED
    assert verdict.summary == ["No measurement (a failure): X bench: key → frame."]
    report = render_report([result], {}, command="t", smoke=False)
    assert "| **FAIL** (no measurement) |" in report and "| 0 presses |" in report
    assert "Every budget met" not in report
    assert json.dumps(empty.to_json())  # no NaN in the JSON
    assert empty.to_json()["value"] is None


def test_report_names_machine_budgets_and_failures() -> None:
    ok = Figure("a.ok", "fast thing", "ms", [1.0, 2.0, 3.0], budget=5.0)
    bad = Figure("a.bad", "slow thing", "ms", [9.0, 10.0, 11.0], budget=5.0)
    ctx = Figure("a.ctx", "baseline", "ms", [1.0])
    text = render_report([BenchResult("a", "A bench", [ok, bad, ctx], ["a note"], load=QUIET)],
                         {"cpu": "Test CPU", "cores": "2"}, command="python -m bench",
                         smoke=False)
    assert "Test CPU" in text and "cores: 2" in text
    assert "| A bench | fast thing | 2.00 ms |" in text
    assert "| ≤ 5.00 ms | — | **pass** |" in text and "| ≤ 5.00 ms | — | **FAIL** |" in text
    assert "| — | — | (context) |" in text
    assert "Budgets missed: A bench: slow thing." in text
    assert "**Result: FAILED (a budget missed)** (exit status 1)" in text
    assert "Every budget met" not in text
    assert "a note" in text and "other processes used 2% of the CPU" in text


def test_a_crashed_benchmark_is_reported_and_fails_the_run() -> None:
    ok = Figure("a.ok", "fast thing", "ms", [1.0], budget=5.0)
    results = [BenchResult("a", "A bench", [ok], load=QUIET)]
    crash = Crash("b", "B bench", "RuntimeError: the stand-in broke")
    verdict = judge_run(results, [crash])
    assert verdict.code == EXIT_CRASHED
    assert verdict.summary == ["Crashed: B bench (RuntimeError: the stand-in broke)."]
    text = render_report(results, {}, command="t", smoke=False, crashed=[crash])
    assert "| B bench | — | — | — | — | — | — | — | — | **CRASHED** (RuntimeError: the " \
        "stand-in broke) |" in text
    assert "Every budget met" not in text
    assert "**Result: FAILED (a benchmark crashed)** (exit status 2)" in text
    assert judge_run(results).code == EXIT_MET
    assert judge_run(results).summary == ["Every budget met."]
    assert judge_run([]).code == EXIT_CRASHED  # nothing ran: nothing was shown to pass


# --------------------------------------------------------------------------- the load


def test_judge_load_reasons_and_thresholds() -> None:
    assert judge_load(None) is None
    assert judge_load(LoadReading(before=None, after=None, others=None)) is None
    assert judge_load(QUIET) is None
    assert judge_load(LoadReading(before=0.9, after=1.8, others=0.25)) is None  # at the edge
    assert judge_load(LoadReading(before=0.2, after=0.3, others=0.48)) == \
        "other processes used 48% of the CPU during it"
    assert judge_load(LoadReading(before=1.6, after=0.3, others=0.1)) == \
        "load average 1.60 per core before it"
    # the load after includes the benchmark's own processes: judged only when the CPU
    # share of the others is unknown (off Linux)
    assert judge_load(LoadReading(before=0.2, after=1.7, others=0.1)) is None
    assert judge_load(LoadReading(before=0.2, after=1.7, others=None)) == \
        "load average 1.70 per core after it"
    both = judge_load(LoadReading(before=2.0, after=2.0, others=0.7))
    assert both == "other processes used 70% of the CPU during it; load average 2.00 per " \
                   "core before it"
    assert judge_load(LoadReading(before=0.2, after=0.2, others=0.3), busy_share=0.5) is None


def test_load_reading_between_two_samples() -> None:
    start = LoadSample(at=100.0, cores=2, load1=1.0, busy=500.0, own=10.0)
    # 4 s of wall time on 2 cores = 8 CPU-seconds; the machine was busy 5 of them, the
    # benchmark itself used 3: the others used 2 of 8 = 25%
    end = LoadSample(at=104.0, cores=2, load1=3.0, busy=505.0, own=13.0)
    reading = LoadReading.between(start, end)
    assert reading == LoadReading(before=0.5, after=1.5, others=0.25)
    assert reading.describe() == ("load average 0.50 → 1.50 per core, other processes used "
                                  "25% of the CPU")
    # the process accounting may run ahead of /proc/stat: never below 0
    ahead = LoadSample(at=104.0, cores=2, load1=1.0, busy=501.0, own=13.0)
    assert LoadReading.between(start, ahead).others == 0.0
    unknown = LoadSample(at=104.0, cores=2, load1=None, busy=None, own=13.0)
    assert LoadReading.between(start, unknown) == LoadReading(before=0.5, after=None,
                                                              others=None)


def test_load_sample_reads_this_machine() -> None:
    first = LoadSample.take()
    total = 0
    # CPU work of our own until the process's CPU time shows it: the kernel counts it in
    # clock ticks (10 ms), and ~25 ms of work on a loaded machine once read as none
    deadline = time.monotonic() + 60
    while True:
        for i in range(100_000):
            total += i * i
        second = LoadSample.take()
        if second.own > first.own or time.monotonic() > deadline:
            break
    assert total > 0 and first.cores >= 1
    assert second.at > first.at and second.own > first.own
    assert first.load1 is not None and first.load1 >= 0
    if Path("/proc/stat").exists():
        assert first.busy is not None and second.busy is not None
        assert second.busy >= first.busy > 0
        others = LoadReading.between(first, second).others
        assert others is not None and 0.0 <= others <= 1.0


# --------------------------------------------------------------------------- the command


def _fixed_load(before: float, after: float, others: float) -> Callable[[], LoadSample]:
    """Load samples that read as `before`/`after` load per core (2 cores) and `others`
    share of the CPU over each benchmark (every call is 10 s after the previous one)."""
    clock = iter(range(0, 10_000, 10))
    state = {"busy": 0.0}

    def sample() -> LoadSample:
        at = float(next(clock))
        state["busy"] += others * 10 * 2
        return LoadSample(at=at, cores=2, load1=(before if at % 20 == 0 else after) * 2,
                          busy=state["busy"], own=0.0)

    return sample


QUIET_MACHINE = _fixed_load(0.1, 0.1, 0.0)
BUSY_MACHINE = _fixed_load(0.4, 0.9, 0.55)


@pytest.fixture
def standin_benchmarks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """STAND-INS for benchmarks (a real one cannot be made to crash or to miss on purpose):
    modules bench.t_ok, bench.t_slow, bench.t_empty and bench.t_crash, registered
    beside the real ones for one test."""
    def ok(smoke: bool = False, runs: int | None = None) -> BenchResult:
        return BenchResult("t_ok", "T ok", [Figure("t_ok.x", "quick", "ms", [1.0, 2.0],
                                                    budget=10.0)])

    def slow(smoke: bool = False, runs: int | None = None) -> BenchResult:
        return BenchResult("t_slow", "T slow", [Figure("t_slow.x", "sluggish", "ms", [50.0],
                                                        budget=10.0)])

    def empty(smoke: bool = False, runs: int | None = None) -> BenchResult:
        return BenchResult("t_empty", "T empty", [Figure("t_empty.x", "no presses", "ms", [],
                                                          budget=10.0, per="press")])

    def crash(smoke: bool = False, runs: int | None = None) -> BenchResult:
        raise RuntimeError("the stand-in benchmark broke")

    runs = {"t_ok": ok, "t_slow": slow, "t_empty": empty, "t_crash": crash}
    titles = {"t_ok": "T ok", "t_slow": "T slow", "t_empty": "T empty", "t_crash": "T crash"}
    for name, fn in runs.items():
        module = types.ModuleType(f"bench.{name}")
        module.__dict__["run"] = fn
        monkeypatch.setitem(sys.modules, f"bench.{name}", module)
        monkeypatch.setitem(BENCHMARKS, name, titles[name])
    monkeypatch.setattr(bench_main, "ORDER", [*ORDER, *runs])
    yield


def _run(tmp_path: Path, *argv: str, load: Callable[[], LoadSample] = QUIET_MACHINE
         ) -> tuple[int, str, dict[str, object]]:
    out = tmp_path / "RESULTS.md"
    code = main([*argv, "--out", str(out)], sample_load=load)
    return code, out.read_text(), json.loads(out.with_suffix(".json").read_text())


def test_command_exit_status_says_what_happened(tmp_path: Path, standin_benchmarks: None
                                                ) -> None:
    code, text, data = _run(tmp_path, "t_ok")
    assert code == EXIT_MET and "Every budget met." in text and data["exit_status"] == 0
    assert "**Result: every budget met** (exit status 0)" in text

    code, text, data = _run(tmp_path, "t_ok", "t_slow")
    assert code == EXIT_MISSED
    assert "Budgets missed: T slow: sluggish." in text and "Every budget met" not in text

    code, text, data = _run(tmp_path, "t_ok", "t_empty")
    assert code == EXIT_MISSED
    assert "No measurement (a failure): T empty: no presses." in text
    assert "| **FAIL** (no measurement) |" in text and "Every budget met" not in text

    code, text, data = _run(tmp_path, "t_ok", "t_crash")
    assert code == EXIT_CRASHED
    assert "Crashed: T crash (RuntimeError: the stand-in benchmark broke)." in text
    assert "| T crash | — |" in text and "**CRASHED**" in text
    assert "Every budget met" not in text
    assert data["crashed"] == [{"name": "t_crash", "title": "T crash",
                                "error": "RuntimeError: the stand-in benchmark broke"}]
    # the row of the benchmark that did run is still there, and passes
    assert "| T ok | quick |" in text and "| ≤ 10.0 ms | — | **pass** |" in text


def test_busy_machine_is_not_judged_unless_asked(tmp_path: Path, standin_benchmarks: None
                                                 ) -> None:
    why = "other processes used 55% of the CPU during it"
    code, text, data = _run(tmp_path, "t_ok", "t_slow", load=BUSY_MACHINE)
    assert code == EXIT_NOT_JUDGED and data["exit_status"] == 3
    assert f"| machine busy ({why}): not judged |" in text
    assert "**pass**" not in text and "**FAIL**" not in text  # neither a pass nor a fail
    assert "Not judged, the machine was too busy: T ok (" + why in text
    assert "--judge-anyway" in text and "Every budget met" not in text
    results = data["results"]
    assert isinstance(results, list) and results[0]["not_judged"] == why
    assert results[0]["load"] == pytest.approx({"before_per_core": 0.4, "after_per_core": 0.9,
                                                "others_share": 0.55})

    code, text, _ = _run(tmp_path, "t_ok", "t_slow", "--judge-anyway", load=BUSY_MACHINE)
    assert code == EXIT_MISSED
    assert "| **pass** (judged on a busy machine) |" in text
    assert "| **FAIL** (judged on a busy machine) |" in text
    code, _, _ = _run(tmp_path, "t_ok", "--judge-anyway", load=BUSY_MACHINE)
    assert code == EXIT_MET

    # busy never hides a crash or a benchmark that measured nothing
    assert _run(tmp_path, "t_ok", "t_crash", load=BUSY_MACHINE)[0] == EXIT_CRASHED
    assert _run(tmp_path, "t_ok", "t_empty", load=BUSY_MACHINE)[0] == EXIT_MISSED
    # the load before a benchmark alone is enough to call the machine busy
    code, text, _ = _run(tmp_path, "t_ok", load=_fixed_load(1.5, 0.2, 0.0))
    assert code == EXIT_NOT_JUDGED and "load average 1.50 per core before it" in text


def test_command_runs_a_real_benchmark(tmp_path: Path) -> None:
    code, text, data = _run(tmp_path, "--smoke", "parser")
    assert code in (EXIT_MET, EXIT_MISSED)  # missed only if the smoke-size ratio misses
    assert "# fleet-tui benchmarks" in text and "Smoke mode" in text
    assert "| 1. Parser | stream.py ÷ json.loads (lines/s) |" in text
    assert "- python: CPython" in text and "- textual: " in text
    assert "other processes used 0% of the CPU" in text
    results = data["results"]
    assert isinstance(results, list) and [r["name"] for r in results] == ["parser"]
    assert [f["n"] for f in results[0]["figures"]] == [2, 2, 2]
    assert results[0]["figures"][0]["baseline"] == "parser.json"
    assert "| ≥ 0.90 × | bare json.loads loop (baseline): " in text


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["nosuchbench"])
    assert exc.value.code == 2
    assert "unknown benchmark nosuchbench" in capsys.readouterr().err
    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit) as exc:
            main(["--runs", bad, "parser"])
        assert exc.value.code == 2
        assert "--runs" in capsys.readouterr().err


def test_long_ones_run_when_asked_and_the_table_keeps_every_benchmark(
        tmp_path: Path, standin_benchmarks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m bench` alone skips the long benchmarks (`--long`, or naming one, runs
    it); RESULTS.md is one table of every benchmark, each row from its latest run with
    its date and load, while the verdict is the run's own; HISTORY.md gets each run."""
    monkeypatch.setattr(bench_main, "ORDER", ["t_ok", "t_slow"])
    monkeypatch.setitem(bench_main.LONG, "t_slow", "a stand-in that would take long")
    code, text, data = _run(tmp_path)
    assert code == EXIT_MET and [r["name"] for r in data["results"]] == ["t_ok"]
    assert "| T slow (long: `--long`) | — | — | — | not run into this table yet |" in text
    code, text, data = _run(tmp_path, "--long")
    assert code == EXIT_MISSED and [r["name"] for r in data["results"]] == ["t_ok", "t_slow"]
    code, text, data = _run(tmp_path, "t_ok")
    assert code == EXIT_MET  # the run's verdict: t_slow did not run in it
    assert [r["name"] for r in data["results"]] == ["t_ok", "t_slow"]  # kept, in order
    slow_row = next(line for line in text.splitlines() if line.startswith("| T slow | 20"))
    assert "UTC |" in slow_row and "load average 0.10 → 0.10 per core" in slow_row
    assert "`python -m bench --long`" in slow_row  # the run it comes from
    assert "| T slow | sluggish | 50.0 ms |" in text and "| **FAIL** |" in text
    history = (tmp_path / "HISTORY.md").read_text()
    runs = [line for line in history.splitlines() if line.startswith("## ")]
    assert len(runs) == 3 and "`python -m bench t_ok`" in runs[0]  # the newest first
    assert "`python -m bench --long`" in runs[1] and "FAILED" in runs[1]
    # a smoke run neither mixes with the full runs' table nor goes into the history
    code, text, data = _run(tmp_path, "--smoke", "t_ok")
    assert [r["name"] for r in data["results"]] == ["t_ok"]
    assert (tmp_path / "HISTORY.md").read_text() == history


def test_the_report_is_written_after_each_benchmark(
        tmp_path: Path, standin_benchmarks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run stopped inside a benchmark (ctrl-c here; SIGTERM becomes the same in
    `python -m bench`) keeps the rows of those that finished before it."""
    def interrupted(smoke: bool = False, runs: int | None = None) -> BenchResult:
        raise KeyboardInterrupt

    module = types.ModuleType("bench.t_stop")
    module.__dict__["run"] = interrupted
    monkeypatch.setitem(sys.modules, "bench.t_stop", module)
    monkeypatch.setitem(BENCHMARKS, "t_stop", "T stop")
    monkeypatch.setattr(bench_main, "ORDER", ["t_ok", "t_stop"])
    out = tmp_path / "RESULTS.md"
    with pytest.raises(KeyboardInterrupt):
        main(["--out", str(out)], sample_load=QUIET_MACHINE)
    text = out.read_text()
    assert "| T ok | quick | 1.50 ms |" in text and "| T stop | stopped" not in text
    assert "| T stop | — | — | — | not run into this table yet |" in text
    assert "(in progress: t_stop still to run)" in text
    assert not (tmp_path / "HISTORY.md").exists()  # a run that did not end: no history
