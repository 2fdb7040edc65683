"""What one `fleet-tui` process costs: CPU (user+sys) and wall per command, the median of N.

Every CLI command is a process of its own (the test suite starts a great many of them), so
what a command imports it pays for at each call. This runs a set of commands in a scratch
HOME / FLEET_TUI_HOME (nothing of the user's is read or written) with a git repository and
one finished task (made with the pinned claude against the scripted endpoint; without
claude, the commands given its ID are left out: `show`, `logs`, `diff`, and `merge`,
refused as the task changed nothing), and prints a Markdown table. The commands the test
suite starts most are here (`run` refused, `ls`, `show`, `logs`, `merge`, `host ls`), each
for its common path and, for the commands given an ID, an ID that names no task.

    python scripts/cli_cost.py [--runs 7] [--compare OTHER_CHECKOUT] [--bytecode]

`--compare` measures another checkout too (its fleet_tui first on PYTHONPATH, this venv's
scripts), round by round in turn with this one, so load hits both alike. Python is run as
the environment says: with PYTHONDONTWRITEBYTECODE=1 every process compiles fleet_tui's
modules again (about twice the CPU), unless a checkout has `__pycache__` folders already
(said below the table); `--bytecode` drops it and uses a cache of the run's own (the first
round writes it), alike for every checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def scratch(base: Path) -> tuple[dict[str, str], Path, Path]:
    """The environment, a repository with one commit, and a folder of no repository."""
    home = base / "home"
    repo = base / "repo"
    home.mkdir()
    repo.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY")}
    env.update(HOME=str(home), FLEET_TUI_HOME=str(base / "fleet-home"),
               XDG_CONFIG_HOME=str(home / ".config"), XDG_DATA_HOME=str(home / ".local/share"),
               XDG_CACHE_HOME=str(home / ".cache"), FLEET_WORKER_KEY_SOURCES="env",
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.invalid",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.invalid")
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "i"]):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)
    return env, repo, home


def one_task(env: dict[str, str], repo: Path) -> str | None:
    """The id of a task run to its end, or None without the pinned claude."""
    claude = ROOT / ".claude-cli" / "node_modules" / ".bin" / "claude"
    if not claude.exists():
        return None
    from fleet_tui.demo.endpoint import ScriptedEndpoint

    with ScriptedEndpoint({"default": ["done"]}) as endpoint:
        run_env = {**env, "FLEET_WORKER_BASE_URL": endpoint.url,
                   "FLEET_WORKER_CLAUDE": str(claude), "ANTHROPIC_AUTH_TOKEN": "sk-scratch",
                   "CLAUDE_CODE_MAX_RETRIES": "0", "PYTHONPATH": str(ROOT),
                   "FLEET_WORKER_GATEWAY": "0"}  # no gateway process left behind
        out = subprocess.run([str(BIN / "fleet-tui"), "run", "--wait", "--json", "say done"],
                             cwd=repo, env=run_env, capture_output=True, text=True,
                             timeout=300, check=False)
    tasks = json.loads(out.stdout) if out.returncode == 0 else []
    return str(tasks[0]["id"]) if tasks else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--compare", type=Path, metavar="CHECKOUT")
    parser.add_argument("--bytecode", action="store_true")
    args = parser.parse_args()
    trees = {"this": ROOT, **({"compared": args.compare.resolve()} if args.compare else {})}
    base = Path(tempfile.mkdtemp(prefix="fleet-cli-cost-"))
    try:
        env, repo, elsewhere = scratch(base)
        if args.bytecode:  # a cache of this run's own, alike for every checkout
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(base / "pycache")
        task = one_task(env, repo)
        cases = {"fleet-tui --help": (["fleet-tui", "--help"], repo),
                 "fleet-tui version": (["fleet-tui", "version"], repo),
                 "fleet-tui ls": (["fleet-tui", "ls"], repo),
                 "fleet-tui ls --json": (["fleet-tui", "ls", "--json"], repo),
                 **({"fleet-tui show ID": (["fleet-tui", "show", task], repo),
                     "fleet-tui logs ID": (["fleet-tui", "logs", task], repo),
                     "fleet-tui diff ID": (["fleet-tui", "diff", task], repo),
                     "merge, nothing to merge": (["fleet-tui", "merge", "--yes", task], repo)}
                    if task else {}),
                 "show, no such task": (["fleet-tui", "show", "zzzzzz"], repo),
                 "logs, no such task": (["fleet-tui", "logs", "zzzzzz"], repo),
                 "fleet-tui run --help": (["fleet-tui", "run", "--help"], repo),
                 "run, a bad option": (["fleet-tui", "run", "--copies", "0", "x"], repo),
                 "run, no repository": (["fleet-tui", "run", "x"], elsewhere),
                 "run, no key": (["fleet-tui", "run", "x"], repo),
                 "fleet-tui host ls": (["fleet-tui", "host", "ls"], repo),
                 "fleet-tui cost": (["fleet-tui", "cost"], repo),
                 "fleet-tui key status": (["fleet-tui", "key", "status"], repo),
                 "fleet-worker --help": (["fleet-worker", "--help"], repo),
                 "fleet-collect --help": (["fleet-collect", "--help"], repo),
                 "fleet-doctor --help": (["fleet-doctor", "--help"], repo)}
        seen: dict[tuple[str, str], list[tuple[float, float]]] = {}
        codes: dict[tuple[str, str], int] = {}
        for n in range(args.runs + (1 if args.bytecode else 0)):
            for name, (argv, cwd) in cases.items():
                order = list(trees) if n % 2 == 0 else list(trees)[::-1]
                for tree in order:
                    started = time.perf_counter()
                    child = subprocess.Popen(
                        [str(BIN / argv[0]), *argv[1:]], cwd=cwd,
                        env={**env, "PYTHONPATH": str(trees[tree])}, stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    _, status, usage = os.wait4(child.pid, 0)
                    wall = time.perf_counter() - started
                    codes[(name, tree)] = os.waitstatus_to_exitcode(status)
                    if args.bytecode and n == 0:
                        continue  # the round that writes the bytecode
                    seen.setdefault((name, tree), []).append(
                        (usage.ru_utime + usage.ru_stime, wall))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    for path in trees.values():
        if not args.bytecode and next(path.glob("fleet_tui/**/__pycache__"), None):
            print(f"note: {path} has __pycache__ folders: its modules load from bytecode")
    print(f"runs {args.runs}, load {load}, bytecode "
          f"{'cached' if 'PYTHONDONTWRITEBYTECODE' not in env else 'not written'}")
    heads = [f"{what} {tree}" for what in ("CPU s", "wall s") for tree in trees]
    print("| command | exit | " + " | ".join(heads) + " |")
    print("|---" * (2 + len(heads)) + "|")
    for name in cases:
        cells = [f"{statistics.median(x[i] for x in seen[(name, tree)]):.3f}"
                 for i in (0, 1) for tree in trees]
        exits = "/".join(str(codes[(name, tree)]) for tree in trees)
        print(f"| `{name}` | {exits} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
