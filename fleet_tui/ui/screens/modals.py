"""Small modals: confirm, choice, follow-up prompt, error, merge review, attempt picker,
and the whole tool call (its input and output, scrollable and searchable).

Every modal answers to the keyboard alone: `y` / `n` / `escape` where it asks a question,
`ctrl+s` where it takes text. Text from agents or git is shown as plain Text, never markup.

Each names the widget that starts with the focus in ``AUTO_FOCUS``: the screen sets it as
it composes, before any key reaches it. A `focus()` in ``on_mount`` lands a moment later
(it goes through the app's queue), and until then Textual's default had focused the first
focusable widget: the confirm's Yes, where an `enter` typed just after `d` would discard.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Input, Label, OptionList, Static, TextArea
from textual.widgets.option_list import Option

from fleet_tui.ui.formatting import open_comments_words
from fleet_tui.ui.screens import DIALOG_CSS
from fleet_tui.ui.widgets.line_view import LineView, SearchBar, TextLines


def after_typed_keys(screen: Screen[Any], callback: Callable[[], object]) -> None:
    """Run `callback` once the focused widget has handled the keys that came before the one
    being handled. A submit key (ctrl+s, a priority binding) is handled by the screen as
    soon as it arrives, while the keys typed or pasted just before it, in the same read,
    may still wait in the text box's own queue: read right away, the text would miss
    them (the message sent empty, or cut short). The callback joins that queue instead."""
    focused = screen.focused
    (focused if focused is not None else screen).call_later(callback)


def keyed(label: str, key: str) -> Text:
    """A button label that names its key ("Merge  y"), as Text so nothing is markup."""
    return Text.assemble(label, "  ", (key, "bold"))


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question about a destructive action."""

    CSS_PATH = DIALOG_CSS
    AUTO_FOCUS = "#no"

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm.yes"),
        Binding("n", "answer(False)", "No", id="confirm.no"),
        Binding("escape", "answer(False)", "Cancel", id="confirm.cancel"),
    ]

    def __init__(self, title: str, body: str | Text, *, yes: str = "Yes",
                 danger: bool = True) -> None:
        super().__init__(classes="modal")
        self._title = title
        self._body = body
        self._yes = yes
        self._danger = danger

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self._title, classes="dialog-title", markup=False)
            body = self._body if isinstance(self._body, Text) else Text(self._body)
            yield Static(body, classes="dialog-body")
            with Horizontal(classes="dialog-buttons"):
                yield Button(keyed(self._yes, "y"), id="yes",
                             variant="error" if self._danger else "primary")
                yield Button(keyed("No", "n"), id="no")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class ChoiceScreen(ModalScreen[str | None]):
    """Pick one of a few answers by its key (retry: fresh or resume)."""

    CSS_PATH = DIALOG_CSS
    AUTO_FOCUS = "Button"  # the first answer

    BINDINGS = [Binding("escape", "dismiss_none", "Cancel", id="choice.cancel")]

    def __init__(self, title: str, body: str, choices: list[tuple[str, str, str]]) -> None:
        """choices: (key, value, label)."""
        super().__init__(classes="modal")
        self._title = title
        self._body = body
        self._choices = choices

    def _buttons_width(self) -> int:
        """Columns the button row takes: each label with its key, the button's own padding
        and border (2 + 2) and the margin before it (1)."""
        labels = [keyed(label, key) for key, _, label in self._choices]
        labels.append(keyed("Cancel", "esc"))
        return sum(max(text.cell_len + 4, 10) + 1 for text in labels)

    def compose(self) -> ComposeResult:
        # the plain dialog (64 columns, 60 inside) cuts off a row of four buttons
        wide = self._buttons_width() > 60
        with Vertical(classes="dialog wide" if wide else "dialog"):
            yield Label(self._title, classes="dialog-title", markup=False)
            yield Static(Text(self._body), classes="dialog-body")
            with Horizontal(classes="dialog-buttons"):
                for i, (key, value, label) in enumerate(self._choices):
                    yield Button(keyed(label, key), id=f"choice-{value}",
                                 variant="primary" if i == 0 else "default")
                yield Button(keyed("Cancel", "esc"), id="choice-cancel")

    def on_key(self, event: object) -> None:
        key = getattr(event, "key", None)
        for choice_key, value, _ in self._choices:
            if key == choice_key:
                getattr(event, "stop")()  # noqa: B009
                self.dismiss(value)
                return

    def action_dismiss_none(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        button_id = event.button.id or ""
        self.dismiss(None if button_id == "choice-cancel"
                     else button_id.removeprefix("choice-"))


class PromptScreen(ModalScreen[str | None]):
    """A multi-line prompt (the follow-up to a finished task)."""

    CSS_PATH = DIALOG_CSS
    AUTO_FOCUS = "#prompt-text"

    BINDINGS = [
        Binding("ctrl+s", "submit", "Send", id="prompt.submit", priority=True),
        Binding("escape", "cancel", "Cancel", id="prompt.cancel"),
    ]

    def __init__(self, title: str, hint: str = "", *, text: str = "", send: str = "Send",
                 empty: str = "Write a prompt first.") -> None:
        """``text``: what the box starts with (an edit); ``send``: the button's word;
        ``empty``: what is said when it is sent empty."""
        super().__init__(classes="modal")
        self._title = title
        self._hint = hint
        self._text = text
        self._send_word = send
        self._empty = empty

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label(self._title, classes="dialog-title", markup=False)
            if self._hint:
                yield Static(Text(self._hint), classes="dialog-hint")
            yield TextArea(self._text, id="prompt-text", soft_wrap=True,
                           show_line_numbers=False)
            yield Label("", id="prompt-error", classes="field-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button(keyed(self._send_word, "ctrl+s"), id="send", variant="primary")
                yield Button(keyed("Cancel", "esc"), id="cancel")

    def action_submit(self) -> None:
        after_typed_keys(self, self._submit)

    def _submit(self) -> None:
        text = self.query_one(TextArea).text.strip()
        if not text:
            self.query_one("#prompt-error", Label).update(self._empty)
            return
        self.dismiss(text)

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#send")
    def _send(self) -> None:
        self.action_submit()

    @on(Button.Pressed, "#cancel")
    def _cancel(self) -> None:
        self.dismiss(None)


class MessageScreen(ModalScreen[None]):
    """An error or a long result (test output) the user should read before going on."""

    CSS_PATH = DIALOG_CSS
    AUTO_FOCUS = "#ok"

    BINDINGS = [
        Binding("escape", "close", "Close", id="message.close"),
        Binding("enter", "close", "Close", show=False, id="message.enter"),
        Binding("q", "close", "Close", show=False, id="message.q"),
    ]

    def __init__(self, title: str, body: str, *, error: bool = True) -> None:
        super().__init__(classes="modal")
        self._title = title
        self._body = body
        self._error = error

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide" + (" error" if self._error else "")):
            yield Label(self._title, classes="dialog-title", markup=False)
            with VerticalScroll(classes="dialog-scroll"):
                yield Static(Text(self._body), classes="dialog-body")
            with Horizontal(classes="dialog-buttons"):
                yield Button(keyed("OK", "enter"), id="ok", variant="primary")

    def action_close(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#ok")
    def _ok(self) -> None:
        self.dismiss(None)


@dataclass(frozen=True)
class MergeItem:
    """What the merge modal shows for one task."""

    task_id: str
    title: str
    branch: str
    base_branch: str
    clean: bool
    conflicts: list[str]
    preview_message: str
    added: int
    deleted: int
    message: str = ""  # the default commit message (the title without a copy's "(1/2)")
    problem: str = ""  # why this task cannot land now (its preview failed); "" when it can
    open_comments: int = 0  # review comments not sent or not dealt with

    @property
    def landable(self) -> bool:
        return not self.problem

    @classmethod
    def unlandable(cls, task_id: str, title: str, branch: str, base_branch: str,
                   problem: str) -> MergeItem:
        """The row of a task whose preview failed: it says why, and nothing merges it."""
        return cls(task_id, title, branch, base_branch, False, [], "", 0, 0,
                   message=title, problem=problem)


@dataclass(frozen=True)
class MergeAnswer:
    message: str | None
    task_ids: tuple[str, ...] = ()  # what to land: the tasks shown that can, in order


class MergeScreen(ModalScreen[MergeAnswer | None]):
    """Confirm a merge: the conflict preview, the commit message, the test gate. With
    ``queue``: several tasks landed through the merge queue, in the order shown.

    The commit message box is one key away (`e`, or `tab`); while it has focus `y` and `n`
    are typed into it, never answered; `enter` there goes back to the buttons; its text is
    kept (not selected) so editing changes the default rather than wiping it."""

    CSS_PATH = DIALOG_CSS
    # a button, not the message box, so y / n answer at once: Merge, or No when it is
    # disabled (a disabled button cannot take the focus)
    AUTO_FOCUS = "#yes, #no"

    BINDINGS = [
        Binding("y", "merge", "Merge", id="merge.yes"),
        Binding("ctrl+s", "merge", "Merge", show=False, id="merge.submit", priority=True),
        Binding("n", "cancel", "No", id="merge.no"),
        Binding("escape", "cancel", "Cancel", id="merge.cancel"),
        Binding("e", "edit_message", "Edit message", id="merge.edit"),
    ]

    def __init__(self, items: list[MergeItem], test_command: str | None, *,
                 queue: bool = False) -> None:
        super().__init__(classes="modal")
        self._items = items
        self._test_command = test_command
        self._queue = queue

    @property
    def landable(self) -> list[MergeItem]:
        """The tasks the answer acts on: those whose preview did not fail."""
        return [i for i in self._items if i.landable]

    def compose(self) -> ComposeResult:
        single = len(self._items) == 1 and not self._queue
        total, can = len(self._items), len(self.landable)
        with Vertical(classes="dialog wide"):
            if self._queue and not can:
                title = f"None of the {total} marked tasks can land"
            elif self._queue and can < total:
                title = f"Land {can} of {total} marked tasks through the merge queue?"
            elif self._queue:
                title = (f"Land {len(self._items)} task{'s' if len(self._items) > 1 else ''}"
                         " through the merge queue?")
            elif single:
                title = f"Merge {self._items[0].branch} into {self._items[0].base_branch}?"
            else:
                title = f"Merge {len(self._items)} tasks?"
            yield Label(title, classes="dialog-title", markup=False)
            with VerticalScroll(classes="dialog-scroll"):
                if self._queue:
                    yield Static(Text(
                        "One at a time, in this order: each is brought up to date with its "
                        "base branch, tested in its worktree, then merged. A conflict or a "
                        "failing test goes back to its worker; the queue goes on. Q shows "
                        "the queue."), classes="dialog-hint")
                for item in self._items:
                    yield Static(self._preview(item), classes="merge-item",
                                 id=f"merge-item-{item.task_id}")
                if self._test_command:
                    yield Static(Text.assemble(("Test gate: ", "bold"), self._test_command,
                                               " runs in the worktree first; a failure "
                                               "stops the merge."), classes="dialog-hint")
                else:
                    yield Static(Text("No test command configured (test_command in "
                                      "config.toml): merging without a test gate."),
                                 classes="dialog-hint")
            if single and can:
                yield Label(Text.assemble("Commit message  ", ("e", "bold"),
                                          " to edit, enter when done"),
                            classes="field-label")
                item = self._items[0]
                yield Input(value=item.message or item.title, id="merge-message",
                            select_on_focus=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button(keyed("Queue" if self._queue else "Merge", "y"), id="yes",
                             variant="success", disabled=not self._can_merge())
                yield Button(keyed("No", "n"), id="no")

    def _can_merge(self) -> bool:
        """The queue brings each task up to date itself (conflicts go to its worker);
        a merge now needs every task to merge cleanly. A task whose preview failed is left
        out of the queue (its row says why); a queue of none is nothing to answer."""
        if self._queue:
            return bool(self.landable)
        return all(i.clean for i in self._items)

    def _preview(self, item: MergeItem) -> Text:
        text = Text()
        text.append(f"{item.task_id} ", style="bold")
        text.append(item.title)
        if item.problem:
            text.append("\n")
            text.append("✗ cannot land:", style="bold reverse")
            text.append(f" {item.problem}")
            return text
        text.append(f"   +{item.added} -{item.deleted}\n")
        if item.open_comments:
            text.append(f"! {open_comments_words(item.open_comments)}", style="bold")
            text.append(" (R lists them; merging asks first)\n")
        if item.clean:
            text.append("✔ merges cleanly", style="bold")
            if item.preview_message:
                text.append(f" — {item.preview_message}")
        else:
            text.append("✗ conflicts: ", style="bold reverse")
            text.append(", ".join(item.conflicts) or item.preview_message)
            if item.preview_message and item.conflicts:
                text.append(f"\n{item.preview_message}")
        return text

    def action_merge(self) -> None:
        after_typed_keys(self, self._merge_now)  # the message box may still hold keys

    def _merge_now(self) -> None:
        if self._queue and not self.landable:
            self.notify("None of these tasks can land now: each row says why.",
                        severity="warning")
            return
        if len(self._items) == 1 and not self.landable:
            self.notify(f"It cannot land now: {self._items[0].problem}", severity="warning")
            return
        if not self._can_merge():
            self.notify("It does not merge cleanly now: update it from its base first (u) "
                        "and resolve the conflicts, or mark it and land it through the "
                        "merge queue (m with marks).", severity="warning")
            return
        message: str | None = None
        boxes = self.query("#merge-message")
        if boxes:
            message = self.query_one("#merge-message", Input).value.strip() or None
        answer = MergeAnswer(message, tuple(i.task_id for i in self.landable))
        open_comments = sum(i.open_comments for i in self.landable)
        if not open_comments:
            self.dismiss(answer)
            return
        many = open_comments > 1
        self.app.push_screen(
            ConfirmScreen(open_comments_words(open_comments),
                          "The worker has not dealt with "
                          + ("them" if many else "it") + " yet (or "
                          + ("they were" if many else "it was") + " never sent: ctrl+r "
                          "sends the review). " + ("Land" if self._queue else "Merge")
                          + " anyway?", yes="Merge anyway" if not self._queue
                          else "Land anyway"),
            partial(self._after_comments_asked, answer))

    def _after_comments_asked(self, answer: MergeAnswer, yes: bool | None) -> None:
        if yes:
            self.dismiss(answer)

    def action_edit_message(self) -> None:
        """Put the focus in the commit message box, the cursor after its text."""
        boxes = self.query("#merge-message")
        if boxes:
            box = self.query_one("#merge-message", Input)
            box.focus()
            box.cursor_position = len(box.value)

    @on(Input.Submitted, "#merge-message")
    def _message_done(self) -> None:
        button = self.query_one("#yes", Button)
        (self.query_one("#no", Button) if button.disabled else button).focus()

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#yes")
    def _yes(self) -> None:
        self.action_merge()

    @on(Button.Pressed, "#no")
    def _no(self) -> None:
        self.dismiss(None)


class AttemptScreen(ModalScreen[int | None]):
    """Choose which attempt of a task the stream shows."""

    CSS_PATH = DIALOG_CSS
    AUTO_FOCUS = "#attempts"

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="attempt.cancel")]

    def __init__(self, title: str, attempts: list[tuple[int, str]], current: int) -> None:
        super().__init__(classes="modal")
        self._title = title
        self._attempts = attempts
        self._current = current

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self._title, classes="dialog-title", markup=False)
            yield OptionList(*[Option(Text(label), id=str(n)) for n, label in self._attempts],
                             id="attempts")

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        for index, (n, _) in enumerate(self._attempts):
            if n == self._current:
                options.highlighted = index

    @on(OptionList.OptionSelected)
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(int(event.option.id or "0"))

    def action_cancel(self) -> None:
        self.dismiss(None)


class ToolCallScreen(ModalScreen[None]):
    """One tool call whole: its input, its output and (Bash) its exit status, in a
    scrolling view that searches like the stream (`/`, `n` / `N`)."""

    CSS_PATH = DIALOG_CSS
    AUTO_FOCUS = "#toolcall-lines"

    BINDINGS = [
        Binding("escape", "close", "Close", id="toolcall.close"),
        Binding("q", "close", "Close", show=False, id="toolcall.q"),
    ]

    def __init__(self, title: str, status: str, rows: list[tuple[str, str]]) -> None:
        super().__init__(classes="modal")
        self._title = title
        self._status = status
        self._rows = rows

    def compose(self) -> ComposeResult:
        view = TextLines(self._rows, id="toolcall-lines")
        with Vertical(classes="dialog wide", id="toolcall-dialog"):
            yield Label(self._title, classes="dialog-title", markup=False)
            yield Label(self._status, id="toolcall-status", markup=False)
            yield view
            yield SearchBar(view, id="toolcall-search")
            yield Label(Text("↑ ↓ pgup pgdn: scroll · /: search · escape: close"),
                        classes="dialog-hint")

    @property
    def lines(self) -> list[str]:
        """The rows as plain text (tests)."""
        return self.query_one(TextLines).plain_lines()

    @on(LineView.SearchAsked)
    def _search_asked(self, event: LineView.SearchAsked) -> None:
        event.stop()
        self.query_one(SearchBar).open()

    @on(LineView.SearchMoved)
    def _search_moved(self, event: LineView.SearchMoved) -> None:
        event.stop()
        self.query_one(SearchBar).sync()

    def action_close(self) -> None:
        self.dismiss(None)


class RepoScreen(ModalScreen[str | None]):
    """Which repository a new task starts in (the panel was opened outside one): the
    recent ones, or a path typed."""

    CSS_PATH = DIALOG_CSS
    AUTO_FOCUS = "#repo-recent, #repo-path"  # the list when there is one

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="repo.cancel")]

    def __init__(self, recent: list[str]) -> None:
        super().__init__(classes="modal")
        self._recent = recent

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="repo-dialog"):
            yield Label("Which repository?", classes="dialog-title", markup=False)
            yield Static(Text("The panel was opened outside a git repository. Choose a "
                              "recent one (enter), or type the path of another."),
                         classes="dialog-hint")
            if self._recent:
                yield OptionList(*[Option(Text(path), id=path) for path in self._recent],
                                 id="repo-recent")
            yield Input(placeholder="a path: ~/src/shop", id="repo-path")
            yield Label(Text("enter: choose · tab: the list / the path · escape: cancel"),
                        classes="dialog-hint")

    @on(OptionList.OptionSelected)
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    @on(Input.Submitted, "#repo-path")
    def _typed(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)
