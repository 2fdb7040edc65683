"""Best of N in the headless CLI: `compare`'s ranking table, `pick --best`, and the rank
that `show` and `ls --json` carry. commands/tasks.py parses the arguments and calls these.

Everything printed from a worker, git or the user's commands (file names, a command's
words, a reason quoting them) goes through `stream.one_line`: no control character reaches
the terminal.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from fleet_tui.core import stream
from fleet_tui.core.errors import EXIT_USAGE, FleetTuiError
from fleet_tui.core.ranking import CheckResult, Ranked
from fleet_tui.store.budgets import usd
from fleet_tui.store.db import Task

__all__ = ["compare_json", "print_ranking", "rank_line", "winner_of"]


def _safe(text: str | None, limit: int = 100) -> str:
    return stream.one_line(text or "", limit)


def _tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def _check(c: CheckResult | None) -> str:
    if c is None:
        return "-"
    return f"{'passed' if c.passed else 'FAILED'} {c.seconds:.1f}s"


def _checks(r: Ranked) -> str:
    ev = r.evidence
    if ev is None or not ev.checks:
        return "-"
    return f"{sum(c.passed for c in ev.checks)}/{len(ev.checks)}"


def place_text(r: Ranked, total: int) -> str:
    """"★1" for the best (every copy tied at the top), "2", "3" ... for the others."""
    return f"{'★' if r.best else ''}{r.place}"


def print_ranking(out: Callable[[str], None], ranked: list[Ranked], tasks: dict[str, Task],
                  costs: dict[str, float]) -> None:
    """The copies best first, each with its evidence and, below it, the reason and the
    files (those no other copy touched marked *)."""
    out(f"{'ID':<6}  {'RANK':<4}  {'TESTS':<12}  {'CHECKS':<6}  {'+/-':>9}  {'FILES':>5}  "
        f"{'VERDICT':<9}  {'TURNS':>5}  {'TOKENS':>7}  {'COST':>8}  {'OPEN':>4}  "
        "MERGES CLEANLY")
    for r in ranked:
        t = tasks[r.task_id]
        ev = r.evidence
        change = f"+{ev.added}/-{ev.deleted}" if ev is not None else "-"
        files = str(len(ev.files)) if ev is not None else "-"
        merges = _safe(ev.merges, 60) if ev is not None else "not gathered yet"
        cost = usd(costs[t.id]) if costs.get(t.id) else "-"
        out(f"{t.id:<6}  {place_text(r, len(ranked)):<4}  "
            f"{_check(ev.test) if ev is not None else '-':<12}  {_checks(r):<6}  "
            f"{change:>9}  {files:>5}  {_safe(t.verdict, 9) or '-':<9}  {t.turns:>5}  "
            f"{_tokens(t.input_tokens + t.output_tokens):>7}  {cost:>8}  "
            f"{ev.open_comments if ev is not None else 0:>4}  {merges}")
        out(f"      why: {_safe(r.reason, 120)}")
        if ev is not None and ev.files:
            marked = [f"{f}*" if f in ev.outside else f for f in ev.files]
            out(f"      files: {_safe(', '.join(marked), 110)}")
        if ev is not None:
            for c in (ev.test, *ev.checks):
                if c is not None and not c.passed and c.tail:
                    tail = [line for line in c.tail.splitlines() if line.strip()][-1:]
                    out(f"      {_safe(c.command, 40)}: {_safe(' '.join(tail), 90)}")
    best = [r.task_id for r in ranked if r.best]
    if not best:
        out("no copy passes: `fleet-tui pick --best` would land nothing")
    elif len(best) > 1:
        out(f"tied for best: {', '.join(best)} (equal evidence); `pick --best` asks, or "
            "with --yes takes the first")
    if any(r.evidence is not None and r.evidence.outside for r in ranked):
        out("* a file no other copy touched")


def rank_line(r: Ranked, total: int) -> str:
    """`show`'s rank row."""
    best = " (best)" if r.best else ""
    return f"{r.place} of {total}{best}: {_safe(r.reason, 120)}"


def compare_json(ranked: list[Ranked], base: dict[str, dict[str, Any]]
                 ) -> list[dict[str, Any]]:
    """`compare --json`: each copy's row (as before) with its rank, best first."""
    return [{**base[r.task_id], "rank": r.as_json()} for r in ranked]


class _Tie(FleetTuiError):
    exit_code = EXIT_USAGE


def winner_of(ranked: list[Ranked], yes: bool) -> str | None:
    """The copy `pick --best` lands: the best; None when none passes. Copies tied at the
    top: asked in a terminal, the first (the smallest change, then copy order) with
    --yes, refused (exit 2) on a non-interactive stdin without it."""
    best = [r for r in ranked if r.best]
    if not best:
        return None
    if len(best) == 1 or yes:
        return best[0].task_id
    if sys.stdin is None or not sys.stdin.isatty():
        raise _Tie(f"copies {', '.join(r.task_id for r in best)} are tied for best (equal "
                   "evidence); name one (`fleet-tui pick ID`), or pass --yes to take "
                   f"{best[0].task_id}")
    names = [r.task_id for r in best]
    sys.stdout.write(f"copies {', '.join(names)} are tied for best (equal evidence); "
                     f"which one to land? [{names[0]}] ")
    sys.stdout.flush()
    answer = sys.stdin.readline().strip()
    if not answer:
        return names[0]
    chosen = [n for n in names if n.startswith(answer)]
    if len(chosen) != 1:
        raise _Tie(f"{answer!r} is not one of {', '.join(names)}; nothing was changed")
    return chosen[0]
