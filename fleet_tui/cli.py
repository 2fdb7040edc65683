"""Entry points: fleet-tui [subcommand], fleet-worker, fleet-collect, fleet-doctor.

This module only dispatches; each command lives in fleet_tui/commands/<name>.py and exposes
``main(argv: list[str]) -> int``. Imports are lazy so that `fleet-worker` (which execs
claude) never pays for Textual or GitPython, and this module itself imports only `sys`.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

# subcommand -> module under fleet_tui.commands
TASK_COMMANDS = ("run", "ls", "show", "logs", "diff", "merge", "discard", "retry",
                  "follow-up", "kill", "say", "archive", "update", "queue", "compare", "pick",
                  "push", "review")

USAGE = """\
usage: fleet-tui [--demo] [--repo PATH]        open the control panel
       fleet-tui --demo [--new]                the demo: reopens the last one (--new: afresh)
       fleet-tui run PROMPT [--title T] [--base REF] [--copies N] [--endpoint E] [--host H|any]
                     [--wait] [--json]
       fleet-tui ls [--all-repos] [--json]
       fleet-tui show|logs|diff|merge|discard|retry|follow-up|kill ID ...
       fleet-tui update ID [--resolve worker|shell|abort] [--wait]
       fleet-tui queue [ID...] [--wait] [--remove]      fleet-tui compare|pick|push ID
       fleet-tui say ID TEXT                    a message to a running worker
       fleet-tui review ID [--comment FILE:LINE[-LINE] TEXT | --edit N TEXT | --delete N
                        | --send] [--json]      comments on diff lines, sent to the worker
       fleet-tui archive [ID ...] [--older-than DAYS]   merged/discarded out of the list
       fleet-tui cost [--since 7d] [--by task|endpoint|day] [--json]   spend, budgets
       fleet-tui key set|delete|status
       fleet-tui gateway status|stop          the local gateway the workers go through
       fleet-tui host add NAME TARGET [--max-workers N] [--key-on-host] | ls [--json] |
                      rm NAME | check [NAME] [--yes]     the machines workers run on
       fleet-tui serve [--bind ADDR] [--port P] [--public]   the panel in a browser
       fleet-tui mcp [install [--scope user|project] [--print]]   the fleet as Claude
                                                Code's tools (an MCP server), with a skill
       fleet-tui scripted-endpoint [--port P]  try it on your repository without a key
       fleet-tui version

Run `fleet-tui COMMAND --help` for the options of one command.
"""


def _run(module: str, argv: Sequence[str], package: str = "fleet_tui.commands") -> int:
    name = f"{package}.{module}"
    __import__(name)
    result: int = sys.modules[name].main(list(argv))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """A command's exit status. Without `argv` this is the process's own command line (the
    `fleet-tui` script, `python -m fleet_tui.cli`), and main ends the process itself:
    system.leave, which keeps a native library's teardown from aborting it."""
    if argv is None:
        from fleet_tui.system.leave import leave

        leave(_main(sys.argv[1:]))
    return _main(argv)


def _main(argv: Sequence[str]) -> int:
    args = list(argv)
    if args and args[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0
    if args and args[0] in ("version", "--version"):
        from fleet_tui import CLAUDE_CODE_VERSION, __version__

        print(f"fleet-tui {__version__} (tested with Claude Code {CLAUDE_CODE_VERSION})")
        return 0
    if args and args[0] == "key":
        return _run("key", args[1:])
    if args and args[0] == "gateway":
        return _run("gateway", args[1:])
    if args and args[0] == "host":
        return _run("host", args[1:])
    if args and args[0] == "serve":
        return _run("serve", args[1:])
    if args and args[0] == "cost":
        return _run("cost", args[1:])
    if args and args[0] == "mcp":
        return _run("mcp", args[1:])
    if args and args[0] == "scripted-endpoint":
        return _run("scripted", args[1:])
    if args and args[0] in TASK_COMMANDS:
        return _run("tasks", args)
    if args and not args[0].startswith("-"):
        sys.stderr.write(f"fleet-tui: unknown command {args[0]!r}\n\n{USAGE}")
        return 2
    return _run("panel", args)


def worker_main() -> int:
    # fleet-worker is this machine's launcher with a command line: it lives beside it
    return _run("fleet_worker", sys.argv[1:], "fleet_tui.execution.local")


def collect_main() -> int:
    from fleet_tui.system.leave import leave

    leave(_run("collect", sys.argv[1:]))  # it follows the tasks, Ray's included


def doctor_main() -> int:
    return _run("doctor", sys.argv[1:])


if __name__ == "__main__":  # pragma: no cover
    main()
