"""fleet-worker: the drop-in replacement of the original launcher script.

All arguments go to claude; the process *becomes* claude (exec: same pid, so signals and
the exit code pass straight through). Only `--dry-run` and `-h/--help` are ours. Kept
lean: this runs before every worker, so it imports only config_core and the launch (no
dataclasses, pathlib, json or typing on the usual path; see those modules). It lives in the
local kind's folder: `fleet-worker` runs claude on this machine by definition (cli.py's
worker_main is its entry point); the launch it fronts is every host's
(execution/worker/launch.py).
"""

from __future__ import annotations

import os
import sys

from fleet_tui.core.errors import FleetTuiError
from fleet_tui.execution.worker.launch import LaunchError, plan_launch
from fleet_tui.settings.config_core import FIELD_NAMES, LaunchSettings, load_launch_settings

PROG = "fleet-worker"

USAGE = """\
usage: fleet-worker [--dry-run] [--endpoint NAME] [CLAUDE FLAGS...] "PROMPT"
       fleet-worker [--dry-run] [--endpoint NAME] [CLAUDE FLAGS...] < prompt.txt

Runs `claude -p --model sonnet --permission-mode MODE [CLAUDE FLAGS...] PROMPT` in an
isolated CLAUDE_CONFIG_DIR, pointed at an Anthropic-compatible endpoint. Every argument
except ours below is passed to claude unchanged; the process becomes claude, so its
pid, signals and exit code are claude's. A prompt piped on stdin reaches claude; when
stdin is a terminal, claude gets /dev/null instead (no wait for input). Put `--` before
the prompt when the flag before it takes a list (--allowedTools Read Edit -- "PROMPT").

options (ours; everything else goes to claude):
  --dry-run        print the environment changes (key redacted) and the argv; run nothing
  --endpoint NAME  an [endpoints.NAME] of config.toml: its base URL, models and its own
                   key (key_env, key_keyring; neither: the usual sources below)
  -h, --help       this text

settings (environment; also config.toml keys without the prefix, in lower case):
  FLEET_WORKER_CONFIG_DIR        isolated CLAUDE_CONFIG_DIR      (~/.fleet-worker/cfg)
  FLEET_WORKER_BASE_URL          endpoint          (https://api.z.ai/api/anthropic)
  FLEET_WORKER_MODEL             opus/sonnet model mapping                  (GLM-5.2)
  FLEET_WORKER_SMALL_MODEL       haiku model mapping                    (GLM-4.5-Air)
  FLEET_WORKER_PERMISSION_MODE   default, acceptEdits, plan, auto, dontAsk,
                                 bypassPermissions                (bypassPermissions)
                                 (a --permission-mode flag overrides it)
  FLEET_WORKER_EFFORT            effortLevel written to settings.json          (high)
  FLEET_WORKER_KEYRING_SERVICE   keyring service of the key            (fleet-worker)
  FLEET_WORKER_KEYRING_KEY       keyring entry name of the key              (api-key)
  FLEET_WORKER_KEY_SOURCES       where to look for the key, in order
                                 (env,keyring,zhipu,glm)
  FLEET_WORKER_CLAUDE            claude binary, a path or a name on PATH     (claude)
  FLEET_WORKER_SANDBOX=1         this machine is a sandbox: allow bypassPermissions as
                                 root (sets IS_SANDBOX=1 for claude)
  FLEET_WORKER_KEY_HELPER=0      put the key in claude's environment (default: claude
                                 reads it once from a pipe, so its tools never see it)
  FLEET_WORKER_SCRUB_TOOL_ENV=1  also run claude's tools without the key and in their own
                                 pid namespace (needs bubblewrap and socat; forces
                                 claude's permission mode to default with --allowedTools)
  FLEET_TUI_CONFIG               path of config.toml
                                 (default: ~/.config/fleet-tui/config.toml)

the key (first found): ANTHROPIC_AUTH_TOKEN, the OS keyring entry (`fleet-tui key set`),
ZHIPU_API_KEY, GLM_API_KEY. It reaches claude through a one-shot pipe read by its
apiKeyHelper (or, with FLEET_WORKER_KEY_HELPER=0, its environment), never its argv.
Inherited ANTHROPIC_* variables, CLAUDE_CODE_OAUTH_TOKEN and CLAUDE_CONFIG_DIR are removed.

exit codes: claude's own (0 ok, 1 auth/API/overload error); 2 usage or configuration
error; 5 claude not found or no key.
"""


def _split_own_options(argv: list[str]) -> tuple[bool, bool, str | None, list[str]]:
    """(dry_run, help, endpoint, arguments for claude). Ours are recognised anywhere
    before `--`."""
    dry_run = False
    want_help = False
    endpoint: str | None = None
    rest: list[str] = []
    args = iter(enumerate(argv))
    for index, arg in args:
        if arg == "--":
            rest.extend(argv[index:])
            break
        if arg == "--dry-run":
            dry_run = True
        elif arg in ("-h", "--help"):
            want_help = True
        elif arg == "--endpoint":
            endpoint = next(args, (0, ""))[1]
            if not endpoint or endpoint.startswith("-"):
                raise _EndpointUsage("--endpoint needs a name: an [endpoints.NAME] of "
                                     "config.toml")
        elif arg.startswith("--endpoint="):
            endpoint = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return dry_run, want_help, endpoint, rest


class _EndpointUsage(FleetTuiError):
    exit_code = 2


def _for_endpoint(name: str) -> tuple[LaunchSettings, dict[str, str]]:
    """The launch settings and the environment of a worker of the named endpoint: its URL,
    models and key source (endpoints.launch_overrides); a key_env endpoint's key handed as
    the "env" source's variable, and no endpoint's key_env variable left for claude's
    tools. Imported only here: the usual launch stays lean."""
    from fleet_tui.settings import endpoints
    from fleet_tui.settings.config_core import config_file_location
    from fleet_tui.settings.credentials import endpoint_credential

    top = load_launch_settings()
    every = endpoints.read_endpoints(config_file_location(), top)
    endpoint = endpoints.find(every, name)
    settings = load_launch_settings(overrides=endpoints.launch_overrides(endpoint))
    endpoint_credential(settings, endpoint)  # no key for it: NoCredentialError, exit 5
    return settings, endpoints.runner_env(endpoint, every, os.environ)


def _claude_version(path: str) -> str:
    """`claude --version` for the dry-run report (with a timeout; never fatal)."""
    import subprocess

    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=15,
                             stdin=subprocess.DEVNULL,
                             env={**os.environ, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({type(exc).__name__})"
    return (out.stdout.strip().splitlines() or ["unknown"])[0]


def _stdin_for_claude() -> None:
    """A terminal on stdin becomes /dev/null (claude would wait for input); a pipe or file
    is left untouched so a piped prompt reaches claude (original defect 1)."""
    try:
        is_tty = os.isatty(0)
        os.fstat(0)
        usable = True
    except OSError:
        is_tty, usable = False, False
    if is_tty or not usable:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)


def _err(message: str) -> None:
    sys.stderr.write(f"{PROG}: {message}\n")


def _uncaged(settings: LaunchSettings) -> LaunchSettings:
    if settings.cage == "off":
        return settings
    return LaunchSettings({**{name: getattr(settings, name) for name in FIELD_NAMES},
                           "cage": "off"})


def main(argv: list[str]) -> int:
    try:
        dry_run, want_help, endpoint, args = _split_own_options(argv)
        if want_help:
            sys.stdout.write(USAGE)
            return 0
        env: dict[str, str] | None = None
        if endpoint is None:
            settings = load_launch_settings()
        else:
            settings, env = _for_endpoint(endpoint)
        # fleet-worker runs claude here, as `claude` would run: uncaged (the cage is for
        # the workers fleet-tui starts), so root needs FLEET_WORKER_SANDBOX=1 as before.
        settings = _uncaged(settings)
        # The key reaches claude through a one-shot pipe (setting key_helper), so the
        # tools claude runs do not inherit it; dry runs show it without starting it.
        plan = plan_launch(settings, args, base_env=env, prepare=not dry_run,
                           key_handoff=True)
    except FleetTuiError as exc:  # a setting, the key, claude: the message and its code
        _err(f"error: {exc}")
        return exc.exit_code
    for warning in plan.warnings:
        _err(f"warning: {warning}")
    if dry_run:
        text = plan.describe()
        version = _claude_version(plan.argv[0])
        sys.stdout.write(f"{text}claude version: {version}\n")
        return 0
    _stdin_for_claude()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        if plan.cwd is not None:
            os.chdir(plan.cwd)
        plan.start_key_handoff()  # its writer outlives this exec: claude becomes its parent
        os.execve(plan.argv[0], plan.argv, plan.env)
    except LaunchError as exc:
        _err(f"error: {exc}")
        return exc.exit_code
    except OSError as exc:
        if plan.key_handoff is not None:
            plan.key_handoff.cancel()
        _err(f"error: cannot run {plan.argv[0]}: {exc.strerror or exc}")
        return 5
    return 0  # pragma: no cover - execve does not return
