"""The README's first command, as written, on a clean copy of the checkout, in a real terminal.

The rest of the suite runs on an editable install, which finds everything in the checkout:
package data left out of the wheel (the cage's host script, the panel's styles), a console
script that points nowhere, would pass there and break only for a newcomer. So this test
copies the checkout's tracked files to a folder of its own (a fresh clone has nothing else),
reads the first command from README.md's first ```bash block, and runs it there in tmux
(`python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/fleet-tui --demo`: a real
venv, a real non-editable install from the package registries, then the demo), with a private
HOME and fleet-tui home. It waits until the panel shows the demo's tasks and a worker's
stream, quits with the key the panel's footer names, and checks the command exited 0 with
no traceback, and that what ran was the install in the new venv: its `fleet_tui`, and its
copy of the cage's host script under the workers.

The demo finds `claude` and srt on PATH, as a user who installed them with npm has them
(the pinned ones scripts/test installs). pip keeps the machine's own configuration and
cache (what a newcomer's second try has), read before the suite's private HOME hides them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from proc_helpers import working_in

from fleet_tui.demo.session import DEMO_TASKS
from fleet_tui.execution.worker import cage
from fleet_tui.system import procs

ROOT = Path(__file__).resolve().parents[2]
WIDTH, HEIGHT = 160, 48
# pip install from the registries, a cold start of the panel and four workers, on a loaded
# 2-core machine: minutes, not seconds (a second install reads pip's caches)
DEADLINE = 600.0
CLONE = "fleet-tui"  # the folder a `git clone` makes


def _pip_settings(environ: dict[str, str]) -> dict[str, str]:
    """The machine's pip cache and user configuration, as paths that stay right under the
    private HOME each test gets (conftest's isolated_env replaces HOME and XDG_*)."""
    home = Path(environ.get("HOME", str(Path.home())))
    settings = {}
    cache = environ.get("PIP_CACHE_DIR") or str(
        Path(environ.get("XDG_CACHE_HOME") or home / ".cache") / "pip")
    settings["PIP_CACHE_DIR"] = cache
    if "PIP_CONFIG_FILE" in environ:
        settings["PIP_CONFIG_FILE"] = environ["PIP_CONFIG_FILE"]
    else:
        config_home = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
        for config in (config_home / "pip" / "pip.conf", home / ".pip" / "pip.conf"):
            if config.is_file():
                settings["PIP_CONFIG_FILE"] = str(config)
                break
    return settings


# read when the module is imported, before any test's private HOME
_PIP = _pip_settings(dict(os.environ))


def first_command(readme: str) -> str:
    """The first line of README.md's first ```bash block, without its `# comment`."""
    block = re.search(r"^```bash\n(.*?)^```", readme, re.S | re.M)
    assert block is not None, "README.md has no ```bash block"
    command = block.group(1).splitlines()[0].split("#", 1)[0].strip()
    assert command, "README.md's first ```bash block starts with an empty line"
    return command


def test_the_first_command_is_read_from_the_readme() -> None:
    readme = "# x\n\n```bash\nmake it go   # start\nmake check\n```\n\n```bash\nother\n```\n"
    assert first_command(readme) == "make it go"
    assert first_command((ROOT / "README.md").read_text()).endswith("--demo")


def _missing(message: str) -> NoReturn:
    """Skip locally, fail under CI (where scripts/test installed everything)."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


def _copy_tracked_files(checkout: Path, to: Path) -> None:
    """The checkout's tracked files as they are on disk (a fresh clone of this work):
    nothing ignored or untracked (.venv, .claude-cli, .srt, build/, *.egg-info)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=checkout, capture_output=True,
                            check=True, timeout=60).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source, target = checkout / name, to / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the work tree, not yet in git
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)


class Terminal:
    """A tmux server of this test's own (its socket in the test's folder) with one pane."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.socket = folder / "tmux.sock"
        self.config = folder / "tmux.conf"
        self.status_file = folder / "exit-status"
        # remain-on-exit: the pane, and what it shows, stay after its command ends
        self.config.write_text("set -g remain-on-exit on\nset -g history-limit 10000\n")
        self.env = env

    def tmux(self, *args: str) -> str:
        out = subprocess.run(["tmux", "-S", str(self.socket), "-f", str(self.config), *args],
                             env=self.env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"tmux {args[0]}: {out.stderr}"
        return out.stdout

    def start(self, cwd: Path, command: str) -> None:
        """Run `command` in the pane as a user's shell does: the README's block is bash, so
        `bash -c COMMAND` (the command one argument, unchanged), whose exit status the shell
        around it writes down once it has waited for it. (tmux's own record of a pane's
        exit, pane_dead_status, once stayed unset for over a minute with the panel's
        process already a zombie under the tmux server, on a loaded machine.)"""
        self.status_file.unlink(missing_ok=True)
        self.tmux("new-session", "-d", "-x", str(WIDTH), "-y", str(HEIGHT), "-c", str(cwd),
                  "bash", "-c", 'bash -c "$1"; echo "$?" > "$2"', "bash", command,
                  str(self.status_file))

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p")

    def everything(self) -> str:
        """The pane's scrollback and screen (pip's output, what the panel left behind)."""
        return self.tmux("capture-pane", "-p", "-J", "-S", "-")

    def exit_status(self) -> int | None:
        """The command's exit status once it ended, else None."""
        try:
            said = self.status_file.read_text()
        except FileNotFoundError:
            return None
        return int(said) if said.endswith("\n") else None  # else: being written

    def press(self, key: str) -> None:
        self.tmux("send-keys", key)

    def stop(self) -> None:
        subprocess.run(["tmux", "-S", str(self.socket), "kill-server"], env=self.env,
                       capture_output=True, timeout=60)


def _tail(terminal: Terminal, lines: int = 60) -> str:
    """The end of what the pane printed (pip's output before it runs to a hundred lines)."""
    return "\n".join(terminal.everything().rstrip().splitlines()[-lines:])


def _tmux_key(shown: str) -> str:
    """A key as the footer shows it (`q`, `^q`) as tmux's send-keys names it."""
    return f"C-{shown[1:]}" if shown.startswith("^") and len(shown) == 2 else shown


def _newcomer_env(home: Path, bin_dirs: list[str]) -> dict[str, str]:
    """This test's environment (private HOME, fleet-tui home and XDG dirs, no credentials)
    without what only the suite sets (its PYTHONPATH, keyring stand-in, FLEET_WORKER_*),
    with the pinned claude and srt on PATH and the machine's pip settings."""
    dropped = ("PYTHONPATH", "PYTHON_KEYRING_BACKEND", "PYTHONDONTWRITEBYTECODE",
               "FLEET_TEST_KEYRING_FILE", "VIRTUAL_ENV", "TMUX", "TMUX_PANE")
    env = {name: value for name, value in os.environ.items()
           if name not in dropped and not name.startswith(("PYTEST_", "FLEET_WORKER_",
                                                           "FLEET_TEST_"))}
    assert env["HOME"] == str(home)  # conftest's private one
    # not this suite's venv: the command makes and uses its own
    ours = str(Path(sys.prefix) / "bin") if sys.prefix != sys.base_prefix else None
    path = [entry for entry in env.get("PATH", os.defpath).split(os.pathsep)
            if entry and entry != ours]
    env["PATH"] = os.pathsep.join([*bin_dirs, *path])
    env.update(_PIP)
    env.setdefault("TERM", "xterm-256color")
    env.setdefault("LANG", "C.UTF-8")
    return env


def _srt_bin_dir() -> str:
    """Where an npm install of the pinned srt has its `srt` (scripts/test: .srt/)."""
    package = cage.find_srt(dict(os.environ))
    if package is None:
        _missing("no srt here: scripts/test installs the pinned sandbox runtime into .srt/")
    node_modules = Path(package).resolve().parents[1]  # <prefix>/node_modules/@scope/name
    bin_dir = node_modules / ".bin"
    if not (bin_dir / "srt").exists():
        pytest.fail(f"srt has no {bin_dir / 'srt'} to put on PATH")
    return str(bin_dir)


def _ours(roots: list[Path]) -> list[int]:
    """Live processes working under this test's folders: the ones this test started
    (the panel, its workers, their cages, the demo's endpoint and gateway)."""
    return sorted({pid for root in roots for pid in working_in(root)})


def _cage_hosts(roots: list[Path]) -> set[str]:
    """The host scripts the cages of this test's workers run (`node HOST ...`)."""
    hosts = set()
    for pid in _ours(roots):
        argv = procs.cmdline(pid)
        hosts.update(arg for arg in argv[1:2] if arg.endswith("cage_host.mjs"))
    return hosts


def _stop_ours(roots: list[Path]) -> None:
    """TERM then KILL what this test started and left running (the demo's workers finish
    on their own after the panel quits; the endpoint and gateway stop when idle)."""
    deadline = time.monotonic() + 30
    sig = signal.SIGTERM
    while pids := _ours(roots):
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        time.sleep(0.2)
        if time.monotonic() > deadline + 30:
            raise AssertionError(f"processes of this test outlived SIGKILL: {pids}")


def _forget_our_wheel(clone: Path) -> None:
    """pip keeps the wheel it built from `clone` in the machine's wheel cache under the
    folder's URL, which no later run asks for again: drop it (only that one)."""
    url = clone.as_uri()
    try:  # listed first: the walk would trip over the folder removed under it
        origins = list((Path(_PIP["PIP_CACHE_DIR"]) / "wheels").rglob("origin.json"))
    except OSError:  # another pip changing its cache meanwhile: leave it
        return
    for origin in origins:
        try:
            built_here = f'"url": "{url}"' in origin.read_text()
        except OSError:
            continue
        if built_here:
            shutil.rmtree(origin.parent, ignore_errors=True)


@pytest.fixture
def terminal(tmp_path: Path, isolated_env: Path, claude_bin: str) -> Iterator[Terminal]:
    if shutil.which("tmux") is None:
        _missing("tmux is not installed (scripts/test installs Debian's tmux as root)")
    env = _newcomer_env(isolated_env, [str(Path(claude_bin).parent), _srt_bin_dir()])
    term = Terminal(tmp_path, env)
    try:
        yield term
    finally:
        term.stop()
        _stop_ours([tmp_path, isolated_env.parent])
        # the command's venv (over 100 MB) is of no use once the test ran
        shutil.rmtree(tmp_path / CLONE / ".venv", ignore_errors=True)
        _forget_our_wheel(tmp_path / CLONE)


@pytest.mark.timeout(DEADLINE + 180)
@pytest.mark.long
def test_the_readmes_first_command_starts_the_demo_from_a_fresh_clone(
        terminal: Terminal, tmp_path: Path, isolated_env: Path) -> None:
    clone = tmp_path / CLONE
    _copy_tracked_files(ROOT, clone)
    command = first_command((clone / "README.md").read_text())
    roots = [tmp_path, isolated_env.parent]
    started = time.monotonic()
    terminal.start(clone, command)

    titles = [title for title, _ in DEMO_TASKS]
    hosts: set[str] = set()
    screen = ""

    def shown() -> bool:
        nonlocal screen
        screen = terminal.screen()
        hosts.update(_cage_hosts(roots))
        stream = "session started" in screen and re.search(r"^\s*└ \S", screen, re.M)
        return all(title in screen for title in titles) and bool(stream) and bool(hosts)

    while not shown():
        status = terminal.exit_status()
        assert status is None, \
            f"`{command}` ended ({status}) before the demo showed:\n{_tail(terminal)}"
        assert "[y/N]" not in screen, f"the demo asks to install something:\n{screen}"
        # the demo's workers all succeed: one that failed will not show a stream
        assert not re.search(r"^\s*\S+ failed\s", screen, re.M), \
            f"a demo task failed:\n{screen}"
        assert time.monotonic() - started < DEADLINE, \
            f"no demo tasks and stream after {DEADLINE:.0f} s:\n{screen}"
        time.sleep(0.5)
    panel_after = time.monotonic() - started

    quit_key = re.search(r"(?:^|\s)(\S+) Quit(?:\s|$)", screen.strip().splitlines()[-1])
    assert quit_key is not None, f"the footer names no Quit key:\n{screen}"
    terminal.press(_tmux_key(quit_key.group(1)))
    deadline = time.monotonic() + 60
    while (status := terminal.exit_status()) is None:
        assert time.monotonic() < deadline, \
            f"still running 60 s after {quit_key.group(1)!r}:\n{terminal.screen()}"
        time.sleep(0.2)
    everything = terminal.everything()
    assert status == 0, f"`{command}` exited {status}:\n{_tail(terminal)}"
    assert "Traceback" not in everything, everything

    # what ran was the install in the command's own venv, not the checkout it came from
    venv = clone / ".venv"
    where = subprocess.run([str(venv / "bin" / "python"), "-I", "-c",
                            "import fleet_tui; print(fleet_tui.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert where.returncode == 0, where.stderr
    package = Path(where.stdout.strip()).parent
    assert package.parent.name == "site-packages" and venv in package.parents, package
    assert hosts == {str(package / "execution" / "worker" / "cage_host.mjs")}, hosts
    print(f"the demo's panel showed its tasks and a stream {panel_after:.0f} s after "
          f"`{command}` started")
