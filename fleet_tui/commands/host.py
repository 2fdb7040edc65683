"""fleet-tui host add|ls|rm|check: the machines workers run on (issue 20).

`add` writes a `[hosts.NAME]` table into config.toml (the rest of the file kept byte for
byte: settings/hosts.py's writer), `rm` cuts it out (refused while tasks live on that
host: their worktrees and sessions are there), `ls` lists `local` and the configured hosts
with their caps and tasks, `check` says whether a host can run workers, each failed check
with its fix, and offers to install the pinned claude there with npm (`--yes`: without
asking). The same hosts can be written by hand in config.toml.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fleet_tui import CLAUDE_CODE_VERSION
from fleet_tui.core.errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    FleetRefused,
    FleetTuiError,
)
from fleet_tui.core.states import ACTIVE_STATES
from fleet_tui.engine import host_check
from fleet_tui.engine.host_check import Check
from fleet_tui.settings.config import ConfigError, Settings, config_file_path, load_settings
from fleet_tui.settings.hosts import (
    LOCAL,
    HostConfig,
    add_host,
    host_from_table,
    remove_host,
)

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleet-tui host",
        description="The machines workers run on: `local` (this one) and the ssh hosts of "
                    "config.toml ([hosts.NAME]).")
    sub = parser.add_subparsers(dest="action", metavar="add|ls|rm|check")
    add = sub.add_parser("add", help="add an ssh host or a Ray cluster to config.toml")
    add.add_argument("name", help="its name (`run --host NAME`)")
    add.add_argument("target", nargs="?", help="as ssh takes it: an alias of ~/.ssh/config, "
                     "user@host, host:port (not with --ray)")
    add.add_argument("--ray", metavar="ADDRESS",
                     help="a Ray cluster's Jobs address (e.g. http://head:8265): each "
                          "attempt a Ray job (needs pip install 'fleet-tui[ray]')")
    add.add_argument("--resources", metavar="JSON",
                     help='with --ray: the resources each job asks for, e.g. \'{"gpu_box": 1}\''
                          " (its node)")
    add.add_argument("-p", "--port", type=int, metavar="PORT",
                     help="the ssh port (or write host:port)")
    add.add_argument("--max-workers", type=int, metavar="N",
                     help="workers at once on that host (default: the top-level max_workers)")
    add.add_argument("--key-on-host", action="store_true",
                     help="keep the key on the host, for workers that must go on while this "
                          "machine is away (default: the key never leaves this machine)")
    ls = sub.add_parser("ls", help="the hosts, their caps and tasks")
    ls.add_argument("--json", action="store_true", help="a JSON list")
    rm = sub.add_parser("rm", help="remove a host from config.toml (not while tasks live "
                        "on it)")
    rm.add_argument("name")
    check = sub.add_parser("check", help="can the host run workers? each failed check with "
                           "its fix")
    check.add_argument("name", nargs="?", default=LOCAL, help="a host's name (default local)")
    check.add_argument("--yes", action="store_true",
                       help="install what is missing (the pinned claude) without asking")
    check.add_argument("--json", action="store_true", help="the checks as JSON")
    check.add_argument("--probe", action="store_true",
                       help="a Ray host: run one short job on a node (placed by the host's "
                            "resources) that reads git, python and claude there")
    return parser


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(f"fleet-tui host: {text}\n")


def _settings() -> Settings:
    return load_settings()


def _add(args: argparse.Namespace) -> int:
    settings = _settings()  # a config.toml that does not read is said before writing
    path = config_file_path()
    if args.ray is not None:
        return _add_ray(args, settings, Path(path))
    if args.resources is not None:
        raise ConfigError("--resources is for a Ray host (with --ray ADDRESS)")
    if args.target is None:
        raise ConfigError("host add: give an ssh target (user@host) or --ray ADDRESS")
    table: dict[str, object] = {"ssh": args.target}
    if args.port is not None:
        table["port"] = args.port
    if args.max_workers is not None:
        table["max_workers"] = args.max_workers
    if args.key_on_host:
        table["key_on_host"] = True
    if args.name == LOCAL:
        raise ConfigError("'local' is this machine, always a host; give the ssh host another "
                          "name (this machine's cap: [hosts.local] max_workers in "
                          f"{path})")
    host = host_from_table(args.name, table, "host add", settings.max_workers)
    add_host(Path(path), host)
    _out(f"added host {host.name}: ssh {host.target}, max_workers {host.max_workers}"
         + (", the key kept on the host" if host.key_on_host else "") + f" ({path})")
    _out(f"check it: fleet-tui host check {host.name}")
    return EXIT_OK


def _add_ray(args: argparse.Namespace, settings: Settings, path: Path) -> int:
    if args.target is not None or args.port is not None or args.key_on_host:
        raise ConfigError("host add --ray: a Ray host has no ssh target, --port or "
                          "--key-on-host (its Jobs address is all it needs)")
    if args.name == LOCAL:
        raise ConfigError("'local' is this machine, always a host; give the Ray host "
                          "another name")
    table: dict[str, object] = {"ray": args.ray}
    if args.resources is not None:
        try:
            table["resources"] = json.loads(args.resources)
        except ValueError as exc:
            raise ConfigError(f"host add: --resources: not JSON ({exc}); e.g. "
                              '\'{"gpu_box": 1}\'', key="resources") from None
    if args.max_workers is not None:
        table["max_workers"] = args.max_workers
    host = host_from_table(args.name, table, "host add", settings.max_workers)
    add_host(path, host)
    asked = (", resources " + ", ".join(f"{k}={v:g}" for k, v in host.resources.items())
             if host.resources else "")
    _out(f"added host {host.name}: Ray cluster {host.ray}{asked}, max_workers "
         f"{host.max_workers} ({path})")
    _out(f"check it: fleet-tui host check {host.name}")
    return EXIT_OK


def _rows(settings: Settings) -> list[dict[str, object]]:
    from fleet_tui.engine.fleet import Fleet

    fleet = Fleet(settings)
    rows: list[dict[str, object]] = []
    for host in settings.all_hosts:
        live = fleet.tasks_on_host(host.name)
        rows.append({"name": host.name, "ssh": host.ssh, "port": host.port,
                     "target": host.target, "max_workers": host.max_workers,
                     "key_on_host": host.key_on_host, "ray": host.ray,
                     "resources": host.resources, "key_env": host.key_env,
                     "running": sum(t.state in ACTIVE_STATES for t in live),
                     "tasks": len(live)})
    return rows


def _ls(args: argparse.Namespace) -> int:
    rows = _rows(_settings())
    if args.json:
        _out(json.dumps(rows, indent=2))
        return EXIT_OK
    width = max(len(str(r["name"])) for r in rows)
    target_width = max(len(str(r["target"])) for r in rows)
    _out(f"{'NAME':<{width}}  {'TARGET':<{target_width}}  {'WORKERS':>7}  {'TASKS':>5}  KEY")
    for r in rows:
        workers = f"{r['running']}/{r['max_workers']}"
        key = (f"${r['key_env']} there" if r["key_env"] else "here") if r["ray"] else \
            "-" if r["ssh"] is None else "on host" if r["key_on_host"] else "here"
        _out(f"{r['name']!s:<{width}}  {r['target']!s:<{target_width}}  {workers:>7}  "
             f"{r['tasks']!s:>5}  {key}")
    return EXIT_OK


def _rm(args: argparse.Namespace) -> int:
    from fleet_tui.engine.fleet import Fleet

    settings = _settings()
    if args.name == LOCAL:
        raise FleetRefused("'local' is this machine: it is always a host")
    host = settings.host(args.name)  # ConfigError naming the hosts
    live = Fleet(settings).tasks_on_host(host.name)
    if live:
        ids = ", ".join(t.id for t in live[:8]) + (" ..." if len(live) > 8 else "")
        raise FleetRefused(f"{len(live)} task{'s' if len(live) != 1 else ''} live on the host "
                           f"{host.name} ({ids}): their worktrees and sessions are there; "
                           "merge or discard them first (`fleet-tui merge ID`, `fleet-tui "
                           "discard ID`)")
    path = config_file_path()
    remove_host(Path(path), host.name)
    _out(f"removed host {host.name} ({path})")
    return EXIT_OK


def _claude_where(settings: Settings, host: HostConfig) -> tuple[tuple[str, ...], str | None]:
    """Where the host's claude is looked for first, and where `--yes` installs it."""
    if not host.is_local:
        return (), None
    from fleet_tui.system import paths

    copy = paths.cli_install_dir()
    return (settings.claude, str(copy / "node_modules" / ".bin" / "claude")), str(copy)


def _check(args: argparse.Namespace) -> int:
    settings = _settings()
    host = settings.host(args.name)
    if host.is_ray:
        return _check_ray(host, as_json=args.json, probe=args.probe)
    if args.probe:
        raise ConfigError(f"--probe is for a Ray host; {host.name} is checked on the host "
                          "itself already")
    claude, install_to = _claude_where(settings, host)
    checks, values = host_check.check_host(host, claude=claude, install_to=install_to)
    failed_claude = any(c.name == "claude" and not c.ok for c in checks)
    if failed_claude and values.get("npm") and (args.yes or not args.json):
        if not args.json:
            _show(host, checks)
        if not _install(host, install_to, args.yes, quiet=args.json):
            return EXIT_FAILED
        if not host.is_local:  # the installed one is the host's now (its record)
            host_check.run_on(host, host_check.record_script(
                f"{host_check.claude_dir()}/node_modules/.bin/claude"))
        checks, values = host_check.check_host(host, claude=claude, install_to=install_to)
    if not host.is_local and any(c.name == "claude" and c.ok for c in checks) \
            and values.get("claude_path"):
        # what the host's runners run: the one found here (execution/hostclaude.py)
        host_check.run_on(host, host_check.record_script(values["claude_path"]))
    if not host.is_local:
        caged, values = _cage_srt(host, checks, values, args, claude, install_to)
        if caged is None:
            return EXIT_FAILED
        checks = caged
    return _report(host, checks, as_json=args.json)


def _cage_srt(host: HostConfig, checks: list[Check], values: dict[str, str],
              args: argparse.Namespace, claude: tuple[str, ...], install_to: str | None
              ) -> tuple[list[Check] | None, dict[str, str]]:
    """An ssh host's srt (what its workers' cage runs on): installed with npm into its
    data dir beside its claude when it lacks it (`--yes`, or asked), and recorded there
    (the host's runners read the record: execution/hostcage.py)."""
    if host_check.srt_lacking(values) and values.get("npm") and host.cage != "off" \
            and (args.yes or not args.json):
        if not args.json:
            _show(host, checks)
        if not _install(host, install_to, args.yes, quiet=args.json,
                        script=host_check.srt_install_script(), what=host_check.SRT_WHAT):
            return None, values
        host_check.run_on(host, host_check.srt_record_script())
        checks, values = host_check.check_host(host, claude=claude, install_to=install_to)
    if values.get("cage_srt"):  # what the host's runners cage their workers with
        host_check.run_on(host, host_check.srt_record_script(values["cage_srt"]))
    return checks, values


def _check_ray(host: HostConfig, *, as_json: bool, probe: bool = False) -> int:
    return _report(host, host_check.check_ray_host(host, probe=probe), as_json=as_json)


def _report(host: HostConfig, checks: list[Check], *, as_json: bool) -> int:
    """The checks shown (or as JSON); the exit status says whether all passed."""
    if as_json:
        _out(json.dumps({"host": host.name, "target": host.target,
                         "ok": all(c.ok for c in checks),
                         "checks": [c.to_json() for c in checks]}, indent=2))
    else:
        _show(host, checks)
    return EXIT_OK if all(c.ok for c in checks) else EXIT_FAILED


def _show(host: HostConfig, checks: list[Check]) -> None:
    what = "this machine" if host.is_local else \
        f"Ray {host.target}" if host.is_ray else f"ssh {host.target}"
    _out(f"host {host.name} ({what}):")
    for check in checks:
        _out(f"  {'ok  ' if check.ok else 'FAIL'}  {check.name:<9}  {check.found}")
        if not check.ok and check.fix:
            _out(f"        fix: {check.fix}")


def _install(host: HostConfig, install_to: str | None, yes: bool, *,
             quiet: bool = False, script: str | None = None, what: str = "") -> bool:
    """The pinned claude (or `what`, by `script`) installed on the host with npm, after
    asking (unless `yes`)."""
    say = _err if quiet else _out
    given = script
    script = script or host_check.install_script(install_to)
    what = what or f"Claude Code {CLAUDE_CODE_VERSION}"
    where = "here" if host.is_local else f"on {host.name}"
    if not yes:
        if not sys.stdin.isatty():
            say(f"not installed (no terminal to ask); `fleet-tui host check {host.name} "
                 f"--yes` installs {what} {where}")
            return False
        try:
            answer = input(f"Install {what} {where} with npm? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            say("not installed")
            return False
    limit = host_check.INSTALL_LIMIT
    say(f"installing {what} {where} with npm (stopped after "
        f"{host_check._minutes(limit)}) ...")

    def progress(elapsed: float, last: str) -> None:
        say(f"  still installing ({elapsed:.0f} s)" + (f": {last[:160]}" if last else ""))

    done = host_check.install(host, install_to, limit=limit, progress=progress, script=given)
    if not done.ok:
        say(f"npm failed {where}: {done.why}")
        for line in done.errors:
            say(f"  {line}")
        say(f"fix that, then `fleet-tui host check {host.name} --yes` again, or run it by "
            f"hand {where}:\n  {script.strip()}")
        return False
    return True


def main(argv: list[str]) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0) if exc.code in (0, None) else EXIT_USAGE
    if args.action is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    action = {"add": _add, "ls": _ls, "rm": _rm, "check": _check}[args.action]
    try:
        return action(args)
    except FleetTuiError as exc:
        _err(exc.message)
        return exc.exit_code if exc.exit_code is not None else EXIT_REFUSED
