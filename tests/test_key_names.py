"""A file whose NAME holds the API key (review finding): the diff names it with the key
hidden and lists it among the files that hold the key; the merge (and its preview)
refuses it, in the changes or in the branch's history, and says precisely what it found
(a name in a folder, not "a folder listing"). Real git repositories; no worker."""

from __future__ import annotations

from pathlib import Path

from test_git import commit_all, git, snapshot

from fleet_tui import git as fgit
from fleet_tui import redaction

KEY = "sk-key-names-SECRET-90b1e2"


def test_a_file_named_after_the_key_is_named_hidden_and_refused(git_repo: Path) -> None:
    info = fgit.create_worktree(git_repo, "n1")
    (info.path / "notes").mkdir()
    (info.path / "notes" / f"{KEY}.txt").write_text("harmless\n")
    (info.path / "feature.txt").write_text("work\n")
    hidden = f"notes/{fgit.REDACTED}.txt"
    diff = fgit.diff(info.path, info.base_commit, secrets=(KEY,))
    assert sorted(f.path for f in diff.files) == ["feature.txt", hidden]
    assert diff.secret_paths == [hidden]
    assert KEY not in diff.patch and all(KEY not in f.patch for f in diff.files)
    preview = fgit.conflict_preview(git_repo, info.branch, "main", worktree=info.path,
                                    secrets=(KEY,))
    assert preview.reason == "secret" and preview.secret_paths == [hidden]
    before = snapshot(git_repo)
    commit_all(info.path, "work")
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="x",
                        secrets=(KEY,))
    assert not result.merged
    assert result.message == (f"the changes of {info.branch} contain the API key in: "
                              f"{hidden}; remove it before merging")
    assert snapshot(git_repo) == before


def test_a_name_in_the_history_is_said_as_a_name(git_repo: Path) -> None:
    info = fgit.create_worktree(git_repo, "n2")
    (info.path / "src" / f"{KEY}.txt").write_text("harmless\n")
    commit_all(info.path, "oops")
    git(info.path, "mv", f"src/{KEY}.txt", "src/renamed.txt")
    commit_all(info.path, "renamed it")
    before = snapshot(git_repo)
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="x",
                        secrets=(KEY,))
    assert not result.merged and KEY not in result.message
    assert result.message == (
        f"an earlier commit of {info.branch} contains the API key in: the name "
        f"src/{fgit.REDACTED}.txt in folder src; a merge would copy it into the history "
        "of main: remove it from the branch's commits, or discard the task")
    assert snapshot(git_repo) == before


def test_the_one_helper() -> None:
    redaction.forget_all()
    try:
        assert redaction.redact(f"a {KEY} b") == f"a {KEY} b"  # nothing known yet
        assert redaction.redact(f"a {KEY} b", [KEY]) == f"a {redaction.MARK} b"
        assert redaction.redact("a short b", ["short"]) == "a short b"  # too short to look for
        redaction.remember([KEY])
        assert redaction.redact(f"{KEY}{KEY}") == redaction.MARK * 2
        assert redaction.redact_bytes(f'{{"k": "{KEY}"}}'.encode()) == \
            f'{{"k": "{redaction.MARK}"}}'.encode()
        redaction.remember([KEY + "-longer"])  # one holding another: the longer first
        assert redaction.redact(f"x {KEY}-longer") == f"x {redaction.MARK}"
    finally:
        redaction.forget_all()
