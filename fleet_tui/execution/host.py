"""The host seam: the one door between the engine and wherever an attempt runs.

The engine decides what runs (the task, the attempt, its spec, when to stop it); a host
decides where and how. Everything the engine, the follower, the CLI and the panel need of
a running attempt goes through these two objects:

- `Host`: prepares a placement (the worktree at the base commit with the included files,
  the task's config dir, the attempt folder; a port free on it), stages the attempt (its lock taken,
  its spec written: nothing runs yet) so that the engine can record the placement in the
  store before anything runs, starts the runner detached, and attaches to an attempt it (or
  another engine, or an older version) started.
  `collect` brings the task's commits to a branch of the main repository (before a merge)
  and `release` frees what the task holds on the host once it is closed.
- `Run`: one attempt on its host: whether its runner lives, who it is, the stop request,
  signals, the sweep of what it left behind (by the attempt's token), waiting for it to be
  gone, a message to the worker, and the attempt folder (`log`) its bytes are read from.

The attempt folder (`execution.worker.attemptlog`) is the one format every host leaves behind on
this machine: the local host's runner writes it in place; a remote host mirrors into it
the bytes it fetches. So the follower and the panel read one format whatever the host.

Hosts: `execution.local.host.LocalHost` (this machine: a detached runner process) and
`execution.memory.MemoryHost` (no process at all: the engine's rules tested in
milliseconds). `execution.hosts.default_host` builds the local one for an engine that was
given none, so that nothing above this folder imports a host's code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    import threading
    from collections.abc import Mapping, Sequence

    from fleet_tui.core.model import Attempt, Task
    from fleet_tui.core.states import StopReason
    from fleet_tui.execution.worker.attemptlog import AttemptLog
    from fleet_tui.execution.worker.spec import RunSpec
    from fleet_tui.settings.config import Settings
    from fleet_tui.vcs.git import UpdateResult, WorktreeInfo

RunnerState = Literal["alive", "dead", "never"]


class NotStarted(Exception):
    """A start that must not happen (killed or taken over meanwhile, or a runner of the
    attempt lives already): nothing to mark, nothing spawned."""


@dataclass(frozen=True)
class Placement:
    """Where one attempt runs. Recorded in the store (attempts.host, attempts.placement)
    before its runner starts; `attempt_dir` is on this machine for every host."""

    host: str
    worktree: Path  # on the host
    branch: str
    base_commit: str
    base_branch: str | None
    config_dir: Path  # on the host
    attempt_dir: Path  # here: the attempt folder (a remote host mirrors into it)

    def to_record(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}


class Staged(Protocol):
    """An attempt whose lock is held and whose spec is written; nothing runs yet. Exactly
    one of `spawn` or `abandon` is called."""

    def spawn(self, env: dict[str, str]) -> int:
        """Start the runner detached; return its pid (on its host)."""

    def abandon(self) -> None:
        """Let go of the lock: the start did not happen."""


class Run(Protocol):
    """One attempt on its host."""

    @property
    def log(self) -> AttemptLog:
        """The attempt folder on this machine (what the follower and the panel read)."""

    def state(self) -> RunnerState:
        """"alive": its runner lives; "dead": it ran and is gone; "never": no runner was
        ever started for it."""

    def identity(self) -> tuple[int | None, str | None]:
        """The runner's pid and start time on its host (the engine's launch record, or the
        runner's own for a runner whose engine died before recording it)."""

    def request_stop(self, reason: StopReason, message: str, *, at: float, by: str) -> None:
        """Record why, then ask the runner to stop (it passes the request on to claude and
        everything it started, and kills them after the kill grace by itself)."""

    def kill(self) -> None:
        """End the runner and everything the attempt started, now."""

    def sweep(self) -> int:
        """Stop what the attempt started that outlived its runner (found by its token);
        return how many processes there were."""

    def wait_gone(self, timeout: float) -> bool:
        """Wait until the runner is gone; False when it still lives after `timeout`."""

    def send_input(self, text: str, *, by: str = "") -> str:
        """Queue a message for the worker; return its id (InputClosed: no more input)."""


class LostLedger(Protocol):
    """Where a host keeps the attempts it lost until what they started there is swept
    (the engine's store), so that a restarted engine still sweeps them."""

    def lost(self, host: str, task_id: str, attempt: int, reason: str) -> None:
        """The host lost this attempt (silent past its lease)."""

    def swept(self, host: str, task_id: str, attempt: int, processes: int) -> None:
        """What the lost attempt started on the host was stopped."""

    def to_sweep(self, host: str) -> list[tuple[str, int, str]]:
        """(task, attempt, reason) of the host's lost attempts not swept yet."""


class RemoteWorktrees(Protocol):
    """The worktrees of a host that are not folders of this machine (an SSH host). The
    engine never opens such a path: it asks the host, and diffs, tests, merges and pushes
    what `snapshot` and `Host.collect` brought into the main repository."""

    def has_worktree(self, task: Task) -> bool:
        """The task's worktree is there, on the host."""

    def snapshot(self, task: Task) -> str:
        """The task's work as it is now (its commits and its uncommitted files) as a
        commit of the main repository (`refs/fleet/snapshot/<id>`), the worktree left
        exactly as it is; the task's branch is fetched with it. Cheap: one command there
        and one fetch of what is new."""

    def update_worktree(self, task: Task, *, base_commit: str, base_branch: str,
                        strategy: str, message: str) -> UpdateResult:
        """Bring the host's worktree up to date with `base_commit` (the base branch's tip
        here, sent there), merge or rebase, the worker's uncommitted work committed first;
        on conflicts the worktree is left mid-merge there (its worker resolves them). An
        update stopped on conflicts is concluded once they are resolved."""

    def abort_update(self, task: Task) -> str:
        """The update stopped on conflicts undone in the host's worktree; what was done."""

    def read_file(self, task: Task, path: str) -> bytes | None:
        """A file of the task's work as last fetched (`snapshot`); None: not there."""

    def session_problem(self, task: Task) -> str | None:
        """Why a resume or a follow-up of the task cannot run there (its session is gone
        with the machine that held it), in a sentence with the way out; None: it can."""


class Host(Protocol):
    """Where attempts run."""

    name: str

    def free_port(self) -> int:
        """A TCP port nothing listens on now, on the host (for FLEET_PORT)."""

    def check_setup(self, settings: Settings, env: Mapping[str, str], *,
                    args: Sequence[str] = (), permission_mode: str | None = None) -> None:
        """Refuse (a FleetTuiError with its exit code) a setup the host's claude would
        refuse or could not keep (the local host: root with bypassPermissions without the
        sandbox opt-in, scrub_tool_env without bubblewrap), before anything is created."""

    def make_worktree(self, task: Task, *, reattach: bool, reset: bool) -> WorktreeInfo:
        """The task's worktree at its base commit on the branch `fleet/<id>` (checked out
        again as it is when `reattach`; removed and made fresh when `reset`)."""

    def remote_worktrees(self) -> RemoteWorktrees | None:
        """None: a task's worktree is a folder of this machine (the engine reads it
        there); else the host's own way to read and change it."""

    def check_worktree(self, task: Task, worktree: Path) -> None:
        """Refuse (FleetError, GitError) unless `worktree` is the task's own checkout on
        its branch: a worker never runs in the main checkout, whatever happened."""

    def place(self, task: Task, worktree: Path, attempt_n: int) -> Placement:
        """The placement of attempt `attempt_n` in `worktree`: the task's config dir and
        the attempt folder made (private to the user)."""

    def stage(self, placement: Placement, spec: RunSpec) -> Staged:
        """Take the attempt's lock and write its spec (NotStarted when a runner of the
        attempt holds the lock: following adopts it)."""

    def attach(self, attempt: Attempt) -> Run:
        """The attempt's run, whoever started it."""

    def collect(self, task: Task) -> str:
        """The branch of the main repository that holds the task's commits, brought there
        if they were made elsewhere (before a merge, an update or a push)."""

    def release(self, task_id: str) -> None:
        """Free what the task's placements hold on the host once the task is closed
        (merged or discarded): its config dir (the worktree goes with git's merge or
        discard)."""

    def keep_lost_in(self, ledger: LostLedger) -> None:
        """Record the attempts this host loses in `ledger`, and sweep those it holds
        already (an engine before this one lost them). A host that never loses an attempt
        (this machine) records nothing."""

    def reap(self) -> None:
        """Collect the exit status of runners this host started that have ended."""

    def wait(self, stop: threading.Event, interval: float) -> None:
        """Sleep up to `interval`; return early when `stop` is set or a runner this host
        started has ended."""

    def runner_env(self) -> dict[str, str]:
        """The environment a detached process of this host starts with (the package
        importable), before the key variables are taken out."""


__all__ = ["Host", "LostLedger", "NotStarted", "Placement", "RemoteWorktrees", "Run", "RunnerState",
           "Staged"]
