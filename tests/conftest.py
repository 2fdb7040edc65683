"""Fixtures shared by the whole suite.

Every test runs with a private HOME, FLEET_TUI_HOME and XDG dirs, and with no inherited
Anthropic credentials, so nothing on the developer's machine leaks in or gets touched.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import claude_marks
import folders
import pytest
import suite_order
from claude_marks import pytest_runtest_setup

folders.on_path()

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "support" / "fixtures"

_PORTABLE_RUN = os.environ.get("FLEET_TUI_PORTABLE_PROCS", "") not in ("", "0")
_SCRUB_PREFIXES = ("ANTHROPIC_", "FLEET_WORKER_", "FLEET_TUI_", "CLAUDE_")
_SCRUB_NAMES = ("ZHIPU_API_KEY", "GLM_API_KEY", "IS_SANDBOX", "HTTPS_PROXY", "HTTP_PROXY",
                "https_proxy", "http_proxy", "ALL_PROXY", "all_proxy")


def _find_claude(variable: str = "FLEET_TEST_CLAUDE", folder: str = ".claude-cli") -> str | None:
    explicit = os.environ.get(variable)
    candidates = [explicit] if explicit else []
    candidates.append(str(REPO_ROOT / folder / "node_modules" / ".bin" / "claude"))
    for cand in candidates:
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


_CLAUDE = _find_claude()
_CLAUDE_NEWEST = _find_claude("FLEET_TEST_CLAUDE_NEWEST", ".claude-cli-newest")


# claude is a Bun build: its JavaScriptCore reads BUN_JSC_* options from the environment.
# A test's claude run is short (one to a few turns against the scripted endpoint), and in a
# run that short the optimizing JIT and the collector cost more CPU than they save:
# - without the optimizing JIT and the concurrent collector a run of the pinned claude took
#   0.515 CPU-s against 0.615 (median of 15, alternating), tests/engine 262 CPU-s against 297;
# - without collections at all (useGC=0) as well, 0.465 against 0.556 (median of 12,
#   alternating; the newest pinned claude 0.508 against 0.528), and 0.96 against 1.21 for a
#   run of 20 tool turns and a 200 KB prompt, whose peak RSS grew 292 -> 300 MB (100 turns:
#   293 -> 314 MB): a test's run ends long before its garbage matters.
# Claude's cost is ~40 % of the suite's CPU. What claude does is unchanged; only how its VM
# runs the same code (a worker of the product keeps its VM's defaults: it runs for hours).
# A name JavaScriptCore does not know stops claude at start ("invalid JSC environment
# variable"), so the options are set only once both pinned binaries have started with them
# (`--version`, once per test process).
JSC_TUNING = {"BUN_JSC_useDFGJIT": "0", "BUN_JSC_useConcurrentGC": "0", "BUN_JSC_useGC": "0"}


@functools.cache
def _jsc_tuning() -> dict[str, str]:
    binaries = [b for b in (_CLAUDE, _CLAUDE_NEWEST) if b]
    env = dict(os.environ, **JSC_TUNING)
    try:
        ok = bool(binaries) and all(
            subprocess.run([b, "--version"], env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=60).returncode == 0
            for b in binaries)
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return JSC_TUNING if ok else {}


def _missing(msg: str) -> NoReturn:
    """Skip locally, fail under CI (where scripts/test installed everything)."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(msg)
    pytest.skip(msg)

# The real_claude mark follows the claude_bin fixture (see tests/support/claude_marks.py).
__all__ = ["pytest_collection_modifyitems", "pytest_runtest_setup"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", default=False,
                     help="the long forms of the reliability suite (same as FLEET_SOAK=1; "
                          "see tests/support/soak_report.py and scripts/soak)")


# The cyclic collector's thresholds in each pytest process (not in what the tests start).
# With the defaults (700, 10, 10) a worker's full collections, each over everything the
# tests imported (Textual, the engine, pytest), were ~30 % of its CPU: tests/ui and
# tests/cli spent 31.1 of 102.7 CPU-s in 167 of them. Fewer, larger young collections and
# a full one a tenth as often: 11.4 CPU-s in 62, the run 164.8 -> 149.9 s.
GC_THRESHOLDS = (50_000, 20, 100)


def pytest_configure(config: pytest.Config) -> None:
    import gc

    gc.set_threshold(*GC_THRESHOLDS)
    # before the test modules are imported: their sizes are read from the environment
    if config.getoption("--soak"):
        os.environ["FLEET_SOAK"] = "1"
    if not hasattr(config, "workerinput"):  # once, in the process that starts the workers
        _compile_what_subprocesses_import()
        import rewrite_cache

        rewrite_cache.fill(config, REPO_ROOT / "tests")
    # a pytest-xdist worker that dies is named with the test and phase it was in
    import xdist_watch

    config.pluginmanager.register(xdist_watch, "fleet-xdist-watch")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """What the stopped test sshds' sessions left running ends with this pytest process
    (tests/support/sshd.py: a session outlives its server, and the engine's ssh master
    with it, 600 s)."""
    import sshd

    sshd.end_sessions()


def pytest_unconfigure(config: pytest.Config) -> None:
    """One full collection, then what survives it frozen (gc.freeze): pytest's own cleanup,
    which runs after this hook, collects five times more to find exceptions raised in
    finalizers, each time over everything a worker still holds at its end (~0.5 M objects
    after 130 tests: 0.35 s a collection here). The first collection finds that garbage;
    the five then look at nothing, ~1.5-3 s of CPU less for each worker, at the pass's end."""
    import gc

    gc.collect()
    gc.freeze()


def _compile_what_subprocesses_import() -> None:
    """The bytecode of the checkout's own modules, as an installed fleet-tui has it (pip
    compiles a package when it installs it). An editable checkout has none until Python
    writes it on an import, which it never does where PYTHONDONTWRITEBYTECODE is set (a
    development shell; the machines this suite was timed on): then each of the suite's
    many subprocesses (every `fleet-tui` command, runner, gateway, bench child) compiled
    what it imports, about half of a `fleet-tui ls`'s CPU. compileall writes whatever
    that variable says, and skips the files whose bytecode is current."""
    import compileall

    for folder in ("fleet_tui", "bench", "tests/support"):
        compileall.compile_dir(REPO_ROOT / folder, quiet=2)


# Where the workers run in the cage, the product's default: the cage's own tests, the
# hosts' and the users' paths (tests/execution, tests/journeys) and tests marked `caged`.
# Elsewhere (the engine's rules, the CLI, the panel, the gateway) the subject is not the
# cage, and a caged start costs ~0.35 s of CPU more (node, srt, bwrap, 4 socat): those
# tests run their workers with FLEET_WORKER_CAGE=off, as a user's `cage = "off"` would.
CAGED_FOLDERS = ("execution", "journeys")


def runs_caged(node: pytest.Item) -> bool:
    folder = Path(str(node.path)).relative_to(REPO_ROOT / "tests").parts[0]
    return folder in CAGED_FOLDERS or node.get_closest_marker("caged") is not None


@pytest.fixture(autouse=True)
def isolated_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
                 request: pytest.FixtureRequest) -> Iterator[Path]:
    """A private HOME and fleet-tui home for each test; no inherited credentials."""
    base = tmp_path_factory.mktemp("env")
    home = base / "home"
    home.mkdir()
    for name in list(os.environ):
        if name.startswith(_SCRUB_PREFIXES) or name in _SCRUB_NAMES:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("FLEET_TUI_HOME", str(base / "fleet-home"))
    if _PORTABLE_RUN:  # `FLEET_TUI_PORTABLE_PROCS=1 pytest`: the children read processes so too
        monkeypatch.setenv("FLEET_TUI_PORTABLE_PROCS", "1")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    # Keyring: the stand-in file backend from tests/support/keyring_standin.py (no OS keyring
    # daemon can run here); tests that need "no backend" override this.
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring_standin.FileKeyring")
    monkeypatch.setenv("FLEET_TEST_KEYRING_FILE", str(base / "keyring.json"))
    tests_dir = str(Path(__file__).resolve().parent / "support")
    pythonpath = os.pathsep.join([tests_dir, os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", pythonpath.rstrip(os.pathsep))
    # CI runs as root: claude refuses bypassPermissions as root without the opt-in.
    if os.geteuid() == 0:
        monkeypatch.setenv("FLEET_WORKER_SANDBOX", "1")
    monkeypatch.setenv("GIT_AUTHOR_NAME", "Fleet Test")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "fleet@example.invalid")
    monkeypatch.setenv("GIT_COMMITTER_NAME", "Fleet Test")
    monkeypatch.setenv("GIT_COMMITTER_EMAIL", "fleet@example.invalid")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    # git's own upkeep, `git maintenance run --auto` after each commit, merge and fetch, is
    # one process more each time (~3,400 in a parallel pass) with nothing to keep up in a
    # test's small repositories: off in the test home's git configuration
    (home / ".gitconfig").write_text("[maintenance]\n\tauto = false\n")
    for name, value in _jsc_tuning().items():
        monkeypatch.setenv(name, value)
    # The workers of the older tests talk to their endpoint directly, as they were written
    # to (a gateway is a process more in each test's home); tests/test_gateway*.py turn it on.
    monkeypatch.setenv("FLEET_WORKER_GATEWAY", "0")
    if not runs_caged(request.node):
        monkeypatch.setenv("FLEET_WORKER_CAGE", "off")
    yield home


@pytest.hookimpl(tryfirst=True)  # as claude_marks' own: before `-m` deselects on the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test that asks for claude gets its real_claude mark (claude_marks); then the
    tests marked `long` go out early, spread (suite_order)."""
    claude_marks.pytest_collection_modifyitems(items)
    suite_order.long_early(items)


@pytest.fixture(params=["linux", "portable"] if sys.platform == "linux" else ["portable"])
def procs_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test over both ways fleet_tui.system.procs reads processes: Linux's /proc with its
    extras (subreaper, parent-death signal), and the portable path on psutil without them
    (macOS's), in this process and in every engine and runner it starts."""
    from fleet_tui.system import procs

    portable = request.param == "portable"
    monkeypatch.setattr(procs, "PORTABLE", portable)
    if portable:
        monkeypatch.setenv("FLEET_TUI_PORTABLE_PROCS", "1")
    else:
        monkeypatch.delenv("FLEET_TUI_PORTABLE_PROCS", raising=False)
    return str(request.param)


@pytest.fixture(scope="session")
def claude_bin() -> str:
    """Path of the real, pinned claude binary. Missing: skip locally, fail under CI.
    The only way a test reaches the real binary; asking for it marks the test real_claude."""
    if _CLAUDE is None:
        _missing("the real claude binary is not installed; run `bash scripts/test` (it installs "
                 "the pinned @anthropic-ai/claude-code into .claude-cli/) or set "
                 "FLEET_TEST_CLAUDE")
    return _CLAUDE


@pytest.fixture(scope="session")
def claude_newest_bin() -> str:
    """Path of the newest pinned claude (CLAUDE_CODE_NEWEST_VERSION), for behaviour that
    differs between versions. Missing: skip locally, fail under CI."""
    if _CLAUDE_NEWEST is None:
        _missing("the newest claude binary is not installed; run `bash scripts/test` (it "
                 "installs CLAUDE_CODE_NEWEST_VERSION into .claude-cli-newest/) or set "
                 "FLEET_TEST_CLAUDE_NEWEST")
    return _CLAUDE_NEWEST


def git(cwd: Path, *args: str) -> str:
    """Run git in cwd and return stdout (raises on failure)."""
    out = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)
    return out.stdout


@pytest.fixture(scope="session")
def _git_repo_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The git_repo made once per session (per xdist worker); each test gets a copy.
    Made with no user or system git configuration, as the tests' own environment has."""
    repo = tmp_path_factory.mktemp("template") / "repo"
    repo.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(repo.parent),
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "Fleet Test",
           "GIT_AUTHOR_EMAIL": "fleet@example.invalid", "GIT_COMMITTER_NAME": "Fleet Test",
           "GIT_COMMITTER_EMAIL": "fleet@example.invalid"}

    def run(*args: str) -> None:
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, env=env)

    run("init", "-q", "-b", "main")
    run("config", "user.name", "Fleet Test")
    run("config", "user.email", "fleet@example.invalid")
    (repo / "README.md").write_text("# demo\n")
    (repo / "src").mkdir()
    (repo / "src" / "app.py").write_text("def main():\n    return 1\n")
    run("add", "-A")
    run("commit", "-q", "-m", "initial")
    return repo


@pytest.fixture
def git_repo(tmp_path: Path, _git_repo_template: Path) -> Path:
    """A real git repository on branch main with one commit (README.md, src/app.py):
    a copy of the session's template, so each test has its own."""
    repo = tmp_path / "repo"
    shutil.copytree(_git_repo_template, repo, symlinks=True)
    return repo


@pytest.fixture
def stand_in_runner() -> Iterator[int]:
    """The pid of a live process of the test's own (its own session) to record as an
    attempt's runner. Never the test process itself: an engine that stops that attempt
    signals the recorded pid (once that was the xdist worker: "node down")."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True,
                            stdin=subprocess.DEVNULL)
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=30)


@pytest.fixture
def reference_samples() -> Path:
    """Real outputs of the pinned CLI (stdout, stderr, exit code per case), kept in
    tests/support/fixtures/stream-json."""
    path = FIXTURES / "stream-json"
    if not path.is_dir():
        pytest.skip("tests/support/fixtures/stream-json missing")
    return path


def which(name: str) -> str | None:
    return shutil.which(name)
