"""The header line: running / queued / cap (effective/configured when a concurrency limit
lowered it), an endpoint cooldown counting down, a park until a usage window resets or a
hold for an account problem or a day's budget, tokens, and what each endpoint spent today
(the gateway's meter; only when it spent some)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from fleet_tui.ui.formatting import human_cost, human_duration, human_tokens

TYPE_CHECKING = False
if TYPE_CHECKING:
    from fleet_tui.engine.fleet import FleetStatus


class StatusLine(Static):
    """One line; its parts are styled from component classes (theme colours)."""

    COMPONENT_CLASSES = {"status--name", "status--running", "status--cooldown",
                         "status--muted", "status--marked", "status--held"}
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
        & > .status--held { color: $text-error; background: $error-muted;
                            text-style: bold; }
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
            # the fleet's cap is every endpoint's; a lowered one takes its share off
            lowered = status.cap - sum(max(0, e.max_workers - e.cap) for e in status.endpoints)
            text.append(f" · cap {lowered}/{status.cap}" if lowered < status.cap
                        else f" · cap {status.cap}")
            if status.cooldown_until is not None and status.cooldown_until > now:
                text.append("  ")
                text.append(f" cooldown {human_duration(status.cooldown_until - now)} ",
                            style=self.get_component_rich_style("status--cooldown"))
            self._limits(text, status, now)
        if self.marked:  # before the tokens: at 80 columns the end of the line is cut
            text.append(f"   ● {self.marked} marked",
                        style=self.get_component_rich_style("status--marked"))
        if status is not None:
            text.append(f"   Σ {human_tokens(status.total_tokens)} tokens",
                        style=self.get_component_rich_style("status--muted"))
            if status.spent_today:
                spent = " · ".join(f"{name} {human_cost(amount)}" for name, amount
                                   in sorted(status.spent_today.items()))
                text.append(f"   today {spent}",
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

    def _limits(self, text: Text, status: FleetStatus, now: float) -> None:
        """An endpoint held (an account or key problem), or parked until a window's reset,
        or resuming its parked sessions: said where the counts are (before the tokens)."""
        for ep in status.endpoints:
            # a named endpoint's limits say whose they are (the default's as before)
            whose = "" if ep.endpoint == "default" else f"{ep.endpoint} "
            if ep.held is not None:
                text.append("  ")
                text.append(f" {whose}held: {ep.held_reason or ep.held} ",
                            style=self.get_component_rich_style("status--held"))
            elif ep.parked_until is not None and ep.parked_until > now:
                text.append("  ")
                text.append(f" {whose}{_park_text(ep.parked_until, ep.park_reason, now)} ",
                            style=self.get_component_rich_style("status--cooldown"))
            elif ep.parked_until is not None:
                text.append("  ")
                text.append(f" {whose}resuming parked sessions ",
                            style=self.get_component_rich_style("status--cooldown"))


def _park_text(until: float, reason: str | None, now: float) -> str:
    """policy.park_text, imported when first needed (the first frame has no endpoint)."""
    from fleet_tui.core.policy import park_text

    return park_text(until, reason, now)
