"""What the remote hosts share (the SSH host, the Ray host): a task's worktree, config dir
and attempt folder under a data dir of the machine it runs on, the attempt folder mirrored
here, the included files sent as a tar, the task's work read from what was fetched here.

`RemoteHost` is their base: each says where its data dir is (`remote_root`) and keeps the
event `_ended` set when one of its followers saw a run end (`wait` returns early on it).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet_tui.execution.host import Placement, RunnerState
from fleet_tui.execution.worker import launch, prepare
from fleet_tui.execution.worker.attemptlog import AttemptLog
from fleet_tui.system import paths
from fleet_tui.vcs.git import UpdateResult

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from fleet_tui.core.model import Attempt, Task
    from fleet_tui.execution.worker.spec import RunSpec
    from fleet_tui.settings.config import Settings

# the variables the host's runner hands claude through its pipe (never its environment)
KEY_VARIABLES = ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY", "ZHIPU_API_KEY", "GLM_API_KEY")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def write_at(path: Path, at: int, body: bytes, *, sender: str) -> None:
    """Bytes a remote side sent of an appended file (its offset `at`), written where this
    copy lacks them: a replay changes nothing; a gap (ValueError) is never filled."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        if at > size:
            raise ValueError(f"{path.name}: {sender} sent bytes from {at}, the copy here "
                             f"holds {size}")
        if at + len(body) > size:
            os.pwrite(fd, body[size - at:], size)
    finally:
        os.close(fd)


def update_result(answer: Mapping[str, Any], *, branch: str, base_branch: str,
                  base_commit: str, strategy: str, host: str) -> UpdateResult:
    """The SSH agent's `update` answer (run on the host, or in a Ray job on the node) as
    the engine's UpdateResult; `host` names where ("host NAME", "the Ray host NAME")."""
    if "error" in answer:
        return UpdateResult("refused", f"updating {branch} from {base_branch} on {host} "
                            f"failed: {answer['error']}")
    status = str(answer.get("status"))
    conflicts = [str(c) for c in answer.get("conflicts") or []]
    committed = answer.get("committed")
    where = f"in its worktree on {host}"
    if status == "conflicts" and answer.get("concluded"):
        return UpdateResult(
            "conflicts", f"the update of {branch} was concluded {where} with conflict "
            f"markers still in: {', '.join(conflicts)}; let its worker resolve them "
            "(update --resolve worker) or abort the update", conflicts,
            base_tip=base_commit, head=answer.get("head"))
    if status == "conflicts":
        operation = str(answer.get("operation") or "merge")
        return UpdateResult(
            "conflicts", f"updating {branch} from {base_branch} stopped on conflicts "
            f"{where} in: {', '.join(conflicts)}; let its worker resolve them "
            "(update --resolve worker) or abort the update", conflicts,
            base_tip=base_commit, committed=committed, operation=operation)
    if status == "current":
        return UpdateResult("current", f"{branch} is up to date with {base_branch} "
                            f"({base_commit[:10]}) already", base_tip=base_commit,
                            head=answer.get("head"), committed=committed)
    if status == "updated":
        done = ("is up to date with " + base_branch + " (the conflicts were resolved)"
                if answer.get("resolved") else
                f"{'rebased onto' if strategy == 'rebase' else 'merged with'} "
                f"{base_branch} ({base_commit[:10]}) {where}")
        return UpdateResult("updated", f"{branch} {done}", base_tip=base_commit,
                            head=answer.get("head"), committed=committed)
    return UpdateResult("refused", f"updating {branch} from {base_branch} on {host} "
                        f"failed: {answer.get('error') or status}")


class RemoteRun:
    """The parts of a remote attempt's run that do not depend on its host: the attempt
    folder here, its key, waiting for it to be gone (by `state`)."""

    def __init__(self, attempt: Attempt) -> None:
        assert attempt.dir is not None, "an attempt that was never placed has no run"
        self.attempt = attempt
        self._log = AttemptLog(attempt.dir)

    @property
    def log(self) -> AttemptLog:
        return self._log

    @property
    def key(self) -> tuple[str, int]:
        return self.attempt.task_id, self.attempt.n

    # which record names the runner first: the engine's launch record (an SSH host's
    # spawn returns the pid) or the runner's own (a Ray job's pid is known only from it)
    runner_first = False

    def identity(self) -> tuple[int | None, str | None]:
        """The runner's pid and start time on its host, from the records mirrored here;
        else the attempt's recorded pid (a Ray job's 0: submitted, its runner not known
        yet, so that a kill meanwhile goes ahead and stops the job)."""
        records = (self._log.launch_record(), self._log.runner_record())
        for rec in reversed(records) if self.runner_first else records:
            pid = rec.get("runner_pid") if rec else None
            if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0:
                start = rec.get("runner_start") if rec else None
                return pid, str(start) if start is not None else None
        return self.attempt.runner_pid, None

    def state(self) -> RunnerState:
        raise NotImplementedError

    def wait_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if self.state() != "alive":
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


class RemoteHost:
    """The parts of a host whose worktrees are on another machine that do not depend on
    how that machine is reached."""

    name: str
    env: Mapping[str, str]
    _ended: threading.Event

    def remote_root(self) -> str:
        """The data dir on the machine the attempts run on (absolute)."""
        raise NotImplementedError

    def mirror_path(self, repo: Path) -> str:
        """The bare mirror of `repo` there (one per repository of this machine)."""
        real = str(Path(repo).resolve())
        slug = re.sub(r"[^A-Za-z0-9._-]", "_", Path(real).name)[:40]
        digest = hashlib.sha256(real.encode()).hexdigest()[:10]
        return f"{self.remote_root()}/repos/{slug}-{digest}.git"

    def check_setup(self, settings: Settings, env: Mapping[str, str], *,
                    args: Sequence[str] = (), permission_mode: str | None = None) -> None:
        launch.check_setup(settings, env, args=args, permission_mode=permission_mode)

    def place(self, task: Task, worktree: Path, attempt_n: int) -> Placement:
        """The attempt folder here (private), the config dir there."""
        adir = paths.attempt_dir(task.repo, task.id, attempt_n)
        for folder in (paths.logs_dir(task.repo), adir.parent, adir):
            paths.private_dir(folder)
        return Placement(host=self.name, worktree=worktree,
                         branch=task.branch or f"fleet/{task.id}",
                         base_commit=task.base_commit or "", base_branch=task.base_branch,
                         config_dir=Path(f"{self.remote_root()}/config/{task.id}"),
                         attempt_dir=adir)

    def included_tar(self, spec: RunSpec) -> bytes:
        """The repository's included files as a tar (those holding a key left out); b""
        when the task includes none."""
        if not spec.include:
            return b""
        secrets = [v for k, v in self.env.items() if k in KEY_VARIABLES and v]
        files = prepare.included_files(spec.repo, spec.include)
        with tempfile.TemporaryDirectory(prefix="fleet-include-") as tmp:
            prepare.copy_included(spec.repo, tmp, files, secrets)
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                tar.add(tmp, arcname=".")
            return buf.getvalue()

    def git_identity(self, repo: Path) -> tuple[str, str] | None:
        """This machine's git identity for `repo` (a commit made for it there is this
        user's, as a merge here would make it); None: git has none."""
        done = subprocess.run(["git", "-C", str(repo), "var", "GIT_COMMITTER_IDENT"],
                              capture_output=True, text=True, env=dict(self.env), check=False)
        match = re.match(r"(.*) <([^>]*)>", done.stdout.strip())
        if done.returncode != 0 or match is None:
            return None
        return match.group(1), match.group(2)

    @staticmethod
    def snapshot_ref(task: Task) -> str:
        return f"refs/fleet/snapshot/{task.id}"

    def read_file(self, task: Task, path: str) -> bytes | None:
        """From the last snapshot fetched here (else the branch): no round trip."""
        for ref in (self.snapshot_ref(task), f"refs/heads/{task.branch or 'fleet/' + task.id}"):
            done = subprocess.run(["git", "-C", str(task.repo), "cat-file", "blob",
                                   f"{ref}:{path}"], capture_output=True, check=False,
                                  env=dict(self.env))
            if done.returncode == 0:
                return done.stdout
        return None

    def session_problem(self, task: Task) -> str | None:
        """A host keeps its sessions in its data dir (an SSH host); see the Ray host's."""
        return None

    def wait(self, stop: threading.Event, interval: float) -> None:
        deadline = time.monotonic() + interval
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self._ended.wait(min(left, 0.05)):
                self._ended.clear()
                return


__all__ = ["KEY_VARIABLES", "LOOPBACK", "RemoteHost", "RemoteRun", "update_result",
           "write_at"]
