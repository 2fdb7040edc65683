"""The task actions that go to the engine, and their dialogs: launch, merge (one task, or
marked tasks through the merge queue), discard and kill (one confirm), retry, follow-up,
say, update from the base branch, compare and pick copies, push, the merge queue view, and
a shell in the task's worktree.

Each action asks in a dialog worker (``push_screen_wait``), then calls the engine in a
thread worker, which posts ``ActionDone``: the screen hands it back here to say how it went.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet_tui.core.states import ACTIVE_STATES, CLOSED_STATES, PENDING_STATES, Action
from fleet_tui.ui.actions import IN_BROWSER_SHELL
from fleet_tui.ui.controllers import Controller, Handlers, PanelScreen, Receivers, screen_work
from fleet_tui.ui.external import run_external
from fleet_tui.ui.formatting import describe_error, open_comments_words
from fleet_tui.ui.messages import ActionDone, TasksSubmitted

if TYPE_CHECKING:
    from fleet_tui.core.model import Task
    from fleet_tui.engine.fleet import Fleet
    from fleet_tui.ui.screens.landing import CopyRow, QueueRow
    from fleet_tui.ui.screens.launch import FormDraft, LaunchRequest
    from fleet_tui.ui.screens.modals import MergeItem

SAY_SETTLE = 15.0
"""Seconds a message to a worker that ended its turn meanwhile waits for the task to be
recorded finished, to go as a follow-up instead (the scheduler records it within a tick)."""


class TaskActionsController(Controller):
    """The task actions that go to the engine, each with its dialog."""

    def __init__(self, screen: PanelScreen) -> None:
        super().__init__(screen)
        self.launch_drafts: dict[Path, FormDraft] = {}  # a closed launch form's text, by repo

    def bindings(self) -> Handlers:
        return {"task.new": self.new_task, "task.merge": self.merge,
                "task.discard": self.discard, "task.kill": self.kill,
                "task.retry": self.retry, "task.follow_up": self.follow_up,
                "task.say": self.say, "task.update": self.update,
                "task.compare": self.compare, "task.pick": self.pick, "task.push": self.push,
                "queue.view": self.queue_view, "task.shell": self.shell}

    def receives(self) -> Receivers:
        return {ActionDone: self.action_done}

    def new_task(self) -> None:
        self._new_task()

    @screen_work(exclusive=True, group="dialog", description="launching")
    async def _new_task(self) -> None:
        """The launch form, once the engine is ready (a key pressed before waits for it:
        the repository is known only then when the panel looked for it)."""
        from fleet_tui.ui.screens.launch import LaunchScreen

        await self.screen.ready.wait()
        repo = self.screen.repo
        base = self.screen.default_base
        if repo is None:
            # opened outside a repository: which one (the recent ones are offered)
            chosen = await self._choose_repository(self.screen.engine())
            if chosen is None:
                return
            repo, base = chosen
        if self.screen.closing:
            return
        form = LaunchScreen(repo, default_base=base, draft=self.launch_drafts.get(repo),
                            endpoints=self.screen.engine().settings.endpoint_names,
                            hosts=self.screen.engine().settings.host_names)
        request = await self.screen.app.push_screen_wait(form)
        if form.draft is not None and request is None:
            self.launch_drafts[repo] = form.draft  # closed with something typed: kept
        else:
            self.launch_drafts.pop(repo, None)
        if request is not None:
            self._submit(self.screen.engine(), request)

    async def _choose_repository(self, fleet: Fleet) -> tuple[Path, str] | None:
        """Ask which repository a new task starts in (the panel was opened outside one):
        the recent ones from the task list, or a path typed. (repository, its branch)."""
        from fleet_tui.ui.screens.modals import RepoScreen

        recent = await asyncio.to_thread(fleet.recent_repos)
        while not self.screen.closing:
            answer = await self.screen.app.push_screen_wait(RepoScreen(
                [str(r) for r in recent if Path(r).is_dir()]))
            if answer is None:
                return None
            try:
                return await asyncio.to_thread(_repository_at, answer)
            except Exception as exc:  # GitError: not a repository; said, and asked again
                self.screen.notify(describe_error(exc), title="Not a repository",
                                   severity="error")
        return None

    @screen_work(thread=True, group="actions", description="launching")
    def _submit(self, fleet: Fleet, request: LaunchRequest) -> None:
        tasks = fleet.submit(request.spec, copies=request.copies, base=request.base)
        self.screen.post_message(TasksSubmitted(tasks))

    def merge(self) -> None:
        targets = self.screen.task_list.targets()
        if targets:
            self._merge_flow(self.screen.engine(), [t.id for t in targets])

    @screen_work(exclusive=True, group="dialog", description="previewing the merge")
    async def _merge_flow(self, fleet: Fleet, task_ids: list[str]) -> None:
        """The conflict preview (in a thread), the merge dialog, then the merge. Several
        tasks (marked) land through the merge queue, in the list's order."""
        from fleet_tui.ui.screens.modals import MergeScreen

        items, test_command = await asyncio.to_thread(merge_items, fleet, task_ids)
        if self.screen.closing:
            return
        queue = len(task_ids) > 1
        answer = await self.screen.app.push_screen_wait(MergeScreen(items, test_command,
                                                                    queue=queue))
        if answer is None or not answer.task_ids:
            return
        chosen = list(answer.task_ids)
        if queue:
            left_out = [(i.task_id, i.problem) for i in items if not i.landable]
            self._enqueue(fleet, chosen, left_out)
        else:
            # each task's own test gate (tasks of several repositories may differ)
            self._merge(fleet, chosen, answer.message, None)

    @screen_work(thread=True, group="actions", description="queuing to land")
    def _enqueue(self, fleet: Fleet, task_ids: list[str],
                 left_out: list[tuple[str, str]] | None = None) -> None:
        """Queue ``task_ids``; ``left_out``: (task, why) of the marked tasks the dialog
        showed as unable to land, named in the toast (they stay marked)."""
        tasks = fleet.enqueue(task_ids)
        text = (f"{', '.join(t.id for t in tasks)} land one at a time, in this order (Q "
                "shows the queue)")
        title = f"Queued {len(tasks)} tasks to land"
        if left_out:
            text += "\nLeft out (still marked): " + "; ".join(
                f"{task_id}: {why}" for task_id, why in left_out)
            title = f"Queued {len(tasks)} of {len(tasks) + len(left_out)} tasks to land"
        self.screen.post_message(ActionDone(
            text, title=title, task_ids=task_ids,
            severity="warning" if left_out else "information"))

    @screen_work(thread=True, group="actions", description="merging")
    def _merge(self, fleet: Fleet, task_ids: list[str], message: str | None,
               test_command: str | None) -> None:
        if len(task_ids) > 1:
            def merge_one(task_id: str) -> str | None:
                result = fleet.merge(task_id, message=message, test_command=test_command)
                if result.merged:
                    return None
                return result.message + (
                    f" (conflicts: {', '.join(result.conflicts)})" if result.conflicts else "")

            self.screen.post_message(_each(task_ids, merge_one, "merged", "Merged"))
            return
        for task_id in task_ids:
            result = fleet.merge(task_id, message=message, test_command=test_command)
            if result.merged:
                self.screen.post_message(ActionDone(
                    result.message or f"commit {(result.commit or '')[:10]}",
                    title=f"{task_id} merged", task_ids=[task_id],
                    details=result.test_output if result.test_output else None))
            else:
                detail = result.message
                if result.conflicts:
                    detail += "\nConflicts: " + ", ".join(result.conflicts)
                if result.test_output:
                    detail += "\n\nTest output:\n" + result.test_output
                self.screen.post_message(ActionDone(detail, title=f"{task_id} not merged",
                                                    severity="error", details=detail,
                                                    task_ids=[task_id]))

    def discard(self) -> None:
        targets = self.screen.task_list.targets()
        if targets:
            self._confirm_each(self.screen.engine(), Action.DISCARD, targets)

    def kill(self) -> None:
        targets = self.screen.task_list.targets()
        if targets:
            self._confirm_each(self.screen.engine(), Action.KILL, targets)

    @screen_work(exclusive=True, group="dialog", description="asking first")
    async def _confirm_each(self, fleet: Fleet, action: Action, targets: list[Task]) -> None:
        """Discard and kill: ask (y / n / escape), then do it to every target."""
        from fleet_tui.ui.screens.modals import ConfirmScreen

        title, body, yes, word = confirm_text(action, targets)
        if await self.screen.app.push_screen_wait(ConfirmScreen(title, body, yes=yes)):
            self._engine_each(fleet, action.value, [t.id for t in targets], word)

    def retry(self) -> None:
        targets = self.screen.task_list.targets()
        if targets:
            self._retry_flow(self.screen.engine(), targets)

    @screen_work(exclusive=True, group="dialog", description="asking first")
    async def _retry_flow(self, fleet: Fleet, targets: list[Task]) -> None:
        from fleet_tui.ui.screens.modals import ChoiceScreen

        can_resume = all(t.session_id for t in targets)
        choices = [("f", "fresh", "Fresh run")]
        if can_resume:
            choices.append(("r", "resume", "Resume session"))
        body = ("A fresh run starts over from the prompt; the worktree is reset to its "
                "base first (its changes are dropped)."
                + ("\nResume continues the last session, changes and history kept."
                   if can_resume
                   else "\n(No session to resume.)"))
        title = (f"Retry {targets[0].id}" if len(targets) == 1
                 else f"Retry {len(targets)} tasks?")
        if len(targets) > 1:
            body = "\n".join(f"  {t.id}  {t.short_title}  ({t.state})"
                             for t in targets) + "\n\n" + body
        choice = await self.screen.app.push_screen_wait(ChoiceScreen(title, body, choices))
        if choice:
            self._retry(fleet, [t.id for t in targets], choice == "resume")

    @screen_work(thread=True, group="actions", description="retrying")
    def _retry(self, fleet: Fleet, task_ids: list[str], resume: bool) -> None:
        if len(task_ids) > 1:
            def retry_one(task_id: str) -> None:
                fleet.retry(task_id, resume=resume)

            self.screen.post_message(_each(task_ids, retry_one, "queued again",
                                           "Queued", again=" again"))
            return
        for task_id in task_ids:
            fleet.retry(task_id, resume=resume)
            self.screen.post_message(ActionDone(
                "queued again" + (" (resume)" if resume else ""), title=f"{task_id} retry",
                task_ids=[task_id]))

    def follow_up(self) -> None:
        task = self.screen.task_list.cursor_task
        if task is not None:
            self._follow_up_flow(self.screen.engine(), task)

    @screen_work(exclusive=True, group="dialog", description="asking first")
    async def _follow_up_flow(self, fleet: Fleet, task: Task) -> None:
        from fleet_tui.ui.screens.modals import PromptScreen

        prompt = await self.screen.app.push_screen_wait(PromptScreen(
            f"Follow-up for {task.id}: {task.short_title}",
            "Continues the task's session with this prompt, in the same worktree."))
        if prompt:
            self._follow_up(fleet, task.id, prompt)

    @screen_work(thread=True, group="actions", description="following up")
    def _follow_up(self, fleet: Fleet, task_id: str, prompt: str) -> None:
        fleet.follow_up(task_id, prompt)
        self.screen.post_message(ActionDone("follow-up queued", title=task_id,
                                            task_ids=[task_id]))

    def say(self) -> None:
        task = self.screen.task_list.cursor_task
        if task is not None:
            self._say_flow(self.screen.engine(), task)

    @screen_work(exclusive=True, group="dialog", description="asking first")
    async def _say_flow(self, fleet: Fleet, task: Task) -> None:
        from fleet_tui.ui.screens.modals import PromptScreen

        text = await self.screen.app.push_screen_wait(PromptScreen(
            f"Message to {task.id}: {task.short_title}",
            "The running worker gets it as your next message: it joins the turn the "
            "worker is in, or starts its next one (a follow-up, if the worker has "
            "finished by then). The stream shows it when the worker takes it in."))
        if text:
            self._say(fleet, task.id, text)

    @screen_work(thread=True, group="actions", description="sending the message")
    def _say(self, fleet: Fleet, task_id: str, text: str) -> None:
        from fleet_tui.core.errors import WorkerFinished

        try:
            taken = fleet.say(task_id, text)
        except WorkerFinished:
            # The worker ended its turn while the message was written: its session takes
            # the text as a follow-up, once this panel's scheduler has recorded the end.
            if not settle_for_follow_up(fleet, task_id, SAY_SETTLE):
                raise
            fleet.follow_up(task_id, text)
            self.screen.app.call_from_thread(
                self.screen.notify, "its worker had finished: sent as a follow-up to "
                "the same session", title=f"{task_id}: message sent")
            return
        self.screen.app.call_from_thread(
            self.screen.notify, "taken by the worker" if taken else
            "waiting for the worker to take it in", title=f"{task_id}: message sent")

    @screen_work(thread=True, group="actions", description="engine call")
    def _engine_each(self, fleet: Fleet, method: str, task_ids: list[str], word: str) -> None:
        call: Callable[[str], Any] = getattr(fleet, method)
        if len(task_ids) > 1:
            def one(task_id: str) -> None:
                call(task_id)

            self.screen.post_message(_each(task_ids, one, word, word.capitalize()))
            return
        for task_id in task_ids:
            call(task_id)
            self.screen.post_message(ActionDone(word, title=task_id, task_ids=[task_id]))

    def action_done(self, message: ActionDone) -> None:
        """An engine action ended: say how (a failure with details in a dialog), and read
        the list and the stream again."""
        screen = self.screen
        screen.task_list.keep_row_of(message.task_ids)
        if message.details and message.severity == "error":
            from fleet_tui.ui.screens.modals import MessageScreen

            screen.app.push_screen(MessageScreen(message.title, message.details))
            screen.app.bell()
        else:
            screen.notify(message.text, title=message.title,
                          severity=message.severity)  # type: ignore[arg-type]
        screen.stream.reread()
        screen.task_list.poll()

    # --- landing ---------------------------------------------------------------------------
    def update(self) -> None:
        task = self.screen.task_list.cursor_task
        if task is not None:
            self._update_flow(self.screen.engine(), task.id)

    @screen_work(exclusive=True, group="dialog", description="updating from the base branch")
    async def _update_flow(self, fleet: Fleet, task_id: str) -> None:
        """Update from base; on conflicts ask: the worker, a shell, or abort."""
        from fleet_tui.ui.screens.modals import ChoiceScreen, MessageScreen

        screen = self.screen
        result = await asyncio.to_thread(fleet.update, task_id)
        for _ in range(3):  # a shell may leave it conflicted: ask again, a few times
            if screen.closing:
                return
            if result.status == "refused":
                screen.app.push_screen(MessageScreen(f"{task_id} not updated", result.message))
                screen.app.bell()
                return
            if result.status != "conflicts":
                screen.notify(result.message, title=f"{task_id} up to date")
                self._after_landing_action(task_id)
                return
            files = "\n".join(f"• {path}" for path in result.conflicts)
            # in a browser a shell would open on the server: not offered, and said
            shell_line = ("(no shell here: the panel is in a browser)" if screen.served
                          else "o: a shell in the worktree")
            body = (f"{result.message}\n\nConflicted files:\n{files}\n\n"
                    "w: a follow-up asks the worker to resolve them, keep the tests passing "
                    f"and commit (its stream shows the work)\n{shell_line}\n"
                    "a: abort: the worktree goes back exactly as it was")
            choices = [("w", "worker", "Worker resolves"), ("o", "shell", "Shell"),
                       ("a", "abort", "Abort update")]
            if screen.served:
                choices = [c for c in choices if c[1] != "shell"]
            choice = await screen.app.push_screen_wait(ChoiceScreen(
                f"Update of {task_id} stopped on conflicts", body, choices))
            if choice is None:
                screen.notify("Left mid-merge; u again to choose.", title=task_id,
                              severity="warning")
                self._after_landing_action(task_id)
                return
            if choice == "worker":
                await asyncio.to_thread(fleet.resolve_update, task_id, "worker")
                screen.notify(f"Sent to its worker: resolve {', '.join(result.conflicts)}.",
                              title=f"{task_id} follow-up queued")
                screen.detail.show_tab("tab-stream")
                self._after_landing_action(task_id)
                return
            if choice == "abort":
                task = await asyncio.to_thread(fleet.resolve_update, task_id, "abort")
                screen.notify(task.message or "aborted", title=f"{task_id} update aborted")
                self._after_landing_action(task_id)
                return
            listed = screen.task_list.tasks.get(task_id)
            worktree = listed.worktree if listed is not None else None
            if worktree is None or listed is None:
                return
            if fleet.worktree_here(listed) is None:
                screen.notify(fleet.elsewhere(listed), severity="warning", markup=False)
                return
            shell = os.environ.get("SHELL") or "/bin/sh"
            run_external(screen.app, [shell], worktree,
                         f"resolve the conflicts in {worktree}, `git add` them, then exit")
            result = await asyncio.to_thread(fleet.update, task_id)

    def _after_landing_action(self, task_id: str) -> None:
        if task_id == self.screen.task_list.selected_id:
            self.screen.detail.reload()
        self.screen.task_list.poll()

    def compare(self) -> None:
        task = self.screen.task_list.cursor_task
        if task is not None:
            self._compare_flow(self.screen.engine(), task.id)

    @screen_work(exclusive=True, group="dialog", description="comparing the copies")
    async def _compare_flow(self, fleet: Fleet, task_id: str) -> None:
        from fleet_tui.ui.screens.landing import CompareScreen

        title, rows = await asyncio.to_thread(compare_rows, fleet, task_id)
        if self.screen.closing:
            return
        answer = await self.screen.app.push_screen_wait(CompareScreen(title, rows, task_id))
        if answer is None:
            return
        what, chosen = answer
        if what == "select":
            if self.screen.table.select_key(chosen):
                self.screen.task_list.select(chosen)
                self.screen.detail.show_tab("tab-diff")
            return
        await self._pick(fleet, chosen)

    def pick(self) -> None:
        task = self.screen.task_list.cursor_task
        if task is not None:
            self._pick_flow(self.screen.engine(), task.id)

    @screen_work(exclusive=True, group="dialog", description="picking a copy")
    async def _pick_flow(self, fleet: Fleet, task_id: str) -> None:
        await self._pick(fleet, task_id)

    async def _pick(self, fleet: Fleet, task_id: str) -> None:
        """Ask once, then land the copy through the queue and discard its siblings."""
        from fleet_tui.ui.screens.modals import ConfirmScreen

        copies = await asyncio.to_thread(fleet.copies, task_id)
        siblings = [t for t in copies if t.id != task_id and t.state not in CLOSED_STATES]
        chosen = next((t for t in copies if t.id == task_id), None)
        if chosen is None or self.screen.closing:
            return
        names = "\n".join(f"  {t.id}  {t.short_title}  ({t.state})" for t in siblings)
        body = (f"Land {chosen.id} ({chosen.short_title}) through the merge queue, and "
                f"discard its other copies (their worktrees and branches):\n"
                f"{names or '  (none left)'}")
        # review comments not dealt with ask first, as the merge dialog does
        open_comments = await asyncio.to_thread(_open_comments, fleet, task_id)
        if open_comments:
            them = "them" if open_comments > 1 else "it"
            body += (f"\n\n{open_comments_words(open_comments)}: the worker has not dealt "
                     f"with {them} yet (R lists {them}, ctrl+r sends {them}). Land it "
                     "anyway?")
        if not await self.screen.app.push_screen_wait(ConfirmScreen(
                f"Pick {chosen.id}?", body,
                yes="Pick anyway" if open_comments else "Pick")):
            return
        self._pick_now(fleet, task_id)

    @screen_work(thread=True, group="actions", description="picking a copy")
    def _pick_now(self, fleet: Fleet, task_id: str) -> None:
        queued, discarded = fleet.pick(task_id)
        gone = f"; discarded {', '.join(discarded)}" if discarded else ""
        self.screen.post_message(ActionDone(f"queued to land ({queued.land_state}){gone}",
                                            title=f"{task_id} picked",
                                            task_ids=[task_id, *discarded]))

    def push(self) -> None:
        task = self.screen.task_list.cursor_task
        if task is not None:
            self._push(self.screen.engine(), task.id)

    @screen_work(thread=True, group="actions", description="pushing")
    def _push(self, fleet: Fleet, task_id: str) -> None:
        result = fleet.push(task_id)
        details = None
        text = f"{result.remote}/{result.remote_branch} ({result.commit[:10]})"
        if result.hook_output is not None:
            details = f"{result.message}\n\npr_command said:\n{result.hook_output}"
            if not result.hook_passed:
                self.screen.post_message(ActionDone(
                    details, title=f"{task_id} pushed; pr_command failed", severity="error",
                    details=details, task_ids=[task_id]))
                return
        self.screen.post_message(ActionDone(text, title=f"{task_id} pushed", details=details,
                                            task_ids=[task_id]))

    def shell(self) -> None:
        """$SHELL in the cursor task's worktree (this machine's terminal)."""
        screen = self.screen
        if screen.served:  # its guard dims the key; a keymap or the palette may still ask
            screen.explain(IN_BROWSER_SHELL)
            return
        task = screen.task_list.cursor_task
        if task is None or task.worktree is None or screen.fleet is None:
            return
        if screen.fleet.worktree_here(task) is None:
            screen.notify(screen.fleet.elsewhere(task), severity="warning", markup=False)
            return
        shell = os.environ.get("SHELL") or "/bin/sh"
        run_external(screen.app, [shell], task.worktree,
                     f"shell in {task.worktree} (exit to come back)")

    def queue_view(self) -> None:
        from fleet_tui.ui.screens.landing import QueueScreen

        fleet = self.screen.engine()
        self.screen.app.push_screen(QueueScreen(partial(queue_rows, fleet, self.screen.repo)))


def _repository_at(text: str) -> tuple[Path, str]:
    """The main checkout of the repository at (or around) a path, and its branch; GitError
    when there is none."""
    from fleet_tui.vcs import git

    repo = git.main_worktree(Path(os.path.expanduser(text.strip())))
    return repo, git.current_branch(repo) or ""


def confirm_text(action: Action, targets: list[Task]) -> tuple[str, str, str, str]:
    """(title, body, yes button, past-tense word) of the confirm dialog of a discard or a
    kill of ``targets``."""
    many = f"{len(targets)} task{'s' if len(targets) > 1 else ''}"
    if action is Action.KILL:
        names = "\n".join(f"  {t.id}  {t.short_title}  ({t.state})" for t in targets)
        return (f"Kill {many}?", f"Stop these workers (their whole process group):\n{names}",
                "Kill", "killed")
    names = "\n".join(f"  {t.id}  {t.short_title}" for t in targets)
    body = (f"Delete the worktree and the branch of:\n{names}\n\n"
            "The work in them is lost. The logs stay.")
    live = [t.id for t in targets if t.state in ACTIVE_STATES | PENDING_STATES]
    if live:
        # the engine stops a running or queued task before it discards it
        body += (f"\n{live[0]} is still running or queued: it is stopped first."
                 if len(live) == 1 else
                 f"\n{', '.join(live)} are still running or queued: they are stopped first.")
    return f"Discard {many}?", body, "Discard", "discarded"


def settle_for_follow_up(fleet: Fleet, task_id: str, seconds: float) -> bool:
    """Wait (in a thread) for a task whose worker just ended its last turn to be recorded
    finished, so that its session takes a follow-up: True once it does, False when it does
    not within ``seconds`` (or it went another way)."""
    from fleet_tui.core.policy import why_not

    deadline = time.monotonic() + seconds
    while True:
        task = fleet.get_task(task_id)
        if why_not(task, Action.FOLLOW_UP) is None:
            return True
        if task.state not in ACTIVE_STATES or time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def merge_items(fleet: Fleet, task_ids: list[str]) -> tuple[list[MergeItem], str | None]:
    """What the merge dialog shows (the conflict preview of each task) and the test
    command that gates the merge. Runs in a thread: git work."""
    from fleet_tui.core.titles import commit_title
    from fleet_tui.ui.screens.modals import MergeItem

    items = []
    for task_id in task_ids:
        task: Task | None = None
        try:
            task = fleet.get_task(task_id)
            preview = fleet.conflict_preview(task_id)
        except Exception as exc:  # this task's row says why; the others go on
            problem = describe_error(exc)
            if task is None:
                items.append(MergeItem.unlandable(task_id, "", "", "", problem))
            else:
                items.append(MergeItem.unlandable(task.id, task.short_title, task.branch,
                                                  task.base_branch or "the base branch",
                                                  problem))
            continue
        try:  # counted from where the task stands against its base branch now
            added, deleted = fleet.diff_stat(task)
        except Exception:  # a worktree that cannot be read: the stored counts
            added, deleted = task.added_lines, task.deleted_lines
        open_comments = _open_comments(fleet, task.id)  # the dialog asks again
        items.append(MergeItem(task.id, task.short_title, task.branch,
                               task.base_branch or "the base branch", preview.clean,
                               list(preview.conflicts), preview.message, added, deleted,
                               message=commit_title(task.short_title),
                               open_comments=open_comments))
    # the repository's own test gate (.fleet-tui.toml), else the setting; read afresh
    # (for the first task that can land: a damaged row has no repository to ask)
    landable = [i.task_id for i in items if i.landable]
    command = fleet.test_command_for(landable[0]) if landable else None
    return items, command if isinstance(command, str) and command else None


def _open_comments(fleet: Fleet, task_id: str) -> int:
    """Review comments not dealt with (0 when they cannot be read: the question is a
    courtesy, the merge's own checks stand). Runs in a thread."""
    try:
        return fleet.open_comments(task_id)
    except Exception:
        return 0


def _each(task_ids: list[str], act: Callable[[str], str | None], word: str, verb: str,
          *, again: str = "") -> ActionDone:
    """Run ``act`` on every task of a bulk action, one failure not stopping the others,
    and say in one message how many it did: ``act`` returns None when it did it, or why
    not (or raises). ``task_ids`` of the message are the ones done (their marks go)."""
    done: list[str] = []
    failed: list[tuple[str, str]] = []
    for task_id in task_ids:
        try:
            why = act(task_id)
        except Exception as exc:  # reported below with the task's id; the others go on
            why = describe_error(exc)
        if why is None:
            done.append(task_id)
        else:
            failed.append((task_id, why))
    total = len(task_ids)
    if not failed:
        return ActionDone(", ".join(done), title=f"{verb} {total} tasks{again}",
                          task_ids=done)
    lines = [f"{verb} {len(done)} of {total} tasks{again}"
             + (f": {', '.join(done)}." if done else "."),
             f"Not {word} ({len(failed)}, still marked):"]
    lines += [f"  {task_id}: {why}" for task_id, why in failed]
    text = "\n".join(lines)
    return ActionDone(text, title=f"{verb} {len(done)} of {total} tasks{again}",
                      severity="error", details=text, task_ids=done)


def compare_rows(fleet: Fleet, task_id: str) -> tuple[str, list[CopyRow]]:
    """What the compare view shows: the copies' title and one row per copy (with its diff
    prepared for painting). Runs in a thread: git work."""
    from fleet_tui.core.titles import commit_title
    from fleet_tui.ui.formatting import PreparedDiff
    from fleet_tui.ui.screens.landing import CopyRow

    reports = fleet.compare(task_id)
    # best of N: ranked by evidence (gathered here when missing or stale), best first
    ranked = {r.task_id: r for r in fleet.rank(task_id)} if len(reports) > 1 else {}
    order = list(ranked)
    reports.sort(key=lambda r: order.index(r.task.id) if r.task.id in ranked else 0)
    rows = []
    for r in reports:
        rank = ranked.get(r.task.id)
        ev = rank.evidence if rank is not None else None
        # the result only: its duration is `compare`'s (a snapshot stays the same)
        tests = "-" if ev is None or ev.test is None else (
            "passed" if ev.test.passed else "FAILED")
        checks = f"{sum(c.passed for c in ev.checks)}/{len(ev.checks)}" \
            if ev is not None and ev.checks else "-"
        rows.append(CopyRow(
            r.task.id, r.task.short_title, str(r.task.state), r.task.verdict or "",
            r.task.turns, r.task.input_tokens + r.task.output_tokens, r.added, r.deleted,
            list(r.files), r.gate, r.merges, r.clean,
            PreparedDiff.build(r.diff) if r.diff is not None else None,
            place=rank.place if rank is not None else None,
            best=rank.best if rank is not None else False,
            reason=rank.reason if rank is not None else "", tests=tests, checks=checks))
    title = commit_title(reports[0].task.short_title) if reports else task_id
    return title, rows


def queue_rows(fleet: Fleet, repo: Path | None) -> list[QueueRow]:
    """The merge queue view's rows: the queue in landing order, then the tasks it stopped
    (they wait for the user). Runs in a thread: the store."""
    from fleet_tui.core.states import LandState
    from fleet_tui.ui.screens.landing import QueueRow

    fleet.resume_queues()  # a queue whose runner was killed gets one again
    queue = fleet.landing_queue(repo)
    stopped = [t for t in fleet.list_tasks(repo) if t.land_state == LandState.STOPPED
               and t.state not in CLOSED_STATES]
    return [QueueRow(t.id, t.short_title, t.land_state or "", t.land_note or "",
                     str(t.state), t.land_fixes) for t in [*queue, *stopped]]
