"""The runner's side of the cage host (`cage_host.mjs`, cage.py): started early, before the
run is planned, so that node and srt load while the launch settings are read and the
worktree is made ready; then told what to run and in which cage (its order), and finally
"go", when it becomes claude's process. Or let go, when the run does not start or the
settings say the worker is not caged after all.

Standard library only, as the runner that imports it (it runs on every host).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

from fleet_tui.execution.worker import cage
from fleet_tui.execution.worker.spec import LEFTOVER_GRACE
from fleet_tui.system import cgroups

TYPE_CHECKING = False
if TYPE_CHECKING:  # a runner starts per attempt: typing would cost each one ~5 ms
    from collections.abc import Callable, Mapping, Sequence
    from pathlib import Path
    from typing import IO, Any

    from fleet_tui.execution.worker import cageearly
    from fleet_tui.execution.worker.spec import RunSpec


def caged(settings: Any) -> bool:
    """The launch settings put this worker in the cage (setting cage = "worker")."""
    return settings is not None and getattr(settings, "cage", "off") == "worker"


def wrap(settings: Any, spec: RunSpec, argv: list[str], env: dict[str, str], *,
         attempt_dir: str) -> tuple[list[str], dict[str, str]]:
    """claude in the worker's cage when the settings say so, else as it is (no warm host:
    the cage host is started with claude's argv)."""
    if not caged(settings):
        return argv, env
    return cage.wrap(argv, env, attempt_dir=attempt_dir, worktree=spec.cwd,
                     config_dir=spec.config_dir, repo=spec.repo,
                     base_url=settings.base_url, allow_hosts=settings.allow_hosts)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class WarmCageHost:
    """A cage host started before the run is known: the child that becomes claude's
    process, and the pipe that carries its order and then "go"."""

    def __init__(self, proc: subprocess.Popen[bytes], go_fd: int) -> None:
        self.proc = proc
        self.go_fd: int | None = go_fd

    @classmethod
    def start(cls, spec: RunSpec, env: Mapping[str, str],
              spawn: Callable[[Sequence[str], Mapping[str, str], int],
                              subprocess.Popen[bytes] | None]) -> WarmCageHost | None:
        """Start it when the worker will most likely be caged; None when it is not, or
        when this machine cannot cage (the run then fails as `wrap` says). `spawn` starts
        the child as claude's would be started, the pipe's reading end passed on."""
        from pathlib import Path

        if not Path(spec.cwd).is_dir() or not cage.wanted(spec.settings or {}, env):
            return None
        argv = cage.warm_argv(env)
        if argv is None:
            return None
        go_r, go_w = os.pipe()
        try:
            proc = spawn(argv, env, go_r)
        finally:
            os.close(go_r)
        if proc is None:
            os.close(go_w)
            return None
        return cls(proc, go_w)

    @classmethod
    def adopt(cls, early: cageearly.Early, spec: RunSpec, cgroup: str | None, namespaced: bool,
              events: Path) -> tuple[WarmCageHost, tuple[int, IO[bytes], IO[bytes]]] | None:
        """The host the runner started before its imports (cageearly.py) as its warm host,
        moved into the attempt's cgroup before it is told anything; with the runner's ends
        of its stdin, stderr and events files. None when it does not fit the run as it
        turned out (no cgroup after all, another worktree, gone): the caller drops it."""
        if cgroup is None or namespaced or early.cwd != spec.cwd or early.proc.poll() is not None:
            return None
        try:
            out_fh = open(events, "ab", buffering=0)  # noqa: SIM115 (closed by the runner)
        except OSError:
            return None
        cgroups.add(cgroup, early.proc.pid)
        return cls(early.proc, early.go_fd), (early.stdin_fd, early.err_fh, out_fh)

    def order(self, settings: Any, spec: RunSpec, argv: list[str], env: dict[str, str], *,
              attempt_dir: str) -> bool:
        """Send what to run, in which cage; False when the settings say this worker is not
        caged (the caller lets it go). Raises as `cage.wrap` does."""
        if not caged(settings):
            return False
        line = cage.order(argv, env, attempt_dir=attempt_dir, worktree=spec.cwd,
                          config_dir=spec.config_dir, repo=spec.repo,
                          base_url=settings.base_url, allow_hosts=settings.allow_hosts)
        assert self.go_fd is not None
        write_all(self.go_fd, line)
        return True

    def go(self) -> subprocess.Popen[bytes]:
        """Its order is in: now it starts claude. Its process is claude's from here."""
        assert self.go_fd is not None
        with contextlib.suppress(OSError):  # it is gone: its exit status says so
            write_all(self.go_fd, cage.GO)
        os.close(self.go_fd)
        self.go_fd = None
        return self.proc

    def drop(self) -> None:
        """End it, as it will not run claude (closing its pipe ends it; a SIGTERM and then
        SIGKILL should it linger)."""
        if self.go_fd is not None:
            os.close(self.go_fd)
            self.go_fd = None
        proc = self.proc
        for sig in (signal.SIGTERM, signal.SIGKILL, None):  # its own process group
            try:
                proc.wait(timeout=2.0 if sig == signal.SIGTERM else LEFTOVER_GRACE)
                break
            except subprocess.TimeoutExpired:
                if sig is None:
                    break
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, sig)
        if proc.stdout is not None:
            proc.stdout.close()
