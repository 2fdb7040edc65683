"""A new worktree made ready before claude starts: the included files, the setup marker.

The runner calls this for an attempt whose worktree has not been set up (a new worktree,
or one reset by a fresh retry): it copies the files the repository's `include` patterns
(and `.worktreeinclude`) match from the main checkout, then runs the setup command, then
marks the worktree as set up in its private git folder (`<repo>/.git/worktrees/<id>/`),
which git removes with the worktree, so a reset worktree is set up again and a resumed
session or a follow-up is not.

Only files git ignores in the main checkout are copied (`git ls-files --others --ignored`
with the patterns, then `git check-ignore`), never anything under `.fleet-work/` (the
worktrees and logs) and never a file that holds the API key. Lean (os, subprocess,
shutil): every runner may import it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile

from fleet_tui.core import redaction

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

SETUP_MARKER = "fleet-tui-setup.json"
OWN_FOLDERS = (".fleet-work/", ".git/")  # never copied, whatever a pattern says
SCAN_CHUNK = 1 << 20
GIT_TIMEOUT = 120


def admin_dir(worktree: str) -> str | None:
    """The worktree's private git folder (from its `.git` file), None when unknown."""
    try:
        with open(os.path.join(worktree, ".git"), encoding="utf-8") as fh:
            head = fh.read(4096)
    except OSError:
        return None
    if not head.startswith("gitdir:"):
        return None
    path = head[len("gitdir:"):].strip()
    if not os.path.isabs(path):
        path = os.path.normpath(os.path.join(worktree, path))
    return path if os.path.isdir(path) else None


def is_set_up(worktree: str) -> bool:
    """The worktree was made ready already (since git created it)."""
    folder = admin_dir(worktree)
    return folder is not None and os.path.exists(os.path.join(folder, SETUP_MARKER))


def mark_set_up(worktree: str, record: dict[str, object]) -> None:
    folder = admin_dir(worktree)
    if folder is None:
        return
    path = os.path.join(folder, SETUP_MARKER)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(record, fh, sort_keys=True)


def _git(repo: str, args: Sequence[str], stdin: bytes | None = None) -> bytes:
    out = subprocess.run(["git", "-C", repo, *args], input=stdin, capture_output=True,
                         timeout=GIT_TIMEOUT, check=False)
    if out.returncode not in (0, 1):  # check-ignore: 1 is "none of them"
        err = out.stderr.decode("utf-8", "replace").strip().splitlines()
        raise OSError(f"git {args[0]} failed: {err[-1] if err else out.returncode}")
    return out.stdout


def included_files(repo: str, patterns: Sequence[str]) -> list[str]:
    """The files of the main checkout the patterns match that git ignores (paths relative
    to the repository, sorted); OSError when git cannot say."""
    if not patterns:
        return []
    with tempfile.NamedTemporaryFile("w", suffix=".patterns", delete=False,
                                     encoding="utf-8") as fh:
        fh.write("\n".join(patterns) + "\n")
        pattern_file = fh.name
    try:
        listed = _git(repo, ["ls-files", "-z", "--others", "--ignored",
                             f"--exclude-from={pattern_file}"])
    finally:
        with contextlib.suppress(OSError):
            os.unlink(pattern_file)
    candidates = [p for p in listed.decode("utf-8", "surrogateescape").split("\0")
                  if p and not p.startswith(OWN_FOLDERS)]
    if not candidates:
        return []
    ignored = _git(repo, ["check-ignore", "-z", "--stdin"],
                   stdin="\0".join(candidates).encode("utf-8", "surrogateescape") + b"\0")
    keep = set(ignored.decode("utf-8", "surrogateescape").split("\0"))
    return sorted(p for p in candidates if p in keep)


def holds(path: str, secret: str) -> bool:
    """The file's bytes contain `secret` (read in chunks; a symlink is not followed)."""
    if not secret:
        return False
    needle = secret.encode("utf-8")
    if os.path.islink(path):
        return needle in os.readlink(path).encode("utf-8", "surrogateescape")
    overlap = b""
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(SCAN_CHUNK)
            if not chunk:
                return False
            if needle in overlap + chunk:
                return True
            overlap = chunk[-(len(needle) - 1):] if len(needle) > 1 else b""


def copy_included(repo: str, worktree: str, files: Sequence[str], secrets: Sequence[str]
                  ) -> tuple[list[str], list[tuple[str, str]]]:
    """Copy `files` (relative paths) from the main checkout into the worktree, keeping
    modes and symlinks; (copied, [(skipped, why)]). A file holding the key is skipped."""
    copied: list[str] = []
    skipped: list[tuple[str, str]] = []
    for rel in files:
        source = os.path.join(repo, rel)
        target = os.path.join(worktree, rel)
        try:
            if any(holds(source, s) for s in secrets if s):
                skipped.append((rel, "it holds the API key"))
                continue
            os.makedirs(os.path.dirname(target) or worktree, exist_ok=True)
            if os.path.lexists(target):
                os.unlink(target)
            shutil.copy2(source, target, follow_symlinks=False)
        except OSError as exc:
            skipped.append((rel, exc.strerror or str(exc)))
            continue
        copied.append(rel)
    return copied, skipped


def redact(text: str, secrets: Sequence[str]) -> str:
    """`text` with every secret replaced (the setup's output never shows the key): the
    one rule, redaction.redact."""
    return redaction.redact(text, secrets)
