"""fleet-worker as a process: it becomes claude, and claude gets the key through a one-shot
pipe its apiKeyHelper reads (or, with FLEET_WORKER_KEY_HELPER=0, in its environment), never
in its argv.

Most tests run the recording stand-in claude (tests/support/standin_claude.py) because what is
under test is what claude *receives*; the last tests run the real pinned claude against
the scripted endpoint on 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import json
import os
import pty
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import standin_claude

from fleet_tui.demo.endpoint import ScriptedEndpoint

WORKER_SCRIPT = Path(sys.executable).parent / "fleet-worker"
TIMEOUT = 30


def worker_cmd(*args: str) -> list[str]:
    if WORKER_SCRIPT.exists():
        return [str(WORKER_SCRIPT), *args]
    return [sys.executable, "-c",
            "import sys; from fleet_tui.cli import worker_main; sys.exit(worker_main())", *args]


def run_worker(*args: str, input: str | None = None,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(worker_cmd(*args), input=input, capture_output=True, text=True,
                          timeout=TIMEOUT, env=env,
                          stdin=subprocess.DEVNULL if input is None else None)


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    value = "sk-fleet-" + secrets.token_hex(20)
    monkeypatch.setenv("ZHIPU_API_KEY", value)
    return value


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in claude installed as FLEET_WORKER_CLAUDE; returns its record path."""
    monkeypatch.setenv("FLEET_WORKER_CLAUDE", str(standin_claude.install(tmp_path / "bin")))
    monkeypatch.setenv("FLEET_WORKER_CONFIG_DIR", str(tmp_path / "cfg"))
    path = tmp_path / "record.json"
    monkeypatch.setenv("FLEET_STANDIN_RECORD", str(path))
    return path


def _helper_of(argv: list[str]) -> str:
    index = argv.index("--settings")
    helper: str = json.loads(argv[index + 1])["apiKeyHelper"]
    return helper


def test_worker_execs_claude_with_the_key_in_neither_argv_nor_environment(
        record: Path, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_STANDIN_WAIT", "1")
    proc = subprocess.Popen(worker_cmd("--output-format", "json", "hello there"),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        rec = standin_claude.read_record(record)
        assert rec["pid"] == proc.pid  # exec: claude *is* the process we started
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
        assert key.encode() not in cmdline and key.encode() not in environ
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=TIMEOUT) == -signal.SIGTERM  # the signal reached claude
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert key.encode() not in out + err
    assert rec["helper_key"] == key and rec["helper_exit"] == 0  # what claude would send
    argv = rec["argv"]
    assert argv[0] == "-p" and argv[1] == "--settings"
    assert argv[3:] == ["--model", "sonnet", "--permission-mode", "bypassPermissions",
                        "--output-format", "json", "hello there"]
    assert all(key not in arg for arg in argv)
    fifo = _helper_of(argv).split("cat ", 1)[1].strip("'")
    assert Path(fifo).parent == Path(os.environ["FLEET_WORKER_CONFIG_DIR"])
    assert not Path(fifo).exists()  # read once, then gone
    env = rec["env"]
    assert "ANTHROPIC_AUTH_TOKEN" not in env and "ANTHROPIC_API_KEY" not in env
    assert env["CLAUDE_CODE_API_KEY_HELPER_TTL_MS"] == "2147483647"
    assert env["CLAUDE_CONFIG_DIR"] == os.environ["FLEET_WORKER_CONFIG_DIR"]
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["DISABLE_TELEMETRY"] == "1"


def test_the_key_pipe_gives_the_key_once(record: Path, key: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A second reader (a tool running the same helper command) gets nothing."""
    assert run_worker("hi").returncode == 0
    rec = standin_claude.read_record(record)
    assert rec["helper_key"] == key
    again = subprocess.run(["/bin/sh", "-c", _helper_of(rec["argv"])], capture_output=True,
                           text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert again.returncode != 0 and key not in again.stdout


def test_key_helper_off_puts_the_key_in_claudes_environment(
        record: Path, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_WORKER_KEY_HELPER", "0")
    assert run_worker("hi").returncode == 0
    rec = standin_claude.read_record(record)
    assert rec["env"]["ANTHROPIC_AUTH_TOKEN"] == key and rec["helper_key"] is None
    assert rec["argv"][:5] == ["-p", "--model", "sonnet", "--permission-mode",
                               "bypassPermissions"]
    # and a --settings of the caller's own wins over the handoff, with a warning
    monkeypatch.delenv("FLEET_WORKER_KEY_HELPER")
    own = run_worker("--settings", "{}", "hi")
    assert own.returncode == 0 and "--settings is given" in own.stderr
    assert standin_claude.read_record(record)["env"]["ANTHROPIC_AUTH_TOKEN"] == key


@pytest.mark.parametrize("code", [0, 1, 3])
def test_claudes_exit_code_passes_through(record: Path, key: str, code: int,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_STANDIN_EXIT", str(code))
    assert run_worker("hi").returncode == code
    assert standin_claude.read_record(record)["argv"][-1] == "hi"


def test_prompt_piped_on_stdin_reaches_claude(record: Path, key: str) -> None:
    """Original defect 1: the launcher replaced stdin with /dev/null."""
    prompt = "Summarise README.md\nin three bullet points.\n"
    result = run_worker("--output-format", "json", input=prompt)
    assert result.returncode == 0, result.stderr
    rec = standin_claude.read_record(record)
    assert rec["stdin"] == prompt and rec["stdin_is_devnull"] is False


def test_terminal_stdin_becomes_dev_null(record: Path, key: str) -> None:
    master, slave = pty.openpty()
    try:
        proc = subprocess.run(worker_cmd("hi"), stdin=slave, capture_output=True,
                              timeout=TIMEOUT)
    finally:
        os.close(slave)
        os.close(master)
    assert proc.returncode == 0, proc.stderr
    rec = standin_claude.read_record(record)
    assert rec["stdin_is_devnull"] is True and rec["stdin"] == ""


def test_inherited_credentials_do_not_reach_the_worker(record: Path, key: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Original defect 6: ANTHROPIC_API_KEY went on, and a token for another endpoint
    was used; FLEET_WORKER_KEY_SOURCES keeps the exported token out."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "other-api-key")
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "token-for-api.anthropic.com")
    monkeypatch.setenv("CLAUDE_CODE_OAUTH_TOKEN", "oauth-token")
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", "/host/.claude")
    monkeypatch.setenv("FLEET_WORKER_KEY_SOURCES", "zhipu,glm")
    assert run_worker("hi").returncode == 0
    rec = standin_claude.read_record(record)
    env = rec["env"]
    assert rec["helper_key"] == key and "ANTHROPIC_AUTH_TOKEN" not in env
    assert "ANTHROPIC_API_KEY" not in env and "CLAUDE_CODE_OAUTH_TOKEN" not in env
    assert env["CLAUDE_CONFIG_DIR"] != "/host/.claude"


def test_effort_change_reaches_settings_json_on_every_launch(record: Path, key: str,
                                                            tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """Original defect 5: a later FLEET_WORKER_EFFORT was silently ignored."""
    settings_file = tmp_path / "cfg" / "settings.json"
    monkeypatch.setenv("FLEET_WORKER_EFFORT", "low")
    assert run_worker("hi").returncode == 0
    assert json.loads(settings_file.read_text())["effortLevel"] == "low"
    data = json.loads(settings_file.read_text())
    data["permissions"] = {"allow": ["Read"]}
    data["hooks"] = {"Stop": [{"hooks": [{"type": "command", "command": "echo host"}]}]}
    settings_file.write_text(json.dumps(data))
    monkeypatch.setenv("FLEET_WORKER_EFFORT", "high")
    assert run_worker("hi").returncode == 0
    data = json.loads(settings_file.read_text())
    assert data == {"effortLevel": "high", "hooks": {}, "permissions": {"allow": ["Read"]}}


def test_dontask_warning_and_the_equals_form(record: Path, key: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Original defect 7: `--allowedTools=Read` still produced the warning."""
    monkeypatch.setenv("FLEET_WORKER_PERMISSION_MODE", "dontAsk")
    warned = run_worker("hi")
    assert warned.returncode == 0 and "warning" in warned.stderr and "dontAsk" in warned.stderr
    quiet = run_worker("--allowedTools=Read", "hi")
    assert quiet.returncode == 0 and quiet.stderr == ""
    argv = standin_claude.read_record(record)["argv"]
    at = argv.index("--permission-mode")
    assert argv[at:at + 3] == ["--permission-mode", "dontAsk", "--allowedTools=Read"]


def test_dry_run_shows_the_isolated_env_with_the_key_redacted(
        record: Path, key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "inherited-secret-value")
    result = run_worker("--output-format", "json", "--dry-run", "hello")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert key not in out + result.stderr and "inherited-secret-value" not in out
    assert "key: from ZHIPU_API_KEY; handed to claude through a one-shot pipe" in out
    assert "ANTHROPIC_AUTH_TOKEN" not in out.replace("unset ANTHROPIC_API_KEY", "")
    assert "unset ANTHROPIC_API_KEY" in out
    assert f"CLAUDE_CONFIG_DIR={tmp_path / 'cfg'}" in out
    assert "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1" in out
    argv_line = next(line for line in out.splitlines() if line.startswith("argv: "))
    assert "--model sonnet --permission-mode bypassPermissions --output-format json hello" \
        in argv_line and "--dry-run" not in argv_line and "apiKeyHelper" in argv_line
    assert standin_claude.STANDIN_VERSION in out
    assert not record.exists() and not (tmp_path / "cfg").exists()  # nothing ran or changed
    monkeypatch.setenv("FLEET_WORKER_KEY_HELPER", "0")
    in_env = run_worker("--dry-run", "hello").stdout
    assert "ANTHROPIC_AUTH_TOKEN=<redacted: from ZHIPU_API_KEY>" in in_env
    assert key not in in_env


def test_help_anywhere_prints_our_usage(record: Path) -> None:
    result = run_worker("--output-format", "json", "--help", "prompt")
    assert result.returncode == 0
    for knob in ("FLEET_WORKER_CONFIG_DIR", "FLEET_WORKER_BASE_URL", "FLEET_WORKER_MODEL",
                 "FLEET_WORKER_SMALL_MODEL", "FLEET_WORKER_PERMISSION_MODE",
                 "FLEET_WORKER_EFFORT", "FLEET_WORKER_KEYRING_SERVICE",
                 "FLEET_WORKER_KEYRING_KEY", "FLEET_WORKER_CLAUDE", "FLEET_WORKER_SANDBOX",
                 "--dry-run", "exit codes"):
        assert knob in result.stdout
    assert not record.exists()
    assert run_worker("-h").returncode == 0


def test_missing_claude_and_missing_key_exit_5(record: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLM_API_KEY", "g-key-123456")
    monkeypatch.setenv("FLEET_WORKER_CLAUDE", str(tmp_path / "no-such-claude"))
    missing = run_worker("hi")
    assert missing.returncode == 5 and "FLEET_WORKER_CLAUDE" in missing.stderr
    monkeypatch.setenv("FLEET_WORKER_CLAUDE", "claude")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert run_worker("hi").returncode == 5
    monkeypatch.delenv("GLM_API_KEY")
    monkeypatch.setenv("FLEET_WORKER_CLAUDE", str(standin_claude.install(tmp_path / "bin")))
    nokey = run_worker("hi")
    assert nokey.returncode == 5
    assert "ZHIPU_API_KEY" in nokey.stderr and "fleet-tui key set" in nokey.stderr
    assert "Traceback" not in missing.stderr + nokey.stderr
    assert not record.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the root check needs root")
def test_root_with_bypass_needs_the_sandbox_opt_in(record: Path, key: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_WORKER_SANDBOX", raising=False)
    refused = run_worker("hi")
    assert refused.returncode == 2 and "FLEET_WORKER_SANDBOX=1" in refused.stderr
    assert not record.exists()
    assert run_worker("--permission-mode", "acceptEdits", "hi").returncode == 0
    assert "IS_SANDBOX" not in standin_claude.read_record(record)["env"]
    record.unlink()
    monkeypatch.setenv("FLEET_WORKER_SANDBOX", "1")
    assert run_worker("hi").returncode == 0
    assert standin_claude.read_record(record)["env"]["IS_SANDBOX"] == "1"


def test_non_root_runs_bypass_without_the_opt_in(key: str) -> None:
    """The counterpart of the root test, run on every machine (as root, fleet-worker runs
    as nobody): a normal user's bypassPermissions run needs no opt-in, and claude is not
    told it runs in a sandbox."""
    from nonroot import non_root

    with non_root() as user:
        record = user.root / "record.json"
        user.env.update(FLEET_WORKER_CLAUDE=str(standin_claude.install(user.root / "bin")),
                        FLEET_WORKER_CONFIG_DIR=str(user.root / "cfg"),
                        FLEET_STANDIN_RECORD=str(record))
        user.env.pop("FLEET_WORKER_SANDBOX", None)
        user.own()
        result = user.run(worker_cmd("hi"), timeout=TIMEOUT)
        assert result.returncode == 0, result.stderr
        claude = standin_claude.read_record(record)
    assert "--permission-mode" in claude["argv"]
    assert claude["argv"][claude["argv"].index("--permission-mode") + 1] == "bypassPermissions"
    assert "IS_SANDBOX" not in claude["env"]


def test_usage_and_config_errors_exit_2_without_traceback(
        record: Path, key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_WORKER_PERMISSION_MODE", "yolo")
    bad_mode = run_worker("hi")
    assert bad_mode.returncode == 2 and "FLEET_WORKER_PERMISSION_MODE" in bad_mode.stderr
    monkeypatch.delenv("FLEET_WORKER_PERMISSION_MODE")
    cfg = tmp_path / "config.toml"
    cfg.write_text("model = 'x'\nmax_workers = [\n")
    monkeypatch.setenv("FLEET_TUI_CONFIG", str(cfg))
    bad_toml = run_worker("hi")
    assert bad_toml.returncode == 2 and f"{cfg}, line 2" in bad_toml.stderr
    monkeypatch.delenv("FLEET_TUI_CONFIG")
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "settings.json").write_text("{broken")
    bad_json = run_worker("hi")
    assert bad_json.returncode == 2 and "settings.json" in bad_json.stderr
    assert (tmp_path / "cfg" / "settings.json").read_text() == "{broken"
    for result in (bad_mode, bad_toml, bad_json):
        assert "Traceback" not in result.stderr and key not in result.stderr
    assert not record.exists()


_IMPORT_PROBE = """
import os, sys
before = set(sys.modules)  # what the interpreter and site (e.g. an editable finder) loaded
from fleet_tui.execution.local import fleet_worker as worker
def report(path, argv, env):
    heavy = [m for m in ("textual", "git", "msgspec", "keyring", "platformdirs", "tomllib")
             if m in sys.modules]
    print("HEAVY=" + ",".join(heavy))
    # stdlib modules that cost fleet-worker milliseconds each (bench 6)
    slow = [m for m in ("dataclasses", "pathlib", "json", "re", "typing", "contextlib",
                        "collections", "importlib.util")
            if m in sys.modules and m not in before]
    print("SLOW=" + ",".join(slow), flush=True)  # os._exit skips the flush of a pipe's buffer
    os._exit(0)
os.execve = report
sys.exit(worker.main(["hi"]))
"""


def test_worker_imports_only_what_it_needs(record: Path, monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "a-token-123456")
    fast = subprocess.run([sys.executable, "-c", _IMPORT_PROBE], capture_output=True,
                          text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert fast.stdout.split() == ["HEAVY=", "SLOW="], (fast.returncode, fast.stderr)
    # keyring is imported only when the keyring is actually consulted.
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN")
    monkeypatch.setenv("GLM_API_KEY", "g-token-123456")
    slow = subprocess.run([sys.executable, "-c", _IMPORT_PROBE], capture_output=True,
                          text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert slow.stdout.split()[:1] == ["HEAVY=keyring"], (slow.returncode, slow.stderr)


# -- the real claude ----------------------------------------------------------------------

@pytest.mark.real_claude
def test_dry_run_with_the_real_claude_reports_its_version(claude_bin: str, key: str,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    from fleet_tui import CLAUDE_CODE_VERSION

    monkeypatch.setenv("FLEET_WORKER_CLAUDE", claude_bin)
    result = run_worker("--dry-run", "hello")
    assert result.returncode == 0, result.stderr
    assert f"claude version: {CLAUDE_CODE_VERSION} (Claude Code)" in result.stdout
    assert key not in result.stdout + result.stderr


@pytest.mark.real_claude
def test_real_claude_gets_piped_prompt_and_key_through_the_worker(
        claude_bin: str, key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: fleet-worker execs the real claude, which sends the piped prompt and
    our key (as a Bearer token) to the scripted endpoint, and its exit code comes back."""
    monkeypatch.setenv("FLEET_WORKER_CLAUDE", claude_bin)
    monkeypatch.setenv("FLEET_WORKER_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "must-not-be-sent")
    work = tmp_path / "work"
    work.mkdir()
    with ScriptedEndpoint(["All done: the prompt arrived."]) as endpoint:
        monkeypatch.setenv("FLEET_WORKER_BASE_URL", endpoint.url)
        prompt = "Reply with one line. piped-prompt-" + secrets.token_hex(4)
        proc = subprocess.run(worker_cmd("--output-format", "json"), input=prompt,
                              capture_output=True, text=True, timeout=120, cwd=work)
        requests = endpoint.requests
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["is_error"] is False and "the prompt arrived" in result["result"]
    messages = [r for r in requests if r.path.startswith("/v1/messages")]
    # the apiKeyHelper's key goes out as both headers (observed with 2.1.197 and 2.1.332)
    assert messages and all(r.auth_kind == "bearer+x-api-key" for r in messages)
    assert {r.auth_sha256 for r in messages} == {hashlib.sha256(key.encode()).hexdigest()}
    assert any(prompt in (r.prompt or "") for r in messages)
    assert {r.model for r in messages} <= {"GLM-5.2", "GLM-4.5-Air"}
    assert key not in proc.stdout + proc.stderr


def test_scrub_tool_env_sets_the_scrub_and_an_explicit_allowlist(
        record: Path, key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_WORKER_SCRUB_TOOL_ENV", "1")
    tools = tmp_path / "tools"  # bwrap and socat only need to be found on PATH
    tools.mkdir()
    for name in ("bwrap", "socat"):
        (tools / name).write_text("#!/bin/sh\nexit 0\n")
        (tools / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    assert run_worker("hi").returncode == 0
    rec = standin_claude.read_record(record)
    assert rec["env"]["CLAUDE_CODE_SUBPROCESS_ENV_SCRUB"] == "1"
    argv = rec["argv"]
    at = argv.index("--allowedTools")
    # claude forces the permission mode to default under the scrub: name the tools
    assert argv[at + 1:at + 4] == ["Bash", "Edit", "Write"] and "--model" in argv[at:]
    assert argv[-1] == "hi" and rec["helper_key"] == key
    own = run_worker("--allowedTools", "Read", "--", "hi")  # the caller's list is kept
    assert own.returncode == 0
    assert standin_claude.read_record(record)["argv"].count("--allowedTools") == 1
    (tools / "socat").unlink()  # without socat every Bash call would fail: refused
    monkeypatch.setenv("PATH", str(tools))  # the stand-in runs by absolute paths
    record.unlink()
    refused = run_worker("hi")
    assert refused.returncode == 2 and "apt-get install bubblewrap socat" in refused.stderr
    assert "socat is not installed" in refused.stderr and not record.exists()


# -- --endpoint NAME -----------------------------------------------------------------------

ENDPOINTS_TOML = '''
base_url = "http://127.0.0.1:9/default"

[endpoints.zai]
base_url = "{zai}"
key_env = "ZAI_WORKER_KEY"
model = "zai-main"
small_model = "zai-small"

[endpoints.other]
base_url = "{other}"
key_keyring = "other-worker-key"
model = "other-main"
'''


def endpoints_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                     zai: str = "http://127.0.0.1:9/zai",
                     other: str = "http://127.0.0.1:9/other") -> None:
    path = tmp_path / "config.toml"
    path.write_text(ENDPOINTS_TOML.format(zai=zai, other=other), encoding="utf-8")
    monkeypatch.setenv("FLEET_TUI_CONFIG", str(path))


def test_endpoint_names_the_url_models_and_its_own_key(
        record: Path, key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fleet-worker --endpoint NAME`: that endpoint's base URL and models, and its own key
    (its key_env's variable, its keyring entry), through the pipe as the usual key; no
    endpoint's key variable reaches claude's environment."""
    import keyring

    endpoints_config(tmp_path, monkeypatch)
    zai_key, other_key = ("sk-zai-" + secrets.token_hex(8), "sk-other-" + secrets.token_hex(8))
    monkeypatch.setenv("ZAI_WORKER_KEY", zai_key)
    keyring.set_password("fleet-worker", "other-worker-key", other_key)
    for name, url, model, want in (("zai", "http://127.0.0.1:9/zai", "zai-main", zai_key),
                                   ("other", "http://127.0.0.1:9/other", "other-main",
                                    other_key)):
        done = run_worker("--endpoint", name, "hi")
        assert done.returncode == 0, done.stderr
        rec = standin_claude.read_record(record)
        env = rec["env"]
        assert rec["helper_key"] == want, name  # not the usual key (ZHIPU_API_KEY)
        assert env["ANTHROPIC_BASE_URL"] == url
        assert env["ANTHROPIC_DEFAULT_SONNET_MODEL"] == model
        assert "ZAI_WORKER_KEY" not in env and "ZHIPU_API_KEY" not in env
        assert rec["argv"][-1] == "hi" and "--endpoint" not in rec["argv"]
        assert all(want not in arg for arg in rec["argv"])
    # the equals form, and the dry run names it with the key redacted
    dry = run_worker("--endpoint=zai", "--dry-run", "hi")
    assert dry.returncode == 0, dry.stderr
    assert "http://127.0.0.1:9/zai" in dry.stdout and zai_key not in dry.stdout
    # without --endpoint: the top-level settings and the usual key, as before
    assert run_worker("hi").returncode == 0
    assert standin_claude.read_record(record)["helper_key"] == key


def test_endpoint_errors_say_what_to_do(record: Path, key: str, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    endpoints_config(tmp_path, monkeypatch)
    unknown = run_worker("--endpoint", "nope", "hi")
    assert unknown.returncode == 2 and "unknown endpoint 'nope'" in unknown.stderr
    assert "default, zai, other" in unknown.stderr
    bare = run_worker("hi", "--endpoint")
    assert bare.returncode == 2 and "--endpoint needs a name" in bare.stderr
    monkeypatch.delenv("ZAI_WORKER_KEY", raising=False)
    missing = run_worker("--endpoint", "zai", "hi")  # its own key only: not ZHIPU_API_KEY
    assert missing.returncode == 5, missing.stderr
    assert "$ZAI_WORKER_KEY" in missing.stderr and "export ZAI_WORKER_KEY" in missing.stderr
    for done in (unknown, bare, missing):
        assert "Traceback" not in done.stderr and key not in done.stderr
    assert not record.exists()  # claude never ran


@pytest.mark.real_claude
def test_real_claude_reaches_the_named_endpoint_with_its_key(
        claude_bin: str, key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_WORKER_CLAUDE", claude_bin)
    monkeypatch.setenv("FLEET_WORKER_CONFIG_DIR", str(tmp_path / "cfg"))
    zai_key = "sk-zai-" + secrets.token_hex(8)
    monkeypatch.setenv("ZAI_WORKER_KEY", zai_key)
    work = tmp_path / "work"
    work.mkdir()
    with ScriptedEndpoint(["zai answered."]) as zai, ScriptedEndpoint(["unused"]) as other:
        endpoints_config(tmp_path, monkeypatch, zai=zai.url, other=other.url)
        proc = subprocess.run(worker_cmd("--endpoint", "zai", "--output-format", "json"),
                              input="answer", capture_output=True, text=True, timeout=120,
                              cwd=work)
        messages = zai.message_requests()
        assert other.requests == []
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "zai answered" in json.loads(proc.stdout)["result"]
    assert messages and {r.auth_sha256 for r in messages} \
        == {hashlib.sha256(zai_key.encode()).hexdigest()}
    assert {r.model for r in messages} <= {"zai-main", "zai-small"}
    assert zai_key not in proc.stdout + proc.stderr
