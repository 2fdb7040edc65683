"""What a merge into the main checkout and an update of a worktree share: the merge worked
out without a checkout (``git merge-tree``, the paths it changes, those in the way), the
state files a ``git merge`` writes in a git dir and putting them back, and git merge's
failure said in one sentence."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from fleet_tui.vcs.run import GitError, _first_line, _out, _run, _shown


def _merge_tree(repo: Path, base_tip: str, side: str) -> tuple[str, list[str]]:
    """(tree, conflicting paths) of merging ``side`` into ``base_tip``. No checkout."""
    status, out, err = _run(repo, "merge-tree", "--write-tree", "--name-only", "--no-messages",
                            base_tip, side, check=False)
    lines = out.splitlines()
    if status in (0, 1) and lines:
        conflicts = sorted({line for line in lines[1:] if line.strip()}) if status else []
        return lines[0].strip(), conflicts
    raise GitError(f"git merge-tree failed: {_first_line(err) or 'exit ' + str(status)} "
                   "(fleet-tui needs git 2.38 or newer)")


def _tree_changes(repo: Path, base_tip: str, tree: str) -> list[tuple[str, str, str]]:
    """(status letter, path, new object id) of every path the merge changes in the base."""
    out = _out(repo, "diff-tree", "-r", "-z", "--no-renames", "--no-abbrev", "--raw",
               base_tip, tree, what="git diff-tree")
    tokens = out.split("\0")
    changes: list[tuple[str, str, str]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith(":") and i + 1 < len(tokens):
            fields = token[1:].split()
            if len(fields) >= 5:
                changes.append((fields[4][0], tokens[i + 1], fields[3]))
            i += 2
        else:
            i += 1
    return changes


def _in_the_way(repo: Path, changes: list[tuple[str, str, str]]) -> list[str]:
    """Paths the merge would write that exist in the main checkout but are not tracked
    there (untracked or ignored): `git merge` overwrites an ignored file without a word.

    Only added paths can be such: a modified one is tracked in the base, and the main
    checkout is on the base with no changes. A new file whose folder exists as an
    untracked file (or link) is in the way too.
    """
    removed = {path for letter, path, _ in changes if letter == "D"}
    found: set[str] = set()
    for letter, path, _ in changes:
        if letter != "A":
            continue
        if os.path.lexists(repo / path):
            found.add(path)
            continue
        parts = path.split("/")
        for n in range(1, len(parts)):
            prefix = "/".join(parts[:n])
            if prefix in removed:
                break  # a tracked file the merge replaces by a folder: git handles it
            where = repo / prefix
            if not os.path.lexists(where):
                break
            if os.path.islink(where) or not os.path.isdir(where):
                found.add(prefix)
                break
    return sorted(found)


_MARKER_RE = re.compile(rb"^(?:<{7}|>{7})(?: |$)", re.MULTILINE)


def _with_markers(worktree: Path, candidates: Sequence[str]) -> list[str]:
    """The files among ``candidates`` that still hold conflict markers (an update's
    conflicted files, here or in a host's worktree: its agent asks the same)."""
    found = []
    for rel in candidates:
        try:
            data = (Path(worktree) / rel).read_bytes()
        except OSError:
            continue
        if _MARKER_RE.search(data):
            found.append(rel)
    return found


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

