"""The fleet as MCP tools (`fleet-tui mcp`): what an orchestrating Claude Code session
calls to delegate work to the fleet, watch it, read it and land it.

Every tool is the CLI's command of the same name over the same `Fleet` (the engine's
front), with the CLI's checks and refusals, so nothing reaches the engine that the CLI
could not do; only the confirmations a terminal would ask become refusals the model can
read (open review comments stop a merge; a fresh retry that throws work away needs
``discard_changes``). Each tool answers with structured content and a short text (Claude
Code shows the model the structured content, so the text is in it too: "summary"); a
failure is an MCP tool error with the CLI's message, never a crash of the server. What a
worker wrote is redacted as the CLI prints it.

The guard rails of a model caller (`[mcp]` in config.toml, settings/mcp.py): this server
starts at most ``max_tasks`` tasks and no more work once its tasks spent ``max_spend``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field, ValidationError

from fleet_tui.commands import cost as cost_command
from fleet_tui.commands import tasks as cli
from fleet_tui.core import policy, redaction, stream
from fleet_tui.core.durations import check_seconds, parse_duration
from fleet_tui.core.errors import FleetRefused, FleetTuiError
from fleet_tui.core.states import (
    ACTIVE_STATES,
    CLOSED_STATES,
    FINISHED_STATES,
    LAND_ACTIVE,
    PENDING_STATES,
    Action,
    TaskState,
)
from fleet_tui.engine.fleet import Fleet, TaskSpec, check_text
from fleet_tui.settings.mcp import McpSettings
from fleet_tui.store import budgets
from fleet_tui.store.costs import BY
from fleet_tui.store.db import MAX_COPIES, Task
from fleet_tui.store.meter import Totals
from fleet_tui.vcs import git

log = logging.getLogger(__name__)

SERVER_NAME = "fleet"
WAIT_LIMIT = 600.0  # seconds one `wait` call may block (call again for longer)
WAIT_DEFAULT = 120.0
DIFF_DEFAULT = 20_000  # bytes of patch a `diff` returns unless told
DIFF_LIMIT = 1_000_000
READY_LIMIT = 60.0  # seconds a tool waits for the engine's start (the key's lookup)
TEST_OUTPUT_LIMIT = 4_000  # the tail of a test command's output in a merge's answer
PROMPT_SHOWN = 4_000  # characters of a task's prompt in `show`
LIST_LIMIT = 200  # tasks in one `list` answer
RUNNING_OR_PENDING = ACTIVE_STATES | PENDING_STATES

INSTRUCTIONS = """\
The fleet runs coding tasks in the background, each by a worker (a headless Claude Code on
a cheaper model) in its own git worktree and branch of this repository. You delegate with
`run`, wait with `wait`, read the work with `show` and `diff`, and land it with `merge` or
`queue` (the merge gate: test command, conflict check, open review comments). Tasks are
named by id (6 characters; a unique prefix works). A person may watch the same tasks in
the fleet-tui panel and steer or kill them. This session may start a limited number of
tasks and spend a limited amount (`cost` shows both)."""

ID_HELP = "the task's id, as `run` or `list` gave it (a unique prefix is enough)"
IdArg = Annotated[str, Field(description=ID_HELP, min_length=1, max_length=200)]


class _FleetServer(MCPServer[Any]):
    """MCPServer whose malformed calls get one readable line: an argument missing, of the
    wrong type or unknown (a typo'd name would otherwise be ignored silently)."""

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Any = None) -> Any:
        tool = self._tool_manager.get_tool(name)
        if tool is not None:
            known = set(tool.parameters.get("properties", {}))
            unknown = sorted(set(arguments) - known)
            if unknown:
                raise ToolError(f"{name}: unknown argument {unknown[0]!r}; {name} takes "
                                + (", ".join(sorted(known)) or "no arguments"))
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                raise ToolError(_readable(name, exc.__cause__)) from None
            raise


def _readable(tool: str, error: ValidationError) -> str:
    """A ValidationError as one line: each bad argument and what it needs."""
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "arguments"
        if item["type"] == "missing":
            parts.append(f"missing argument {where!r}")
        else:
            parts.append(f"argument {where!r}: {item['msg']}")
    return f"{tool}: {'; '.join(dict.fromkeys(parts))} (the tool's description says what " \
           "it takes)"


def _clean(value: Any) -> Any:
    """Structured content as JSON with the key hidden in every string."""
    if isinstance(value, str):
        return redaction.redact(value)
    if isinstance(value, Path):
        return redaction.redact(str(value))
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _cut(text: str, limit: int) -> tuple[str, bool]:
    """At most `limit` bytes of UTF-8 text (a character is never split)."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text, False
    return data[:limit].decode("utf-8", "ignore"), True


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "[...]\n" + text[-limit:]


class FleetTools:
    """The tools' work, over one `Fleet`, with this server's caps (one per process)."""

    def __init__(self, fleet: Fleet, caps: McpSettings, repo: Path | None) -> None:
        self.fleet = fleet
        self.caps = caps
        self.repo = repo  # where the server started (Claude Code's project), if a repository
        self.started: list[str] = []  # the tasks this server started (the caps count them)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()  # set once the key is known (start)

    # --- the scheduler, as the panel runs it ---------------------------------------------

    def start(self) -> None:
        """Schedule in a thread while the server runs: queued tasks start and finished
        ones are recorded without a tool call (the panel, if open, does the same). The
        thread first looks the key up (redaction needs it; a keyring can be slow), while
        the server already answers Claude Code's handshake; tools wait for it."""
        self._thread = threading.Thread(target=self._schedule, name="fleet-scheduler",
                                        daemon=True)
        self._thread.start()

    def _schedule(self) -> None:
        try:
            self.fleet.prepare_secret_scan()
        except FleetTuiError as exc:  # no key yet: `run` says so when it is called
            log.warning("%s", redaction.redact(exc.message))
        except Exception as exc:  # a keyring that fails: schedule all the same
            log.warning("the key could not be looked up: %s", redaction.redact(str(exc)))
        finally:
            self.ready.set()
        self.fleet.run(self._stop, cli.TICK)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # --- shared pieces -------------------------------------------------------------------

    def _repo(self, repo: str | None) -> Path:
        if repo is not None:
            check_text("repository", repo)
            return cli._repo(Path(repo))
        if self.repo is None:
            raise cli._Usage("the server was not started in a git repository; pass `repo` "
                             "(the repository's path)")
        return self.repo

    def _task(self, task_id: str) -> Task:
        check_text("id", task_id)
        return self.fleet.get_task(task_id.strip())

    def _spent(self) -> Totals:
        with self._lock:
            ids = list(self.started)
        costs = self.fleet.costs(ids) if ids else {}
        return Totals(requests=sum(t.requests for t in costs.values()),
                      cost=sum(t.cost for t in costs.values()),
                      unpriced=sum(t.unpriced for t in costs.values()))

    def _check_spend(self, what: str) -> None:
        """No more work once this session's tasks spent the cap."""
        cap = self.caps.max_spend
        if cap <= 0:
            return
        spent = self._spent().cost
        if spent >= cap:
            raise FleetRefused(
                f"refused: {what} would start more work, and the tasks of this session "
                f"have spent {budgets.usd(spent)} of the {budgets.usd(cap)} it may spend "
                "([mcp] max_spend in config.toml). Merge or discard what you have and "
                "report to the user; only a person can raise the cap")

    def _session(self) -> dict[str, Any]:
        spent = self._spent()
        with self._lock:
            count = len(self.started)
        return {"tasks_started": count, "max_tasks": self.caps.max_tasks,
                "spent": round(spent.cost, 6), "max_spend": self.caps.max_spend,
                "unpriced_requests": spent.unpriced}

    def _summary(self, task: Task, cost: Totals | None = None) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": task.id, "title": task.short_title, "state": task.state.value,
            "state_text": policy.state_text(task), "verdict": task.verdict,
            "message": task.message, "turns": task.turns,
            "tokens": {"input": task.input_tokens, "output": task.output_tokens},
            "added_lines": task.added_lines, "deleted_lines": task.deleted_lines,
            "no_change": policy.no_change(task), "branch": task.branch,
            "base": task.base_branch or task.base_ref, "endpoint": task.endpoint,
            "host": task.host, "copies_group": task.group_id,
            "land_state": task.land_state, "land_note": task.land_note, "gate": task.gate,
        }
        if cost is not None:
            data["cost"] = round(cost.cost, 6)
            data["unpriced_requests"] = cost.unpriced
        return data

    def _line(self, task: Task) -> str:
        verdict = f" ({task.verdict})" if task.verdict else ""
        land = f", landing: {task.land_state}" if task.land_state else ""
        return (f"{task.id} {policy.state_text(task)}{verdict} "
                f"+{task.added_lines}/-{task.deleted_lines}{land}: "
                f"{stream.one_line(task.short_title, 70)}")

    # --- the tools -----------------------------------------------------------------------

    def run(self, prompt: str, title: str | None, copies: int, host: str | None,
            endpoint: str | None, model: str | None, base: str | None,
            max_turns: int | None, timeout: float | str | None,
            repo: str | None) -> tuple[str, dict[str, Any]]:
        if not prompt.strip():
            raise cli._Usage("the prompt is empty; say what the worker should do")
        if len(prompt.encode("utf-8", "surrogatepass")) > cli.PROMPT_LIMIT:
            raise cli._Usage("the prompt is over 1 MiB; shorten it, or put the material in a "
                             "file in the repository the worker can read")
        check_text("prompt", prompt)
        for what, value in (("title", title), ("base ref", base), ("model", model),
                            ("endpoint", endpoint), ("host", host)):
            if value is not None:
                check_text(what, value)
        seconds = _timeout(timeout)
        where = self._repo(repo)
        with self._lock:
            cap = self.caps.max_tasks
            if cap and len(self.started) + copies > cap:
                left = max(0, cap - len(self.started))
                raise FleetRefused(
                    f"refused: this session may start {cap} tasks ([mcp] max_tasks in "
                    f"config.toml) and has started {len(self.started)}; {copies} more "
                    f"{'is' if copies == 1 else 'are'} past the cap ({left} left). Land or "
                    "discard what you have and report to the user; only a person can raise "
                    "the cap")
        self._check_spend("run")
        settings = self.fleet.settings
        cli._check_launch(settings, None, endpoint, host)
        made = self.fleet.submit(TaskSpec(prompt=prompt, title=title or "", repo=where,
                                          base_ref=base, model=model or "main",
                                          endpoint=endpoint, host=host, max_turns=max_turns,
                                          timeout=seconds), copies=copies)
        with self._lock:
            self.started.extend(t.id for t in made)
        _tick(self.fleet)
        made = [self.fleet.get_task(t.id) for t in made]
        ids = [t.id for t in made]
        text = (f"started {len(ids)} task{'s' if len(ids) != 1 else ''}: {', '.join(ids)} "
                f"({made[0].short_title}). Call wait with ids {ids} to know when "
                f"{'they end' if len(ids) > 1 else 'it ends'}.")
        return text, {"ids": ids, "tasks": [self._summary(t) for t in made],
                      "session": self._session()}

    def list_tasks(self, state: str | None, repo: str | None,
                   all_repos: bool) -> tuple[str, dict[str, Any]]:
        wanted: TaskState | None = None
        if state is not None:
            try:
                wanted = TaskState(state.strip().lower())
            except ValueError:
                raise cli._Usage(f"state {state!r} is not one of "
                                 + ", ".join(s.value for s in TaskState)) from None
        where = None if all_repos else self._repo(repo)
        found = self.fleet.list_tasks(where)
        if wanted is not None:
            found = [t for t in found if t.state == wanted]
        shown = found[:LIST_LIMIT]
        costs = self.fleet.costs([t.id for t in shown])
        rows = [self._summary(t, costs.get(t.id, Totals())) for t in shown]
        more = f" (the newest {LIST_LIMIT} of {len(found)})" if len(found) > len(shown) else ""
        text = (f"{len(found)} task{'s' if len(found) != 1 else ''}{more}"
                + (":\n" + "\n".join(self._line(t) for t in shown) if shown else ""))
        return text, {"tasks": rows, "count": len(found), "truncated": bool(more)}

    def show(self, task_id: str) -> tuple[str, dict[str, Any]]:
        task = self._task(task_id)
        cost = self.fleet.costs([task.id]).get(task.id, Totals())
        data = self._summary(task, cost)
        prompt, cut = _cut(task.prompt, PROMPT_SHOWN)
        data.update(prompt=prompt, prompt_truncated=cut, result=self._result_text(task),
                    open_review_comments=self.fleet.open_comments(task.id),
                    conflicts=list(task.conflicts))
        data["attempts"] = [
            {"n": a.n, "kind": a.kind, "model": a.model, "verdict": a.verdict,
             "message": a.message, "turns": a.turns,
             "seconds": round(a.finished_at - a.started_at, 1)
             if a.started_at and a.finished_at else None}
            for a in self.fleet.attempts(task.id)]
        files, note = self._files(task)
        data["files"] = files
        if note:
            data["files_note"] = note
        text = self._line(task)
        if task.message:
            text += f"\nmessage: {stream.one_line(task.message, 300)}"
        if data["result"]:
            text += f"\nresult: {_cut(data['result'], 2000)[0]}"
        if files:
            text += "\nfiles: " + ", ".join(f"{f['path']} +{f['added']}/-{f['deleted']}"
                                            for f in files[:30])
        return text, data

    def _result_text(self, task: Task) -> str | None:
        """The final text of the task's last attempt (the worker's own summary)."""
        attempts = [a for a in self.fleet.attempts(task.id) if a.dir is not None]
        if not attempts:
            return None
        found: str | None = None
        offset = 0
        while True:
            events, new = self.fleet.read_events(attempts[-1], offset)
            for ev in events:
                if isinstance(ev, stream.Result):
                    found = ev.result
            if new == offset or not events:
                return found
            offset = new

    def _files(self, task: Task) -> tuple[list[dict[str, Any]], str | None]:
        if task.state in CLOSED_STATES or task.worktree is None:
            return [], f"no worktree ({task.state.value}): no files to show"
        if task.state not in FINISHED_STATES and task.state != TaskState.RUNNING:
            return [], None
        try:
            diff = self.fleet.diff(task.id)
        except (FleetTuiError, git.GitError, OSError) as exc:
            return [], f"the files could not be read: {exc}"
        return [{"path": f.path, "status": f.status, "added": f.added, "deleted": f.deleted}
                for f in diff.files], None

    def wait(self, ids: list[str], timeout: float) -> tuple[str, dict[str, Any]]:
        if not ids:
            raise cli._Usage("ids is empty; give the ids `run` returned")
        tasks = [self._task(i) for i in ids]
        wanted = list(dict.fromkeys(t.id for t in tasks))
        deadline = time.monotonic() + timeout
        waiting: dict[str, str] = {}
        while True:
            tasks = [self.fleet.get_task(i) for i in wanted]
            waiting = {}
            for t in tasks:
                why = self.fleet.why_waiting(t.endpoint) if t.state == TaskState.QUEUED \
                    else None
                if why is not None and why.startswith("held: "):
                    waiting[t.id] = why  # only a person ends a hold: no use waiting
            ended = [t for t in tasks if _ended(t) or t.id in waiting]
            if len(ended) == len(tasks) or time.monotonic() >= deadline:
                break
            time.sleep(min(cli.TICK * 2, max(0.0, deadline - time.monotonic())) or 0.05)
        costs = self.fleet.costs(wanted)
        rows = [self._summary(t, costs.get(t.id, Totals())) for t in tasks]
        for row in rows:
            if row["id"] in waiting:
                row["waiting"] = waiting[row["id"]]
        done = all(_ended(t) for t in tasks)
        if done:
            head = f"all {len(tasks)} ended" if len(tasks) > 1 else "it ended"
        elif waiting:
            head = "some cannot start until a person acts"
        else:
            head = (f"time is up ({timeout:g} s): {sum(not _ended(t) for t in tasks)} still "
                    "going; call wait again")
        lines = [self._line(t) + (f" [{waiting[t.id]}]" if t.id in waiting else "")
                 for t in tasks]
        return head + ":\n" + "\n".join(lines), {"done": done, "timed_out": not done
                                                 and not waiting, "tasks": rows}

    def diff(self, task_id: str, file: str | None,
             max_bytes: int) -> tuple[str, dict[str, Any]]:
        task = self._task(task_id)
        if file is not None:
            check_text("file", file)
        diff = self.fleet.diff(task.id)
        files = [{"path": f.path, "status": f.status, "added": f.added, "deleted": f.deleted,
                  **({"old_path": f.old_path} if f.old_path else {}),
                  **({"binary": True} if f.binary else {})} for f in diff.files]
        patch = diff.patch
        if file is not None:
            chosen = [f for f in diff.files if file in (f.path, f.old_path)]
            if not chosen:
                raise cli._Usage(f"task {task.id} did not change {file!r}; it changed: "
                                 + (", ".join(f.path for f in diff.files) or "nothing"))
            patch = chosen[0].patch
        size = len(patch.encode("utf-8"))
        shown, cut = _cut(patch, max_bytes)
        note = (f"\n[cut at {max_bytes} of {size} bytes: ask for one file with `file`, or "
                "a larger max_bytes]" if cut else "")
        warn = (f"these files contain the API key (shown as {git.REDACTED}; a merge refuses "
                f"them): {', '.join(diff.secret_paths)}\n" if diff.secret_paths else "")
        if not diff.files:
            head = f"task {task.id} has no changes against its base"
        else:
            head = (f"task {task.id}: {len(diff.files)} file"
                    f"{'s' if len(diff.files) != 1 else ''} +{diff.added}/-{diff.deleted}")
        text = f"{head}\n{warn}{shown}{note}"
        return text, {"id": task.id, "files": files, "patch": shown, "bytes": size,
                      "truncated": cut, "secret_paths": list(diff.secret_paths)}

    def _refuse_open_comments(self, tasks: list[Task], done: str) -> None:
        """Open review comments (a person's, from the panel or `fleet-tui review`) stop a
        landing: the CLI asks a person; a model may not answer for them."""
        counts = [(t, n) for t in tasks if (n := self.fleet.open_comments(t.id))]
        if counts:
            words = "; ".join(f"{n} review comment{'s are' if n > 1 else ' is'} open on "
                              f"{t.id}" for t, n in counts)
            raise FleetRefused(f"not {done}: {words}. A person reviewed the diff: send the "
                               "worker a follow-up that addresses them (or ask the user), "
                               "then read its next diff")

    def merge(self, task_id: str, message: str | None) -> tuple[str, dict[str, Any]]:
        task = self._task(task_id)
        if message is not None:
            check_text("message", message)
        cli._refuse_unless(task, Action.MERGE)
        preview = self.fleet.conflict_preview(task.id)
        if not preview.clean:
            raise FleetRefused(f"not merged: {preview.message}")
        self._refuse_open_comments([task], "merged")
        result = self.fleet.merge(task.id, message=message)
        output = _tail(result.test_output or "", TEST_OUTPUT_LIMIT)
        if not result.merged:
            raise FleetRefused(f"not merged: {result.message}"
                               + (f"\ntest output:\n{output}" if output else ""))
        return result.message, {"id": task.id, "merged": True, "message": result.message,
                                "test_output": output or None}

    def queue(self, ids: list[str]) -> tuple[str, dict[str, Any]]:
        if not ids:
            raise cli._Usage("ids is empty; give the tasks to land, in landing order")
        tasks = [self._task(i) for i in ids]
        self._refuse_open_comments(tasks, "queued")
        queued = self.fleet.enqueue(list(dict.fromkeys(t.id for t in tasks)))
        text = ("queued to land, in this order: "
                + ", ".join(f"{t.id} ({t.land_state})" for t in queued)
                + ". Each is updated with its base, tested and merged in turn; call wait "
                  "with these ids to know when each landed or stopped.")
        return text, {"tasks": [self._summary(t) for t in queued]}

    def say(self, task_id: str, text: str) -> tuple[str, dict[str, Any]]:
        if not text.strip():
            raise cli._Usage("the message is empty; say what the worker should do")
        check_text("message", text)
        task = self._task(task_id)
        cli._refuse_unless(task, Action.SAY)
        taken = self.fleet.say(task.id, text)
        return (f"{task.id}: message " + ("taken by the worker" if taken else
                                         "left for the worker (it takes it in a moment)"),
                {"id": task.id, "taken": taken})

    def follow_up(self, task_id: str, text: str) -> tuple[str, dict[str, Any]]:
        if not text.strip():
            raise cli._Usage("the follow-up is empty; say what the worker should do next")
        check_text("follow-up prompt", text)
        task = self._task(task_id)
        self._check_spend("follow_up")
        done = self.fleet.follow_up(task.id, text)
        _tick(self.fleet)
        done = self.fleet.get_task(done.id)
        return (f"{done.id} queued for a follow-up in the same session ({done.state.value}); "
                "call wait to know when it ends", {"task": self._summary(done)})

    def retry(self, task_id: str, mode: str,
              discard_changes: bool) -> tuple[str, dict[str, Any]]:
        task = self._task(task_id)
        resume = mode == "resume"
        self._check_spend("retry")
        if not resume and policy.why_not(task, Action.RETRY) is None \
                and not discard_changes:
            at_stake = self.fleet.work_at_stake(task)
            if at_stake is not None:
                raise FleetRefused(f"a fresh retry of {task.id} would throw away its work: "
                                   f"{at_stake}. Retry with mode \"resume\" to continue in "
                                   "the same worktree, or with discard_changes true to "
                                   "start from scratch anyway")
        done = self.fleet.retry(task.id, resume=resume)
        _tick(self.fleet)
        done = self.fleet.get_task(done.id)
        return (f"{done.id} queued for a {'resumed' if resume else 'fresh'} attempt "
                f"({done.state.value}); call wait to know when it ends",
                {"task": self._summary(done)})

    def kill(self, task_id: str) -> tuple[str, dict[str, Any]]:
        task = self._task(task_id)
        cli._refuse_unless(task, Action.KILL)
        self.fleet.kill(task.id)
        done = self.fleet.get_task(task.id)
        return self._line(done), {"task": self._summary(done)}

    def discard(self, task_id: str) -> tuple[str, dict[str, Any]]:
        task = self._task(task_id)
        cli._refuse_unless(task, Action.DISCARD)
        said = self.fleet.discard(task.id)
        return said, {"id": task.id, "discarded": True, "message": said}

    def cost(self, since: str, by: str) -> tuple[str, dict[str, Any]]:
        now = time.time()
        try:
            start = cost_command.parse_since(since, now)
        except ValueError as exc:
            raise cli._Usage(f"since: {exc}") from None
        report, rows, titles = cost_command.cost_report(self.fleet.settings, start, by, now)
        report["session"] = session = self._session()
        total = report["total"]
        lines = [f"{key or '-'}: {budgets.usd(t.cost)}{'*' if t.unpriced else ''} "
                 f"({t.requests} requests)" + (f" {titles[key]}" if key in titles else "")
                 for key, t in list(rows.items())[:50]]
        text = (f"spent since {since} by {by}: {budgets.usd(total['cost'])} in "
                f"{total['requests']} requests"
                + ("\n" + "\n".join(lines) if lines else "")
                + f"\nthis session: {session['tasks_started']} of "
                  f"{session['max_tasks'] or 'unlimited'} tasks started, "
                  f"{budgets.usd(session['spent'])} of "
                  + (budgets.usd(session['max_spend']) if session['max_spend']
                     else 'unlimited') + " spent")
        if total.get("unpriced"):
            text += ("\n* requests of a model with no price are counted without a cost: "
                     + ", ".join(report["unpriced_models"]))
        return text, report


def _ended(task: Task) -> bool:
    """Nothing more will happen to it without a call: not queued, not running, not in
    the merge queue."""
    return task.state not in RUNNING_OR_PENDING and task.land_state not in LAND_ACTIVE


def _tick(fleet: Fleet) -> None:
    """One scheduling pass now, so a started task shows as such (the thread does the
    rest)."""
    try:
        fleet.tick()
    except (FleetTuiError, OSError) as exc:
        log.warning("could not update running tasks: %s", exc)


def _timeout(value: float | str | None) -> float | None:
    if value is None:
        return None
    try:
        if isinstance(value, str):
            return parse_duration(value)
        return check_seconds(float(value))
    except ValueError as exc:
        raise cli._Usage(f"timeout {value!r}: expected {exc} (0: no limit)") from None


# --- the server -------------------------------------------------------------------------


def _answer(tools: FleetTools, name: str,
            work: Callable[[], tuple[str, dict[str, Any]]]) -> CallToolResult:
    """A tool's answer, or a ToolError with the message the CLI would print; never an
    exception the SDK would call a crash (a bug still answers, with its type)."""
    try:
        tools.ready.wait(READY_LIMIT)  # the key known: the answer hides it
        text, data = work()
    except ToolError:
        raise
    except FleetTuiError as exc:
        raise ToolError(redaction.redact(exc.message)) from None
    except (git.GitError, OSError) as exc:
        raise ToolError(redaction.redact(f"{name}: {exc}")) from None
    except Exception as exc:
        log.exception("tool %s failed", name)
        raise ToolError(redaction.redact(f"{name} failed: {type(exc).__name__}: {exc}")) \
            from None
    # Claude Code (2.1.197) gives the model the structured content, when there is one, and
    # not the text: the text goes in too, as its "summary" (what to do next, often)
    text = redaction.redact(text)
    return CallToolResult(content=[TextContent(type="text", text=text)],
                          structured_content={"summary": text, **_clean(data)})


READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)
ACTS = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
DESTROYS = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)


def build_server(tools: FleetTools) -> MCPServer[Any]:
    """The MCP server named `fleet` with its tools (Claude Code: mcp__fleet__<tool>)."""
    from fleet_tui import __version__

    server = _FleetServer(name=SERVER_NAME, version=__version__, instructions=INSTRUCTIONS,
                          log_level="WARNING")

    @server.tool(name="run", annotations=ACTS, description=(
        "Delegate a task to the fleet: a worker (headless Claude Code) starts on it in the "
        "background, in its own git worktree and branch of the repository, and this returns "
        "at once with the task ids. The worker sees only `prompt`: make it self-contained "
        "(the goal, the files and names involved, the constraints, how to check the work, "
        "that it should commit). `copies` runs N independent attempts at the same prompt "
        "(best of N: compare their diffs, merge one, discard the rest). Then call `wait` "
        "with the ids. Limits: this session may start a capped number of tasks and spend a "
        "capped amount (see `cost`); a refusal says so; do not try to get around it."))
    def run(prompt: Annotated[str, Field(description="everything the worker needs to know; "
                                         "it sees nothing else of this conversation")],
            title: Annotated[str | None, Field(description="a short title (default: the "
                                               "prompt's first line)")] = None,
            copies: Annotated[int, Field(ge=1, le=MAX_COPIES, description="independent "
                                         f"copies, 1 to {MAX_COPIES}")] = 1,
            host: Annotated[str | None, Field(description="a host of config.toml, `local` "
                                              "(default) or `any`")] = None,
            endpoint: Annotated[str | None, Field(description="an endpoint of config.toml "
                                                  "(default: `default`)")] = None,
            model: Annotated[str | None, Field(description="`main` (default), `small` or a "
                                               "model name")] = None,
            base: Annotated[str | None, Field(description="branch, tag or commit to start "
                                              "from (default: the current HEAD)")] = None,
            max_turns: Annotated[int | None, Field(ge=1, description="stop the worker "
                                                   "after this many turns")] = None,
            timeout: Annotated[float | str | None, Field(description="wall-clock limit: "
                                                         "seconds, or `15m`, `1h30m`; 0: "
                                                         "none")] = None,
            repo: Annotated[str | None, Field(description="the repository's path (default: "
                                              "the one Claude Code runs in)")] = None,
            ) -> CallToolResult:
        return _answer(tools, "run", lambda: tools.run(prompt, title, copies, host, endpoint, model,
                                                base, max_turns, timeout, repo))

    @server.tool(name="list", annotations=READ_ONLY, description=(
        "The fleet's tasks in this repository, newest first: id, title, state (queued, "
        "running, succeeded, failed, killed, merged, discarded, ...), verdict, turns, "
        "tokens, cost, lines added/deleted, landing state. A person's tasks from the panel "
        "are listed too: leave alone what you did not start unless asked."))
    def list_(state: Annotated[str | None, Field(description="only tasks in this state")
                               ] = None,
              repo: Annotated[str | None, Field(description="the repository's path "
                                                "(default: the one Claude Code runs in)")
                              ] = None,
              all_repos: Annotated[bool, Field(description="every repository's tasks")
                                   ] = False) -> CallToolResult:
        return _answer(tools, "list", lambda: tools.list_tasks(state, repo, all_repos))

    @server.tool(name="show", annotations=READ_ONLY, description=(
        "One task in full: state, verdict and message, the worker's final result text, "
        "turns, tokens, cost, the files it changed with +/- lines, its attempts, its "
        "landing state and open review comments. Read it before judging a task; read the "
        "code itself with `diff`."))
    def show(id: IdArg) -> CallToolResult:
        return _answer(tools, "show", lambda: tools.show(id))

    @server.tool(name="wait", annotations=READ_ONLY, description=(
        "Block until every task in `ids` has ended (succeeded, failed, killed, ...; a task "
        "in the merge queue: landed or stopped) or `timeout` seconds are up, then give each "
        f"one's state. At most {WAIT_LIMIT:g} s per call: if `done` is false, call again. "
        "Prefer this to polling `list` or `show`. A task whose endpoint is held (out of "
        "budget) returns at once with the reason: only a person can release it."))
    def wait(ids: Annotated[list[str], Field(description="task ids (from `run`)",
                                             min_length=1, max_length=200)],
             timeout: Annotated[float, Field(gt=0, le=WAIT_LIMIT,
                                             description="seconds to wait at most")
                                ] = WAIT_DEFAULT) -> CallToolResult:
        return _answer(tools, "wait", lambda: tools.wait(ids, timeout))

    @server.tool(name="diff", annotations=READ_ONLY, description=(
        "A task's changes against its base as a unified diff (committed, uncommitted and "
        "new files), with the list of files and their +/- lines. Past `max_bytes` the patch "
        "is cut and says so: ask for one `file` at a time for large changes. Read it "
        "critically before merging: does it do what was asked, only that, and would you "
        "accept it in review?"))
    def diff(id: IdArg,
             file: Annotated[str | None, Field(description="only this file's patch (a path "
                                               "as the file list gives it)")] = None,
             max_bytes: Annotated[int, Field(ge=1, le=DIFF_LIMIT,
                                             description="cut the patch past this many "
                                             "bytes")] = DIFF_DEFAULT) -> CallToolResult:
        return _answer(tools, "diff", lambda: tools.diff(id, file, max_bytes))

    @server.tool(name="merge", annotations=DESTROYS, description=(
        "Merge a finished task into its base branch now, through the same gate as the "
        "panel and the CLI: the conflict check, the test command (test_command), open "
        "review comments; then its worktree and branch are cleaned up. Refused with the "
        "reason when the gate says no (a conflict, red tests, comments open, a task not "
        "finished): read it, fix with follow_up, or leave it to the user. For several "
        "tasks, use `queue`."))
    def merge(id: IdArg,
              message: Annotated[str | None, Field(description="the commit message "
                                                   "(default: the task's title)")] = None,
              ) -> CallToolResult:
        return _answer(tools, "merge", lambda: tools.merge(id, message))

    @server.tool(name="queue", annotations=ACTS, description=(
        "Land several finished tasks through the merge queue, one at a time in this order: "
        "each is brought up to date with its base, tested (test_command) and merged; a "
        "conflict or a red test goes back to its worker to fix, then the queue stops on "
        "it. Returns at once; call `wait` with the same ids to know when each landed "
        "(state merged) or stopped (land_note says why)."))
    def queue(ids: Annotated[list[str], Field(description="task ids, in landing order",
                                              min_length=1, max_length=200)]
              ) -> CallToolResult:
        return _answer(tools, "queue", lambda: tools.queue(ids))

    @server.tool(name="say", annotations=ACTS, description=(
        "Send a message to a running worker: it joins the turn the worker is in. For a "
        "task that has finished, use follow_up."))
    def say(id: IdArg, text: Annotated[str, Field(description="the message")]
            ) -> CallToolResult:
        return _answer(tools, "say", lambda: tools.say(id, text))

    @server.tool(name="follow_up", annotations=ACTS, description=(
        "Give a finished task a new prompt in the same session and worktree (it remembers "
        "its work): to fix what its diff got wrong, answer review comments, or go on. "
        "Starts work: counts against this session's spend cap. Then call `wait`."))
    def follow_up(id: IdArg, text: Annotated[str, Field(description="the follow-up prompt")]
                  ) -> CallToolResult:
        return _answer(tools, "follow_up", lambda: tools.follow_up(id, text))

    @server.tool(name="retry", annotations=DESTROYS, description=(
        "Run a finished task again: `fresh` (worktree and branch reset to its base; refused "
        "when that throws changes away, unless discard_changes is true) or `resume` (its "
        "session goes on in the same worktree). Counts against the spend cap. Then `wait`."))
    def retry(id: IdArg,
              mode: Annotated[Literal["fresh", "resume"], Field(description="fresh or "
                                                                "resume")] = "fresh",
              discard_changes: Annotated[bool, Field(description="a fresh retry may throw "
                                                     "the task's changes away")] = False,
              ) -> CallToolResult:
        return _answer(tools, "retry", lambda: tools.retry(id, mode, discard_changes))

    @server.tool(name="kill", annotations=DESTROYS, description=(
        "Stop a running task now (its whole process tree), or drop a queued one. Its work "
        "so far stays in its worktree (discard it, retry or follow_up later)."))
    def kill(id: IdArg) -> CallToolResult:
        return _answer(tools, "kill", lambda: tools.kill(id))

    @server.tool(name="discard", annotations=DESTROYS, description=(
        "Throw a task's work away for good: its worktree, branch and session (a running "
        "task is stopped first). For the copies you did not pick, and work not worth "
        "keeping."))
    def discard(id: IdArg) -> CallToolResult:
        return _answer(tools, "discard", lambda: tools.discard(id))

    @server.tool(name="cost", annotations=READ_ONLY, description=(
        "What the workers' requests cost (the gateway's meter), grouped by task, endpoint "
        "or day, the budgets left, and this session's tasks started and spend against its "
        "caps. Check it before fanning out wide."))
    def cost(since: Annotated[str, Field(description="how far back: 7d, 12h, 90m, 2w, "
                                         "today or all")] = "7d",
             by: Annotated[Literal["task", "endpoint", "day"],
                           Field(description="one row per " + ", ".join(BY))] = "endpoint",
             ) -> CallToolResult:
        return _answer(tools, "cost", lambda: tools.cost(since, by))

    return server


__all__ = ["SERVER_NAME", "FleetTools", "build_server"]
