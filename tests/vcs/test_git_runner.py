"""How vcs/ runs git: each one-shot command a process of its own through `run_git`, the
standard library's subprocess, as the worker does on a host. GitPython is imported only
where its `cat-file --batch` stream is read (the key scan of objects): its import, with
the two `git version` it runs, cost a task command (`fleet-tui show`, `diff`, `merge`)
~60 ms of CPU, a third of what the whole command took."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# a task's whole life in git, in a fresh interpreter: its worktree made from main, a file
# written, the diff read, the branch merged (its worktree and branch then gone)
LIFE = """\
import json, sys
from pathlib import Path
from fleet_tui.vcs import git
repo = Path(sys.argv[1])
info = git.create_worktree(repo, "t1")
(info.path / "new.txt").write_text("hello\\n")
changed = [f.path for f in git.diff(info.path, info.base_commit).files]
result = git.merge(repo, info.path, info.branch, "main", message="add new.txt")
print(json.dumps({"changed": changed, "merged": result.merged, "message": result.message,
                  "gitpython": sorted(m for m in ("git", "gitdb") if m in sys.modules)}))
"""


def _in_a_fresh_interpreter(script: str, repo: Path) -> dict[str, Any]:
    """What `script` printed last (JSON), run in a new python on this checkout, in repo."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script, str(repo)], cwd=repo, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    seen: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return seen


def test_a_task_made_diffed_and_merged_runs_git_without_gitpython(git_repo: Path) -> None:
    seen = _in_a_fresh_interpreter(LIFE, git_repo)
    assert seen["changed"] == ["new.txt"]
    assert seen["merged"], seen["message"]
    assert (git_repo / "new.txt").read_text() == "hello\n"
    assert seen["gitpython"] == [], "running git through vcs/ imported GitPython"


# a file whose name is not UTF-8 (a worker's, written with Latin-1 bytes), through the same
# life: its name must come back from git as the bytes it has on disk
ODD_NAME = """\
import json, os, sys
from pathlib import Path
from fleet_tui.vcs import git
repo = Path(sys.argv[1])
info = git.create_worktree(repo, "t3")
with open(os.path.join(os.fsencode(info.path), b"caf\\xe9.txt"), "w") as fh:
    fh.write("latin\\n")
changed = [os.fsencode(f.path).hex() for f in git.diff(info.path, info.base_commit).files]
result = git.merge(repo, info.path, info.branch, "main", message="add a file")
print(json.dumps({"changed": changed, "merged": result.merged, "message": result.message}))
"""


def test_a_file_name_that_is_not_utf8_is_diffed_and_merged_as_its_bytes(
        git_repo: Path) -> None:
    seen = _in_a_fresh_interpreter(ODD_NAME, git_repo)
    assert seen["changed"] == [b"caf\xe9.txt".hex()]
    assert seen["merged"], seen["message"]
    assert (os.fsencode(git_repo) + b"/caf\xe9.txt") in [
        os.fsencode(p) for p in git_repo.iterdir()]
