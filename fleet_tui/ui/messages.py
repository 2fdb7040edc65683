"""Messages that thread workers post to the panel (dataclasses, so a flood can coalesce)."""

from __future__ import annotations

from dataclasses import dataclass, field

from textual.message import Message

TYPE_CHECKING = False
if TYPE_CHECKING:  # the engine is imported once the first frame is up, not for it
    from fleet_tui.fleet import FleetStatus
    from fleet_tui.store import Attempt, Task
    from fleet_tui.ui.formatting import StreamRow
    from fleet_tui.ui.widgets.diff_view import PreparedDiff


@dataclass
class TasksLoaded(Message):
    """A fresh read of the task list and the fleet's status."""

    tasks: list[Task]
    status: FleetStatus
    at: float

    def can_replace(self, message: Message) -> bool:  # only the newest list matters
        return isinstance(message, TasksLoaded)


@dataclass
class PollFailed(Message):
    """Reading the task list failed; ``problem`` is one sentence naming the cause."""

    problem: str

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, PollFailed)


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
class DiffLoaded(Message):
    task_id: str
    prepared: PreparedDiff | None
    problem: str | None = None


@dataclass
class TasksSubmitted(Message):
    tasks: list[Task]


@dataclass
class ActionDone(Message):
    """An engine call finished; ``title`` and ``text`` become a toast or a message box."""

    text: str
    title: str = ""
    severity: str = "information"
    details: str | None = None
    task_ids: list[str] = field(default_factory=list)


