"""A process that takes a repository lock over and over (release, take again at once), as
an engine merging one task after another does; used by tests/vcs/test_repolock_fairness.py.

argv: lock file, log file, stop file, seconds to hold, most rounds. Each round appends
"A <monotonic time>" to the log while it holds the lock. Stops when the stop file exists or
after the most rounds."""

from __future__ import annotations

import os
import sys
import time

from fleet_tui.vcs import repolock


def main() -> None:
    lock, log, stop, hold, rounds = sys.argv[1:6]
    with open(log, "a", encoding="utf-8") as out:
        for _ in range(int(rounds)):
            if os.path.exists(stop):
                break
            with repolock.hold(lock, "looping", timeout=120):
                out.write(f"A {time.monotonic()}\n")
                out.flush()
                time.sleep(float(hold))


if __name__ == "__main__":
    main()
