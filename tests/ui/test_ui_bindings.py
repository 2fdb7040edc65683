"""Each panel action's handler is declared by the one controller that answers it.

The records (ui/actions.py) make the bindings, the help and the palette; the controllers'
`bindings()` say what runs for each record's id; the screen's one action (`act`) runs it.
A record without a handler would be a dead key, a handler without a record a key that no
binding reaches, and two handlers for one id an ambiguity: all three are refused here.
"""

from __future__ import annotations

from functools import partial

from fleet_tui.ui.actions import ACTIONS, BY_ID, DISPATCH, find
from fleet_tui.ui.screens.main import MainScreen

# records whose handler is not a method of a controller named as the record says
NOT_BY_NAME = {"view.list": "the table's focus", "app.help": "the screen's open_help",
               "app.quit": "the app's quit"}


def test_every_record_has_exactly_one_handler() -> None:
    screen = MainScreen()
    parts = (screen.task_list, screen.task_actions, screen.detail, screen.review, screen)
    owners: dict[str, list[str]] = {}
    for part in parts:
        for action_id in part.bindings():
            owners.setdefault(action_id, []).append(type(part).__name__)
    assert sorted(owners) == sorted(a.id for a in ACTIONS)
    assert {i: o for i, o in owners.items() if len(o) != 1} == {}
    assert set(screen.handlers) == set(BY_ID)


def test_a_handler_is_the_method_its_record_names() -> None:
    screen = MainScreen()
    for record in ACTIONS:
        if record.id in NOT_BY_NAME:
            continue
        handler = screen.handlers[record.id]
        args: tuple[object, ...] = ()
        if isinstance(handler, partial):
            handler, args = handler.func, handler.args
        assert getattr(handler, "__name__", None) == record.name, record.id
        assert tuple(str(a) for a in args) == tuple(str(p) for p in record.params), record.id


def test_every_binding_runs_the_one_dispatch_with_its_id() -> None:
    for record in ACTIONS:
        binding = record.binding()
        assert binding.action == f"{DISPATCH}({record.id!r})"
        name, _, rest = binding.action.partition("(")
        assert find(name, (rest.rstrip(")").strip("'"),)) is record
    assert not [n for n in vars(MainScreen) if n.startswith("action_") and n != "action_act"]


def test_every_message_for_a_controller_has_exactly_one_taker() -> None:
    from fleet_tui.ui import messages

    screen = MainScreen()
    kinds = {m for m in vars(messages).values() if isinstance(m, type)
             and issubclass(m, messages.ForController) and m is not messages.ForController}
    takers: dict[type, int] = {}
    for part in (screen.task_list, screen.task_actions, screen.detail, screen.review):
        for kind in part.receives():
            takers[kind] = takers.get(kind, 0) + 1
    assert takers == dict.fromkeys(kinds, 1)
    assert set(screen.receivers) == kinds
