"""Named endpoints through the product: a task runs on the endpoint it was
given, its runner gets that endpoint's URL, models and key (and no other's), each endpoint
keeps its own park, hold and cap, and the CLI and the panel say which endpoint a task is on.

The engine's rules on the in-memory host (real store, real git, the environment the host
is handed recorded), then `fleet-tui` itself with the real claude against two scripted
endpoints on 127.0.0.1, each with its own key.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from endpoint_helpers import cli_env, run_cli

from fleet_tui.core import policy
from fleet_tui.core.states import TaskState
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet, InvalidSpec
from fleet_tui.execution.host import Placement
from fleet_tui.execution.memory import MemoryHost, MemoryStaged
from fleet_tui.execution.worker.spec import RunSpec
from fleet_tui.settings import endpoints
from fleet_tui.settings.config import Settings, load_settings
from fleet_tui.store.db import Store, TaskSpec
from fleet_tui.system import paths

DEFAULT_KEY = "sk-default-endpoint-key-7f3a"
ZAI_KEY = "sk-zai-endpoint-key-91c2"
OTHER_KEY = "sk-other-endpoint-key-44de"


class RecordingHost(MemoryHost):
    """The in-memory host, starting its runners with the engine's environment as the
    local host does, and keeping the environment each runner would start with."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        super().__init__(root)
        self.env = env
        self.envs: dict[str, dict[str, str]] = {}

    def runner_env(self) -> dict[str, str]:
        return dict(self.env)

    def stage(self, placement: Placement, spec: RunSpec) -> MemoryStaged:
        staged = super().stage(placement, spec)
        host, task_id = self, spec.task_id

        class Recording(MemoryStaged):
            def spawn(self, env: dict[str, str]) -> int:
                host.envs[task_id] = dict(env)
                return super().spawn(env)

        return Recording(staged.host, staged.placement, staged.spec)


def config(tmp_path: Path, zai_url: str = "http://127.0.0.1:9/zai",
           other_url: str = "http://127.0.0.1:9/other", *, zai_workers: int = 1) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(f'''
base_url = "http://127.0.0.1:9/default"
max_workers = 3

[endpoints.zai]
base_url = "{zai_url}"
key_env = "ZAI_TEST_KEY"
model = "zai-main"
small_model = "zai-small"
max_workers = {zai_workers}

[endpoints.other]
base_url = "{other_url}"
key_keyring = "other-key"
model = "other-main"
''', encoding="utf-8")
    return path


def make(tmp_path: Path, **overrides: Any) -> tuple[Fleet, RecordingHost]:
    values: dict[str, Any] = {"key_sources": "env", "max_attempts": 1}
    values.update(overrides)
    settings = load_settings(env=os.environ, config_file=config(tmp_path), overrides=values)
    env = dict(os.environ, ANTHROPIC_AUTH_TOKEN=DEFAULT_KEY, ZAI_TEST_KEY=ZAI_KEY)
    host = RecordingHost(tmp_path / "memory-host", env)
    return Fleet(settings, Store(paths.db_path()), env=env, host=host), host


def submit(fleet: Fleet, repo: Path, endpoint: str | None, n: int = 1) -> list[str]:
    return [t.id for t in fleet.submit(TaskSpec(prompt="work", repo=repo, endpoint=endpoint),
                                       copies=n)]


def running(fleet: Fleet, ids: list[str]) -> int:
    return sum(1 for i in ids if fleet.get_task(i).state == TaskState.RUNNING)


# --- the engine ---------------------------------------------------------------------------------


def test_each_runner_gets_its_endpoints_url_models_and_only_its_key(
        git_repo: Path, tmp_path: Path) -> None:
    fleet, host = make(tmp_path)
    (zai,) = submit(fleet, git_repo, "zai")
    (other,) = submit(fleet, git_repo, "other")
    (plain,) = submit(fleet, git_repo, None)
    assert [fleet.get_task(i).endpoint for i in (zai, other, plain)] == \
        ["zai", "other", "default"]
    fleet.tick()
    specs = {i: host.runs_of(i)[0].spec for i in (zai, other, plain)}
    assert specs[zai]["settings"]["base_url"] == "http://127.0.0.1:9/zai"
    assert (specs[zai]["model"], specs[zai]["settings"]["small_model"]) == \
        ("zai-main", "zai-small")
    assert specs[zai]["settings"]["key_sources"] == ["env"]
    assert specs[other]["settings"]["base_url"] == "http://127.0.0.1:9/other"
    assert specs[other]["model"] == "other-main"
    assert specs[other]["settings"]["key_sources"] == ["keyring"]
    assert specs[other]["settings"]["keyring_key"] == "other-key"
    assert specs[plain]["settings"]["base_url"] == "http://127.0.0.1:9/default"
    for spec in specs.values():  # no key in any spec
        text = json.dumps(spec)
        assert ZAI_KEY not in text and DEFAULT_KEY not in text
    envs = host.envs
    # the key_env endpoint: its key as the variable the runner reads, nothing else
    assert envs[zai]["ANTHROPIC_AUTH_TOKEN"] == ZAI_KEY
    # the keyring endpoint: none of the engine's key variables (the runner reads its entry)
    assert "ANTHROPIC_AUTH_TOKEN" not in envs[other]
    # the default: today's key; and no runner has the key_env variable itself
    assert envs[plain]["ANTHROPIC_AUTH_TOKEN"] == DEFAULT_KEY
    assert all("ZAI_TEST_KEY" not in env for env in envs.values())


def test_an_unknown_endpoint_is_refused_with_the_known_ones(git_repo: Path,
                                                             tmp_path: Path) -> None:
    fleet, _host = make(tmp_path)
    with pytest.raises(InvalidSpec, match=r"unknown endpoint 'nope'; the endpoints are: "
                                          r"default, zai, other"):
        fleet.submit(TaskSpec(prompt="work", repo=git_repo, endpoint="nope"))
    assert fleet.list_tasks() == []


def test_a_key_env_endpoint_without_its_variable_fails_its_start_saying_so(
        git_repo: Path, tmp_path: Path) -> None:
    fleet, host = make(tmp_path)
    del fleet.ctx.env["ZAI_TEST_KEY"]
    (zai,) = submit(fleet, git_repo, "zai")
    fleet.tick()
    task = fleet.get_task(zai)
    assert task.state == TaskState.FAILED and not host.runs_of(zai)
    assert "$ZAI_TEST_KEY, which is not set in the engine's environment" in (task.message
                                                                              or "")


def test_each_endpoint_has_its_own_worker_cap(git_repo: Path, tmp_path: Path) -> None:
    fleet, _host = make(tmp_path)  # zai: max_workers 1; default: 3; other: the default's
    zai = submit(fleet, git_repo, "zai", 3)
    plain = submit(fleet, git_repo, None, 4)
    other = submit(fleet, git_repo, "other", 4)
    fleet.tick()
    assert (running(fleet, zai), running(fleet, plain), running(fleet, other)) == (1, 3, 3)
    assert fleet.status().cap == 1 + 3 + 3  # the fleet's: every endpoint's cap


def test_a_park_on_one_endpoint_does_not_hold_another(git_repo: Path,
                                                      tmp_path: Path) -> None:
    fleet, host = make(tmp_path)
    now = time.time()
    park = policy.Effect("park", until=now + 3600, reason="5-hour window, code 1308",
                         message="usage limit reached")
    zai_settings = fleet.settings.for_endpoint("zai")
    fleet.store.change_endpoint(
        "zai", lambda state: policy.apply_effect(state, park, zai_settings, now), now)
    hold = policy.Effect("hold", reason="account in arrears, code 1113", task="t0",
                         settings=policy.settings_key(fleet.settings.for_endpoint("other")))
    fleet.store.change_endpoint(
        "other", lambda state: policy.apply_effect(state, hold, fleet.settings, now), now)
    zai = submit(fleet, git_repo, "zai", 2)
    other = submit(fleet, git_repo, "other", 2)
    plain = submit(fleet, git_repo, None, 2)
    fleet.tick()
    assert running(fleet, plain) == 2  # neither the park nor the hold reaches the default
    assert running(fleet, zai) == 0 and running(fleet, other) == 0
    assert not any(host.runs_of(i) for i in zai + other)
    assert "parked" in (fleet.endpoint_note("zai") or "")
    assert "held" in (fleet.endpoint_note("other") or "")
    assert fleet.endpoint_note("default") is None and fleet.why_waiting() is None
    # the park lifted: zai starts again, other stays held
    fleet.store.change_endpoint("zai", lambda state: {"parked_until": None,
                                                      "park_reason": None}, time.time())
    fleet.tick()
    assert running(fleet, zai) == 1 and running(fleet, other) == 0  # zai's cap is 1


def test_the_secret_scan_knows_every_endpoints_key(git_repo: Path, tmp_path: Path) -> None:
    import keyring

    keyring.set_password("fleet-worker", "other-key", OTHER_KEY)
    fleet, _host = make(tmp_path)
    assert set(fleet.secrets.get(fresh=True)) == {DEFAULT_KEY, ZAI_KEY, OTHER_KEY}


def test_runner_env_for_each_kind_of_endpoint() -> None:
    settings = Settings()
    own_env = endpoints.Endpoint("e", "http://x", "m", "s", 1, key_env="E_KEY")
    keyring_one = endpoints.Endpoint("k", "http://y", "m", "s", 1, key_keyring="k")
    every = (endpoints.default_endpoint(settings), own_env, keyring_one)
    env = {"PATH": "/bin", "E_KEY": " sk-e \n", "ZHIPU_API_KEY": "sk-z",
           "ANTHROPIC_AUTH_TOKEN": "sk-a"}
    assert endpoints.runner_env(own_env, every, env) == {"PATH": "/bin",
                                                         "ANTHROPIC_AUTH_TOKEN": "sk-e"}
    assert endpoints.runner_env(keyring_one, every, env) == {"PATH": "/bin"}
    assert endpoints.runner_env(every[0], every, env) == {
        "PATH": "/bin", "ZHIPU_API_KEY": "sk-z", "ANTHROPIC_AUTH_TOKEN": "sk-a"}
    with pytest.raises(endpoints.MissingKey, match=r"\$E_KEY, which is empty"):
        endpoints.runner_env(own_env, every, {"E_KEY": " "})
    assert endpoints.name_of(every, "http://y/") == "k"
    assert endpoints.name_of(every, "https://api.z.ai/api/anthropic") == "default"
    assert endpoints.name_of(every, "http://elsewhere") == "default"


def test_older_rows_naming_a_base_url_read_as_the_default(tmp_path: Path) -> None:
    """A store of schema 7 held the base URL in tasks.endpoint and the endpoints table."""
    db = tmp_path / "old.db"
    with Store(db) as store:
        store.create_task(prompt="p", repo=tmp_path, endpoint="https://api.z.ai/api/anthropic")
        store.create_task(prompt="q", repo=tmp_path, endpoint="http://127.0.0.1:9")
        store.change_endpoint("https://old.example", lambda s: {"cap": 1}, 10.0)
        store.change_endpoint("https://api.z.ai/api/anthropic",
                              lambda s: {"held": "arrears"}, 20.0)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA user_version = 7")
    conn.commit()
    conn.close()
    with Store(db) as store:
        assert {t.endpoint for t in store.list_tasks()} == {"default"}
        (state,) = store.list_endpoints()
        assert (state.endpoint, state.held, state.cap) == ("default", "arrears", None)


# --- the CLI --------------------------------------------------------------------------------


def test_run_with_an_unknown_endpoint_creates_nothing(git_repo: Path, tmp_path: Path) -> None:
    env = cli_env("http://127.0.0.1:9", "/nonexistent/claude", DEFAULT_KEY,
                  FLEET_TUI_CONFIG=str(config(tmp_path)))
    out = run_cli(env, git_repo, "run", "do it", "--endpoint", "nope")
    assert out.returncode == 2, out.stderr
    assert "unknown endpoint 'nope'; the endpoints are: default, zai, other" in out.stderr
    listed = run_cli(env, git_repo, "ls", "--json")
    assert json.loads(listed.stdout) == []
    branches = subprocess.run(["git", "branch", "--list", "fleet/*"], cwd=git_repo,
                              capture_output=True, text=True, check=True).stdout
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=git_repo,
                               capture_output=True, text=True, check=True).stdout
    assert branches == "" and len(worktrees.splitlines()) == 1
    assert not (git_repo / ".fleet-work").exists() or \
        not any((git_repo / ".fleet-work").glob("*/*"))


def test_ls_has_an_endpoint_column_only_with_more_than_one(git_repo: Path,
                                                           tmp_path: Path) -> None:
    env = cli_env("http://127.0.0.1:9", "/nonexistent/claude", DEFAULT_KEY,
                  FLEET_TUI_CONFIG=str(config(tmp_path)))
    store = Store(paths.db_path())
    store.create_task(prompt="one", title="first", repo=git_repo, endpoint="default",
                      state=TaskState.FAILED)
    single = run_cli(env, git_repo, "ls")
    assert "ENDPOINT" not in single.stdout and "first" in single.stdout
    store.create_task(prompt="two", title="second", repo=git_repo, endpoint="zai",
                      state=TaskState.FAILED)
    both = run_cli(env, git_repo, "ls")
    header, *rows = both.stdout.splitlines()
    assert "ENDPOINT" in header
    assert any("zai" in r and "second" in r for r in rows)
    assert any("default" in r and "first" in r for r in rows)
    assert {t["endpoint"] for t in json.loads(run_cli(env, git_repo, "ls", "--json").stdout)} \
        == {"default", "zai"}


def test_key_set_for_an_endpoint(tmp_path: Path) -> None:
    import keyring

    env = dict(os.environ, FLEET_TUI_CONFIG=str(config(tmp_path)))

    def key(*args: str, given: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fleet_tui.cli", "key", *args],
                              input=given, env=env, capture_output=True, text=True,
                              timeout=60)

    stored = key("set", "--endpoint", "other", given=OTHER_KEY + "\n")
    assert stored.returncode == 0, stored.stderr
    assert "fleet-worker/other-key" in stored.stdout and OTHER_KEY not in stored.stdout
    assert keyring.get_password("fleet-worker", "other-key") == OTHER_KEY
    status = key("--endpoint", "other", "status")
    assert status.returncode == 0 and "keyring fleet-worker/other-key: set" in status.stdout
    assert OTHER_KEY not in status.stdout + status.stderr
    # a key_env endpoint: what to export instead
    env_one = key("--endpoint", "zai", "set", given="sk-x")
    assert env_one.returncode == 2 and "export ZAI_TEST_KEY=..." in env_one.stderr
    assert keyring.get_password("fleet-worker", "api-key") is None
    missing = key("--endpoint", "zai", "status")
    assert missing.returncode == 5 and "$ZAI_TEST_KEY: not set" in missing.stdout
    unknown = key("--endpoint", "nope", "set", given="sk-x")
    assert unknown.returncode == 2 and "unknown endpoint 'nope'" in unknown.stderr


def test_key_set_for_an_endpoint_without_a_key_of_its_own_says_what_to_add(
        tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[endpoints.team]\nbase_url = "http://127.0.0.1:9/team"\n')
    out = subprocess.run([sys.executable, "-m", "fleet_tui.cli", "key", "--endpoint", "team",
                          "set"], input="sk-team", capture_output=True, text=True,
                         env=dict(os.environ, FLEET_TUI_CONFIG=str(path)), timeout=60)
    assert out.returncode == 2
    assert '[endpoints.team]\n  key_keyring = "team"' in out.stderr


def test_doctor_lists_each_named_endpoint_and_its_key(tmp_path: Path) -> None:
    env = dict(os.environ, FLEET_TUI_CONFIG=str(config(tmp_path)), ZAI_TEST_KEY=ZAI_KEY)
    out = subprocess.run([sys.executable, "-c", "import sys; from fleet_tui.cli import "
                          "doctor_main; sys.exit(doctor_main())", "--json"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert "Traceback" not in out.stderr
    checks = {c["check"]: c for c in json.loads(out.stdout)["data"]}
    zai, other = checks["endpoint zai"], checks["endpoint other"]
    assert zai["status"] == "ok" and "http://127.0.0.1:9/zai" in zai["detail"]
    assert "key found in $ZAI_TEST_KEY" in zai["detail"]
    assert other["status"] == "warn" and "fleet-tui key set --endpoint other" in \
        other["detail"]
    assert ZAI_KEY not in out.stdout


# --- the real claude: one panel, two providers ---------------------------------------------

# the tool's environment, and the argv of every process it can see (the runner's, claude's)
LOOK = ('echo done > a.txt; env > tool-env-$FLEET_TASK_ID.txt; '
        'for p in /proc/[0-9]*; do tr "\\0" " " < "$p/cmdline"; echo; done '
        '> argv-$FLEET_TASK_ID.txt 2>/dev/null; true')
SCRIPT: dict[str, Any] = {"default": [[{"type": "tool_use", "name": "Bash",
                                        "input": {"command": LOOK, "description": "look"}}],
                                      "looked"]}


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.mark.parametrize("route", ["direct", "gateway"])
def test_two_endpoints_each_with_its_own_key_from_one_fleet(
        claude_bin: str, git_repo: Path, tmp_path: Path, route: str) -> None:
    """The promise of named endpoints: one z.ai key (key_env) and another provider's (its keyring
    entry) from one fleet, straight to each endpoint and through the gateway, which then
    holds both keys and sends each request on with its own endpoint's."""
    with ScriptedEndpoint(SCRIPT) as zai_ep, ScriptedEndpoint(SCRIPT) as other_ep:
        env = cli_env("http://127.0.0.1:9", claude_bin, DEFAULT_KEY, ZAI_TEST_KEY=ZAI_KEY,
                      FLEET_TUI_CONFIG=str(config(tmp_path, zai_ep.url, other_ep.url,
                                                  zai_workers=2)),
                      FLEET_WORKER_GATEWAY="1" if route == "gateway" else "0")
        try:
            _two_endpoints(env, git_repo, zai_ep, other_ep, route)
        finally:
            if route == "gateway":
                run_cli(env, git_repo, "gateway", "stop")


def _two_endpoints(env: dict[str, str], git_repo: Path, zai_ep: ScriptedEndpoint,
                   other_ep: ScriptedEndpoint, route: str) -> None:
    stored = subprocess.run([sys.executable, "-m", "fleet_tui.cli", "key", "--endpoint",
                             "other", "set"], input=OTHER_KEY, env=env,
                            capture_output=True, text=True, timeout=60)
    assert stored.returncode == 0, stored.stderr
    tasks = {}
    for name in ("zai", "other"):
        out = run_cli(env, git_repo, "run", f"look on {name}", "--endpoint", name,
                      "--wait", "--json", timeout=240)
        assert out.returncode == 0, out.stderr + out.stdout
        (task,) = json.loads(out.stdout)
        assert task["state"] == "succeeded" and task["endpoint"] == name, task
        tasks[name] = task
    for ep, name, key, model in ((zai_ep, "zai", ZAI_KEY, "zai-main"),
                                 (other_ep, "other", OTHER_KEY, "other-main")):
        messages = ep.message_requests()
        assert len(messages) == 2, messages  # the tool turn and the answer
        assert all(r.auth_sha256 == sha(key) for r in messages), name
        assert all(r.model == model for r in messages), name
        assert all(r.cwd == tasks[name]["worktree"] for r in messages)
    # the list says which endpoint each task ran on
    listed = run_cli(env, git_repo, "ls")
    assert "ENDPOINT" in listed.stdout.splitlines()[0]
    if route == "gateway":  # both went through it, each request on its own endpoint
        status = run_cli(env, git_repo, "gateway", "status", "--json")
        assert status.returncode == 0, status.stderr
        served = json.loads(status.stdout)["endpoints"]
        assert served["zai"]["served"] == 2 and served["other"]["served"] == 2, served
        assert all(r.auth_sha256 not in (sha(DEFAULT_KEY),)
                   for r in zai_ep.message_requests() + other_ep.message_requests())
    shown = run_cli(env, git_repo, "show", tasks["zai"]["id"])
    assert any(line.split() == ["endpoint:", "zai"] for line in shown.stdout.splitlines())
    # the key_env endpoint's key: in no argv the worker could see (the runner's, claude's),
    # not in the worker's environment, no spec, attempt file, config dir or store (the
    # variable given is in the engine's own environment: the user's choice of source)
    for task in tasks.values():
        worktree = Path(task["worktree"])  # (the cage lets a worker write only there)
        seen = (worktree / f"argv-{task['id']}.txt").read_text(errors="replace")
        assert "claude" in seen  # it did see them (in its cage: claude and its own tools)
        tool_env = (worktree / f"tool-env-{task['id']}.txt").read_text()
        for secret in (ZAI_KEY, OTHER_KEY, DEFAULT_KEY):
            assert secret not in seen and secret not in tool_env
        assert "ZAI_TEST_KEY" not in tool_env
    home = Path(env["FLEET_TUI_HOME"])
    for path in [*home.rglob("*"), *git_repo.joinpath(".fleet-work").rglob("*")]:
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            assert ZAI_KEY.encode() not in data, path
            assert OTHER_KEY.encode() not in data, path


# --- the panel ------------------------------------------------------------------------------


def panel(fleet: Fleet, repo: Path) -> Any:
    from fleet_tui.ui.app import FleetApp

    return FleetApp(fleet, repo=repo, default_base="main", run_scheduler=False, bell=False,
                    poll_interval=0.1, diff_interval=60)


async def test_the_task_list_has_an_endpoint_column_only_with_more_than_one(
        git_repo: Path, tmp_path: Path) -> None:
    from test_ui_support import wait_until

    from fleet_tui.ui.widgets.task_table import TaskTable

    fleet, _host = make(tmp_path)
    first = fleet.store.create_task(prompt="x", title="on the default", repo=git_repo,
                                    endpoint="default", state=TaskState.SUCCEEDED)
    app = panel(fleet, git_repo)
    async with app.run_test(size=(160, 30)) as pilot:
        table = app.main.query_one(TaskTable)
        await wait_until(pilot, lambda: table.row_count == 1, what="the list")
        assert not table.shows_endpoint
        assert "default" not in [str(cell) for cell in table.get_row(first.id)]
        second = fleet.store.create_task(prompt="y", title="on zai", repo=git_repo,
                                         endpoint="zai", state=TaskState.SUCCEEDED)
        await wait_until(pilot, lambda: table.row_count == 2, what="the second task")
        assert table.shows_endpoint
        assert "zai" in [str(cell) for cell in table.get_row(second.id)]
        assert "default" in [str(cell) for cell in table.get_row(first.id)]
        header = "".join(s.text for s in table.render_line(0))
        assert "endpoint" in header
        # a named endpoint's hold says whose it is, in the status line and its toast
        from fleet_tui.ui.widgets.status_line import StatusLine

        now = time.time()
        hold = policy.Effect("hold", reason="account in arrears, code 1113", task=second.id,
                             settings=policy.settings_key(fleet.settings.for_endpoint("zai")))
        fleet.store.change_endpoint(
            "zai", lambda state: policy.apply_effect(state, hold, fleet.settings, now), now)
        await wait_until(pilot, lambda: "zai held: account in arrears" in
                         str(app.main.query_one(StatusLine).render()), what="the hold")
        await wait_until(pilot, lambda: any(title == "Endpoint zai held"
                                            for _, title, _ in app.toasts), what="the toast")


async def test_the_launch_form_asks_which_endpoint_when_there_are_several(
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

    single = Fleet(load_settings())
    app = panel(single, git_repo)
    async with app.run_test(size=(120, 40)) as pilot:
        form = await open_form(pilot, app)
        assert not form.query("#endpoint")  # one endpoint: nothing to choose

    fleet, _host = make(tmp_path)
    app = panel(fleet, git_repo)
    async with app.run_test(size=(120, 40)) as pilot:
        form = await open_form(pilot, app)
        chosen: Select[str] = form.query_one("#endpoint", Select)
        assert chosen.value == "default"
        chosen.value = "zai"
        form.query_one("#prompt", TextArea).text = "on zai"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: len(fleet.list_tasks()) == 1, what="the task")
        assert fleet.list_tasks()[0].endpoint == "zai"
        form = await open_form(pilot, app)  # remembered, and said so
        assert form.query_one("#endpoint", Select).value == "zai"
        assert "endpoint zai" in str(form.query_one("#carried").render())


def test_a_task_whose_endpoint_left_config_toml_is_not_sent_elsewhere(
        git_repo: Path, tmp_path: Path) -> None:
    fleet, host = make(tmp_path)
    (gone,) = submit(fleet, git_repo, "zai")
    fleet.apply_settings(load_settings(env=os.environ, overrides={"key_sources": "env"},
                                       config_file=os.devnull))
    fleet.tick()
    task = fleet.get_task(gone)
    assert task.state == TaskState.FAILED and not host.runs_of(gone)
    assert "its endpoint 'zai' is not in config.toml any more" in (task.message or "")
