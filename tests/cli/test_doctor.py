"""fleet-doctor: each check, the --json shape, -q, and --live against 127.0.0.1."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import standin_claude

from fleet_tui.commands import doctor
from fleet_tui.demo.endpoint import ScriptedEndpoint

# doctor checks the settings as a user has them: the cage is the default
pytestmark = pytest.mark.caged

DOCTOR_SCRIPT = Path(sys.executable).parent / "fleet-doctor"
TIMEOUT = 60


def _doctor_cmd(*args: str) -> list[str]:
    return [str(DOCTOR_SCRIPT), *args] if DOCTOR_SCRIPT.exists() else [
        sys.executable, "-c",
        "import sys; from fleet_tui.cli import doctor_main; sys.exit(doctor_main())", *args]


def run_doctor(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_doctor_cmd(*args), capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=cwd, stdin=subprocess.DEVNULL)


def as_json(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def by_check(report: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {row["check"]: row for row in report["data"]}


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    value = "sk-doctor-" + secrets.token_hex(20)
    monkeypatch.setenv("ZHIPU_API_KEY", value)
    return value


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, git_repo: Path) -> Path:
    """Stand-in claude, a private config dir, and a repository with .fleet-work ignored."""
    monkeypatch.setenv("FLEET_WORKER_CLAUDE", str(standin_claude.install(tmp_path / "bin")))
    monkeypatch.setenv("FLEET_WORKER_CONFIG_DIR", str(tmp_path / "cfg"))
    exclude = git_repo / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    exclude.write_text(".fleet-work/\n")
    return git_repo


def test_json_reports_every_check(setup: Path, key: str) -> None:
    result = run_doctor("--json", cwd=setup)
    assert result.returncode == 0, result.stdout + result.stderr
    report = as_json(result)
    checks = by_check(report)
    assert list(checks) == ["settings", "claude", "key", "config_dir", "root", "tool_env",
                            "cage", "host_login", "platform", "git", "fleet_work_ignored",
                            "git_identity"]
    assert all(set(row) == {"check", "status", "detail"} for row in report["data"])
    assert all(row["status"] == "ok" for row in report["data"]), report
    assert checks["key"]["detail"] == "found in ZHIPU_API_KEY"
    assert standin_claude.STANDIN_VERSION in checks["claude"]["detail"]
    assert "will be created" in checks["config_dir"]["detail"]
    assert "one-shot pipe" in checks["tool_env"]["detail"]
    assert "ZHIPU_API_KEY is exported" in checks["tool_env"]["detail"]
    assert report["meta"]["exit_code"] == 0 and report["meta"]["live"] is False
    assert report["meta"]["claude_version"] == "0.0.0-standin"
    assert key not in result.stdout + result.stderr


def test_human_output_and_quiet(setup: Path, key: str, tmp_path: Path) -> None:
    full = run_doctor(cwd=setup)
    assert full.returncode == 0
    assert [line.split()[1] for line in full.stdout.splitlines()][:3] == [
        "settings", "claude", "key"]
    assert run_doctor("-q", cwd=setup).stdout == ""  # nothing wrong, nothing printed
    (tmp_path / "cfg").mkdir(mode=0o755)
    (tmp_path / "cfg").chmod(0o755)
    quiet = run_doctor("-q", cwd=setup)
    assert quiet.returncode == 0  # a warning is not a failure
    assert quiet.stdout.splitlines() == [line for line in quiet.stdout.splitlines()
                                         if line.startswith("warn")]
    assert "mode 0755" in quiet.stdout and "chmod 700" in quiet.stdout


@pytest.mark.real_claude
def test_real_claude_version_is_reported(setup: Path, key: str, claude_bin: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet_tui import CLAUDE_CODE_VERSION

    monkeypatch.setenv("FLEET_WORKER_CLAUDE", claude_bin)
    report = as_json(run_doctor("--json", cwd=setup))
    assert report["meta"]["claude_version"] == CLAUDE_CODE_VERSION
    assert by_check(report)["claude"]["detail"].startswith(f"{CLAUDE_CODE_VERSION} (Claude Code)")


def test_missing_claude_or_key_exit_5(setup: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    result = run_doctor("--json", cwd=setup)  # no key anywhere
    assert result.returncode == 5
    detail = by_check(as_json(result))["key"]["detail"]
    assert "ANTHROPIC_AUTH_TOKEN: not set" in detail and "fleet-tui key set" in detail
    # In the text report each place looked in stands on its own, indented line.
    lines = run_doctor(cwd=setup).stdout.splitlines()
    sources = [line.strip() for line in lines if line.startswith(" ") and ": not set" in line]
    assert sources[:1] == ["- ANTHROPIC_AUTH_TOKEN: not set"] and len(sources) >= 3
    monkeypatch.setenv("GLM_API_KEY", "g-123456789")
    monkeypatch.setenv("FLEET_WORKER_CLAUDE", str(tmp_path / "nowhere" / "claude"))
    result = run_doctor("--json", cwd=setup)
    assert result.returncode == 5
    assert by_check(as_json(result))["claude"]["status"] == "fail"


@pytest.mark.skipif(os.geteuid() != 0, reason="the root check needs root")
def test_root_with_bypass_and_no_opt_in_fails(setup: Path, key: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_WORKER_SANDBOX", raising=False)
    # caged (the default), root needs no opt-in: the cage is the sandbox
    caged = by_check(as_json(run_doctor("--json", cwd=setup)))
    assert caged["root"]["status"] == "ok" and "caged" in caged["root"]["detail"]
    monkeypatch.setenv("FLEET_WORKER_CAGE", "off")
    result = run_doctor("--json", cwd=setup)
    assert result.returncode == 2
    assert "FLEET_WORKER_SANDBOX=1" in by_check(as_json(result))["root"]["detail"]


def test_non_root_with_bypass_needs_no_opt_in(key: str) -> None:
    """The counterpart of the root test, run on every machine (as root, the doctor runs as
    nobody): a normal user with bypassPermissions and no sandbox opt-in passes."""
    from nonroot import make_repo, non_root

    with non_root() as user:
        repo = make_repo(user.root / "repo")
        user.env.update(FLEET_WORKER_CLAUDE=str(standin_claude.install(user.root / "bin")),
                        FLEET_WORKER_CONFIG_DIR=str(user.root / "cfg"))
        user.env.pop("FLEET_WORKER_SANDBOX", None)
        # bubblewrap refuses to start with the capabilities this stand-in user inherits
        # (to read the checkout), so its cage cannot be checked here: test_cage.py does
        user.env["FLEET_WORKER_CAGE"] = "off"
        user.own()
        result = user.run(_doctor_cmd("--json"), cwd=repo, timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    checks = by_check(as_json(result))
    assert checks["settings"]["detail"].endswith("permission_mode bypassPermissions (default)")
    assert checks["root"]["status"] == "ok"
    assert checks["root"]["detail"] == "not running as root"


def test_host_login_trap_is_advice(setup: Path, key: str) -> None:
    home = Path(os.environ["HOME"])
    (home / ".claude.json").write_text(json.dumps({"oauthAccount": {"emailAddress": "x@y"}}))
    (home / ".claude").mkdir()
    (home / ".claude" / "settings.json").write_text(json.dumps({"forceLoginMethod": "claudeai"}))
    result = run_doctor("--json", "-q", cwd=setup)
    assert result.returncode == 0
    rows = as_json(result)["data"]
    assert [r["check"] for r in rows] == ["host_login"] and rows[0]["status"] == "warn"
    assert "oauthAccount" in rows[0]["detail"] and "forceLoginMethod" in rows[0]["detail"]


def test_fleet_work_not_ignored_is_flagged(setup: Path, key: str) -> None:
    (setup / ".git" / "info" / "exclude").write_text("")
    row = by_check(as_json(run_doctor("--json", cwd=setup)))["fleet_work_ignored"]
    assert row["status"] == "warn" and ".git/info/exclude" in row["detail"]


def test_bad_settings_and_corrupt_settings_json_exit_2(setup: Path, key: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cfg").mkdir(mode=0o700)
    (tmp_path / "cfg" / "settings.json").write_text("{nope")
    result = run_doctor("--json", cwd=setup)
    assert result.returncode == 2
    assert "settings.json" in by_check(as_json(result))["config_dir"]["detail"]
    monkeypatch.setenv("FLEET_WORKER_MAX_WORKERS", "lots")
    result = run_doctor("--json", cwd=setup)
    checks = by_check(as_json(result))
    assert result.returncode == 2 and checks["settings"]["status"] == "fail"
    assert "FLEET_WORKER_MAX_WORKERS" in checks["settings"]["detail"]
    assert checks["claude"]["status"] == "skip"


def test_help_documents_the_exit_codes(tmp_path: Path) -> None:
    result = run_doctor("--help", cwd=tmp_path)
    assert result.returncode == 0
    for text in ("--live", "--json", "-q", "401/403", "429", "529", "404", "unavailable"):
        assert text in result.stdout


# -- --live -------------------------------------------------------------------------------

@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with ScriptedEndpoint(["pong"]) as ep:
        yield ep


@pytest.mark.parametrize(("fault", "status", "code"), [
    (None, "ok", 0), (401, "fail", 6), (403, "fail", 6), (429, "fail", 8),
    (529, "fail", 9), (500, "fail", 7)])
def test_live_probe_maps_http_status_to_exit_code(
        setup: Path, key: str, endpoint: ScriptedEndpoint, monkeypatch: pytest.MonkeyPatch,
        fault: int | None, status: str, code: int) -> None:
    monkeypatch.setenv("FLEET_WORKER_BASE_URL", endpoint.url)
    if fault is not None:
        endpoint.set_faults([fault])
    result = run_doctor("--live", "--json", cwd=setup)
    assert result.returncode == code, result.stdout
    row = by_check(as_json(result))["live"]
    assert row["status"] == status
    assert "Authorization: Bearer" in row["detail"]
    if fault is not None:
        assert f"HTTP {fault}" in row["detail"]
    [request] = endpoint.requests
    assert request.path == "/v1/messages" and request.auth_kind == "bearer"
    assert request.auth_sha256 == hashlib.sha256(key.encode()).hexdigest()
    assert request.prompt == "ping" and request.model == "GLM-5.2"
    assert key not in result.stdout + result.stderr


@pytest.mark.parametrize(("fault", "code", "said"), [
    # z.ai's 5-hour window: its reset, written in Beijing time, read back and given
    ({"kind": "window", "seconds": 2 * 3600 + 900}, 8,
     r"HTTP 429: verdict window: z\.ai code 1308 \(5-hour window\): Usage limit reached "
     r"for 5 hour\. Your limit will reset at [0-9-]+ [0-9:]+; it resets at \d\d:\d\d local "
     r"time, in 2 h 1\d min \(read as UTC\+8, the provider's zone\)"),
    ({"kind": "zai", "code": "1113"}, 11,
     r"HTTP 429: verdict account: z\.ai code 1113 \(account in arrears\): Your account is "
     r"in arrears, please recharge and try again — recharge the account"),
    ({"kind": "zai", "code": "1302"}, 8,
     r"verdict concurrency: z\.ai code 1302 \(too many requests at once\)"),
    ({"kind": "zai", "code": "1312"}, 9,
     r"verdict model_overload: z\.ai code 1312 \(model overloaded\)"),
    ({"kind": "zai", "code": "1002", "status": 401}, 6,
     r"HTTP 401: verdict auth: z\.ai code 1002 \(invalid key\)"),
])
def test_live_probe_names_a_providers_refusal(
        setup: Path, key: str, endpoint: ScriptedEndpoint, monkeypatch: pytest.MonkeyPatch,
        fault: dict[str, Any], code: int, said: str) -> None:
    monkeypatch.setenv("FLEET_WORKER_BASE_URL", endpoint.url)
    endpoint.set_faults([fault])
    result = run_doctor("--live", "--json", cwd=setup)
    assert result.returncode == code, result.stdout
    row = by_check(as_json(result))["live"]
    assert row["status"] == "fail" and re.search(said, row["detail"]), row["detail"]
    assert key not in result.stdout + result.stderr


def test_live_probe_drift_and_unavailable(setup: Path, key: str, endpoint: ScriptedEndpoint,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_WORKER_BASE_URL", endpoint.url + "/api/anthropic")
    drift = run_doctor("--live", cwd=setup)
    assert drift.returncode == 10 and "drifted" in drift.stdout
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("FLEET_WORKER_BASE_URL", f"http://127.0.0.1:{port}")
    down = run_doctor("--live", "-q", cwd=setup)
    assert down.returncode == 7 and "unavailable" in down.stdout
    assert key not in drift.stdout + down.stdout


def test_live_probe_keeps_the_key_out_of_any_argv(setup: Path, key: str,
                                                  endpoint: ScriptedEndpoint,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Original defect 4: the key went into curl's arguments, visible to `ps`."""
    monkeypatch.setenv("FLEET_WORKER_BASE_URL", endpoint.url)
    started: list[list[str]] = []
    real_popen = subprocess.Popen

    def recording_popen(args: Any, *rest: Any, **kwargs: Any) -> Any:
        started.append([str(a) for a in args])
        return real_popen(args, *rest, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    monkeypatch.chdir(setup)
    assert doctor.main(["--live", "--json"]) == 0
    out = capsys.readouterr()
    assert started, "expected claude --version and git to run"
    assert all(key not in arg for argv in started for arg in argv)
    assert key not in out.out + out.err
    assert len(endpoint.requests) == 1  # the probe was made in-process


class _Redirector(http.server.BaseHTTPRequestHandler):
    target = ""

    def do_POST(self) -> None:
        self.send_response(307)
        self.send_header("Location", self.target)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_live_probe_does_not_follow_redirects_with_the_key(setup: Path, key: str,
                                                           endpoint: ScriptedEndpoint,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    handler = type("Redirect", (_Redirector,), {"target": endpoint.url + "/v1/messages"})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("FLEET_WORKER_BASE_URL", f"http://127.0.0.1:{server.server_port}")
        result = run_doctor("--live", "--json", cwd=setup)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert result.returncode == 7
    assert "HTTP 307" in by_check(as_json(result))["live"]["detail"]
    assert endpoint.requests == []  # the key was not carried to the redirect target


def _tools(folder: Path, **scripts: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    return folder


def test_tool_env_reports_who_can_read_the_key(setup: Path, key: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 17: key_helper off is a warning; scrub_tool_env needs bubblewrap and socat
    on PATH (else exit 2) and a bubblewrap that can make a sandbox here. All of it is about
    an uncaged worker (cage off): a caged one always gets the key through the pipe and runs
    its tools in the cage's pid namespace, whatever these settings say."""
    monkeypatch.setenv("FLEET_WORKER_KEY_HELPER", "0")
    monkeypatch.setenv("FLEET_WORKER_SCRUB_TOOL_ENV", "1")
    caged = by_check(as_json(run_doctor("--json", cwd=setup)))["tool_env"]
    assert caged["status"] == "ok" and "caged: the key reaches claude through a one-shot " \
        "pipe" in caged["detail"] and "has no effect on a caged worker" in caged["detail"]
    monkeypatch.delenv("FLEET_WORKER_SCRUB_TOOL_ENV")
    monkeypatch.setenv("FLEET_WORKER_CAGE", "off")
    off = by_check(as_json(run_doctor("--json", cwd=setup)))["tool_env"]
    assert off["status"] == "warn" and "every tool it runs" in off["detail"]
    monkeypatch.delenv("FLEET_WORKER_KEY_HELPER")
    monkeypatch.setenv("FLEET_WORKER_SCRUB_TOOL_ENV", "1")
    bare = _tools(tmp_path / "bare", git='exec /usr/bin/git "$@"')
    monkeypatch.setenv("PATH", str(bare))
    missing = run_doctor("--json", cwd=setup)
    row = by_check(as_json(missing))["tool_env"]
    assert missing.returncode == 2 and row["status"] == "fail"
    assert "bwrap and socat are not installed" in row["detail"]
    assert "apt-get install bubblewrap socat" in row["detail"]
    broken = _tools(tmp_path / "broken", git='exec /usr/bin/git "$@"', socat="exit 0",
                    bwrap="echo 'bwrap: No permissions to create new namespace' >&2; exit 1")
    monkeypatch.setenv("PATH", str(broken))
    refused = run_doctor("--json", cwd=setup)
    row = by_check(as_json(refused))["tool_env"]
    assert refused.returncode == 2 and "No permissions to create new namespace" in row["detail"]


def test_tool_env_with_a_working_bubblewrap(setup: Path, key: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    if not (shutil.which("bwrap") and shutil.which("socat")):
        pytest.skip("needs bubblewrap and socat installed (apt-get install bubblewrap socat)")
    monkeypatch.setenv("FLEET_WORKER_CAGE", "off")  # scrub_tool_env is an uncaged worker's
    monkeypatch.setenv("FLEET_WORKER_SCRUB_TOOL_ENV", "1")
    result = run_doctor("--json", cwd=setup)
    row = by_check(as_json(result))["tool_env"]
    if row["status"] == "fail":  # installed, but this machine allows no namespaces
        assert result.returncode == 2 and "cannot make a sandbox" in row["detail"]
    else:
        assert result.returncode == 0 and "own pid namespace" in row["detail"]


@pytest.mark.parametrize(("make", "expected"), [
    (lambda d: subprocess.run(["git", "init", "-q", "--bare", str(d)], check=True),
     "is a bare repository"),
    (lambda d: subprocess.run(["git", "init", "-q", str(d)], check=True), "has no commit yet"),
])
def test_the_repository_is_found_as_the_engine_finds_it(
        setup: Path, key: str, tmp_path: Path, make: Any, expected: str) -> None:
    """fleet-doctor finds the repository with git.find_repo, as fleet-tui does, so it says
    what fleet-tui would refuse (a raw `git rev-parse --show-toplevel` called a bare
    repository "not a git repository" and passed a repository without a commit)."""
    where = tmp_path / "not-set-up"
    make(where)
    row = by_check(as_json(run_doctor("--json", cwd=where)))["fleet_work_ignored"]
    assert row["status"] == "skip" and expected in row["detail"], row


def test_doctor_runs_no_git_plumbing_of_its_own() -> None:
    """Finding the repository is git.py's (one rule for what a usable repository is)."""
    source = Path(doctor.__file__).read_text(encoding="utf-8")
    assert '"rev-parse"' not in source and "find_repo" in source


def test_the_platform_is_reported_with_what_it_allows(setup: Path, key: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """fleet-doctor says which system this is and which process path it takes; on macOS
    it says scrub_tool_env is Linux-only, and turning it on there fails the check."""
    from fleet_tui.execution.worker import launch as launcher
    from fleet_tui.settings.config import load_settings

    monkeypatch.delenv("FLEET_TUI_PORTABLE_PROCS", raising=False)  # a portable suite run
    linux = by_check(as_json(run_doctor("--json", cwd=setup)))["platform"]
    assert linux["status"] == "ok" and linux["detail"].startswith("Linux: everything")
    monkeypatch.setenv("FLEET_TUI_PORTABLE_PROCS", "1")
    portable = by_check(as_json(run_doctor("--json", cwd=setup)))["platform"]
    assert "FLEET_TUI_PORTABLE_PROCS=1" in portable["detail"] and "psutil" in portable["detail"]
    mac = doctor._platform_check(system="darwin", portable=True)
    assert mac.status == "ok" and "macOS" in mac.detail and "Linux-only" in mac.detail
    assert doctor._platform_check(system="win32", portable=True).status == "warn"
    monkeypatch.setattr(launcher, "SYSTEM", "darwin")
    monkeypatch.setenv("FLEET_WORKER_CAGE", "off")  # scrub_tool_env is an uncaged worker's
    monkeypatch.setenv("FLEET_WORKER_SCRUB_TOOL_ENV", "1")
    ctx = doctor.Context(env=dict(os.environ))
    settings = load_settings(env=ctx.env)
    row = doctor._tool_env_check(ctx, settings, 5.0)
    assert row.status == "fail" and "Linux-only" in row.detail


def test_live_probes_every_named_endpoint_with_its_own_key(
        setup: Path, key: str, endpoint: ScriptedEndpoint, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--live with [endpoints.NAME] tables: the default endpoint's probe, then
    one per named endpoint, each with its own key and model; one whose key is not found
    is skipped; one that refuses its key fails with the exit code of that refusal."""
    import keyring

    zai_key, other_key = ("sk-zai-" + secrets.token_hex(8), "sk-other-" + secrets.token_hex(8))
    with ScriptedEndpoint(["pong"]) as zai, ScriptedEndpoint(["pong"]) as other:
        config = tmp_path / "config.toml"
        config.write_text(f'''
[endpoints.zai]
base_url = "{zai.url}"
key_env = "ZAI_DOCTOR_KEY"
model = "zai-main"

[endpoints.other]
base_url = "{other.url}"
key_keyring = "other-doctor-key"
model = "other-main"

[endpoints.nokey]
base_url = "http://127.0.0.1:9/nokey"
key_env = "NOKEY_DOCTOR_KEY"
''', encoding="utf-8")
        monkeypatch.setenv("FLEET_TUI_CONFIG", str(config))
        monkeypatch.setenv("FLEET_WORKER_BASE_URL", endpoint.url)
        monkeypatch.setenv("ZAI_DOCTOR_KEY", zai_key)
        keyring.set_password("fleet-worker", "other-doctor-key", other_key)
        result = run_doctor("--live", "--json", cwd=setup)
        assert result.returncode == 0, result.stdout + result.stderr
        rows = by_check(as_json(result))
        assert rows["live"]["status"] == "ok"
        assert rows["live zai"]["status"] == "ok" and zai.url in rows["live zai"]["detail"]
        assert rows["live other"]["status"] == "ok"
        assert rows["live nokey"]["status"] == "skip"
        for ep, secret, model in ((endpoint, key, "GLM-5.2"), (zai, zai_key, "zai-main"),
                                  (other, other_key, "other-main")):
            [request] = ep.requests
            assert request.auth_sha256 == hashlib.sha256(secret.encode()).hexdigest()
            assert request.model == model
        # a named endpoint that refuses its key: the report fails with the auth code
        other.set_faults([401])
        refused = run_doctor("--live", cwd=setup)
        assert refused.returncode == 6, refused.stdout
        line = next(r for r in refused.stdout.splitlines() if "live other" in r)
        assert line.startswith("fail") and "rejected the key" in line
        out = result.stdout + result.stderr + refused.stdout + refused.stderr
        assert all(s not in out for s in (key, zai_key, other_key))
