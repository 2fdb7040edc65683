"""`fleet-tui [--demo] [--repo PATH]`: open the control panel.

Textual is imported only here, after the arguments are read, so `fleet-tui --help` and
the other commands stay fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleet-tui", description="The control panel for a fleet of Claude Code workers.")
    parser.add_argument("--demo", action="store_true",
                        help="a scratch repository, a scripted local endpoint and a few "
                             "running tasks; no API key needed")
    parser.add_argument("--repo", type=Path, default=None,
                        help="the repository new tasks start in (default: the one around "
                             "the current directory)")
    parser.add_argument("--no-scheduler", action="store_true",
                        help="only watch: do not start queued tasks from this panel")
    return parser


def _fail(message: str, code: int = 1) -> int:
    sys.stderr.write(f"fleet-tui: {message}\n")
    return code


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from fleet_tui import git
    from fleet_tui.config import ConfigError, load_settings

    demo = None
    if args.demo:
        from fleet_tui.ui import demo as demo_mod

        claude = demo_mod.ensure_claude()
        if claude is None:
            return 5
        demo = demo_mod.start_demo(claude)
        repo: Path | None = demo.repo
        print(f"fleet-tui demo: project in {demo.repo}, endpoint {demo.endpoint.url}")
    else:
        start = args.repo if args.repo is not None else Path.cwd()
        try:
            repo = git.main_worktree(start)
        except git.GitError as exc:
            if args.repo is not None:
                return _fail(f"--repo {args.repo}: {exc}", 2)
            repo = None  # the panel still lists tasks; `n` says what to do
    try:
        try:
            settings = load_settings()
        except ConfigError as exc:
            return _fail(str(exc), 2)
        from fleet_tui.fleet import Fleet, FleetError
        from fleet_tui.store import StoreError

        try:
            fleet = Fleet(settings)
            if demo is not None:
                from fleet_tui.ui.demo import submit_demo_tasks

                submit_demo_tasks(fleet, demo.repo)
        except (FleetError, StoreError) as exc:
            return _fail(str(exc))
        default_base = (git.current_branch(repo) or "") if repo is not None else ""
        from fleet_tui.ui.app import FleetApp

        app = FleetApp(fleet, repo=repo, default_base=default_base,
                       run_scheduler=not args.no_scheduler)
        app.run()
        if demo is not None:
            print(f"fleet-tui demo: the project stays in {demo.repo} "
                  f"(FLEET_TUI_HOME={demo.home}).")
        return 0
    finally:
        if demo is not None:
            demo.stop()
            os.environ.pop("ANTHROPIC_AUTH_TOKEN", None)
