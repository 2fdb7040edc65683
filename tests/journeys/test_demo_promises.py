"""The demo keeps the README's promises, with the real claude against the demo's own
scripts: the stock task waits for the user's message (and says how long) and answers it;
a review sent to a demo worker changes the commented lines, so the review shows them
**addressed**; and the README's key for reaching the stream is the panel's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from endpoint_helpers import cli_env, poll_pauses, run_cli
from landing_support import drive, make_fleet, settled
from test_ui_support import rig  # noqa: F401  (the panel tests' fixture)

from fleet_tui.demo import session as demo
from fleet_tui.demo.endpoint import ScriptedEndpoint, user_message_after_prompt
from fleet_tui.store.db import TaskSpec, TaskState

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return demo.create_project(tmp_path / "inventory")


def test_a_message_of_the_users_is_found_after_the_prompt() -> None:
    prompt = {"role": "user", "content": [{"type": "text", "text": "<system-reminder>x"},
                                           {"type": "text", "text": "the prompt"}]}
    tool = {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "B",
                                              "input": {}}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                           "content": "out"}]}
    assert user_message_after_prompt({"messages": [prompt, tool, result]}) is None
    said = {"role": "user", "content": [{"type": "text", "text": "use a set\nplease"}]}
    assert user_message_after_prompt(
        {"messages": [prompt, tool, result, tool, {**result}, said]}) == (2, "use a set")
    relayed = {"role": "system", "content": "The user sent a new message while you were "
                                            "working: keep it short"}
    note = {"role": "system", "content": "Available agent types for the Agent tool: ..."}
    assert user_message_after_prompt({"messages": [prompt, note, tool, result]}) is None
    assert user_message_after_prompt({"messages": [prompt, note, tool, relayed]}) == \
        (1, "keep it short")


@pytest.mark.real_claude
@pytest.mark.long
def test_the_stock_task_waits_for_the_users_message(project: Path, claude_bin: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # a third of the demo's pace: each wait is 3 s here (10 s in the demo)
    monkeypatch.setenv("FLEET_ENDPOINT_PACE", "0.3")
    prompt = dict((t, p) for t, p in demo.DEMO_TASKS)[
        "Refuse to remove more stock than there is"]
    with ScriptedEndpoint(demo.demo_scripts()) as endpoint:
        fleet = make_fleet(endpoint, claude_bin)
        (task,) = fleet.submit(TaskSpec(prompt=prompt, title="stock", repo=project))

        def waiting() -> bool:
            return bool(fleet.attempts(task.id)) and fleet.attempts(task.id)[-1].dir \
                is not None and "waiting for your message (press s): " in _events(fleet, task.id)

        drive(fleet, waiting, timeout=120, what="the worker to wait for a message")
        events = _events(fleet, task.id)
        assert "I wait up to 90 s" in events and "waiting for your message (press s): " in events
        assert re.search(r"waiting for your message \(press s\): \d+ s more", events), events
        assert fleet.say(task.id, "keep the error message short")
        drive(fleet, settled(fleet, task.id), timeout=180, what="the stock task")
        done = fleet.get_task(task.id)
        assert done.state == TaskState.SUCCEEDED, done.message
        events = _events(fleet, task.id)
        assert "You said: keep the error message short. Noted" in events
        # it went on once it had the message: fewer waits than the 9 it plays without one
        assert 1 <= events.count('"first_line": "waiting for your message') < 9
        worktree = done.worktree
        assert worktree is not None and "ValueError" in (worktree / "inventory.py").read_text()


def _events(fleet: Any, task_id: str) -> str:
    attempt = fleet.attempts(task_id)[-1]
    events, _ = fleet.read_events(attempt, 0)
    return "\n".join(json.dumps(ev.to_dict()) for ev in events)


@pytest.mark.real_claude
def test_a_review_sent_to_a_demo_worker_is_addressed(project: Path, claude_bin: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_ENDPOINT_PACE", "0")
    prompt = dict(demo.DEMO_TASKS)["Make the greeting formal"]
    with ScriptedEndpoint(demo.demo_scripts()) as endpoint:
        env = cli_env(endpoint.url, claude_bin, "sk-demo-review-SECRET-0b9e")
        out = run_cli(env, project, "run", prompt, "--title", "formal", "--wait")
        assert out.returncode == 0, out.stderr
        task_id = out.stdout.split()[0]
        worktree = Path(json.loads(run_cli(env, project, "show", task_id, "--json").stdout)
                        ["worktree"])
        line = next(n for n, text in enumerate(
            (worktree / "greeting.py").read_text().splitlines(), 1)
            if text.startswith("GREETING"))
        out = run_cli(env, project, "review", task_id, "--comment", f"greeting.py:{line}",
                      "shorter, please")
        assert out.returncode == 0, out.stderr
        out = run_cli(env, project, "review", task_id, "--send")
        assert out.returncode == 0, out.stderr
        fleet_done = _wait_finished(env, project, task_id)
        assert fleet_done["state"] == "succeeded", fleet_done
        comments = json.loads(run_cli(env, project, "review", task_id, "--json").stdout)
        assert [c["state"] for c in comments] == ["addressed"], comments
        text = (worktree / "greeting.py").read_text()
        assert "# changed after the review" in text


def _wait_finished(env: dict[str, str], repo: Path, task_id: str) -> dict[str, Any]:
    import time

    deadline = time.monotonic() + 120
    pauses = poll_pauses()
    while True:
        out = run_cli(env, repo, "show", task_id, "--json")
        task: dict[str, Any] = json.loads(out.stdout)
        if task["state"] not in ("queued", "running", "starting", "retrying") \
                and len(task["attempts"]) >= 2:
            return task
        assert time.monotonic() < deadline, task
        time.sleep(next(pauses))


@pytest.mark.real_claude
async def test_the_readmes_tabs_reach_the_stream(rig: Any) -> None:  # noqa: F811
    """The README says how many `tab`s take the keys from the list into the stream, where
    `x` / `enter` open a tool call: that many do, in the panel."""
    from test_ui_support import wait_until

    from fleet_tui.ui.widgets.stream_view import StreamView

    readme = (ROOT / "README.md").read_text()
    said = re.search(r"in the stream \(`tab` (twice|once)? ?moves there", readme)
    assert said is not None, "the README's demo paragraph no longer says it"
    presses = 2 if said.group(1) == "twice" else 1
    task_id = rig.submit("write a file")
    app = rig.app()
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: rig.state(task_id) == TaskState.SUCCEEDED
                         and app.main.task_list.selected_id == task_id, what="the task", timeout=90)
        await wait_until(pilot, lambda: app.main.query_one(StreamView).row_count() > 3,
                         what="its stream")
        for _ in range(presses - 1):
            await pilot.press("tab")
            assert not isinstance(app.focused, StreamView)
        await pilot.press("tab")
        await wait_until(pilot, lambda: isinstance(app.focused, StreamView),
                         what="the stream focused")


async def test_titles_keep_their_room_at_80_columns_with_a_cost(tmp_path: Path) -> None:
    """At 80 columns with the cost column shown (the demo's workers go through the
    gateway's meter) the demo's titles were cut to 16 characters: the tokens column gives
    way, and "Make the greeting casual" is whole."""
    from textual.app import App, ComposeResult

    from fleet_tui.store.db import Task
    from fleet_tui.store.meter import Totals
    from fleet_tui.ui.widgets.task_table import TaskTable

    class One(App[None]):
        def compose(self) -> ComposeResult:
            yield TaskTable(id="tasks")

    tasks = [Task(id=f"t{i}aaaa", prompt="p", repo=tmp_path, title=title,
                  state=TaskState.RUNNING)
             for i, (title, _) in enumerate(demo.DEMO_TASKS)]
    app = One()
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.query_one(TaskTable)
        table.show(tasks, set(), 0.0, {t.id: Totals(requests=3, cost=0.02) for t in tasks})
        await pilot.pause(0.1)
        assert table.shows_cost
        title_width, _ = table._widths()
        assert title_width >= len("Make the greeting casual"), title_width
        keys = [key for _, key, _, _ in table._layout()]
        assert "cost" in keys and "tokens" not in keys
    app = One()
    async with app.run_test(size=(160, 24)) as pilot:  # wide: the tokens stay
        table = app.query_one(TaskTable)
        table.show(tasks, set(), 0.0, {t.id: Totals(requests=3, cost=0.02) for t in tasks})
        await pilot.pause(0.1)
        assert "tokens" in [key for _, key, _, _ in table._layout()]
