"""Sums what tests/support/suite_cpu.py wrote: `python scripts/suite_cpu.py DIR [N]`.

The CPU the tests cost (with every process they started) by folder and by file, the
processes they started by kind, and the N costliest tests (default 30), with their claude
runs and caged starts beside them. To make DIR, run the suite with the plugin, e.g.:

    PYTHONPATH=tests/support SUITE_CPU_DIR=/tmp/suite-cpu \\
        .venv/bin/python -m pytest -p suite_cpu -n 4 --dist loadgroup -m "not serial"
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path


def main(argv: list[str]) -> int:
    if not argv or not Path(argv[0]).is_dir():
        print(__doc__.strip(), file=sys.stderr)
        return 2
    rows = [json.loads(line) for path in sorted(Path(argv[0]).glob("*.jsonl"))
            for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    top = int(argv[1]) if len(argv) > 1 else 30
    cpu = sum(r["cpu"] for r in rows)
    print(f"{len(rows)} tests: {cpu:.0f} CPU s, {sum(r['wall'] for r in rows):.0f} s of "
          "tests' wall summed")
    kinds: Counter[str] = Counter()
    folders: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0])
    files: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0])
    for r in rows:
        kinds.update(r["procs"])
        path = r["id"].split("::")[0]
        for key, table in (("/".join(path.split("/")[1:-1]) or ".", folders), (path, files)):
            entry = table[key]
            entry[0] += 1
            entry[1] += r["cpu"]
            entry[2] += r["procs"].get("claude", 0)
    print("\nprocesses started, by kind:")
    print(", ".join(f"{k} {n}" for k, n in kinds.most_common(25)))
    for title, table, limit in (("by folder", folders, 40), ("by file", files, top)):
        print(f"\n{title}: CPU s, tests, claude runs")
        for key, (n, c, claude) in sorted(table.items(), key=lambda kv: -kv[1][1])[:limit]:
            print(f"{c:8.1f} {int(n):5d} {int(claude):5d}  {key}")
    print(f"\nthe {top} costliest tests: CPU s, wall s, claude runs, caged starts")
    for r in sorted(rows, key=lambda r: -r["cpu"])[:top]:
        print(f"{r['cpu']:7.1f} {r['wall']:7.1f} {r['procs'].get('claude', 0):3d} "
              f"{r['procs'].get('cage host', 0):3d}  {r['id']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
