"""Review comments in the panel: `C` comments on the diff's cursor line (or a
selected range), `R` lists the selected task's comments (edit, delete, send), `ctrl+r`
sends the review. The rules and the sending are the engine's (engine/review.py); the diff
view says which lines are under the cursor and shows the comments under their lines."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from fleet_tui.ui.controllers import Controller, Handlers, screen_work
from fleet_tui.ui.controllers.task_actions import SAY_SETTLE, settle_for_follow_up

if TYPE_CHECKING:
    from fleet_tui.core.model import Task
    from fleet_tui.core.review import Anchor
    from fleet_tui.engine.fleet import Fleet


class ReviewController(Controller):
    """The review keys and their dialogs."""

    def bindings(self) -> Handlers:
        return {"review.comment": self.comment, "review.list": self.review,
                "review.send": self.send_review}

    def comment(self) -> None:
        task = self.screen.task_list.selected
        view = self.screen.diff.view
        if task is None or view is None:
            return
        rows = view.lines_at_cursor()
        if not rows:
            self.screen.notify("Put the cursor on a line of the diff (↑↓; shift+↑↓ for a "
                               "range), not on a file's header.", severity="warning")
            return
        from fleet_tui.core.review import anchor_of

        self._comment_flow(self.screen.engine(), task, anchor_of(rows))

    @screen_work(exclusive=True, group="dialog", description="commenting")
    async def _comment_flow(self, fleet: Fleet, task: Task, anchor: Anchor) -> None:
        from fleet_tui.ui.screens.modals import PromptScreen

        quote = "\n".join(anchor.quote[:8]) + (
            f"\n… {len(anchor.quote) - 8} more lines" if len(anchor.quote) > 8 else "")
        text = await self.screen.app.push_screen_wait(PromptScreen(
            f"Comment on {anchor.label}", quote, send="Comment",
            empty="Write the comment first."))
        if text:
            await asyncio.to_thread(fleet.add_comment, task.id, anchor, text)
            self.screen.notify(f"on {anchor.where}: R lists the comments, ctrl+r sends them",
                               title=f"{task.id}: comment added")
            self.screen.diff.reload()

    def review(self) -> None:
        task = self.screen.task_list.selected
        if task is not None:
            self._review_flow(self.screen.engine(), task)

    @screen_work(exclusive=True, group="dialog", description="the review")
    async def _review_flow(self, fleet: Fleet, task: Task) -> None:
        """The list, again after each edit or delete, until it is closed or sent."""
        from fleet_tui.ui.screens.modals import ConfirmScreen, PromptScreen
        from fleet_tui.ui.screens.review import ReviewScreen

        app = self.screen.app
        try:
            while not self.screen.closing:
                comments = await asyncio.to_thread(fleet.comments, task.id)
                answer = await app.push_screen_wait(ReviewScreen(task.id, task.short_title,
                                                                 comments))
                if answer is None:
                    return
                if answer.action == "send":
                    self.send_now(fleet, task.id)
                    return
                chosen = next(c for c in comments if c.id == answer.comment_id)
                if answer.action == "edit":
                    text = await app.push_screen_wait(PromptScreen(
                        f"Edit comment #{chosen.id} on {chosen.anchor.label}",
                        "\n".join(chosen.anchor.quote[:8]), text=chosen.body, send="Save",
                        empty="Write the comment first."))
                    if text:
                        await asyncio.to_thread(fleet.edit_comment, task.id, chosen.id, text)
                elif answer.action == "delete" and await app.push_screen_wait(ConfirmScreen(
                        f"Delete comment #{chosen.id}?", chosen.body, yes="Delete")):
                    await asyncio.to_thread(fleet.delete_comment, task.id, chosen.id)
        finally:
            self.screen.diff.reload()

    def send_review(self) -> None:
        task = self.screen.task_list.selected
        if task is not None:
            self.send_now(self.screen.engine(), task.id)

    @screen_work(thread=True, group="actions", description="sending the review")
    def send_now(self, fleet: Fleet, task_id: str) -> None:
        """Every comment not sent yet, as one message: to the running worker, or a
        follow-up (also when the worker ended its last turn meanwhile)."""
        from fleet_tui.core.errors import WorkerFinished

        try:
            sent = fleet.send_review(task_id)
        except WorkerFinished:
            if not settle_for_follow_up(fleet, task_id, SAY_SETTLE):
                raise
            sent = fleet.send_review(task_id)
        plural = "s" if sent.count != 1 else ""
        how = ("to the running worker" + ("" if sent.taken else " (it takes them in a "
                                                               "moment)")
               if sent.how == "say" else "as a follow-up in the same session")
        app = self.screen.app
        app.call_from_thread(self.screen.notify, f"{sent.count} comment{plural} {how}",
                             title=f"{task_id}: review sent")
        app.call_from_thread(self.screen.diff.reload)
        app.call_from_thread(self.screen.task_list.poll)
