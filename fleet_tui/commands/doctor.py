"""fleet-doctor: is this machine ready to run workers, and (with --live) does the endpoint
answer our key?

Every check reports a status and a one-line detail; the key itself is never shown (only
where it came from). The live probe is made in-process with urllib, the key only in a
request header, so it cannot show up in `ps` (original defect 4: curl got it in argv).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fleet_tui import CLAUDE_CODE_VERSION, __version__
from fleet_tui.engine.localhost import launcher as local_launcher
from fleet_tui.settings.config import (
    ConfigError,
    Settings,
    config_file_path,
    load_settings,
    setting_sources,
)
from fleet_tui.settings.credentials import (
    LaunchError,
    check_sources,
    endpoint_credential,
    no_credential_message,
)

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_MISSING = 5
EXIT_AUTH = 6
EXIT_UNAVAILABLE = 7
EXIT_QUOTA = 8
EXIT_OVERLOADED = 9
EXIT_DRIFT = 10
EXIT_ACCOUNT = 11

EPILOG = f"""\
checks: settings (config.toml and FLEET_WORKER_*), claude found and its version, a key
resolvable (its source only), the isolated config dir writable and private (0700), the
host login trap (~/.claude.json oauthAccount, forceLoginMethod) as advice, root with
bypassPermissions and no FLEET_WORKER_SANDBOX=1, whether the tools claude runs can read
the key (key_helper; scrub_tool_env needs bubblewrap and socat, and bubblewrap must work
here), git present, `.fleet-work/` ignored in the current repository. --live also sends
one 1-token request to <base>/v1/messages (key in the `Authorization: Bearer` header, as
claude sends it), and one to every [endpoints.NAME] of config.toml with its own key and
model (`live NAME`; skipped when its key is not found).

exit codes (the first failing check decides; warnings never fail):
  {EXIT_OK}   ok
  {EXIT_CONFIG}   usage or configuration error (bad setting, unusable config dir, root
      without the sandbox opt-in, scrub_tool_env without a working bubblewrap)
  {EXIT_MISSING}   claude not found, or no key
  {EXIT_AUTH}   --live: the endpoint rejected the key (HTTP 401/403)
  {EXIT_UNAVAILABLE}   --live: endpoint unavailable (connection error, timeout, other HTTP status)
  {EXIT_QUOTA}   --live: quota or rate limit (HTTP 429)
  {EXIT_OVERLOADED}   --live: endpoint overloaded (HTTP 529)
  {EXIT_DRIFT}  --live: HTTP 404: the base URL or API path has drifted
  {EXIT_ACCOUNT}  --live: the account cannot be used (z.ai: in arrears, plan expired, model
      not in the plan, fair-use restriction)

--live names a provider's refusal by its verdict (window, quota, concurrency, account,
auth, model_overload), its code and its words; for a closed usage window it says when the
window resets (the time read in the zone that puts it inside the window).

fleet-doctor {__version__}; tested with Claude Code {CLAUDE_CODE_VERSION}.
"""


@dataclass
class Check:
    """One line of the report. `exit_code` is used only when status is fail."""

    check: str
    status: str
    detail: str
    exit_code: int = 0

    def as_json(self) -> dict[str, str]:
        return {"check": self.check, "status": self.status, "detail": self.detail}


@dataclass
class Context:
    env: Mapping[str, str]
    settings: Settings | None = None
    secret: str = ""
    claude_path: str | None = None
    claude_version: str | None = None
    secret_sources: tuple[str, ...] = ()  # environment variables that hold a key
    meta: dict[str, object] = field(default_factory=dict)
    # each named endpoint's key, when found: its live probe's, and redacted
    endpoint_keys: dict[str, str] = field(default_factory=dict)

    @property
    def secrets(self) -> tuple[str, ...]:
        return (self.secret, *self.endpoint_keys.values())


def _settings_check(ctx: Context) -> Check:
    path = config_file_path(ctx.env)
    try:
        ctx.settings = load_settings(env=ctx.env)
    except ConfigError as exc:
        return Check("settings", FAIL, str(exc), EXIT_CONFIG)
    sources = setting_sources(env=ctx.env)
    where = f"{path}" if path.exists() else f"no config file ({path} absent)"
    s = ctx.settings

    def shown(name: str, value: str) -> str:
        source = sources.get(name, "default")
        origin = "default" if source == "default" else \
            "config.toml" if source == str(path) else source
        return f"{name} {value} ({origin})"

    return Check("settings", OK, f"{where}; " + ", ".join(
        shown(name, getattr(s, name))
        for name in ("base_url", "model", "small_model", "permission_mode")))


def _claude_check(ctx: Context, settings: Settings, timeout: float) -> Check:
    try:
        path = local_launcher().find_claude(settings, ctx.env)
    except LaunchError as exc:
        return Check("claude", FAIL, str(exc), EXIT_MISSING)
    ctx.claude_path = path
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL,
            env={**ctx.env, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                 "DISABLE_TELEMETRY": "1"})
    except subprocess.TimeoutExpired:
        return Check("claude", FAIL, f"{path} --version did not answer within {timeout:g} s",
                     EXIT_MISSING)
    except OSError as exc:
        return Check("claude", FAIL, f"cannot run {path}: {exc.strerror or exc}", EXIT_MISSING)
    first = (out.stdout.strip().splitlines() or [""])[0]
    if out.returncode != 0 or not first:
        return Check("claude", FAIL, f"{path} --version exited {out.returncode}",
                     EXIT_MISSING)
    ctx.claude_version = first.split()[0]
    note = "" if ctx.claude_version == CLAUDE_CODE_VERSION else \
        f" (fleet-tui is tested with {CLAUDE_CODE_VERSION})"
    return Check("claude", OK, f"{first} at {path}{note}")


def _key_check(ctx: Context, settings: Settings) -> Check:
    found, checks = check_sources(settings, ctx.env)
    if found is None:
        message = no_credential_message(settings, checks, ctx.env)
        return Check("key", FAIL, message, EXIT_MISSING)
    ctx.secret = found.value
    ctx.secret_sources = tuple(c.label for c in checks if c.found and c.kind != "keyring")
    return Check("key", OK, f"found in {found.source}")


def _endpoint_checks(ctx: Context, settings: Settings) -> list[Check]:
    """One line per named endpoint of config.toml: its URL and models, and
    whether its key resolves (where from, never the key). A named endpoint without a key
    warns: its tasks would fail to start, the default's still run."""
    out: list[Check] = []
    for endpoint in settings.endpoints[1:]:
        what = (f"{endpoint.base_url}, model {endpoint.model} (small {endpoint.small_model}), "
                f"max_workers {endpoint.max_workers}")
        try:
            found = endpoint_credential(settings, endpoint, ctx.env)
        except LaunchError as exc:
            out.append(Check(f"endpoint {endpoint.name}", WARN,
                             f"{what}; {' '.join(str(exc).split())}"))
            continue
        ctx.endpoint_keys[endpoint.name] = found.value
        out.append(Check(f"endpoint {endpoint.name}", OK, f"{what}; key found in "
                         f"{found.source}"))
    return out


def _config_dir_check(settings: Settings) -> Check:
    path = Path(os.path.abspath(settings.config_dir))
    if not path.exists():
        parent = path.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if os.access(parent, os.W_OK | os.X_OK):
            return Check("config_dir", OK, f"{path} will be created (0700) at the first launch")
        return Check("config_dir", FAIL, f"{path} does not exist and {parent} is not writable",
                     EXIT_CONFIG)
    if not path.is_dir():
        return Check("config_dir", FAIL, f"{path} exists and is not a directory", EXIT_CONFIG)
    if not os.access(path, os.W_OK | os.X_OK):
        return Check("config_dir", FAIL, f"{path} is not writable", EXIT_CONFIG)
    try:
        local_launcher().read_user_settings(path)
    except LaunchError as exc:
        return Check("config_dir", FAIL, str(exc), EXIT_CONFIG)
    mode = path.stat().st_mode & 0o777
    if mode != 0o700:
        return Check("config_dir", WARN, f"{path} has mode {mode:04o}; fleet-worker sets it to "
                     "0700 at the next launch (or run: chmod 700 " + str(path) + ")")
    return Check("config_dir", OK, f"{path} is writable, mode 0700")


def _login_trap_check(env: Mapping[str, str]) -> Check:
    """Spec §4: a host logged into a subscription sends its OAuth token instead of ours
    unless the config dir is isolated. fleet-worker isolates it; this is advice for
    anyone running claude against the endpoint by hand."""
    home = Path(env.get("HOME") or Path.home())
    found: list[str] = []
    try:
        data = json.loads((home / ".claude.json").read_text(encoding="utf-8"))
        if isinstance(data, dict) and data.get("oauthAccount"):
            found.append("~/.claude.json holds an oauthAccount (subscription login)")
    except (OSError, ValueError):
        pass
    try:
        data = json.loads((home / ".claude" / "settings.json").read_text(encoding="utf-8"))
        if isinstance(data, dict) and data.get("forceLoginMethod"):
            found.append(f"~/.claude/settings.json sets forceLoginMethod="
                         f"{data['forceLoginMethod']}")
    except (OSError, ValueError):
        pass
    if not found:
        return Check("host_login", OK, "no subscription login in ~/.claude.json or "
                     "~/.claude/settings.json")
    return Check("host_login", WARN, "; ".join(found) + ". fleet-worker is not affected (it "
                 "uses its own CLAUDE_CONFIG_DIR), but plain `claude` pointed at the endpoint "
                 "would send the subscription token and get 401: never run it without "
                 "CLAUDE_CONFIG_DIR set to a separate dir.")


def _root_check(settings: Settings) -> Check:
    if local_launcher().current_euid() != 0:
        return Check("root", OK, "not running as root")
    if settings.permission_mode != "bypassPermissions":
        return Check("root", OK, f"running as root; permission mode {settings.permission_mode}"
                     " does not need the sandbox opt-in")
    if settings.sandbox:
        return Check("root", OK, "running as root with FLEET_WORKER_SANDBOX=1: claude gets "
                     "IS_SANDBOX=1 and accepts bypassPermissions")
    if settings.cage == "worker":
        return Check("root", OK, "running as root: a caged worker is sandboxed, so claude "
                     "gets IS_SANDBOX=1 and accepts bypassPermissions")
    return Check("root", FAIL, local_launcher().ROOT_MESSAGE, EXIT_CONFIG)


_EXPORTED = ("ANTHROPIC_AUTH_TOKEN", "ZHIPU_API_KEY", "GLM_API_KEY")


def _tool_env_check(ctx: Context, settings: Settings, timeout: float) -> Check:
    """Can the tools claude runs read the key? key_helper keeps it out of their
    environment; scrub_tool_env (bubblewrap, socat) also hides claude's own process."""
    path = ctx.env.get("PATH", os.defpath)
    exported = [name for name in _EXPORTED if name in ctx.secret_sources]
    note = ""
    if exported:
        note = (f"; note: {exported[0]} is exported in this shell, so every process started "
                "from it carries the key in its environment (/proc/PID/environ), which "
                "anything running as you can read: `fleet-tui key set` avoids that")
    if settings.cage == "worker":
        # the cage replaces scrub_tool_env: the key always goes through the pipe, and the
        # tools run in the cage's own pid namespace (the cage check says if it works here)
        unused = ("; scrub_tool_env is set but has no effect on a caged worker"
                  if settings.scrub_tool_env else "")
        return Check("tool_env", OK, "caged: the key reaches claude through a one-shot pipe "
                     "(apiKeyHelper), never its environment, and the tools it runs see no "
                     "process outside the cage (its own pid namespace), which is what "
                     "scrub_tool_env did for an uncaged worker" + unused + note)
    if settings.scrub_tool_env:
        unsupported = local_launcher().scrub_platform_message()
        if unsupported:
            return Check("tool_env", FAIL, unsupported, EXIT_CONFIG)
        missing = local_launcher().missing_scrub_programs(ctx.env)
        if missing:
            return Check("tool_env", FAIL, local_launcher().scrub_missing_message(missing),
                         EXIT_CONFIG)
        problem = local_launcher().bwrap_problem(ctx.env, timeout)
        if problem:
            return Check("tool_env", FAIL, local_launcher().bwrap_broken_message(problem),
                         EXIT_CONFIG)
        how = "its own pid namespace (bubblewrap)"
        return Check("tool_env", OK, f"scrub_tool_env: claude runs each tool without the key "
                     f"and in {how}; it forces the permission mode to default, so the "
                     "tools are listed with --allowedTools" + note)
    programs = local_launcher().SCRUB_PROGRAMS
    have = [name for name in programs if local_launcher().which(name, path)]
    extra = ("bubblewrap and socat are installed" if len(have) == len(programs)
             else "it needs bubblewrap and socat")
    if not settings.key_helper:
        return Check("tool_env", WARN, "key_helper is off: the key is in claude's environment, "
                     "so every tool it runs (Bash, hooks, MCP servers) can read it; set "
                     "FLEET_WORKER_KEY_HELPER=1, or FLEET_WORKER_SCRUB_TOOL_ENV=1 "
                     f"({extra})" + note)
    return Check("tool_env", OK, "the key reaches claude through a one-shot pipe "
                 "(apiKeyHelper), not its environment, so the tools it runs do not inherit "
                 "it; scrub_tool_env would also hide claude's own process from them "
                 f"({extra})" + note)


def _cage_check(ctx: Context, settings: Settings, timeout: float) -> Check:
    """Can workers be caged here (srt, node, bubblewrap, socat, ripgrep, user namespaces)?
    Runs one command in the cage to know."""
    launcher = local_launcher()

    if settings.cage == "off":
        return Check("cage", WARN, "cage is off: workers run as you, with your files (~/.ssh, "
                     "~/.aws, other repositories) and your network; set cage = \"worker\" "
                     "(the default) to run each in an OS sandbox")
    problem = launcher.cage_problems(ctx.env, run=True, timeout=timeout)
    if problem:
        return Check("cage", FAIL, problem if "cage" in problem else
                     f"the cage does not work here: {problem}. Allow unprivileged user "
                     "namespaces (or run where they are allowed), or set cage = \"off\"",
                     EXIT_CONFIG)
    return Check("cage", OK, "workers run caged (srt: bubblewrap on Linux, Seatbelt on "
                 "macOS): their worktree and config dir writable, the home hidden, the "
                 "network only to their endpoint and " + ", ".join(settings.allow_hosts[:3])
                 + (" ..." if len(settings.allow_hosts) > 3 else ""))


def _platform_check(system: str | None = None, portable: bool | None = None) -> Check:
    """The system and what it allows (README, "Supported systems")."""
    launcher = local_launcher()
    from fleet_tui.system import procs

    system = launcher.SYSTEM if system is None else system
    portable = procs.PORTABLE if portable is None else portable
    name = local_launcher().system_name(system)
    if system.startswith("linux") and not portable:
        return Check("platform", OK, "Linux: everything (the controller, local workers, "
                     "scrub_tool_env); a worker's processes are kept together by the child "
                     "subreaper and the parent-death signal, and found by its token")
    if system.startswith("linux"):
        return Check("platform", OK, f"Linux with {procs.PORTABLE_ENV}=1: processes are read "
                     "through psutil without the subreaper and the parent-death signal (the "
                     "macOS path); a worker's leftovers are found by its token")
    if system == "darwin":
        return Check("platform", OK, "macOS: the controller and local workers; processes are "
                     "read through psutil, and a worker's leftovers are found by its token "
                     "(no subreaper or parent-death signal here); scrub_tool_env (bubblewrap) "
                     "is Linux-only")
    return Check("platform", WARN, f"{name} is not supported: fleet-tui runs on Linux and "
                 "macOS (on Windows, inside WSL)")


def _git_checks(env: Mapping[str, str], cwd: Path) -> list[Check]:
    git = local_launcher().which("git", env.get("PATH", os.defpath))
    if git is None:
        return [Check("git", WARN, "git not found on PATH: fleet-tui needs it for worktrees "
                      "(fleet-worker alone does not)")]
    run_env = {**env, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    try:
        version = subprocess.run([git, "--version"], capture_output=True, text=True,
                                 timeout=10, env=run_env).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [Check("git", WARN, f"git did not run: {exc}")]
    checks = [Check("git", OK, f"{version} at {git}")]
    # the repository the engine would use, as it finds it (not git's front: diffs, merges)
    from fleet_tui.vcs.repository import find_repo
    from fleet_tui.vcs.run import GitError

    try:
        repo = find_repo(cwd)
    except GitError as exc:
        checks.append(Check("fleet_work_ignored", SKIP, str(exc)))
        return checks
    try:
        ignored = subprocess.run([git, "check-ignore", "-q", ".fleet-work/"],
                                 capture_output=True, text=True, timeout=10, cwd=repo,
                                 env=run_env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        checks.append(Check("fleet_work_ignored", WARN, f"git check-ignore did not run: {exc}"))
        return checks
    if ignored.returncode == 0:
        checks.append(Check("fleet_work_ignored", OK, f".fleet-work/ is ignored in {repo}"))
    else:
        checks.append(Check("fleet_work_ignored", WARN, f".fleet-work/ is not ignored in {repo}"
                            ": worktrees there would show up as untracked files. Add it: "
                            f"echo .fleet-work/ >> {repo}/.git/info/exclude"))
    return checks


def _git_identity_check(env: Mapping[str, str], cwd: Path) -> Check:
    """`fleet-tui merge` commits (the worker's changes, then the merge): without a git
    identity it cannot. `git var GIT_COMMITTER_IDENT` fails exactly when a commit would
    (user.useConfigOnly included)."""
    git = local_launcher().which("git", env.get("PATH", os.defpath))
    if git is None:
        return Check("git_identity", SKIP, "git not found")
    run_env = {**env, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    where = cwd if cwd.is_dir() else Path(env.get("HOME") or "/")
    try:
        idents = [subprocess.run([git, "var", var], capture_output=True, text=True,
                                 timeout=10, cwd=where, env=run_env)
                  for var in ("GIT_COMMITTER_IDENT", "GIT_AUTHOR_IDENT")]
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("git_identity", WARN, f"git var did not run: {exc}")
    if any(r.returncode != 0 for r in idents):
        return Check("git_identity", WARN, "git does not know who you are, so `fleet-tui "
                     "merge` cannot commit; set it: git config --global user.name \"Your "
                     "Name\" && git config --global user.email you@example.com")
    who = idents[0].stdout.strip().rsplit(" ", 2)[0]  # drop the timestamp and zone
    return Check("git_identity", OK, f"commits as {who}")


def _redact(text: str, *secrets: str) -> str:
    for secret in secrets:
        if len(secret) >= 6:
            text = text.replace(secret, "<redacted>")
    return text


def _live_checks(ctx: Context, settings: Settings, timeout: float) -> list[Check]:
    """The default endpoint's probe (`live`), then each named endpoint's with its own key
    and model (`live NAME`); one whose key was not found is skipped, saying so."""
    out = [_live_check(settings.base_url, settings.model, ctx.secret, timeout) if ctx.secret
           else Check("live", SKIP, "needs a key (see `key` above)")]
    for endpoint in settings.endpoints[1:]:
        name = f"live {endpoint.name}"
        secret = ctx.endpoint_keys.get(endpoint.name)
        if secret is None:
            out.append(Check(name, SKIP, f"no key found for it (see `endpoint "
                             f"{endpoint.name}` above)"))
            continue
        out.append(_live_check(endpoint.base_url, endpoint.model, secret, timeout, name))
    return out


def _live_check(base_url: str, model: str, secret: str, timeout: float,
                name: str = "live") -> Check:
    """One 1-token request to <base>/v1/messages, the key only in a header; redirects are
    not followed so the header never goes to another host."""
    import urllib.error
    import urllib.request

    url = base_url.rstrip("/") + "/v1/messages"
    body = json.dumps({"model": model, "max_tokens": 1,
                       "messages": [{"role": "user", "content": "ping"}]}).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Authorization": f"Bearer {secret}",
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
        "user-agent": f"fleet-doctor/{__version__}",
    })

    class _NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    opener = urllib.request.build_opener(_NoRedirect)
    how = f"POST {url} (key in the Authorization: Bearer header)"
    try:
        with opener.open(request, timeout=timeout) as response:
            status = int(response.status)
            reply = response.read(4096)
    except urllib.error.HTTPError as exc:
        status = exc.code
        try:
            reply = exc.read(4096)
        except OSError:
            reply = b""
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return Check(name, FAIL, _redact(f"{how}: endpoint unavailable: {reason}", secret),
                     EXIT_UNAVAILABLE)
    summary = _error_summary(reply)
    if status == 200:
        return Check(name, OK, f"{how}: HTTP 200, the endpoint accepted the key")
    named = _provider_check(status, reply.decode("utf-8", "replace"))
    if named is not None:
        detail, code = named
        return Check(name, FAIL, _redact(f"{how}: HTTP {status}: {detail}", secret), code)
    verdicts = {401: ("the endpoint rejected the key", EXIT_AUTH),
                403: ("the endpoint refused the key", EXIT_AUTH),
                404: ("not found: FLEET_WORKER_BASE_URL or the API path has drifted",
                      EXIT_DRIFT),
                429: ("quota or rate limit reached", EXIT_QUOTA),
                529: ("the endpoint is overloaded; try again later", EXIT_OVERLOADED)}
    text, code = verdicts.get(status, ("endpoint unavailable", EXIT_UNAVAILABLE))
    detail = f"{how}: HTTP {status}: {text}" + (f" ({summary})" if summary else "")
    return Check(name, FAIL, _redact(detail, secret), code)


def _provider_check(status: int, reply: str) -> tuple[str, int] | None:
    """A provider's refusal named as the engine names it (providers.py, the one table):
    its verdict, its code and words, and for a closed window when it resets; None for a
    refusal the table does not name (the status alone says it then)."""
    import time

    from fleet_tui.core import outcome, providers

    signal = providers.identify(reply, status)
    if signal is None or (signal.code.provider == "anthropic"
                          and signal.kind is not providers.Kind.WINDOW):
        return None
    verdict = outcome.KIND_VERDICT[signal.kind]
    detail = (f"verdict {verdict}: {signal.code.provider} {signal.code.name} "
              f"({signal.label or signal.code.what}): {signal.sentence[:200]}")
    if signal.kind is providers.Kind.WINDOW:
        now = time.time()
        reading = providers.read_reset(signal.reset, signal.window, now,
                                       zones=signal.code.zones)
        if reading.at is not None:
            left = max(0, int(reading.at - now))
            detail += (f"; it resets at {providers.clock_text(reading.at, now)} local time, "
                       f"in {left // 3600} h {left % 3600 // 60:02d} min (read as "
                       f"{reading.zone})")
        else:
            detail += f"; its reset time could not be used ({reading.why})"
    elif signal.code.advice:
        detail += f" — {signal.code.advice}"
    codes = {providers.Kind.WINDOW: EXIT_QUOTA, providers.Kind.RATE: EXIT_QUOTA,
             providers.Kind.CONCURRENCY: EXIT_QUOTA, providers.Kind.ACCOUNT: EXIT_ACCOUNT,
             providers.Kind.AUTH: EXIT_AUTH, providers.Kind.MODEL_OVERLOAD: EXIT_OVERLOADED,
             providers.Kind.OVERLOAD: EXIT_OVERLOADED}
    return detail, codes.get(signal.kind, EXIT_UNAVAILABLE)


def _error_summary(reply: bytes) -> str:
    """The endpoint's own error message, short, from an Anthropic-style error body."""
    try:
        data = json.loads(reply.decode("utf-8", "replace"))
    except ValueError:
        return ""
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        message = str(error.get("message") or error.get("type") or "")
        return " ".join(message.split())[:200]
    return ""


def run_checks(*, env: Mapping[str, str], cwd: Path, live: bool, timeout: float) -> tuple[
        list[Check], Context]:
    """All checks in order; later checks that need settings are skipped when they fail."""
    ctx = Context(env=env)
    checks = [_settings_check(ctx)]
    settings = ctx.settings
    if settings is None:
        for name in ("claude", "key", "config_dir", "root", "tool_env", "cage"):
            checks.append(Check(name, SKIP, "settings could not be loaded"))
    else:
        checks.append(_claude_check(ctx, settings, timeout))
        checks.append(_key_check(ctx, settings))
        checks.extend(_endpoint_checks(ctx, settings))
        checks.append(_config_dir_check(settings))
        checks.append(_root_check(settings))
        checks.append(_tool_env_check(ctx, settings, timeout))
        checks.append(_cage_check(ctx, settings, timeout))
    checks.append(_login_trap_check(env))
    checks.append(_platform_check())
    checks.extend(_git_checks(env, cwd))
    checks.append(_git_identity_check(env, cwd))
    if live:
        if settings is None:
            checks.append(Check("live", SKIP, "needs valid settings"))
        else:
            checks.extend(_live_checks(ctx, settings, timeout))
    ctx.meta = {
        "fleet_tui_version": __version__,
        "claude_version": ctx.claude_version,
        "claude_path": ctx.claude_path,
        "tested_claude_version": CLAUDE_CODE_VERSION,
        "config_file": str(config_file_path(env)),
        "config_dir": str(settings.config_dir) if settings else None,
        "base_url": settings.base_url if settings else None,
        "live": live,
    }
    return checks, ctx


def exit_code_for(checks: list[Check]) -> int:
    for check in checks:
        if check.status == FAIL:
            return check.exit_code or EXIT_UNAVAILABLE
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleet-doctor", description="Check that fleet-worker can run here.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--live", action="store_true",
                        help="also send one 1-token request to each endpoint, with its key")
    parser.add_argument("--json", action="store_true",
                        help="print {data: [{check, status, detail}], meta: {...}}")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="print only problems (warn and fail)")
    parser.add_argument("--timeout", type=float, default=20.0,
                        help="seconds to wait for claude --version and the live request")
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.timeout <= 0:
        sys.stderr.write("fleet-doctor: --timeout must be positive\n")
        return EXIT_CONFIG
    checks, ctx = run_checks(env=dict(os.environ), cwd=Path.cwd(), live=args.live,
                             timeout=args.timeout)
    code = exit_code_for(checks)
    shown = [c for c in checks if c.status in (WARN, FAIL)] if args.quiet else checks
    if args.json:
        meta = {**ctx.meta, "exit_code": code}
        text = json.dumps({"data": [c.as_json() for c in shown], "meta": meta}, indent=2)
        sys.stdout.write(_redact(text, *ctx.secrets) + "\n")
    else:
        width = max((len(c.check) for c in shown), default=0)
        indent = "\n" + " " * (width + 8)
        for c in shown:
            # A multi-line detail (the key's sources, how to set one) stays readable:
            # its further lines are indented under the first.
            detail = indent.join(line.rstrip() for line in c.detail.splitlines())
            sys.stdout.write(_redact(f"{c.status:<5} {c.check:<{width}}  {detail}\n",
                                     *ctx.secrets))
    return code
