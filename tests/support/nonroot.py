"""Run a child process as a user who is not root, on every machine.

Some behaviour differs for root (claude refuses bypassPermissions as root unless told it
runs in a sandbox; fleet-worker and fleet-doctor check for that). The root side can only
be tested as root; the other side, what everybody else sees, is tested everywhere with
this: as root (CI, containers) the child drops to `nobody` (uid and gid 65534, no
supplementary groups) through util-linux's `setpriv`, as a normal user it runs as that
user. Either way it gets a scratch directory of its own (HOME, FLEET_TUI_HOME, XDG dirs
and the keyring stand-in's file inside it): the test's own tmp_path is private to root
and the child could not use it.

When the Python interpreter lives where `nobody` cannot reach it (pyenv under /root, mode
0700), the dropped child keeps one capability, CAP_DAC_READ_SEARCH (read any file, enter
any directory), so that it can start Python at all. It is still not root: its uid and
euid are 65534 and it holds no other privilege, which is all that the root checks under
test look at (os.geteuid(); claude's own check).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

NOBODY = 65534


@dataclass
class NonRoot:
    root: Path  # a scratch directory the user owns (after own())
    env: dict[str, str]  # the test's environment with every private path moved into root
    uid: int  # the uid the child runs as

    @property
    def drops(self) -> bool:
        """True when the child drops from root to `nobody`."""
        return self.uid != os.geteuid()

    def own(self) -> None:
        """Give everything under root to the user (call after creating files there)."""
        if not self.drops:
            return
        for path in [self.root, *self.root.rglob("*")]:
            os.chown(path, self.uid, self.uid, follow_symlinks=False)

    def command(self, argv: Sequence[str]) -> list[str]:
        """argv, run as the user."""
        if not self.drops:
            return list(argv)
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.fail("running as root, and util-linux's setpriv (needed to run a child as "
                        "a non-root user) is not installed")
        keep = [] if _others_can_run(sys.executable) else [
            "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
        return [setpriv, f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                *keep, "--", *argv]

    def run(self, argv: Sequence[str], *, cwd: Path | None = None, timeout: float = 60,
            env: dict[str, str] | None = None, **kwargs: Any
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(argv), cwd=cwd or self.root, env=env or self.env,
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, **kwargs)


def _others_can_run(program: str) -> bool:
    """Whether a user with no rights of owner or group may run `program` (every directory
    above it searchable, the file itself readable and executable by others)."""
    path = Path(os.path.realpath(program))
    if path.stat().st_mode & 0o005 != 0o005:
        return False
    return all(parent.stat().st_mode & 0o001 for parent in path.parents)


@contextmanager
def non_root() -> Iterator[NonRoot]:
    root = Path(tempfile.mkdtemp(prefix="fleet-nonroot-"))
    try:
        root.chmod(0o755)
        home = root / "home"
        home.mkdir()
        env = dict(os.environ)
        env.update({"HOME": str(home), "FLEET_TUI_HOME": str(root / "fleet-home"),
                    "XDG_CONFIG_HOME": str(home / ".config"),
                    "XDG_DATA_HOME": str(home / ".local" / "share"),
                    "XDG_CACHE_HOME": str(home / ".cache"),
                    "FLEET_TEST_KEYRING_FILE": str(root / "keyring.json")})
        yield NonRoot(root=root, env=env, uid=NOBODY if os.geteuid() == 0 else os.geteuid())
    finally:
        shutil.rmtree(root, ignore_errors=True)


def make_repo(path: Path) -> Path:
    """A git repository on main with one commit and .fleet-work/ excluded."""
    path.mkdir(parents=True)
    for args in (["init", "-q", "-b", "main"], ["config", "user.name", "Fleet Test"],
                 ["config", "user.email", "fleet@example.invalid"]):
        subprocess.run(["git", *args], cwd=path, check=True, capture_output=True)
    (path / "README.md").write_text("# demo\n")
    (path / ".git" / "info").mkdir(parents=True, exist_ok=True)
    (path / ".git" / "info" / "exclude").write_text(".fleet-work/\n")
    subprocess.run(["git", "add", "-A"], cwd=path, check=True, capture_output=True)
    subprocess.run(["git", "commit", "-q", "-m", "initial"], cwd=path, check=True,
                   capture_output=True)
    return path
