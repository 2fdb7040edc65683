"""Several hosts: `[hosts.NAME]` settings, a task's host chosen at
submit (`local`, a name, or `any`: placed by its first claim), each host's max_workers
obeyed by the claim, and a task's attempts, resumes and follow-ups kept on its host.

Two in-memory hosts stand for `local` and `b` (no process, no claude); a real git
repository and the engine's real SQLite store. The ssh host's code is not in this build:
a host of config.toml with `ssh = ...` says so, for that host only.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from fleet_tui.core.errors import FleetError, InvalidSpec
from fleet_tui.core.states import TaskState
from fleet_tui.engine.fleet import Fleet
from fleet_tui.execution import hosts as hosts_mod
from fleet_tui.execution.memory import MemoryHost, MemoryRun
from fleet_tui.execution.ssh.config import options as ssh_options
from fleet_tui.execution.ssh.config import parse_target, ssh_args, ssh_host
from fleet_tui.settings.config import ConfigError, load_settings
from fleet_tui.settings.hosts import HostConfig, add_host, remove_host
from fleet_tui.store.db import Store, TaskSpec
from fleet_tui.system import paths

KEY = "sk-hosts-key"


def config(tmp_path: Path, text: str = "") -> Path:
    path = tmp_path / "config.toml"
    path.write_text('max_workers = 8\n\n[hosts.local]\nmax_workers = 2\n\n'
                    '[hosts.b]\nssh = "b.example"\nmax_workers = 1\n' + text, encoding="utf-8")
    return path


def make(tmp_path: Path, extra: str = "", **overrides: Any
         ) -> tuple[Fleet, MemoryHost, MemoryHost]:
    values: dict[str, Any] = {"key_sources": "env", "max_attempts": 1,
                              "backoff_base": 0.01, "kill_grace": 0.5}
    values.update(overrides)
    settings = load_settings(env=os.environ, config_file=config(tmp_path, extra),
                             overrides=values)
    here = MemoryHost(tmp_path / "host-local", name="local")
    there = MemoryHost(tmp_path / "host-b", name="b")
    env = dict(os.environ, ANTHROPIC_AUTH_TOKEN=KEY)
    fleet = Fleet(settings, Store(paths.db_path()), env=env, host=here, hosts={"b": there})
    return fleet, here, there


def submit(fleet: Fleet, repo: Path, host: str | None, n: int = 1) -> list[str]:
    return [t.id for t in fleet.submit(TaskSpec(prompt="work", repo=repo, host=host),
                                       copies=n)]


def one(host: MemoryHost, task_id: str) -> MemoryRun:
    runs = host.runs_of(task_id)
    assert len(runs) == 1, runs
    return runs[0]


def test_a_task_runs_on_the_host_it_was_given(git_repo: Path, tmp_path: Path) -> None:
    fleet, here, there = make(tmp_path)
    (on_b,) = submit(fleet, git_repo, "b")
    (on_local,) = submit(fleet, git_repo, None)
    fleet.tick()
    assert one(there, on_b).alive and not here.runs_of(on_b)
    assert one(here, on_local).alive and not there.runs_of(on_local)
    assert fleet.get_task(on_b).host == "b" and fleet.get_task(on_local).host == "local"
    (attempt,) = fleet.attempts(on_b)
    assert attempt.host == "b"
    # kill reaches the run on its own host
    fleet.kill(on_b)
    assert not one(there, on_b).alive and one(here, on_local).alive
    assert fleet.get_task(on_b).state == TaskState.KILLED


def test_each_host_keeps_to_its_max_workers(git_repo: Path, tmp_path: Path) -> None:
    fleet, here, there = make(tmp_path)
    on_b = submit(fleet, git_repo, "b", 3)
    on_local = submit(fleet, git_repo, "local", 3)
    fleet.tick()
    assert len(there.live()) == 1  # b: max_workers = 1
    assert len(here.live()) == 2  # local: [hosts.local] max_workers = 2
    states = {t: fleet.get_task(t).state for t in on_b + on_local}
    assert sum(s == TaskState.QUEUED for s in states.values()) == 3
    # b's slot frees: the next task of b starts there, and only there
    first = there.live()[0]
    first.finish()
    fleet.tick()
    assert len(there.live()) == 1 and there.live()[0] is not first
    assert len(here.live()) == 2
    assert {r.task_id for r in there.started} <= set(on_b)
    assert {r.task_id for r in here.started} <= set(on_local)


def test_a_full_host_says_why_its_tasks_wait(git_repo: Path, tmp_path: Path) -> None:
    """`ls`, `show` and the panel's caption say it: "waiting: host b at its 1 worker"."""
    fleet, _here, there = make(tmp_path)
    (first,) = submit(fleet, git_repo, "b")
    fleet.tick()
    assert fleet.host_waits() == {}  # running its one worker, nothing queued behind it
    (second,) = submit(fleet, git_repo, "b")
    fleet.tick()
    assert fleet.get_task(second).state == TaskState.QUEUED
    assert fleet.host_waits() == {"b": "waiting: host b at its 1 worker"}
    assert fleet.status().host_waits == {"b": "waiting: host b at its 1 worker"}
    one(there, first).finish()
    fleet.tick()
    assert fleet.get_task(second).state == TaskState.RUNNING
    assert fleet.host_waits() == {}


def test_any_goes_to_the_host_with_a_free_slot(git_repo: Path, tmp_path: Path) -> None:
    fleet, here, there = make(tmp_path)
    ids = submit(fleet, git_repo, "any", 4)
    assert {fleet.get_task(t).host for t in ids} == {"any"}  # not placed until claimed
    fleet.tick()
    placed = {t: fleet.get_task(t).host for t in ids}
    assert sorted(placed.values()) == ["any", "b", "local", "local"], placed
    assert len(here.live()) == 2 and len(there.live()) == 1
    waiting = next(t for t, h in placed.items() if h == "any")
    assert fleet.get_task(waiting).state == TaskState.QUEUED
    # a slot frees on b: the waiting task is placed there
    there.live()[0].finish()
    fleet.tick()
    assert fleet.get_task(waiting).host == "b"
    assert one(there, waiting).alive


def test_attempts_resumes_and_follow_ups_stay_on_the_tasks_host(
        git_repo: Path, tmp_path: Path) -> None:
    fleet, here, there = make(tmp_path, max_attempts=3)
    (task,) = submit(fleet, git_repo, "any")
    (blocker,) = submit(fleet, git_repo, "local")
    fleet.tick()
    assert fleet.get_task(task).host == "local"
    # local is full meanwhile (its cap lowered to 1, the blocker runs), b has a free slot:
    # the task's next attempt waits for local all the same (its session lives there)
    fleet.apply_settings(dataclasses.replace(fleet.settings, hosts=(
        HostConfig("local", 1), ssh_host("b", 1, "b.example"))))
    one(here, task).finish("half", session_id="s-here", is_error=True, exit_code=1)
    fleet.tick()
    fleet.retry(task, resume=True)
    fleet.tick()
    assert fleet.get_task(task).state == TaskState.QUEUED and not there.started
    one(here, blocker).finish()
    fleet.tick()
    _first, second = here.runs_of(task)
    assert second.resume == "s-here" and second.alive
    second.finish("done", session_id="s-here")
    fleet.tick()
    assert fleet.get_task(task).state == TaskState.SUCCEEDED
    fleet.follow_up(task, "and the tests")
    fleet.tick()
    third = here.runs_of(task)[2]
    assert third.resume == "s-here" and third.alive
    assert not there.started
    assert {a.host for a in fleet.attempts(task)} == {"local"}


def test_the_host_of_a_task_on_b_serves_its_retry(git_repo: Path, tmp_path: Path) -> None:
    fleet, here, there = make(tmp_path, max_attempts=3)
    (task,) = submit(fleet, git_repo, "b")
    fleet.tick()
    one(there, task).crash()
    fleet.tick()
    fleet.retry(task)
    fleet.tick()
    assert len(there.runs_of(task)) == 2 and there.runs_of(task)[1].alive
    assert not here.started


def test_an_unknown_host_is_refused_with_the_names(git_repo: Path, tmp_path: Path) -> None:
    fleet, _here, _there = make(tmp_path)
    with pytest.raises(InvalidSpec) as refused:
        submit(fleet, git_repo, "nope")
    assert "unknown host 'nope'; the hosts are: local, b" in str(refused.value)
    assert "`any`" in str(refused.value)
    assert fleet.list_tasks() == []


def test_an_ssh_host_without_its_code_says_so(git_repo: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """[hosts.box] is read; a build without the ssh host's code (its module made
    one that does not import): the task is refused before anything is stored, and `any` never
    places a task there."""
    monkeypatch.setitem(sys.modules, "fleet_tui.execution.ssh.host", None)  # not importable
    fleet, _here, _there = make(tmp_path, '\n[hosts.box]\nssh = "me@box:2222"\n')
    assert ssh_args(fleet.settings.host("box")) == ["-p", "2222", "--", "me@box"]
    with pytest.raises(InvalidSpec) as refused:
        submit(fleet, git_repo, "box")
    assert "ssh hosts are not available in this build" in str(refused.value)
    assert fleet.list_tasks() == []
    ids = submit(fleet, git_repo, "any", 4)
    fleet.tick()
    assert {fleet.get_task(t).host for t in ids} == {"local", "b", "any"}
    assert "box" not in fleet.supervisor.host_caps()


def test_tasks_on_a_host_are_those_not_closed(git_repo: Path, tmp_path: Path) -> None:
    fleet, _here, there = make(tmp_path)
    (task,) = submit(fleet, git_repo, "b")
    assert [t.id for t in fleet.tasks_on_host("b")] == [task]
    fleet.tick()
    one(there, task).finish()
    fleet.tick()
    assert [t.id for t in fleet.tasks_on_host("b")] == [task]  # succeeded: work there
    fleet.discard(task)
    assert fleet.tasks_on_host("b") == [] and task in there.released


# --- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("table", "message"), [
    ('[hosts.b]\nmax_workers = 2\n', "[hosts.b]: ssh is missing"),
    ('[hosts.b]\nssh = "-oProxyCommand=x"\n', "is not an ssh target"),
    ('[hosts.b]\nssh = "a b"\n', "is not an ssh target"),
    ('[hosts.b]\nssh = "b"\nmax_workers = 0\n', "max_workers: expected a whole number >= 1"),
    ('[hosts.b]\nssh = "b"\nkey_on_host = "yes"\n', "key_on_host: expected true or false"),
    ('[hosts.b]\nssh = "b:99999"\n', "port: expected a port number 1-65535"),
    ('[hosts.b]\nssh = "b:22"\nport = 23\n', "says port 22 and port says 23"),
    ('[hosts.b]\nssh = "b"\nuser = "me"\n', "unknown setting 'user'; a host takes ssh"),
    ('[hosts.local]\nssh = "b"\n', "'local' is this machine, always a host"),
    ('[hosts.local]\nmax_workers = -1\n', "max_workers: expected a whole number >= 1"),
    ('[hosts.any]\nssh = "b"\n', "'any' is not a host"),
    ('[hosts."a b"]\nssh = "b"\n', "a host's name is letters"),
    ('hosts = 3\n', "hosts must be tables"),
])
def test_bad_host_settings_are_said_clearly(tmp_path: Path, table: str, message: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(table, encoding="utf-8")
    with pytest.raises(ConfigError) as bad:
        load_settings(env={}, config_file=path)
    assert message in str(bad.value)
    assert str(path) in str(bad.value)


def test_targets_as_ssh_takes_them(tmp_path: Path) -> None:
    assert parse_target("box") == ("box", None)
    assert parse_target("me@box.example") == ("me@box.example", None)
    assert parse_target("me@box:2222") == ("me@box", 2222)
    assert parse_target("[::1]:2200") == ("::1", 2200)
    assert parse_target("fe80::1") == ("fe80::1", None)
    path = tmp_path / "config.toml"
    path.write_text('[hosts.lab]\nssh = "lab"\nport = 2201\nkey_on_host = true\n')
    settings = load_settings(env={}, config_file=path)
    lab = settings.host("lab")
    own = ssh_options(lab)
    assert (own.ssh, own.port, own.key_on_host, lab.max_workers) == ("lab", 2201, True, 4)
    assert settings.host_names == ("local", "lab")
    assert settings.host().max_workers == 4  # local: the fleet's cap


def test_the_writer_keeps_the_users_file(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    original = ('# my settings\nmax_workers = 3  # a comment kept\n\n[endpoints.zai]\n'
                'base_url = "https://z.example"\n')
    path.write_text(original, encoding="utf-8")
    path.chmod(0o640)
    add_host(path, ssh_host("lab", 2, "me@lab", 2222))
    text = path.read_text()
    assert text.startswith(original)
    assert '[hosts.lab]\nssh = "me@lab:2222"\nmax_workers = 2\n' in text
    assert path.stat().st_mode & 0o777 == 0o640
    add_host(path, ssh_host("box", 1, "box", None, True))
    with pytest.raises(ConfigError, match="the host 'lab' is there already"):
        add_host(path, ssh_host("lab", 1, "x"))
    settings = load_settings(env={}, config_file=path)
    assert settings.host_names == ("local", "lab", "box")
    assert ssh_options(settings.host("box")).key_on_host is True
    remove_host(path, "lab")
    remove_host(path, "box")
    assert path.read_text() == original
    with pytest.raises(ConfigError, match="no host 'lab'"):
        remove_host(path, "lab")


def test_the_writer_cuts_one_table_between_others(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[hosts.a]\nssh = "a"\n\n# the b host\n[hosts.b]\nssh = "b"\n'
                    'max_workers = 2\n\n# endpoints below\n[endpoints.x]\n'
                    'base_url = "https://x.example"\n', encoding="utf-8")
    remove_host(path, "b")
    assert path.read_text() == ('[hosts.a]\nssh = "a"\n\n# the b host\n\n# endpoints below\n'
                                '[endpoints.x]\nbase_url = "https://x.example"\n')
    path.write_text('hosts = { c = { ssh = "c" } }\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="remove it by hand"):
        remove_host(path, "c")


# --- the panel --------------------------------------------------------------------------------


def panel(fleet: Fleet, repo: Path) -> Any:
    from fleet_tui.ui.app import FleetApp

    return FleetApp(fleet, repo=repo, default_base="main", run_scheduler=False, bell=False,
                    poll_interval=0.1, diff_interval=60)


async def test_the_task_list_has_a_host_column_only_with_more_than_one(
        git_repo: Path, tmp_path: Path) -> None:
    from test_ui_support import wait_until

    from fleet_tui.ui.widgets.task_table import TaskTable

    fleet, _here, _there = make(tmp_path)
    first = fleet.store.create_task(prompt="x", title="here", repo=git_repo,
                                    state=TaskState.SUCCEEDED)
    app = panel(fleet, git_repo)
    async with app.run_test(size=(160, 30)) as pilot:
        table = app.main.query_one(TaskTable)
        await wait_until(pilot, lambda: table.row_count == 1, what="the list")
        assert not table.shows_host
        assert "local" not in [str(cell) for cell in table.get_row(first.id)]
        assert "host" not in "".join(s.text for s in table.render_line(0))
        second = fleet.store.create_task(prompt="y", title="there", repo=git_repo,
                                         host="b", state=TaskState.SUCCEEDED)
        await wait_until(pilot, lambda: table.row_count == 2, what="the second task")
        assert table.shows_host and not table.shows_endpoint
        assert "b" in [str(cell) for cell in table.get_row(second.id)]
        assert "local" in [str(cell) for cell in table.get_row(first.id)]
        await wait_until(pilot, lambda: "host" in "".join(
            s.text for s in table.render_line(0)), what="the header")


async def test_the_launch_form_asks_which_host_when_there_are_several(
        git_repo: Path, tmp_path: Path) -> None:
    from test_ui_support import wait_until
    from textual.widgets import Select, TextArea

    from fleet_tui.ui.screens.launch import LaunchScreen

    async def open_form(pilot: Any, app: Any) -> LaunchScreen:
        await pilot.press("n")
        await wait_until(pilot, lambda: isinstance(app.screen, LaunchScreen)
                         and bool(app.screen.query("#copies")), what="the form")
        assert isinstance(app.screen, LaunchScreen)
        return app.screen

    alone = Fleet(load_settings(env=os.environ, config_file=os.devnull),
                  host=MemoryHost(tmp_path / "alone"))
    app = panel(alone, git_repo)
    async with app.run_test(size=(120, 40)) as pilot:
        form = await open_form(pilot, app)
        assert not form.query("#host")  # this machine alone: nothing to choose

    fleet, _here, there = make(tmp_path)
    app = panel(fleet, git_repo)
    async with app.run_test(size=(120, 40)) as pilot:
        form = await open_form(pilot, app)
        chosen: Select[str] = form.query_one("#host", Select)
        assert chosen.value == "local"
        options = [value for _label, value in chosen._options]
        assert options == ["local", "b", "any"]
        chosen.value = "b"
        form.query_one("#prompt", TextArea).text = "on b"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: len(fleet.list_tasks()) == 1, what="the task")
        (task,) = fleet.list_tasks()
        assert task.host == "b"
        fleet.tick()
        assert one(there, task.id).alive
        form = await open_form(pilot, app)  # remembered, and said so
        assert form.query_one("#host", Select).value == "b"
        assert "host b" in str(form.query_one("#carried").render())
        form.query_one("#host", Select).value = "any"
        form.query_one("#prompt", TextArea).text = "anywhere"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: len(fleet.list_tasks()) == 2, what="the second")
        assert {t.host for t in fleet.list_tasks()} == {"b", "any"}


def test_new_settings_rebuild_a_host_only_when_its_target_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []

    def build(config: HostConfig, **_: Any) -> MemoryHost:
        built.append(config.target)
        return MemoryHost(tmp_path / config.name / str(len(built)), name=config.name)

    monkeypatch.setattr(hosts_mod, "build_host", build)
    local = MemoryHost(tmp_path / "local", name="local")
    registry = hosts_mod.Hosts((HostConfig("local", 2), ssh_host("b", 1, "b.example")),
                               env={}, python="python3", local=local)
    first = registry.get("b")
    assert registry.get("b") is first and built == ["b.example"]
    registry.configure((HostConfig("local", 5), ssh_host("b", 4, "b.example")))
    assert registry.get("b") is first and registry.local is local  # a cap: kept
    registry.configure((HostConfig("local", 5), ssh_host("b", 4, "b.example", 2222)))
    assert registry.get("b") is not first and built == ["b.example", "b.example:2222"]
    registry.configure((HostConfig("local", 5),))
    with pytest.raises(FleetError, match=r"its host 'b' is not in config\.toml any more"):
        registry.get("b")
