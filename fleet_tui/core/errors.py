"""The root of every error fleet-tui shows a user.

Each error carries the message a person can act on and the exit code the CLI ends with, so
the CLI and the panel turn any of them into output the same way instead of listing classes
by hand. Cheap to import (no imports at all): fleet-worker and every runner load it.

Exit codes: the one table below, OUTCOMES (the README's "Exit codes" sentence says the same
words; a test holds the two together and runs every command's refusals against it).
"""

from __future__ import annotations

# What ended a command -> the code it exits with. A refusal that the task's state or the
# user's work calls for (a merged task killed, a discarded one queued, a message to a
# finished worker, a dirty checkout) is "refused"; asking for something that is not there
# (no such task, a task that is not in the merge queue taken out of it) is "not found".
OUTCOMES: dict[str, int] = {
    "ok": 0,
    "a task failed": 1,
    "usage or setup": 2,
    "no such task": 3,
    "refused to keep your work safe": 4,
    "claude or the key is missing": 5,
    "no usable keyring": 6,
}

EXIT_OK = OUTCOMES["ok"]
EXIT_FAILED = OUTCOMES["a task failed"]
EXIT_USAGE = OUTCOMES["usage or setup"]
EXIT_NOT_FOUND = OUTCOMES["no such task"]
EXIT_REFUSED = OUTCOMES["refused to keep your work safe"]
EXIT_MISSING = OUTCOMES["claude or the key is missing"]
EXIT_KEYRING = OUTCOMES["no usable keyring"]


class FleetTuiError(Exception):
    """An error meant for the user: `message` says what went wrong and what to do;
    `exit_code` is what the CLI exits with; `title` heads the panel's notification."""

    exit_code: int = EXIT_FAILED
    title: str = "Error"
    # a failure of the moment that the same step may not meet again (a host's dropped
    # connection): a caller that can wait tries the step again, bounded
    transient: bool = False

    def __init__(self, message: str, *, exit_code: int | None = None,
                 title: str | None = None, transient: bool = False) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
        if title is not None:
            self.title = title
        if transient:
            self.transient = True

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:
        return self.message


# --- the engine's errors (fleet.py re-exports them; its parts below the front raise them) ---


class FleetError(FleetTuiError):
    """A user-facing engine error; the message says what to do."""


class TaskNotFound(FleetError):
    """No task has this id (exit 3) or, with `ambiguous`, the prefix matches several (a
    usage error: exit 2)."""

    exit_code = EXIT_NOT_FOUND

    def __init__(self, message: str, *, ambiguous: bool = False) -> None:
        super().__init__(message, exit_code=EXIT_USAGE if ambiguous else None)
        self.ambiguous = ambiguous


class FleetRefused(FleetError):
    """The engine refused an action to keep the user's work safe (dirty checkout, conflict,
    failing tests): exit 4."""

    exit_code = EXIT_REFUSED
    title = "Refused"


class WorkerFinished(FleetError):
    """A message for a worker that has finished its work (or is stopping after its last
    turn): it takes no more messages; a follow-up to the same session is the way. A
    refusal: exit 4."""

    exit_code = EXIT_REFUSED
    title = "Refused"


class NotInQueue(FleetError):
    """A task taken out of the merge queue that is not in it: nothing was at stake, the
    thing asked for is not there (exit 3)."""

    exit_code = EXIT_NOT_FOUND


class InvalidSpec(FleetError):
    """A task cannot be queued as given (empty prompt, a NUL byte, text that is not UTF-8,
    a number out of range, a setup claude would refuse); the message says what to change.
    Nothing was stored. A usage error: exit 2."""

    exit_code = EXIT_USAGE
