"""`fleet-tui [--demo] [--repo PATH]`: open the control panel.

Textual is imported only here, after the arguments are read, so `fleet-tui --help` and
the other commands stay fast. The engine is made after the panel's first frame (see
``FleetApp``), and with it the lookup of the repository around the current directory.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from fleet_tui.demo.session import Demo
    from fleet_tui.settings.config import Settings
    from fleet_tui.ui.messages import EngineReady


class Options:
    """What the command line asks for."""

    def __init__(self, *, demo: bool = False, repo: Path | None = None,
                 no_scheduler: bool = False, new: bool = False, served: bool = False) -> None:
        self.demo = demo
        self.served = served
        self.new = new
        self.repo = repo
        self.no_scheduler = no_scheduler


def _parse(argv: list[str]) -> Options:
    if not argv:
        # `fleet-tui` alone, the usual start: nothing to parse, and argparse (with gettext,
        # which it imports) would cost the first frame ~5 ms, 3% of Textual's own start
        return Options()
    args = _parser().parse_args(argv)
    if args.new and not args.demo:
        _parser().error("--new goes with --demo (a fresh demo)")
    return Options(demo=args.demo, repo=args.repo, no_scheduler=args.no_scheduler,
                   new=args.new, served=args.served)


def _parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(
        prog="fleet-tui", description="The control panel for a fleet of Claude Code workers.")
    parser.add_argument("--demo", action="store_true",
                        help="a scratch repository, a scripted local endpoint and a few "
                             "running tasks; no API key needed. As in a real run, workers "
                             "keep running after the panel quits: the endpoint is a "
                             "process of its own, reused by the next --demo, and it stops "
                             "by itself a minute after nothing uses it (no worker, no "
                             "demo panel)")
    parser.add_argument("--new", action="store_true",
                        help="with --demo: start a fresh demo (by default --demo reopens "
                             "the last one, with its tasks)")
    parser.add_argument("--repo", type=Path, default=None,
                        help="the repository new tasks start in (default: the one around "
                             "the current directory)")
    parser.add_argument("--no-scheduler", action="store_true",
                        help="only watch: do not start queued tasks from this panel")
    # `fleet-tui serve` starts each browser session's panel with it: the panel is in a
    # browser, and what would open on this machine's terminal (a shell, $EDITOR) is off
    parser.add_argument("--served", action="store_true", help=argparse.SUPPRESS)
    return parser


def _fail(message: str, code: int = 1) -> int:
    sys.stderr.write(f"fleet-tui: {message}\n")
    return code


def main(argv: list[str]) -> int:
    args = _parse(argv)
    # No cyclic garbage collection until the first frame is out: the start-up makes ~54,000
    # container objects that stay alive (modules, classes, widgets, styles), and the
    # collector ran ~116 times on the way over them (~14 ms). The app freezes what is there
    # and resumes the collector once the frame is written (FleetApp's resume_gc).
    gc.disable()
    try:
        return _panel(args)
    finally:
        gc.enable()


def _panel(args: Options) -> int:
    # Textual first: the first frame needs nothing else. The engine (store, GitPython) is
    # made in a thread once the frame is up, and the repository is looked up there too.
    from fleet_tui.settings.config import ConfigError, load_settings
    from fleet_tui.ui.app import FleetApp

    demo = None
    repo: Path | None = None
    if args.demo:
        started = _start_demo(args)
        if isinstance(started, int):
            return started
        demo = started
        repo = demo.repo
    elif args.repo is not None:
        # named on the command line: a mistake is reported before the screen is taken
        from fleet_tui.vcs import git

        try:
            repo = git.main_worktree(args.repo)
        except git.GitError as exc:
            return _fail(f"--repo {args.repo}: {exc}", 2)
    try:
        try:
            settings = load_settings()
        except ConfigError as exc:
            return _fail(str(exc), 2)
        look_around = not args.demo and args.repo is None
        app = FleetApp(_engine_maker(settings, repo, look_around, demo), repo=repo,
                       run_scheduler=not args.no_scheduler, resume_gc=True,
                       served=args.served)
        app.run()
        if app.return_code:
            return app.return_code
        if demo is not None:
            print(f"fleet-tui demo: the project stays in {demo.repo} "
                  f"(FLEET_TUI_HOME={demo.home}). Workers still running finish on their "
                  f"own; the endpoint (pid {demo.endpoint.pid}) stops a minute after the "
                  "last one. `fleet-tui --demo` reopens this demo; `--demo --new` "
                  "starts another.")
        return 0
    finally:
        if demo is not None:
            demo.stop()


def _start_demo(args: Options) -> Demo | int:
    """The demo's project and endpoint, started or reopened (said on the terminal), or the
    exit code when it cannot start (no claude CLI, an endpoint that does not come up)."""
    from fleet_tui.demo import session as demo_mod

    claude = demo_mod.ensure_claude()
    if claude is None:
        return 5
    demo_mod.ensure_cage()  # its workers are caged: srt offered as claude is
    try:
        demo = demo_mod.start_demo(
            claude, root=None if args.new else demo_mod.latest_demo())
    except (demo_mod.DemoEndpointError, OSError) as exc:
        return _fail(f"--demo: {exc}")
    endpoint = demo.endpoint
    if demo.reopened:
        print(f"fleet-tui demo: reopened the last demo ({demo.root}); "
              "`fleet-tui --demo --new` starts a fresh one")
    print(f"fleet-tui demo: project in {demo.repo}, endpoint {endpoint.url} "
          f"({'running already' if endpoint.reused else 'started'}: pid {endpoint.pid}, "
          f"log {endpoint.log})")
    return demo


def _engine_maker(settings: Settings, repo: Path | None, look_around: bool,
                  demo: Demo | None) -> Callable[[], EngineReady]:
    """The function that makes the panel's engine (``FleetApp`` runs it in a thread after
    the first frame); ``look_around``: find the repository around the current directory
    there, else new tasks start in ``repo``."""
    from fleet_tui.ui.messages import EngineReady

    def make_engine() -> EngineReady:
        """Runs in a thread after the first frame; a FleetError or StoreError ends the
        panel with its message. What it returns is the panel's EngineReady: the engine,
        the repository new tasks start in (looked up here unless given) and its
        current branch."""
        from fleet_tui.engine.fleet import Fleet
        from fleet_tui.vcs import git

        where = repo
        if look_around:
            try:
                where = git.main_worktree(Path.cwd())
            except git.GitError:
                where = None  # the panel still lists tasks; `n` says what to do
        base = (git.current_branch(where) or "") if where is not None else ""
        fleet = Fleet(settings)
        # the key known before the stream pane reads a worker's words (they are shown
        # with it hidden: redaction), and the first diff need not wait for a lookup
        fleet.prepare_secret_scan()
        # config.toml edited while the panel runs: read again (a bad edit is said and
        # the settings in use stay)
        fleet.watch_settings()
        if demo is not None and not demo.reopened:
            from fleet_tui.demo.session import submit_demo_tasks

            submit_demo_tasks(fleet, demo.repo)
        return EngineReady(fleet, where, base)

    return make_engine
