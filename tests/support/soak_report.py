"""The knobs and the figures of the standing reliability suite.

Each reliability test has a fast form that fits the normal run and a long form, the soak:
`FLEET_SOAK=1` (or `pytest --soak`, see conftest.py) turns every one into its long form.
The sizes can be set one by one as well (see `knob`). A test hands its figures to `record`:
they are printed (shown with `pytest -s`), and appended as JSON lines to the file named by
FLEET_SOAK_REPORT when it is set, which is how `bash scripts/soak` builds its table.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPORT_ENV = "FLEET_SOAK_REPORT"
COMBINE: dict[str, Callable[[list[float]], float]] = {"sum": sum, "max": max, "min": min}


def soak() -> bool:
    """True when the long forms were asked for (FLEET_SOAK set to anything but 0/empty)."""
    return os.environ.get("FLEET_SOAK", "").strip() not in ("", "0")


def knob(name: str, fast: int, long: int) -> int:
    """An integer size: the environment variable `name` when set, else the soak's or the
    fast form's default."""
    raw = os.environ.get(name, "").strip()
    if raw:
        value = int(raw)
        if value < 0:
            raise ValueError(f"{name}={raw}: must be 0 or more")
        return value
    return long if soak() else fast


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, for the note beside a figure."""
    try:
        one, five, fifteen = Path("/proc/loadavg").read_text().split()[:3]
    except (OSError, ValueError):
        return "?"
    return f"{one} {five} {fifteen}"


def record(suite: str, figure: str, value: object, unit: str = "", note: str = "", *,
           combine: str = "sum", detail: bool = False) -> None:
    """One figure of one suite: printed, and appended to $FLEET_SOAK_REPORT if set. Figures
    of one suite and name (e.g. one per fuzz generator) are combined in the table by
    `combine` ("sum", "max" or "min"), their distinct notes joined; `detail` ones (a round's
    duration and kill point) are kept in the report but not in the table."""
    if combine not in COMBINE:
        raise ValueError(f"combine={combine!r}: one of {', '.join(COMBINE)}")
    entry = {"suite": suite, "figure": figure, "value": value, "unit": unit, "note": note,
             "combine": combine, "detail": detail, "form": "soak" if soak() else "fast",
             "load": load_average(), "at": time.time()}
    print(f"[reliability] {suite}: {figure} = {value}{(' ' + unit) if unit else ''}"
          f"{(' (' + note + ')') if note else ''}")
    target = os.environ.get(REPORT_ENV)
    if target:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")


def table(entries: list[dict[str, Any]]) -> str:
    """The figures of a report as a Markdown table (details left out), in the order they
    were first recorded."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for entry in entries:
        if not entry.get("detail"):
            groups.setdefault((entry["suite"], entry["figure"]), []).append(entry)
    rows = ["| Suite | Figure | Value | Notes |", "|---|---|---|---|"]
    for (suite, figure), group in groups.items():
        values = [e["value"] for e in group]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            value: Any = COMBINE[group[0].get("combine", "sum")](values)
            shown = f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"
        else:
            shown = ", ".join(str(v) for v in values)
        unit = group[0].get("unit") or ""
        notes = list(dict.fromkeys(e["note"] for e in group if e.get("note")))
        note = "; ".join(notes)
        if len(group) > 1:
            note = f"{len(group)} runs" + (f": {note}" if note else "")
        rows.append(f"| {suite} | {figure} | {shown}{(' ' + unit) if unit else ''} "
                    f"| {note.replace('|', '/')} |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    """`python tests/support/soak_report.py REPORT.jsonl`: print its table."""
    if len(argv) != 1:
        sys.stderr.write("usage: soak_report.py REPORT.jsonl\n")
        return 2
    try:
        text = Path(argv[0]).read_text(encoding="utf-8")
    except OSError as exc:
        sys.stderr.write(f"soak_report.py: cannot read {argv[0]}: {exc.strerror}\n")
        return 1
    entries = [json.loads(line) for line in text.splitlines() if line.strip()]
    print(table(entries))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
