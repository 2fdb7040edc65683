"""Every dialog opens with the focus where it stays: on the widget its keys are for, from
the moment it is composed. A dialog that focused its widget from ``on_mount`` (a
``focus()``, which waits for the app's queue) had Textual's default focus meanwhile, the
first focusable widget: the discard confirm's Yes (an `enter` typed right after `d`
discarded), the launch form's scrolling fields (a prompt typed right after `n` went
nowhere), the merge dialog's preview. The focus it takes is recorded from the start.

No engine here: each dialog on a bare app.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_ui_support import wait_for_screen
from textual.app import App
from textual.screen import Screen
from textual.widget import Widget

from fleet_tui.ui.screens.help import HelpScreen
from fleet_tui.ui.screens.landing import CompareScreen, CopyRow, QueueScreen
from fleet_tui.ui.screens.launch import LaunchScreen
from fleet_tui.ui.screens.modals import (
    AttemptScreen,
    ChoiceScreen,
    ConfirmScreen,
    MergeItem,
    MergeScreen,
    MessageScreen,
    PromptScreen,
    RepoScreen,
    ToolCallScreen,
)

CLEAN = MergeItem("t1", "Add a file", "fleet/t1", "main", True, [], "", 1, 0,
                  message="Add a file")
CONFLICTED = MergeItem("t2", "Edit a file", "fleet/t2", "main", False, ["a.txt"], "", 1, 1,
                       message="Edit a file")

# (dialog, the id of the widget that must hold the focus from the start)
DIALOGS: dict[str, tuple[Callable[[Path], Screen[Any]], str]] = {
    "confirm": (lambda _: ConfirmScreen("Discard 1 task?", "gone"), "no"),
    "choice": (lambda _: ChoiceScreen("Retry", "how", [("f", "fresh", "Fresh run")]),
               "choice-fresh"),
    "prompt": (lambda _: PromptScreen("Follow-up", "hint"), "prompt-text"),
    "message": (lambda _: MessageScreen("Failed", "why"), "ok"),
    "merge": (lambda _: MergeScreen([CLEAN], None), "yes"),
    "merge-conflicted": (lambda _: MergeScreen([CONFLICTED], None), "no"),
    "attempts": (lambda _: AttemptScreen("Attempts", [(1, "one"), (2, "two")], 2),
                 "attempts"),
    "tool-call": (lambda _: ToolCallScreen("Bash", "exit 0", [("head", "ls")]),
                  "toolcall-lines"),
    "repo-recent": (lambda _: RepoScreen(["/src/shop"]), "repo-recent"),
    "repo-typed": (lambda _: RepoScreen([]), "repo-path"),
    "compare": (lambda _: CompareScreen("Own file", [
        CopyRow("t1", "Own file", "succeeded", "ok", 1, 10, 1, 0)], "t1"), "copies"),
    "queue": (lambda _: QueueScreen(lambda: []), "queue"),
    "launch": (lambda tmp: LaunchScreen(tmp, form_file=tmp / "form.json"), "prompt"),
    "help": (lambda _: HelpScreen([("Keys", [("q", "quit")])]), "help-scroll"),
}


def _name(widget: Widget | None) -> str:
    return "nothing" if widget is None else f"{type(widget).__name__}#{widget.id}"


@pytest.mark.parametrize("name", list(DIALOGS))
async def test_a_dialog_takes_its_focus_once_as_it_opens(name: str, tmp_path: Path) -> None:
    make, expected = DIALOGS[name]
    dialog = make(tmp_path)
    focused: list[str] = []
    set_focus = dialog.set_focus

    def recording(widget: Widget | None, *args: Any, **kwargs: Any) -> None:
        focused.append(_name(widget))
        set_focus(widget, *args, **kwargs)

    dialog.set_focus = recording  # type: ignore[method-assign]
    app: App[None] = App()
    async with app.run_test(size=(120, 40)) as pilot:
        app.push_screen(dialog)
        await wait_for_screen(pilot, type(dialog), what=name)
        # composed and mounted: the focus is in place, before any key is handled
        assert dialog.focused is not None and dialog.focused.id == expected, \
            _name(dialog.focused)
        await pilot.pause()  # a focus() asked for on mount would have landed by now
        assert focused == [_name(dialog.focused)]  # its first focus, and no other
