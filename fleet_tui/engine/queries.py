"""What the engine tells without changing anything: task lists, a task and its attempts,
counts and the endpoints' limits (the panel's status line), and an attempt's events."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_tui.core import policy, stream
from fleet_tui.core.model import Attempt, Task
from fleet_tui.core.states import ACTIVE_STATES, TaskState
from fleet_tui.engine.context import Context, Part
from fleet_tui.engine.follower import attempt_finished
from fleet_tui.engine.secret_cache import SecretCache
from fleet_tui.execution.worker.attemptlog import AttemptLog
from fleet_tui.settings import endpoints
from fleet_tui.settings.hosts import LOCAL
from fleet_tui.store import budgets
from fleet_tui.store.costs import Ledger
from fleet_tui.store.meter import Totals

__all__ = ["EndpointStatus", "FleetStatus", "Queries"]


@dataclass
class EndpointStatus:
    """One endpoint's limits as the panel's status line shows them."""

    endpoint: str
    cap: int  # the effective cap
    max_workers: int  # the configured one
    parked_until: float | None = None
    park_reason: str | None = None
    held: str | None = None
    held_task: str | None = None
    held_reason: str | None = None  # short: "account in arrears, code 1113"
    cap_reason: str | None = None  # why the cap is lowered
    note: str | None = None  # policy.endpoint_note: the whole sentence
    event: str | None = None  # the latest event (park, hold, cap) and when it began:
    event_at: float | None = None  # the panel notifies once per event
    budget: bool = False  # held for its day's budget (lifts by itself at midnight)


@dataclass
class FleetStatus:
    running: int
    queued: int
    waiting: int
    cap: int
    cooldown_until: float | None
    total_tokens: int
    endpoints: list[EndpointStatus] = field(default_factory=list)
    # the meter: the listed tasks' totals (those with metered requests), and
    # each endpoint's spend since the local day began (those that spent some), by name
    costs: dict[str, Totals] = field(default_factory=dict)
    spent_today: dict[str, float] = field(default_factory=dict)
    # the gateway's line: requests of each task waiting for a request slot
    slot_waits: dict[str, int] = field(default_factory=dict)
    # why the queued tasks of a host wait, by host ("waiting: host box at its 2
    # workers"), for the hosts at their max_workers with tasks queued for them
    host_waits: dict[str, str] = field(default_factory=dict)
    # the tasks whose latest attempt ran (or runs) without the cage, as `ls` marks them
    uncaged: frozenset[str] = frozenset()


class Queries(Part):
    """Reads of the store and of attempt folders (the key known first: redaction)."""

    def __init__(self, ctx: Context, secrets: SecretCache) -> None:
        super().__init__(ctx)
        self.secrets = secrets
        self._ledger: Ledger | None = None
        self._ledger_lock = threading.Lock()
        # (task, attempt number) -> ran caged: settled once the attempt has started
        self._caged: dict[tuple[str, int], bool] = {}

    def attempt_log(self, attempt: Attempt) -> AttemptLog | None:
        """The attempt's folder as its host left it on this machine (the one format every
        host leaves: a remote host mirrors into it), for the panel's and the CLI's reads;
        None for an attempt that was never placed. The key is known first (redaction)."""
        if attempt.dir is None:
            return None
        self.secrets.get()
        return self.supervisor.run(attempt).log

    @property
    def ingested_events(self) -> int:
        """Events folded in from events files so far (for the panel and benchmarks)."""
        return self.follower.ingested_events

    @property
    def ingested_bytes(self) -> int:
        """Bytes of events files folded in so far."""
        return self.follower.ingested_bytes

    def list_tasks(self, repo: Path | None = None, *, archived: bool | None = False
                   ) -> list[Task]:
        """Tasks, newest first (of one repository); archived ones only when asked."""
        return self.store.list_tasks(Path(repo).resolve() if repo is not None else None,
                                     archived=archived)

    def recent_repos(self, limit: int = 10) -> list[Path]:
        """Repositories by their newest task (what the panel offers for a new task)."""
        return self.store.recent_repos(limit)

    def attempts(self, task_id: str) -> list[Attempt]:
        return self.store.list_attempts(self.get_task(task_id).id)

    def status(self, tasks: list[Task] | None = None) -> FleetStatus:
        """Counts, tokens and the cooldown over every task. ``tasks``: a full task list the
        caller has just read (the panel polls it anyway), so the store is not read twice."""
        if tasks is None:
            tasks = self.store.list_tasks()
        now = self.clock()
        cooldowns = [policy.cooldown_until(ep, tasks, now) for ep in {t.endpoint for t in tasks}]
        until = max((c for c in cooldowns if c is not None), default=None)
        return FleetStatus(
            running=sum(1 for t in tasks if t.state in ACTIVE_STATES),
            queued=sum(1 for t in tasks if t.state == TaskState.QUEUED),
            waiting=sum(1 for t in tasks if t.state == TaskState.WAITING),
            # every endpoint has a cap of its own: their sum is the fleet's (one endpoint:
            # the top-level max_workers)
            cap=sum(self.settings.for_endpoint(n).max_workers
                    for n in self.settings.endpoint_names), cooldown_until=until,
            total_tokens=sum(t.input_tokens + t.output_tokens for t in tasks),
            endpoints=self.endpoint_status(now), slot_waits=self.slot_waits(),
            host_waits=self.host_waits(tasks), uncaged=self.uncaged(tasks),
            **self._metered(tasks, now))

    def uncaged(self, tasks: list[Task]) -> frozenset[str]:
        """The tasks whose latest attempt ran without the cage: its folder holds no
        cage.json (written when a caged worker starts). A caged answer is kept; an
        uncaged one is read again while the task runs (its runner may not have written it
        yet), so only the running tasks cost a read each time."""
        out: set[str] = set()
        for task in tasks:
            if task.state == TaskState.QUEUED or task.attempt_count <= 0:
                continue
            key = (task.id, task.attempt_count)
            caged = self._caged.get(key)
            if caged is None:
                attempt = self.store.latest_attempt(task.id)
                log = self.attempt_log(attempt) if attempt is not None else None
                if log is None or not log.dir.is_dir():
                    continue
                caged = log.cage_policy.exists()
                if caged or task.state not in ACTIVE_STATES:
                    self._caged[key] = caged
            if not caged:
                out.add(task.id)
        return frozenset(out)

    def host_waits(self, tasks: list[Task] | None = None) -> dict[str, str]:
        """Why the queued tasks of a host (of config.toml: this machine's cap is the
        endpoints') do not start: the host runs its max_workers already."""
        if tasks is None:
            tasks = self.store.list_tasks()
        caps = {h.name: h.max_workers for h in self.settings.all_hosts if h.name != LOCAL}
        out: dict[str, str] = {}
        for name, cap in caps.items():
            mine = [t for t in tasks if t.host == name]
            if not any(t.state == TaskState.QUEUED for t in mine):
                continue
            running = sum(1 for t in mine if t.state in ACTIVE_STATES)
            if running >= cap:
                out[name] = f"waiting: host {name} at its {cap} worker{'s' * (cap != 1)}"
        return out

    def slot_waits(self) -> dict[str, int]:
        """The requests of each task that wait for a request slot at the gateway, from the
        status it writes (a small file; {} with the gateway off or not running)."""
        if not self.settings.gateway:
            return {}
        from fleet_tui.gateway import control

        try:
            status = control.read_status(self.env, Path(self.store.path)) or {}
        except (OSError, ValueError):
            return {}
        waits: dict[str, int] = {}
        for state in dict(status.get("endpoints") or {}).values():
            for task_id, count in dict(dict(state).get("waiting_tasks") or {}).items():
                if isinstance(count, int) and count > 0:
                    waits[str(task_id)] = waits.get(str(task_id), 0) + count
        return waits

    def _metered(self, tasks: list[Task], now: float) -> dict[str, Any]:
        """The listed tasks' costs and today's spend per endpoint, from the ledger (one
        query a refresh: the rows recorded since the last one)."""
        with self._ledger_lock:
            if self._ledger is None or self._ledger.store is not self.store:
                self._ledger = Ledger(self.store)
            ledger = self._ledger
            ledger.refresh(now)
            costs = {t.id: ledger.tasks[t.id] for t in tasks if t.id in ledger.tasks}
            today: dict[str, float] = {}
            for endpoint, spent in ledger.today.items():
                found = budgets.endpoint_settings(self.settings, endpoint)
                name = found.name if found is not None else endpoint
                today[name] = today.get(name, 0.0) + spent
        return {"costs": costs, "spent_today": {k: v for k, v in today.items() if v > 0}}

    def costs(self, task_ids: list[str]) -> dict[str, Totals]:
        """The meter summed for these tasks (those with metered requests)."""
        from fleet_tui.store.costs import totals

        return totals(self.store, by="task", task_ids=task_ids)

    def endpoint_status(self, now: float | None = None) -> list[EndpointStatus]:
        """The limits of every endpoint that has some (parked, held, a lowered cap)."""
        now = self.clock() if now is None else now
        out: list[EndpointStatus] = []
        for state in self.store.list_endpoints():
            settings = self.settings.for_endpoint(state.endpoint)
            note = policy.endpoint_note(state, settings, now)
            if note is None and state.event is None:
                continue
            out.append(EndpointStatus(
                endpoint=state.endpoint, cap=policy.effective_cap(state, settings),
                max_workers=settings.max_workers, parked_until=state.parked_until,
                park_reason=state.park_reason, held=state.held, held_task=state.held_task,
                held_reason=policy.held_reason(state.held), cap_reason=state.cap_reason,
                note=note, event=state.event, event_at=state.event_at,
                budget=policy.budget_held(state)))
        return out

    def _endpoint(self, endpoint: str | None) -> str:
        """The store's name of an endpoint: a task's (a name), a name or a base URL given
        (endpoints.name_of), None: the default."""
        return endpoints.name_of(self.settings.endpoints, endpoint) \
            if endpoint is None or "://" in endpoint else endpoint

    def cooldown_until(self, endpoint: str | None = None) -> float | None:
        """When the endpoint's 429 cooldown ends (None: no cooldown)."""
        ep = self._endpoint(endpoint)
        return policy.cooldown_until(ep, self.store.list_tasks(endpoint=ep), self.clock())

    def why_waiting(self, endpoint: str | None = None) -> str | None:
        """Why no task starts on an endpoint now and will not until a time or the user
        (held, or parked until a reset), or None: the CLI stops waiting for a start then."""
        ep = self._endpoint(endpoint)
        state = self.store.get_endpoint(ep)
        settings = self.settings.for_endpoint(ep)
        gate = policy.gate(state, settings, self.clock(), parked=1,
                           settings_now=policy.settings_key(settings))
        return None if gate.cap is not None or gate.why is None \
            or gate.why.startswith("resuming") else gate.why

    def endpoint_note(self, endpoint: str | None = None) -> str | None:
        """What to know of an endpoint's limits now (held, parked, resuming, its cap
        lowered), or None (`fleet-tui ls` and `show` print it)."""
        ep = self._endpoint(endpoint)
        return policy.endpoint_note(self.store.get_endpoint(ep),
                                    self.settings.for_endpoint(ep), self.clock())

    @staticmethod
    def attempt_finished(attempt: Attempt) -> bool:
        """The attempt has ended (closed in the store, or its exit record is written)."""
        return attempt_finished(attempt)

    def read_events(self, attempt: Attempt, offset: int = 0, max_bytes: int | None = None
                    ) -> tuple[list[stream.Event], int]:
        """Parsed events of the attempt from `offset` (a byte offset at a line start) and
        the offset to continue from, at most about `max_bytes` (a longer line is read
        whole). Works the same for running and finished attempts; a last line without
        newline is only returned once the attempt has finished (attemptlog's rule). The
        API key, where the worker said it, reads as redaction.MARK."""
        self.secrets.get()
        return self.follower.read_events(attempt, offset, max_bytes)

    async def follow_events(self, attempt: Attempt, offset: int = 0, *,
                            poll: float = 0.2) -> AsyncIterator[stream.Event]:
        """Yield events as they are written, until the attempt has finished."""
        import asyncio  # here: the CLI never pays for it

        while True:
            fresh = self.store.get_attempt(attempt.id)
            done = self.attempt_finished(fresh)
            events, offset = await asyncio.to_thread(self.read_events, fresh, offset)
            for ev in events:
                yield ev
            if done and not events:
                return
            await asyncio.sleep(poll)
