"""The folders that show the layers: what moved keeps working from
outside the package. No claude."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fleet_tui.execution.worker.runner import RUNNER_MODULE
from fleet_tui.system import paths

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_root_is_the_folder_that_holds_the_package() -> None:
    """A detached child (the runner, the queue runner, the test gate's boot under
    `python -I`) gets it on its path; the move into folders once made it fleet_tui/ itself,
    hidden by the editable install."""
    assert paths.package_root() == ROOT
    assert (paths.package_root() / "fleet_tui" / "__init__.py").is_file()
    out = subprocess.run([sys.executable, "-I", "-c",
                          f"import sys; sys.path.insert(0, {str(paths.package_root())!r}); "
                          "import fleet_tui.vcs.testgate, fleet_tui.execution.worker.runner"],
                         cwd="/", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_the_runner_answers_to_its_old_module_name_and_its_new_one(tmp_path: Path) -> None:
    """Runners an older fleet-tui started ran `python -m fleet_tui.runner`; that name still
    reaches the runner (here: its usage, exit 2, for a folder that is not there)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for module in ("fleet_tui.runner", RUNNER_MODULE):
        out = subprocess.run([sys.executable, "-m", module, str(tmp_path / "gone")],
                             cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 2, (module, out.stderr)
        assert "is not a directory" in out.stderr, (module, out.stderr)
