"""Messages that workers post to the panel (dataclasses, so a flood can coalesce).

Data flows down through method calls and reactives; what happens in a worker, and what a
screen asks of the app, comes back up as one of these. A `ForController` goes to the main
screen's controller that takes it (its `receives`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from textual.message import Message

TYPE_CHECKING = False
if TYPE_CHECKING:  # the engine is imported once the first frame is up, not for it
    from textual.message_pump import MessagePump
    from textual.worker import Worker

    from fleet_tui.core.model import Attempt, Task
    from fleet_tui.engine.fleet import Fleet, FleetStatus, SettingsNotice
    from fleet_tui.store.evidence import BestPick
    from fleet_tui.store.reviews import ReviewComment
    from fleet_tui.ui.formatting import PreparedDiff, StreamRow, ToolCallDetail


@dataclass
class EngineReady(Message):
    """The engine is made (in a thread, after the first frame): everything that needs it
    starts when this arrives: polling, the scheduler, the launch form. ``repo`` is where new
    tasks start (None: the panel was not opened in a repository), ``default_base`` its
    current branch, the launch form's default base."""

    fleet: Fleet
    repo: Path | None = None
    default_base: str = ""


@dataclass
class WorkerFailed(Message):
    """A worker of a screen or a pane raised: the app turns it into one error toast.
    (Worker.StateChanged does not bubble; this does.)"""

    worker: Worker[object]


@dataclass
class TasksLoaded(Message):
    """A fresh read of the task list and the fleet's status."""

    tasks: list[Task]
    status: FleetStatus
    at: float

    def can_replace(self, message: Message) -> bool:  # only the newest list matters
        return isinstance(message, TasksLoaded)


class ForController(Message):
    """A result for one of the main screen's controllers: the screen hands it to the one
    that declared it takes it (`Controller.receives`)."""


@dataclass
class PollFailed(ForController):
    """Reading the task list failed; ``problem`` is one sentence naming the cause."""

    problem: str

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, PollFailed)


@dataclass
class SettingsChecked(ForController):
    """The poll found settings files changed: what was reloaded, or an edit not used."""

    notices: list[SettingsNotice]


@dataclass
class BestPicked(ForController):
    """The poll found groups of copies decided since the panel opened (auto_pick's winner,
    or none passed): one toast each, naming the winner and why."""

    picks: list[BestPick]


@dataclass
class StreamBatch(Message):
    """Rows of the selected attempt, in order; ``generation`` drops stale batches."""

    generation: int
    rows: list[StreamRow]
    attempt: Attempt | None = None
    attempts: int = 0
    older: int | None = None  # with ``attempt``: bytes before the tail, read on demand


@dataclass
class StreamOlder(Message):
    """Rows from before what the stream view holds; ``older`` bytes are still unread."""

    generation: int
    rows: list[StreamRow]
    older: int
    everything: bool = False


@dataclass
class ToolCallLoaded(ForController):
    """A tool call and its result, whole, read and laid out for the detail view (the
    stream pane posts it, the screen shows it); ``task_id`` and ``ref`` say which."""

    task_id: str
    ref: str
    detail: ToolCallDetail


@dataclass
class DiffLoaded(Message):
    task_id: str
    prepared: PreparedDiff | None
    problem: str | None = None
    viewed: dict[str, str] | None = None  # the store's viewed marks (None: not read)


@dataclass
class TasksSubmitted(ForController):
    tasks: list[Task]


@dataclass
class ActionDone(ForController):
    """An engine call finished; ``title`` and ``text`` become a toast or a message box."""

    text: str
    title: str = ""
    severity: str = "information"
    details: str | None = None
    task_ids: list[str] = field(default_factory=list)




def report_failure(node: MessagePump, event: Worker.StateChanged) -> None:
    """Hand a failed worker of ``node`` to the app's one failure handler (call it from the
    node's ``on_worker_state_changed``)."""
    from textual.worker import WorkerState

    if event.state == WorkerState.ERROR and event.worker.error is not None:
        node.post_message(WorkerFailed(event.worker))


@dataclass
class CommentsLoaded(Message):
    """A task's review comments with their states, read with its diff."""

    task_id: str
    comments: list[ReviewComment]
