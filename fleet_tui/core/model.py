"""The domain model: what a task is (TaskSpec asked, Task stored), each run of it (Attempt)
and what the fleet knows of an endpoint's limits (EndpointState).

Plain dataclasses, no I/O: the store persists them (store/rows.py maps each field to a column
of the same name), policy decides on them, the engine, the CLI and the panel read them. The
states they move through are states.py's table (TaskState, LandState, Verdict).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fleet_tui.core.errors import InvalidSpec
from fleet_tui.core.states import TaskState
from fleet_tui.core.titles import task_title

__all__ = ["ID_ALPHABET", "ID_LENGTH", "MAX_COPIES", "Attempt", "EndpointState", "Task",
           "TaskSpec", "check_text", "new_task_id"]

# how many copies of one task a submit may ask for (the engine and the form agree on it)
MAX_COPIES = 50

ID_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
ID_LENGTH = 6


def new_task_id() -> str:
    """A random 6-char id from [0-9a-z] (uniqueness is checked on insert)."""
    import secrets  # here: it loads hmac, hashlib and random, for a submit alone

    return "".join(secrets.choice(ID_ALPHABET) for _ in range(ID_LENGTH))


def check_text(what: str, text: str) -> None:
    """Refuse text claude cannot be given: a NUL byte (no process argument or environment
    can hold one) or text that is not valid UTF-8 (bytes that did not decode arrive as
    surrogate escapes, e.g. from argv). InvalidSpec names the first bad spot."""
    nul = text.find("\0")
    if nul >= 0:
        raise InvalidSpec(f"the {what} contains a NUL byte (at character {nul + 1}), which "
                          "cannot be passed to claude; remove it")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        bad = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else \
            f"character U+{code:04X}"
        raise InvalidSpec(f"the {what} is not valid UTF-8 text ({bad} at character "
                          f"{exc.start + 1}); convert it to UTF-8") from None


@dataclass
class TaskSpec:
    """What the user asks for; the engine turns it into a stored Task."""

    prompt: str
    title: str = ""
    repo: Path | None = None  # None: the repository of the current directory
    base_ref: str | None = None
    model: str = "main"  # "main" | "small" | an explicit model name
    permission_mode: str | None = None
    effort: str | None = None
    max_turns: int | None = None
    timeout: float | None = None
    extra_args: list[str] = field(default_factory=list)
    endpoint: str | None = None  # a named endpoint of config.toml (None: "default")
    host: str | None = None  # a host of config.toml, or "any" (None: "local")


@dataclass
class Task:
    """One stored task: its spec, where it runs, and the summary of its latest attempt."""

    id: str
    prompt: str
    repo: Path
    title: str = ""
    base_ref: str | None = None
    base_branch: str | None = None
    base_commit: str = ""
    branch: str = ""
    worktree: Path | None = None
    endpoint: str = ""  # its endpoint's name in config.toml (v8; before: the base URL)
    model: str = "main"
    permission_mode: str | None = None
    effort: str | None = None
    max_turns: int | None = None
    timeout: float | None = None
    extra_args: list[str] = field(default_factory=list)
    state: TaskState = TaskState.QUEUED
    verdict: str | None = None
    message: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    not_before: float | None = None
    attempt_count: int = 0
    session_id: str | None = None
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    last_tool: str | None = None
    last_event_at: float | None = None
    added_lines: int = 0
    deleted_lines: int = 0
    claimed_by: str | None = None
    claimed_at: float | None = None
    # landing (migration _V3_LANDING)
    group_id: str | None = None  # copies submitted together share it (best of N)
    conflicts: list[str] = field(default_factory=list)  # an update from base stopped here
    pushed: str | None = None  # "remote branch @ commit" of the last push
    land_state: str | None = None  # the merge queue: states.LandState
    land_order: float | None = None  # place in the merge queue (smallest lands first)
    land_fixes: int = 0  # follow-ups the queue sent the worker to fix a conflict or test
    land_note: str | None = None  # why stopped, what it waits for
    land_commit: str | None = None  # the commit the queue tested and is landing
    land_attempt: int = 0  # the attempt number of the queue's fix follow-up
    gate: str | None = None  # the last test gate: "passed" | "failed" (None: never run)
    archived_at: float | None = None  # archived: out of the lists, logs kept (v5)
    # the host its attempts run on: a host of config.toml; "any" until the
    # claim that first starts it places it on the host with a free slot
    host: str = "local"
    # Not a column: why the stored row could not be read as it is (None: it could). Such a
    # task is shown failed with this as its message, and the engine never runs it.
    row_error: str | None = None
    # Not a column: the columns that could not be read (their fields hold defaults).
    row_damaged: tuple[str, ...] = ()

    @property
    def short_title(self) -> str:
        """The title, else the one its prompt gives (titles.task_title: the one rule)."""
        return task_title(self.title, self.prompt)


@dataclass
class Attempt:
    """One run of claude for a task (fresh, resumed, or a follow-up)."""

    id: int
    task_id: str
    n: int
    kind: str = "fresh"  # "fresh" | "resume" | "followup"
    prompt: str = ""
    model: str | None = None
    pid: int | None = None
    pid_start: str | None = None  # /proc/<pid>/stat start time, guards against pid reuse
    runner_pid: int | None = None
    dir: Path | None = None
    events_path: Path | None = None
    stderr_path: Path | None = None
    exit_path: Path | None = None
    config_dir: Path | None = None
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    verdict: str | None = None
    message: str | None = None
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    session_id: str | None = None
    last_tool: str | None = None
    last_event_at: float | None = None
    events_offset: int = 0
    port: int | None = None  # the attempt's FLEET_PORT (v5)
    host: str = "local"  # the host it runs on (v6); attempts before v6 ran here
    placement: str | None = None  # JSON: execution.host.Placement.to_record() (v6)
    row_error: str | None = None  # not a column: see Task.row_error


@dataclass
class EndpointState:
    """What the fleet knows of one endpoint's limits, shared by every fleet-tui process
    (policy decides it; the scheduler obeys it): a usage window it is parked for, an
    account problem it is held for, an effective cap lowered below the configured one."""

    endpoint: str
    parked_until: float | None = None  # no request before this (the window's reset + jitter)
    park_reason: str | None = None  # "5-hour window, code 1308"
    park_message: str | None = None  # the refusal, in the provider's words (its reset)
    next_start: float | None = None  # after a park: the earliest next start (staggered)
    held: str | None = None  # why no task may start until the user acts (None: not held)
    held_task: str | None = None  # the task that met it
    held_settings: str | None = None  # fingerprint of the settings it was met with
    cap: int | None = None  # the effective cap (None: the configured one)
    cap_reason: str | None = None
    cap_changed_at: float | None = None
    event: str | None = None  # the latest event: park, hold, cap (the panel says it once)
    event_at: float | None = None
    updated_at: float = 0.0
    row_error: str | None = None  # not a column: see Task.row_error

