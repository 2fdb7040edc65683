"""One owner for each rule: a set of task states, a stop reason, an action's words are
written in states.py and read from there everywhere else.

The scans below read the source (AST, no import) and fail when a hand-written copy comes
back: a literal collection of task states, a state name inside an SQL string, a stop reason
compared or passed as a string, a second table of action verbs. Each scan is checked to
see what it is meant to see (`test_the_scans_see_a_copy`), so none of them passes by
seeing nothing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from fleet_tui.core import policy
from fleet_tui.core.states import STATES, VERBS, Action, Phase, StopReason, TaskState
from fleet_tui.store.db import Store, Task

PACKAGE = Path(__file__).resolve().parents[2] / "fleet_tui"
OWNER = PACKAGE / "core" / "states.py"
STATE_NAMES = frozenset(s.value for s in TaskState)
STOP_NAMES = frozenset(r.value for r in StopReason)

# collections of task states that are not a phase's set, each with why
ALLOWED_STATE_COLLECTIONS = {
    # the list's filter cycles through every state in the order of a task's life: an order,
    # not a set (states.py's `order` is the sort order of the list, a different one)
    ("ui/widgets/task_table.py", "LIFECYCLE"),
    # the detail title leaves out the message of a running or a queued task: a choice of
    # what that one line shows, not a phase (running is active, queued pending)
    ("ui/controllers/detail.py", "title message"),
}
# SQL text that may name a state: the schema's default (a migration's text is fixed)
ALLOWED_SQL = ("DEFAULT 'queued'",)


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p != OWNER)


def _state_member(node: ast.expr) -> bool:
    """`TaskState.X`, `TaskState.X.value` or the string of a state ("queued")."""
    if isinstance(node, ast.Attribute) and node.attr == "value":
        node = node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.value.id == "TaskState"
    return isinstance(node, ast.Constant) and node.value in STATE_NAMES


def state_collections(tree: ast.AST) -> list[int]:
    """Lines of literal tuples, lists and sets with two or more task states in them (the
    parameters of a query too: `(endpoint, TaskState.QUEUED.value, TaskState.WAITING.value)`)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List | ast.Set) and sum(
                _state_member(e) for e in node.elts) >= 2:
            found.append(node.lineno)
    return found


def sql_state_names(tree: ast.AST) -> list[int]:
    """Lines of string constants that quote a state name the way SQL does ('queued')."""
    pattern = re.compile(r"'(" + "|".join(sorted(STATE_NAMES)) + r")'")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            for allowed in ALLOWED_SQL:
                text = text.replace(allowed, "")
            if pattern.search(text) and re.search(r"\b(SELECT|UPDATE|WHERE|IN)\b", text):
                found.append(node.lineno)
    return found


STOP_CALLS = frozenset({"request_stop", "stop_now", "_record_kill"})


def stop_reason_strings(tree: ast.AST) -> list[int]:
    """Lines where a stop reason is a string: passed to a stop call, compared with
    something named like a reason, or tupled as `(reason, message)` for a stop."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = (node.func.attr if isinstance(node.func, ast.Attribute)
                    else node.func.id if isinstance(node.func, ast.Name) else "")
            if name in STOP_CALLS and any(isinstance(a, ast.Constant) and a.value in STOP_NAMES
                                          for a in node.args):
                found.append(node.lineno)
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = any("reason" in ast.unparse(s) for s in sides)
            consts = [c for s in sides for c in ast.walk(s)
                      if isinstance(c, ast.Constant) and c.value in STOP_NAMES]
            if named and consts:
                found.append(node.lineno)
        if isinstance(node, ast.keyword) and node.arg == "stop" and isinstance(
                node.value, ast.Tuple) and node.value.elts and isinstance(
                node.value.elts[0], ast.Constant) and node.value.elts[0].value in STOP_NAMES:
            found.append(node.value.lineno)
    return found


def verb_tables(tree: ast.AST) -> list[int]:
    """Lines of dict literals that map actions (`Action.X`) to strings."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and node.keys and all(
                isinstance(k, ast.Attribute) and isinstance(k.value, ast.Name)
                and k.value.id == "Action" for k in node.keys) and all(
                isinstance(v, ast.Constant) and isinstance(v.value, str) for v in node.values):
            found.append(node.lineno)
    return found


def _allowed_collection(path: Path, source: str, line: int) -> bool:
    rel = path.relative_to(PACKAGE).as_posix()
    text = source.splitlines()[line - 1]
    for where, mark in ALLOWED_STATE_COLLECTIONS:
        if rel != where:
            continue
        if mark == "LIFECYCLE" and text.startswith("LIFECYCLE"):
            return True
        if mark == "title message" and "task.message" in text:
            return True
    return False


def test_no_hand_written_set_of_task_states() -> None:
    """Every set of states outside states.py is a phase's set (PENDING_STATES, ...)."""
    copies = []
    for path in _sources():
        source = path.read_text(encoding="utf-8")
        for line in state_collections(ast.parse(source)):
            if not _allowed_collection(path, source, line):
                copies.append(f"{path.relative_to(PACKAGE)}:{line}")
    assert copies == [], f"task states written by hand (use states.py's sets): {copies}"


def test_no_state_name_in_sql() -> None:
    """The store's queries take their states from the table (an IN-list of parameters)."""
    copies = [f"{p.relative_to(PACKAGE)}:{line}" for p in _sources()
              for line in sql_state_names(ast.parse(p.read_text(encoding="utf-8")))]
    assert copies == [], f"state names in SQL text: {copies}"


def test_stop_reasons_are_the_enum_everywhere() -> None:
    copies = [f"{p.relative_to(PACKAGE)}:{line}" for p in _sources()
              for line in stop_reason_strings(ast.parse(p.read_text(encoding="utf-8")))]
    assert copies == [], f"stop reasons written as strings (use StopReason): {copies}"


def test_one_table_of_action_verbs() -> None:
    copies = [f"{p.relative_to(PACKAGE)}:{line}" for p in _sources()
              for line in verb_tables(ast.parse(p.read_text(encoding="utf-8")))]
    assert copies == [], f"a second table of action words (use states.VERBS): {copies}"
    assert verb_tables(ast.parse(OWNER.read_text(encoding="utf-8")))  # the owner's is seen


def test_the_scans_see_a_copy() -> None:
    """Each scan finds what it is for in a snippet that has it, and nothing in one without."""
    copy = ast.parse(
        "a = t.state in (TaskState.QUEUED, TaskState.WAITING)\n"
        "b = t.state in ('merged', 'discarded')\n"
        "c = 'SELECT * FROM tasks WHERE state = \\'queued\\''\n"
        "sup.stop_now(attempt, 'kill', 'x')\n"
        "if stop_reason == 'endpoint': pass\n"
        "w = Watch(stop=('timeout', 'late'))\n"
        "V = {Action.MERGE: 'merge', Action.KILL: 'kill'}\n"
        "q = conn.execute(sql, (ep, TaskState.QUEUED.value, TaskState.WAITING.value, now))\n")
    assert state_collections(copy) == [1, 2, 8]
    assert sql_state_names(copy) == [3]
    assert sorted(stop_reason_strings(copy)) == [4, 5, 6]
    assert verb_tables(copy) == [7]
    clean = ast.parse(
        "a = t.state in PENDING_STATES\n"
        "c = f'SELECT * FROM tasks WHERE state IN ({marks})'\n"
        "sup.stop_now(attempt, StopReason.KILL, 'x')\n"
        "if stop_reason is StopReason.ENDPOINT: pass\n"
        "modes = ('error', 'hang')\n")
    assert (state_collections(clean), sql_state_names(clean), stop_reason_strings(clean),
            verb_tables(clean)) == ([], [], [], [])


# --- the owners' tables, as behaviour ----------------------------------------------------------


@pytest.mark.parametrize("action", list(Action))
def test_policy_and_panel_say_the_same_words(action: Action) -> None:
    """A refusal names the action with states.VERBS (the panel's dimmed keys use it too)."""
    task = Task(id="abc123", prompt="p", repo=Path("/r"), state=TaskState.DISCARDED)
    refusal = policy.refusal(task, action)
    assert refusal is not None and refusal.startswith(f"cannot {VERBS[action]} task abc123:")


def test_claim_next_takes_exactly_the_pending_states(tmp_path: Path) -> None:
    """A task of every state, one endpoint: claim_next takes the pending ones (queued, and
    waiting whose time has come), oldest first, and never an active, finished or closed
    one. A pending task whose time has not come waits."""
    store = Store(tmp_path / "fleet.db")
    e = "http://127.0.0.1:1"
    ids = {state: store.create_task(prompt=f"task {state}", repo=tmp_path, endpoint=e,
                                    now=100.0 + n, state=state).id
           for n, state in enumerate(STATES)}
    later = store.create_task(prompt="not yet", repo=tmp_path, endpoint=e, now=200.0,
                              state=TaskState.WAITING, not_before=10_000.0)
    pending = {ids[s] for s, row in STATES.items() if row.phase is Phase.PENDING}
    claimed = set()
    while (task := store.claim_next(e, cap=100, now=1_000.0)) is not None:
        claimed.add(task.id)
        assert task.state is TaskState.RUNNING
    assert claimed == pending
    assert store.get_task(later.id).state is TaskState.WAITING
