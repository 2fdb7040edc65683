"""One fleet-tui engine in a process of its own, for the tests that need a real engine
process to die (SIGKILL) at a chosen point, or a second engine process beside the test's.

Not a stand-in: the real Fleet, store, git, runner and claude. The only addition is the
crash point: the process SIGKILLs itself right after one named step, which is the moment
a real `kill -9` (or a power cut) would have to hit by luck.

usage: python engine_child.py CONFIG.json
CONFIG (JSON): settings (load_settings overrides), env (the engine's environment), db (the
store path), die_at (null, "after-claim", "after-worktree": made but not recorded,
"after-record-launch": the attempt folder is recorded, no runner yet, or
"after-runner-spawn"), until_settled (task
ids: run the scheduler until every one has finished, then exit 0), start_grace (seconds,
instead of supervisor.START_GRACE: how often the heartbeat of a slow start beats), ssh_host
(SshHost's arguments but env: the engine's host, as tests/ssh_support.host_config gives
them), linger_until (a path: once the tasks have finished, go on running until it exists,
so the host can sweep what its lost attempts left).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _report(path: str, fleet: Any) -> None:
    status = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmHWM", "VmRSS"):
            status[name] = int(value.split()[0])
    Path(path).write_text(json.dumps({
        "vm_hwm_kib": status.get("VmHWM"), "vm_rss_kib": status.get("VmRSS"),
        "ingested_events": getattr(fleet, "ingested_events", None),
        "ingested_bytes": getattr(fleet, "ingested_bytes", None)}))


def main() -> int:
    config = json.loads(Path(sys.argv[1]).read_text())
    from fleet_tui.engine import supervisor as supervisor_mod
    from fleet_tui.engine.fleet import Fleet
    from fleet_tui.settings.config import load_settings
    from fleet_tui.store.db import FINISHED_STATES, Store

    if config.get("start_grace") is not None:
        supervisor_mod.START_GRACE = float(config["start_grace"])
    die_at = config.get("die_at")
    if die_at == "after-claim":
        # the engine claims through claim_gated (claim_next inside the endpoint's limits, in
        # one transaction): die once that transaction has committed a claim
        real_claim = Store.claim_gated

        def claim_then_die(self: Store, *args: Any, **kwargs: Any) -> Any:
            task = real_claim(self, *args, **kwargs)
            if task is not None:
                _die()
            return task

        Store.claim_gated = claim_then_die  # type: ignore[method-assign]
    elif die_at == "after-worktree":
        from fleet_tui.vcs import git as fleet_git

        real_create = fleet_git.create_worktree

        def create_then_die(*args: Any, **kwargs: Any) -> Any:
            real_create(*args, **kwargs)
            _die()

        fleet_git.create_worktree = create_then_die
    elif die_at == "after-record-launch":
        real_record = Store.record_launch

        def record_then_die(self: Store, *args: Any, **kwargs: Any) -> Any:
            if real_record(self, *args, **kwargs):
                _die()
            return False

        Store.record_launch = record_then_die  # type: ignore[method-assign]
    elif die_at == "after-runner-spawn":
        real_popen = subprocess.Popen

        class PopenThenDie(real_popen):  # type: ignore[misc, valid-type]
            def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
                super().__init__(args, *rest, **kwargs)
                if "fleet_tui.execution.worker.runner" in list(args):
                    _die()

        subprocess.Popen = PopenThenDie  # type: ignore[misc]

    settings = load_settings(env=config["env"], overrides=config["settings"])
    host = None
    if config.get("ssh_host"):
        from fleet_tui.execution.ssh.host import SshHost

        host = SshHost(env=config["env"], **config["ssh_host"])
    fleet = Fleet(settings, Store(config["db"]), env=config["env"],
                  **({"host": host} if host is not None else {}))
    ids = list(config.get("until_settled") or [])
    if not ids:
        fleet.tick()
        return 0
    stop = threading.Event()
    loop = threading.Thread(target=fleet.run, args=(stop,), kwargs={"interval": 0.05})
    loop.start()
    try:
        deadline = time.monotonic() + float(config.get("timeout", 240))
        while time.monotonic() < deadline:
            if all(fleet.get_task(i).state in FINISHED_STATES for i in ids):
                linger = config.get("linger_until")
                while linger and not Path(linger).exists():
                    if time.monotonic() > deadline:
                        return 3
                    time.sleep(0.1)
                return 0
            time.sleep(0.1)
        return 3
    finally:
        stop.set()
        loop.join(timeout=30)
        if config.get("report"):
            _report(config["report"], fleet)


if __name__ == "__main__":
    raise SystemExit(main())
