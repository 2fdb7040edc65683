"""Looking for the API key in what a task would publish: in a file, in git's objects
(the merge's result and, for a real merge or a push, the branch's history), and hiding it
(``REDACTED``) in what is shown. The rule itself is ``core.redaction``'s."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fleet_tui.core import redaction
from fleet_tui.vcs.run import GitError, _gitpython, _out

SECRET_MIN_LENGTH = redaction.MIN_LENGTH  # shorter "keys" would match everywhere
REDACTED = redaction.MARK


def _needles(secrets: Sequence[str]) -> list[str]:
    """The secrets worth looking for (a very short one would match everywhere)."""
    return redaction.needles(secrets)


def _redact(text: str, needles: Sequence[str]) -> str:
    return redaction.redact(text, needles)


def _file_holds(path: Path, needles: Sequence[bytes]) -> bool:
    """Does the file at path hold one of needles? Read in chunks (a binary may be big)."""
    overlap = max(len(n) for n in needles) - 1
    tail = b""
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                window = tail + chunk
                if any(n in window for n in needles):
                    return True
                tail = window[-overlap:] if overlap else b""
    except OSError:
        return False
    return False


def _objects_holding(repo: Path, oids: list[str], needles: Sequence[bytes]) -> dict[str, str]:
    """{object id: type} of the objects whose content holds one of needles, read through
    one `git cat-file --batch` (GitPython's), in chunks."""
    if not oids or not needles:
        return {}
    overlap = max(len(n) for n in needles) - 1
    gitpython = _gitpython()
    runner = gitpython.Git(str(repo))
    found: dict[str, str] = {}
    try:
        for oid in oids:
            _, kind, _, stream = runner.stream_object_data(oid)
            tail = b""
            hit = False
            while chunk := stream.read(1 << 20):
                if hit:
                    continue  # read it to the end: the batch process stays in step
                window = tail + chunk
                hit = any(n in window for n in needles)
                tail = window[-overlap:] if overlap else b""
            if hit:
                found[oid] = kind.decode() if isinstance(kind, bytes) else str(kind)
    except (gitpython.GitCommandError, ValueError, OSError) as exc:
        raise GitError(f"could not read the branch's objects: {exc}") from None
    finally:
        runner.clear_cache()
    return found


def _secret_hits(repo: Path, base_tip: str, side: str, changes: list[tuple[str, str, str]],
                 needles: Sequence[str], *, history: bool) -> tuple[list[str], list[str]]:
    """(paths whose merged content holds a needle, further places in the branch's history
    that hold one). History counts for a real merge: its commits land in the base."""
    final: dict[str, list[str]] = {}
    for letter, path, oid in changes:
        if letter != "D" and oid.strip("0"):
            final.setdefault(oid, []).append(path)
    earlier: dict[str, str] = {}
    if history:
        out = _out(repo, "rev-list", "--objects", side, "--not", base_tip,
                   what="git rev-list")
        for line in out.splitlines():
            oid, _, name = line.partition(" ")
            if oid and oid not in final:
                earlier[oid] = name
    hits = _objects_holding(repo, [*final, *earlier], [n.encode() for n in needles])
    named = {p for _, p, _ in changes if any(n in p for n in needles)}
    in_result = sorted({p for oid in hits if oid in final for p in final[oid]} | named)
    in_history = sorted({_history_hit(repo, oid, kind, earlier[oid], needles)
                         for oid, kind in hits.items() if oid in earlier})
    return ([_redact(p, needles) for p in in_result],
            [_redact(p, needles) for p in in_history])


def _history_hit(repo: Path, oid: str, kind: str, name: str,
                 needles: Sequence[str]) -> str:
    """What an object of the branch's history that holds the key is, in words: a file's
    content (its path), a commit's message, or the name of a file or folder in a folder
    (a tree object holds its entries' names, not their content)."""
    if kind == "commit":
        return f"the message of commit {oid[:10]}"
    if kind != "tree":
        return name or f"object {oid[:10]}"
    entries = _out(repo, "ls-tree", "-z", "--name-only", oid, what="git ls-tree").split("\0")
    found = [e for e in entries if e and any(n in e for n in needles)]
    where = f"folder {name}" if name else "the top folder"
    if not found:
        return f"the listing of {where}"
    shown = ", ".join(f"{name}/{e}" if name else e for e in found[:3])
    return f"the name {shown} in {where}"

