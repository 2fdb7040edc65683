"""launcher.py as a library: credential, config-dir isolation, env, argv, warnings."""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path

import keyring
import pytest
import standin_claude

from fleet_tui.execution.worker import launch as launcher
from fleet_tui.execution.worker.launch import (
    ClaudeNotFoundError,
    ConfigDirError,
    UsageError,
    find_claude,
    plan_launch,
    prepare_config_dir,
)
from fleet_tui.settings.config import Settings, load_settings
from fleet_tui.settings.credentials import (
    Credential,
    LaunchError,
    NoCredentialError,
    resolve_credential,
)


@pytest.fixture
def key() -> str:
    return "sk-test-" + secrets.token_hex(16)


@pytest.fixture
def claude(tmp_path: Path) -> Path:
    return standin_claude.install(tmp_path / "bin")


@pytest.fixture
def settings(tmp_path: Path, claude: Path) -> Settings:
    return load_settings(env={"HOME": str(tmp_path), "FLEET_WORKER_CLAUDE": str(claude),
                              "FLEET_WORKER_SANDBOX": "1",
                              "FLEET_WORKER_CONFIG_DIR": str(tmp_path / "cfg")},
                         config_file=tmp_path / "none.toml")


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- credential ---------------------------------------------------------------------------

def test_credential_order_env_keyring_zhipu_glm(settings: Settings) -> None:
    env = {"ANTHROPIC_AUTH_TOKEN": "a-token", "ZHIPU_API_KEY": "z-key", "GLM_API_KEY": "g-key"}
    keyring.set_password("fleet-worker", "api-key", "k-key")
    assert resolve_credential(settings, env).value == "a-token"
    del env["ANTHROPIC_AUTH_TOKEN"]
    cred = resolve_credential(settings, env)
    assert (cred.value, cred.kind, cred.source) == ("k-key", "keyring",
                                                   "keyring fleet-worker/api-key")
    keyring.delete_password("fleet-worker", "api-key")
    assert resolve_credential(settings, env).source == "ZHIPU_API_KEY"
    del env["ZHIPU_API_KEY"]
    assert resolve_credential(settings, env).value == "g-key"


def test_credential_whitespace_and_crlf_are_stripped(settings: Settings) -> None:
    keyring.set_password("fleet-worker", "api-key", "  k-key\r\n")
    assert resolve_credential(settings, {}).value == "k-key"
    assert resolve_credential(settings, {"ANTHROPIC_AUTH_TOKEN": " a-token\r\n"}).value \
        == "a-token"
    # Blank values do not count as a key.
    keyring.delete_password("fleet-worker", "api-key")
    cred = resolve_credential(settings, {"ANTHROPIC_AUTH_TOKEN": " \r\n", "GLM_API_KEY": "g"})
    assert cred.source == "GLM_API_KEY"


def test_key_sources_restrict_and_order(settings: Settings) -> None:
    """Original defect 6: an exported token meant for another endpoint was always used."""
    import dataclasses

    restricted = dataclasses.replace(settings, key_sources=("glm", "zhipu"))
    env = {"ANTHROPIC_AUTH_TOKEN": "for-anthropic", "ZHIPU_API_KEY": "z", "GLM_API_KEY": "g"}
    assert resolve_credential(restricted, env).value == "g"
    with pytest.raises(NoCredentialError) as info:
        resolve_credential(dataclasses.replace(settings, key_sources=("keyring",)), env)
    assert "ignored because FLEET_WORKER_KEY_SOURCES=keyring" in str(info.value)
    assert "for-anthropic" not in str(info.value)


def test_no_credential_lists_every_place_and_how_to_set(settings: Settings) -> None:
    with pytest.raises(NoCredentialError) as info:
        resolve_credential(settings, {})
    message = str(info.value)
    for place in ("ANTHROPIC_AUTH_TOKEN: not set", "keyring fleet-worker/api-key: no entry",
                  "ZHIPU_API_KEY: not set", "GLM_API_KEY: not set", "fleet-tui key set",
                  "export ZHIPU_API_KEY"):
        assert place in message
    assert info.value.exit_code == 5


def test_keyring_without_backend_is_not_found_there(settings: Settings,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")
    import keyring.core

    # what a fresh process would pick with that variable
    keyring.core.set_keyring(keyring.core.load_keyring("keyring.backends.fail.Keyring"))
    try:
        assert resolve_credential(settings, {"GLM_API_KEY": "g"}).value == "g"
        with pytest.raises(NoCredentialError) as info:
            resolve_credential(settings, {})
        assert "keyring fleet-worker/api-key: no usable OS keyring backend" in str(info.value)
        assert "Traceback" not in str(info.value)
    finally:
        monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring_standin.FileKeyring")
        keyring.core.set_keyring(keyring.core.load_keyring("keyring_standin.FileKeyring"))


def test_credential_repr_never_shows_the_value(key: str) -> None:
    cred = Credential(source="GLM_API_KEY", value=key, kind="glm")
    assert key not in repr(cred) and key not in str(cred) and key not in f"{cred}"
    assert "GLM_API_KEY" in repr(cred)


# -- claude binary ------------------------------------------------------------------------

def test_find_claude_path_name_and_missing(tmp_path: Path, settings: Settings,
                                           claude: Path) -> None:
    import dataclasses

    assert find_claude(settings, {}) == str(claude)
    by_name = dataclasses.replace(settings, claude="claude")
    assert find_claude(by_name, {"PATH": f"/nonexistent:{claude.parent}"}) == str(claude)
    with pytest.raises(ClaudeNotFoundError, match="FLEET_WORKER_CLAUDE") as info:
        find_claude(by_name, {"PATH": str(tmp_path / "empty")})
    assert info.value.exit_code == 5
    plain = tmp_path / "not-exec"
    plain.write_text("x")
    with pytest.raises(ClaudeNotFoundError, match="not an executable"):
        find_claude(dataclasses.replace(settings, claude=str(plain)), {})


def test_find_claude_falls_back_to_the_copy_the_demo_installed(tmp_path: Path,
                                                               settings: Settings,
                                                               claude: Path) -> None:
    import dataclasses

    home = tmp_path / "fleet-home"
    local = home / "claude-cli" / "node_modules" / ".bin"
    local.mkdir(parents=True)
    (local / "claude").symlink_to(claude)
    by_name = dataclasses.replace(settings, claude="claude")
    env = {"PATH": str(tmp_path / "empty"), "FLEET_TUI_HOME": str(home)}
    assert find_claude(by_name, env) == str(local / "claude")
    # Only the default name falls back: an explicit other name stays an error.
    with pytest.raises(ClaudeNotFoundError):
        find_claude(dataclasses.replace(settings, claude="claude-nightly"), env)


# -- config dir ---------------------------------------------------------------------------

def test_config_dir_created_private_and_tightened(tmp_path: Path) -> None:
    cfg = tmp_path / "a" / "cfg"
    prepare_config_dir(cfg, "high")
    assert mode_of(cfg) == 0o700
    assert mode_of(cfg / "settings.json") == 0o600
    cfg.chmod(0o755)
    (cfg / "settings.json").chmod(0o644)
    prepare_config_dir(cfg, "high")
    assert mode_of(cfg) == 0o700 and mode_of(cfg / "settings.json") == 0o600


def test_settings_json_rewritten_every_launch_keeping_user_keys(tmp_path: Path) -> None:
    """Original defect 5: the effort was written only into a new dir, and not escaped."""
    cfg = tmp_path / "cfg"
    cfg.mkdir(mode=0o700)
    (cfg / "settings.json").write_text(json.dumps({
        "effortLevel": "low", "hooks": {"PreToolUse": [{"matcher": "*", "hooks": [
            {"type": "command", "command": "touch /tmp/pwned"}]}]},
        "permissions": {"allow": ["Read", "Bash(git:*)"]}, "model": "kept"}))
    prepare_config_dir(cfg, "high")
    data = json.loads((cfg / "settings.json").read_text())
    assert data["effortLevel"] == "high" and data["hooks"] == {}
    assert data["permissions"] == {"allow": ["Read", "Bash(git:*)"]} and data["model"] == "kept"
    weird = 'med"ium\\\n{'
    prepare_config_dir(cfg, weird)
    assert json.loads((cfg / "settings.json").read_text())["effortLevel"] == weird
    assert not [p for p in cfg.iterdir() if p.name.endswith(".tmp")]


def test_corrupt_settings_json_is_an_error_and_left_alone(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    broken = '{"permissions": {"allow": ["Read"]},\n  oops\n}'
    (cfg / "settings.json").write_text(broken)
    with pytest.raises(ConfigDirError) as info:
        prepare_config_dir(cfg, "high")
    assert str(cfg / "settings.json") in str(info.value) and "line 2" in str(info.value)
    assert (cfg / "settings.json").read_text() == broken
    (cfg / "settings.json").write_text("[1, 2]")
    with pytest.raises(ConfigDirError, match="JSON object"):
        prepare_config_dir(cfg, "high")


def test_config_dir_that_is_a_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "cfg"
    path.write_text("")
    with pytest.raises(ConfigDirError, match="not a directory"):
        prepare_config_dir(path, "high")


# -- plan ---------------------------------------------------------------------------------

def test_plan_env_isolated_and_inherited_credentials_removed(settings: Settings, key: str,
                                                             tmp_path: Path) -> None:
    """Original defect 6: an exported ANTHROPIC_API_KEY went on to the worker."""
    base = {"PATH": "/usr/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
            "ANTHROPIC_API_KEY": "leak-1", "ANTHROPIC_MODEL": "leak-2",
            "ANTHROPIC_BASE_URL": "https://elsewhere", "CLAUDE_CODE_OAUTH_TOKEN": "leak-3",
            "CLAUDE_CONFIG_DIR": str(tmp_path / "host"), "ZHIPU_API_KEY": key}
    plan = plan_launch(settings, base_env=base)
    env = plan.env
    assert not {k for k in env if k.startswith("ANTHROPIC_")} - {
        "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_DEFAULT_OPUS_MODEL",
        "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL"}
    assert "CLAUDE_CODE_OAUTH_TOKEN" not in env
    assert not any(v.startswith("leak-") for v in env.values())
    assert env["CLAUDE_CONFIG_DIR"] == str(tmp_path / "cfg")
    assert env["ANTHROPIC_BASE_URL"] == "https://api.z.ai/api/anthropic"
    assert env["ANTHROPIC_AUTH_TOKEN"] == key
    assert env["ANTHROPIC_DEFAULT_OPUS_MODEL"] == env["ANTHROPIC_DEFAULT_SONNET_MODEL"] \
        == "GLM-5.2"
    assert env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "GLM-4.5-Air"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["DISABLE_TELEMETRY"] == "1" and env["IS_SANDBOX"] == "1"
    assert env["LANG"] == "C.UTF-8" and env["PATH"] == "/usr/bin"
    assert "ANTHROPIC_API_KEY" in plan.removed_env
    assert plan.credential_source == "ZHIPU_API_KEY"
    assert mode_of(tmp_path / "cfg") == 0o700


def test_plan_argv_shape_prompt_and_engine_options(settings: Settings, claude: Path,
                                                   tmp_path: Path) -> None:
    extra = ["--output-format", "stream-json", "--verbose", "--max-turns", "7",
             "--resume", "sid-1"]
    plan = plan_launch(settings, extra, prompt="fix the bug", base_env={"GLM_API_KEY": "g"},
                       config_dir=tmp_path / "task-cfg", model="GLM-4.5-Air",
                       permission_mode="acceptEdits", cwd=tmp_path)
    assert plan.argv == [str(claude), "-p", "--model", "sonnet", "--permission-mode",
                         "acceptEdits", *extra, "--", "fix the bug"]
    assert plan.env["ANTHROPIC_DEFAULT_SONNET_MODEL"] == "GLM-4.5-Air"
    assert plan.env["ANTHROPIC_DEFAULT_OPUS_MODEL"] == "GLM-4.5-Air"
    assert plan.env["CLAUDE_CONFIG_DIR"] == str(tmp_path / "task-cfg")
    assert plan.cwd == tmp_path and plan.warnings == []


@pytest.mark.parametrize("flags", [["--permission-mode", "plan"], ["--permission-mode=plan"]])
def test_callers_permission_mode_overrides_and_is_not_doubled(settings: Settings,
                                                              flags: list[str]) -> None:
    plan = plan_launch(settings, [*flags, "hi"], base_env={"GLM_API_KEY": "g"})
    assert plan.argv.count("--permission-mode") == 1
    assert plan.argv[4:7] == ["--permission-mode", "plan", "hi"]
    assert plan.permission_mode == "plan"


def test_invalid_permission_modes_are_usage_errors(settings: Settings) -> None:
    import dataclasses

    with pytest.raises(UsageError, match="bypassPermissions") as info:
        plan_launch(settings, ["--permission-mode", "yolo"], base_env={"GLM_API_KEY": "g"})
    assert info.value.exit_code == 2
    with pytest.raises(UsageError, match="needs a value"):
        plan_launch(settings, ["--permission-mode"], base_env={"GLM_API_KEY": "g"})
    with pytest.raises(UsageError):
        plan_launch(dataclasses.replace(settings, permission_mode="nope"),
                    base_env={"GLM_API_KEY": "g"})


@pytest.mark.parametrize("flags", [
    ["--allowedTools", "Read"], ["--allowedTools=Read"], ["--allowed-tools", "Read Edit"],
    ["--allowed-tools=Read"]])
def test_dontask_with_an_allowlist_flag_does_not_warn(settings: Settings,
                                                      flags: list[str]) -> None:
    """Original defect 7: `--allowedTools=Read` was not seen as an allowlist."""
    plan = plan_launch(settings, ["--permission-mode", "dontAsk", *flags, "do it"],
                       base_env={"GLM_API_KEY": "g"})
    assert plan.warnings == []


def test_dontask_without_allowlist_warns_and_settings_allow_counts(settings: Settings,
                                                                   tmp_path: Path) -> None:
    plan = plan_launch(settings, ["do it"], permission_mode="dontAsk",
                       base_env={"GLM_API_KEY": "g"})
    assert len(plan.warnings) == 1 and "dontAsk" in plan.warnings[0]
    assert "--allowedTools" in plan.warnings[0]
    settings_file = tmp_path / "cfg" / "settings.json"
    settings_file.write_text(json.dumps({"permissions": {"allow": ["Read"]}}))
    plan = plan_launch(settings, ["do it"], permission_mode="dontAsk",
                       base_env={"GLM_API_KEY": "g"})
    assert plan.warnings == []
    # An --allowedTools after `--` is the prompt, not a flag.
    settings_file.write_text("{}")
    plan = plan_launch(settings, ["--", "--allowedTools=Read"], permission_mode="dontAsk",
                       base_env={"GLM_API_KEY": "g"})
    assert len(plan.warnings) == 1


def test_root_without_sandbox_opt_in_is_refused(settings: Settings,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    monkeypatch.setattr(launcher, "current_euid", lambda: 0)
    no_opt_in = dataclasses.replace(settings, sandbox=False, cage="off")  # uncaged
    for args in (["hi"], ["--dangerously-skip-permissions", "hi"]):
        mode = None if args == ["hi"] else "acceptEdits"
        with pytest.raises(UsageError, match="FLEET_WORKER_SANDBOX=1") as info:
            plan_launch(no_opt_in, args, permission_mode=mode, base_env={"GLM_API_KEY": "g"})
        assert info.value.exit_code == 2
    # Another mode is fine as root and gets no IS_SANDBOX.
    plan = plan_launch(no_opt_in, ["--permission-mode=acceptEdits"],
                       base_env={"GLM_API_KEY": "g"})
    assert "IS_SANDBOX" not in plan.env
    # With the opt-in, claude is told it runs in a sandbox.
    assert plan_launch(settings, base_env={"GLM_API_KEY": "g"}).env["IS_SANDBOX"] == "1"


def test_non_root_needs_no_opt_in(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    monkeypatch.setattr(launcher, "current_euid", lambda: 1000)
    plan = plan_launch(dataclasses.replace(settings, sandbox=False), base_env={"GLM_API_KEY": "g"})
    assert plan.permission_mode == "bypassPermissions" and "IS_SANDBOX" not in plan.env


def test_missing_cwd_is_refused(settings: Settings, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        plan_launch(settings, base_env={"GLM_API_KEY": "g"}, cwd=tmp_path / "gone")


def test_dry_run_plan_writes_nothing(settings: Settings, tmp_path: Path) -> None:
    plan = plan_launch(settings, ["hi"], base_env={"GLM_API_KEY": "g"}, prepare=False)
    assert not (tmp_path / "cfg").exists() and plan.prepared is False


def test_key_never_in_argv_describe_repr_or_errors(settings: Settings, key: str,
                                                   tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    base = {"ANTHROPIC_AUTH_TOKEN": key, "PATH": "/usr/bin"}
    plan = plan_launch(settings, ["--output-format", "json", "hello"], base_env=base)
    assert all(key not in arg for arg in plan.argv)
    text = plan.describe()
    assert key not in text and key not in repr(plan)
    assert "ANTHROPIC_AUTH_TOKEN=<redacted: from ANTHROPIC_AUTH_TOKEN>" in text
    assert "unset ANTHROPIC_AUTH_TOKEN" in text  # the inherited one is removed, then set
    # Even a key typed into a flag by mistake is redacted in the dry-run text.
    assert key not in plan_launch(settings, [key], base_env=base).describe()
    # Errors raised while a key is in play do not carry it.
    errors: list[LaunchError] = []
    for kwargs in ({"cwd": tmp_path / "missing"}, {"permission_mode": "bad"}):
        try:
            plan_launch(settings, base_env=base, **kwargs)
        except LaunchError as exc:
            errors.append(exc)
    (tmp_path / "cfg" / "settings.json").write_text("{not json")
    try:
        plan_launch(settings, base_env=base)
    except LaunchError as exc:
        errors.append(exc)
    assert len(errors) == 3 and all(key not in str(e) and key not in repr(e) for e in errors)
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""  # a library: no printing


def test_plan_uses_the_process_environment_by_default(settings: Settings,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLM_API_KEY", "from-process")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "leak")
    plan = plan_launch(settings)
    assert plan.env["ANTHROPIC_AUTH_TOKEN"] == "from-process"
    assert "ANTHROPIC_API_KEY" not in plan.env
    assert os.environ["ANTHROPIC_API_KEY"] == "leak"  # the caller's env is not modified


@pytest.mark.real_claude
def test_real_claude_receives_the_prompt_after_a_list_flag(tmp_path: Path, claude_bin: str,
                                                           key: str) -> None:
    """The engine passes --allowedTools (a list flag) and then prompt=: without the `--`
    plan_launch inserts, claude 2.1.197 takes the prompt for a tool name and fails."""
    import hashlib
    import subprocess

    from fleet_tui.demo.endpoint import ScriptedEndpoint

    with ScriptedEndpoint(["done"]) as endpoint:
        settings = load_settings(
            env={"HOME": str(tmp_path), "FLEET_WORKER_CLAUDE": claude_bin,
                 "FLEET_WORKER_SANDBOX": "1", "FLEET_WORKER_BASE_URL": endpoint.url},
            config_file=tmp_path / "none.toml")
        work = tmp_path / "work"
        work.mkdir()
        plan = plan_launch(settings, ["--allowedTools", "Read", "Edit"],
                           prompt="-starts with a dash", permission_mode="dontAsk",
                           config_dir=tmp_path / "task-cfg", cwd=work,
                           base_env={**os.environ, "GLM_API_KEY": key})
        assert plan.warnings == []
        proc = subprocess.run(plan.argv, env=plan.env, cwd=plan.cwd, capture_output=True,
                              text=True, timeout=120, stdin=subprocess.DEVNULL)
        requests = endpoint.requests
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "done"
    assert [r.prompt for r in requests] == ["-starts with a dash"]
    assert requests[0].auth_sha256 == hashlib.sha256(key.encode()).hexdigest()
