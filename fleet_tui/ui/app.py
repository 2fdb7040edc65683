"""FleetApp: the Textual control panel over the engine.

The app makes the engine (or is given it), runs the scheduler loop (``Fleet.run``) in a
thread worker so the panel is one of the processes that start queued tasks, builds the main
screen with what it needs (``get_default_screen``, as posting does), and turns every failed
worker into one error toast.

The door between panel and engine is narrow and one-way: the start-up worker posts
``EngineReady`` (the engine, the repository, the default base) and everything that needs
the engine starts in its handler (harlequin's DatabaseConnected): the scheduler here, the
polling and the launch form in the main screen. Nothing waits for the engine on a thread,
and nothing asks the app for it later.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from fleet_tui.core.terminal import visible
from fleet_tui.ui import textual_fixes
from fleet_tui.ui.actions import known_ids, unknown_ids
from fleet_tui.ui.formatting import describe_error
from fleet_tui.ui.messages import EngineReady, WorkerFailed
from fleet_tui.ui.screens.main import MainScreen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from fleet_tui.engine.fleet import Fleet

textual_fixes.apply()  # before any frame: see the module

HIDDEN_DELAY = 0.05  # seconds after the first layout until the hidden widgets are mounted

GC_THRESHOLDS = (2000, 20, 20)
"""The collector's thresholds once the panel runs (Python's are 700, 10, 10). A frame makes
thousands of short-lived objects (a strip and its caches a row): a larger youngest
generation lets them die by reference count before a collection promotes them, and the
oldest generation, whose walk took 35-120 ms with a 20,000-line diff open (every such walk
a page down late by as much), runs a quarter as often. Bench 5: page down p99 117 -> 58 ms
on the same machine."""

EngineMaker = Callable[[], "Fleet | EngineReady"]
"""Makes the engine in a thread after the first frame: the engine alone (the app's ``repo``
and ``default_base`` go with it), or an EngineReady that says where the repository is."""


class FleetApp(App[None]):
    """The control panel. Inject ``clock`` and turn the scheduler off for snapshots.

    ``fleet`` is the engine, or a function that makes it (``EngineMaker``): then it is
    made in a thread once the first frame is up (importing the engine and GitPython takes
    longer than Textual's own start). ``keymap`` rebinds keys by binding id
    (``{"task.new": "N"}``; ids in ui/actions.py). ``resume_gc``: the caller paused the
    cyclic garbage collector for the start-up (``gc.disable()``, as the panel command does);
    once the first frame is out, what the start-up made is frozen (never walked again: it
    lives as long as the panel) and the collector resumes. ``served``: the panel is in a
    browser (`fleet-tui serve`): what would open on this machine's terminal is off.
    """

    CSS_PATH = "app.tcss"
    TITLE = "fleet-tui"
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", show=False, priority=True, id="app.ctrl_q"),
    ]

    def __init__(self, fleet: Fleet | EngineMaker, *, repo: Path | None = None,
                 default_base: str = "",
                 clock: Callable[[], float] = time.time, run_scheduler: bool = True,
                 poll_interval: float = 0.5, diff_interval: float = 2.0,
                 stream_interval: float = 0.1, bell: bool = True,
                 scheduler_interval: float = 0.25,
                 keymap: Mapping[str, str] | None = None, resume_gc: bool = False,
                 served: bool = False) -> None:
        super().__init__()
        self.served = served
        self.fleet: Fleet | None = None  # the engine, once EngineReady arrived
        self._fleet_given: Fleet | None = None
        self._make_fleet: EngineMaker | None = None
        if callable(fleet):
            self._make_fleet = fleet
        else:
            self._fleet_given = fleet
        self.repo = repo
        self.default_base = default_base
        self.clock = clock
        self.run_scheduler = run_scheduler
        self.poll_interval = poll_interval
        self.diff_interval = diff_interval
        self.stream_interval = stream_interval
        self.scheduler_interval = scheduler_interval
        self.keymap = dict(keymap or {})
        self._resume_gc = resume_gc
        self._settle_gc = resume_gc
        self.bell_enabled = bell
        self.bells = 0
        self.errors: list[str] = []
        self.toasts: list[tuple[str, str, str]] = []  # (severity, title, message)
        self._stop = threading.Event()
        self.quitting = False
        self._last_error: str | None = None
        self._last_error_at = 0.0
        self._main: MainScreen | None = None
        if self.keymap:
            unknown = unknown_ids(self.keymap, self.BINDINGS)
            if unknown:  # a typo would rebind nothing, silently
                raise ValueError(f"no key binding has the id {', '.join(map(repr, unknown))}"
                                 f"; the ids are {', '.join(known_ids(self.BINDINGS))}")
            self.set_keymap(self.keymap)

    def get_default_screen(self) -> MainScreen:
        """The main screen, built with what it needs (it never imports the app)."""
        self._main = MainScreen(
            repo=self.repo, clock=self.clock, run_scheduler=self.run_scheduler,
            poll_interval=self.poll_interval, diff_interval=self.diff_interval,
            stream_interval=self.stream_interval, keymap=self.keymap, served=self.served)
        return self._main

    @property
    def _background_screens(self) -> list[Screen[Any]]:
        """The screens below the top one that can show through it. Textual always counts
        the one right below (it stops at the first opaque one, after adding it), so the
        main screen's every poll repainted an opaque screen over it, the help whole
        twice a second (10 KB a frame to a browser). A top screen whose background is
        opaque paints every cell: nothing below it shows."""
        stack = self._screen_stack
        if stack and stack[-1].styles.background.a == 1:
            return []
        return super()._background_screens

    @property
    def main(self) -> MainScreen:
        if self._main is None:
            raise LookupError("the main screen is not up")
        return self._main

    def on_ready(self) -> None:
        """The first layout is done (its frame is painted right after this): mount what
        it does not show a moment later, and start making the engine once the frame is
        out, so neither delays it (a thread importing the engine and GitPython while the
        first frame is laid out and painted would take the GIL from it half the time)."""
        main = self.main
        if self._resume_gc:
            self.call_after_refresh(self._gc_resume)
        main.set_timer(HIDDEN_DELAY, main.mount_hidden)
        if self._make_fleet is not None:
            self.call_after_refresh(self._start_engine)

    def _gc_resume(self) -> None:
        """The first frame is out: freeze what the start-up made (a first collection would
        walk all of it at once) and let the collector run again."""
        self._resume_gc = False
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        gc.enable()

    def on_tasks_loaded(self) -> None:
        """The first task list reached the app (it bubbles up once the main screen has
        shown it): settle the collector once that frame is out."""
        if self._settle_gc:
            self._settle_gc = False
            self.call_after_refresh(self._gc_settle)

    def _gc_settle(self) -> None:
        """The panel is up (the engine, its imports, the list and the hidden widgets): one
        full collection, then what survives it is frozen too. Without it every tenth
        collection of the middle generation was a full one (the collector runs a full one
        when what reached the oldest generation since the last full one is over a quarter
        of what the last one left, and before this there was no last one: any is), and
        each walked all that the engine made after the first freeze: 10 to 20 ms with the
        event loop stopped, about once a second, a key press's frame late by as much.
        Once, here, where no key waits for a frame."""
        gc.collect()
        gc.freeze()

    def on_mount(self) -> None:
        if self._fleet_given is not None:
            self.post_message(EngineReady(self._fleet_given, self.repo, self.default_base))

    @work(thread=True, exit_on_error=False, group="engine", name="engine",
          description="starting the engine")
    def _start_engine(self) -> None:
        assert self._make_fleet is not None
        try:
            made = self._make_fleet()
        except Exception as exc:
            problem = describe_error(exc)
            self.errors.append(problem)
            if self._main is not None:
                self._main.closing = True  # nothing more is mounted on the way out
            # after the next refresh: exiting while the main screen still mounts fails
            self.call_from_thread(self.call_after_refresh, partial(
                self.exit, return_code=1, message=f"fleet-tui: {problem}"))
            raise
        if not isinstance(made, EngineReady):
            made = EngineReady(made, self.repo, self.default_base)
        self.post_message(made)

    def on_engine_ready(self, ready: EngineReady) -> None:
        """Everything that needs the engine starts here."""
        self.fleet = ready.fleet
        self.repo = ready.repo
        self.default_base = ready.default_base
        if self.run_scheduler:
            self._scheduler()
        self.main.engine_ready(ready)

    # --- the scheduler -------------------------------------------------------------------
    def _scheduler(self) -> None:
        if self.fleet is None or self._stop.is_set():
            return
        self.run_worker(partial(self.fleet.run, self._stop, self.scheduler_interval),
                        thread=True, exit_on_error=False, group="scheduler",
                        name="scheduler", description="the scheduler")

    def stop_scheduler(self) -> None:
        self._stop.set()

    def on_unmount(self) -> None:
        self._stop.set()

    async def action_quit(self) -> None:
        self.quitting = True  # keys already typed must not open screens on the way out
        if self._main is not None:
            self._main.closing = True
        self._stop.set()
        self.exit()

    # --- one place for worker failures ---------------------------------------------------
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            self._worker_failed(event.worker)

    def on_worker_failed(self, message: WorkerFailed) -> None:
        """A screen's or a pane's worker failed (they post this: StateChanged does not
        bubble)."""
        self._worker_failed(message.worker)

    def _worker_failed(self, worker: Worker[object]) -> None:
        if worker.error is None:
            return
        if worker.group == "engine":
            return  # said on the way out: it ends the panel (see _start_engine)
        message = describe_error(worker.error)
        self.errors.append(message)
        now = time.monotonic()
        if self._last_error == message and now - self._last_error_at < 10:
            return  # a poll failing every half second says it once
        self._last_error, self._last_error_at = message, now
        what = worker.description or worker.name or "background work"
        self.notify(message, title=f"Failed: {what}", severity="error", timeout=10)
        self.bell()
        if worker.group == "scheduler" and not self._stop.is_set():
            # The scheduler must keep going: start it again after a pause.
            self.set_timer(2.0, self._scheduler)

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """A toast; markup is off by default because messages carry agent and git text,
        and escapes in them are shown, not sent to the terminal (`core.terminal.visible`)."""
        message, title = visible(message), visible(title)
        self.toasts.append((severity, title, message))
        del self.toasts[:-200]
        super().notify(message, title=title, severity=severity, timeout=timeout,
                       markup=markup)

    def bell(self) -> None:
        """Ring (counted, for tests; silent with ``bell=False``)."""
        self.bells += 1
        if self.bell_enabled:
            super().bell()

    # --- command palette -----------------------------------------------------------------
    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if isinstance(screen, MainScreen):
            for title, help_text, callback in screen.palette_commands():
                yield SystemCommand(title, help_text, callback)
