#!/usr/bin/env python3
"""Screenshots for the README: drive the real panel through a demo run, headlessly.

Runs the same setup as `fleet-tui --demo` (scratch repository, scripted endpoint, the
real claude binary), opens FleetApp with Textual's Pilot at 160x48, and saves
screenshots/*.svg while the workers run, of the diff review, a review with two comments
(inline and in the R list), a whole tool output (with a search), the merge confirmation
and the launch form; then converts them to PNG with rsvg-convert (apt-get install -y
librsvg2-bin fonts-dejavu-core).

    .venv/bin/python scripts/screenshots.py [--out screenshots] [--size 160x48]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _claude() -> str | None:
    from fleet_tui.demo.session import find_claude_binary

    local = ROOT / ".claude-cli" / "node_modules" / ".bin" / "claude"
    return os.environ.get("FLEET_TEST_CLAUDE") or find_claude_binary() or (
        str(local) if local.exists() else None)


def to_png(svg: Path) -> Path | None:
    """SVG -> PNG; xml:space=preserve keeps the spaces between styled runs."""
    tool = shutil.which("rsvg-convert")
    if tool is None:
        print("rsvg-convert not found: apt-get install -y librsvg2-bin fonts-dejavu-core",
              file=sys.stderr)
        return None
    text = svg.read_text(encoding="utf-8").replace("<svg ", '<svg xml:space="preserve" ', 1)
    with tempfile.NamedTemporaryFile("w", suffix=".svg", delete=False) as tmp:
        tmp.write(text)
    png = svg.with_suffix(".png")
    subprocess.run([tool, tmp.name, "-o", str(png)], check=True)
    os.unlink(tmp.name)
    return png


async def _until(pilot: Any, predicate: Callable[[], bool], what: str,
                 timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"screenshots: timed out waiting for {what}")
        await pilot.pause(0.1)


async def shoot(out: Path, size: tuple[int, int]) -> list[Path]:
    from textual.widgets import Input, TextArea

    from fleet_tui.core.review import diff_lines
    from fleet_tui.demo.session import start_demo, submit_demo_tasks
    from fleet_tui.engine.fleet import Fleet
    from fleet_tui.settings.config import load_settings
    from fleet_tui.store.db import TaskState
    from fleet_tui.ui.app import FleetApp
    from fleet_tui.ui.screens.main import MainScreen
    from fleet_tui.ui.screens.review import ReviewScreen
    from fleet_tui.ui.widgets.diff_view import DiffView
    from fleet_tui.ui.widgets.stream_view import StreamView
    from fleet_tui.ui.widgets.task_table import TaskTable

    claude = _claude()
    if claude is None:
        raise SystemExit("screenshots: no claude binary (run scripts/test once, or set "
                         "FLEET_TEST_CLAUDE)")
    scratch = Path(tempfile.mkdtemp(prefix="fleet-shots-"))
    demo = start_demo(claude, root=scratch / "demo")  # its endpoint: scratch/endpoint
    saved: list[Path] = []
    try:
        fleet = Fleet(load_settings())
        tasks = submit_demo_tasks(fleet, demo.repo)
        validate = tasks[0].id
        app = FleetApp(fleet, repo=demo.repo, default_base="main", bell=False)

        def save(name: str) -> None:
            for widget in app.screen.query("Input, TextArea"):
                assert isinstance(widget, Input | TextArea)
                widget.cursor_blink = False
            path = out / f"{name}.svg"
            app.save_screenshot(filename=path.name, path=str(out))
            saved.append(path)
            print(f"wrote {path}")

        async with app.run_test(size=size) as pilot:
            main = app.main
            table = main.query_one(TaskTable)
            await _until(pilot, lambda: validate in table.keys, "the task list")
            table.select_key(validate)
            await _until(pilot, lambda: fleet.status().running >= 2
                         and main.query_one(StreamView).row_count() >= 6,
                         "workers to be busy")
            save("main-running")

            # the stock task waits for the user's message (the demo's `s`): send it one
            await _until(pilot, lambda: fleet.say(validate, "keep the error message short",
                                                  wait=0.5),
                         "the stock task to take a message")
            await _until(pilot, lambda: fleet.get_task(validate).state
                         == TaskState.SUCCEEDED, "the task to finish")
            await _until(pilot, lambda: main.tasks[validate].state == TaskState.SUCCEEDED,
                         "the panel to see it")
            table.select_key(validate)
            await pilot.press("2")
            diff = main.query_one(DiffView)
            await _until(pilot, lambda: diff.prepared is not None
                         and bool(diff.prepared.diff.files), "the diff")
            await pilot.pause(0.3)
            save("diff-review")

            # a review under way: two comments on the worker's lines, shown inline under
            # them, then the list R opens
            first = diff.prepared.diff.files[0]
            added = [r.new for r in diff_lines(first.patch.splitlines(), [first.path])
                     if r is not None and r.kind == "+" and r.new is not None]
            if len(added) < 3:
                raise SystemExit(f"screenshots: {first.path} has too few added lines")
            fleet.comment_at(validate, first.path, added[0], added[0],
                             "Name it `available`: `have` reads like a verb here.")
            fleet.comment_at(validate, first.path, added[1], added[2],
                             "Say which item ran short; and a test for count == have?")
            main.diff.reload()  # the panel reads comments with each diff
            await _until(pilot, lambda: len(diff.comments) == 2, "the comments in the diff")
            await pilot.pause(0.3)
            save("review-comments")
            await pilot.press("R")
            await _until(pilot, lambda: isinstance(app.screen, ReviewScreen), "the review list")
            await pilot.pause(0.3)
            save("review-list")
            await pilot.press("escape")
            await _until(pilot, lambda: isinstance(app.screen, MainScreen), "the main screen")

            # the whole output of the test run (its first line is a row of dashes: the
            # stream shows that; x shows everything, and / finds the verdict)
            await pilot.press("1")
            view = main.query_one(StreamView)
            await _until(pilot, lambda: any(line.startswith("$ Bash python3 -m unittest")
                                            for line in view.plain_lines()), "the test run")
            view.move_cursor(next(i for i, line in enumerate(view.plain_lines())
                                  if line.startswith("$ Bash python3 -m unittest")))
            await pilot.press("x")
            await _until(pilot, lambda: not isinstance(app.screen, MainScreen),
                         "the tool call")
            await pilot.press("slash", "O", "K", "enter")
            await pilot.pause(0.3)
            save("tool-output")
            await pilot.press("escape", "escape")
            await _until(pilot, lambda: isinstance(app.screen, MainScreen), "the main screen")
            await pilot.press("2")

            await pilot.press("m")
            await _until(pilot, lambda: not isinstance(app.screen, MainScreen),
                         "the merge dialog")
            await pilot.pause(0.3)
            save("merge-confirm")
            await pilot.press("escape")

            await pilot.press("n")
            await _until(pilot, lambda: bool(app.screen.query("#prompt")), "the form")
            await pilot.press(*"Add a low-stock warning to inventory.py", "enter",
                              *"and a test for it.")
            await pilot.pause(0.3)
            save("launch-form")
            await pilot.press("escape")
            app.stop_scheduler()
    finally:
        demo.stop()
        demo.endpoint.stop()  # nothing of a throwaway run stays behind
        shutil.rmtree(scratch, ignore_errors=True)
    return saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "screenshots")
    parser.add_argument("--size", default="160x48")
    args = parser.parse_args(argv)
    width, height = (int(x) for x in args.size.lower().split("x"))
    args.out.mkdir(parents=True, exist_ok=True)
    saved = asyncio.run(shoot(args.out, (width, height)))
    for svg in saved:
        png = to_png(svg)
        if png:
            print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
