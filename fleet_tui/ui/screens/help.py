"""`?`: every key of the panel, grouped, generated from the action records (ui/actions.py)
with the keys a keymap set, so it never lies."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from fleet_tui.ui.screens import DIALOG_CSS

HelpSection = tuple[str, list[tuple[str, str]]]


class HelpScreen(ModalScreen[None]):
    """A scrollable list of keys; any of escape, q or ? closes it."""

    CSS_PATH = DIALOG_CSS
    AUTO_FOCUS = "#help-scroll"

    BINDINGS = [
        Binding("escape,q,question_mark", "close", "Close", id="help.close"),
    ]

    def __init__(self, sections: list[HelpSection]) -> None:
        super().__init__(classes="modal")
        self.sections = sections

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="help-dialog"):
            yield Label("fleet-tui keys", classes="dialog-title")
            with VerticalScroll(id="help-scroll"):
                for title, keys in self.sections:
                    yield Label(title, classes="help-section")
                    table = Table.grid(padding=(0, 2))
                    table.add_column(min_width=12, style="bold")
                    table.add_column()
                    for key, description in keys:
                        table.add_row(Text(key), Text(description))
                    yield Static(table, classes="help-keys")
            yield Label("escape / q / ? close", classes="dialog-hint")

    def action_close(self) -> None:
        self.dismiss(None)
