"""Count the one-line forwards ("relays") of the engine's front and the main screen.

A relay is a method whose whole body (its docstring aside) is one statement that hands the
call to an attribute of ``self``'s part: ``return self.part.method(...)``,
``self.part.method(...)``, ``return self.part.value`` (a property) or
``self.part.value = value`` (a setter). Methods that do anything else (two statements, a
guard, a computation) are not relays. Names a class routes to a part without a method of
its own (the engine front's ``Via`` / ``Field`` entries: reading one gives the part's own
method, so no call is relayed) are counted apart, as "routed names".

    python scripts/relays.py            # Fleet and MainScreen
    python scripts/relays.py FILE:CLASS ...

It reads the source (ast), so it runs without importing the panel or the engine.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ("fleet_tui/engine/fleet.py:Fleet", "fleet_tui/ui/screens/main.py:MainScreen")


def _through_part(node: ast.expr) -> bool:
    """``self.part.name`` (two attribute steps or more, rooted at ``self``)."""
    steps = 0
    while isinstance(node, ast.Attribute):
        steps += 1
        node = node.value
    return isinstance(node, ast.Name) and node.id == "self" and steps >= 2


def is_relay(method: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = list(method.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # the docstring
    if len(body) != 1:
        return False
    statement = body[0]
    if isinstance(statement, (ast.Return, ast.Expr)):
        value = statement.value
        if isinstance(value, ast.Await):
            value = value.value
        if isinstance(value, ast.Call):
            value = value.func
        return value is not None and _through_part(value)
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        return _through_part(statement.targets[0])
    return False


def _routed(node: ast.stmt) -> bool:
    """``name = Via(...)`` / ``name = Field[T](...)`` in a class body."""
    if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Call):
        return False
    func = node.value.func
    if isinstance(func, ast.Subscript):
        func = func.value
    return isinstance(func, ast.Name) and func.id in ("Via", "Field")


def count(spec: str) -> tuple[int, int, list[str], int]:
    """(methods, relays, the relays' names, routed names) of ``FILE:CLASS``."""
    file, _, name = spec.partition(":")
    tree = ast.parse((ROOT / file).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            methods = [m for m in node.body
                       if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
            relays = [m.name for m in methods if is_relay(m)]
            return len(methods), len(relays), relays, sum(map(_routed, node.body))
    raise SystemExit(f"no class {name} in {file}")


def main(argv: list[str]) -> int:
    for spec in argv or DEFAULT:
        methods, relays, names, routed = count(spec)
        print(f"{spec}: {methods} methods, {relays} one-line forwards, "
              f"{routed} routed names")
        if names:
            print("  " + " ".join(names))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
