"""fleet-doctor's git_identity check: `fleet-tui merge` commits, so a
missing git identity is reported up front, with how to set it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fleet_tui.commands import doctor

IDENT_VARS = ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME",
              "GIT_COMMITTER_EMAIL", "EMAIL")


def identity_check(cwd: Path, env: dict[str, str]) -> doctor.Check:
    checks, _ = doctor.run_checks(env=env, cwd=cwd, live=False, timeout=20)
    (found,) = [c for c in checks if c.check == "git_identity"]
    return found


def test_identity_is_reported(git_repo: Path) -> None:
    check = identity_check(git_repo, dict(os.environ))
    assert check.status == doctor.OK
    assert check.detail == "commits as Fleet Test <fleet@example.invalid>"


@pytest.mark.parametrize("where", ["repository", "elsewhere"])
def test_missing_identity_is_a_warning_that_says_how_to_set_it(
        git_repo: Path, tmp_path: Path, where: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in IDENT_VARS}
    subprocess.run(["git", "config", "--unset", "user.name"], cwd=git_repo, check=True)
    subprocess.run(["git", "config", "--unset", "user.email"], cwd=git_repo, check=True)
    # git would guess an identity from the host name on some machines: forbid guessing,
    # as a careful user's config does
    subprocess.run(["git", "config", "--global", "user.useConfigOnly", "true"], check=True,
                   env=env)
    cwd = git_repo if where == "repository" else tmp_path
    check = identity_check(cwd, env)
    assert check.status == doctor.WARN
    assert "git does not know who you are" in check.detail
    assert "git config --global user.name" in check.detail
    assert "git config --global user.email" in check.detail
    checks, _ = doctor.run_checks(env=env, cwd=cwd, live=False, timeout=20)
    assert doctor.exit_code_for([c for c in checks if c.check == "git_identity"]) == 0
