"""The cage: a worker (claude and everything it starts) in an OS sandbox.

Built on Anthropic's sandbox runtime (`@anthropic-ai/sandbox-runtime`, the `srt` command and
library, pinned as SRT_VERSION): on Linux its bubblewrap mount, pid and network namespaces,
its seccomp helper and its filtering proxy outside the cage; on macOS a Seatbelt profile it
generates from the same settings. This module only decides what the cage holds and writes
it down as srt settings (`policy`), then wraps claude's argv so that `cage_host.mjs` (beside
this file, driving srt's library with node) runs it inside (`wrap`); the repository's setup
command runs under the same rules (`wrap_setup`). It writes no namespace, mount or proxy
code of its own.

What a caged worker has:
- writable: its worktree, its config dir, the commit side of the repository's git folder
  (objects, refs, logs and its own worktree's admin folder; not hooks or config), a cache
  folder kept per repository (XDG_CACHE_HOME, pip's, npm's, Go's, uv's caches point there),
  and a private /tmp and home (empty tmpfs folders, gone with the worker);
- read-only: the system and the toolchains (/usr, /opt, PATH's folders, claude itself);
- not there at all: /tmp's and the home's contents (~/.ssh, ~/.aws, ~/.config/gh, ~/.netrc,
  keyrings, browser profiles, shell histories...), other home folders, the repository's
  main checkout and so other tasks' worktrees, fleet-tui's data folder beyond the worker's
  own config dir and the repository's cache;
- no process outside it (its own pid namespace);
- network: its endpoint when it is on this machine (the gateway, a loopback base URL) over a
  socket bridged into its network namespace (that one host:port); through srt's proxy, a
  remote endpoint (the host:port its base URL names) and the allowed hosts (package
  registries by default, the `allow_hosts` setting). The key never enters: with the
  gateway a worker holds only its token, and without it claude reads the key through its
  one-shot pipe as uncaged.

Standard library only: the runner (which must stay so) calls `wrap`.
"""

from __future__ import annotations

import json
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

SRT_PACKAGE = "@anthropic-ai/sandbox-runtime"
SRT_VERSION = "0.0.83"  # pinned like the claude CLI: srt's settings may change between releases
POLICY_FILE = "cage.json"
HOST_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cage_host.mjs")
SRT_ENV = "FLEET_WORKER_SRT"  # where srt is (its package folder, or a folder it was installed into)
# Linux programs srt needs besides node, with the Debian package of each.
LINUX_PROGRAMS = (("bwrap", "bubblewrap"), ("socat", "socat"), ("rg", "ripgrep"))
# Inside, every connection but the bridged endpoint's goes through srt's proxy, so every
# refusal is seen (its NO_PROXY sends loopback and private addresses past the proxy, where
# nothing is).
UNSET_INSIDE = ("NO_PROXY", "no_proxy")
# Cache variables pointed at the repository's cache folder (kept between its workers).
CACHE_VARIABLES = (("XDG_CACHE_HOME", ""), ("PIP_CACHE_DIR", "pip"), ("npm_config_cache", "npm"),
                   ("UV_CACHE_DIR", "uv"), ("GOCACHE", "go-build"), ("GOMODCACHE", "go-mod"))


def _which(name: str, path: str) -> str | None:
    for folder in path.split(os.pathsep):
        candidate = os.path.join(folder or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _package_in(folder: str) -> str | None:
    """srt's package folder in `folder`: the package itself, or an npm prefix holding it."""
    for candidate in (folder, os.path.join(folder, "node_modules", *SRT_PACKAGE.split("/")),
                      os.path.join(folder, "lib", "node_modules", *SRT_PACKAGE.split("/"))):
        if os.path.isfile(os.path.join(candidate, "dist", "index.js")):
            return candidate
    return None


def default_data_dir(env: Mapping[str, str]) -> str:
    """fleet-tui's data folder as paths.home() finds it (FLEET_TUI_HOME, else the
    platform's user data folder), without platformdirs (the runner is standard-library only)."""
    given = env.get("FLEET_TUI_HOME", "").strip()
    home = env.get("HOME") or os.path.expanduser("~")
    if given:
        return os.path.expanduser(given)
    if sys.platform == "darwin":
        return os.path.join(home, "Library", "Application Support", "fleet-tui")
    xdg = env.get("XDG_DATA_HOME", "").strip()
    return os.path.join(xdg or os.path.join(home, ".local", "share"), "fleet-tui")


def repo_cache_dir(data_dir: str, repo: str) -> str:
    """The repository's cache folder: one per repository, so a worker of one cannot
    poison another's caches."""
    import hashlib

    key = hashlib.sha256(os.path.realpath(repo).encode("utf-8", "surrogateescape"))
    return os.path.join(data_dir, "cache", key.hexdigest()[:16])


def install_dir(data_dir: str) -> str:
    """Where fleet-tui installs srt for the user (npm --prefix)."""
    return os.path.join(data_dir, "srt")


def install_command(data_dir: str) -> str:
    return (f"npm install --prefix {install_dir(data_dir)} --no-audit --no-fund "
            f"{SRT_PACKAGE}@{SRT_VERSION}")


def find_srt(env: Mapping[str, str], data_dir: str = "") -> str | None:
    """srt's package folder: FLEET_WORKER_SRT, this checkout's .srt/ (what scripts/test
    installs), fleet-tui's data folder's srt/, then an `srt` on PATH."""
    given = env.get(SRT_ENV, "").strip()
    if given:
        return _package_in(os.path.expanduser(given))
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HOST_SCRIPT))))
    for folder in (os.path.join(checkout, ".srt"), install_dir(data_dir) if data_dir else ""):
        found = _package_in(folder) if folder else None
        if found:
            return found
    srt = _which("srt", env.get("PATH", os.defpath))
    if srt is not None:  # <prefix>/bin/srt -> ../lib/node_modules/<package>/dist/cli.js
        real = os.path.realpath(srt)
        return _package_in(os.path.dirname(os.path.dirname(real)))
    return None


def missing(env: Mapping[str, str], data_dir: str = "", system: str | None = None
            ) -> list[str]:
    """What the cage needs and this machine lacks, each with how to get it ([] = ready)."""
    system = sys.platform if system is None else system
    if not system.startswith(("linux", "darwin")):
        return [f"an OS sandbox: srt cages workers on Linux and macOS only, not {system}"]
    path = env.get("PATH", os.defpath)
    problems: list[str] = []
    if _which("node", path) is None:
        problems.append("node (Node.js, which runs srt): install Node.js, which brings npm")
    if find_srt(env, data_dir) is None:
        where = install_command(data_dir) if data_dir else \
            f"npm install -g {SRT_PACKAGE}@{SRT_VERSION}"
        problems.append(f"srt ({SRT_PACKAGE} {SRT_VERSION}): {where}")
    if system.startswith("linux"):
        for program, package in LINUX_PROGRAMS:
            if _which(program, path) is None:
                problems.append(f"{program} (Debian/Ubuntu: apt-get install {package})")
    elif _which("rg", path) is None:
        problems.append("rg (ripgrep: brew install ripgrep)")
    return problems


def missing_message(problems: Sequence[str]) -> str:
    return ("the cage (setting cage = \"worker\", the default) cannot run here: it needs "
            + "; ".join(problems) + ". Install that (fleet-doctor checks it), or run workers "
            "uncaged with cage = \"off\" in config.toml (or FLEET_WORKER_CAGE=off).")


def endpoint_host(base_url: str) -> str:
    """`host:port` of the worker's endpoint (the port made explicit: 80/443 by scheme)."""
    scheme, _, rest = base_url.partition("://")
    authority = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    if authority.startswith("["):  # [v6]:port
        host, _, port = authority[1:].partition("]")
        port = port.lstrip(":")
        host = f"[{host}]"
    else:
        host, _, port = authority.partition(":")
    if not port:
        port = "443" if scheme.lower() == "https" else "80"
    return f"{host}:{port}"


def _git_dirs(worktree: str) -> tuple[str, str] | None:
    """(the repository's git folder, this worktree's admin folder in it), from the
    worktree's `.git` file; None when it is not a linked worktree."""
    try:
        with open(os.path.join(worktree, ".git"), encoding="utf-8") as fh:
            text = fh.read(4096)
    except OSError:
        return None
    if not text.startswith("gitdir:"):
        return None
    admin = text[len("gitdir:"):].strip()
    if not os.path.isabs(admin):
        admin = os.path.normpath(os.path.join(worktree, admin))
    common = admin
    try:
        with open(os.path.join(admin, "commondir"), encoding="utf-8") as fh:
            rel = fh.read().strip()
        common = os.path.normpath(rel if os.path.isabs(rel) else os.path.join(admin, rel))
    except OSError:
        common = os.path.dirname(os.path.dirname(admin))
    return common, admin


def _homes(env: Mapping[str, str]) -> list[str]:
    homes = [env.get("HOME", "")]
    try:
        import pwd

        homes.append(pwd.getpwuid(os.getuid()).pw_dir)
    except (ImportError, KeyError):
        pass
    return [h for h in dict.fromkeys(os.path.realpath(h) for h in homes if h) if h != "/"]


def _under(path: str, folders: Iterable[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def _program_dirs(argv0: str) -> list[str]:
    """What running claude needs to read: its folder and, for an npm install, the
    node_modules folder its link leads into."""
    dirs = [os.path.dirname(os.path.abspath(argv0))]
    real = os.path.realpath(argv0)
    dirs.append(os.path.dirname(real))
    parts = real.split(os.sep)
    if "node_modules" in parts:
        dirs.append(os.sep.join(parts[:parts.index("node_modules") + 1]))
    return dirs


# Never shown, even when a PATH folder lies in them: where credentials live.
SECRET_PLACES = (".ssh", ".aws", ".gnupg", ".netrc", ".docker", ".kube", ".azure",
                 ".config/gh", ".config/gcloud", ".local/share/keyrings", ".password-store",
                 ".git-credentials", ".pypirc", ".npmrc", ".cargo/credentials",
                 ".cargo/credentials.toml", ".bash_history", ".zsh_history",
                 ".python_history")
GENERIC = (".local", ".config", ".cache")  # a toolchain is one level further in these


def _toolchain_dirs(folder: str, homes: Sequence[str]) -> list[str]:
    """A PATH folder in a home: its toolchain's root (~/.pyenv for ~/.pyenv/shims, the
    folder itself in ~/.local), and where its links lead (~/.local/bin/x -> ~/.local/share/x)."""
    home = next((h for h in homes if _under(folder, [h])), None)
    if home is None or folder == home:
        return [folder] if home is None else []
    parts = os.path.relpath(folder, home).split(os.sep)
    keep = 2 if parts[0] in GENERIC and len(parts) > 1 else 1
    root = os.path.join(home, *parts[:keep])
    if parts[0] in GENERIC:
        root = folder
    dirs = [root]
    try:
        names = os.listdir(folder)[:500]
    except OSError:
        names = []
    for name in names:
        path = os.path.join(folder, name)
        if os.path.islink(path):
            target = os.path.realpath(path)
            if _under(target, [home]) and not _under(target, [folder]):
                dirs.append(os.path.dirname(target))
    return [d for d in dirs if not any(_under(d, [os.path.join(home, secret)])
                                       for secret in SECRET_PLACES)]


def _venv_dirs(folder: str) -> list[str]:
    """A virtual environment's bin folder on PATH: the environment and the Python it was
    made from (pyvenv.cfg's `home`, which may live in a hidden place such as ~/.pyenv)."""
    if not folder or not os.path.isabs(folder):
        return []
    venv = os.path.dirname(os.path.realpath(folder))
    try:
        with open(os.path.join(venv, "pyvenv.cfg"), encoding="utf-8") as fh:
            text = fh.read(8192)
    except OSError:
        return []
    dirs = [venv]
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and os.path.isabs(value.strip()):
            dirs.append(os.path.dirname(os.path.realpath(value.strip())))  # its prefix
    return dirs


def policy(*, worktree: str, config_dir: str, repo: str, env: Mapping[str, str],
           base_url: str, allow_hosts: Sequence[str], data_dir: str, cache_dir: str,
           srt_dir: str, argv0: str, system: str | None = None) -> dict[str, object]:
    """The cage's rules: srt's settings plus what cage_host.mjs needs to report refused
    reads. Paths are resolved (bubblewrap binds real paths). On Linux srt makes a hidden
    folder an empty tmpfs, so /tmp is hidden and so private; Seatbelt (macOS) can only
    refuse, so there the worker's temp folder is one of its own in its config dir."""
    system = sys.platform if system is None else system
    real = os.path.realpath
    worktree, config_dir, cache_dir = real(worktree), real(config_dir), real(cache_dir)
    homes = _homes(env)
    linux = system.startswith("linux")
    tmpdir = "/tmp" if linux else os.path.join(config_dir, "tmp")
    if not linux:
        os.makedirs(tmpdir, mode=0o700, exist_ok=True)
    hidden = ["/tmp", "/var/tmp"] if linux else []
    hidden += [*homes, "/home", "/root", "/Users"]
    if data_dir:
        hidden.append(real(data_dir))
    if repo:
        hidden.append(real(repo))
    # credentials inside a folder shown below (~/.cargo/credentials.toml) stay hidden: a
    # more specific read denial wins over a re-allowed folder
    hidden += [os.path.join(home, secret) for home in homes for secret in SECRET_PLACES]
    hidden = [h for h in dict.fromkeys(hidden) if os.path.exists(h)]
    shown = [worktree, config_dir, cache_dir, real(srt_dir), *_program_dirs(argv0)]
    writable = [worktree, config_dir, cache_dir] + ([] if linux else [tmpdir])
    dirs = _git_dirs(worktree)
    if dirs is not None:
        # The repository's git folder: what a commit writes (its objects, refs and logs, and
        # this worktree's own admin folder) writable; the rest (config, hooks, HEAD...) read
        # only; the other worktrees' admin folders and the main checkout's files hidden.
        common, admin = dirs
        commit_side = ("objects", "refs", "logs")
        writable += [os.path.join(common, name) for name in commit_side]
        writable.append(admin)
        try:
            entries = sorted(os.listdir(common))
        except OSError:
            entries = []
        shown += [os.path.join(common, name) for name in entries
                  if name not in (*commit_side, "worktrees")]
    # the toolchains on PATH that live in a hidden place (~/.pyenv, ~/.cargo, a venv):
    # readable, never a place that holds credentials
    for folder in env.get("PATH", "").split(os.pathsep):
        if folder and os.path.isabs(folder) and _under(real(folder), hidden) \
                and not _under(real(folder), [real(repo)] if repo else []):
            shown += _toolchain_dirs(real(folder), homes)

    for folder in env.get("PATH", "").split(os.pathsep):
        shown += _venv_dirs(folder)
    shown = [p for p in dict.fromkeys(shown) if os.path.exists(p)]
    writable = [p for p in dict.fromkeys(writable) if os.path.exists(p)]
    hosts = [endpoint_host(base_url), *allow_hosts]
    srt = {
        "network": {"allowedDomains": list(dict.fromkeys(hosts)), "deniedDomains": []},
        "filesystem": {"denyRead": hidden, "allowRead": shown, "allowWrite": writable,
                       "denyWrite": []},
    }
    rules: dict[str, object] = {
        "srt": srt, "hidden": hidden, "shown": shown, "home": homes[0] if homes else "",
        "unset_env": list(UNSET_INSIDE), "tmpdir": tmpdir}
    bridge = loopback_endpoint(base_url) if linux else None
    if bridge is not None:
        # The worker's endpoint on this machine (the gateway, a local endpoint) is not
        # reached through srt's proxy but over a socket bridged into the cage's network
        # namespace: claude meets it as uncaged (a refused connection is a refused
        # connection, not the proxy's "502 Bad Gateway"), and only that port is bridged.
        # NO_PROXY names just that host:port, so every other connection still goes through
        # the proxy and each refusal is seen.
        host, port = bridge
        rules["bridge"] = {"host": host, "port": port}
        rules["set_env"] = {name: f"{host}:{port}" for name in UNSET_INSIDE}
    return rules


LOOPBACK_NAMES = ("localhost", "127.0.0.1")


def loopback_endpoint(base_url: str) -> tuple[str, int] | None:
    """(host, port) of an endpoint on this machine's IPv4 loopback, else None."""
    host, _, port = endpoint_host(base_url).rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        return None
    if host == "localhost" or (host.startswith("127.") and host.replace(".", "").isdigit()):
        return host, int(port)
    return None


# The files and folders srt always refuses to let a command write (its mandatory denies).
# One that does not exist in the worktree gets a mount point there while the worker runs
# (/dev/null inside, an empty file outside), which `git add -A` would choke on: git is told
# to ignore them (core.excludesFile, through GIT_CONFIG_* so no config file changes).
SRT_PLACEHOLDERS = (".bashrc", ".bash_profile", ".zshrc", ".zprofile", ".profile",
                    ".gitconfig", ".gitmodules", ".ripgreprc", ".mcp.json", ".vscode",
                    ".idea", ".claude/commands", ".claude/agents")


def git_env(env: Mapping[str, str], config_dir: str) -> dict[str, str]:
    """GIT_CONFIG_* variables that add core.excludesFile = <config dir>/cage-gitignore
    (listing srt's mount points) after any the environment already gives."""
    path = os.path.join(config_dir, "cage-gitignore")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("# srt's mount points while a caged worker runs (fleet-tui)\n")
        fh.write("".join(f"/{name}\n" for name in SRT_PLACEHOLDERS))
    try:
        count = int(env.get("GIT_CONFIG_COUNT", "0") or "0")
    except ValueError:
        count = 0
    return {"GIT_CONFIG_COUNT": str(count + 1), f"GIT_CONFIG_KEY_{count}": "core.excludesFile",
            f"GIT_CONFIG_VALUE_{count}": path}


def cache_env(cache_dir: str) -> dict[str, str]:
    """The cache variables, each pointed into the repository's cache folder."""
    return {name: os.path.join(cache_dir, sub) if sub else cache_dir
            for name, sub in CACHE_VARIABLES}


def wrap(argv: Sequence[str], env: Mapping[str, str], *, attempt_dir: str, worktree: str,
         config_dir: str, repo: str, base_url: str, allow_hosts: Sequence[str]
         ) -> tuple[list[str], dict[str, str]]:
    """claude's argv and environment, caged: `node cage_host.mjs SRT POLICY -- argv`, the
    policy written to the attempt folder's cage.json. RuntimeError when the cage cannot be
    built here (missing_message says what to install)."""
    node, srt_dir, path, caged_env = _build(argv, env, attempt_dir=attempt_dir,
                                            worktree=worktree, config_dir=config_dir,
                                            repo=repo, base_url=base_url,
                                            allow_hosts=allow_hosts)
    return [node, HOST_SCRIPT, srt_dir, path, "--", *argv], caged_env


def wrap_setup(command: str, env: Mapping[str, str], *, attempt_dir: str, worktree: str,
               config_dir: str, repo: str, base_url: str, allow_hosts: Sequence[str],
               events: str) -> tuple[list[str], dict[str, str]]:
    """The repository's setup command (`/bin/sh -c COMMAND` in the worktree) in the
    worker's cage, as `wrap` cages claude: the same rules, in the same cage.json (so an
    attempt whose setup failed is known caged; claude's order rewrites it after the
    setup). What the cage refuses goes to `events` (the attempt's stream) as its lines,
    not into the command's output; its output (stderr with stdout) is read for refused
    reads as a tool's is."""
    extra = {"blocked_file": events, "output": "text", "command": command}
    argv = ["/bin/sh", "-c", command]
    node, srt_dir, path, caged_env = _build(argv, env, attempt_dir=attempt_dir,
                                            worktree=worktree, config_dir=config_dir,
                                            repo=repo, base_url=base_url,
                                            allow_hosts=allow_hosts, extra=extra)
    return [node, HOST_SCRIPT, srt_dir, path, "--", *argv], caged_env


def _build(argv: Sequence[str], env: Mapping[str, str], *, attempt_dir: str, worktree: str,
           config_dir: str, repo: str, base_url: str, allow_hosts: Sequence[str],
           extra: Mapping[str, object] | None = None) -> tuple[str, str, str, dict[str, str]]:
    """(node, srt's folder, the policy written to cage.json (with `extra`), claude's
    environment)."""
    data_dir = default_data_dir(env)
    cache_dir = repo_cache_dir(data_dir, repo or worktree)
    problems = missing(env, data_dir)
    if problems:
        raise RuntimeError(missing_message(problems))
    srt_dir = find_srt(env, data_dir)
    node = _which("node", env.get("PATH", os.defpath))
    assert srt_dir is not None and node is not None
    os.makedirs(cache_dir, mode=0o700, exist_ok=True)
    rules = policy(worktree=worktree, config_dir=config_dir, repo=repo, env=env,
                   base_url=base_url, allow_hosts=allow_hosts, data_dir=data_dir,
                   cache_dir=cache_dir, srt_dir=srt_dir, argv0=argv[0])
    rules.update(extra or {})
    path = os.path.join(attempt_dir, POLICY_FILE)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(rules, fh, indent=1, sort_keys=True)
    caged_env = dict(env)
    caged_env.update(cache_env(cache_dir))
    caged_env.update(git_env(env, config_dir))
    caged_env["IS_SANDBOX"] = "1"  # a caged root worker may run bypassPermissions
    return node, srt_dir, path, caged_env


# The runner starts the cage host before it knows the run (`warm_argv` + the descriptor of
# a pipe), so that node and srt load while it plans and prepares the run; it then sends the
# order (`order`) and, once the run is ready to start, "go" (GO) on that pipe.
GO = b"go\n"


def wanted(spec_settings: Mapping[str, object], env: Mapping[str, str],
           system: str | None = None) -> bool:
    """Whether the runner's settings will most likely cage the worker: the spec's `cage`,
    else FLEET_WORKER_CAGE, else the default (on where srt runs). A guess made before the
    settings are loaded, to start the cage host early; the settings decide."""
    given = spec_settings.get("cage") if isinstance(spec_settings, dict) else None
    if not isinstance(given, str) or not given.strip():
        given = env.get("FLEET_WORKER_CAGE", "")
    if given.strip():
        return given.strip().lower() == "worker"
    system = sys.platform if system is None else system
    return system.startswith(("linux", "darwin"))


def warm_argv(env: Mapping[str, str]) -> list[str] | None:
    """`node cage_host.mjs SRT --go` (the pipe's descriptor follows), or None when this
    machine cannot cage (the run then fails as `wrap` does, saying what to install)."""
    data_dir = default_data_dir(env)
    if missing(env, data_dir):
        return None
    srt_dir = find_srt(env, data_dir)
    node = _which("node", env.get("PATH", os.defpath))
    if srt_dir is None or node is None:
        return None
    return [node, HOST_SCRIPT, srt_dir, "--go"]


def order(argv: Sequence[str], env: Mapping[str, str], *, attempt_dir: str, worktree: str,
          config_dir: str, repo: str, base_url: str, allow_hosts: Sequence[str]) -> bytes:
    """The line that tells a warm cage host what to run (as `wrap`, which raises as it
    does): the policy's path, claude's argv and its caged environment."""
    _node, _srt, path, caged_env = _build(argv, env, attempt_dir=attempt_dir,
                                          worktree=worktree, config_dir=config_dir,
                                          repo=repo, base_url=base_url,
                                          allow_hosts=allow_hosts)
    line = json.dumps({"policy": path, "argv": list(argv), "env": caged_env})
    return line.encode("utf-8", "surrogateescape") + b"\n"


def probe(env: Mapping[str, str], timeout: float = 30.0) -> str:
    """'' when a command runs in the cage here (srt, bubblewrap, user namespaces, the proxy
    and seccomp helper all work), else why not in one line: what fleet-doctor runs."""
    import subprocess
    import tempfile

    data_dir = default_data_dir(env)
    problems = missing(env, data_dir)
    if problems:
        return "; ".join(problems)
    srt_dir = find_srt(env, data_dir)
    node = _which("node", env.get("PATH", os.defpath))
    assert srt_dir is not None and node is not None
    with tempfile.TemporaryDirectory(prefix="fleet-cage-probe-") as folder:
        rules = {"srt": {"network": {"allowedDomains": [], "deniedDomains": []},
                         "filesystem": {"denyRead": [], "allowRead": [],
                                        "allowWrite": [folder], "denyWrite": []}},
                 "hidden": [], "shown": [], "home": "", "unset_env": list(UNSET_INSIDE)}
        path = os.path.join(folder, POLICY_FILE)
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(rules, fh)
        try:
            out = subprocess.run([node, HOST_SCRIPT, srt_dir, path, "--", "true"], cwd=folder,
                                 capture_output=True, text=True, timeout=timeout,
                                 stdin=subprocess.DEVNULL, env=dict(env))
        except subprocess.TimeoutExpired:
            return f"a command in the cage did not finish within {timeout:g} s"
        except OSError as exc:
            return f"cannot run node: {exc.strerror or exc}"
    if out.returncode == 0:
        return ""
    lines = [line for line in (out.stderr or out.stdout).strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else f"the cage exited {out.returncode}"
