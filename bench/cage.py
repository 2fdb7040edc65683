"""Benchmark 16: what the worker's cage costs (`python -m bench cage`).

Three figures, each paired round by round with its uncaged twin (the order alternates):

- **A worker's start → first request** (the budgeted start figure): the real runner
  (`python -m fleet_tui.execution.worker.runner` on an attempt folder, as the engine starts
  it) with the real claude (the pinned CLI), from the runner's spawn to the scripted
  endpoint receiving claude's first message request; cage = "worker" and "off". Caged, the
  runner starts the cage host before its own imports (cageearly.py), so node and srt load
  while the runner loads and plans the run: the cost a user's worker pays. Budget: caged ÷
  uncaged at most START_BUDGET.
- **Claude alone in a cold cage** (context, no budget): the same claude started directly,
  caged with `cage.wrap` (node + srt + bubblewrap, nothing started ahead) and not: the
  whole cage start in series, as a setup command pays it; what the first figure hides.
- **A build step**: `pip install` of a local wheel (no index, no cache) into a folder, then
  a `pytest` run of a small test file in the worktree, timed by a Python timer started
  inside the same shell as the step: inside the cage and outside it. The cage's own start
  is not part of it (a worker pays it once, the start figures); what is measured is the
  step under the cage's mounts, seccomp filter and namespaces. Budget: caged ÷ uncaged at
  most BUILD_BUDGET.

Needs the pinned claude (FLEET_TEST_CLAUDE, else the checkout's .claude-cli/) and what the
cage needs (`cage.missing`: node, srt, bubblewrap, socat, ripgrep).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from bench.common import REPO_ROOT, BenchResult, Figure, bench_env, git, make_repo, ms
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.execution.worker import cage
from fleet_tui.execution.worker.spec import RunSpec

START_BUDGET = 1.3  # a worker's start, caged ÷ uncaged; see RESULTS.md for the figure
BUILD_BUDGET = 1.2


def _claude() -> str:
    found = os.environ.get("FLEET_TEST_CLAUDE") or str(
        REPO_ROOT / ".claude-cli" / "node_modules" / ".bin" / "claude")
    if not os.access(found, os.X_OK):
        raise RuntimeError(f"claude not found at {found}: run `bash scripts/test --co -q` "
                           "once (it installs the pinned CLI), or set FLEET_TEST_CLAUDE")
    return found


def _wheel(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "benchpkg-1.0-py3-none-any.whl"
    info = "benchpkg-1.0.dist-info"
    files = {"benchpkg/__init__.py": "VALUE = 1\n",
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: benchpkg\nVersion: 1.0\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
        zf.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n")
    return wheel


def _worktree(root: Path, env: dict[str, str]) -> tuple[Path, Path]:
    repo = make_repo(root / "repo", {
        "README.md": "# bench\n",
        "test_step.py": "".join(f"def test_{i}():\n    assert sum(range({i})) >= 0\n\n"
                                for i in range(30))})
    worktree = repo / ".fleet-work" / "t1"
    git(repo, "worktree", "add", "-q", "-b", "fleet/t1", str(worktree), env=env)
    return repo, worktree


# The build step, timed inside the shell that runs it (so a cage's own start is not in it).
STEP = ("import subprocess, sys, time; t = time.monotonic(); "
        "subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-index', "
        "'--no-cache-dir', '--disable-pip-version-check', '--target', sys.argv[2], "
        "sys.argv[1]], check=True); "
        "subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', "
        "'test_step.py'], check=True, stdout=subprocess.DEVNULL); "
        "print('STEP', time.monotonic() - t)")


def _step(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    out = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300,
                         stdin=subprocess.DEVNULL)
    for line in out.stdout.splitlines():
        if line.startswith("STEP "):
            return float(line.split()[1])
    raise RuntimeError(f"the build step failed ({out.returncode}): "
                       f"{(out.stderr or out.stdout).strip()[-500:]}")


def _first_request(argv: list[str], env: dict[str, str], cwd: Path,
                   ep: ScriptedEndpoint) -> float:
    """Seconds from the spawn to the endpoint's first message request; the run is then
    let finish (one "done" turn)."""
    before = len(ep.message_requests())
    start = time.time()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        got = ep.wait_for(before + 1, timeout=120)
    finally:
        _out, err = proc.communicate(timeout=120)
    if proc.returncode != 0 or len(got) <= before:
        raise RuntimeError(f"claude failed ({proc.returncode}): "
                           f"{err.decode(errors='replace').strip()[-500:]}")
    return got[before].time - start


def _worker_request(claude: str, env: dict[str, str], root: Path, worktree: Path, repo: Path,
                    ep: ScriptedEndpoint, mode: str, n: int) -> float:
    """Seconds from the runner's spawn to the endpoint's first message request."""
    adir = root / f"attempt-{mode}-{n}"
    adir.mkdir()
    spec = RunSpec(cwd=str(worktree), prompt="say done", config_dir=str(root / "cfg" / mode),
                   settings={"base_url": ep.url, "claude": claude, "cage": mode,
                             "sandbox": os.geteuid() == 0, "key_sources": ["env"]},
                   task_id="t1", attempt=n, token=f"tok-bench-{mode}-{n}", kill_grace=2.0,
                   repo=str(repo), permission_mode="bypassPermissions")
    (adir / "spec.json").write_text(spec.to_json())
    runner_env = dict(env, ANTHROPIC_AUTH_TOKEN="bench-key", CLAUDE_CODE_MAX_RETRIES="0",
                      DISABLE_TELEMETRY="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
    before = len(ep.message_requests())
    start = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "fleet_tui.execution.worker.runner",
                             str(adir)], env=runner_env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        got = ep.wait_for(before + 1, timeout=120)
    finally:
        _out, err = proc.communicate(timeout=120)
    if proc.returncode != 0 or len(got) <= before:
        exit_record = (adir / "exit.json").read_text() if (adir / "exit.json").exists() else ""
        raise RuntimeError(f"the runner failed ({proc.returncode}): {exit_record[-500:]} "
                           f"{err.decode(errors='replace').strip()[-300:]}")
    return got[before].time - start


def run(smoke: bool = False, runs: int | None = None) -> BenchResult:
    runs = runs or (2 if smoke else 12)
    claude = _claude()
    with bench_env("fleet-bench-cage-") as benv:
        env = dict(benv.env)
        problems = cage.missing(env, cage.default_data_dir(env))
        if problems:
            raise RuntimeError(cage.missing_message(problems))
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
        repo, worktree = _worktree(benv.root, env)
        config = benv.fleet_home / "config" / "t1"
        config.mkdir(parents=True)
        attempt = benv.root / "attempt"
        attempt.mkdir()
        wheel = _wheel(worktree / "wheels")  # a place the cage shows
        start_ratio: list[float] = []
        start_caged: list[float] = []
        start_bare: list[float] = []
        build_ratio: list[float] = []
        build_caged: list[float] = []
        build_bare: list[float] = []
        worker_ratio: list[float] = []
        worker_caged: list[float] = []
        worker_bare: list[float] = []
        with ScriptedEndpoint({"default": ["done"]}) as ep:
            cenv = dict(env, ANTHROPIC_BASE_URL=ep.url, ANTHROPIC_AUTH_TOKEN="bench-key",
                        CLAUDE_CONFIG_DIR=str(config), CLAUDE_CODE_MAX_RETRIES="0",
                        IS_SANDBOX="1", DISABLE_TELEMETRY="1",
                        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
            bare = [claude, "-p", "--model", "sonnet", "--permission-mode",
                    "bypassPermissions", "--", "say done"]

            def caged(argv: list[str], base: dict[str, str]) -> tuple[list[str], dict[str, str]]:
                return cage.wrap(argv, base, attempt_dir=str(attempt), worktree=str(worktree),
                                 config_dir=str(config), repo=str(repo), base_url=ep.url,
                                 allow_hosts=())

            step = [sys.executable, "-c", STEP, str(wheel)]
            # one untimed round of each: page cache, pyc files, srt's first start (a smoke
            # run's figures are only checked for being measurements: it makes the same
            # calls in its timed round)
            if not smoke:
                _first_request(bare, cenv, worktree, ep)
                _first_request(*caged(bare, cenv), worktree, ep)
                for mode in ("off", "worker"):
                    _worker_request(claude, env, benv.root, worktree, repo, ep, mode, 0)
            for i in range(runs):
                arms = ["bare", "caged"] if i % 2 == 0 else ["caged", "bare"]
                took: dict[str, float] = {}
                for arm in arms:
                    if arm == "bare":
                        took[arm] = _first_request(bare, cenv, worktree, ep)
                    else:
                        took[arm] = _first_request(*caged(bare, cenv), worktree, ep)
                start_bare.append(ms(took["bare"]))
                start_caged.append(ms(took["caged"]))
                start_ratio.append(took["caged"] / took["bare"])
                worker: dict[str, float] = {}
                for arm in arms:
                    worker[arm] = _worker_request(claude, env, benv.root, worktree, repo, ep,
                                                  "off" if arm == "bare" else "worker", i + 1)
                worker_bare.append(ms(worker["bare"]))
                worker_caged.append(ms(worker["caged"]))
                worker_ratio.append(worker["caged"] / worker["bare"])
                built: dict[str, float] = {}
                for arm in arms:
                    # the same file system for both: the worktree (the cage binds it)
                    target = str(worktree / f"deps-{i}-{arm}")
                    if arm == "bare":
                        built[arm] = _step([*step, target], env, worktree)
                    else:
                        argv, cage_env = caged([*step, target], env)
                        built[arm] = _step(argv, cage_env, worktree)
                build_bare.append(ms(built["bare"]))
                build_caged.append(ms(built["caged"]))
                build_ratio.append(built["caged"] / built["bare"])
    figures = [
        Figure("cage.worker_start_ratio",
               "caged ÷ uncaged: a worker's start (the runner's spawn) → its first request",
               "×", worker_ratio, budget=START_BUDGET, per="pair",
               baseline="cage.worker_start_uncaged",
               note="the real runner; caged, it starts the cage host before its own imports"),
        Figure("cage.worker_start_uncaged", "runner spawn → first request, uncaged", "ms",
               worker_bare),
        Figure("cage.worker_start_caged", "runner spawn → first request, caged", "ms",
               worker_caged),
        Figure("cage.worker_start_added",
               "caged − uncaged: runner spawn → first request, what the cage adds", "ms",
               [c - b for c, b in zip(worker_caged, worker_bare, strict=True)], per="pair"),
        Figure("cage.start_ratio",
               "caged ÷ uncaged: claude alone in a cold cage (no warm host), spawn → first "
               "request", "×", start_ratio, per="pair",
               note="context: the whole cage start in series, as a setup command pays it"),
        Figure("cage.start_uncaged", "spawn → first request, uncaged (baseline)", "ms",
               start_bare),
        Figure("cage.start_caged", "spawn → first request, caged (node + srt + bwrap)",
               "ms", start_caged),
        Figure("cage.start_added", "caged − uncaged: spawn → first request, what the cage adds",
               "ms", [c - b for c, b in zip(start_caged, start_bare, strict=True)], per="pair",
               note="less sensitive to the machine's load than the ratio"),
        Figure("cage.build_ratio", "caged ÷ uncaged: pip install of a local wheel + pytest",
               "×", build_ratio, budget=BUILD_BUDGET, per="pair",
               baseline="cage.build_uncaged", note="timed inside the step's own shell"),
        Figure("cage.build_uncaged", "build step, uncaged (baseline)", "ms", build_bare),
        Figure("cage.build_caged", "build step, in the cage", "ms", build_caged),
    ]
    notes = [f"claude: {claude}; srt {cage.SRT_VERSION}; the cage's start is in the first "
             "figure only (a worker pays it once)"]
    return BenchResult("cage", "16. The cage", figures, notes)
