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
