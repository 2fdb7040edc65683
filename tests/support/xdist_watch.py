"""What a pytest-xdist worker was doing when it died (imported by tests/conftest.py).

pytest-xdist names the test a dead worker ran only when that test was still pending in its
scheduler: a worker that dies in the teardown of its last test, or after it (a fixture's
or a leftover thread's doing, or a signal from elsewhere), is reported as just "node down:
Not properly terminated". So each worker writes the test and phase it is in to a file of
its own (one small write per phase), and faulthandler writes every thread's stack there on
SIGTERM, SIGHUP, SIGINT and SIGQUIT (pytest's own faulthandler prints a crash's
stack); when a worker goes down the
controller prints that file and the worker's exit status (-9: SIGKILL, nothing could be
written; a positive code: os._exit or sys.exit). The folder goes when the run ends."""

from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import pytest

_KEY = "fleet_xdist_watch_dir"
_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGINT", "SIGQUIT")
                 if hasattr(signal, name))
_state: dict[str, Any] = {}


def _worker_file(folder: str, worker: str) -> Path:
    return Path(folder) / f"{worker}.txt"


def _note(text: str) -> None:
    fh: IO[str] | None = _state.get("file")
    if fh is None:
        return
    try:
        fh.write(f"{time.strftime('%H:%M:%S')} {text}\n")
        fh.flush()
    except (OSError, ValueError):
        pass


# --- in the controller -------------------------------------------------------------------

@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    folder = _state.get("folder")
    if folder is None:
        folder = _state["folder"] = tempfile.mkdtemp(prefix="fleet-xdist-watch-")
    node.workerinput[_KEY] = folder


def _exit_status(node: Any) -> int | None:
    popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)
    if popen is None:
        return None
    deadline = time.monotonic() + 2.0
    while popen.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return popen.returncode  # type: ignore[no-any-return]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    folder = _state.get("folder")
    if not error or folder is None:
        return
    worker = node.gateway.id
    status = _exit_status(node)
    try:
        lines = _worker_file(folder, worker).read_text(errors="replace").splitlines()
    except OSError:
        lines = ["(no record)"]
    how = {None: "unknown", -9: "SIGKILL"}.get(status, str(status))
    if isinstance(status, int) and status < 0 and status != -9:
        how = f"{status} ({signal.Signals(-status).name})"
    shown: list[str] = []
    frames = 0
    for line in lines:  # the records, and the innermost frames of each thread's stack
        frames = 0 if not line.startswith(" ") else frames + 1
        if frames <= 12:
            shown.append(line)
    text = (f"\n[{worker}] went down ({error}); exit status {how}; its last record:\n"
            + "\n".join(f"  {line}" for line in shown[-80:]) + "\n")
    reporter = node.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(text, red=True)
    else:  # pragma: no cover
        print(text)


def pytest_unconfigure() -> None:
    """The end of the run (in the controller, after its workers went down): the folder
    goes with it. (In a worker nothing: the controller's folder is not in its state.)"""
    folder = _state.pop("folder", None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


# --- in each worker -----------------------------------------------------------------------

def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or _KEY not in workerinput:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw?")
    fh = _worker_file(workerinput[_KEY], worker).open("a")
    _state["file"] = fh
    fh.write(f"worker {worker} pid {os.getpid()} group {os.getpgrp()}\n")
    fh.flush()
    for sig in _SIGNALS:
        faulthandler.register(sig, file=fh, all_threads=True, chain=True)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _note(f"setup {item.nodeid}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    _note(f"call {item.nodeid}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    _note(f"teardown {item.nodeid}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logfinish(nodeid: str) -> None:
    _note(f"done {nodeid}")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish() -> None:
    _note("session finishing")
