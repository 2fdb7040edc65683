"""fleet-tui host add|ls|rm|check: the machines workers run on.

`add` writes a `[hosts.NAME]` table into config.toml (the rest of the file kept byte for
byte: settings/hosts.py's writer), `rm` cuts it out (refused while tasks live on that
host: their worktrees and sessions are there), `ls` lists `local` and the configured hosts
with their caps and tasks, `check` says whether a host can run workers, each failed check
with its fix, and offers to install the pinned claude there with npm (`--yes`: without
asking). The same hosts can be written by hand in config.toml. Each kind of host brings
its own options, columns and checks (settings/kinds.py: the table of kinds); nothing here
names a kind.
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
from fleet_tui.settings import kinds
from fleet_tui.settings.config import ConfigError, Settings, config_file_path, load_settings
from fleet_tui.settings.hosts import (
    LOCAL,
    HostConfig,
    add_host,
    host_from_table,
    remove_host,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from fleet_tui.store.db import Store

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleet-tui host",
        description="The machines workers run on: `local` (this one) and the ssh hosts of "
                    "config.toml ([hosts.NAME]).")
    sub = parser.add_subparsers(dest="action", metavar="add|ls|rm|check")
    add = sub.add_parser("add", help="add a host to config.toml (" + ", ".join(
        f"{k.schema().label}: {k.options().how}" for k in _addable()) + ")")
    add.add_argument("name", help="its name (`run --host NAME`)")
    for kind in _addable():
        kind.options().add_arguments(add)
    add.add_argument("--max-workers", type=int, metavar="N",
                     help="workers at once on that host (default: the top-level max_workers)")
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
                       help="a " + " or ".join(host_check.probing()) + " host: run one short "
                            "job on a node (placed by the host's resources) that reads git, "
                            "python and claude there")
    return parser


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(f"fleet-tui host: {text}\n")


def _settings() -> Settings:
    return load_settings()


def _addable() -> list[kinds.Kind]:
    """The kinds `host add` adds (those config.toml names by a mark), flagged ones first:
    `--ray` picks its kind even when a target is given too (and is refused for it)."""
    marked = [k for k, _s in kinds.marked()]
    return [k for k in marked if k.options().flag] + [k for k in marked
                                                      if not k.options().flag]


def _add(args: argparse.Namespace) -> int:
    settings = _settings()  # a config.toml that does not read is said before writing
    path = Path(config_file_path())
    addable = _addable()
    chosen = next((k for k in addable if k.options().picks(args)), None)
    if chosen is None:
        for other in addable:  # a kind's options given without the flag that picks it
            if other.options().flag:
                other.options().refuse_stray(args, None, "")
        raise ConfigError("host add: give " + " or ".join(k.options().how for k, _s in
                                                          kinds.marked()))
    for other in addable:
        if other is not chosen:
            other.options().refuse_stray(args, chosen.options().flag, chosen.schema().label)
    label = chosen.schema().label
    if args.name == LOCAL:
        raise ConfigError(f"'local' is this machine, always a host; give the {label} host "
                          "another name (this machine's cap: [hosts.local] max_workers in "
                          f"{path})")
    table = chosen.options().table(args)
    if args.max_workers is not None:
        table["max_workers"] = args.max_workers
    host = host_from_table(args.name, table, "host add", settings.max_workers)
    add_host(path, host)
    _out(f"added host {host.name}: {chosen.options().added(host)} ({path})")
    _out(f"check it: fleet-tui host check {host.name}")
    return EXIT_OK


def _store() -> Store:
    """The task store, for the tasks that live on a host: a read, no engine built."""
    from fleet_tui.store.db import Store
    from fleet_tui.system import paths

    return Store(paths.db_path())


def _rows(settings: Settings) -> list[dict[str, object]]:
    store = _store()
    blank: dict[str, object] = {}
    for kind in kinds.KINDS:
        blank.update(kind.options().blank_row())
    rows: list[dict[str, object]] = []
    for host in settings.all_hosts:
        live = store.tasks_on_host(host.name)
        own = kinds.kind(host.kind).options()
        rows.append({"name": host.name, "kind": host.kind, **blank, "target": host.target,
                     "max_workers": host.max_workers, **own.row(host),
                     "key": own.key_shown(host),
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
        _out(f"{r['name']!s:<{width}}  {r['target']!s:<{target_width}}  {workers:>7}  "
             f"{r['tasks']!s:>5}  {r['key']}")
    return EXIT_OK


def _rm(args: argparse.Namespace) -> int:
    settings = _settings()
    if args.name == LOCAL:
        raise FleetRefused("'local' is this machine: it is always a host")
    host = settings.host(args.name)  # ConfigError naming the hosts
    live = _store().tasks_on_host(host.name)
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


def _check(args: argparse.Namespace) -> int:
    settings = _settings()
    host = settings.host(args.name)
    kind = host_check.checks_of(host)
    if args.probe and not kind.probes:
        raise ConfigError(f"--probe is for a {' or '.join(host_check.probing())} host; "
                          f"{host.name} is checked on the host itself already")
    claude, install_to = kind.claude_where(settings, host)
    checks, values = host_check.check_host(host, claude=claude, install_to=install_to,
                                           probe=args.probe)
    if kind.shell(host) is None:  # nothing to install or record with
        return _report(host, checks, as_json=args.json)
    failed_claude = any(c.name == "claude" and not c.ok for c in checks)
    if failed_claude and values.get("npm") and (args.yes or not args.json):
        if not args.json:
            _show(host, checks)
        if not _install(host, install_to, args.yes, quiet=args.json):
            return EXIT_FAILED
        if kind.records:  # the installed one is the host's now (its record)
            host_check.run_on(host, host_check.record_script(
                f"{host_check.claude_dir()}/node_modules/.bin/claude"))
        checks, values = host_check.check_host(host, claude=claude, install_to=install_to)
    if kind.records and any(c.name == "claude" and c.ok for c in checks) \
            and values.get("claude_path"):
        # what the host's runners run: the one found here (execution/worker/hostclaude.py)
        host_check.run_on(host, host_check.record_script(values["claude_path"]))
    if kind.records:  # a host keeping records: its srt too (the local cage has its own)
        caged, values = _cage_srt(host, checks, values, args, claude, install_to)
        if caged is None:
            return EXIT_FAILED
        checks = caged
    return _report(host, checks, as_json=args.json)


def _cage_srt(host: HostConfig, checks: list[Check], values: dict[str, str],
              args: argparse.Namespace, claude: tuple[str, ...], install_to: str | None
              ) -> tuple[list[Check] | None, dict[str, str]]:
    """A host's srt (what its workers' cage runs on): installed with npm into its data
    dir beside its claude when it lacks it (`--yes`, or asked), and recorded there (the
    host's runners read the record: execution/worker/hostcage.py). A host whose cage is off
    passes the `cage` check: nothing installed."""
    failed_cage = any(c.name == "cage" and not c.ok for c in checks)
    if failed_cage and host_check.srt_lacking(values) and values.get("npm") \
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
    _out(f"host {host.name} ({host_check.checks_of(host).describe(host)}):")
    for check in checks:
        mark = "FAIL" if not check.ok else "warn" if check.warn else "ok  "
        _out(f"  {mark}  {check.name:<9}  {check.found}")
        if (not check.ok or check.warn) and check.fix:
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
        f"{host_check.minutes(limit)}) ...")

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
