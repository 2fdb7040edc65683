"""Handing the terminal to an interactive program ($SHELL, $EDITOR) and taking it back."""

from __future__ import annotations

import subprocess
from pathlib import Path

from textual.app import App, SuspendNotSupported


def run_command(argv: list[str], cwd: Path) -> int:
    """Run an interactive program on the real terminal (the app is suspended)."""
    try:
        return subprocess.call(argv, cwd=cwd)
    except OSError as exc:
        raise RuntimeError(f"could not start {argv[0]}: {exc.strerror}") from None


def run_external(app: App[object], argv: list[str], cwd: Path, what: str) -> None:
    """Suspend the panel, run an interactive program in ``cwd``, come back; a program
    that cannot start or a terminal that cannot hand over is said in a toast."""
    try:
        with app.suspend():
            print(f"fleet-tui: {what}", flush=True)
            code = run_command(argv, cwd)
    except SuspendNotSupported:
        app.notify("This terminal cannot hand over control (no suspend here).",
                   severity="error", markup=False)
        return
    except RuntimeError as exc:
        app.notify(str(exc), severity="error", markup=False)
        return
    if code:
        app.notify(f"{argv[0]} exited with {code}", severity="warning", markup=False)
    app.refresh()
