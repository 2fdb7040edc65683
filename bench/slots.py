"""Benchmark 11: request slots — more workers than the account allows requests.

The same 8 tasks, run by the real claude through the gateway against the scripted
endpoint, twice per round in alternating order: with 8 workers sharing `max_requests = 2`
(the account's 2 requests in flight), and with 2 workers on the same 2 slots (what a user
without slots sets to avoid 1302s). Each task's script alternates a model turn and a tool
step that take about as long (the endpoint paces each answer's events; the tool sleeps
that long): a worker spends half its time running tools, and with slots the other workers'
requests use the account meanwhile. The ideal is half the time; the budget: the 8 workers
finish in at most 0.6 of the 2 workers' wall time (median of the rounds' ratios). The wall
times are context, and so is where each run's time went (`_timeline`): the share of the 2
slots' time in use (at the endpoint, and held at the gateway), the last task's first
request, a request's mean wait for a slot, the machine's CPU and the run's own processes'
(claude, runners, the gateway, this process: the engine and the scripted endpoint).
The engine runs its own loop (`Fleet.run`), as the panel does.

Needs the pinned claude (FLEET_TEST_CLAUDE, else .claude-cli/ of the checkout, as
scripts/test installs it).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import BenchResult, Figure, bench_env, make_repo

BUDGET = 0.6
KEY = "sk-bench-slots-key"
ROOT = Path(__file__).resolve().parent.parent
# seconds a tool step (and a model turn) takes, and a task's tool steps. 2 s, not 1: a
# real model turn takes seconds, and claude spends CPU of its own on every turn (~0.3 s on
# this machine) and at its start (~2 s): with 1 s turns that fixed cost, 8 processes on 2
# cores, was a third of a turn, and the figure measured claude's CPU more than the slots
STEP, STEPS = 2.0, 6
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


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of every core of the machine, from /proc/stat ((0, 0) without
    it): the share used during a run, by every process (other users' too)."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


class _CpuWatch:
    """The CPU seconds of the run's processes, by kind, sampled from /proc every 0.5 s
    (a process's last reading kept: it counts once it has exited too): claude's, the
    runners', the gateway's (those working under this run's folder: the machine is
    shared); and this process's (the engine's ticks and the scripted
    endpoint's threads) from its own clock."""

    KINDS = (("claude", ("claude-code", "/claude ", ".bin/claude")),
             ("runner", ("fleet_tui.execution.worker.runner", "fleet_tui.runner")),
             ("gateway", ("fleet_tui.gateway.server",)))

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.seen: dict[int, tuple[str, float]] = {}
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._stop = threading.Event()
        self._own0 = time.process_time()
        self.own = 0.0
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self._sample()

    def _sample(self) -> None:
        try:
            pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
        except OSError:
            return
        for pid in pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    cmd = fh.read().replace(b"\0", b" ").decode("utf-8", "replace") + " "
                kind = next((k for k, marks in self.KINDS if any(m in cmd for m in marks)),
                            None)
                if kind is None or not os.readlink(f"/proc/{pid}/cwd").startswith(self.root):
                    continue  # another run's (the machine is shared)
                with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except (OSError, ValueError, IndexError):
                continue
            self.seen[pid] = (kind, (int(fields[11]) + int(fields[12])) / self._tick)

    def stop(self) -> dict[str, float]:
        self._sample()
        self._stop.set()
        self.own = time.process_time() - self._own0
        out = {kind: 0.0 for kind, _marks in self.KINDS}
        for kind, seconds in self.seen.values():
            out[kind] += seconds
        out["bench"] = self.own
        return out


def _timeline(ep: Any, fleet: Any, ids: list[str], t0: float, end: float,
              cpu0: tuple[int, int], used: dict[str, float]) -> dict[str, float]:
    """Where one run's time went: each request's time at the endpoint (its arrival there,
    from the endpoint's log, to its end, the meter row the gateway wrote), so the share of
    the 2 slots' time in use since the submit; each task's start (its runner spawned, its
    first request at the endpoint); the gateway's slot waits; the machine's CPU share."""
    from fleet_tui.gateway import control
    from fleet_tui.store.meter import Meter

    tasks = {str(fleet.get_task(i).worktree): i for i in ids}
    starts: dict[str, list[float]] = {i: [] for i in ids}
    for request in ep.message_requests():
        if request.cwd in tasks:
            starts[tasks[request.cwd]].append(request.time)
    ends: dict[str, list[float]] = {i: [] for i in ids}
    for row in Meter(fleet.store).rows():
        if row.task_id in ends:
            ends[row.task_id].append(row.at)
    spans = [(a, b) for i in ids for a, b in zip(starts[i], ends[i], strict=False)]
    busy = sum(b - a for a, b in spans)
    # the slots' idle time (slot-seconds) in three phases: until the last task's first
    # request (the start-up), from the first task's last request on (the tail), between
    firsts = [starts[i][0] for i in ids if starts[i]]
    lasts = [ends[i][-1] for i in ids if ends[i]]
    cut1 = max(firsts, default=t0)
    cut2 = max(cut1, min(lasts, default=end))

    def idle(lo: float, hi: float) -> float:
        used = sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in spans)
        return max(0.0, 2 * (hi - lo) - used)

    spawned = []
    for i in ids:
        attempt = fleet.attempts(i)[-1]
        spawned.append((attempt.started_at or t0) - t0)
    first = sorted(starts[i][0] - t0 for i in ids if starts[i])
    status = (control.read_status(fleet.env, db=Path(fleet.store.path)) or {})
    slot = status.get("endpoints", {}).get("default", {})
    cpu1 = _cpu_ticks()
    return {
        "busy": busy / (2 * (end - t0)),  # of the 2 slots' time since the submit
        "idle_start": idle(t0, cut1), "idle_middle": idle(cut1, cut2),
        "idle_tail": idle(cut2, end),
        "spawned_last": max(spawned),  # the last runner spawned, s after the submit
        "first_median": first[len(first) // 2] if first else 0.0,
        "first_last": first[-1] if first else 0.0,  # the last task's first request
        "tail": end - max((e for i in ids for e in ends[i]), default=end),
        "wait_mean": float(slot.get("waited", 0.0)) / max(1, len(ep.message_requests())),
        "cpu": (cpu1[0] - cpu0[0]) / max(1, cpu1[1] - cpu0[1]),
        "held": float(slot.get("held", 0.0)) / (2 * (end - t0)),  # at the gateway
        # CPU seconds of the run's processes, and their share of the machine's 2 cores
        **{f"cpu_{kind}": seconds for kind, seconds in used.items()},
        "ours": sum(used.values()) / ((os.cpu_count() or 1) * (end - t0)),
    }


def _wall(ep: Any, repo: Path, env: dict[str, str], claude: str, *, workers: int,
          tasks: int, timeout: float) -> tuple[float, dict[str, float]]:
    """Seconds from submitting `tasks` tasks to the last one finished (all must succeed),
    and where they went (`_timeline`)."""
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
    stop = threading.Event()
    engine: threading.Thread | None = None
    try:
        cpu0 = _cpu_ticks()
        watch = _CpuWatch(Path(env["FLEET_TUI_HOME"]).parent)
        t0, wall0 = time.monotonic(), time.time()
        submitted = fleet.submit(TaskSpec(prompt="[script:default] go", repo=repo),
                                 copies=tasks)
        ids = [t.id for t in submitted]
        # the engine's own loop, as the panel and `fleet-tui run` drive it (its interval;
        # a runner that exits wakes it at once), not a faster one of the bench's
        engine = threading.Thread(target=fleet.run, args=(stop,), daemon=True)
        engine.start()
        while True:
            done = [fleet.get_task(i) for i in ids]
            if all(t.state in FINISHED_STATES for t in done):
                break
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"{workers} workers: not done after {timeout:.0f} s")
            time.sleep(0.1)
        took = time.monotonic() - t0
        end = wall0 + took
        used = watch.stop()
        failed = [(t.id, t.message) for t in done if t.state != TaskState.SUCCEEDED]
        if failed:
            raise RuntimeError(f"{workers} workers: tasks failed: {failed}")
        refused = [r for r in ep.message_requests() if r.status != 200]
        if refused:
            raise RuntimeError(f"{workers} workers: the endpoint refused {len(refused)} "
                               "request(s): the slots let too many through")
        return took, _timeline(ep, fleet, ids, wall0, end, cpu0, used)
    finally:
        stop.set()
        if engine is not None:
            engine.join(timeout=30)
        control.stop(fleet.env, db=store.path)
        store.close()


def run(smoke: bool = False, runs: int | None = None, long: bool = False) -> BenchResult:
    """`long` (`python -m bench --long`): 3 rounds, the order of the two runs alternating;
    else one (~2½ minutes on a quiet 2-core machine: 8 workers then 2; the rounds' ratios
    spread by ±0.01 on a quiet machine, bench/HISTORY.md)."""
    from fleet_tui.demo.endpoint import ScriptedEndpoint

    claude = _claude()
    rounds = runs or (3 if long and not smoke else 1)
    # a smoke run's figures are only checked for being measurements: three tasks are still
    # more than the two slots (some wait for one), with a third fewer claude runs than four
    tasks = 3 if smoke else 8
    # a script ends on a model turn (the answer), one more than its tool steps: the ideal
    # ratio is (steps + 1) / (2 steps + 1), 0.54 with 6 steps (0.57 with 3)
    step = float(os.environ.get("FLEET_BENCH_SLOTS_STEP") or (0.3 if smoke else STEP))
    steps = int(os.environ.get("FLEET_BENCH_SLOTS_STEPS") or (1 if smoke else STEPS))
    many: list[float] = []
    few: list[float] = []
    spent: dict[int, list[dict[str, float]]] = {}
    with bench_env("fleet-bench-slots-") as benv:
        repo = make_repo(benv.root / "repo")
        for index in range(rounds):
            order = [tasks, 2] if index % 2 == 0 else [2, tasks]
            for workers in order:
                # a fresh endpoint a run: its request log is that run's alone
                with ScriptedEndpoint({"default": _script(step, steps)},
                                      faults=[{"kind": "concurrency", "limit": 2}]) as ep:
                    took, where = _wall(ep, repo, benv.env, claude, workers=workers,
                                        tasks=tasks, timeout=900)
                (many if workers == tasks else few).append(took)
                spent.setdefault(workers, []).append(where)
                print(f"  slots: {workers} workers {took:.1f} s: "
                      + ", ".join(f"{k} {v:.2f}" for k, v in where.items()), file=sys.stderr)
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
        # 2 workers on 2 slots never wait: only the many workers' wait is a figure
        Figure(f"slots.wait_{tasks}", f"{tasks} workers: a request's mean wait for a slot",
               "s", [w["wait_mean"] for w in spent.get(tasks, [])],
               note="may be 0 in a smoke run"),
    ]
    for workers, label in ((tasks, f"{tasks} workers"), (2, "2 workers")):
        seen = spent.get(workers, [])
        figures += [
            Figure(f"slots.busy_{workers}", f"{label}: share of the 2 slots' time in use",
                   "×", [w["busy"] for w in seen],
                   note="each request from its arrival at the endpoint to its meter row"),
            Figure(f"slots.first_{workers}", f"{label}: the last task's first request after "
                   "the submit", "s", [w["first_last"] for w in seen],
                   note="engine start, runner, claude's start-up"),
            Figure(f"slots.cpu_{workers}", f"{label}: the machine's CPU in use", "×",
                   [w["cpu"] for w in seen], note="every process, other users' too"),
        ]
    return BenchResult("slots", "11. Request slots", figures)
