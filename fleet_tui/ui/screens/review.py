"""`R`: a task's review comments, each with its state, the lines it is on and
its text; `e` edits the highlighted one, `d` deletes it, `s` sends every comment not sent
yet to the worker as one message. The dialog answers what was asked (``ReviewAnswer``);
the controller does it and opens the list again."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, OptionList, Static
from textual.widgets.option_list import Option

from fleet_tui.ui.formatting import clean
from fleet_tui.ui.screens import DIALOG_CSS
from fleet_tui.ui.screens.modals import keyed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from fleet_tui.store.reviews import ReviewComment

STATE_STYLES = {"open": "bold", "addressed": "bold green", "outdated": "dim italic"}
QUOTED = 3  # lines of each comment's quote shown in the list


@dataclass(frozen=True)
class ReviewAnswer:
    action: str  # "edit", "delete" or "send"
    comment_id: int | None = None


class ReviewScreen(ModalScreen[ReviewAnswer | None]):
    """The list of a task's review comments."""

    CSS_PATH = DIALOG_CSS
    AUTO_FOCUS = "#review-list"

    BINDINGS = [
        Binding("e", "answer('edit')", "Edit", id="review.edit"),
        Binding("d", "answer('delete')", "Delete", id="review.delete"),
        Binding("s", "answer('send')", "Send", id="review.send"),
        Binding("escape,q", "close", "Close", id="review.close"),
    ]

    def __init__(self, task_id: str, title: str, comments: list[ReviewComment]) -> None:
        super().__init__(classes="modal")
        self.task_id = task_id
        self._title = title
        self.comments = comments

    @property
    def unsent(self) -> int:
        return sum(1 for c in self.comments if not c.sent)

    def compose(self) -> ComposeResult:
        counts = {s: sum(1 for c in self.comments if c.state == s)
                  for s in ("open", "addressed", "outdated")}
        summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no comments"
        with Vertical(classes="dialog wide", id="review-dialog"):
            yield Label(f"Review of {self.task_id}: {self._title}", classes="dialog-title",
                        markup=False)
            yield Static(Text(f"{summary}; {self.unsent} not sent. Open: not sent yet, or "
                              "the worker has not touched its lines. Addressed: it changed "
                              "them after it got the comment. Outdated: they changed "
                              "before it did."), classes="dialog-hint")
            options = [Option(self._label(c), id=str(c.id)) for c in self.comments]
            yield OptionList(*options, id="review-list")
            if not self.comments:
                yield Static(Text("C on a line of the diff comments on it (shift+↑↓ first "
                                  "for a range)."), classes="dialog-hint")
            with Horizontal(classes="dialog-buttons"):
                yield Button(keyed(f"Send {self.unsent}", "s"), id="review-send",
                             variant="primary", disabled=not self.unsent)
                yield Button(keyed("Edit", "e"), id="review-edit",
                             disabled=not self.comments)
                yield Button(keyed("Delete", "d"), id="review-delete",
                             disabled=not self.comments)
                yield Button(keyed("Close", "esc"), id="review-close")

    @staticmethod
    def _label(comment: ReviewComment) -> Text:
        text = Text(no_wrap=False)
        text.append(f"#{comment.id} ", style="bold")
        text.append(str(comment.state), style=STATE_STYLES.get(str(comment.state), ""))
        text.append(f" ({'sent' if comment.sent else 'not sent'})  ")
        text.append(clean(comment.anchor.label), style="bold")
        for line in comment.anchor.quote[:QUOTED]:
            text.append(f"\n  > {clean(line)}", style="dim")
        if len(comment.anchor.quote) > QUOTED:
            text.append(f"\n  > … {len(comment.anchor.quote) - QUOTED} more lines",
                        style="dim")
        for line in comment.body.splitlines():
            text.append(f"\n  {clean(line)}")
        return text

    @property
    def highlighted(self) -> int | None:
        """The id of the comment under the list's cursor."""
        listing = self.query_one("#review-list", OptionList)
        index = listing.highlighted
        if index is None or not self.comments:
            return None
        return int(listing.get_option_at_index(index).id or 0)

    def action_answer(self, action: str) -> None:
        if action == "send":
            if not self.unsent:
                self.notify("Every comment was sent already.", severity="warning")
                return
            self.dismiss(ReviewAnswer("send"))
            return
        chosen = self.highlighted
        if chosen is None:
            self.notify("No comment to " + action + ".", severity="warning")
            return
        self.dismiss(ReviewAnswer(action, chosen))

    def action_close(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        which = (event.button.id or "").removeprefix("review-")
        if which == "close":
            self.dismiss(None)
        else:
            self.action_answer(which)
