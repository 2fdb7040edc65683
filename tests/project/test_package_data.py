"""What `pip install .` (the README's first command) installs: every file of the package
that is not Python code is named by `[tool.setuptools.package-data]`, so that a wheel
holds it. (The cage's host script, `execution/worker/cage_host.mjs`, was once left out:
an installed fleet-tui could not start a caged worker.)"""

from __future__ import annotations

import fnmatch
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_file_of_the_package_that_is_not_python_is_in_its_package_data() -> None:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["fleet_tui"]
    tracked = subprocess.run(["git", "ls-files", "fleet_tui"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    data = [Path(p).relative_to("fleet_tui").as_posix() for p in tracked
            if not p.endswith(".py")]
    assert "execution/worker/cage_host.mjs" in data
    left_out = [p for p in data if not any(fnmatch.fnmatchcase(p, pat) for pat in patterns)]
    assert left_out == [], f"not in [tool.setuptools.package-data]: {left_out}"
