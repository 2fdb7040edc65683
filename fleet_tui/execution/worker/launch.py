"""Turn settings and a credential into one isolated `claude -p` process description.

This is the load-bearing part of fleet-worker (spec §4): a dedicated CLAUDE_CONFIG_DIR so
no host login or hook leaks in, inherited Anthropic credentials removed so only *our* key
reaches *our* endpoint, and the key carried only in the child's environment. It is a
library: nothing here prints or exits; `fleet-worker`, `fleet-doctor` and the engine's
runner decide what to do with a `LaunchPlan` or a `LaunchError`.

Startup cost matters (fleet-worker imports this on every launch): only `os` is imported
at the top. `keyring` is imported only when the keyring is consulted, `json` only when
settings.json holds more than fleet-worker wrote there itself, `pathlib` only when a
caller reads `LaunchPlan.config_dir` or `.cwd`. Paths are handled as strings inside.
"""

from __future__ import annotations

import os
import sys

from fleet_tui.settings.config_core import PERMISSION_MODES

# The key's sources are settings-level (settings/credentials.py); a launch resolves the key,
# and its callers catch the launch's errors, whose base is the credentials' one.
from fleet_tui.settings.credentials import Credential, endpoint_credential, resolve_credential
from fleet_tui.settings.credentials import LaunchError as LaunchError

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: these imports cost start-up time
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from fleet_tui.settings.config_core import SettingsLike as Settings
    from fleet_tui.settings.endpoints import Endpoint

    StrPath = str | os.PathLike[str]

# Inherited variables that would let another credential, login or config reach claude.
# ANTHROPIC_* covers ANTHROPIC_API_KEY / _AUTH_TOKEN / _BASE_URL / model overrides. The
# CLAUDE_CODE_USE_* switches would send every request to another provider altogether.
# ZHIPU_API_KEY and GLM_API_KEY are where our key may come from: claude gets the key its
# own way, and the tools it runs (which inherit its environment) get neither.
SCRUB_PREFIXES = ("ANTHROPIC_",)
SCRUB_NAMES = ("CLAUDE_CODE_OAUTH_TOKEN", "CLAUDE_CONFIG_DIR", "CLAUDE_CODE_USE_BEDROCK",
               "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY", "ZHIPU_API_KEY",
               "GLM_API_KEY")

ALLOWLIST_FLAGS = ("--allowedTools", "--allowed-tools")
SETTINGS_FILE = "settings.json"
REDACTED = "<redacted>"

# The key handoff (setting key_helper): claude reads the key once from a named pipe through
# its apiKeyHelper instead of ANTHROPIC_AUTH_TOKEN, so the tools it runs (Bash, hooks, MCP
# servers) never find it in their environment. Checked with CLI 2.1.197 and 2.1.332: the
# helper runs once, its answer is sent as `Authorization: Bearer` and `x-api-key`, and a
# helper that fails later keeps the cached key; the TTL below keeps claude from asking again
# (~24 days). A helper that never answers hangs claude, hence the `timeout` around `cat`.
KEY_HELPER_TTL_MS = "2147483647"
KEY_READ_TIMEOUT = 60  # seconds the helper waits for the pipe's writer
KEY_HANDOFF_TIMEOUT = 600  # seconds the writer waits for claude to ask
# scrub_tool_env: CLAUDE_CODE_SUBPROCESS_ENV_SCRUB=1 also runs every tool in its own pid
# namespace (bubblewrap; socat for its network proxy), so a tool cannot even read claude's
# /proc entries. claude then forces the permission mode to `default` and denies every tool
# not listed explicitly, so without a list of the user's own, these are allowed.
SCRUB_PROGRAMS = ("bwrap", "socat")
SCRUB_PACKAGES = "bubblewrap and socat"
SCRUB_ALLOWED_TOOLS = ("Bash", "Edit", "Write", "NotebookEdit", "Read", "WebFetch",
                       "WebSearch", "Task")


class UsageError(LaunchError):
    """Bad flags or settings, or a setup claude itself would refuse (exit 2)."""

    exit_code = 2


class ConfigDirError(LaunchError):
    """The isolated config dir or its settings.json cannot be used (exit 2)."""

    exit_code = 2


class ClaudeNotFoundError(LaunchError):
    """The claude binary is missing or not executable (exit 5, as the original)."""

    exit_code = 5


def which(name: str, search_path: str) -> str | None:
    """shutil.which for the common case (shutil costs fleet-worker startup time)."""
    for folder in search_path.split(os.pathsep):
        candidate = os.path.join(folder or os.curdir, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def find_claude(settings: Settings, env: Mapping[str, str] | None = None) -> str:
    """Absolute path of the claude binary: FLEET_WORKER_CLAUDE (a path or a name looked
    up on PATH), default `claude` on the caller's PATH."""
    return find_claude_named(settings.claude, env)


def find_claude_named(name: str, env: Mapping[str, str] | None = None) -> str:
    """`find_claude` for a name or path given directly (the demo asks before it has
    settings); ClaudeNotFoundError with how to install it when there is none."""
    env = os.environ if env is None else env
    hint = ("Install Claude Code (npm install -g @anthropic-ai/claude-code) or set "
            "FLEET_WORKER_CLAUDE to the path of the claude binary.")
    if os.sep in name or (os.altsep and os.altsep in name):
        path = os.path.abspath(os.path.expanduser(name))
        if not os.path.exists(path):
            raise ClaudeNotFoundError(f"claude not found: {path} does not exist. {hint}")
        if not os.path.isfile(path) or not os.access(path, os.X_OK):
            raise ClaudeNotFoundError(f"claude at {path} is not an executable file. {hint}")
        return path
    found = which(name, env.get("PATH", os.defpath))
    if found is None and name == "claude":
        # The copy `fleet-tui --demo` installs into fleet-tui's own data folder. Imported
        # here, not at the top: only this fallback pays for platformdirs.
        from fleet_tui.system import paths

        local = paths.cli_install_dir(env) / "node_modules" / ".bin" / "claude"
        if local.is_file() and os.access(local, os.X_OK):
            found = str(local)
    if found is None:
        raise ClaudeNotFoundError(f"claude not found: {name!r} is not on PATH. {hint}")
    return os.path.abspath(found)


def _settings_path(config_dir: StrPath) -> str:
    return os.path.join(os.fspath(config_dir), SETTINGS_FILE)


# What prepare_config_dir writes into a settings.json that holds nothing else (json.dump
# with indent=2 and ensure_ascii=False, and a newline). Recognising and producing exactly
# this text without the json module keeps ~8 ms (json pulls in `re`) off every launch.
_OURS_HEAD = '{\n  "effortLevel": "'
_OURS_TAIL = '",\n  "hooks": {}\n}\n'


def _plain_json_string(text: str) -> bool:
    """True when json.dumps(text, ensure_ascii=False) is just text in double quotes."""
    return '"' not in text and "\\" not in text and all(ch >= " " for ch in text)


def _parse_user_settings(path: str, text: str) -> dict[str, object]:
    if not text.strip():
        return {}
    if text.startswith(_OURS_HEAD) and text.endswith(_OURS_TAIL):
        effort = text[len(_OURS_HEAD):-len(_OURS_TAIL)]
        if _plain_json_string(effort):
            return {"effortLevel": effort, "hooks": {}}
    import json

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigDirError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}). "
            "Fix it or delete it; fleet-worker rewrites it at every launch but will not "
            "throw away settings it cannot read.") from None
    if not isinstance(data, dict):
        raise ConfigDirError(f"{path}: must hold a JSON object (it holds a "
                             f"{type(data).__name__}). Fix it or delete it.")
    return data


def _dump_user_settings(data: dict[str, object]) -> str:
    effort = data.get("effortLevel")
    if list(data) == ["effortLevel", "hooks"] and data["hooks"] == {} and \
            isinstance(effort, str) and _plain_json_string(effort):
        return f"{_OURS_HEAD}{effort}{_OURS_TAIL}"
    import json

    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def read_user_settings(config_dir: StrPath) -> dict[str, object]:
    """The JSON object in <config_dir>/settings.json ({} when absent). A corrupt file is a
    ConfigDirError naming it: it is the user's file and is never silently replaced."""
    path = _settings_path(config_dir)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigDirError(f"{path}: cannot read it ({exc})") from None
    return _parse_user_settings(path, text)


def _ensure_private_dir(path: str) -> None:
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except FileExistsError:
        raise ConfigDirError(f"config dir {path} exists and is not a directory") from None
    except OSError as exc:
        raise ConfigDirError(f"cannot create config dir {path}: {exc.strerror or exc}") from None
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConfigDirError(f"cannot use config dir {path}: {exc.strerror or exc}") from None
    if not (st.st_mode & 0o170000) == 0o040000:
        raise ConfigDirError(f"config dir {path} exists and is not a directory")
    try:
        if st.st_mode & 0o777 != 0o700:
            os.chmod(path, 0o700)
    except OSError as exc:
        raise ConfigDirError(f"cannot make config dir {path} private (0700): "
                             f"{exc.strerror or exc}") from None


def prepare_config_dir(path: StrPath, effort: str) -> None:
    """Create the isolated CLAUDE_CONFIG_DIR (0700) and rewrite its settings.json (0600)
    at every launch: effortLevel from the current setting (original defect 5: it was only
    written once and not JSON-escaped), hooks emptied so no host hook runs, every other
    key the user put there kept. The write is atomic, so parallel launches sharing a
    dir never see a half-written file."""
    _prepare_config_dir(os.fspath(path), effort)


def _prepare_config_dir(path: str, effort: str) -> dict[str, object]:
    """prepare_config_dir; returns what settings.json now holds."""
    _ensure_private_dir(path)
    data = read_user_settings(path)
    data["effortLevel"] = effort
    data["hooks"] = {}
    target = _settings_path(path)
    tmp = os.path.join(path, f".{SETTINGS_FILE}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(_dump_user_settings(data))
        os.chmod(tmp, 0o600)
        os.replace(tmp, target)
    except OSError as exc:
        # (not contextlib.suppress: contextlib costs fleet-worker ~5 ms to import)
        try:  # noqa: SIM105
            os.unlink(tmp)
        except OSError:
            pass
        raise ConfigDirError(f"cannot write {target}: {exc.strerror or exc}") from None
    return data


def _settings_allowlist(data: Mapping[str, object]) -> bool:
    permissions = data.get("permissions")
    if isinstance(permissions, dict):
        allow = permissions.get("allow")
        return isinstance(allow, list) and len(allow) > 0
    return False


def _options_part(args: Sequence[str]) -> list[str]:
    """The caller's arguments up to a `--` (after it everything is a positional)."""
    out: list[str] = []
    for arg in args:
        if arg == "--":
            break
        out.append(arg)
    return out


def has_allowlist_flag(args: Sequence[str]) -> bool:
    """True for --allowedTools X, --allowedTools=X, --allowed-tools X, --allowed-tools=X
    (original defect 7: the `=` form was not recognised)."""
    opts = _options_part(args)
    for index, arg in enumerate(opts):
        if arg in ALLOWLIST_FLAGS and index + 1 < len(opts):
            return True
        for flag in ALLOWLIST_FLAGS:
            if arg.startswith(flag + "=") and arg[len(flag) + 1:].strip():
                return True
    return False


def split_permission_mode(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """(the last --permission-mode given in args, args without it) so that the caller's
    mode overrides the setting and claude never receives two."""
    mode: str | None = None
    rest: list[str] = []
    items = list(args)
    index = 0
    while index < len(items):
        arg = items[index]
        if arg == "--":
            rest.extend(items[index:])
            break
        if arg == "--permission-mode":
            if index + 1 >= len(items):
                raise UsageError("--permission-mode needs a value: one of "
                                 + ", ".join(PERMISSION_MODES))
            mode = items[index + 1]
            index += 2
            continue
        if arg.startswith("--permission-mode="):
            mode = arg.split("=", 1)[1]
            index += 1
            continue
        rest.append(arg)
        index += 1
    return mode, rest


def current_euid() -> int:
    """The effective uid (a function so tests can simulate a non-root user)."""
    return os.geteuid() if hasattr(os, "geteuid") else -1


ROOT_MESSAGE = (
    "running as root with permission mode bypassPermissions: claude refuses that unless it "
    "runs in a sandbox. If this machine is a container or VM, set FLEET_WORKER_SANDBOX=1 "
    "(claude then gets IS_SANDBOX=1); otherwise run fleet-tui as a non-root user, or choose "
    "another permission mode, e.g. FLEET_WORKER_PERMISSION_MODE=dontAsk with --allowedTools.")


def missing_scrub_programs(env: Mapping[str, str] | None = None) -> list[str]:
    """The programs scrub_tool_env needs (bwrap, socat) that are not on env's PATH."""
    search = (os.environ if env is None else env).get("PATH", os.defpath)
    return [name for name in SCRUB_PROGRAMS if which(name, search) is None]


def scrub_missing_message(missing: Sequence[str]) -> str:
    return (f"scrub_tool_env is on but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed: claude needs "
            f"{SCRUB_PACKAGES} to run its tools without the key (Debian/Ubuntu: "
            "apt-get install bubblewrap socat). Install them, or turn it off "
            "(FLEET_WORKER_SCRUB_TOOL_ENV=0).")


SYSTEM = sys.platform
"""The system this runs on (sys.platform); tests set it to see another system's answers."""


def system_name(system: str | None = None) -> str:
    """Linux, macOS, or what sys.platform says."""
    system = SYSTEM if system is None else system
    return {"linux": "Linux", "darwin": "macOS"}.get(system, system)


def scrub_platform_message(system: str | None = None) -> str:
    """'' where scrub_tool_env can work (Linux), else why not and what to do instead."""
    system = SYSTEM if system is None else system
    if system.startswith("linux"):
        return ""
    return (f"scrub_tool_env is Linux-only and this is {system_name(system)}: claude runs each "
            "tool in its own pid namespace through bubblewrap, which needs Linux namespaces. "
            "Turn it off (FLEET_WORKER_SCRUB_TOOL_ENV=0); key_helper (FLEET_WORKER_KEY_HELPER=1) "
            "keeps the key out of the tools' environment on every system.")


def bwrap_problem(env: Mapping[str, str] | None = None, timeout: float = 10.0) -> str:
    """'' when bubblewrap (on env's PATH) can make a pid namespace here, else why not, in
    one line (e.g. a container that allows no user namespaces)."""
    import subprocess

    env = os.environ if env is None else env
    bwrap = which("bwrap", env.get("PATH", os.defpath))
    if bwrap is None:
        return "bwrap is not installed"
    try:
        out = subprocess.run([bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                              "--unshare-pid", "true"], capture_output=True, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL, env=dict(env))
    except subprocess.TimeoutExpired:
        return f"{bwrap} did not answer within {timeout:g} s"
    except OSError as exc:
        return f"cannot run {bwrap}: {exc.strerror or exc}"
    if out.returncode == 0:
        return ""
    lines = (out.stderr or out.stdout).strip().splitlines()
    return lines[-1] if lines else f"{bwrap} exited {out.returncode}"


def bwrap_broken_message(problem: str) -> str:
    return (f"scrub_tool_env is on but bubblewrap cannot make a sandbox here ({problem}); "
            "claude's tools would all fail. Allow unprivileged user namespaces (or run "
            "where they are allowed), or turn it off (FLEET_WORKER_SCRUB_TOOL_ENV=0).")


def _scrubs(settings: Settings) -> bool:
    """scrub_tool_env applies to an uncaged worker only: the cage replaces it (its own pid
    namespace and no key in the environment), and claude's bubblewrap cannot nest in it."""
    return bool(settings.scrub_tool_env) and getattr(settings, "cage", "off") != "worker"


def cage_problems(env: Mapping[str, str] | None = None, *, run: bool = False,
                  timeout: float = 30.0) -> str:
    """'' when workers can be caged here (cage.py), else what is missing and how to get
    it; `run`: also run a command in the cage (fleet-doctor)."""
    from fleet_tui.execution.worker import cage

    env = os.environ if env is None else env
    problems = cage.missing(env, cage.default_data_dir(env))
    if problems:
        return cage.missing_message(problems)
    return cage.probe(env, timeout) if run else ""


def srt_install_command(env: Mapping[str, str] | None = None) -> list[str]:
    """npm's command that installs the pinned srt where the cage finds it."""
    from fleet_tui.execution.worker import cage

    return cage.install_command(cage.default_data_dir(os.environ if env is None else env)
                                ).split()


def check_setup(settings: Settings, env: Mapping[str, str] | None = None, *,
                args: Sequence[str] = (), permission_mode: str | None = None) -> str:
    """Refuse (UsageError, exit 2) a launch claude would refuse or that cannot keep its
    promises, before anything is created: an unknown permission mode, root with
    bypassPermissions without the sandbox opt-in, scrub_tool_env without bubblewrap and
    socat, or with a bubblewrap that cannot make a namespace here. Reads nothing but the
    settings, the uid and PATH (and runs bwrap once when scrub_tool_env is on). Returns
    the permission mode."""
    flag_mode, rest = split_permission_mode(args)
    mode = flag_mode or permission_mode or settings.permission_mode
    if mode not in PERMISSION_MODES:
        raise UsageError(f"unknown permission mode {mode!r}; use one of "
                         + ", ".join(PERMISSION_MODES))
    bypass = mode == "bypassPermissions" or "--dangerously-skip-permissions" in \
        _options_part(rest)
    caged = getattr(settings, "cage", "off") == "worker"
    if caged:  # refused before anything is created when this machine cannot cage
        problem = cage_problems(env)
        if problem:
            raise UsageError(problem)
    # a caged worker is sandboxed: root may run it with bypassPermissions
    if bypass and current_euid() == 0 and not settings.sandbox and not caged:
        raise UsageError(ROOT_MESSAGE)
    if _scrubs(settings):
        unsupported = scrub_platform_message()
        if unsupported:
            raise UsageError(unsupported)
        missing = missing_scrub_programs(env)
        if missing:
            raise UsageError(scrub_missing_message(missing))
        problem = bwrap_problem(env)  # one `bwrap ... true`, only for those who opt in
        if problem:
            raise UsageError(bwrap_broken_message(problem))
    return mode


def check_launch(settings: Settings, env: Mapping[str, str] | None = None, *,
                 args: Sequence[str] = (), permission_mode: str | None = None,
                 endpoint: Endpoint | None = None) -> Credential:
    """Everything that would stop `plan_launch`, without its side effects (nothing is
    written): `check_setup`, then claude (ClaudeNotFoundError) and a key
    (NoCredentialError; `endpoint`: that endpoint's key). For commands that queue work to
    be launched later."""
    check_setup(settings, env, args=args, permission_mode=permission_mode)
    find_claude(settings, env)
    if endpoint is not None:
        return endpoint_credential(settings, endpoint, env)
    return resolve_credential(settings, env)


def _sh_quote(text: str) -> str:
    """shlex.quote without importing shlex (and the `re` it pulls in)."""
    return "'" + text.replace("'", "'\\''") + "'"


def _json_string(text: str) -> str:
    """json.dumps(text, ensure_ascii=False) without importing json (~8 ms)."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch < " ":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


class KeyHandoff:
    """Hands the key to one claude process through a named pipe (FIFO) that its
    apiKeyHelper reads once: the key is never in claude's environment, so the tools it
    runs do not inherit it, and the pipe is gone once read.

    `start()` creates the pipe (0600, in the private config dir) and forks a writer that
    waits for the first reader, writes the key, removes the pipe and exits; it also goes
    (removing the pipe) on SIGTERM, when its parent exits, or after KEY_HANDOFF_TIMEOUT.
    The caller starts it right before claude (fleet-worker: before exec, so claude becomes
    the writer's parent). Never started, the helper finds no pipe and claude fails with an
    auth error at once. The value stays out of repr."""

    __slots__ = ("_value", "path", "pid")

    def __init__(self, path: str, value: str) -> None:
        self.path = path
        self._value = value
        self.pid: int | None = None

    def __repr__(self) -> str:
        return f"KeyHandoff(path={self.path!r}, pid={self.pid!r}, value=<redacted>)"

    @property
    def value(self) -> str:
        return self._value

    def helper_command(self, env: Mapping[str, str]) -> str:
        """The apiKeyHelper command: `cat` of the pipe, bounded by `timeout` when there
        is one (a helper that never returns would hang claude for good)."""
        guard = which("timeout", env.get("PATH", os.defpath))
        read = f"cat {_sh_quote(self.path)}"
        return f"{_sh_quote(guard)} {KEY_READ_TIMEOUT} {read}" if guard else read

    def start(self) -> None:
        """Create the pipe and fork its writer. ConfigDirError when the pipe cannot be
        made (e.g. a file system without FIFOs): set FLEET_WORKER_KEY_HELPER=0 then."""
        if self.pid is not None:
            return
        try:
            os.mkfifo(self.path, 0o600)
        except OSError as exc:
            raise ConfigDirError(
                f"cannot create the key pipe {self.path}: {exc.strerror or exc}. Set "
                "FLEET_WORKER_KEY_HELPER=0 to pass the key in claude's environment "
                "instead.") from None
        parent = os.getpid()
        secret = self._value.encode("utf-8")
        try:
            pid = os.fork()
        except OSError as exc:
            _unlink_quietly(self.path)
            raise LaunchError(f"cannot start the key pipe's writer: {exc.strerror or exc}",
                              1) from None
        if pid == 0:  # pragma: no cover - the child never returns (coverage cannot see it)
            _write_key_once(self.path, secret, parent)
        self.pid = pid

    def cancel(self) -> None:
        """Stop the writer (if claude never asked) and remove the pipe."""
        if self.pid is not None:
            import signal

            try:
                os.kill(self.pid, signal.SIGTERM)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.pid = None
        _unlink_quietly(self.path)


def _unlink_quietly(path: str) -> None:
    try:  # noqa: SIM105 (contextlib costs fleet-worker start-up time)
        os.unlink(path)
    except OSError:
        pass


def _write_key_once(path: str, secret: bytes, parent: int) -> None:
    """The forked writer: give the key to the first reader of the pipe, then go. Never
    returns into the caller's code, whatever happens."""
    try:
        import signal

        def leave(_sig: int = 0, _frame: object = None) -> None:
            _unlink_quietly(path)
            os._exit(0)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM):
            signal.signal(sig, leave)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        # Hold none of the launcher's files (a reader of fleet-worker's output must not
        # wait for this process to close its stdout).
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, 65536)
        from fleet_tui.system import procs

        procs.set_parent_death_signal(signal.SIGTERM)
        # the parent went before the death signal was armed (a parent that reads as 0 is
        # outside this process's PID namespace, a runner's attempt namespace, which ends
        # with that runner: system/pidns.py)
        if os.getppid() not in (parent, 0):
            leave()
        signal.alarm(KEY_HANDOFF_TIMEOUT)
        fd = os.open(path, os.O_WRONLY)  # blocks until the helper opens the pipe to read
        view = memoryview(secret)
        while view:
            view = view[os.write(fd, view):]
        os.close(fd)
    except BaseException:  # nothing to report to: the helper just finds no key
        pass
    _unlink_quietly(path)
    os._exit(0)


class LaunchPlan:
    """Everything needed to start claude. `env` is the child's complete environment and
    holds the key, so it is left out of repr; `describe()` is safe to print."""

    __slots__ = ("_config_dir", "_cwd", "argv", "credential_source", "env", "key_handoff",
                 "permission_mode", "prepared", "removed_env", "set_env", "warnings")

    def __init__(self, *, argv: list[str], env: dict[str, str], cwd: StrPath | None,
                 config_dir: StrPath, credential_source: str, warnings: list[str],
                 permission_mode: str, removed_env: tuple[str, ...] = (),
                 set_env: tuple[str, ...] = (), prepared: bool = True,
                 key_handoff: KeyHandoff | None = None) -> None:
        self.argv = argv
        self.env = env
        self._cwd = cwd
        self._config_dir = config_dir
        self.credential_source = credential_source
        self.warnings = warnings
        self.permission_mode = permission_mode
        self.removed_env = removed_env  # inherited names taken out (values never shown)
        self.set_env = set_env  # names we set, in order
        self.prepared = prepared  # False: dry run, settings.json not written
        # Not None: the key is not in `env`; start it right before claude starts.
        self.key_handoff = key_handoff

    def start_key_handoff(self) -> None:
        """Start handing the key over (a no-op when it travels in the environment)."""
        if self.key_handoff is not None:
            self.key_handoff.start()

    @property
    def cwd(self) -> Path | None:
        """Where claude runs (None: the caller's cwd). A Path, made when asked for."""
        if self._cwd is None:
            return None
        from pathlib import Path

        return Path(self._cwd)

    @property
    def config_dir(self) -> Path:
        """The isolated CLAUDE_CONFIG_DIR. A Path, made when asked for."""
        from pathlib import Path

        return Path(self._config_dir)

    def __repr__(self) -> str:
        return (f"LaunchPlan(argv={self.argv!r}, cwd={self.cwd!r}, "
                f"config_dir={self.config_dir!r}, credential_source="
                f"{self.credential_source!r}, warnings={self.warnings!r})")

    def describe(self) -> str:
        """Dry-run text: the environment changes and the argv, key redacted."""
        import shlex

        secret = self.env.get("ANTHROPIC_AUTH_TOKEN", "")
        if self.key_handoff is not None:
            secret = self.key_handoff.value
            key = (f"key: from {self.credential_source}; handed to claude through a one-shot "
                   "pipe (apiKeyHelper), not its environment, so its tools do not see it")
        else:
            key = f"key: from {self.credential_source}"
        lines = ["fleet-worker --dry-run: nothing was started.",
                 f"config dir: {os.fspath(self._config_dir)} (0700)",
                 "  settings.json: effortLevel and hooks={} "
                 + ("written" if self.prepared else "would be rewritten")
                 + "; your other keys are kept",
                 key,
                 f"cwd: {os.fspath(self._cwd) if self._cwd is not None else os.getcwd()}",
                 "environment changes:"]
        lines += [f"  unset {name}" for name in self.removed_env]
        for name in self.set_env:
            value = self.env[name]
            if name == "ANTHROPIC_AUTH_TOKEN":
                value = f"<redacted: from {self.credential_source}>"
            lines.append(f"  {name}={value}")
        lines.append("argv: " + shlex.join(self.argv))
        lines += [f"warning: {w}" for w in self.warnings]
        text = "\n".join(lines) + "\n"
        if len(secret) >= 6:  # belt and braces: a key typed into a setting or a flag
            text = text.replace(secret, REDACTED)
        return text


def child_env(base_env: Mapping[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """The caller's environment without inherited credentials and config redirections."""
    env: dict[str, str] = {}
    removed: list[str] = []
    for name, value in base_env.items():
        if name.startswith(SCRUB_PREFIXES) or name in SCRUB_NAMES:
            removed.append(name)
        else:
            env[name] = value
    return env, tuple(sorted(removed))


def _handoff_for(options: Sequence[str], cfg: str, secret: str,
                 warnings: list[str]) -> KeyHandoff | None:
    """The one-shot pipe the key goes through to claude's apiKeyHelper, or None when the
    caller passes its own --settings (which would replace ours): then the key stays in
    the environment, and a warning says so."""
    if "--settings" in options or any(o.startswith("--settings=") for o in options):
        warnings.append("--settings is given, so the key reaches claude in its "
                        "environment (ANTHROPIC_AUTH_TOKEN), where its tools can read it")
        return None
    return KeyHandoff(os.path.join(
        cfg, f".key-{os.getpid()}-{os.urandom(6).hex()}.fifo"), secret)


def _our_env(settings: Settings, cfg: str, secret: str, main_model: str, *,
             handoff: bool) -> dict[str, str]:
    """What the launch sets in claude's environment over the scrubbed one: its config
    dir, the endpoint and the key (not with a handoff: the helper's refresh time
    instead), the model mapping, and the switches that keep it quiet and contained."""
    ours = {
        "CLAUDE_CONFIG_DIR": cfg,
        "ANTHROPIC_BASE_URL": settings.base_url,
        "ANTHROPIC_AUTH_TOKEN": secret,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": main_model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": main_model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": settings.small_model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
    }
    if handoff:
        del ours["ANTHROPIC_AUTH_TOKEN"]
        ours["CLAUDE_CODE_API_KEY_HELPER_TTL_MS"] = KEY_HELPER_TTL_MS
    if settings.sandbox:
        ours["IS_SANDBOX"] = "1"
    if _scrubs(settings):
        ours["CLAUDE_CODE_SUBPROCESS_ENV_SCRUB"] = "1"
    return ours


def plan_launch(settings: Settings, args: Sequence[str] = (), *, prompt: str | None = None,
                config_dir: StrPath | None = None, base_env: Mapping[str, str] | None = None,
                model: str | None = None, permission_mode: str | None = None,
                cwd: StrPath | None = None, prepare: bool = True,
                key_handoff: bool = False) -> LaunchPlan:
    """Build the isolated launch: argv `claude -p [--settings ...] [--allowedTools ...]
    --model sonnet --permission-mode MODE [args] [-- prompt]`, the child's environment
    and the prepared config dir.

    Precedence of the permission mode: a --permission-mode in `args` > `permission_mode`
    > settings. `model` replaces the OPUS/SONNET mapping (small-model fallback).
    `prepare=False` (dry run) reads settings.json but writes nothing. Raises LaunchError
    subclasses; warnings (dontAsk without an allowlist) come back in `plan.warnings`.

    `key_handoff=True` (a caller that will call `plan.start_key_handoff()` right before
    claude starts) with the `key_helper` setting on: the key goes through a one-shot pipe
    read by claude's apiKeyHelper (`plan.key_handoff`), not ANTHROPIC_AUTH_TOKEN. Otherwise
    (and when the caller passes its own --settings) it is in `plan.env` as before.
    `scrub_tool_env`: CLAUDE_CODE_SUBPROCESS_ENV_SCRUB=1, plus an --allowedTools list when
    none is given (claude forces the permission mode to default then).
    """
    base = dict(os.environ if base_env is None else base_env)
    mode = check_setup(settings, base, args=args, permission_mode=permission_mode)
    rest = split_permission_mode(args)[1]
    options = _options_part(rest)
    if cwd is not None and not os.path.isdir(cwd):
        raise UsageError(f"working directory {cwd} does not exist or is not a directory")

    claude = find_claude(settings, base)
    credential = resolve_credential(settings, base)

    cfg = os.path.abspath(os.path.expanduser(
        config_dir if config_dir is not None else settings.config_dir))
    # settings.json: what prepare wrote, or (dry run) what is there; corrupt -> an error
    user_settings = _prepare_config_dir(cfg, settings.effort) if prepare \
        else read_user_settings(cfg)

    warnings: list[str] = []
    if mode == "dontAsk" and not (has_allowlist_flag(rest) or _settings_allowlist(user_settings)):
        warnings.append(
            "permission mode dontAsk without an allowlist: every tool call that needs "
            "permission will be denied. Pass --allowedTools \"Read Edit Bash(git:*)\" or "
            f"add a permissions.allow list to {_settings_path(cfg)}.")

    env, removed = child_env(base)
    handoff: KeyHandoff | None = None
    ours_first: list[str] = []  # our flags, right after -p (before --model ends a list)
    # a caged worker always gets the key through the pipe: the cage's tools never find it
    # in their environment (what scrub_tool_env did, which cannot nest in the cage)
    if key_handoff and (settings.key_helper or getattr(settings, "cage", "off") == "worker"):
        handoff = _handoff_for(options, cfg, credential.value, warnings)
        if handoff is not None:
            ours_first += ["--settings", '{"apiKeyHelper": '
                           + _json_string(handoff.helper_command(base)) + "}"]
    ours = _our_env(settings, cfg, credential.value, model or settings.model,
                    handoff=handoff is not None)
    if _scrubs(settings) and not (has_allowlist_flag(rest)
                                        or _settings_allowlist(user_settings)):
        ours_first += ["--allowedTools", *SCRUB_ALLOWED_TOOLS]
    env.update(ours)

    argv = [claude, "-p", *ours_first, "--model", "sonnet", "--permission-mode", mode, *rest]
    if prompt is not None:
        # `--` ends the options: claude's list flags (--allowedTools X Y, --add-dir) would
        # otherwise swallow the prompt, and a prompt starting with "-" would be a flag.
        if "--" not in rest:
            argv.append("--")
        argv.append(prompt)
    return LaunchPlan(
        argv=argv, env=env, cwd=cwd, config_dir=cfg,
        credential_source=credential.source, warnings=warnings, permission_mode=mode,
        removed_env=removed, set_env=tuple(ours), prepared=prepare, key_handoff=handoff)
