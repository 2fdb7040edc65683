"""The header line: running / queued / cap, an endpoint cooldown counting down, tokens."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from fleet_tui.ui.formatting import human_duration, human_tokens

TYPE_CHECKING = False
if TYPE_CHECKING:
    from fleet_tui.fleet import FleetStatus


class StatusLine(Static):
    """One line; its parts are styled from component classes (theme colours)."""

    COMPONENT_CLASSES = {"status--name", "status--running", "status--cooldown",
                         "status--muted", "status--marked"}
    DEFAULT_CSS = """
    StatusLine {
        height: 1;
        background: $panel;
        color: $foreground;
        padding: 0 1;
        & > .status--name { color: $accent; text-style: bold; }
        & > .status--running { color: $text-primary; text-style: bold; }
        & > .status--cooldown { color: $text-warning; background: $warning-muted;
                                text-style: bold; }
        & > .status--muted { color: $text-muted; }
        & > .status--marked { color: $accent; text-style: bold; }
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id, markup=False)
        self.repo_name = ""
        self.status: FleetStatus | None = None
        self.scheduler = True
        self.marked = 0  # how many tasks are marked (the bulk actions act on them)
        self.view_note = ""  # how the list is shown: its order, the closed tasks it hides
        self._shown: str | None = None

    def show(self, status: FleetStatus | None, now: float) -> None:
        self.status = status
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append("fleet-tui", style=self.get_component_rich_style("status--name"))
        if status is not None:
            text.append("   ")
            text.append(f"▶ {status.running} running",
                        style=self.get_component_rich_style("status--running"))
            text.append(f" · {status.queued} queued")
            if status.waiting:
                text.append(f" · {status.waiting} waiting")
            text.append(f" · cap {status.cap}")
            if status.cooldown_until is not None and status.cooldown_until > now:
                text.append("  ")
                text.append(f" cooldown {human_duration(status.cooldown_until - now)} ",
                            style=self.get_component_rich_style("status--cooldown"))
        if self.marked:  # before the tokens: at 80 columns the end of the line is cut
            text.append(f"   ● {self.marked} marked",
                        style=self.get_component_rich_style("status--marked"))
        if status is not None:
            text.append(f"   Σ {human_tokens(status.total_tokens)} tokens",
                        style=self.get_component_rich_style("status--muted"))
        if self.repo_name:
            text.append(f"   {self.repo_name}", style=self.get_component_rich_style(
                "status--muted"))
        if self.view_note:
            text.append(f"   {self.view_note}", style=self.get_component_rich_style(
                "status--muted"))
        if not self.scheduler:
            text.append("   (not starting tasks)",
                        style=self.get_component_rich_style("status--muted"))
        if text.plain != self._shown:
            self._shown = text.plain
            self.update(text)
