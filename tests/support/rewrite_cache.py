"""pytest's cache of rewritten test modules, written once before the xdist workers start.

pytest rewrites the asserts of every test module it imports (parse, rewrite, compile) and
keeps the result in `__pycache__/*-pytest-*.pyc`, but only where Python may write bytecode:
with PYTHONDONTWRITEBYTECODE set (CI's environment) every xdist worker rewrote every
module again, and so did the serial pass: a collection took 8.5 CPU-s against 3.1 with the
cache, seven times a run. `fill(config)` writes the cache for each test module (and
conftest.py) under the given roots, whatever that variable says, as conftest.py's
compileall does for the checkout's own modules; a file whose cache is current is skipped.

It uses pytest's own rewriting (its private functions, in _pytest.assertion.rewrite): a
pytest without them leaves the cache alone, and the workers rewrite as before.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def fill(config: pytest.Config, *roots: Path) -> int:
    """Write the rewritten pyc of each test module under `roots`; returns how many were
    written (0 also when pytest's rewriting is not what this knows)."""
    try:
        from _pytest.assertion import rewrite
    except ImportError:
        return 0
    needed = ("PYC_TAIL", "get_cache_dir", "_read_pyc", "_rewrite_test", "_write_pyc",
              "assertstate_key")
    if config.getoption("assertmode", "rewrite") != "rewrite" or not all(
            hasattr(rewrite, name) for name in needed):
        return 0
    state = config.stash.get(rewrite.assertstate_key, None)
    if state is None:
        return 0
    written = 0
    for root in roots:
        for source in sorted([*root.rglob("test_*.py"), *root.rglob("conftest.py")]):
            if "__pycache__" in source.parts:
                continue
            cache_dir = rewrite.get_cache_dir(source)
            pyc = cache_dir / (source.name[:-3] + rewrite.PYC_TAIL)
            if rewrite._read_pyc(source, pyc) is not None:
                continue
            try:
                cache_dir.mkdir(exist_ok=True)
                stat, code = rewrite._rewrite_test(source, config)
            except (OSError, SyntaxError):
                continue  # the worker's own import says what is wrong with it
            written += bool(rewrite._write_pyc(state, code, stat, pyc))
    return written
