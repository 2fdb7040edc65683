"""The engine and the CLI never load Textual: checked at run time, in a fresh interpreter.

The import-linter contracts (pyproject.toml, `lint-imports` in scripts/test) read the static
import graph, so they cannot tell an import at the top of a module from one deferred into
the function that needs it (the panel command imports the panel inside main(), after its
arguments are read). These tests import the real thing in a subprocess and look at
`sys.modules`, which is the only way to see that a deferral defers (harlequin keeps the
same guard for its headless core).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

FORBIDDEN = ("textual", "rich")
"""Nothing headless renders: the engine, the runner and the CLI commands need neither."""

HEADLESS = [
    "import fleet_tui.engine.fleet",
    "import fleet_tui.commands.tasks",
    "import fleet_tui.execution.worker.runner",
    "import fleet_tui.cli",
    "import fleet_tui.commands.panel",  # the panel is imported inside its main()
    "import fleet_tui.core.policy, fleet_tui.core.states, fleet_tui.core.errors,"
    " fleet_tui.execution.worker.attemptlog",
]


def loaded_after(statement: str) -> list[str]:
    """The forbidden top-level packages in sys.modules after ``statement`` runs in a
    fresh interpreter."""
    probe = (f"{statement}\n"
             "import sys\n"
             f"print('loaded:' + ','.join(m for m in {FORBIDDEN!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1]  # after whatever the statement printed
    assert last.startswith("loaded:"), out.stdout
    return [m for m in last.removeprefix("loaded:").split(",") if m]


@pytest.mark.parametrize("statement", HEADLESS)
def test_headless_imports_do_not_load_the_panel(statement: str) -> None:
    assert loaded_after(statement) == [], f"{statement!r} loaded Textual or Rich"


def test_the_cli_help_of_the_panel_does_not_load_it() -> None:
    """`fleet-tui --help` reads its arguments before anything of the panel is imported."""
    statement = ("from fleet_tui.commands import panel\n"
                 "try:\n"
                 "    panel.main(['--help'])\n"
                 "except SystemExit:\n"
                 "    pass")
    assert loaded_after(statement) == []


def test_the_probe_sees_the_panel_when_it_is_loaded() -> None:
    """The check above can fail: importing the panel does load Textual."""
    assert "textual" in loaded_after("import fleet_tui.ui.app")


def test_the_panels_usual_start_parses_nothing() -> None:
    """`fleet-tui` alone reads no arguments with argparse: it and the gettext it imports
    cost the first frame ~5 ms (the start-up budget is 1.5 times a bare Textual app)."""
    probe = ("from fleet_tui.commands import panel\n"
             "options = panel._parse([])\n"
             "import sys\n"
             "print('loaded:' + ','.join(m for m in ('argparse', 'gettext') "
             "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "loaded:"
    with_args = probe.replace("_parse([])", "_parse(['--no-scheduler'])")
    out = subprocess.run([sys.executable, "-c", with_args], capture_output=True, text=True,
                         timeout=60, check=True)
    assert "argparse" in out.stdout  # the check can fail: arguments are parsed by argparse



FIRST_FRAME_SPARED = ("fleet_tui.core.policy", "fleet_tui.core.providers",
                      "fleet_tui.execution.worker.attemptlog", "json",
                      "fleet_tui.ui.screens.help")
"""What the panel's first frame does without: the policy and the provider tables (the key
bar and the status line need them only once there are tasks), the attempt log (the stream
reads one only for a selected task); the engine, made after the frame, loads them all. The
help screen is imported when `?` opens it."""

FIRST_FRAME = """\
import asyncio, sys, threading, time
from fleet_tui.ui.app import FleetApp
from fleet_tui.ui.screens.main import MainScreen

release = threading.Event()

def engine():  # stands in for the engine maker: imports nothing, waits, gives up
    release.wait(30)
    raise RuntimeError("no engine in this probe")

async def main():
    app = FleetApp(engine, run_scheduler=False)
    async with app.run_test(size=(160, 50)) as pilot:
        # the first frame, then the hidden parts mounted: waited for, with a deadline (a
        # fixed pause failed under load)
        deadline = time.monotonic() + 30
        while not (isinstance(app.screen, MainScreen) and app.screen._hidden_done.is_set()):
            assert time.monotonic() < deadline, "the hidden parts never mounted"
            await pilot.pause(0.05)
        print("loaded:" + ",".join(m for m in SPARED if m in sys.modules))
        release.set()

asyncio.run(main())
"""


def first_frame_loads(before: str = "") -> str:
    probe = f"{before}\nSPARED = {FIRST_FRAME_SPARED!r}\n" + FIRST_FRAME
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=False)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("loaded:")]
    assert lines, out.stdout + out.stderr
    return lines[-1].removeprefix("loaded:")


def test_the_panels_first_frame_loads_no_engine_module() -> None:
    """The main screen's first frame (task table, key bar, status line; then the hidden
    parts) is drawn without the engine's modules: they cost it milliseconds (the start-up budget's
    start-up budget), and the engine, made in a thread after it, loads them anyway."""
    assert first_frame_loads() == ""
    # the probe sees them when they are loaded
    probe = "import fleet_tui.engine.fleet, fleet_tui.ui.screens.help"
    assert first_frame_loads(probe) == ",".join(FIRST_FRAME_SPARED)


COMMAND_SPARED = ("msgspec", "hashlib", "secrets", "socket", "concurrent.futures")
"""What a task command's start does without: msgspec comes with the first stream line
decoded (core/wire.py), the others with the one function that needs each (a token, a
digest, a pool of threads). Together ~12 % of the import of a task command."""


def test_a_task_commands_start_loads_none_of_what_it_may_not_need() -> None:
    """The engine and the task commands imported (what each `fleet-tui ls|show|merge...`
    process loads before its pass) load none of COMMAND_SPARED; and the probe sees them
    once something needs them (a stream line decoded, a token made)."""
    look = (f"import sys\nprint('loaded:' + ','.join(m for m in {COMMAND_SPARED!r} "
            "if m in sys.modules))\n")
    start = "import fleet_tui.engine.fleet, fleet_tui.commands.tasks\n"
    used = (start + "from fleet_tui.core import stream, model\n"
            "stream.decode_all(b'{\"type\": \"result\", \"subtype\": \"success\"}\\n')\n"
            "model.new_task_id()\nimport socket, concurrent.futures\n")
    seen = []
    for statement in (start, used):
        out = subprocess.run([sys.executable, "-c", statement + look], capture_output=True,
                             text=True, timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        seen.append(out.stdout.strip().removeprefix("loaded:"))
    assert seen == ["", ",".join(COMMAND_SPARED)]
