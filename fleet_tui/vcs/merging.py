"""What a merge into the main checkout and an update of a worktree share: the merge worked
out without a checkout (``git merge-tree``, the paths it changes, those in the way), the
state files a ``git merge`` writes in a git dir and putting them back, and git merge's
failure said in one sentence."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

from fleet_tui.system.gitplumbing import first_line as _first_line
from fleet_tui.system.gitplumbing import merge_tree, tree_changes
from fleet_tui.system.gitplumbing import shown as _shown
from fleet_tui.vcs.run import _run


def _merge_tree(repo: Path, base_tip: str, side: str) -> tuple[str, list[str]]:
    """(tree, conflicting paths) of merging ``side`` into ``base_tip``. No checkout."""
    return merge_tree(repo, base_tip, side, run=_run)


def _tree_changes(repo: Path, base_tip: str, tree: str) -> list[tuple[str, str, str]]:
    """(status letter, path, new object id) of every path the merge changes in the base."""
    return tree_changes(repo, base_tip, tree, run=_run)


# Files a merge attempt may write into the main checkout's git dir; a failed one leaves
# them as they were before it.
_MERGE_STATE_FILES = ("ORIG_HEAD", "MERGE_HEAD", "MERGE_MSG", "MERGE_MODE", "SQUASH_MSG",
                      "AUTO_MERGE")


def _put_back(git_dir: Path, files: Mapping[str, bytes | None]) -> None:
    """The state files of a git dir as they were (None: absent), each written only if it
    differs."""
    for name, content in files.items():
        path = git_dir / name
        with contextlib.suppress(OSError):
            if content is None:
                path.unlink(missing_ok=True)
            elif not path.exists() or path.read_bytes() != content:
                path.write_bytes(content)


def _merge_failure(text: str) -> str:
    """git merge's reason, with the files it names ("... would be overwritten by merge:"
    lists them on the following lines)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "would be overwritten by merge" in line or "would be removed by merge" in line:
            names = []
            for follow in lines[i + 1:]:
                if not follow.startswith(("\t", " ")) or not follow.strip():
                    break
                names.append(follow.strip())
            head = line.strip().removeprefix("error: ").rstrip(":").strip()
            return f"{head}: {_shown(names, 10)}" if names else head
    return _first_line(text) or "git merge failed"

