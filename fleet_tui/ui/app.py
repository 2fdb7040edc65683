"""FleetApp: the Textual control panel over the engine.

The app owns the engine object, runs the scheduler loop (``Fleet.run``) in a thread worker
so the panel is one of the processes that start queued tasks, turns every failed worker
into one error toast, and hands the terminal to $SHELL / $EDITOR when asked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

from textual import work
from textual.app import App, SuspendNotSupported, SystemCommand
from textual.binding import Binding
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from fleet_tui.ui.screens.main import HELP_TEXT, MainScreen, run_command

TYPE_CHECKING = False
if TYPE_CHECKING:
    from fleet_tui.fleet import Fleet

HIDDEN_DELAY = 0.05  # seconds after the first layout until the hidden widgets are mounted
ENGINE_WAIT = 120.0  # seconds a thread waits for the engine before giving up


class EngineNotStarted(RuntimeError):
    """Asked for the engine after making it failed: that failure is the one reported."""


def describe_error(error: BaseException) -> str:
    """A user-facing message for an engine failure; never a traceback."""
    from fleet_tui.fleet import FleetError
    from fleet_tui.git import GitError

    if isinstance(error, FleetError | GitError):
        return str(error) or type(error).__name__
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class FleetApp(App[None]):
    """The control panel. Inject ``clock`` and turn the scheduler off for snapshots.

    ``fleet`` is the engine, or a function that makes it: then it is made in a thread
    once the first frame is up (importing the engine and GitPython takes longer than
    Textual's own start), and every thread that asks for ``fleet`` waits for it.
    """

    CSS_PATH = "app.tcss"
    TITLE = "fleet-tui"
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", show=False, priority=True, id="app.ctrl_q"),
    ]

    def __init__(self, fleet: Fleet | Callable[[], Fleet], *, repo: Path | None = None,
                 default_base: str = "",
                 clock: Callable[[], float] = time.time, run_scheduler: bool = True,
                 poll_interval: float = 0.5, diff_interval: float = 2.0,
                 stream_interval: float = 0.1, bell: bool = True,
                 scheduler_interval: float = 0.25) -> None:
        super().__init__()
        self._fleet: Fleet | None = None
        self._make_fleet: Callable[[], Fleet] | None = None
        self._fleet_ready = threading.Event()
        if callable(fleet):
            self._make_fleet = fleet
        else:
            self._fleet = fleet
            self._fleet_ready.set()
        self.repo = repo
        self.default_base = default_base
        self.clock = clock
        self.run_scheduler = run_scheduler
        self.poll_interval = poll_interval
        self.diff_interval = diff_interval
        self.stream_interval = stream_interval
        self.scheduler_interval = scheduler_interval
        self.bell_enabled = bell
        self.bells = 0
        self.errors: list[str] = []
        self.toasts: list[tuple[str, str, str]] = []  # (severity, title, message)
        self._stop = threading.Event()
        self.quitting = False
        self._last_error: str | None = None
        self._last_error_at = 0.0

    @property
    def fleet(self) -> Fleet:
        """The engine; a thread that asks before it is made waits for it. (The event
        loop never asks: every engine call runs in a thread worker.)"""
        if self._fleet is None and not self._fleet_ready.wait(ENGINE_WAIT):
            raise RuntimeError("the engine did not start in time")
        if self._fleet is None:
            raise EngineNotStarted("the engine did not start")
        return self._fleet

    def on_ready(self) -> None:
        """The first layout is done (its frame is painted right after this): mount what
        it does not show a moment later, so they do not delay it."""
        main = self.main
        main.set_timer(HIDDEN_DELAY, main.mount_hidden)

    def on_mount(self) -> None:
        self.push_screen(MainScreen())
        if self._make_fleet is not None:
            self._start_engine()
        elif self.run_scheduler:
            self._scheduler()

    @work(thread=True, exit_on_error=False, group="engine", name="engine",
          description="starting the engine")
    def _start_engine(self) -> None:
        assert self._make_fleet is not None
        try:
            self._fleet = self._make_fleet()
        except Exception as exc:
            message = f"fleet-tui: {describe_error(exc)}"
            # after the next refresh: exiting while the main screen still mounts fails
            self.call_from_thread(self.call_after_refresh, partial(
                self.exit, return_code=1, message=message))
            raise
        finally:
            self._fleet_ready.set()
        if self.run_scheduler:
            self.call_from_thread(self._scheduler)

    @property
    def main(self) -> MainScreen:
        for candidate in self.screen_stack:
            if isinstance(candidate, MainScreen):
                return candidate
        raise LookupError("the main screen is not up")

    # --- the scheduler -------------------------------------------------------------------
    def _scheduler(self) -> None:
        self.run_worker(partial(self.fleet.run, self._stop, self.scheduler_interval),
                        thread=True, exit_on_error=False, group="scheduler",
                        name="scheduler", description="the scheduler")

    def stop_scheduler(self) -> None:
        self._stop.set()

    def on_unmount(self) -> None:
        self._stop.set()

    async def action_quit(self) -> None:
        self.quitting = True  # keys already typed must not open screens on the way out
        self._stop.set()
        self.exit()

    def settings_test_command(self) -> str | None:
        settings = getattr(self.fleet, "settings", None)
        command = getattr(settings, "test_command", None)
        return command if isinstance(command, str) and command else None

    # --- one place for worker failures ---------------------------------------------------
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state != WorkerState.ERROR or event.worker.error is None:
            return
        if isinstance(event.worker.error, EngineNotStarted):
            return  # the engine's own failure is reported (and ends the panel)
        message = describe_error(event.worker.error)
        self.errors.append(message)
        now = time.monotonic()
        if self._last_error == message and now - self._last_error_at < 10:
            return  # a poll failing every half second says it once
        self._last_error, self._last_error_at = message, now
        what = event.worker.description or event.worker.name or "background work"
        self.notify(message, title=f"Failed: {what}", severity="error", timeout=10)
        self.ring()
        if event.worker.group == "scheduler" and not self._stop.is_set():
            # The scheduler must keep going: start it again after a pause.
            self.set_timer(2.0, self._scheduler)

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """A toast; markup is off by default because messages carry agent and git text."""
        self.toasts.append((severity, title, message))
        del self.toasts[:-200]
        super().notify(message, title=title, severity=severity, timeout=timeout,
                       markup=markup)

    def ring(self) -> None:
        self.bells += 1
        if self.bell_enabled:
            self.bell()

    # --- outside programs ----------------------------------------------------------------
    def run_external(self, argv: list[str], cwd: Path, what: str) -> None:
        """Suspend the panel, run an interactive program in ``cwd``, come back."""
        try:
            with self.suspend():
                print(f"fleet-tui: {what}", flush=True)
                code = run_command(argv, cwd)
        except SuspendNotSupported:
            self.notify("This terminal cannot hand over control (no suspend here).",
                        severity="error", markup=False)
            return
        except RuntimeError as exc:
            self.notify(str(exc), severity="error", markup=False)
            return
        if code:
            self.notify(f"{argv[0]} exited with {code}", severity="warning", markup=False)
        self.refresh()

    # --- command palette -----------------------------------------------------------------
    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if not isinstance(screen, MainScreen):
            return
        for binding in screen.BINDINGS:
            assert isinstance(binding, Binding)
            action = binding.action
            name, _, args = action.partition("(")
            params: tuple[object, ...] = (args.rstrip(")").strip("'\""),) if args else ()
            if name in ("quit",) or not screen.check_action(name, params):
                continue
            key = self.get_key_display(binding)
            help_text = HELP_TEXT.get(action, binding.description)
            yield SystemCommand(f"{binding.description} ({key})", help_text,
                                partial(screen.run_action, action))
