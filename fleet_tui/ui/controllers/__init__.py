"""The main screen's controllers: one per part of it, the way lazygit has one per view.

``TaskListController`` (task_list.py) owns the list: the tasks as last read, the marks, the
filter, the sort, the selection and the polling. ``TaskActionsController`` (task_actions.py)
owns the task actions that go to the engine and their dialogs: launch, merge, discard, kill,
retry, follow-up, say, update, compare, pick, push, the shell, the queue view.
``DetailController`` (detail.py) owns what is below the list: the detail title, the tabs,
the stream and diff panes' keys, the editor. ``ReviewController`` (review.py) owns the
review comments.

Each is a plain class the screen makes, holding the screen as ``PanelScreen`` (below): what
the controllers share of it, so they never import the screen above them. Each declares the
keys it answers (``bindings``: a panel action's id to its handler, as lazygit's controllers
list their key bindings); the action's record (ui/actions.py: keys, words, guard) makes the
binding, the help and the palette entry. Textual sees one screen, whose one action
(``MainScreen.action_act``) runs the handler a record's id names: the screen holds no
method per key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial, wraps
from inspect import iscoroutinefunction
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from textual.screen import Screen
from textual.widgets import Input
from textual.worker import Worker

from fleet_tui.ui.messages import ForController

if TYPE_CHECKING:
    from fleet_tui.engine.fleet import Fleet
    from fleet_tui.ui.controllers.detail import DetailController
    from fleet_tui.ui.controllers.task_actions import TaskActionsController
    from fleet_tui.ui.controllers.task_list import TaskListController
    from fleet_tui.ui.widgets.diff_pane import DiffPane
    from fleet_tui.ui.widgets.stream_pane import StreamPane
    from fleet_tui.ui.widgets.task_table import TaskTable


class PanelScreen(Screen[None]):
    """The main screen as its controllers see it (``MainScreen`` is the one subclass and
    sets all of these in its ``__init__``)."""

    fleet: Fleet | None
    repo: Path | None  # where new tasks start (None: opened outside a repository)
    default_base: str
    clock: Callable[[], float]
    run_scheduler: bool
    served: bool  # in a browser (`fleet-tui serve`): nothing opens on this machine's terminal
    closing: bool  # the app is quitting: keys typed on the way out do nothing
    ready: asyncio.Event  # the engine is here
    table: TaskTable
    stream: StreamPane
    diff: DiffPane
    filter_box: Input | None  # once mounted (MainScreen.mount_hidden)
    task_list: TaskListController
    task_actions: TaskActionsController
    detail: DetailController

    def now(self) -> float:
        return self.clock()

    def engine(self) -> Fleet:
        """The engine, for a worker started by a key (keys that need it apply only once
        the list was read, which needs it)."""
        if self.fleet is None:
            raise RuntimeError("the engine is not ready yet")
        return self.fleet

    def explain(self, reason: str) -> None:
        """Say why an action cannot be done now."""
        self.notify(reason, title="Not now", severity="warning")

    def refresh_keys(self) -> None:
        """Refresh the key bar if what applies changed."""
        raise NotImplementedError


Handlers = dict[str, Callable[[], object]]
"""A panel action's id ("task.merge") to what runs it (a coroutine's is awaited)."""
Receivers = dict[type[ForController], Callable[[Any], object]]
"""A message for a controller (ui/messages.py) to the method that takes it."""


class Controller:
    """One part of the main screen: holds the screen, for its state and Textual's API."""

    def __init__(self, screen: PanelScreen) -> None:
        self.screen = screen

    def bindings(self) -> Handlers:
        """The panel actions this part answers, by the id of their record (ui/actions.py)."""
        return {}

    def receives(self) -> Receivers:
        """The messages this part takes (posted by its workers and the panes)."""
        return {}


C = TypeVar("C", bound=Controller)
P = ParamSpec("P")


def screen_work(*, group: str, description: str, thread: bool = False,
                exclusive: bool = False
                ) -> Callable[[Callable[Concatenate[C, P], Any]],
                              Callable[Concatenate[C, P], Worker[Any]]]:
    """Textual's ``@work`` for a controller's method: the worker is the screen's (its
    group, its ``exclusive`` cancelling, its failures reported by the screen), as when the
    method was the screen's own. ``exit_on_error`` is off: a failure is one toast."""

    def decorator(method: Callable[Concatenate[C, P], Any]
                  ) -> Callable[Concatenate[C, P], Worker[Any]]:
        if not thread and not iscoroutinefunction(method):
            raise TypeError(f"{method.__name__}: a worker that is not a coroutine needs "
                            "thread=True")

        @wraps(method)
        def run(self: C, /, *args: P.args, **kwargs: P.kwargs) -> Worker[Any]:
            return self.screen.run_worker(
                partial(method, self, *args, **kwargs), name=method.__name__, group=group,
                description=description, exclusive=exclusive, exit_on_error=False,
                thread=thread)

        return run

    return decorator
