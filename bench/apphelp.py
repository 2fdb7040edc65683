"""Probing a running Textual app from a benchmark: frames, keys, waiting.

Headless (`App.run_test`), Textual still lays out and composites every frame; only the
write to the terminal is skipped. `FrameProbe` wraps the app's `_display` so each frame
also renders its terminal bytes (the work a real terminal would cost) and is recorded with
a timestamp and whatever the benchmark wants to observe at that moment. Keys go in the way
a terminal driver sends them (`driver.send_message`), not through `Pilot.press`, whose
idle-waiting would be timed along with the app.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from textual import events
from textual.app import App, ComposeResult
from textual.widget import Widget


@dataclass
class Frame:
    at: float  # time.perf_counter()
    seen: Any


@dataclass
class FrameProbe:
    """Records every frame the app paints, with `observe()` evaluated at that frame."""

    app: App[Any]
    observe: Callable[[], Any] = lambda: None
    frames: list[Frame] = field(default_factory=list)
    bytes_out: int = 0

    def install(self) -> FrameProbe:
        original = self.app._display

        def display(screen: Any, renderable: Any) -> None:
            if renderable is not None:
                render = getattr(renderable, "render_segments", None)
                if render is not None:
                    self.bytes_out += len(render(self.app.console))
                self.frames.append(Frame(time.perf_counter(), self.observe()))
            original(screen, renderable)

        self.app._display = display  # type: ignore[method-assign]
        return self

    def first_after(self, t0: float, test: Callable[[Any], bool]) -> Frame | None:
        for frame in reversed(self.frames):
            if frame.at < t0:
                break
        for frame in self.frames:
            if frame.at >= t0 and test(frame.seen):
                return frame
        return None

    async def wait_frame(self, t0: float, test: Callable[[Any], bool],
                         timeout: float = 10.0) -> Frame:
        """The first frame painted at or after t0 whose observation passes `test`."""
        deadline = time.perf_counter() + timeout
        start = len(self.frames)
        while True:
            # frames are appended in time order; scan only what is new since last time
            for index in range(max(0, start - 1), len(self.frames)):
                frame = self.frames[index]
                if frame.at >= t0 and test(frame.seen):
                    return frame
            start = len(self.frames)
            if time.perf_counter() > deadline:
                raise TimeoutError(f"no matching frame within {timeout} s")
            await asyncio.sleep(0.001)


def send_key(app: App[Any], key: str) -> float:
    """Post a key as the terminal driver would; returns the send time (perf_counter)."""
    driver = app._driver
    assert driver is not None, "the app is not running"
    event = events.Key(key, None)
    event.set_sender(app)
    at = time.perf_counter()
    driver.send_message(event)
    return at


async def wait_until(test: Callable[[], bool], timeout: float = 30.0,
                     poll: float = 0.005) -> float:
    """Poll `test` from the app's loop until it is true; returns when (perf_counter)."""
    deadline = time.perf_counter() + timeout
    while not test():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        await asyncio.sleep(poll)
    return time.perf_counter()


class WidgetApp(App[None]):
    """A bare app that shows one widget, to time that widget on its own."""

    def __init__(self, widget: Widget) -> None:
        super().__init__()
        self.widget = widget

    def compose(self) -> ComposeResult:
        yield self.widget


async def bare_log(lines: list[str], steps: int, size: tuple[int, int] = (160, 50)
                   ) -> tuple[float, list[float]]:
    """A bare render of the same rows, the baseline of a view's paint and scrolling: a bare
    app with Textual's own `Log` widget. (seconds from `write_lines` of every line to the
    first frame that holds them all, [seconds from each `pagedown` to the frame that shows
    the new position])."""
    from textual.widgets import Log

    log = Log(auto_scroll=False)
    app = WidgetApp(log)
    steps_s: list[float] = []
    async with app.run_test(size=size) as pilot:
        probe = FrameProbe(app, lambda: (log.line_count, log.scroll_y)).install()
        await pilot.pause()
        t0 = time.perf_counter()
        log.write_lines(lines)
        frame = await probe.wait_frame(t0, lambda seen: seen[0] >= len(lines))
        paint = frame.at - t0
        log.focus()
        await pilot.pause()
        for _ in range(steps):
            before = log.scroll_y
            if log.is_vertical_scroll_end:
                log.scroll_to(y=0, animate=False, immediate=True)
                await pilot.pause()
                before = log.scroll_y
            t1 = send_key(app, "pagedown")
            frame = await probe.wait_frame(t1, lambda seen, b=before: seen[1] != b)
            steps_s.append(frame.at - t1)
    return paint, steps_s


def bare_log_in_thread(lines: list[str], steps: int) -> tuple[float, list[float]]:
    """`bare_log` on an event loop of its own (call it with asyncio.to_thread from inside
    another app, which then waits idle)."""
    import contextvars

    return contextvars.Context().run(asyncio.run, bare_log(lines, steps))
