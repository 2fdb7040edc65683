"""The cage on remote hosts, this machine's side: what `host check` reads on a host about
the cage, the check it makes of it, the srt it installs there, and whether a caged task
may go to a host.

A host can cage its workers when it has what the local cage needs (execution/worker/cage.py:
node, bubblewrap, socat, ripgrep, srt) and its user can make user namespaces (bubblewrap
runs one). `host check` reads that on the host (`probe_lines`, shell, nothing of this
machine's paths in it), says it as the `cage` check (`check`), installs the pinned srt
there with npm next to the host's claude (`--yes`: `install_script`, then the host's
record of it, `record_script`, which the host's runners read: execution/worker/hostcage.py), and
keeps what it found on this machine, per host (`remember`). A caged task for a host whose
last check said it cannot cage (or that was never checked) is refused at submit with one
line (`refusal`); a host whose settings say `cage = "off"` runs its workers uncaged
(`mode_for`). At each start the host itself checks again (the SSH agent's stage, the Ray
job): what changed there since is said then.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from typing import Any

from fleet_tui.execution.worker import cage, hostcage

SRT_PACKAGE = f"{cage.SRT_PACKAGE}@{cage.SRT_VERSION}"
MIN_NODE = (20, 0)  # srt runs on node 20 (its package asks for 22.12; 20 is what we test)
PROGRAMS = (("bwrap", "bubblewrap"), ("socat", "socat"), ("rg", "ripgrep"))
RECORDS = "host-cage"  # folder of this machine's data dir: one JSON file per host


def _sh(path: str) -> str:
    """A path for the host's shell: `$HOME/...` taken as the host's HOME."""
    if path.startswith("$HOME/"):
        return '"$HOME"' + shlex.quote(path[len("$HOME"):])
    return shlex.quote(path)


def probe_lines(data_dir: str, given: str | None = None) -> str:
    """Shell lines that print what the cage needs on the host, `cage_*=...` one a line:
    srt's folder (the host's setting `given`, else the record in `data_dir`, else the copy
    installed there, else an `srt` on PATH) and version, node's version, bwrap, socat, rg,
    and whether a user namespace can be made there (bubblewrap runs `true` in one)."""
    package = "node_modules/" + cage.SRT_PACKAGE
    if given:
        first = (f's="" ; for x in {_sh(given)} {_sh(given)}/{package} '
                 f'{_sh(given)}/lib/{package}; do [ -f "$x/dist/index.js" ] && {{ s="$x"; '
                 'break; }; done')
    else:
        first = (f's=$(head -n 1 {_sh(data_dir + "/" + hostcage.RECORD)} 2>/dev/null); '
                 '[ -n "$s" ] && [ -f "$s/dist/index.js" ] || s=""; '
                 f'x={_sh(data_dir + "/" + hostcage.INSTALLED)}/{package}; '
                 '[ -z "$s" ] && [ -f "$x/dist/index.js" ] && s="$x"; '
                 'if [ -z "$s" ] && x=$(command -v srt 2>/dev/null); then '
                 'x=$(readlink -f "$x" 2>/dev/null); x=$(dirname "$(dirname "$x")"); '
                 '[ -f "$x/dist/index.js" ] && s="$x"; fi')
    return "\n".join([
        first,
        'echo "cage_srt=$s"',
        'echo "cage_srt_version=$([ -n "$s" ] && sed -n \'s/^ *"version": *"\\([^"]*\\)".*/'
        '\\1/p\' "$s/package.json" 2>/dev/null | head -n 1)"',
        'echo "cage_node=$(node --version 2>/dev/null)"',
        *(f'echo "cage_{p}=$(command -v {p} 2>/dev/null)"' for p, _ in PROGRAMS),
        'if command -v bwrap >/dev/null 2>&1; then u=$(bwrap --ro-bind / / --unshare-user '
        '--unshare-pid --unshare-net --proc /proc --dev /dev true 2>&1 </dev/null) && '
        'echo "cage_userns=yes" || echo "cage_userns=no: $(printf \'%s\' "$u" | head -n 1)"; '
        'fi',
    ])


def _version(text: str) -> tuple[int, ...] | None:
    import re

    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g) for g in match.groups() if g is not None) if match else None


def lacks(values: dict[str, str]) -> list[str]:
    """What the host lacks for the cage (each with how to get it), from `probe_lines`."""
    out: list[str] = []
    node = _version(values.get("cage_node", ""))
    if node is None:
        out.append("node (Node.js, which runs srt: e.g. `apt install nodejs npm`)")
    elif node < MIN_NODE:
        out.append(f"node {'.'.join(map(str, MIN_NODE))} or newer (it has "
                   f"{'.'.join(map(str, node))})")
    for program, package in PROGRAMS:
        if not values.get(f"cage_{program}"):
            out.append(f"{program} (`apt install {package}`)")
    userns = values.get("cage_userns", "")
    if values.get("cage_bwrap") and userns != "yes":
        why = userns.partition(":")[2].strip() or "bubblewrap could not run"
        out.append(f"user namespaces for its user ({why[:160]}: e.g. `sysctl -w "
                   "kernel.unprivileged_userns_clone=1`, or on Ubuntu 24.04 "
                   "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`)")
    if not values.get("cage_srt"):
        out.append(f"srt ({SRT_PACKAGE})")
    elif values.get("cage_srt_version") and values["cage_srt_version"] != cage.SRT_VERSION:
        out.append(f"srt {cage.SRT_VERSION} (it has {values['cage_srt_version']} at "
                   f"{values['cage_srt']})")
    return out


def check(values: dict[str, str], *, name: str, setting: str | None, ray: bool = False
          ) -> tuple[bool, str, str]:
    """The `cage` check of a host: (ok, what was found, how to fix it)."""
    if setting == "off":
        return True, ("off: its workers run uncaged (cage = \"off\" in "
                      f"[hosts.{name}])"), ""
    missing = lacks(values)
    if not missing:
        return True, (f"can cage its workers (srt {values.get('cage_srt_version') or '?'} "
                      f"at {values.get('cage_srt')}, bubblewrap, user namespaces)"), ""
    srt_only = all(m.startswith("srt ") for m in missing)
    if ray:
        fix = (f"install them on the nodes (srt: npm install --prefix DIR {SRT_PACKAGE}, "
               f"then srt = \"DIR\" in [hosts.{name}])")
    elif srt_only:
        fix = f"`fleet-tui host check {name} --yes` installs srt there"
    else:
        fix = ("install them there" + (" (then `fleet-tui host check " + name
                                       + " --yes` installs srt)" if any(
                                           m.startswith("srt ") for m in missing) else ""))
    return False, "cannot cage its workers: it lacks " + "; ".join(missing), \
        fix + f"; or set cage = \"off\" in [hosts.{name}] to run its workers uncaged"


def check_host(name: str, values: dict[str, str], *, setting: str | None = None,
               ray: bool = False, here: bool = False) -> tuple[bool, str, str]:
    """`host check`'s `cage` check of a host (`here`: this machine, the local cage's own
    checks; `setting`: the host's `cage`; `ray`: a Ray host, its nodes), kept on this
    machine for `refusal` (a remote host's)."""
    if here:
        env = dict(os.environ)
        problems = cage.missing(env, cage.default_data_dir(env))
        why = "; ".join(problems) if problems else cage.probe(env)
        if not why:
            return True, "can cage its workers (srt, bubblewrap, user namespaces)", ""
        return False, f"cannot cage its workers: {why}", \
            "install that (fleet-doctor says how), or set cage = \"off\" in config.toml"
    ok, found, fix = check(values, name=name, setting=setting, ray=ray)
    if setting != "off":
        remember(name, ok, found, fix)
    return ok, found, fix


def install_dir(data_dir: str) -> str:
    return f"{data_dir}/{hostcage.INSTALLED}"


def install_script(data_dir: str) -> str:
    """The pinned srt installed with npm into the host's data dir, beside its claude."""
    folder = _sh(install_dir(data_dir))
    return (f"mkdir -p {folder} && npm install --prefix {folder} --no-audit --no-fund "
            f"{shlex.quote(SRT_PACKAGE)}\n")


def installed_path(data_dir: str) -> str:
    return f"{install_dir(data_dir)}/node_modules/{cage.SRT_PACKAGE}"


def record_script(data_dir: str, srt: str) -> str:
    """The host's record of its srt (what its runners cage their workers with)."""
    return (f"mkdir -p -m 700 {_sh(data_dir)} && printf '%s\\n' {_sh(srt)} > "
            f"{_sh(data_dir + '/' + hostcage.RECORD)}\n")


# --- what the last check said, kept on this machine per host --------------------------------

def _record_path(name: str) -> str:
    from fleet_tui.system import paths

    return os.path.join(str(paths.home()), RECORDS, f"{name}.json")


def remember(name: str, ok: bool, found: str, fix: str) -> None:
    """What `host check` found about the host's cage, for `refusal` to read at submit."""
    path = _record_path(name)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"ok": ok, "found": found, "fix": fix, "at": time.time()}, fh)
    os.replace(tmp, path)


def recorded(name: str) -> dict[str, Any] | None:
    try:
        with open(_record_path(name), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def mode_for(host: object, mode: str) -> str:
    """The cage an attempt on `host` gets: off where the host's settings say so (or for a
    kind of host that has no cage setting: it cannot be caged), else the task's (its
    settings and repository's)."""
    return "off" if getattr(host, "cage", "off") == "off" else mode


def refusal(host: object, mode: str) -> str | None:
    """Why a task with cage `mode` cannot go to `host` (one line), None when it can: the
    host's last `host check` said it can cage, or its workers run uncaged by the settings."""
    if not hasattr(host, "cage") or mode_for(host, mode) != "worker":
        return None
    name = str(getattr(host, "name", "?"))
    last = recorded(name)
    if last is not None and last.get("ok"):
        return None
    off = (f"or set cage = \"off\" in [hosts.{name}] of config.toml (or the task's "
           "settings) to run its workers uncaged")
    if last is None:
        how = f"`fleet-tui host check {name}" + (" --probe`" if getattr(host, "address", None)
                                                   else " --yes` (it installs srt there)")
        return (f"host {name} has not been checked for the cage its workers run in: run "
                f"{how}, {off}")
    return f"host {name} {last.get('found')}: {last.get('fix') or off}"


__all__ = ["check", "install_script", "lacks", "mode_for", "probe_lines", "record_script",
           "refusal", "remember"]
