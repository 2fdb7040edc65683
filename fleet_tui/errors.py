"""The root of every error fleet-tui shows a user.

Each error carries the message a person can act on and the exit code the CLI ends with, so
the CLI and the panel turn any of them into output the same way instead of listing classes
by hand. Cheap to import (no imports at all): fleet-worker and every runner load it.

Exit codes (README): 0 ok, 1 a task failed, 2 usage or setup, 3 no such task, 4 refused to
keep your work safe, 5 claude or the key is missing, 6 no usable keyring.
"""

from __future__ import annotations

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_REFUSED = 4
EXIT_MISSING = 5
EXIT_KEYRING = 6


class FleetTuiError(Exception):
    """An error meant for the user: `message` says what went wrong and what to do;
    `exit_code` is what the CLI exits with; `title` heads the panel's notification."""

    exit_code: int = EXIT_FAILED
    title: str = "Error"

    def __init__(self, message: str, *, exit_code: int | None = None,
                 title: str | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
        if title is not None:
            self.title = title

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
    turn): it takes no more messages; a follow-up to the same session is the way."""


class InvalidSpec(FleetError):
    """A task cannot be queued as given (empty prompt, a NUL byte, text that is not UTF-8,
    a number out of range, a setup claude would refuse); the message says what to change.
    Nothing was stored. A usage error: exit 2."""

    exit_code = EXIT_USAGE
