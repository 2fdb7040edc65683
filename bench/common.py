"""What every benchmark shares: figures and their statistics, an isolated environment,
scratch git repositories, the stand-in `claude`, the machine description and the report.

A figure keeps every sample it was computed from, so the report can show the median and
the spread (min–max and the interquartile range) and nothing is summarised twice.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
SAMPLES_DIR = REPO_ROOT / "tests" / "support" / "fixtures" / "stream-json"

_SCRUB_PREFIXES = ("ANTHROPIC_", "FLEET_WORKER_", "FLEET_TUI_", "CLAUDE_")
_SCRUB_NAMES = ("ZHIPU_API_KEY", "GLM_API_KEY", "IS_SANDBOX", "HTTPS_PROXY", "HTTP_PROXY",
                "https_proxy", "http_proxy", "ALL_PROXY", "all_proxy")


# --------------------------------------------------------------------------- statistics


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (q in [0, 1]) of a non-empty sequence."""
    if not values:
        raise ValueError("quantile of no values")
    data = sorted(values)
    if len(data) == 1:
        return data[0]
    pos = q * (len(data) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


@dataclass
class Figure:
    """One measured quantity over several runs, and its budget.

    `samples` hold one value per run (or per observation, see `per`). The budget is
    compared with `stat` of the samples (the median, or the 99th percentile for latencies
    sampled press by press); `better` says which way passes.
    """

    key: str
    title: str
    unit: str
    samples: list[float]
    budget: float | None = None
    better: str = "lower"  # "lower": median <= budget passes; "higher": median >= budget
    per: str = "run"  # what one sample is: "run", "press", "step", "pair"
    note: str = ""
    stat: str = "median"  # "median" | "p99": what the budget is compared with
    # A budget is a ratio (unit "×") to a baseline the same run measured on the same
    # machine: `baseline` is the key of that baseline's figure in the same result. A figure
    # that has no honest baseline has no budget; `no_baseline` says why (shown in its row).
    baseline: str = ""
    no_baseline: str = ""

    @property
    def measured(self) -> bool:
        """False when the benchmark took no sample at all: then there is nothing to judge,
        and a figure with a budget fails (a missing measurement never passes)."""
        return bool(self.samples)

    @property
    def value(self) -> float:
        """What the budget is compared with; NaN when nothing was measured."""
        if not self.samples:
            return math.nan
        return quantile(self.samples, 0.99) if self.stat == "p99" else self.median

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else math.nan

    @property
    def minimum(self) -> float:
        return min(self.samples) if self.samples else math.nan

    @property
    def maximum(self) -> float:
        return max(self.samples) if self.samples else math.nan

    @property
    def q1(self) -> float:
        return quantile(self.samples, 0.25) if self.samples else math.nan

    @property
    def q3(self) -> float:
        return quantile(self.samples, 0.75) if self.samples else math.nan

    @property
    def p99(self) -> float:
        return quantile(self.samples, 0.99) if self.samples else math.nan

    @property
    def passed(self) -> bool | None:
        """None when the figure has no budget (context only); False when it has a budget
        but no sample (nothing measured is never a pass)."""
        if self.budget is None:
            return None
        if not self.samples:
            return False
        if self.better == "higher":
            return self.value >= self.budget
        return self.value <= self.budget

    def check(self) -> None:
        """Raise ValueError unless the figure is well formed (used by the smoke tests)."""
        if not self.key or not self.title or not self.unit:
            raise ValueError(f"figure {self.key!r} lacks a key, title or unit")
        if not self.samples:
            raise ValueError(f"figure {self.key!r} has no samples")
        for value in self.samples:
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"figure {self.key!r} has a bad sample {value!r}")
        if self.stat not in ("median", "p99"):
            raise ValueError(f"figure {self.key!r}: stat must be median or p99")
        if self.better not in ("lower", "higher"):
            raise ValueError(f"figure {self.key!r}: better must be lower or higher")
        if self.budget is not None and not math.isfinite(self.budget):
            raise ValueError(f"figure {self.key!r} has a bad budget {self.budget!r}")

    def to_json(self) -> dict[str, object]:
        def num(x: float) -> float | None:  # JSON has no NaN: an unmeasured value is null
            return None if math.isnan(x) else x

        return {"key": self.key, "title": self.title, "unit": self.unit,
                "stat": self.stat, "value": num(self.value), "median": num(self.median),
                "min": num(self.minimum), "max": num(self.maximum),
                "q1": num(self.q1), "q3": num(self.q3), "n": len(self.samples),
                "per": self.per, "budget": self.budget, "better": self.better,
                "passed": self.passed, "measured": self.measured,
                "samples": self.samples, "note": self.note, "baseline": self.baseline or None,
                "no_baseline": self.no_baseline or None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Figure:
        return cls(key=str(data["key"]), title=str(data["title"]), unit=str(data["unit"]),
                   samples=[float(x) for x in data.get("samples") or []],
                   budget=data.get("budget"), better=str(data.get("better") or "lower"),
                   per=str(data.get("per") or "run"), note=str(data.get("note") or ""),
                   stat=str(data.get("stat") or "median"),
                   baseline=str(data.get("baseline") or ""),
                   no_baseline=str(data.get("no_baseline") or ""))


@dataclass
class BenchResult:
    """What one benchmark returns: its figures and free-text findings for the report."""

    name: str
    title: str
    figures: list[Figure]
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    load: LoadReading | None = None  # the machine around the run (set by python -m bench)
    # when it ran and by which command (set by python -m bench; a result carried over
    # from an earlier run into the current table keeps its own)
    date: str = ""
    command: str = ""
    judged_anyway: bool = False

    def check(self) -> None:
        if not self.figures:
            raise ValueError(f"benchmark {self.name} produced no figures")
        for fig in self.figures:
            fig.check()
        budgets = [f for f in self.figures if f.budget is not None]
        if not budgets:
            raise ValueError(f"benchmark {self.name} has no figure with a budget")
        keys = {f.key: f for f in self.figures}
        for fig in budgets:  # the rule of bench/README.md: budgets that travel
            if fig.unit != "×" or fig.baseline not in keys or fig.baseline == fig.key:
                raise ValueError(
                    f"figure {fig.key!r}: a budget must be a ratio (unit ×) to a baseline "
                    "figure of the same result, measured in the same run (set `baseline`)")
            if keys[fig.baseline].budget is not None:
                raise ValueError(f"figure {fig.key!r}: its baseline {fig.baseline!r} is "
                                 "a figure with a budget")

    def to_json(self, not_judged: str | None = None) -> dict[str, object]:
        return {"name": self.name, "title": self.title, "seconds": self.seconds,
                "notes": self.notes, "date": self.date, "command": self.command,
                "judged_anyway": self.judged_anyway,
                "load": self.load.to_json() if self.load is not None else None,
                "not_judged": not_judged, "figures": [f.to_json() for f in self.figures]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BenchResult:
        """A result as `to_json` wrote it (RESULTS.json), to carry it into a later report."""
        load = data.get("load")
        return cls(
            name=str(data["name"]), title=str(data["title"]),
            figures=[Figure.from_json(f) for f in data.get("figures", [])],
            notes=[str(n) for n in data.get("notes", [])],
            seconds=float(data.get("seconds") or 0.0),
            load=None if not load else LoadReading(
                before=load.get("before_per_core"), after=load.get("after_per_core"),
                others=load.get("others_share")),
            date=str(data.get("date") or ""), command=str(data.get("command") or ""),
            judged_anyway=bool(data.get("judged_anyway")))

    def baseline_of(self, fig: Figure) -> Figure | None:
        return next((f for f in self.figures if fig.baseline and f.key == fig.baseline),
                    None)


def ms(seconds: float) -> float:
    return seconds * 1000.0


# --------------------------------------------------------------------------- environment


@dataclass
class BenchEnv:
    """A private HOME, FLEET_TUI_HOME and XDG dirs under one scratch directory.

    `env` is the full environment for child processes; while the context is open the same
    values are set in os.environ too, so in-process code (paths.home()) sees them.
    """

    root: Path
    env: dict[str, str]

    @property
    def home(self) -> Path:
        return Path(self.env["HOME"])

    @property
    def fleet_home(self) -> Path:
        return Path(self.env["FLEET_TUI_HOME"])


def _scrubbed(base: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in base.items()
            if not (k.startswith(_SCRUB_PREFIXES) or k in _SCRUB_NAMES)}


@contextlib.contextmanager
def bench_env(prefix: str = "fleet-bench-") -> Iterator[BenchEnv]:
    """Open an isolated environment; everything under it is removed on exit."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    home = root / "home"
    home.mkdir()
    env = _scrubbed(os.environ)
    env.update({
        "HOME": str(home),
        "FLEET_TUI_HOME": str(root / "fleet-home"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "GIT_AUTHOR_NAME": "Fleet Bench",
        "GIT_AUTHOR_EMAIL": "bench@example.invalid",
        "GIT_COMMITTER_NAME": "Fleet Bench",
        "GIT_COMMITTER_EMAIL": "bench@example.invalid",
        "GIT_CONFIG_NOSYSTEM": "1",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p),
    })
    if os.geteuid() == 0:
        env["FLEET_WORKER_SANDBOX"] = "1"  # claude's root rule; the stand-in ignores it
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield BenchEnv(root=root, env=env)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(root, ignore_errors=True)


def git(cwd: Path, *args: str, env: Mapping[str, str] | None = None) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                         env=dict(env) if env is not None else None)
    return out.stdout


def make_repo(path: Path, files: Mapping[str, str] | None = None) -> Path:
    """A real git repository on `main` with one commit of `files` (or a README)."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.name", "Fleet Bench")
    git(path, "config", "user.email", "bench@example.invalid")
    for name, text in (files or {"README.md": "# bench\n"}).items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


# --------------------------------------------------------------------------- stand-in claude

_STANDIN_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int main(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const char *stamp = getenv("BENCH_STAMP_FILE");
    if (stamp) {
        FILE *f = fopen(stamp, "a");
        if (f) {
            fprintf(f, "%lld\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
            fclose(f);
        }
    }
    if (getenv("BENCH_PRINT_RESULT")) {
        fputs("{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,"
              "\"result\":\"done\",\"num_turns\":1,\"session_id\":\"bench\","
              "\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}\n", stdout);
    }
    return 0;
}
"""

_STANDIN_PY = """\
import os, time
t = time.monotonic_ns()
p = os.environ.get("BENCH_STAMP_FILE")
if p:
    with open(p, "a") as f:
        f.write(f"{t}\\n")
if os.environ.get("BENCH_PRINT_RESULT"):
    print('{"type":"result","subtype":"success","is_error":false,"result":"done",'
          '"num_turns":1,"session_id":"bench","usage":{"input_tokens":1,"output_tokens":1}}')
"""


def build_standin(directory: Path) -> Path:
    """A stand-in for `claude` (nothing real can be timed here without a network): it
    records CLOCK_MONOTONIC at its first instruction into $BENCH_STAMP_FILE, prints one
    successful result line when $BENCH_PRINT_RESULT is set, and exits 0.

    Compiled from C when a compiler is present (so its own start-up is ~1 ms); otherwise
    a Python script started with -S -E (slower, but the same in both arms of a ratio).
    """
    directory.mkdir(parents=True, exist_ok=True)
    exe = directory / "claude"
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc:
        src = directory / "standin.c"
        src.write_text(_STANDIN_C)
        done = subprocess.run([cc, "-O2", "-o", str(exe), str(src)], capture_output=True,
                              check=False)
        if done.returncode == 0:
            return exe
    exe.write_text(f"#!{sys.executable} -S -E\n{_STANDIN_PY}")
    exe.chmod(0o755)
    return exe


def read_stamps(path: Path) -> list[int]:
    try:
        return [int(x) for x in path.read_text().split()]
    except FileNotFoundError:
        return []


# --------------------------------------------------------------------------- the machine


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(module: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return "not installed"


def _mem_total() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                kib = int(line.split()[1])
                return f"{kib / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError):
        pass
    return "unknown"


def machine_info() -> dict[str, str]:
    git_version = subprocess.run(["git", "--version"], capture_output=True, text=True,
                                 check=False).stdout.strip()
    return {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count() or 0),
        "memory": _mem_total(),
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "textual": _version("textual"),
        "msgspec": _version("msgspec"),
        "git": git_version,
    }


# --------------------------------------------------------------------------- the load

# A benchmark is not judged when the machine was too busy for its figures to mean anything:
# other processes took more than BUSY_SHARE of all CPU time while it ran, or the 1-minute
# load average per core was above BUSY_LOAD before it started.
BUSY_SHARE = 0.25
BUSY_LOAD = 1.0


def _machine_busy_seconds() -> float | None:
    """CPU-seconds the whole machine has spent busy since boot (Linux /proc/stat: user,
    nice, system, irq, softirq and steal — steal is CPU a hypervisor gave to others)."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            fields = handle.readline().split()
        ticks = [int(x) for x in fields[1:9]]
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None
    if not fields or fields[0] != "cpu" or len(ticks) < 8 or hz <= 0:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    return (user + nice + system + irq + softirq + steal) / hz


@dataclass(frozen=True)
class LoadSample:
    """The machine at one moment, taken just before and just after each benchmark."""

    at: float  # time.monotonic()
    cores: int
    load1: float | None  # the 1-minute load average (None where the OS has none)
    busy: float | None  # CPU-seconds the machine has been busy since boot (None off Linux)
    own: float  # CPU-seconds used by this process and the children it has waited for

    @classmethod
    def take(cls) -> LoadSample:
        try:
            load1: float | None = os.getloadavg()[0]
        except OSError:
            load1 = None
        t = os.times()
        return cls(at=time.monotonic(), cores=os.cpu_count() or 1, load1=load1,
                   busy=_machine_busy_seconds(),
                   own=t.user + t.system + t.children_user + t.children_system)


@dataclass(frozen=True)
class LoadReading:
    """The load around one benchmark.

    `before`/`after`: the 1-minute load average per core when it started and ended (the
    one after includes the benchmark's own processes, so it is recorded, not judged,
    when `others` is known). `others`: the share of all the machine's CPU time (0–1) that
    processes other than the benchmark used while it ran — the machine's busy time
    minus the benchmark's own CPU time, over wall time × cores.
    """

    before: float | None
    after: float | None
    others: float | None

    @classmethod
    def between(cls, start: LoadSample, end: LoadSample) -> LoadReading:
        cores = max(1, start.cores)
        wall = end.at - start.at
        others: float | None = None
        if start.busy is not None and end.busy is not None and wall > 0:
            used = (end.busy - start.busy) - (end.own - start.own)
            others = min(1.0, max(0.0, used / (wall * cores)))
        return cls(before=None if start.load1 is None else start.load1 / cores,
                   after=None if end.load1 is None else end.load1 / cores, others=others)

    def describe(self) -> str:
        parts = []
        if self.before is not None and self.after is not None:
            parts.append(f"load average {self.before:.2f} → {self.after:.2f} per core")
        if self.others is not None:
            parts.append(f"other processes used {self.others:.0%} of the CPU")
        return ", ".join(parts) or "load unknown"

    def to_json(self) -> dict[str, float | None]:
        return {"before_per_core": self.before, "after_per_core": self.after,
                "others_share": self.others}


def judge_load(reading: LoadReading | None, *, busy_share: float = BUSY_SHARE,
               busy_load: float = BUSY_LOAD) -> str | None:
    """Why the machine was too busy to judge a benchmark, or None when it was quiet
    enough (or nothing is known about it)."""
    if reading is None:
        return None
    reasons = []
    if reading.others is not None and reading.others > busy_share:
        reasons.append(f"other processes used {reading.others:.0%} of the CPU during it")
    if reading.before is not None and reading.before > busy_load:
        reasons.append(f"load average {reading.before:.2f} per core before it")
    if reading.others is None and reading.after is not None and reading.after > busy_load:
        reasons.append(f"load average {reading.after:.2f} per core after it")
    return "; ".join(reasons) or None


# --------------------------------------------------------------------------- the verdict

EXIT_MET = 0  # every budget judged and met
EXIT_MISSED = 1  # a budget missed, or a figure with a budget measured nothing
EXIT_CRASHED = 2  # a benchmark raised (argparse's usage errors exit 2 as well)
EXIT_NOT_JUDGED = 3  # nothing missed or crashed, but the machine was too busy to judge


@dataclass(frozen=True)
class Crash:
    """A benchmark that raised instead of returning its figures."""

    name: str
    title: str
    error: str  # one line: "TypeError: what it said"


@dataclass(frozen=True)
class RunVerdict:
    """What a run of benchmarks comes to: its exit status and the sentences that say
    why (the report's summary). Worked out once, so the report and the exit status agree."""

    code: int
    summary: list[str]
    busy: dict[str, str]  # benchmark name → why it was not judged


def judge_run(results: Sequence[BenchResult], crashed: Sequence[Crash] = (), *,
              judge_anyway: bool = False) -> RunVerdict:
    busy = {} if judge_anyway else {
        r.name: why for r in results if (why := judge_load(r.load)) is not None}
    unmeasured = [f"{r.title}: {f.title}" for r in results for f in r.figures
                  if f.budget is not None and not f.measured]
    missed = [f"{r.title}: {f.title}" for r in results for f in r.figures
              if f.measured and f.passed is False and r.name not in busy]
    judged = [f for r in results if r.name not in busy for f in r.figures
              if f.passed is not None]
    summary = []
    if crashed:
        summary.append("Crashed: " + "; ".join(f"{c.title} ({c.error})" for c in crashed)
                       + ".")
    if unmeasured:
        summary.append("No measurement (a failure): " + "; ".join(unmeasured) + ".")
    if missed:
        summary.append("Budgets missed: " + "; ".join(missed) + ".")
    if busy:
        summary.append("Not judged, the machine was too busy: " + "; ".join(
            f"{r.title} ({busy[r.name]})" for r in results if r.name in busy)
            + ". Run them again on a quiet machine, or pass --judge-anyway.")
    if crashed or not results:
        code = EXIT_CRASHED
    elif unmeasured or missed:
        code = EXIT_MISSED
    elif busy:
        code = EXIT_NOT_JUDGED
    else:
        code = EXIT_MET
    if code == EXIT_MET:
        summary.append("Every budget met." if judged else "No budget was judged.")
    if not results and not crashed:
        summary.append("No benchmark ran.")
    return RunVerdict(code=code, summary=summary, busy=busy)


# --------------------------------------------------------------------------- the report


def _fmt(value: float, unit: str) -> str:
    if math.isnan(value):
        return "—"
    if unit in ("events/s", "lines/s"):
        return f"{value:,.0f}"
    if unit == "×":
        return f"{value:.2f}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _budget_text(fig: Figure) -> str:
    if fig.budget is None:
        return "—"
    op = "≥" if fig.better == "higher" else "≤"
    where = " (p99)" if fig.stat == "p99" else ""
    return f"{op} {_fmt(fig.budget, fig.unit)} {fig.unit}{where}"


def _plural(word: str) -> str:
    return word + ("es" if word.endswith("s") else "s")


def _baseline_text(res: BenchResult, fig: Figure) -> str:
    base = res.baseline_of(fig)
    if base is None:
        return "—"
    return f"{base.title}: {_fmt(base.median, base.unit)} {base.unit}"


def _verdict(fig: Figure, busy: str | None = None, judged_busy: bool = False) -> str:
    if fig.passed is None:
        if fig.no_baseline:
            return f"(context; no budget: {fig.no_baseline})"
        return "(context)"
    if not fig.measured:
        return "**FAIL** (no measurement)"
    if busy is not None:
        return f"machine busy ({busy}): not judged"
    text = "**pass**" if fig.passed else "**FAIL**"
    return text + (" (judged on a busy machine)" if judged_busy else "")


RULE = ("**The rule: budgets that travel.** Every budget is a ratio (×) to a baseline that "
        "the same run measures on the same machine — the bare thing doing the same work "
        "(bare `json.loads`, a bare Textual app, bare git, a bare Python start), measured "
        "in pairs, interleaved with the subject, so load and the machine's speed hit both "
        "alike; the baseline's figure is shown beside each budget. A figure with no honest "
        "baseline gets no budget: it is context, and its row says why. Each budget is set "
        "from runs on a quiet machine, with headroom, and must give the same verdict on a "
        "machine twice as slow. The load is recorded before and after each benchmark; a "
        "benchmark measured while the machine was too busy is not judged. New benchmarks "
        "(the gateway, remote hosts, ...) follow the same rule; see bench/README.md.")

_RESULT_WORDS = {EXIT_MET: "every budget met", EXIT_MISSED: "FAILED (a budget missed)",
                 EXIT_CRASHED: "FAILED (a benchmark crashed)",
                 EXIT_NOT_JUDGED: "NOT JUDGED (the machine was too busy)"}


def _run_cell(res: BenchResult) -> str:
    load = res.load.describe() if res.load is not None else "load unknown"
    return f"{res.date or '—'} | {res.seconds:.0f} s | {load}"


def render_report(results: Sequence[BenchResult], machine: Mapping[str, str], *,
                  command: str, smoke: bool, crashed: Sequence[Crash] = (),
                  judge_anyway: bool = False,
                  table: Sequence[BenchResult] | None = None,
                  missing: Sequence[str] = ()) -> str:
    """The report of a run: its verdict (this run's benchmarks alone), then one table of
    every benchmark in `table` (this run's and those carried over from earlier runs, each
    with its own date and load; default: this run's), then each one's details. `missing`:
    the titles of the benchmarks no run has put in the table yet (listed, so the table
    says it lacks them)."""
    verdict = judge_run(results, crashed, judge_anyway=judge_anyway)
    current = {id(r) for r in results}
    shown = list(results) if table is None else list(table)
    busy: dict[int, str] = {}
    judged_busy: set[int] = set()
    for res in shown:
        anyway = judge_anyway if id(res) in current else res.judged_anyway
        why = judge_load(res.load)
        if why is not None and anyway:
            judged_busy.add(id(res))
        elif why is not None:
            busy[id(res)] = why
    lines = ["# fleet-tui benchmarks", ""]
    lines.append(f"Written by `{command}` — do not edit by hand; run it again instead. "
                 "Each benchmark's row holds its latest run (a run of some benchmarks "
                 "keeps the others' from before, with their own date and load); earlier "
                 "runs are in HISTORY.md.")
    if smoke:
        lines.append("")
        lines.append("**Smoke mode: tiny sizes, figures are NOT comparable with the budgets.**")
    lines += ["", f"**Result: {_RESULT_WORDS[verdict.code]}** (exit status {verdict.code})"
              " — of the benchmarks this run ran.", "", "## Machine", ""]
    for key, value in machine.items():
        lines.append(f"- {key}: {value}")
    lines += ["", RULE, "", "## Runs", "",
              "| benchmark | ran (UTC) | took | load | by |", "|---|---|---|---|---|"]
    for res in shown:
        by = "this run" if id(res) in current else f"`{res.command}`" if res.command else "—"
        lines.append(f"| {res.title} | {_run_cell(res)} | {by} |")
    for crash in crashed:
        lines.append(f"| {crash.title} | — | — | — | this run: **CRASHED** |")
    for title in missing:
        lines.append(f"| {title} | — | — | — | not run into this table yet |")
    lines += ["", "## Summary", "",
              "| benchmark | figure | median | p99 | spread (min–max) | IQR | n | budget "
              "| result |",
              "|---|---|---|---|---|---|---|---|---|"]
    for res in shown:
        for fig in res.figures:
            u = fig.unit
            lines.append(
                f"| {res.title} | {fig.title} | {_fmt(fig.median, u)} {u} "
                f"| {_fmt(fig.p99, u) if fig.per != 'run' else '—'} "
                f"| {_fmt(fig.minimum, u)}–{_fmt(fig.maximum, u)} "
                f"| {_fmt(fig.q1, u)}–{_fmt(fig.q3, u)} | {len(fig.samples)} {_plural(fig.per)} "
                f"| {_budget_text(fig)} | {_baseline_text(res, fig)} "
                f"| {_verdict(fig, busy.get(id(res)), id(res) in judged_busy)} |")
    for crash in crashed:
        lines.append(f"| {crash.title} | — | — | — | — | — | — | — | — "
                     f"| **CRASHED** ({crash.error}) |")
    lines.append("")
    lines += verdict.summary
    lines += ["", "## Details", ""]
    for res in shown:
        lines.append(f"### {res.title}")
        lines.append("")
        load = f"; {res.load.describe()}" if res.load is not None else ""
        when = f", {res.date}" if res.date else ""
        lines.append(f"(`bench/{res.name}.py`{when}, {res.seconds:.1f} s{load})")
        lines.append("")
        for fig in res.figures:
            note = f" — {fig.note}" if fig.note else ""
            base = res.baseline_of(fig)
            if base is not None:
                note += f" (baseline: {base.title}, median {_fmt(base.median, base.unit)} "\
                        f"{base.unit})"
            if not fig.measured:
                lines.append(f"- **{fig.title}**: no measurement (0 {_plural(fig.per)}); "
                             f"budget {_budget_text(fig)} → {_verdict(fig)}{note}")
                continue
            p99 = f", p99 {_fmt(fig.p99, fig.unit)}" if fig.per != "run" else ""
            lines.append(f"- **{fig.title}**: median {_fmt(fig.median, fig.unit)} {fig.unit}"
                         f"{p99}, "
                         f"min {_fmt(fig.minimum, fig.unit)}, max "
                         f"{_fmt(fig.maximum, fig.unit)} over {len(fig.samples)} "
                         f"{_plural(fig.per)}; budget {_budget_text(fig)} → "
                         f"{_verdict(fig, busy.get(id(res)), id(res) in judged_busy)}{note}")
        for note in res.notes:
            lines.append(f"- {note}")
        lines.append("")
    if crashed:
        lines += ["## Crashed", ""]
        lines += [f"- `{c.name}` ({c.title}) raised {c.error}; the traceback is on the run's "
                  "stderr" for c in crashed]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def history_entry(results: Sequence[BenchResult], crashed: Sequence[Crash], *,
                  command: str, verdict: RunVerdict, started: str = "") -> str:
    """One run, in a few lines for HISTORY.md: each benchmark's budget figures with their
    verdicts, its date and load. `started`: when the run began."""
    when = started or _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"## {when}: `{command}` — {_RESULT_WORDS[verdict.code]}", ""]
    for res in results:
        load = res.load.describe() if res.load is not None else "load unknown"
        figs = "; ".join(
            f"{f.title} {_fmt(f.value, f.unit)} {f.unit} ({_budget_text(f)}: "
            f"{'not judged' if res.name in verdict.busy else _verdict(f).strip('*')})"
            for f in res.figures if f.budget is not None)
        lines.append(f"- {res.title} ({res.seconds:.0f} s; {load}): {figs}")
    for crash in crashed:
        lines.append(f"- {crash.title}: CRASHED ({crash.error})")
    return "\n".join(lines) + "\n"


def reap_adopted(timeout: float = 15.0) -> None:
    """Wait (with a deadline) for the descendants this process adopted as a subreaper to
    end, collecting each (its CPU time then counts in this process's children's), then
    stop adopting."""
    from fleet_tui.system import procs

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs.reap_children()
        if not procs.descendants(os.getpid()):
            break
        time.sleep(0.05)
    procs.reap_children()
    procs.set_child_subreaper(False)
