"""The suite's own rules, checked on small suites run by pytest's pytester: the real_claude
mark follows the claude_bin fixture (tests/support/claude_marks.py); the tests marked
`long` are handed out early, spread (tests/support/suite_order.py); where the workers run caged
(tests/conftest.py); that a pytest process ends with its heap frozen (tests/conftest.py); that
a crashed worker fails scripts/test's parallel pass instead of hanging it; and that a worker
gone down is named with the test it was in, and the run leaves no folder of it behind
(tests/support/xdist_watch.py)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = """
import pytest
from claude_marks import pytest_collection_modifyitems, pytest_runtest_setup

@pytest.fixture
def claude_bin():
    return "/stand-in/claude"  # the inner suite only needs the fixture's name

@pytest.fixture
def rig(claude_bin):
    return claude_bin
"""


# the inner runs share this process: leave out the plugins that keep session-wide state
INNER = ("-p", "no:cacheprovider", "-p", "no:textual-snapshot", "-p", "no:syrupy",
         "-p", "no:asyncio")


def _suite(pytester: pytest.Pytester, tests: str) -> None:
    pytester.makeini("[pytest]\nmarkers =\n    real_claude: runs the real claude\n")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner=tests)


def test_asking_for_claude_marks_the_test(pytester: pytest.Pytester) -> None:
    _suite(pytester, """
import pytest

def test_direct(claude_bin):
    pass

def test_through_a_fixture(rig):
    pass

@pytest.mark.real_claude
def test_marked_and_asking(claude_bin):
    pass

def test_plain():
    pass
""")
    claude = pytester.runpytest("-m", "real_claude", "-v", *INNER)
    claude.assert_outcomes(passed=3, deselected=1)
    claude.stdout.fnmatch_lines(["*test_direct PASSED*", "*test_through_a_fixture PASSED*",
                                 "*test_marked_and_asking PASSED*"])
    rest = pytester.runpytest("-m", "not real_claude", "-v", *INNER)
    rest.assert_outcomes(passed=1, deselected=3)
    rest.stdout.fnmatch_lines(["*test_plain PASSED*"])


def test_a_mark_without_claude_fails_the_test(pytester: pytest.Pytester) -> None:
    _suite(pytester, """
import pytest

pytestmark = pytest.mark.real_claude

def test_needs_it(claude_bin):
    pass

def test_parses_a_file():
    pass

class TestGroup:
    def test_in_a_class(self):
        pass
""")
    result = pytester.runpytest(*INNER)
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines([
        "*test_inner.py::test_parses_a_file is marked real_claude but never asks for the "
        "claude_bin fixture*",
        "*test_inner.py::TestGroup::test_in_a_class is marked real_claude*"])


def test_workers_run_uncaged_outside_the_caged_folders() -> None:
    """tests/conftest.py: here (tests/project) workers run with the cage off."""
    assert os.environ.get("FLEET_WORKER_CAGE") == "off"


@pytest.mark.caged
def test_the_caged_mark_keeps_the_default_cage() -> None:
    assert "FLEET_WORKER_CAGE" not in os.environ


def test_the_execution_and_journeys_folders_run_caged() -> None:
    from conftest import REPO_ROOT, runs_caged

    class Node:  # what runs_caged reads of a collected test
        def __init__(self, path: Path) -> None:
            self.path = path

        def get_closest_marker(self, name: str) -> None:
            return None

    tests = REPO_ROOT / "tests"
    assert runs_caged(Node(tests / "execution" / "local" / "test_cage.py"))  # type: ignore[arg-type]
    assert runs_caged(Node(tests / "journeys" / "test_ui_flow.py"))  # type: ignore[arg-type]
    assert not runs_caged(Node(tests / "engine" / "test_fleet.py"))  # type: ignore[arg-type]


def test_the_long_tests_go_out_early_and_spread(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmarkers =\n    long: long\n")
    pytester.makeconftest("from suite_order import long_early\n\n"
                          "def pytest_collection_modifyitems(items):\n"
                          "    long_early(items, spacing=3)\n")
    pytester.makepyfile(test_a="""
import pytest

@pytest.mark.parametrize("n", range(6))
def test_short(n): pass

@pytest.mark.long
def test_two(): pass

@pytest.mark.long
@pytest.mark.parametrize("n", [1, 2])
def test_four(n): pass
""")
    result = pytester.runpytest(*INNER, "--co", "-q")
    order = [line.split("::")[1] for line in result.outlines if "::" in line]
    assert order == ["test_two", "test_short[0]", "test_short[1]",
                     "test_four[1]", "test_short[2]", "test_short[3]",
                     "test_four[2]", "test_short[4]", "test_short[5]"], result.outlines


def test_a_worker_ends_with_its_heap_frozen_so_pytests_last_collections_skip_it() -> None:
    """pytest collects five times after the last unconfigure hook (its unraisable-exception
    check); tests/conftest.py's hook collects once and freezes what survives, so those five
    look at almost nothing instead of everything the worker holds."""
    import gc

    from conftest import pytest_unconfigure

    garbage: list[object] = []
    garbage.append(garbage)  # a cycle only a full collection frees
    del garbage
    held = len(gc.get_objects())
    try:
        pytest_unconfigure(None)  # type: ignore[arg-type]
        assert gc.get_freeze_count() >= held // 2, (gc.get_freeze_count(), held)
        assert len(gc.get_objects()) < held // 100, (len(gc.get_objects()), held)
    finally:
        gc.unfreeze()


CRASHING = {
    "test_a.py": "import os\n\ndef test_1(): pass\n\ndef test_crash(): os._exit(3)\n\n"
                 "def test_2(): pass\n",
    "test_b.py": "import time\n\ndef test_b1(): time.sleep(1)\n\ndef test_b2(): time.sleep(1)\n",
}


def test_a_crashed_worker_fails_the_run_instead_of_hanging_it(tmp_path: Path) -> None:
    """With the xdist options scripts/test gives its parallel pass, a test that ends its
    worker's process is reported as that worker's crash and the run ends, failed. Without
    --max-worker-restart 0, pytest-xdist 3.8 replaced the worker under loadgroup, ran the
    crash again and waited for ever (here and in a run of the suite)."""
    script = (Path(__file__).resolve().parents[2] / "scripts" / "test").read_text()
    found = re.search(r"^XDIST_OPTS=\((.*)\)$", script, re.M)
    assert found, "scripts/test names its xdist options in XDIST_OPTS=(...)"
    for name, text in CRASHING.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the rootdir: not this repository's
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         *shlex.split(found.group(1))], cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, _ = run.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)  # its group: the controller and its workers
        out, _ = run.communicate()
        pytest.fail(f"the run hung after the crash: {out[-1500:]}")
    assert run.returncode == 1, out[-3000:]
    assert "crashed while running 'test_a.py::test_crash'" in out, out[-3000:]


DYING = {
    "test_d.py": "import os\n\n\ndef test_ends_its_worker():\n    os._exit(3)\n",
}


def test_a_dead_worker_is_named_with_its_test_and_the_run_leaves_no_folder(
        tmp_path: Path) -> None:
    """xdist_watch keeps each worker's last phase in a folder of the run's; the controller
    prints a dead worker's record from it, and removes the folder when the run ends (each
    run of the suite had left one in /tmp: 106 of them here)."""
    for name, text in DYING.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the rootdir: not this repository's
    temp = tmp_path / "tmp"
    temp.mkdir()
    support = Path(__file__).resolve().parents[1] / "support"
    env = dict(os.environ, TMPDIR=str(temp),
               PYTHONPATH=os.pathsep.join([str(support), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "xdist_watch",
         "-n", "1", "--max-worker-restart", "0", "--basetemp", str(tmp_path / "base")],
        cwd=tmp_path, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
        timeout=90)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out[-3000:]
    assert re.search(r"\[gw0\] went down .*exit status 3; its last record:", out), out[-3000:]
    assert "call test_d.py::test_ends_its_worker" in out, out[-3000:]
    assert list(temp.iterdir()) == []
