"""Benchmark 7: the engine — worktree creation, and scheduling 100 tasks under a cap of 8.

Worktrees: `git.create_worktree` (checks, exclude file, branch, verification) against a
bare `git worktree add -b BRANCH PATH BASE` of the same repository, alternating, each
worktree removed (untimed) before the next. Budget: at most 1.2 times the bare command.

Scheduling: 100 queued tasks, `max_workers = 8`, and a stand-in claude that prints one
successful result line and exits at once. The engine runs as the panel runs it
(`Fleet.run` in a thread, default tick interval) until every task has finished. The bare
baseline does the unavoidable work with 8 threads: `git worktree add` (one at a time, as
in the engine: git races otherwise) and the stand-in, its stdout to a file, per task.
The engine and the bare baseline alternate, run by run. Budget: the engine's wall time at
most SCHEDULING_BUDGET times the bare baseline's (median of the per-run ratios); the
overhead per task in ms, (engine wall − bare wall) ÷ tasks, is context.

The merge's test gate: what the gate's timeout costs a merge. `git.merge` of a task
whose test command (`sleep 30`) outlives its 0.5 s timeout, minus the same merge whose
test command fails at once (`false`: the same checks, preview and refusal, no wait), from
the call to the refusal, against a bare timeout of the same command (`sh -c 'sleep 30'` in
a session of its own, waited on for 0.5 s, then its group stopped); the three alternate.
Budget: at most GATE_BUDGET times the bare timeout (tests/vcs/test_git.py checks the
behaviour: the command stopped, its later steps never ran). The merge's own git work is
taken out by the `false` merge: compared with the bare timeout alone it made the ratio
follow the machine's speed (1.10 quiet, 1.86 on a busy one), not the gate's.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import BenchEnv, BenchResult, Figure, bench_env, build_standin, git, make_repo, ms

REPO_FILES = 200
WORKTREE_BUDGET = 1.2
SCHEDULING_BUDGET = 3.0  # quiet: 1.74 (old RESULTS.md); 2.25 on a busy machine
GATE_BUDGET = 1.5  # the gate's own cost past its timeout; see measure_test_gate


def _project(files: int) -> dict[str, str]:
    """A small project: `files` modules of 40 lines and a README."""
    out = {"README.md": "# bench project\n"}
    for i in range(files):
        out[f"src/pkg{i % 10}/mod_{i:03d}.py"] = "".join(
            f"def f_{i}_{n}(x):\n    return x + {n}\n" for n in range(20))
    return out


def _remove_worktree(repo: Path, path: Path, branch: str) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=repo,
                   capture_output=True, check=False)
    subprocess.run(["git", "branch", "-D", branch], cwd=repo, capture_output=True, check=False)


def measure_worktrees(repo: Path, runs: int) -> tuple[list[float], list[float]]:
    """(create_worktree ms, bare git worktree add ms), alternating which goes first."""
    from fleet_tui.system import paths
    from fleet_tui.vcs import git as fgit

    base = git(repo, "rev-parse", "HEAD").strip()
    ours: list[float] = []
    bare: list[float] = []

    def time_ours(i: int) -> float:
        tid = f"wt{i:04d}"
        t0 = time.perf_counter()
        fgit.create_worktree(repo, tid, base)
        took = time.perf_counter() - t0
        _remove_worktree(repo, paths.worktree_path(repo, tid), f"fleet/{tid}")
        return took

    def time_bare(i: int) -> float:
        tid = f"wb{i:04d}"
        path = paths.worktree_path(repo, tid)
        t0 = time.perf_counter()
        subprocess.run(["git", "worktree", "add", "-b", f"fleet/{tid}", str(path), base],
                       cwd=repo, capture_output=True, check=True)
        took = time.perf_counter() - t0
        _remove_worktree(repo, path, f"fleet/{tid}")
        return took

    time_ours(9999)  # warm: .fleet-work/, exclude file, page cache
    time_bare(9999)
    for i in range(runs):
        if i % 2 == 0:
            ours.append(ms(time_ours(i)))
            bare.append(ms(time_bare(i)))
        else:
            bare.append(ms(time_bare(i)))
            ours.append(ms(time_ours(i)))
    return ours, bare


def _engine_env(benv: BenchEnv, standin: Path) -> dict[str, str]:
    env = dict(benv.env)
    env.update({
        "FLEET_WORKER_CLAUDE": str(standin),
        "ANTHROPIC_AUTH_TOKEN": "bench-not-a-real-key",
        "BENCH_PRINT_RESULT": "1",
    })
    return env


def measure_engine(benv: BenchEnv, repo: Path, standin: Path, tasks: int, cap: int,
                   interval: float = 0.25) -> tuple[float, float, int]:
    """(wall seconds, engine-process CPU seconds, tasks that succeeded)."""
    from fleet_tui.engine.fleet import Fleet, TaskSpec
    from fleet_tui.settings.config import load_settings
    from fleet_tui.store.db import FINISHED_STATES, Store, TaskState

    env = _engine_env(benv, standin)
    os.environ.update(env)
    # uncaged: this measures the engine's scheduling against a bare worktree + stand-in;
    # a caged start (node and srt per worker) has its own figure in bench 16 (cage)
    settings = load_settings(env=env, overrides={"max_workers": cap, "cage": "off"})
    store = Store(benv.fleet_home / f"engine-{time.monotonic_ns()}.db")
    fleet = Fleet(settings, store, env=env)
    left = tasks
    while left:
        n = min(left, 50)
        fleet.submit(TaskSpec(prompt="exit at once", repo=repo), copies=n)
        left -= n
    stop = threading.Event()
    thread = threading.Thread(target=fleet.run, args=(stop, interval), daemon=True)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    thread.start()
    deadline = t0 + 60 + tasks * 2.0
    try:
        while store.count_tasks(FINISHED_STATES) < tasks:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"the engine finished {store.count_tasks(FINISHED_STATES)}"
                                   f" of {tasks} tasks in time; last error: {fleet.last_error}")
            time.sleep(0.01)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
    finally:
        stop.set()
        thread.join(timeout=30)
    ok = store.count_tasks(TaskState.SUCCEEDED)
    if ok != tasks:
        failed = [t for t in store.list_tasks() if t.state != TaskState.SUCCEEDED][:1]
        why = failed[0].message if failed else "?"
        raise RuntimeError(f"only {ok} of {tasks} stand-in tasks succeeded: {why}")
    store.close()
    return wall, cpu, ok


def measure_bare(benv: BenchEnv, repo: Path, standin: Path, tasks: int, cap: int,
                 tag: str) -> float:
    """Wall seconds for the unavoidable work: worktree add + the stand-in, `cap` at once."""
    env = _engine_env(benv, standin)
    base = git(repo, "rev-parse", "HEAD").strip()
    logs = benv.root / f"bare-{tag}"
    logs.mkdir()

    # git 2.39 races when several `worktree add` run at once in one repository (one reads
    # another's half-written .git/worktrees/<name>), so the adds take turns, as they do in
    # the engine; the stand-ins run `cap` at once.
    add_lock = threading.Lock()

    def one(i: int) -> None:
        path = repo / ".fleet-work" / f"bare{tag}{i:03d}"
        with add_lock:
            subprocess.run(["git", "worktree", "add", "-b", f"bare/{tag}{i:03d}", str(path),
                            base], cwd=repo, capture_output=True, check=True)
        with open(logs / f"{i}.jsonl", "wb") as out:
            subprocess.run([str(standin), "-p", "exit at once"], cwd=path, env=env,
                           stdout=out, stderr=subprocess.DEVNULL, check=True)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=cap) as pool:
        list(pool.map(one, range(tasks)))
    return time.perf_counter() - t0


GATE_TIMEOUT = 0.5


def bare_timeout(timeout: float = GATE_TIMEOUT) -> float:
    """Seconds for a bare `sh -c 'sleep 30'` to be waited on for `timeout` and stopped."""
    import signal

    t0 = time.perf_counter()
    proc = subprocess.Popen(["sh", "-c", "sleep 30"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
    else:
        raise RuntimeError("`sleep 30` ended before its timeout")
    return time.perf_counter() - t0


def measure_test_gate(root: Path, runs: int
                      ) -> tuple[list[float], list[float], list[float]]:
    """(ms for a merge whose test command outlives its timeout to come back refused, ms for
    the same merge with a test command that fails at once, ms for the bare timeout of the
    command), the three in a rotating order."""
    from fleet_tui.vcs import git as fgit

    repo = make_repo(root / "gate", {"src/app.py": "def main():\n    return 1\n"})
    info = fgit.create_worktree(repo, "gate01")
    (info.path / "src" / "feature.py").write_text("def feature():\n    return 42\n")

    def merge(command: str, expect: str) -> float:
        t0 = time.perf_counter()
        result = fgit.merge(repo, info.path, info.branch, "main", message="gate",
                            test_command=command, test_timeout=GATE_TIMEOUT)
        took = ms(time.perf_counter() - t0)
        if result.merged or expect not in (result.message or "") + (result.test_output or ""):
            raise RuntimeError(f"the test gate did not refuse as expected ({expect!r}): "
                               f"{result.message}")
        return took

    timed_out: list[float] = []
    failed: list[float] = []
    bare: list[float] = []
    steps = [lambda: timed_out.append(merge("sleep 30", "timed out")),
             lambda: failed.append(merge("false", "failed")),
             lambda: bare.append(ms(bare_timeout()))]
    for i in range(runs):
        for k in range(3):
            steps[(i + k) % 3]()
    return timed_out, failed, bare


def run(smoke: bool = False, runs: int | None = None) -> BenchResult:
    wt_runs = 3 if smoke else 21
    engine_runs = runs or (1 if smoke else 3)
    tasks, cap = (4, 2) if smoke else (100, 8)
    with bench_env() as benv:
        repo = make_repo(benv.root / "repo", _project(20 if smoke else REPO_FILES))
        ours, bare = measure_worktrees(repo, wt_runs)
        ratios = [o / b for o, b in zip(ours, bare, strict=True)]
        standin = build_standin(benv.root / "bin")
        per_task: list[float] = []
        engine_per_task: list[float] = []
        bare_per_task: list[float] = []
        cpu_per_task: list[float] = []
        wall_ratio: list[float] = []
        for i in range(engine_runs):
            if i % 2:
                bare_wall = measure_bare(benv, repo, standin, tasks, cap, f"r{i}")
                wall, cpu, _ = measure_engine(benv, repo, standin, tasks, cap)
            else:
                wall, cpu, _ = measure_engine(benv, repo, standin, tasks, cap)
                bare_wall = measure_bare(benv, repo, standin, tasks, cap, f"r{i}")
            wall_ratio.append(wall / bare_wall)
            per_task.append(ms((wall - bare_wall) / tasks))
            engine_per_task.append(ms(wall / tasks))
            bare_per_task.append(ms(bare_wall / tasks))
            cpu_per_task.append(ms(cpu / tasks))
        gate, gate_failed, gate_bare = measure_test_gate(benv.root, engine_runs)
    ratio_of_medians = statistics.median(ours) / statistics.median(bare)
    figures = [
        Figure("engine.worktree_ratio", "create_worktree ÷ bare `git worktree add`", "×",
               ratios, budget=WORKTREE_BUDGET, per="pair", baseline="engine.worktree_bare",
               note=f"ratio of the medians {ratio_of_medians:.2f}"),
        Figure("engine.worktree", "git.create_worktree", "ms", ours),
        Figure("engine.worktree_bare", "bare git worktree add (baseline)", "ms", bare),
        Figure("engine.scheduling_ratio", "engine wall time ÷ bare worktree + stand-in",
               "×", wall_ratio, budget=SCHEDULING_BUDGET, per="pair", baseline="engine.bare",
               note=f"{tasks} tasks, cap {cap}, per run"),
        Figure("engine.overhead", "scheduling overhead per task", "ms", per_task,
               note=f"(engine wall − bare wall) ÷ {tasks} tasks, cap {cap}"),
        Figure("engine.wall", "engine wall time per task", "ms", engine_per_task),
        Figure("engine.bare", "bare worktree + stand-in per task (baseline)", "ms",
               bare_per_task),
        Figure("engine.cpu", "engine process CPU per task", "ms", cpu_per_task,
               note="Fleet.run thread and the store, not the runner processes"),
        Figure("engine.test_gate_ratio",
               "the timeout's cost to a merge ÷ bare timeout", "×",
               [(g - f) / b for g, f, b in zip(gate, gate_failed, gate_bare, strict=True)],
               budget=GATE_BUDGET, per="pair", baseline="engine.test_gate_bare",
               note="(merge past its timeout − the same merge failing at once) ÷ bare"),
        Figure("engine.test_gate_timeout", "merge with a test command past its timeout",
               "ms", gate,
               note=f"`sleep 30` with a {GATE_TIMEOUT:g} s timeout: call → refusal"),
        Figure("engine.test_gate_failed", "the same merge, its test command failing at once",
               "ms", gate_failed, note="`false`: the checks, preview and refusal, no wait"),
        Figure("engine.test_gate_bare", "bare `sh -c 'sleep 30'`, 0.5 s timeout (baseline)",
               "ms", gate_bare),
    ]
    notes = [f"repository of {REPO_FILES if not smoke else 20} files; Fleet.run tick "
             "interval 0.25 s (the panel's default); each task's runner is a "
             "`python -m fleet_tui.execution.worker.runner` process that runs the stand-in"]
    return BenchResult("engine", "7. Engine", figures, notes)
