"""A keymap may name every binding the panel has, and nothing else: the ids it accepts are
the panel's actions and the app's own bindings, read from the app's BINDINGS (not a list
written beside them, which a new app binding would not be in)."""

from __future__ import annotations

import pytest
from textual.binding import Binding

from fleet_tui.ui.actions import ACTIONS, known_ids
from fleet_tui.ui.app import EngineMaker, FleetApp


def _never() -> EngineMaker:
    def make() -> object:
        raise AssertionError("the engine is not made: the app is never run here")
    return make  # type: ignore[return-value]


def test_the_apps_own_binding_can_be_rebound() -> None:
    app = FleetApp(_never(), keymap={"app.ctrl_q": "ctrl+w"})
    assert app.keymap == {"app.ctrl_q": "ctrl+w"}


def test_a_new_app_binding_is_known_without_listing_it_again() -> None:
    class WithHelp(FleetApp):
        BINDINGS = [*FleetApp.BINDINGS,
                    Binding("f1", "help", "Help", show=False, id="app.f1")]

    app = WithHelp(_never(), keymap={"app.f1": "f2"})
    assert app.keymap == {"app.f1": "f2"}
    with pytest.raises(ValueError, match=r"'app\.f1'"):  # the base app has no such binding
        FleetApp(_never(), keymap={"app.f1": "f2"})


def test_the_ids_are_the_actions_and_the_apps_bindings() -> None:
    ids = known_ids(FleetApp.BINDINGS)
    assert ids == [a.id for a in ACTIONS] + ["app.ctrl_q"]
    assert "app.ctrl_q" not in known_ids()  # nothing app-side is written into the list
