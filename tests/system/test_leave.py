"""fleet_tui.system.leave: a process that loaded Ray's C++ core ends without the native
teardown that sometimes aborted `fleet-tui ls` (exit -6 after its whole output), and
everything Python's own end does still happens: the threads' exit hooks, the non-daemon
threads joined, the atexit functions, the output flushed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, _missing
from ray_cluster import ray_missing

from fleet_tui.system.leave import NATIVE_TEARDOWN, leave

# a process with a thread still working, an atexit function, an executor, output not yet
# flushed and an object that speaks only in the interpreter's teardown; it ends with leave(5)
SCRIPT = """
import atexit, concurrent.futures, sys, threading, time, types

if sys.argv[1] == "native":  # the name Ray's core has: leave sees it loaded
    sys.modules["NAME"] = types.ModuleType("NAME")

class Teardown:
    def __del__(self):
        sys.stdout.write("teardown\\n")

kept = Teardown()  # a module global: freed in the teardown, not before
atexit.register(lambda: sys.stdout.write("atexit\\n"))
threading.Thread(target=lambda: (time.sleep(0.3), sys.stdout.write("thread\\n"))).start()
pool = concurrent.futures.ThreadPoolExecutor(1)
pool.submit(lambda: (time.sleep(0.3), sys.stdout.write("executor\\n")))
sys.stdout.write("out")  # no newline: still in the buffer when leave is called

from fleet_tui.system.leave import leave
leave(5)
"""


def _run(mode: str) -> subprocess.CompletedProcess[str]:
    script = SCRIPT.replace("NAME", NATIVE_TEARDOWN[0])
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-c", script, mode], capture_output=True,
                          text=True, env=env, timeout=60, check=False)


def test_with_the_native_core_loaded_python_ends_as_usual_but_the_teardown_is_skipped() -> None:
    done = _run("native")
    assert done.returncode == 5, done.stderr
    lines = done.stdout.split("\n")
    assert lines[0].startswith("out"), done.stdout
    assert {"thread", "executor", "atexit"} <= {line.removeprefix("out") for line in lines}, \
        done.stdout
    assert "teardown" not in done.stdout  # os._exit: the native teardown never ran


def test_without_it_the_process_ends_as_python_ends_it() -> None:
    done = _run("plain")
    assert done.returncode == 5, done.stderr
    assert "teardown" in done.stdout and "atexit" in done.stdout, done.stdout


def test_in_process_leave_is_systemexit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without such a module, SystemExit. The names are swapped for one nobody loads: this
    process is a pytest worker, which may hold ray._raylet from an earlier test (a Ray
    host followed in-process), and leave would then end the worker itself (os._exit)."""
    import fleet_tui.system.leave as module

    monkeypatch.setattr(module, "NATIVE_TEARDOWN", ("fleet_tui_test_loads_no_such_module",))
    with pytest.raises(SystemExit) as raised:
        leave(3)
    assert raised.value.code == 3


def test_rays_jobs_client_loads_the_module_leave_looks_for() -> None:
    """What fleet-tui imports of Ray for a Ray host loads the module NATIVE_TEARDOWN names
    (a Ray that renamed it would make leave a plain exit again)."""
    why = ray_missing()
    if why is not None:
        _missing(why)  # skip locally, fail under CI
    probe = ("import sys; import ray.job_submission; "
             f"print(all(n in sys.modules for n in {NATIVE_TEARDOWN!r}))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.stdout.strip() == "True", done.stderr[-2000:]
