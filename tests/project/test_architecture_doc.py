"""ARCHITECTURE.md stays a newcomer's map: every module, file and folder it names exists,
it carries no issue numbers (the history is in git), and it stays short enough to read.
No claude, no processes: the document and the tree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "ARCHITECTURE.md"
MAX_LINES = 520
# what the document describes on paper only (a kind it shows as files, not code)
ON_PAPER = ("execution/k8s/",)
# folders it names that are not the repository's (the user's data dir)
NOT_IN_THE_TREE = {"claude-cli/"}
# a file name: fleet_tui/x/y.py, tests/x/y.py, bench/x.py, y.py, cage_host.mjs
FILE = re.compile(r"(?<![\w./<>$-])((?:[\w-]+/)*[\w-]+\.(?:py|mjs|tcss|md))(?![\w/])")
FOLDER = re.compile(r"`((?:[\w-]+/)+)`")
MODULE = re.compile(r"\bfleet_tui(?:\.\w+)+")
ISSUE = re.compile(r"\b[Ii]ssues?\s+#?\d+|\bfindings?\s+\d+")
SEARCHED = ("fleet_tui", "tests", "bench", "scripts")


def _exists(name: str) -> bool:
    path = Path(name)
    if len(path.parts) == 1 and not name.endswith("/"):  # a bare file name: anywhere
        return (ROOT / name).exists() or any(
            any((ROOT / top).rglob(name)) for top in SEARCHED)
    return (ROOT / name).exists() or (ROOT / "fleet_tui" / name).exists()


def _named(text: str) -> set[str]:
    names = {m.group(1) for m in FILE.finditer(text)}
    names |= {m.group(1) for m in FOLDER.finditer(text)}
    return {n for n in names
            if not n.startswith(ON_PAPER) and n not in NOT_IN_THE_TREE}


def test_every_module_file_and_folder_it_names_exists() -> None:
    text = DOC.read_text(encoding="utf-8")
    names = _named(text)
    assert len(names) > 50  # the document names the tree (the patterns still find it)
    missing = sorted(n for n in names if not _exists(n))
    assert not missing, f"ARCHITECTURE.md names what the tree does not have: {missing}"


def test_every_dotted_module_it_names_exists() -> None:
    text = DOC.read_text(encoding="utf-8")
    modules = {m.group(0) for m in MODULE.finditer(text)
               if not m.group(0).replace(".", "/").startswith(
                   tuple("fleet_tui/" + p.rstrip("/") for p in ON_PAPER))}
    assert modules
    missing = sorted(
        m for m in modules
        if not (ROOT / (m.replace(".", "/") + ".py")).exists()
        and not (ROOT / m.replace(".", "/") / "__init__.py").exists())
    assert not missing, f"ARCHITECTURE.md names modules the package does not have: {missing}"


def test_no_issue_numbers_and_short_enough_to_read() -> None:
    lines = DOC.read_text(encoding="utf-8").splitlines()
    numbered = [f"{i}: {line}" for i, line in enumerate(lines, 1) if ISSUE.search(line)]
    assert not numbered, "issue numbers in ARCHITECTURE.md:\n" + "\n".join(numbered)
    assert len(lines) <= MAX_LINES, f"ARCHITECTURE.md has {len(lines)} lines (at most {MAX_LINES})"


def test_the_checks_catch_what_they_are_for() -> None:
    """The patterns find a module that is not there, an issue number and a folder."""
    names = _named("see `engine/nothing_here.py` and `store/`, tests/x/y.py")
    assert {"engine/nothing_here.py", "store/", "tests/x/y.py"} <= names
    assert not _exists("engine/nothing_here.py")
    assert _exists("store/") and _exists("engine/fleet.py") and _exists("endpoint_helpers.py")
    # the words apart, so that the sweep of issue numbers leaves these lines alone
    word, finding = "issue", "finding"
    assert ISSUE.search(f"landing ({word} 12)") and ISSUE.search(f"{word}s 12 and 19")
    assert ISSUE.search(f"({word} 9, {finding} 8)") and not ISSUE.search("landing (the queue)")
