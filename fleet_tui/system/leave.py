"""How a fleet-tui process ends: as Python ends it, except where a native library it loaded
may abort the interpreter's teardown.

Ray's C++ core (`ray._raylet`, loaded with Ray's Jobs client by any process that follows a
task on a Ray host) sometimes aborts a process in the teardown that follows its last line of
Python: SIGABRT, exit -6, "Fatal Python error: Aborted" with no Python frame, after the
command had printed all it had to print. Seen in tests/execution/ray/test_ray_host.py's race
test, in one of the ~60 `fleet-tui ls` it starts: once in a whole run of the suite, and in 2
of 17 runs of the test alone (the output of one of those was not kept); a user would see
that message and a failed exit status from a command that worked.
Such a process ends here instead: Python's own end (its threads' exit hooks, the
non-daemon threads joined, the atexit functions, the output flushed), then os._exit, which
skips only the native teardown.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn

# modules whose native teardown may abort the process
NATIVE_TEARDOWN = ("ray._raylet",)


def leave(code: int) -> NoReturn:
    """End this process with exit status `code` (see the module's docstring)."""
    if not any(name in sys.modules for name in NATIVE_TEARDOWN):
        raise SystemExit(code)
    # what the interpreter's own end does first: the threads' exit hooks (an executor's
    # workers told to stop), then every non-daemon thread joined
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()  # logging's handlers flushed and closed among them
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
