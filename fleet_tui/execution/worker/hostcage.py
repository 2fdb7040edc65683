"""Whether a remote host's runner can cage its worker, and with which srt: the host's own.

Runs on the host (the SSH agent's `stage`, the Ray job's entrypoint) with the host's python
and the standard library only, as execution/worker/hostclaude.py does for claude. Nothing of this
machine decides it: on the host, in order,
1. the srt the host's settings name (a Ray host's `srt`: its package folder on the nodes, or
   an npm prefix holding it), else
2. the one `fleet-tui host check --yes` installed or found there, recorded in the host's
   data dir (`RECORD`), while it is still there, else
3. the copy `host check --yes` installs into the data dir (`INSTALLED`), else
4. FLEET_WORKER_SRT of the host's environment, then an `srt` on the host's PATH.
The other programs the cage needs (node, bubblewrap, socat, ripgrep) are looked for on the
PATH the host's runners get (execution/worker/cage.py's `missing`).
"""

from __future__ import annotations

import os

from fleet_tui.execution.worker import cage

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

RECORD = "srt-path"  # in the host's data dir, written by `fleet-tui host check`
INSTALLED = "srt"  # the npm prefix `host check --yes` installs srt into (in the data dir)


def find(data_dir: str, given: str | None = None,
         env: Mapping[str, str] | None = None) -> str | None:
    """srt's package folder on this host, or None."""
    env = os.environ if env is None else env
    if given:
        return cage._package_in(os.path.expanduser(given))
    try:
        with open(os.path.join(data_dir, RECORD), encoding="utf-8") as fh:
            recorded = fh.readline().strip()
    except OSError:
        recorded = ""
    named = env.get(cage.SRT_ENV, "").strip()
    for folder in (recorded, os.path.join(data_dir, INSTALLED), os.path.expanduser(named)):
        found = cage._package_in(folder) if folder else None
        if found:
            return found
    srt = cage._which("srt", env.get("PATH", os.defpath))
    if srt is not None:  # <prefix>/bin/srt -> ../lib/node_modules/<package>/dist/cli.js
        return cage._package_in(os.path.dirname(os.path.dirname(os.path.realpath(srt))))
    return None


def ready(data_dir: str, given: str | None = None,
          env: Mapping[str, str] | None = None) -> tuple[str | None, list[str]]:
    """(srt's package folder, what the cage lacks on this host: [] when it can cage)."""
    env = dict(os.environ if env is None else env)
    srt = find(data_dir, given, env)
    problems: list[str] = []
    if srt is None:
        where = f"{given} (the host's setting)" if given else \
            f"not in {os.path.join(data_dir, INSTALLED)}, not on PATH"
        problems.append(f"srt ({cage.SRT_PACKAGE} {cage.SRT_VERSION}: {where})")
    else:
        env[cage.SRT_ENV] = srt
    problems += [p for p in cage.missing(env) if not p.startswith("srt ")]
    return srt, problems


def into_spec(spec: dict[str, object], data_dir: str, given: str | None = None,
              env: Mapping[str, str] | None = None) -> str:
    """A caged attempt's spec given the host's srt (its environment's FLEET_WORKER_SRT,
    which the runner's cage reads); '' when the spec is not caged or it is done, else why
    this host cannot cage it (one line)."""
    settings = spec.get("settings")
    # no cage named: the runner's default, the cage
    if not isinstance(settings, dict) or settings.get("cage", "worker") != "worker":
        return ""
    srt, problems = ready(data_dir, given, env)
    if problems or srt is None:
        return "the cage cannot run there: it lacks " + "; ".join(problems)
    named = spec.get("env")
    if not isinstance(named, dict):
        named = spec["env"] = {}
    named[cage.SRT_ENV] = srt
    return ""


def runner_env(spec_text: str, env: dict[str, str]) -> dict[str, str]:
    """The runner's environment given the srt its staged spec names (the launcher checks
    the cage with the runner's own environment before claude starts)."""
    import json

    try:
        named = json.loads(spec_text).get("env", {}).get(cage.SRT_ENV)
    except (ValueError, AttributeError):
        named = None
    if isinstance(named, str) and named:
        env[cage.SRT_ENV] = named
    return env


__all__ = ["INSTALLED", "RECORD", "find", "into_spec", "ready", "runner_env"]
