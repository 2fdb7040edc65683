"""The launch form: every new form starts from one copy, what it carries over is said
plainly, and the whole form works at 80x24.

No claude here: the scheduler is off, so a launch only queues tasks (the real engine, the
real store, a real git repository).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_ui_support import wait_until
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import Button, Input, TextArea

from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.ui.app import FleetApp
from fleet_tui.ui.screens.launch import FormValues, LaunchScreen


@pytest.fixture
def fleet(git_repo: Path) -> Fleet:
    return Fleet(load_settings())


def make_app(fleet: Fleet, repo: Path) -> FleetApp:
    return FleetApp(fleet, repo=repo, default_base="main", run_scheduler=False, bell=False,
                    poll_interval=0.1, diff_interval=60)


async def open_form(pilot: Pilot[Any], app: FleetApp) -> LaunchScreen:
    await pilot.press("n")
    await wait_until(pilot, lambda: isinstance(app.screen, LaunchScreen)
                     and bool(app.screen.query("#copies")), what="the form")
    screen = app.screen
    assert isinstance(screen, LaunchScreen)
    return screen


async def test_a_new_form_starts_from_one_copy(fleet: Fleet, git_repo: Path) -> None:
    app = make_app(fleet, git_repo)
    async with app.run_test(size=(120, 40)) as pilot:
        form = await open_form(pilot, app)
        form.query_one("#prompt", TextArea).text = "first batch"
        form.query_one("#copies", Input).value = "2"
        form.query_one("#timeout", Input).value = "30m"
        await pilot.pause()
        assert "Launch 2 copies" in str(form.query_one("#launch", Button).label)
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: len(fleet.list_tasks()) == 2, what="two copies")

        form = await open_form(pilot, app)
        assert form.query_one("#copies", Input).value == "1"
        assert str(form.query_one("#launch", Button).label).startswith("Launch  ")
        # what the form carries over from the last launch is said, not just pre-filled
        carried = str(form.query_one("#carried").render())
        assert "timeout 30m" in carried and "copies" not in carried
        form.query_one("#prompt", TextArea).text = "one more"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: len(fleet.list_tasks()) == 3, what="the third task")
        await pilot.pause(0.3)
        assert len(fleet.list_tasks()) == 3  # one task, not two more


async def test_nothing_carried_says_nothing(fleet: Fleet, git_repo: Path) -> None:
    app = make_app(fleet, git_repo)
    async with app.run_test(size=(120, 40)) as pilot:
        form = await open_form(pilot, app)
        assert not form.query_one("#carried").display


def _on_screen(app: FleetApp, widget: Widget) -> bool:
    """The widget's whole region is inside the terminal, and what is painted at its top
    left and bottom right corners is the widget (not a button bar or a border over it)."""
    region = widget.region
    if region.area <= 0 or not app.screen.region.contains_region(region):
        return False
    for x, y in ((region.x, region.y), (region.right - 1, region.bottom - 1)):
        found, _ = app.screen.get_widget_at(x, y)
        if found is not widget and widget not in found.ancestors:
            return False
    return True


async def test_every_field_and_the_launch_button_are_reachable_at_80x24(
        fleet: Fleet, git_repo: Path) -> None:
    app = make_app(fleet, git_repo)
    async with app.run_test(size=(80, 24)) as pilot:
        form = await open_form(pilot, app)
        launch = form.query_one("#launch", Button)
        # what the form will start is in sight before any scrolling: copies and Launch
        # (waited for: the layout may take some frames under load)
        await wait_until(pilot, lambda: _on_screen(app, form.query_one("#copies", Input)),
                         timeout=10, what="Copies on screen")
        await wait_until(pilot, lambda: _on_screen(app, launch), timeout=10,
                         what="Launch on screen")
        seen: list[str] = []
        for _ in range(20):
            focused = app.focused
            assert focused is not None
            # scrolling to the focused widget takes a frame or more
            await wait_until(pilot, lambda f=focused: _on_screen(app, f), timeout=10,
                             what=f"{focused.id} on screen")
            seen.append(focused.id or "")
            if focused is launch:
                break
            await pilot.press("tab")
        assert app.focused is launch, f"tab never reached Launch (went {seen})"
        for field in ("prompt", "title", "base-ref", "model", "permission-mode", "effort",
                      "max-turns", "timeout", "copies"):
            assert field in seen
        # the focused Launch button launches
        form.query_one("#prompt", TextArea).text = "from the keyboard"
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(fleet.list_tasks()) == 1, what="the launch")


async def test_with_remembered_values_the_form_still_fits_80x24(fleet: Fleet,
                                                                git_repo: Path) -> None:
    """The line naming the carried values costs a row; Copies and Launch stay in sight."""
    FormValues(model="small", max_turns="5", timeout="30m").save()
    app = make_app(fleet, git_repo)
    async with app.run_test(size=(80, 24)) as pilot:
        form = await open_form(pilot, app)
        carried = form.query_one("#carried")
        await wait_until(pilot, lambda: carried.display and _on_screen(app, carried),
                         timeout=10, what="the carried values on screen")
        assert "model small, max turns 5, timeout 30m" in str(carried.render())
        assert _on_screen(app, form.query_one("#copies", Input))
        assert _on_screen(app, form.query_one("#launch", Button))


def _burst(app: FleetApp, text: str, then: str) -> None:
    """Keys as a terminal delivers a paste or fast typing followed by a key: all posted to
    the app at once (the driver does the same with one read), none handled yet."""
    from textual import events

    for char in text:
        app.post_message(events.Key(char, char))
    app.post_message(events.Key(then, None))


async def test_ctrl_s_right_after_typing_submits_everything_typed(fleet: Fleet,
                                                                 git_repo: Path) -> None:
    """ctrl+s arriving in the same read as the text before it (seen in tmux: the say
    dialog's ctrl+s was lost, the minimal TextArea app read an empty text) submits the
    whole text: the form reads it once the text box has handled the keys before."""
    app = make_app(fleet, git_repo)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_form(pilot, app)
        _burst(app, "write the changelog", "ctrl+s")
        await wait_until(pilot, lambda: len(fleet.list_tasks()) == 1, what="the task")
        assert fleet.list_tasks()[0].prompt == "write the changelog"


async def test_a_prompt_dialog_sends_everything_typed_before_ctrl_s(fleet: Fleet,
                                                                   git_repo: Path) -> None:
    """The follow-up and say dialogs: the same burst sends the whole message."""
    from fleet_tui.ui.screens.modals import PromptScreen

    app = make_app(fleet, git_repo)
    got: list[str | None] = []
    async with app.run_test(size=(120, 40)) as pilot:
        app.push_screen(PromptScreen("Message to x"), got.append)
        await wait_until(pilot, lambda: isinstance(app.screen, PromptScreen)
                         and any(box.has_focus for box in app.screen.query(TextArea)),
                         what="the dialog")
        _burst(app, "use the helper instead", "ctrl+s")
        await wait_until(pilot, lambda: bool(got), what="the answer")
        assert got == ["use the helper instead"]


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_a_choice_of_four_buttons_shows_them_all(fleet: Fleet, git_repo: Path,
                                                       size: tuple[int, int]) -> None:
    """The update's conflict choice (three answers and Cancel): every button lies whole
    inside the dialog (the 64-column dialog cut Cancel off)."""
    from fleet_tui.ui.screens.modals import ChoiceScreen

    app = make_app(fleet, git_repo)
    async with app.run_test(size=size) as pilot:
        app.push_screen(ChoiceScreen("Update stopped", "body", [
            ("w", "worker", "Worker resolves"), ("o", "shell", "Shell"),
            ("a", "abort", "Abort update")]))
        await wait_until(pilot, lambda: isinstance(app.screen, ChoiceScreen)
                         and len(app.screen.query(Button)) == 4, what="the dialog")
        await pilot.pause()
        dialog = app.screen.query_one(".dialog").content_region
        for button in app.screen.query(Button):
            assert dialog.contains_region(button.region), (str(button.label), dialog,
                                                           button.region)


async def test_at_80x24_the_form_says_there_is_more_below(fleet: Fleet,
                                                          git_repo: Path) -> None:
    """Effort, max turns and timeout are below the fold at 80x24: the buttons' row says
    so until they are scrolled into view; at 160x48 everything fits and it says nothing."""
    from textual.containers import VerticalScroll
    from textual.widgets import Label

    app = make_app(fleet, git_repo)
    async with app.run_test(size=(80, 24)) as pilot:
        form = await open_form(pilot, app)
        hint = form.query_one("#more-below", Label)
        fields = form.query_one("#launch-fields", VerticalScroll)
        await wait_until(pilot, lambda: "more below" in str(hint.render()),
                         timeout=10, what="the hint")
        assert _on_screen(app, hint) and fields.max_scroll_y > 0
        form.query_one("#timeout", Input).focus()  # tab's way down: scrolled into view
        await wait_until(pilot, lambda: str(hint.render()) == "", timeout=10,
                         what="the hint gone at the bottom")
    app = make_app(fleet, git_repo)
    async with app.run_test(size=(160, 48)) as pilot:
        form = await open_form(pilot, app)
        hint = form.query_one("#more-below", Label)
        await wait_until(pilot, lambda: form.query_one("#timeout", Input).region.height > 0,
                         timeout=10, what="the form laid out")
        form._say_more_below()  # the check itself, on the settled layout: nothing below
        assert str(hint.render()) == ""
