"""The package's shape, read from its source (no claude, no processes): no class grows past
700 lines, and core (the domain model and the pure rules) imports nothing else of the
package, type-only imports included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fleet_tui"
MAX_CLASS_LINES = 700


def _classes() -> list[tuple[str, int]]:
    """(path:Class, lines) of every class in the package, nested ones too."""
    found: list[tuple[str, int]] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = (node.end_lineno or node.lineno) - start + 1
                found.append((f"{path.relative_to(ROOT).as_posix()}:{node.name}", lines))
    return found


def test_no_class_is_over_700_lines() -> None:
    classes = _classes()
    assert any(name == "fleet_tui/store/db.py:Store" for name, _ in classes)
    too_long = [f"{name} has {lines} lines"
                for name, lines in classes
                if lines > MAX_CLASS_LINES]
    assert not too_long, (f"classes over {MAX_CLASS_LINES} lines (split them by concern, as "
                          f"the Store is): {'; '.join(too_long)}")


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import in a module, at any depth (TYPE_CHECKING blocks and
    function bodies too). The package imports absolutely, so a module's name is its own."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "the package imports absolutely"
            out.append((node.lineno, node.module or ""))
    return out


def test_core_imports_nothing_else_of_the_package() -> None:
    """The domain model (core/model.py) and the rules over it are the bottom layer: the store
    persists the model, policy decides on it, and neither core module names a type of a
    layer above, even for the type checker alone."""
    outside: list[str] = []
    for path in sorted((PACKAGE / "core").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, module in _imported(tree):
            if module.startswith("fleet_tui") and not (
                    module == "fleet_tui.core" or module.startswith("fleet_tui.core.")):
                outside.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not outside, "; ".join(outside)


def test_the_model_lives_in_core_and_the_package_takes_it_from_there() -> None:
    """fleet_tui.store.db re-exports the model for older imports (tests, scripts); the
    package's own modules import it from core."""
    from fleet_tui.core import model
    from fleet_tui.store import db

    for name in ("Task", "Attempt", "TaskSpec", "EndpointState", "MAX_COPIES"):
        assert getattr(db, name) is getattr(model, name)
    moved = {"Task", "Attempt", "TaskSpec", "EndpointState", "MAX_COPIES", "new_task_id"}
    through_store: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "fleet_tui.store.db":
                names = {alias.name for alias in node.names} & moved
                if names:
                    through_store.append(f"{path.relative_to(ROOT)}:{node.lineno} "
                                         f"{', '.join(sorted(names))}")
    assert not through_store, "import the model from fleet_tui.core.model: " + \
        "; ".join(through_store)
