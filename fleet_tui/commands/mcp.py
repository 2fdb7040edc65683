"""fleet-tui mcp [install [--scope user|project] [--print]]: the fleet as the tools of a
Claude Code session.

`fleet-tui mcp` serves MCP over stdio (Claude Code starts it; the tools are in
mcp_server.py), on the same engine and store as the panel and the CLI. `fleet-tui mcp
install` registers it with Claude Code as `claude mcp add` does (user scope: the
`mcpServers` of ~/.claude.json, or $CLAUDE_CONFIG_DIR/.claude.json; project scope: the
repository's .mcp.json) and installs the orchestrator's skill (SKILL.md) beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

from fleet_tui.core import redaction
from fleet_tui.core.errors import EXIT_OK, EXIT_USAGE, FleetTuiError

SERVER = "fleet"  # Claude Code names the tools mcp__fleet__<tool>
SKILL = "fleet"  # the skill's folder and name

USAGE = """\
usage: fleet-tui mcp [--repo PATH]                 serve the fleet's tools over stdio (MCP)
       fleet-tui mcp install [--scope user|project] [--print] [--repo PATH]
                                                  register it with Claude Code, with a skill

`fleet-tui mcp` is started by Claude Code, not by hand: register it with `fleet-tui mcp
install` (user scope: every project; project scope: the repository's .mcp.json and
.claude/skills/, to check in). The server's caps are [mcp] max_tasks and max_spend in
config.toml.
"""


class _Usage(FleetTuiError):
    exit_code = EXIT_USAGE


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _Usage(f"{message} (see `{self.prog} --help`)")


def main(argv: list[str]) -> int:
    """Every failure is one line on stderr and an exit code."""
    name = "mcp install" if argv[:1] == ["install"] else "mcp"
    try:
        if argv[:1] == ["install"]:
            return _install(argv[1:])
        if argv[:1] in (["-h"], ["--help"], ["help"]):
            sys.stdout.write(USAGE)
            return EXIT_OK
        if argv and not argv[0].startswith("-"):
            raise _Usage(f"unknown mcp command {argv[0]!r}; use `fleet-tui mcp` (serve) or "
                         "`fleet-tui mcp install`")
        return _serve(argv)
    except SystemExit as exc:  # --help
        return int(exc.code or 0) if isinstance(exc.code, int | None) else EXIT_USAGE
    except FleetTuiError as exc:
        sys.stderr.write(f"fleet-tui {name}: {redaction.redact(exc.message)}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_OK


# --- serving ------------------------------------------------------------------------------


def _serve(argv: list[str]) -> int:
    p = _Parser(prog="fleet-tui mcp", description="Serve the fleet's tools over stdio (MCP); "
                "Claude Code starts it (see `fleet-tui mcp install`).")
    p.add_argument("--repo", type=Path, help="the repository the tools work in by default "
                   "(default: the current directory's)")
    args = p.parse_args(argv)
    from fleet_tui.settings.config import config_file_path, load_settings
    from fleet_tui.settings.mcp import read_mcp_settings
    from fleet_tui.vcs import git

    settings = load_settings()  # a ConfigError: one line, exit 2, before serving
    caps = read_mcp_settings(str(config_file_path()))
    repo: Path | None
    try:
        repo = git.main_worktree(args.repo if args.repo is not None else Path.cwd())
    except git.GitError as exc:
        if args.repo is not None:
            raise _Usage(str(exc)) from None
        repo = None  # each call then names its repository
    from fleet_tui.commands.mcp_server import FleetTools, build_server
    from fleet_tui.engine.fleet import Fleet

    fleet = Fleet(settings)
    tools = FleetTools(fleet, caps, repo)
    server = build_server(tools)
    if sys.stdin is not None and sys.stdin.isatty():
        sys.stderr.write("fleet-tui mcp: serving MCP on stdin and stdout, for Claude Code "
                         "to start (`fleet-tui mcp install` registers it); Ctrl-C ends\n")
    tools.start()
    try:
        server.run("stdio")
    finally:
        tools.stop()
    return EXIT_OK


# --- installing -----------------------------------------------------------------------------


def _claude_home() -> Path:
    """Claude Code's own folder (skills, settings): $CLAUDE_CONFIG_DIR, else ~/.claude."""
    configured = os.environ.get("CLAUDE_CONFIG_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".claude"


def _user_config() -> Path:
    """Where `claude mcp add --scope user` writes: .claude.json in $CLAUDE_CONFIG_DIR, else
    in the home folder (seen with Claude Code 2.1.197)."""
    configured = os.environ.get("CLAUDE_CONFIG_DIR")
    return (Path(configured).expanduser() if configured else Path.home()) / ".claude.json"


def _server_command(scope: str) -> list[str]:
    """How Claude Code starts the server. A project's .mcp.json is checked in: `fleet-tui`
    found on each one's PATH. The user's: this installation, by its full path, so that a
    Claude Code started without the virtualenv on PATH finds it too."""
    if scope == "project":
        return ["fleet-tui", "mcp"]
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if script is not None and script.name == "fleet-tui" and script.is_file():
        return [str(script.resolve()), "mcp"]
    found = shutil.which("fleet-tui")
    if found:
        return [str(Path(found).resolve()), "mcp"]
    return [sys.executable, "-m", "fleet_tui.cli", "mcp"]


def skill_text() -> str:
    """The orchestrator's skill, as installed (shipped beside this module)."""
    return resources.files("fleet_tui.commands").joinpath("mcp_skill.md").read_text("utf-8")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise _Usage(f"cannot read {path}: {exc}") from None
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise _Usage(f"{path} is not valid JSON ({exc}); nothing was changed: mend it, or "
                     "use `--print` and add the entry by hand") from None
    if not isinstance(data, dict):
        raise _Usage(f"{path} does not hold a JSON object; nothing was changed")
    servers = data.get("mcpServers")
    if servers is not None and not isinstance(servers, dict):
        raise _Usage(f"{path}: \"mcpServers\" is not an object; nothing was changed")
    return data


def _write(path: Path, text: str, mode: int | None = None) -> None:
    """Write the whole file at once (a reader sees the old one or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        try:
            mode = path.stat().st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _install(argv: list[str]) -> int:
    p = _Parser(prog="fleet-tui mcp install", description="Register `fleet-tui mcp` with "
                "Claude Code (as `claude mcp add` does) and install the orchestrator's "
                "skill: when to delegate to the fleet, how to write a task, fan out, wait, "
                "read diffs and land through the queue.")
    p.add_argument("--scope", choices=("user", "project"), default="user",
                   help="user: every project (~/.claude.json, ~/.claude/skills/); project: "
                   "this repository (.mcp.json, .claude/skills/), to check in (default user)")
    p.add_argument("--print", dest="dry", action="store_true",
                   help="show what it would write, and write nothing")
    p.add_argument("--repo", type=Path, help="with --scope project: the repository "
                   "(default: the current directory's)")
    args = p.parse_args(argv)
    if args.scope == "project":
        from fleet_tui.vcs import git

        try:
            root = git.main_worktree(args.repo if args.repo is not None else Path.cwd())
        except git.GitError as exc:
            raise _Usage(f"{exc} (--scope project writes the repository's .mcp.json)") \
                from None
        config, skill_dir, indent, mode = root / ".mcp.json", root / ".claude", 2, None
    else:
        if args.repo is not None:
            raise _Usage("--repo goes with --scope project")
        config, skill_dir, indent, mode = _user_config(), _claude_home(), 2, 0o600
    command = _server_command(args.scope)
    entry = {"type": "stdio", "command": command[0], "args": command[1:], "env": {}}
    skill = skill_dir / "skills" / SKILL / "SKILL.md"
    text = skill_text()
    if args.dry:
        sys.stdout.write(f"would add to {config}:\n"
                         + json.dumps({"mcpServers": {SERVER: entry}}, indent=2)
                         + f"\n\nwould write {skill}:\n{text}")
        return EXIT_OK
    data = _read_json(config)
    servers: dict[str, Any] = data.setdefault("mcpServers", {})
    before = servers.get(SERVER)
    if before != entry:
        servers[SERVER] = entry
        _write(config, json.dumps(data, indent=indent), mode)  # as Claude Code writes it
    said = ("already registered" if before == entry else
            "registered" if before is None else
            f"registered (it replaced the server {SERVER!r} that ran "
            f"{_command_text(before)})")
    print(f"{said}: the MCP server {SERVER!r} ({' '.join(command)}) in {config}")
    try:
        old = skill.read_text(encoding="utf-8")
    except (FileNotFoundError, UnicodeDecodeError):
        old = None
    except OSError as exc:
        raise _Usage(f"cannot read {skill}: {exc}") from None
    if old != text:
        _write(skill, text)
    print(("skill unchanged" if old == text else "skill installed" if old is None
           else "skill updated") + f": {skill}")
    where = ("every project" if args.scope == "user"
             else f"{config.parent} (Claude Code asks once to trust the project's servers)")
    print(f"Claude Code in {where} now has the tools mcp__{SERVER}__run, ...: ask it to "
          "split a change into tasks for the fleet; the panel (`fleet-tui`) shows them.")
    return EXIT_OK


def _command_text(entry: object) -> str:
    if isinstance(entry, dict):
        parts = [str(entry.get("command") or entry.get("url") or "?")]
        extra = entry.get("args")
        if isinstance(extra, list):
            parts += [str(a) for a in extra]
        return "`" + " ".join(parts) + "`"
    return "an entry of another shape"
