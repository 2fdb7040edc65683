"""Every folder of the test suite on the import path.

The tests sit in folders by layer and import their shared helpers (this folder) and, at
times, each other (test_fleet's drive and make_fleet) by module name, as pytest's default
import mode allows; conftest.py calls this once, and so does a child process that imports
a test module.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
SKIP = {"__pycache__", "__snapshots__", "fixtures"}


def on_path() -> None:
    """Put tests/support and every folder holding a test module on sys.path (once)."""
    folders = sorted({p.parent for p in TESTS.rglob("*.py")
                      if not SKIP.intersection(p.relative_to(TESTS).parts)})
    for folder in folders:
        if str(folder) not in sys.path:
            sys.path.append(str(folder))
