"""A task's changes against its base: per file and as one patch (``diff``), the line
counts alone (``diff_stat``), and the commit they are measured from (``fork_point``).

Untracked files are marked intent-to-add in a temporary copy of the index, so the
worktree's own index is never touched. With the key given, files whose new content or
name holds it are listed and the key is hidden in the patches (``mark_secrets``)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from fleet_tui.vcs.gitfiles import _SHA_RE, _head_from_files
from fleet_tui.vcs.keyscan import _file_holds, _needles, _redact
from fleet_tui.vcs.run import GitError, _gitpython, _out, _rev, _run, _temp_index

FileStatus = Literal["added", "modified", "deleted", "untracked", "renamed"]


@dataclass
class FileDiff:
    """One changed file of a task: status, line counts, and its unified patch."""

    path: str
    status: FileStatus
    added: int
    deleted: int
    patch: str  # empty for binary files
    old_path: str | None = None  # the source of a rename
    binary: bool = False


@dataclass
class Diff:
    """Everything a task changed against its base: per file and as one patch."""

    files: list[FileDiff]
    patch: str
    # Changed files whose new content holds the API key (the key itself is replaced by
    # REDACTED in ``patch`` and in each file's patch, so it is never shown).
    secret_paths: list[str] = field(default_factory=list)

    @property
    def added(self) -> int:
        return sum(f.added for f in self.files)

    @property
    def deleted(self) -> int:
        return sum(f.deleted for f in self.files)


def _intent_to_add(worktree: Path, files: list[str], env: dict[str, str]) -> None:
    """Mark untracked files intent-to-add in the temporary index, so diffs include them."""
    if not files:
        return
    fd, listing = tempfile.mkstemp(prefix="fleet-paths-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(b"\0".join(os.fsencode(f) for f in files) + b"\0")
        _run(worktree, "add", "--intent-to-add", f"--pathspec-from-file={listing}",
             "--pathspec-file-nul", env={**env, "GIT_LITERAL_PATHSPECS": "1"},
             what="listing untracked files")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(listing)


def _untracked(worktree: Path, env: Mapping[str, str] | None = None) -> list[str]:
    out = _out(worktree, "ls-files", "--others", "--exclude-standard", "-z", env=env)
    return [p for p in out.split("\0") if p]


_DIFF_OPTS = ("-c", "core.quotePath=false", "diff", "--no-color", "--no-ext-diff",
              "--no-textconv", "-M")


def _parse_raw_numstat(out: str) -> list[tuple[str, str, str | None, int, int, bool]]:
    """Parse ``git diff --raw --numstat -z``: (status letter, path, old path, +, -, binary)."""
    tokens = out.split("\0")
    raw: list[tuple[str, str, str | None]] = []
    counts: list[tuple[int, int, bool]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token:
            i += 1
            continue
        if token.startswith(":"):
            letter = token.split()[-1][0]
            if letter in "RC":
                raw.append((letter, tokens[i + 2], tokens[i + 1]))
                i += 3
            else:
                raw.append((letter, tokens[i + 1], None))
                i += 2
            continue
        added_s, deleted_s, rest = [*token.split("\t", 2), "", ""][:3]
        binary = added_s == "-"
        counts.append((0 if binary else int(added_s), 0 if binary else int(deleted_s), binary))
        i += 1 if rest else 3
    result = []
    for index, (letter, path, old) in enumerate(raw):
        added, deleted, binary = counts[index] if index < len(counts) else (0, 0, False)
        result.append((letter, path, old, added, deleted, binary))
    return result


def _split_patch(patch: str) -> list[str]:
    """Split a multi-file patch at its ``diff --git`` headers (content lines never match)."""
    chunks: list[str] = []
    current: list[str] = []
    for line in patch.splitlines(keepends=True):
        if line.startswith("diff --git ") and current:
            chunks.append("".join(current))
            current = []
        current.append(line)
    if current:
        chunks.append("".join(current))
    return chunks


_STATUS: dict[str, FileStatus] = {"A": "added", "C": "added", "D": "deleted", "M": "modified",
                                  "R": "renamed", "T": "modified", "U": "modified"}


def diff(worktree: Path, base_commit: str, *, secrets: Sequence[str] = ()) -> Diff:
    """The worktree against its base: committed, uncommitted and untracked changes.

    Untracked files are marked intent-to-add in a temporary copy of the index, so two git
    calls cover every file and the worktree's own index is never touched.

    ``secrets`` (the API key): files whose new content holds one are listed in
    ``Diff.secret_paths`` and the key is replaced by REDACTED in the patch. The scan reads
    the patch already in hand (its added lines) and, for binary files only, the file.
    """
    worktree = Path(worktree)
    if not worktree.is_dir():
        raise GitError(f"the worktree {worktree} does not exist (discarded or merged?)")
    if _rev(worktree, base_commit) is None:
        raise GitError(f"unknown base commit {base_commit!r} in {worktree}")
    with _temp_index(worktree) as env:
        untracked = _untracked(worktree, env)
        _intent_to_add(worktree, untracked, env)
        summary, patch = _summary_and_patch(worktree, (base_commit,), env)
    result, aligned = _parsed(summary, patch, set(untracked))
    needles = _needles(secrets)
    if needles:
        _mark_secrets(worktree, result, needles, aligned)
    return result


def diff_commits(repo: Path, base_commit: str, tip: str, *,
                 secrets: Sequence[str] = ()) -> Diff:
    """``tip`` (a commit of the repository: a remote task's worktree as it was fetched,
    `Host.snapshot`) against its base, as diff() reads a worktree; no working tree is
    read or touched. A binary file is scanned for the key in its blob."""
    repo = Path(repo)
    for commit in (base_commit, tip):
        if _rev(repo, commit) is None:
            raise GitError(f"unknown commit {commit!r} in {repo}")
    summary, patch = _summary_and_patch(repo, (base_commit, tip), None)
    result, aligned = _parsed(summary, patch, set())
    needles = _needles(secrets)
    if needles:
        def holds(path: str, raw: list[bytes]) -> bool:
            status, out, _ = _gitpython().Git(str(repo)).execute(
                ["git", "cat-file", "blob", f"{tip}:{path}"], with_extended_output=True,
                with_exceptions=False, stdout_as_string=False)
            return status == 0 and isinstance(out, bytes) and any(n in out for n in raw)

        _mark_secrets(repo, result, needles, aligned, holds=holds)
    return result


def _summary_and_patch(cwd: Path, commits: tuple[str, ...],
                       env: Mapping[str, str] | None) -> tuple[str, str]:
    """git's --raw --numstat summary and the patch of the same diff, the two gits run at
    once (a 20,000-line diff: ~30 ms each). Neither writes the index
    (--no-optional-locks): two gits at once never race for its lock."""
    def run(*extra: str) -> str:
        return _out(cwd, "--no-optional-locks", *_DIFF_OPTS, *extra, *commits, "--",
                    env=env, what="git diff")

    from concurrent.futures import ThreadPoolExecutor  # here: a diff's alone

    with ThreadPoolExecutor(max_workers=1) as pool:
        summary = pool.submit(run, "--raw", "--numstat", "-z")
        patch = run()
        return summary.result(), patch


def _parsed(summary: str, patch: str, untracked_set: set[str]) -> tuple[Diff, bool]:
    """The Diff of git's --raw --numstat summary and its patch; whether the patch split
    into one chunk per file."""
    entries = _parse_raw_numstat(summary)
    chunks = _split_patch(patch)
    aligned = len(chunks) == len(entries)
    files: list[FileDiff] = []
    for index, (letter, path, old, added, deleted, binary) in enumerate(entries):
        status: FileStatus = _STATUS.get(letter, "modified")
        if status == "added" and path in untracked_set:
            status = "untracked"  # a rename into an untracked file stays "renamed"
        file_patch = chunks[index] if aligned and not binary else ""
        files.append(FileDiff(path=path, status=status, added=added, deleted=deleted,
                              patch=file_patch, old_path=old, binary=binary))
    return Diff(files=files, patch=patch), aligned


def mark_secrets(worktree: Path, result: Diff, secrets: Sequence[str]) -> None:
    """What diff(secrets=...) does, for a Diff made without them: fill ``secret_paths``
    and hide the key in the patches (the engine resolves the key while git diff runs)."""
    needles = _needles(secrets)
    if needles:
        aligned = all(f.patch or f.binary for f in result.files)
        _mark_secrets(Path(worktree), result, needles, aligned)


def _mark_secrets(worktree: Path, result: Diff, needles: list[str], aligned: bool, *,
                  holds: Callable[[str, list[bytes]], bool] | None = None) -> None:
    """Fill result.secret_paths and redact the key from the patches (see diff()).
    ``holds(path, needles)``: whether the new file holds one (default: read it in
    ``worktree``)."""
    in_patch = any(n in result.patch for n in needles)
    raw = [os.fsencode(n) for n in needles]
    hits: list[str] = []
    for f in result.files:
        if f.status == "deleted":
            continue
        if any(n in f.path for n in needles):
            hits.append(f.path)  # its name holds the key: a merge would publish it
        elif f.binary or (in_patch and not aligned):
            # no patch text to read (binary), or the patch could not be split per file
            if (holds(f.path, raw) if holds is not None
                    else _file_holds(worktree / f.path, raw)):
                hits.append(f.path)
        elif in_patch and any(line.startswith("+") and any(n in line for n in needles)
                              for line in f.patch.splitlines()):
            hits.append(f.path)
    if in_patch:
        result.patch = _redact(result.patch, needles)
        for f in result.files:
            f.patch = _redact(f.patch, needles)
            # a file named after the key is named with it hidden (the patch names it too)
            f.path = _redact(f.path, needles)
            if f.old_path is not None:
                f.old_path = _redact(f.old_path, needles)
    result.secret_paths = [_redact(p, needles) for p in hits]


def _status_summary(worktree: Path) -> tuple[bool, bool]:
    """(tracked changes, untracked files) of a worktree, from one `git status`."""
    out = _out(worktree, "--no-optional-locks", "status", "--porcelain", "-z",
               "--untracked-files=all", what="git status")
    tokens = out.split("\0")
    dirty = untracked = False
    i = 0
    while i < len(tokens):
        entry = tokens[i]
        i += 1
        if len(entry) < 3:
            continue
        if entry.startswith("?? "):
            untracked = True
        else:
            dirty = True
            if entry[0] in "RC":
                i += 1  # the rename's source path follows as its own token
    return dirty, untracked


def diff_stat(worktree: Path, base_commit: str) -> tuple[int, int]:
    """(added, deleted) lines of the worktree against its base, untracked files included."""
    worktree = Path(worktree)
    if not worktree.is_dir():
        raise GitError(f"the worktree {worktree} does not exist (discarded or merged?)")
    # One `git status` tells the usual cases apart: nothing changed since the base (the
    # answer is 0/0 if HEAD is still the base), only tracked changes (a plain diff against
    # the base), or untracked files (the temporary index with intent-to-add, as diff()).
    # --no-optional-locks: status must not refresh the worktree's own index.
    dirty, untracked_seen = _status_summary(worktree)
    if not dirty and not untracked_seen:
        head = _head_from_files(worktree)
        if head is not None and head[0] == base_commit:
            return 0, 0
    if not untracked_seen:
        out = _out(worktree, *_DIFF_OPTS, "--numstat", "-z", base_commit, "--",
                   what="git diff")
    else:
        with _temp_index(worktree) as env:
            untracked = _untracked(worktree, env)
            _intent_to_add(worktree, untracked, env)
            out = _out(worktree, *_DIFF_OPTS, "--numstat", "-z", base_commit, "--", env=env,
                       what="git diff")
    added = deleted = 0
    for token in out.split("\0"):
        parts = token.split("\t")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            added += int(parts[0])
            deleted += int(parts[1])
    return added, deleted


def fork_point(worktree: Path, base_commit: str, base_branch: str | None, *,
               head: str = "HEAD") -> str:
    """The commit a task's changes are measured from: the merge base of its HEAD and its
    base branch's current tip. A task that merged (or rebased onto) its base branch since
    it started is measured from there, so what landed on the base meanwhile never shows as
    the task's own change. ``base_commit`` when there is no base branch (a task started
    from a tag or commit) or git cannot tell (the branch is gone). ``head``: another
    commit than the worktree's HEAD (a remote task's, fetched into the main repository)."""
    if not base_branch:
        return base_commit
    status, out, _ = _run(Path(worktree), "merge-base", f"refs/heads/{base_branch}", head,
                          check=False)
    found = out.strip()
    return found if status == 0 and _SHA_RE.match(found) else base_commit

