"""fleet-tui run|ls|show|logs|diff|merge|discard|retry|follow-up|kill|say|archive|update|
queue|compare|pick|push|review: the headless engine.

Every command is a thin layer over `Fleet`. Commands that look at tasks first run one
scheduling pass, so whatever finished while no fleet-tui process was running is recorded
(and queued work starts) before anything is printed: close everything, come back, `ls`.
An ID that names no task is refused from the store before the engine is built (no pass
can make it known: only a new task does).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from fleet_tui.core import policy, redaction
from fleet_tui.core.durations import parse_duration
from fleet_tui.core.errors import (
    EXIT_FAILED,
    EXIT_MISSING,
    EXIT_REFUSED,
    EXIT_USAGE,
    FleetRefused,
    FleetTuiError,
    WorkerFinished,
)
from fleet_tui.core.model import MAX_COPIES, Attempt, Task, TaskSpec, check_text
from fleet_tui.core.states import (
    ACTIVE_STATES,
    CLOSED_STATES,
    FINISHED_STATES,
    LAND_ACTIVE,
    PENDING_STATES,
    Action,
    LandState,
    TaskState,
)
from fleet_tui.core.terminal import visible
from fleet_tui.settings.config import PERMISSION_MODES, Settings, load_settings

# Each command imports the engine, the store, git and the stream parser where it needs them:
# `--help`, a bad option and a refusal print their line without loading them (every command
# is a process of its own, and the test suite starts a great many).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from fleet_tui.core import stream
    from fleet_tui.engine.fleet import Fleet
    from fleet_tui.store.meter import Totals
    from fleet_tui.store.reviews import ReviewComment
    from fleet_tui.vcs import git

EXIT_OK = 0
EXIT_INTERRUPTED = 130

EXIT_CODES = """\
exit codes:
  0  ok
  1  a task failed (run --wait), or the engine reported an error
  2  usage or setup error (bad option, empty or unusable prompt, not a git repository,
     no --yes without a TTY, root without FLEET_WORKER_SANDBOX=1, scrub_tool_env
     without bubblewrap)
  3  no such task (or, for queue --remove, not in the merge queue)
  4  refused to keep your work safe (dirty checkout, conflict, failing test command, a
     fresh retry that would throw changes away without --yes, an action the task's
     state does not allow: killing a merged task, queueing a discarded one, a message
     to a worker that is not running)
  5  claude or the API key is missing
"""

TICK = float(os.environ.get("FLEET_TUI_TICK", "0.1") or 0.1)
RUNNING_OR_PENDING = ACTIVE_STATES | PENDING_STATES


class _Usage(FleetTuiError):
    """A usage error: one line, exit 2."""

    exit_code = EXIT_USAGE


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so every error is one clear line."""

    def error(self, message: str) -> NoReturn:
        raise _Usage(f"{message} (see `{self.prog} --help`)")


def _parser(name: str, description: str) -> _Parser:
    parser = _Parser(prog=f"fleet-tui {name}", description=description, epilog=EXIT_CODES,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, help="the repository (default: the current "
                        "directory's)")
    return parser


def _id_parser(name: str, description: str) -> _Parser:
    parser = _parser(name, description)
    parser.add_argument("id", metavar="ID", help="task id (a unique prefix is enough)")
    return parser


# --- output helpers ---------------------------------------------------------------------------


def _out(text: str = "") -> None:
    # every line goes through `visible`: titles, prompts, messages, tool output and paths
    # come from workers and models, and must not drive the user's terminal
    sys.stdout.write(visible(redaction.redact(text)) + "\n")
    sys.stdout.flush()


def _err(text: str) -> None:
    sys.stderr.write(visible(redaction.redact(text).rstrip("\n")) + "\n")
    sys.stderr.flush()


def task_json(task: Task, attempts: list[Attempt] | None = None,
              cost: Totals | None = None) -> dict[str, Any]:
    """A task as plain JSON (what `ls --json` and `run --json` print): with `cost`, the
    meter's figures too (`cost` in USD, `requests`, `unpriced` requests whose model has no
    price, `tokens` by kind)."""
    data: dict[str, Any] = {}
    for name, value in vars(task).items():
        if isinstance(value, Path):
            value = str(value)
        elif isinstance(value, TaskState):
            value = value.value
        data[name] = value
    if attempts is not None:
        data["attempts"] = [
            {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}
            for a in attempts]
    if cost is not None:
        from fleet_tui.store.costs import as_json

        data.update(as_json(cost))
    return data


def _cost(totals: Totals | None) -> str:
    """A task's cost as the list shows it ($0.42, * when some requests are unpriced)."""
    if totals is None or not totals.requests:
        return "-"
    from fleet_tui.store import budgets

    return budgets.usd(totals.cost) + ("*" if totals.unpriced else "")


def _age(ts: float | None) -> str:
    if not ts:
        return "-"
    secs = max(0, time.time() - ts)
    if secs < 60:
        return f"{secs:.0f}s"
    if secs < 3600:
        return f"{secs / 60:.0f}m"
    if secs < 86400:
        return f"{secs / 3600:.0f}h"
    return f"{secs / 86400:.0f}d"


def _tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def _one_line(text: str | None, limit: int = 100) -> str:
    from fleet_tui.core import stream

    return stream.one_line(text or "", limit)


def format_event(ev: stream.Event) -> str | None:
    """One readable line per event (None for events not worth a line)."""
    from fleet_tui.core import stream  # msgspec: only the commands that print events need it

    prefix = "  ↳ " if getattr(ev, "parent_tool_use_id", None) else ""
    line: str | None
    if isinstance(ev, stream.Init):
        line = f"init     session {ev.session_id} model {ev.model} in {ev.cwd}"
    elif isinstance(ev, stream.UserMessage):
        line = f"you      {_one_line(ev.text)}"
    elif isinstance(ev, stream.Setup) and ev.phase == "start":
        line = f"setup    $ {ev.command}" if ev.command else "setup    (included files)"
    elif isinstance(ev, stream.Setup):
        mark = "ok" if ev.exit_code == 0 else "error"
        took = f" in {ev.seconds:.1f}s" if ev.seconds is not None else ""
        files = f"; copied {', '.join(ev.copied)}" if ev.copied else ""
        files += f"; skipped {'; '.join(ev.skipped)}" if ev.skipped else ""
        line = f"  {mark:<6} setup exit {ev.exit_code}{took}{files}"
    elif isinstance(ev, stream.Blocked):
        line = f"cage     {_one_line(ev.text, 400)}"  # a whole path
    elif isinstance(ev, stream.ToolUse):
        line = f"tool     {ev.summary or ev.name}"
    elif isinstance(ev, stream.ToolResult):
        mark = "error" if ev.is_error else "ok"
        more = ev.content.count("\n") if ev.content else 0
        tail = f"  (+{more} line{'s' if more != 1 else ''}: --full)" if more else ""
        line = f"  {mark:<6} {ev.tool_name or ''} {_one_line(ev.first_line)}{tail}".rstrip()
    elif isinstance(ev, stream.Text):
        line = f"text     {_one_line(ev.text)}" if ev.text.strip() else None
    elif isinstance(ev, stream.Thinking):
        line = f"thinking {_one_line(ev.text)}" if ev.text.strip() else None
    elif isinstance(ev, stream.ApiRetry):
        delay = f" in {ev.retry_delay_ms / 1000:.1f}s" if ev.retry_delay_ms else ""
        line = (f"retry    API retry {ev.attempt}/{ev.max_retries}: {ev.error_status} "
                f"{ev.error or ''}{delay}")
    elif isinstance(ev, stream.Result):
        status = "error" if ev.is_error else "ok"
        turns = "turns unknown" if ev.num_turns is None else f"{ev.num_turns} turns"
        line = (f"result   {status} ({ev.subtype}, {turns}): "
                f"{_one_line(ev.result) or '(no text)'}")
    elif isinstance(ev, stream.RateLimit):
        line = f"limit    rate limit {ev.status or ''} {ev.rate_limit_type or ''}".rstrip()
    elif isinstance(ev, stream.Malformed):
        line = f"?        unreadable line: {_one_line(ev.raw, 80)}"
    else:
        line = None
    return prefix + line if line is not None else None


FULL_INDENT = " " * 9


def _indented(text: str, prefix: str = FULL_INDENT) -> list[str]:
    return [prefix + line for line in text.splitlines()] or [prefix.rstrip()]


def format_event_full(ev: stream.Event) -> list[str]:
    """An event with everything it holds (`logs --full`): a tool call's whole input, a
    tool's whole output and exit status, whole messages; [] for events not worth a line."""
    from fleet_tui.core import stream

    line = format_event(ev)
    if line is None:
        return []
    prefix = "  ↳ " if getattr(ev, "parent_tool_use_id", None) else ""
    pad = prefix + FULL_INDENT
    if isinstance(ev, stream.ToolUse):
        return [line, *_indented(stream.tool_input_text(ev.name, ev.input), pad)]
    if isinstance(ev, stream.ToolResult):
        head = f"{prefix}  {stream.result_status(ev)} {ev.tool_name or ''}".rstrip()
        return [head, *_indented(ev.content or "(no output)", pad)]
    if isinstance(ev, stream.Setup) and ev.phase == "end":
        return [line, *_indented(ev.output or "(no output)", pad)]
    if isinstance(ev, stream.Text | stream.Thinking | stream.UserMessage):
        word = line[len(prefix):].split(" ", 1)[0]
        return [f"{prefix}{word}", *_indented(ev.text, pad)]
    if isinstance(ev, stream.Result) and ev.result and "\n" in ev.result:
        return [line.split(":", 1)[0] + ":", *_indented(ev.result, pad)]
    return [line]


# --- setup ------------------------------------------------------------------------------------


def _settings(overrides: dict[str, object] | None = None) -> Settings:
    return load_settings(overrides=overrides)  # a ConfigError is a usage error (exit 2)


def _repo(path: Path | None) -> Path:
    # finding the repository, not git's front (diffs, merges): a refusal loads no more
    from fleet_tui.vcs.repository import main_worktree
    from fleet_tui.vcs.run import GitError

    try:
        return main_worktree(path if path is not None else Path.cwd())
    except GitError as exc:  # the repository to work in is an argument: usage
        raise _Usage(str(exc)) from None


def _fleet(settings: Settings | None = None, task_id: str | None = None) -> Fleet:
    """The engine, once the arguments are read. With `task_id`, the store is asked for
    that task first: an id that names no task (or several) is refused with the engine's
    own message and exit code before the engine is built (only a new task makes an id
    known, never the pass that would come first); the engine then reuses that store."""
    settings = settings or _settings()  # a settings error still comes before a miss
    store = None
    if task_id is not None:
        from fleet_tui.store.db import Store
        from fleet_tui.system import paths

        store = Store(paths.db_path())
        store.get_task(task_id)
    from fleet_tui.engine.fleet import Fleet

    return Fleet(settings, store)


def _catch_up(fleet: Fleet) -> None:
    """One scheduling pass so the store reflects what happened while nobody watched."""
    try:
        fleet.tick()
    except (FleetTuiError, OSError) as exc:  # never block a look at the tasks
        _err(f"fleet-tui: warning: could not update running tasks: {exc}")


def _refuse_unless(task: Task, action: Action) -> None:
    """Refuse what the task's state does not allow, with the reason the panel shows."""
    refused = policy.refusal(task, action)
    if refused is not None:
        raise FleetRefused(refused)


def _confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if sys.stdin is None or not sys.stdin.isatty():
        raise _Usage("not asking on a non-interactive stdin; pass --yes to confirm")
    sys.stdout.write(visible(f"{question} [y/N] "))
    sys.stdout.flush()
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise _Aborted()


class _Aborted(FleetTuiError):
    """The user said no."""

    exit_code = EXIT_USAGE

    def __init__(self) -> None:
        super().__init__("not confirmed; nothing was changed")


def _schedule_until(fleet: Fleet, ids: Sequence[str], done: Callable[[Task], bool],
                    on_change: Callable[[Task], None] | None = None) -> list[Task]:
    """Run the scheduler here until done(task) holds for every id."""
    from fleet_tui.store.db import StoreError

    seen: dict[str, tuple[TaskState, str | None]] = {}
    while True:
        try:
            fleet.tick()
        except (StoreError, OSError) as exc:
            _err(f"fleet-tui: warning: scheduling pass failed: {exc}")
        tasks = [fleet.get_task(i) for i in ids]
        for t in tasks:
            key = (t.state, t.message)
            if seen.get(t.id) != key:
                seen[t.id] = key
                if on_change is not None:
                    on_change(t)
        if all(done(t) for t in tasks):
            return tasks
        time.sleep(TICK)


def _print_change(task: Task) -> None:
    msg = f": {_one_line(task.message, 140)}" if task.message else ""
    _err(f"{task.id} {policy.state_text(task)}{msg}")


# --- checked option values and prompt text (a bad one is one clear usage line) --------------


def _whole(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            bound = f"from {low} to {high}" if high is not None else f"of at least {low}"
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number {bound}")
        return value
    return parse


def _duration(text: str) -> float:
    """--timeout: seconds (`90`) or a duration (`15m`, `1h30m`), as the launch form takes
    them; 0 for no limit."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {exc} (0: no limit)") from None


PROMPT_LIMIT = 1 << 20  # bytes: a prompt file or stdin over this is refused (1 MiB)


def _bounded(data: bytes, source: str) -> bytes:
    """Refuse what was read past the limit (at most PROMPT_LIMIT + 1 bytes are read)."""
    if len(data) > PROMPT_LIMIT:
        raise _Usage(f"the prompt in {source} is over 1 MiB ({PROMPT_LIMIT} bytes); "
                     "shorten it, or put the material in a file the worker can read")
    return data


def _read_stdin() -> bytes:
    if sys.stdin is None:
        return b""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is not None:
        data: bytes = buffer.read(PROMPT_LIMIT + 1)
        return _bounded(data, "stdin")
    return _bounded(sys.stdin.read(PROMPT_LIMIT + 1).encode("utf-8", "surrogateescape"),
                    "stdin")


def _decode(data: bytes, source: str, command: str) -> str:
    """UTF-8 text from bytes read from a file or stdin; a leading BOM is dropped."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Usage(f"the prompt in {source} is not valid UTF-8 text "
                     f"(byte 0x{data[exc.start]:02x} at offset {exc.start}); save it as "
                     "UTF-8") from None
    return text.removeprefix("\ufeff")


# --- commands ---------------------------------------------------------------------------------


def _read_prompt(args: argparse.Namespace) -> str:
    if args.file is not None and args.prompt is not None and args.prompt != "-":
        raise _Usage("give the prompt as an argument or with --file, not both")
    source = args.file if args.file is not None else args.prompt
    if source == "-" or (source is None and sys.stdin is not None and not sys.stdin.isatty()):
        text = _decode(_read_stdin(), "stdin", "run")
    elif args.file is not None:
        try:
            with open(args.file, "rb") as fh:
                data = _bounded(fh.read(PROMPT_LIMIT + 1), str(args.file))
        except OSError as exc:
            raise _Usage(f"cannot read the prompt file {args.file}: "
                         f"{exc.strerror or exc}") from None
        text = _decode(data, str(args.file), "run")
    elif source is None:
        raise _Usage("no prompt; give it as an argument, with --file F, "
                     "or pipe it in with `-`")
    else:
        text = source
    if not text.strip():
        raise _Usage("the prompt is empty; say what the worker should do")
    check_text("prompt", text)  # a NUL byte, or argv bytes that were not UTF-8
    return text


def _check_launch(settings: Settings, permission_mode: str | None = None,
                  endpoint: str | None = None, host: str | None = None) -> None:
    """Fail fast, before anything is queued or created: an endpoint or a host config.toml
    does not define (exit 2, with the names it does), a setup claude would refuse (root
    with bypassPermissions without FLEET_WORKER_SANDBOX=1, scrub_tool_env without
    bubblewrap: exit 2), then claude or the endpoint's key missing (exit 5). On another
    host than this machine only the key is looked for here (`host check NAME` checks
    that host's claude)."""
    from fleet_tui.engine.localhost import check_launch
    from fleet_tui.settings.credentials import (
        LaunchError,
        endpoint_credential,
        resolve_credential,
    )
    from fleet_tui.settings.hosts import ANY, LOCAL

    chosen = settings.endpoint(endpoint)
    here = host in (None, LOCAL, ANY) or settings.host(host).is_local
    s = settings.for_endpoint(chosen.name)
    try:
        if here:
            check_launch(s, permission_mode=permission_mode,
                         endpoint=chosen if chosen.own_key else None)
        elif chosen.own_key:
            endpoint_credential(s, chosen)
        else:
            resolve_credential(s)
    except LaunchError as exc:
        if exc.exit_code not in (EXIT_USAGE, EXIT_MISSING):  # whatever else stops claude
            exc.exit_code = EXIT_MISSING
        raise


def cmd_run(argv: list[str]) -> int:
    p = _parser("run", "Queue a task (or N copies) and start it in its own worktree.")
    p.add_argument("prompt", nargs="?", metavar="PROMPT",
                   help="what the worker should do; `-` reads it from stdin")
    p.add_argument("--file", "-f", metavar="F", help="read the prompt from file F (`-`: stdin)")
    p.add_argument("--title", help="a short title (default: the prompt's first line)")
    p.add_argument("--base", metavar="REF", help="branch, tag or commit to start from "
                   "(default: the current HEAD)")
    p.add_argument("--copies", type=_whole(1, MAX_COPIES), default=1, metavar="N",
                   help=f"run N independent copies, 1 to {MAX_COPIES} (default 1)")
    p.add_argument("--model", default="main",
                   help="main, small or a model name (default main)")
    p.add_argument("--permission-mode", choices=PERMISSION_MODES, metavar="P",
                   help="one of " + ", ".join(PERMISSION_MODES))
    p.add_argument("--max-turns", type=_whole(1), metavar="N",
                   help="stop after N agent turns (at least 1)")
    p.add_argument("--timeout", type=_duration, metavar="T",
                   help="wall-clock limit: seconds, or 90s, 15m, 1h30m; at most 7 days (0: none)")
    p.add_argument("--endpoint", metavar="NAME",
                   help="run on the endpoint NAME of config.toml ([endpoints.NAME]; "
                        "default: the top-level settings, the endpoint 'default')")
    p.add_argument("--host", metavar="NAME",
                   help="run on the host NAME of config.toml (`fleet-tui host ls`), `local` "
                        "(this machine, the default) or `any`: the host with a free slot")
    p.add_argument("--wait", action="store_true",
                   help="stay until every task finished; exit 1 unless all succeeded")
    p.add_argument("--json", action="store_true", help="print the tasks as JSON")
    args = p.parse_args(argv)
    prompt = _read_prompt(args)
    for what, value in (("title", args.title), ("base ref", args.base),
                        ("model", args.model), ("endpoint", args.endpoint),
                        ("host", args.host)):
        if value is not None:
            check_text(what, value)
    repo = _repo(args.repo)
    settings = _settings()
    _check_launch(settings, args.permission_mode, args.endpoint, args.host)
    fleet = _fleet(settings)
    tasks = fleet.submit(TaskSpec(prompt=prompt, title=args.title or "", repo=repo,
                                  base_ref=args.base, model=args.model,
                                  endpoint=args.endpoint, host=args.host,
                                  permission_mode=args.permission_mode,
                                  max_turns=args.max_turns, timeout=args.timeout),
                         copies=args.copies)
    ids = [t.id for t in tasks]
    if not args.json:
        for t in tasks:
            _out(f"{t.id}  {t.branch}  {t.title}")
    on_change = None if args.json else _print_change
    held: list[str] = []

    def stuck(t: Task) -> bool:
        """The task waits for the user (its endpoint is held), or, without --wait, for a
        window to reset: no use waiting here."""
        why = fleet.why_waiting(t.endpoint) if t.state == TaskState.QUEUED else None
        if why is not None and (why.startswith("held: ") or not args.wait):
            if why not in held:
                held.append(why)
            return True
        return False

    if args.wait:
        final = _schedule_until(fleet, ids, lambda t: t.state not in RUNNING_OR_PENDING
                                or stuck(t), on_change)
    else:
        final = _schedule_until(fleet, ids, lambda t: t.state != TaskState.QUEUED
                                or stuck(t), on_change)
    for why in held:
        _err(f"not started: the endpoint is {why}" if not why.startswith("held: ")
             else f"not started: {why}")
    if not args.wait and not args.json and any(t.state in RUNNING_OR_PENDING for t in final):
        _err("running in the background; follow with `fleet-tui ls` / "
             "`fleet-tui logs ID --follow`")
    if args.json:
        _out(json.dumps([task_json(t) for t in final], indent=2))
    if args.wait:
        unchanged = [t.id for t in final if policy.no_change(t)]
        if unchanged and not args.json:
            _err(f"{len(unchanged)} of {len(final)} succeeded without changing anything "
                 f"(+0/-0): {', '.join(unchanged)}; nothing to merge (`fleet-tui logs ID` "
                 "shows what the worker did)")
        return EXIT_OK if all(t.state == TaskState.SUCCEEDED for t in final) else EXIT_FAILED
    return EXIT_OK


def cmd_ls(argv: list[str]) -> int:
    p = _parser("ls", "List tasks of this repository (newest first).")
    p.add_argument("--all-repos", action="store_true", help="tasks of every repository")
    p.add_argument("--archived", action="store_true",
                   help="the archived tasks instead (`fleet-tui archive`)")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    args = p.parse_args(argv)
    from fleet_tui.store.meter import Totals

    repo: Path | None = None
    if not args.all_repos:
        repo = _repo(args.repo)
    fleet = _fleet()
    _catch_up(fleet)
    tasks = fleet.list_tasks(repo, archived=args.archived)
    costs = fleet.costs([t.id for t in tasks])
    if args.json:
        ranks = fleet.rankings(tasks)  # best of N: each ranked copy's place
        _out(json.dumps([{**task_json(t, cost=costs.get(t.id, Totals())),
                          "rank": ranks[t.id].as_json() if t.id in ranks else None}
                         for t in tasks], indent=2))
        return EXIT_OK
    if not tasks:
        _out("no tasks" + ("" if repo is None else f" in {repo}")
             + "; start one with `fleet-tui run PROMPT`")
        return EXIT_OK
    metered = any(c.requests for c in costs.values())  # the cost column: once there is one
    # the endpoint's column only when the list holds more than one
    width = max(len(t.endpoint) for t in tasks) if len({t.endpoint for t in tasks}) > 1 \
        else 0
    width = max(width, len("ENDPOINT")) if width else 0
    # and the host's, by the same rule
    hosts = max(len(t.host) for t in tasks) if len({t.host for t in tasks}) > 1 else 0
    hosts = max(hosts, len("HOST")) if hosts else 0
    header = f"{'ID':<6}  {'STATE':<9}  {'VERDICT':<15}  {'+/-':>9}  {'TURNS':>5}  " \
             f"{'TOKENS':>7}  " + (f"{'COST':>9}  " if metered else "") + \
             f"{'AGE':>4}  " + (f"{'ENDPOINT':<{width}}  " if width else "") + \
             (f"{'HOST':<{hosts}}  " if hosts else "") + "TITLE"
    _out(header)
    uncaged = _uncaged(fleet, tasks)
    for t in tasks:
        diff = f"+{t.added_lines}/-{t.deleted_lines}"
        where = f"  [{t.repo}]" if repo is None else ""
        cost = f"{_cost(costs.get(t.id)):>9}  " if metered else ""
        column = (f"{t.endpoint:<{width}}  " if width else "") + \
            (f"{t.host:<{hosts}}  " if hosts else "")
        _out(f"{t.id:<6}  {t.state.value:<9}  {policy.verdict_text(t):<15}  {diff:>9}  "
             f"{t.turns:>5}  "
             f"{_tokens(t.input_tokens + t.output_tokens):>7}  {cost}"
             f"{_age(t.created_at):>4}  {column}"
             f"{'[uncaged] ' if t.id in uncaged else ''}{_one_line(t.short_title, 60)}{where}")
    if uncaged:
        _out(f"[uncaged]: cage = \"off\" ran {', '.join(sorted(uncaged))} as you, with your "
             "files and network (`fleet-tui show ID` says more)")
    if any(c.unpriced for c in costs.values()):
        _out("* some requests of a model with no price are not in the cost "
             "(`fleet-tui cost` names them)")
    # the endpoints' limits (a park, a hold, a lowered cap), below the table
    for endpoint in sorted({t.endpoint for t in tasks}):
        note = fleet.endpoint_note(endpoint)
        if note is not None:
            _out(f"endpoint {endpoint}: {note}")
    # the hosts at their max_workers with tasks queued for them
    for host, why in sorted(fleet.host_waits().items()):
        queued = [t.id for t in tasks if t.host == host and t.state == TaskState.QUEUED]
        if queued:
            _out(f"{', '.join(queued)} {why}")
    return EXIT_OK


def cmd_show(argv: list[str]) -> int:
    p = _id_parser("show", "Show one task and its attempts.")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    fleet = _fleet(task_id=args.id)
    from fleet_tui.store.meter import Totals
    from fleet_tui.system import pidns

    fleet.prepare_secret_scan()  # what the worker said is printed with the key hidden
    _catch_up(fleet)
    task = fleet.get_task(args.id)
    attempts = fleet.attempts(task.id)
    limits = fleet.endpoint_note(task.endpoint)
    metered = fleet.costs([task.id]).get(task.id, Totals())
    cage, blocked = _cage_of(fleet, task, attempts)
    ranked = fleet.rankings([task]).get(task.id)  # best of N: its place, when ranked
    if args.json:
        _out(json.dumps({**task_json(task, attempts, metered), "endpoint_limits": limits,
                         "rank": ranked.as_json() if ranked is not None else None,
                         "cage": cage.split(" ", 1)[0],
                         "blocked": [{"action": b.action, "target": b.target,
                                      "detail": b.detail} for b in blocked]}, indent=2))
        return EXIT_OK
    waits = fleet.host_waits().get(task.host) if task.state == TaskState.QUEUED else None
    state = policy.state_text(task) + (f" ({waits})" if waits else "")
    rows = [("id", task.id), ("title", task.short_title), ("state", state),
            ("verdict", task.verdict or "-"), ("message", task.message or "-"),
            ("endpoint", task.endpoint + (f": {limits}" if limits else "")),
            ("host", task.host + (" (placed when it starts)" if task.host == "any" else "")),
            ("repo", str(task.repo)), ("branch", task.branch),
            ("base", f"{task.base_branch or task.base_ref or '-'} @ {task.base_commit[:10]}"),
            ("worktree", str(task.worktree) if task.worktree else "-"),
            ("model", task.model), ("session", task.session_id or "-"),
            ("turns", str(task.turns)),
            ("tokens", f"{task.input_tokens} in / {task.output_tokens} out"),
            *([("cost", _cost_line(fleet, task, metered))] if metered.requests else []),
            ("changes", f"+{task.added_lines} -{task.deleted_lines}"
                        + (f" ({policy.NO_CHANGE})" if policy.no_change(task) else "")),
            ("last tool", task.last_tool or "-"), ("cage", cage)]
    if task.conflicts:
        rows.append(("conflicts", ", ".join(task.conflicts)))
    if task.land_state:
        rows.append(("landing", f"{task.land_state}"
                     + (f": {task.land_note}" if task.land_note else "")))
    if task.pushed:
        remote, _, rest = task.pushed.partition(" ")
        rows.append(("pushed", f"{remote}/{rest.replace(' ', ' @ ')}"))
    if task.gate:
        rows.append(("test gate", task.gate))
    if ranked is not None:
        from fleet_tui.commands import best

        rows.append(("rank", best.rank_line(ranked, len(fleet.copies(task.id)))))
    if task.archived_at is not None:
        rows.append(("archived", f"yes (`fleet-tui archive --undo {task.id}` brings it "
                                 "back)"))
    for name, value in rows:
        _out(f"{name + ':':<10} {value}")
    if blocked:
        _out(f"blocked:   the cage refused {len(blocked)} thing"
             f"{'s' if len(blocked) != 1 else ''} (allow a host with allow_hosts):")
        for item in blocked:
            _out(f"  {_one_line(item.text, 200)}")
    _out("prompt:")
    for line in task.prompt.rstrip().splitlines() or [""]:
        _out(f"  {line}")
    _out("attempts:")
    for a in attempts:
        span = ""
        if a.started_at and a.finished_at:
            span = f" {a.finished_at - a.started_at:.1f}s"
        _out(f"  #{a.n} {a.kind:<8} {a.model or '-':<14} {a.verdict or 'running':<9}{span}"
             f"  {_one_line(a.message, 100)}")
        if a.dir is not None:
            _out(f"     log: {a.dir}")
        log = fleet.attempt_log(a)
        record = log.runner_record() if log is not None else None
        afresh = (record or {}).get("afresh")
        if isinstance(afresh, str):  # a resume that found no saved session (its runner's)
            _out(f"     afresh:  {_one_line(afresh, 200)}")
        contained = pidns.described(record)
        if contained is not None:  # how its processes were held (said by its runner)
            _out(f"     processes: {contained}")
    return EXIT_OK


def _uncaged(fleet: Fleet, tasks: list[Task]) -> set[str]:
    """The tasks whose last attempt ran without the cage (no cage.json in its folder)."""
    out: set[str] = set()
    for task in tasks:
        if task.state == TaskState.QUEUED:
            continue
        started = [a for a in fleet.attempts(task.id) if a.dir is not None]
        log = fleet.attempt_log(started[-1]) if started else None
        if log is not None and log.dir.is_dir() and not log.cage_policy.exists():
            out.add(task.id)
    return out


def _cage_of(fleet: Fleet, task: Task, attempts: list[Attempt]
             ) -> tuple[str, list[stream.Blocked]]:
    """How the task's last attempt ran (caged or not, from its folder) and what its cage
    refused; before any start, what the settings say now."""
    started = [a for a in attempts if a.dir is not None]
    log = fleet.attempt_log(started[-1]) if started else None
    if log is None:
        mode = fleet.settings.cage
        return (f"{mode} (when it starts)" if mode == "worker" else
                "off (uncaged: the worker will run as you, with your files and network)"), []
    if log.cage_policy.exists():
        return "worker (an OS sandbox: its worktree, no home, its endpoint and allowed " \
               "hosts only)", log.blocked()
    if task.host != "local":
        return (f"off (uncaged: the worker ran on host {task.host} as its user, with that "
                "user's files and network: cage = \"off\" for it)"), []
    return "off (uncaged: the worker ran as you, with your files and network)", []


def _cost_line(fleet: Fleet, task: Task, metered: Totals) -> str:
    """`show`'s cost: the figure, the requests and tokens it is of, the budget left."""
    from fleet_tui.store import budgets

    line = (f"{budgets.usd(metered.cost)} ({metered.requests} requests: "
            f"{metered.input_tokens} in / {metered.output_tokens} out / "
            f"{metered.cache_read_tokens} cache read / {metered.cache_write_tokens} cache "
            "write")
    if metered.unpriced:
        line += f"; {metered.unpriced} of a model with no price, not counted"
    line += ")"
    budget = budgets.task_budget(fleet.settings, task.endpoint)
    if budget:
        line += f"; {budgets.usd(max(0.0, budget - metered.cost))} of its " \
                f"{budgets.usd(budget)} budget left"
    return line


def _attempt(fleet: Fleet, task: Task, number: int | None) -> Attempt:
    attempts = fleet.attempts(task.id)
    if not attempts:
        raise _NotStarted(f"task {task.id} has not started yet (it is {task.state})")
    if number is None:
        started = [a for a in attempts if a.dir is not None]
        return started[-1] if started else attempts[-1]
    for a in attempts:
        if a.n == number:
            return a
    raise _Usage(f"task {task.id} has no attempt {number} "
                 f"(it has 1 to {attempts[-1].n})")


class _NotStarted(Exception):
    pass


def cmd_logs(argv: list[str]) -> int:
    p = _id_parser("logs", "Print an attempt's events, one line each (or the raw JSONL).")
    p.add_argument("--follow", action="store_true", help="keep printing until it finishes")
    p.add_argument("--raw", action="store_true", help="the raw stream-json lines")
    p.add_argument("--full", action="store_true",
                   help="everything: each tool call's whole input, each tool's whole output "
                        "and a Bash step's exit status, whole messages")
    p.add_argument("--attempt", type=int, metavar="N", help="attempt number (default: last)")
    args = p.parse_args(argv)
    fleet = _fleet(task_id=args.id)
    fleet.prepare_secret_scan()  # what the worker said is printed with the key hidden
    _catch_up(fleet)
    task = fleet.get_task(args.id)
    try:
        attempt = _attempt(fleet, task, args.attempt)
    except _NotStarted as exc:
        if not args.follow:
            _err(str(exc))
            return EXIT_OK
        _schedule_until(fleet, [task.id], lambda t: bool(fleet.attempts(t.id))
                        and fleet.attempts(t.id)[-1].dir is not None)
        attempt = _attempt(fleet, task, args.attempt)
    offset = 0
    while True:
        attempt = fleet.store.get_attempt(attempt.id)
        done = fleet.attempt_finished(attempt)
        if args.raw:
            offset = _print_raw(fleet, attempt, offset, done)
        else:
            events, offset = fleet.read_events(attempt, offset)
            for ev in events:
                for line in (format_event_full(ev) if args.full
                             else [text for text in [format_event(ev)] if text is not None]):
                    _out(line)
        if not args.follow or done:
            break
        time.sleep(TICK)
        _catch_up(fleet)
    if args.follow:
        final = _recorded_end(fleet, task, attempt)
        _err(f"{final.id} {policy.state_text(final)}"
             + (f": {final.message}" if final.message else ""))
    return EXIT_OK


def _recorded_end(fleet: Fleet, task: Task, attempt: Attempt) -> Task:
    """The task once the end of `attempt` is in the store: the loop leaves on the runner's
    exit record, which the store learns of at the next scheduling pass (this process's, or
    another's): a task read before that still says running."""
    (final,) = _schedule_until(
        fleet, [task.id], lambda t: fleet.store.get_attempt(attempt.id).finished_at is not None
        or t.attempt_count != attempt.n or t.state not in RUNNING_OR_PENDING)
    return final


def _print_raw(fleet: Fleet, attempt: Attempt, offset: int, done: bool) -> int:
    log = fleet.attempt_log(attempt)
    if log is None:
        return offset
    data, offset = log.read_bytes(offset, finished=done)
    if sys.stdout.isatty():  # a person reads it: no escapes; a pipe gets the exact bytes
        sys.stdout.write(visible(data.decode("utf-8", "replace")))
    else:
        sys.stdout.buffer.write(data)
    sys.stdout.flush()
    return offset


def cmd_diff(argv: list[str]) -> int:
    p = _id_parser("diff", "Show a task's changes against its base (committed, uncommitted "
                   "and untracked).")
    p.add_argument("--stat", action="store_true", help="only files and line counts")
    args = p.parse_args(argv)
    fleet = _fleet(task_id=args.id)
    _catch_up(fleet)
    diff = fleet.diff(args.id)
    if not diff.files:
        _err(f"task {fleet.get_task(args.id).id} has no changes")
        return EXIT_OK
    if diff.secret_paths:
        from fleet_tui.vcs import git

        _err(f"fleet-tui diff: warning: these files contain the API key (shown as "
             f"{git.REDACTED}; a merge refuses them): {', '.join(diff.secret_paths)}")
    if args.stat:
        secret = set(diff.secret_paths)
        for f in diff.files:
            mark = "  (contains the API key)" if f.path in secret else ""
            _out(f"{f.status:<9} +{f.added:<5} -{f.deleted:<5} {f.path}{mark}")
    else:
        sys.stdout.write(visible(diff.patch if diff.patch.endswith("\n") or not diff.patch
                                 else diff.patch + "\n"))
    return EXIT_OK


def cmd_merge(argv: list[str]) -> int:
    p = _id_parser("merge", "Merge a finished task into its base branch, then clean up "
                   "its worktree, branch and config dir.")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask")
    p.add_argument("--test", metavar="CMD", help="run CMD in the worktree first; merge only "
                   "if it succeeds (default: the test_command setting)")
    p.add_argument("--message", "-m", help="commit message (default: the task's title)")
    args = p.parse_args(argv)
    fleet = _fleet(task_id=args.id)
    _catch_up(fleet)
    task = fleet.get_task(args.id)
    _refuse_unless(task, Action.MERGE)
    preview = fleet.conflict_preview(task.id)
    if not preview.clean:
        # The merge makes the same checks: refuse now, before asking or running tests.
        _err(f"fleet-tui merge: not merged: {preview.message}")
        return EXIT_REFUSED
    open_comments = _open_comments(fleet, [task], args.yes)
    _confirm(f"merge {task.id} ({task.short_title}) +{task.added_lines}/"
             f"-{task.deleted_lines} into {task.base_branch}?{open_comments}", args.yes)
    result = fleet.merge(task.id, message=args.message, test_command=args.test)
    if result.test_output:
        sys.stdout.write(visible(result.test_output.rstrip("\n") + "\n"))
    if not result.merged:
        _err(f"fleet-tui merge: not merged: {result.message}")
        return EXIT_REFUSED
    _out(result.message)
    return EXIT_OK


def _open_comments(fleet: Fleet, tasks: list[Task], yes: bool, *, verb: str = "merge",
                   done: str = "merged") -> str:
    """Open review comments stop a merge (or a landing through the queue: ``verb`` /
    ``done``) that was not confirmed (--yes): without a terminal it is refused (exit 4),
    nothing done, else the question says how many (its words)."""
    counts = [] if yes else [(t, n) for t in tasks if (n := fleet.open_comments(t.id))]
    if not counts:
        return ""
    several = len(tasks) > 1
    words = "; ".join(
        f"{n} review comment{'s are' if n > 1 else ' is'} open"
        + (f" on {t.id}" if several else "")
        + f" (`fleet-tui review {t.id}` lists {'them' if n > 1 else 'it'})"
        for t, n in counts)
    if sys.stdin is None or not sys.stdin.isatty():
        send = " ".join(f"`fleet-tui review {t.id} --send`" for t, _ in counts)
        raise FleetRefused(f"not {done}: {words}. Send them to the worker ({send}) and "
                           f"look at its next diff, or pass --yes to {verb} anyway")
    return f" {words[0].upper()}{words[1:]}; {verb} anyway?"


def cmd_review(argv: list[str]) -> int:
    p = _id_parser("review", "Review comments on a task's diff lines: list them with their "
                   "state (open, addressed: the worker changed the lines after it got the "
                   "comment, outdated: the lines changed before it did), add, edit or "
                   "delete one, and send all that were not sent as one message to the "
                   "worker (to the running worker, else a follow-up in its session).")
    action = p.add_mutually_exclusive_group()
    action.add_argument("--comment", nargs=2, metavar=("FILE:LINE[-LINE]", "TEXT"),
                        help="comment on lines of a file as the worktree has them (a file "
                        "the task deleted: as its base had them); TEXT `-`: stdin")
    action.add_argument("--edit", nargs=2, metavar=("N", "TEXT"),
                        help="change the text of comment N")
    action.add_argument("--delete", type=_whole(1), metavar="N", help="delete comment N")
    action.add_argument("--send", action="store_true",
                        help="send every comment not sent yet to the worker, as one message")
    p.add_argument("--json", action="store_true", help="print the comments as JSON")
    args = p.parse_args(argv)
    fleet = _fleet(task_id=args.id)
    fleet.prepare_secret_scan()
    _catch_up(fleet)
    task = fleet.get_task(args.id)
    if args.comment is not None:
        spec, text = args.comment
        from fleet_tui.core.review import parse_line_spec

        try:
            path, start, end = parse_line_spec(spec)
        except ValueError as exc:
            raise _Usage(str(exc)) from None
        body = _decode(_read_stdin(), "stdin", "review") if text == "-" else text
        made = fleet.comment_at(task.id, path, start, end, body)
        _say_comment(made, args.json, "added")
        return EXIT_OK
    if args.edit is not None:
        number = _whole(1)(args.edit[0])
        _say_comment(fleet.edit_comment(task.id, number, args.edit[1]), args.json, "edited")
        return EXIT_OK
    if args.delete is not None:
        fleet.delete_comment(task.id, args.delete)
        _out(json.dumps({"deleted": args.delete}) if args.json
             else f"{task.id}: comment #{args.delete} deleted")
        return EXIT_OK
    if args.send:
        return _send_review(fleet, task, args.json)
    comments = fleet.comments(task.id)
    if args.json:
        _out(json.dumps([c.as_json() for c in comments], indent=2))
        return EXIT_OK
    if not comments:
        _err(f"task {task.id} has no review comments (add one with --comment FILE:LINE TEXT)")
        return EXIT_OK
    counts = {state: sum(1 for c in comments if c.state == state)
              for state in ("open", "addressed", "outdated")}
    _out(f"{task.id}: " + ", ".join(f"{n} {state}" for state, n in counts.items() if n))
    for comment in comments:
        _print_comment(comment)
    return EXIT_OK


def _say_comment(comment: ReviewComment, as_json: bool, what: str) -> None:
    if as_json:
        _out(json.dumps(comment.as_json(), indent=2))
    else:
        _out(f"{comment.task_id}: comment #{comment.id} {what} on {comment.anchor.label}")


def _print_comment(comment: ReviewComment) -> None:
    sent = "sent" if comment.sent else "not sent"
    _out(f"#{comment.id:<3} {comment.state:<9} {comment.anchor.label}  ({sent})")
    for line in comment.anchor.quote[:6]:
        _out(f"       > {line[:110]}")
    if len(comment.anchor.quote) > 6:
        _out(f"       > ... {len(comment.anchor.quote) - 6} more lines")
    for line in comment.body.splitlines():
        _out(f"       {line}")


def _send_review(fleet: Fleet, task: Task, as_json: bool) -> int:
    """Send the review; a worker that just ended its last turn takes it as a follow-up
    once this process has recorded it finished."""
    try:
        sent = fleet.send_review(task.id)
    except WorkerFinished:
        _schedule_until(fleet, [task.id], lambda t: t.state not in ACTIVE_STATES)
        sent = fleet.send_review(task.id)
    if as_json:
        _out(json.dumps({"task": sent.task_id, "sent": sent.count, "how": sent.how,
                         "taken": sent.taken}))
    else:
        plural = "s" if sent.count != 1 else ""
        if sent.how == "say":
            _out(f"{task.id}: {sent.count} comment{plural} sent to the running worker ("
                 + ("taken)" if sent.taken else "it takes them in a moment)"))
        else:
            _out(f"{task.id}: {sent.count} comment{plural} sent as a follow-up")
    if sent.how == "follow-up":
        _print_change(_until_started(fleet, fleet.get_task(task.id)))
    return EXIT_OK


def cmd_discard(argv: list[str]) -> int:
    p = _id_parser("discard", "Throw a task's work away: worktree, branch and config dir.")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask")
    args = p.parse_args(argv)
    fleet = _fleet(task_id=args.id)
    _catch_up(fleet)
    task = fleet.get_task(args.id)
    _refuse_unless(task, Action.DISCARD)  # before asking
    running = " (it is stopped first)" if task.state not in FINISHED_STATES else ""
    _confirm(f"discard {task.id} ({task.short_title}) +{task.added_lines}/"
             f"-{task.deleted_lines}{running} for good?", args.yes)
    _out(fleet.discard(task.id))
    return EXIT_OK


def _until_started(fleet: Fleet, task: Task) -> Task:
    """Schedule until the task started, or waits for a reason that a wait here would not
    end (a retry after the endpoint refused, a park, a hold)."""
    why: list[str] = []

    def blocked(t: Task) -> bool:
        found = fleet.why_waiting(t.endpoint) if t.state in PENDING_STATES else None
        if found is not None:
            why.append(found)
        return found is not None

    (final,) = _schedule_until(fleet, [task.id], lambda t: t.state not in PENDING_STATES
                               or t.verdict in policy.TRANSIENT or blocked(t))
    if why and final.state in PENDING_STATES:
        _err(f"{final.id} not started: " + (why[-1] if why[-1].startswith("held: ")
                                            else f"the endpoint is {why[-1]}"))
    return final


def _confirm_loss(fleet: Fleet, task: Task, yes: bool) -> None:
    """A fresh retry resets the worktree and the branch to the base: ask first, as discard
    does. Without a terminal (and no --yes) refuse, exit 4: the work is kept."""
    if yes:
        return
    at_stake = fleet.work_at_stake(task)
    if at_stake is None:
        return
    if sys.stdin is None or not sys.stdin.isatty():
        raise FleetRefused(f"a fresh retry of {task.id} would throw away its work: "
                           f"{at_stake}. Pass --yes to retry from scratch anyway, or "
                           "--resume to continue in the same worktree")
    sys.stdout.write(visible(f"retry {task.id} ({task.short_title}) from scratch? This "
                             f"throws away {at_stake}. [y/N] "))
    sys.stdout.flush()
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise _Aborted()


def cmd_retry(argv: list[str]) -> int:
    p = _id_parser("retry", "Run a finished task again: fresh (worktree and branch reset "
                   "to its base; asks first when that throws work away) or --resume its "
                   "session in the same worktree.")
    p.add_argument("--resume", action="store_true",
                   help="continue the last session in the same worktree (nothing is reset)")
    p.add_argument("--yes", "-y", action="store_true",
                   help="do not ask before a fresh retry throws the task's changes away")
    args = p.parse_args(argv)
    fleet = _fleet()
    _catch_up(fleet)
    if not args.resume:
        current = fleet.get_task(args.id)
        if policy.why_not(current, Action.RETRY) is None:  # else fleet.retry says why not
            _confirm_loss(fleet, current, args.yes)
    task = fleet.retry(args.id, resume=args.resume)
    _out(f"{task.id} queued for a {'resumed' if args.resume else 'fresh'} attempt")
    _print_change(_until_started(fleet, task))
    return EXIT_OK


def cmd_follow_up(argv: list[str]) -> int:
    p = _id_parser("follow-up", "Send a finished task a new prompt in the same session.")
    p.add_argument("text", metavar="TEXT", help="the follow-up prompt (`-`: stdin)")
    args = p.parse_args(argv)
    text = _decode(_read_stdin(), "stdin", "follow-up") if args.text == "-" else args.text
    check_text("follow-up prompt", text)
    fleet = _fleet()
    _catch_up(fleet)
    task = fleet.follow_up(args.id, text)
    _out(f"{task.id} queued for a follow-up")
    _print_change(_until_started(fleet, task))
    return EXIT_OK


def cmd_say(argv: list[str]) -> int:
    p = _id_parser("say", "Send a message to a running worker: it joins the turn the "
                   "worker is in, or starts its next one, in the same session. (A finished "
                   "task takes a follow-up instead.)")
    p.add_argument("text", metavar="TEXT", help="the message (`-`: stdin)")
    args = p.parse_args(argv)
    text = _decode(_read_stdin(), "stdin", "say") if args.text == "-" else args.text
    if not text.strip():
        raise _Usage("the message is empty; say what the worker should do")
    check_text("message", text)
    fleet = _fleet(task_id=args.id)
    _catch_up(fleet)
    task = fleet.get_task(args.id)
    _refuse_unless(task, Action.SAY)
    taken = fleet.say(task.id, text)
    _out(f"{task.id}: message " + ("taken by the worker" if taken else
                                   "left for the worker (it takes it in a moment)"))
    return EXIT_OK


def cmd_archive(argv: list[str]) -> int:
    p = _parser("archive", "Archive merged and discarded tasks: they leave `ls` and the "
                "panel's list; their rows and attempt logs are kept (`ls --archived`, "
                "`show ID`, `logs ID`). The archive_after_days setting does it by itself.")
    p.add_argument("ids", nargs="*", metavar="ID", help="tasks to archive (default: every "
                   "closed task of this repository older than --older-than)")
    p.add_argument("--older-than", type=_days, default=0.0, metavar="DAYS",
                   help="only tasks closed more than DAYS days ago (default 0: all)")
    p.add_argument("--all-repos", action="store_true", help="every repository's tasks")
    p.add_argument("--undo", action="store_true", help="bring the IDs back to the lists")
    args = p.parse_args(argv)
    fleet = _fleet()
    _catch_up(fleet)
    if args.undo:
        if not args.ids:
            raise _Usage("--undo needs the ids of the tasks to bring back "
                         "(`fleet-tui ls --archived`)")
        back = fleet.unarchive(args.ids)
        _out(f"brought back {len(back)} task{'' if len(back) == 1 else 's'}"
             + (f": {', '.join(back)}" if back else ""))
        return EXIT_OK
    if args.ids:
        done = fleet.archive(args.ids)
    else:
        repo = None if args.all_repos else _repo(args.repo)
        done = fleet.archive_closed(args.older_than, repo)
    where = "" if args.ids or args.all_repos else f" in {_repo(args.repo)}"
    _out(f"archived {len(done)} task{'' if len(done) == 1 else 's'}{where}"
         + (f": {', '.join(done)}" if done and len(done) <= 20 else "")
         + ("; their logs are kept (`fleet-tui ls --archived`)" if done else ""))
    return EXIT_OK


def _days(text: str) -> float:
    try:
        value = float(text.strip().removesuffix("d"))
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days (0 or more)")
    return value


def cmd_kill(argv: list[str]) -> int:
    p = _id_parser("kill", "Stop a task now (its whole process tree), or drop it from the "
                   "queue.")
    args = p.parse_args(argv)
    fleet = _fleet(task_id=args.id)
    _catch_up(fleet)
    task = fleet.get_task(args.id)
    _refuse_unless(task, Action.KILL)
    fleet.kill(task.id)
    _print_change(fleet.get_task(task.id))
    return EXIT_OK


# --- landing many branches ---------------------------------------------------------------


def _print_conflicts(task_id: str, result: git.UpdateResult) -> None:
    _err(f"fleet-tui update: {result.message}")
    for path in result.conflicts:
        _err(f"  conflict: {path}")


def _run_shell(worktree: Path, task_id: str) -> None:
    """$SHELL in the worktree, for the user to resolve the conflicts by hand."""
    if sys.stdin is None or not sys.stdin.isatty():
        raise _Usage(f"a shell needs a terminal; resolve the conflicts in {worktree} by hand "
                     f"(edit, `git add`), then run `fleet-tui update {task_id}` again")
    import subprocess

    shell = os.environ.get("SHELL") or "/bin/sh"
    _err(f"resolving in {worktree}: edit the conflicted files, `git add` them (a commit is "
         "optional), then exit the shell")
    subprocess.call([shell], cwd=worktree)


def cmd_update(argv: list[str]) -> int:
    p = _id_parser("update", "Bring a finished task's branch up to date with its base "
                   "branch's current tip, in its worktree (merge or rebase per "
                   "update_strategy; its uncommitted work is committed first). On "
                   "conflicts the worktree is left mid-merge: choose with --resolve.")
    p.add_argument("--resolve", choices=("worker", "shell", "abort"),
                   help="on conflicts: send the worker a follow-up to resolve them, open "
                   "$SHELL in the worktree, or abort (the worktree back as it was)")
    p.add_argument("--wait", action="store_true",
                   help="with --resolve worker: stay until the worker is done")
    args = p.parse_args(argv)
    fleet = _fleet(task_id=args.id)
    _catch_up(fleet)
    task = fleet.get_task(args.id)
    result = fleet.update(task.id)
    if result.status == "refused":
        _err(f"fleet-tui update: not updated: {result.message}")
        return EXIT_REFUSED
    if result.status != "conflicts":
        _out(result.message)
        return EXIT_OK
    if args.resolve is None:
        _print_conflicts(task.id, result)
        _err(f"choose: fleet-tui update {task.id} --resolve worker|shell|abort")
        return EXIT_REFUSED
    # the choice is made: the conflicts, then what is done about them (not the choices)
    _err(f"fleet-tui update: {task.base_branch or 'the base'} does not merge cleanly into "
         f"{task.id}: conflicts in {', '.join(result.conflicts)}")
    if args.resolve == "abort":
        done = fleet.resolve_update(task.id, "abort")
        _out(done.message or "aborted")
        return EXIT_OK
    if args.resolve == "shell":
        here = fleet.worktree_here(task)
        if here is None:
            _err(f"fleet-tui update: {fleet.elsewhere(task)} (--resolve worker)")
            return EXIT_REFUSED
        _run_shell(here, task.id)
        result = fleet.update(task.id)
    else:
        fleet.resolve_update(task.id, "worker")
        _out(f"{task.id} queued for a follow-up: resolve the conflicts in "
             f"{', '.join(result.conflicts)}")
        if not args.wait:
            _print_change(_until_started(fleet, fleet.get_task(task.id)))
            return EXIT_OK
        (final,) = _schedule_until(fleet, [task.id],
                                   lambda t: t.state not in RUNNING_OR_PENDING, _print_change)
        if final.state != TaskState.SUCCEEDED:
            _err(f"fleet-tui update: the worker's follow-up ended {final.state}")
            return EXIT_FAILED
        result = fleet.update(task.id)
        if result.status == "current":  # the worker's resolution concluded the update
            _out(f"the worker resolved the conflicts; {task.id} is now up to date with "
                 f"{task.base_branch or 'its base'}"
                 + (f" ({result.base_tip[:10]})" if result.base_tip else "")
                 + ("; its resolution was committed" if result.committed else ""))
            return EXIT_OK
    if result.status == "conflicts":
        _print_conflicts(task.id, result)
        return EXIT_REFUSED
    _out(result.message)
    return EXIT_OK if result.status != "refused" else EXIT_REFUSED


def _land_line(task: Task, position: int | None = None) -> str:
    where = f"{position:>3}. " if position is not None else ""
    note = f"  {_one_line(task.land_note, 100)}" if task.land_note else ""
    return f"{where}{task.id:<6}  {task.land_state or '-':<8}  {_one_line(task.short_title, 50)}" \
        f"{note}"


def cmd_queue(argv: list[str]) -> int:
    p = _parser("queue", "Land tasks through the merge queue, one at a time and in order: "
                "each is brought up to date with its base, tested in its worktree "
                "(test_command) and merged; a conflict or a red test goes back to its worker "
                "(queue_fix_attempts times), then it stops. Without ID: show the queue.")
    p.add_argument("ids", nargs="*", metavar="ID", help="tasks to queue, in landing order")
    p.add_argument("--remove", action="store_true", help="take these tasks out of the queue")
    p.add_argument("--wait", action="store_true", help="stay until every task given (none "
                   "given: every task in this repository's queue) has landed or stopped; "
                   "exit 4 if one stopped")
    p.add_argument("--yes", "-y", action="store_true",
                   help="do not ask about open review comments")
    args = p.parse_args(argv)
    fleet = _fleet()
    _catch_up(fleet)
    if not args.ids:
        repo = _repo(args.repo)
        queue = fleet.landing_queue(repo)
        if not queue:
            _out("the merge queue is empty; queue tasks with `fleet-tui queue ID...`")
        for n, task in enumerate(queue, 1):
            _out(_land_line(task, n))
        if not args.wait or not queue:
            return EXIT_OK
        # after a crash, say: the queue's runner goes on (or is started again), and this
        # stays until what is queued now has landed or stopped
        fleet.ensure_queue_runner(repo)
        return _wait_landed(fleet, [t.id for t in queue])
    ids = [fleet.get_task(i).id for i in args.ids]
    if args.remove:
        for task in fleet.dequeue(ids):
            _out(f"{task.id} taken out of the merge queue")
        return EXIT_OK
    # a task in the queue already keeps its place: it is waited for, not queued again
    tasks = [fleet.get_task(i) for i in ids]
    queued = [t for t in tasks if policy.in_queue(t)]
    for task in queued:
        _out(f"{task.id} is in the merge queue already ({task.land_state})")
    new = [t.id for t in tasks if t not in queued]
    # open review comments ask first, as a merge does (nothing is queued when refused)
    asked = _open_comments(fleet, [t for t in tasks if t not in queued], args.yes,
                           verb="land", done="queued")
    if asked:
        _confirm(f"queue {', '.join(new)} to land?{asked}", False)
    for task in fleet.enqueue(new) if new else []:
        _out(f"{task.id} queued to land ({task.land_state})")
    for repo in dict.fromkeys(t.repo for t in queued):
        fleet.ensure_queue_runner(repo)
    if not args.wait:
        _err("landing in the background; follow with `fleet-tui queue`")
        return EXIT_OK
    return _wait_landed(fleet, ids)


def _wait_landed(fleet: Fleet, ids: list[str]) -> int:
    """Schedule (and keep a queue runner going) until every task landed or stopped."""
    seen: dict[str, tuple[str | None, str | None]] = {}

    def done(task: Task) -> bool:
        key = (task.land_state, task.land_note)
        if seen.get(task.id) != key:
            seen[task.id] = key
            _err(_land_line(task))
        return task.land_state not in LAND_ACTIVE

    final = _schedule_until(fleet, ids, done)
    stopped = [t for t in final if t.land_state != LandState.MERGED]
    return EXIT_REFUSED if stopped else EXIT_OK


def cmd_compare(argv: list[str]) -> int:
    p = _id_parser("compare", "Compare the copies of a task (launched together with "
                   "--copies) side by side.")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    from fleet_tui.commands import best

    fleet = _fleet()
    _catch_up(fleet)
    reports = fleet.compare(args.id)
    costs = fleet.costs([r.task.id for r in reports])
    # best of N: the copies ranked by evidence (gathered now when missing or stale)
    ranked = fleet.rank(args.id) if len(reports) > 1 else []
    if args.json:
        rows = {r.task.id: {"id": r.task.id, "state": r.task.state.value,
                          "verdict": r.task.verdict, "turns": r.task.turns,
                          "tokens": r.task.input_tokens + r.task.output_tokens,
                          "cost": round(costs[r.task.id].cost, 6)
                          if r.task.id in costs else 0.0,
                          "unpriced": costs[r.task.id].unpriced if r.task.id in costs else 0,
                          "added": r.added, "deleted": r.deleted, "files": r.files,
                          "gate": r.gate, "clean": r.clean, "merges": r.merges}
                for r in reports}
        _out(json.dumps(best.compare_json(ranked, rows) if ranked else list(rows.values()),
                        indent=2))
        return EXIT_OK
    if ranked:
        best.print_ranking(_out, ranked, {r.task.id: r.task for r in reports},
                           {t: c.cost for t, c in costs.items()})
        return EXIT_OK
    if len(reports) == 1:
        _err(f"task {reports[0].task.id} was not launched as one of several copies; "
             "nothing to compare it with")
    _out(f"{'ID':<6}  {'STATE':<9}  {'VERDICT':<9}  {'TURNS':>5}  {'TOKENS':>7}  "
         f"{'COST':>9}  {'+/-':>9}  {'FILES':>5}  {'GATE':<6}  MERGES CLEANLY")
    for r in reports:
        t = r.task
        _out(f"{t.id:<6}  {t.state.value:<9}  {t.verdict or '-':<9}  {t.turns:>5}  "
             f"{_tokens(t.input_tokens + t.output_tokens):>7}  {_cost(costs.get(t.id)):>9}  "
             f"{f'+{r.added}/-{r.deleted}':>9}  {len(r.files):>5}  {r.gate:<6}  "
             f"{_one_line(r.merges, 70)}")
        if r.files:
            _out(f"        {_one_line(', '.join(r.files), 110)}")
    return EXIT_OK


def cmd_pick(argv: list[str]) -> int:
    p = _id_parser("pick", "Keep this copy of a task: discard its sibling copies and land "
                   "it through the merge queue.")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask")
    p.add_argument("--wait", action="store_true", help="stay until it has landed or stopped")
    p.add_argument("--best", action="store_true", help="land the best copy of ID's group "
                   "by evidence (`fleet-tui compare ID`), whichever copy ID is; exit 4 when "
                   "none passes")
    args = p.parse_args(argv)
    from fleet_tui.commands import best

    fleet = _fleet(task_id=args.id)
    _catch_up(fleet)
    task = fleet.get_task(args.id)
    if args.best:
        chosen = best.winner_of(fleet.rank(task.id), args.yes)
        if chosen is not None:
            asked = _open_comments(fleet, [fleet.get_task(chosen)], args.yes, verb="land",
                                   done="picked")
            if asked:
                _confirm(f"land {chosen}, the best copy?{asked}", False)
        queued, discarded, winner = fleet.pick_best(task.id, choose=chosen)
        _out(f"best: {winner.task_id}: {_one_line(winner.reason, 120)}")
        return _picked(fleet, queued, discarded, args.wait)
    _refuse_unless(task, Action.PICK)
    siblings = [t for t in fleet.copies(task.id) if t.id != task.id
                and t.state not in CLOSED_STATES]
    names = ", ".join(t.id for t in siblings) or "none"
    asked = _open_comments(fleet, [task], args.yes, verb="land", done="picked")
    _confirm(f"land {task.id} ({task.short_title}) and discard its other copies "
             f"({names})?{asked}", args.yes)
    queued, discarded = fleet.pick(task.id)
    return _picked(fleet, queued, discarded, args.wait)


def _picked(fleet: Fleet, queued: Task, discarded: Sequence[str], wait: bool) -> int:
    """What `pick` and `pick --best` say once a copy is queued and its siblings discarded,
    then the landing waited for when asked."""
    for sibling in discarded:
        _out(f"discarded {sibling}")
    _out(f"{queued.id} queued to land ({queued.land_state})")
    if not wait:
        _err("landing in the background; follow with `fleet-tui queue`")
        return EXIT_OK
    return _wait_landed(fleet, [queued.id])


def cmd_push(argv: list[str]) -> int:
    p = _id_parser("push", "Push a finished task's branch (its uncommitted work committed "
                   "first) to the repository's remote as fleet/ID, instead of merging it. "
                   "The pr_command setting, if set, runs afterwards (to open a pull request).")
    args = p.parse_args(argv)
    fleet = _fleet()
    _catch_up(fleet)
    result = fleet.push(args.id)
    _out(f"{result.remote}/{result.remote_branch}")
    _err(result.message)
    if result.hook_output is not None:
        sys.stdout.write(visible(result.hook_output.rstrip("\n") + "\n"))
        if not result.hook_passed:
            _err("fleet-tui push: the pr_command failed (the branch is pushed)")
            return EXIT_FAILED
    return EXIT_OK


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "run": cmd_run, "ls": cmd_ls, "show": cmd_show, "logs": cmd_logs, "diff": cmd_diff,
    "merge": cmd_merge, "discard": cmd_discard, "retry": cmd_retry,
    "follow-up": cmd_follow_up, "kill": cmd_kill, "say": cmd_say, "archive": cmd_archive,
    "update": cmd_update, "queue": cmd_queue, "compare": cmd_compare, "pick": cmd_pick,
    "push": cmd_push, "review": cmd_review,
}


def main(argv: list[str]) -> int:
    """argv[0] is the subcommand. Every failure is one line on stderr and an exit code."""
    if not argv or argv[0] not in COMMANDS:
        _err(f"fleet-tui: unknown task command {argv[0] if argv else ''!r}; use one of "
             + ", ".join(COMMANDS))
        return EXIT_USAGE
    name, rest = argv[0], argv[1:]
    try:
        return COMMANDS[name](rest)
    except SystemExit as exc:  # --help
        return int(exc.code or 0) if isinstance(exc.code, int | None) else EXIT_USAGE
    except FleetTuiError as exc:  # every error meant for the user: its message and code
        _err(f"fleet-tui {name}: {exc.message}")
        return exc.exit_code
    except sqlite3.DatabaseError as exc:  # a read outside a transaction met it
        from fleet_tui.store.db import unusable
        from fleet_tui.system import paths

        failure = unusable(paths.db_path(), exc)
        if failure is None:
            raise
        _err(f"fleet-tui {name}: {failure.message}")
        return failure.exit_code
    except KeyboardInterrupt:
        _err(f"fleet-tui {name}: interrupted; running tasks go on in the background "
             "(`fleet-tui ls`)")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
