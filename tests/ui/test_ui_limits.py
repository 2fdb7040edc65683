"""The panel and the endpoint's limits: the status line shows a hold, a park and the
effective cap; each endpoint event is one notification, however many tasks it concerns.

No claude: the scheduler is off; the endpoint's events are made as the engine makes them
(policy.apply_effect through store.change_endpoint) on a real store, and the panel polls
it as it always does. tests/engine/test_limits.py makes the same events with the real claude.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from test_ui_marks import SIZE, listed, make_app, submit
from test_ui_support import wait_until

from fleet_tui.core import policy
from fleet_tui.core.states import TaskState, Verdict
from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.ui.widgets.status_line import StatusLine

ARREARS = ("z.ai (429): Your account is in arrears, please recharge and try again "
           "(account in arrears, code 1113) — recharge the account")


def status_text(app: Any) -> str:
    return str(app.main.query_one(StatusLine).render())


def effect(fleet: Fleet, endpoint: str, what: policy.Effect) -> None:
    """What the follower does when an attempt ends with this effect."""
    now = time.time()
    fleet.store.change_endpoint(
        endpoint, lambda state: policy.apply_effect(state, what, fleet.settings, now), now)


async def test_a_hold_a_park_and_a_lowered_cap_are_shown_and_said_once(
        git_repo: Path) -> None:
    fleet = Fleet(load_settings())
    ids = submit(fleet, git_repo, 3)
    endpoint = "default"  # the store names a task's endpoint
    app = make_app(fleet, git_repo)
    async with app.run_test(size=SIZE) as pilot:
        def said() -> list[tuple[str, str]]:
            return [(title, message) for _, title, message in app.toasts]

        await listed(pilot, app, ids)
        assert "held" not in status_text(app) and "cap 4" in status_text(app)

        # the first task met an account error: it fails, the endpoint is held
        effect(fleet, endpoint, policy.Effect("hold", reason=ARREARS, task=ids[0],
                                              settings=policy.settings_key(fleet.settings)))
        fleet.store.update_task(ids[0], state=TaskState.FAILED, verdict=Verdict.ACCOUNT,
                                message=ARREARS, finished_at=time.time())
        await wait_until(pilot, lambda: "held: account in arrears, code 1113"
                         in status_text(app), what="the hold in the status line")
        await pilot.pause(0.5)  # more polls: nothing is said twice
        assert [title for title, _ in said()] == ["Endpoint held"]  # not "failed" as well
        assert said()[0][1] == (f"task {ids[0]} failed: {ARREARS}\n2 tasks held until you "
                              f"retry {ids[0]} or change the settings.")

        # lifted; then the endpoint parks for a usage window and its cap is lowered
        fleet.store.change_endpoint(endpoint, lambda state: {"held": None})
        until = time.time() + 3600
        effect(fleet, endpoint, policy.Effect("park", until=until,
                                              reason="5-hour window, code 1308"))
        clock = time.strftime("%H:%M", time.localtime(until))
        await wait_until(pilot, lambda: f"parked until {clock} (5-hour window, code 1308), "
                         "resumes then" in status_text(app), what="the park")
        effect(fleet, endpoint, policy.Effect("cap", cap=2, reason="too many requests at "
                                                                  "once, code 1302"))
        await wait_until(pilot, lambda: "cap 2/4" in status_text(app),
                         what="the effective cap")
        await pilot.pause(0.5)
        assert [title for title, _ in said()] == ["Endpoint held", "Endpoint parked",
                                                  "Endpoint concurrency limit"]
        assert said()[1][1] == (f"parked until {clock} (5-hour window, code 1308), resumes "
                              "then; 2 tasks wait for it.")
        assert said()[2][1] == ("cap 2/4 (too many requests at once, code 1302): fewer "
                              "workers at once until the endpoint takes more.")
        assert "cap 2/4" in status_text(app)
