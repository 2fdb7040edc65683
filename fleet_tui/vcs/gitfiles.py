"""Reading git's files directly instead of running git.

Each git subprocess costs milliseconds; the engine creates a worktree per task and checks it
before every start. These helpers read the few facts it needs (where the git dir is, what a
ref or HEAD points at) straight from the files git documents (gitrepository-layout(5)).
They answer None for anything unusual (reftable, a symbolic ref chain, an unreadable file):
the caller then asks git itself, so the answer is never a guess."""

from __future__ import annotations

import re
from pathlib import Path

from fleet_tui.vcs.run import _branch_exists, _out

_SHA_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


def _git_dir_of(checkout: Path) -> Path | None:
    """The git dir of a checkout: its `.git` folder, or where a `.git` file points."""
    dot = checkout / ".git"
    try:
        if dot.is_dir():
            return dot
        text = dot.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if not text.startswith("gitdir: "):
        return None
    target = Path(text[len("gitdir: "):].strip())
    return target if target.is_absolute() else checkout / target


def _common_dir(git_dir: Path) -> Path:
    """The shared git dir (refs, objects, info/) of a possibly linked worktree's git dir."""
    try:
        rel = (git_dir / "commondir").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return git_dir
    common = Path(rel)
    return common if common.is_absolute() else git_dir / common


def _ref_from_files(common: Path, ref: str) -> tuple[bool, str | None]:
    """(known, commit) of a full ref name like refs/heads/x from the loose ref or
    packed-refs. known=False: could not tell from the files (ask git)."""
    if (common / "reftable").exists():
        return False, None
    try:
        text = (common / ref).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        text = None
    except IsADirectoryError:
        return True, None  # refs/heads/fleet is a folder: no branch of that name
    except (OSError, UnicodeDecodeError):
        return False, None
    if text is not None:
        return (True, text) if _SHA_RE.match(text) else (False, None)
    try:
        packed = (common / "packed-refs").read_bytes()
    except FileNotFoundError:
        return True, None
    except OSError:
        return False, None
    needle = b" " + ref.encode() + b"\n"
    at = packed.find(needle)
    if at < 0:
        return True, None
    start = packed.rfind(b"\n", 0, at) + 1
    sha = packed[start:at].decode("ascii", "replace")
    return (True, sha) if _SHA_RE.match(sha) else (False, None)


def _head_from_files(checkout: Path) -> tuple[str, str | None] | None:
    """(commit, branch or None when detached) of a checkout's HEAD, or None: ask git."""
    git_dir = _git_dir_of(checkout)
    if git_dir is None:
        return None
    try:
        head = (git_dir / "HEAD").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if _SHA_RE.match(head):
        return head, None
    if not head.startswith("ref: refs/heads/"):
        return None
    ref = head[len("ref: "):]
    known, sha = _ref_from_files(_common_dir(git_dir), ref)
    if not known or sha is None:
        return None  # unknown, or an unborn branch: let git say so
    return sha, ref[len("refs/heads/"):]


def _branch_exists_fast(repo: Path, branch: str) -> bool:
    """_branch_exists from the files when they tell, else from git."""
    git_dir = _git_dir_of(repo)
    if git_dir is not None:
        known, sha = _ref_from_files(_common_dir(git_dir), f"refs/heads/{branch}")
        if known:
            return sha is not None
    return _branch_exists(repo, branch)


def _main_git_dir(repo: Path) -> Path:
    """The git dir of a checkout itself (a linked worktree's own, not the common one): from
    the files, else from git."""
    git_dir = _git_dir_of(repo)
    if git_dir is not None and (git_dir / "HEAD").is_file():
        return git_dir
    return Path(_out(repo, "rev-parse", "--path-format=absolute", "--git-dir").strip())
