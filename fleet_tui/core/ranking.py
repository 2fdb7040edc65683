"""Best of N: the copies of a task ordered by evidence, each with the reason for its place.

Pure rules (no git, no store): the engine gathers each copy's evidence (engine/ranking.py)
and this module orders them. The order, most important first:

1. a copy that fails the test command, does not merge cleanly on its base's tip, changed
   nothing, or cannot be landed (its state) ranks last: it does not *pass*;
2. then fewer named checks (`[rank] checks`) failing;
3. then the smaller change (lines added + removed, then files);
4. then the lower cost.

Copies whose evidence is equal on all four are tied: all of them are shown as best when
they lead, and `pick --best` asks (or, told yes, takes the first of them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CheckResult", "CopyEvidence", "Ranked", "rank"]


@dataclass(frozen=True)
class CheckResult:
    """One command run in a copy's worktree: the test command or a named check."""

    command: str
    passed: bool
    seconds: float
    tail: str = ""  # the end of its output (for a failure's reason)

    def as_json(self) -> dict[str, Any]:
        return {"command": self.command, "passed": self.passed,
                "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class CopyEvidence:
    """What was found about one copy: gathered once its copies had ended, kept in the
    store with the fingerprint of what it is evidence of (a copy that changes since, or a
    base that moves, makes it stale)."""

    task_id: str
    fingerprint: str
    gathered_at: float
    test: CheckResult | None  # None: the repository names no test command
    checks: tuple[CheckResult, ...] = ()
    added: int = 0
    deleted: int = 0
    files: tuple[str, ...] = ()
    outside: tuple[str, ...] = ()  # files no other copy touched
    clean: bool | None = None  # merges cleanly on its base's tip now
    merges: str = ""  # "yes", or why not
    open_comments: int = 0
    landable: str | None = None  # None: its state allows landing it; else why not
    seconds: float = 0.0  # how long gathering it took

    @property
    def size(self) -> int:
        return self.added + self.deleted

    def as_json(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "gathered_at": self.gathered_at,
                "test": self.test.as_json() if self.test is not None else None,
                "checks": [c.as_json() for c in self.checks],
                "added": self.added, "deleted": self.deleted, "files": list(self.files),
                "outside": list(self.outside), "clean": self.clean, "merges": self.merges,
                "open_comments": self.open_comments, "landable": self.landable is None,
                "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class Ranked:
    """One copy's place: 1 is best; `best` for every copy tied at the top that passes."""

    task_id: str
    place: int
    best: bool
    passes: bool
    reason: str  # one line: why it stands where it does
    evidence: CopyEvidence | None
    cost: float = 0.0
    tied: tuple[str, ...] = field(default_factory=tuple)  # the others with equal evidence

    def as_json(self) -> dict[str, Any]:
        return {"place": self.place, "best": self.best, "passes": self.passes,
                "reason": self.reason, "tied_with": list(self.tied),
                "cost": round(self.cost, 6),
                "evidence": self.evidence.as_json() if self.evidence is not None else None}


def _failure(ev: CopyEvidence | None) -> str | None:
    """Why the copy does not pass (None: it does)."""
    if ev is None:
        return "no evidence yet"
    if ev.landable is not None:
        return f"cannot be landed: {ev.landable}"
    if ev.test is not None and not ev.test.passed:
        return f"fails the test command ({ev.test.command})"
    if ev.clean is not True:
        return f"does not merge cleanly: {ev.merges or 'unknown'}"
    if not ev.size and not ev.files:
        return "changed nothing"
    return None


def _failed_checks(ev: CopyEvidence | None) -> list[str]:
    return [] if ev is None else [c.command for c in ev.checks if not c.passed]


def _key(ev: CopyEvidence | None, cost: float) -> tuple[int, int, int, int, float]:
    passes = _failure(ev) is None
    return (0 if passes else 1, len(_failed_checks(ev)),
            ev.size if ev is not None else 1 << 30,
            len(ev.files) if ev is not None else 1 << 30, round(cost, 6))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _usd(cost: float) -> str:
    return f"${cost:.2f}" if cost >= 0.01 or not cost else f"${cost:.4f}"


def _why(place: int, ev: CopyEvidence | None, cost: float,
         ahead: tuple[CopyEvidence | None, float] | None, tied: bool) -> str:
    failure = _failure(ev)
    if failure is not None:
        return failure
    assert ev is not None
    tests = "passes the tests" if ev.test is not None else "no test command"
    failed = _failed_checks(ev)
    checks = (f"fails {_plural(len(failed), 'check')} ({', '.join(failed)})" if failed
              else f"passes {_plural(len(ev.checks), 'check')}" if ev.checks else "")
    change = f"+{ev.added}/-{ev.deleted} in {_plural(len(ev.files), 'file')}"
    parts = [tests, *([checks] if checks else []), change]
    if tied:
        parts.append("tied: equal evidence")
    elif ahead is not None:
        other, other_cost = ahead
        assert other is not None
        if len(_failed_checks(other)) < len(failed):
            parts.append("below one that fails fewer checks")
        elif (other.size, len(other.files)) < (ev.size, len(ev.files)):
            parts.append("a larger change than the one above")
        elif round(other_cost, 6) < round(cost, 6):
            parts.append(f"costs more ({_usd(cost)} against {_usd(other_cost)})")
    elif place == 1:
        parts.append("the smallest passing change" if not failed else "fewest checks failing")
    return "; ".join(parts)


def rank(copies: Sequence[tuple[str, CopyEvidence | None, float]]) -> list[Ranked]:
    """The copies (id, evidence or None, cost in USD), best first: passing ones before
    failing ones, then fewer failed checks, the smaller change, the lower cost. Equal
    evidence shares a place; the copies tied at place 1 that pass are all `best`. Stable:
    equal copies keep the order given (copy order)."""
    keyed = sorted(enumerate(copies), key=lambda c: (_key(c[1][1], c[1][2]), c[0]))
    groups: list[list[tuple[str, CopyEvidence | None, float]]] = []
    for _, copy in keyed:
        if groups and _key(groups[-1][0][1], groups[-1][0][2]) == _key(copy[1], copy[2]):
            groups[-1].append(copy)
        else:
            groups.append([copy])
    out: list[Ranked] = []
    above: tuple[CopyEvidence | None, float] | None = None
    for group in groups:
        place = len(out) + 1
        for task_id, ev, cost in group:
            passes = _failure(ev) is None
            tied = tuple(c[0] for c in group if c[0] != task_id) if passes else ()
            out.append(Ranked(task_id, place, passes and place == 1, passes,
                              _why(place, ev, cost, above, bool(tied)), ev, cost, tied))
        above = (group[0][1], group[0][2])
    return out
