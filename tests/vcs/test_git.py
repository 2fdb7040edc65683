"""fleet_tui.vcs.git against real git repositories (the `git_repo` fixture)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fleet_tui.vcs import git as fgit
from fleet_tui.vcs import merge as fmerge


def git(cwd: Path, *args: str) -> str:
    """Run the git CLI directly (independent of the code under test); stdout."""
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


GIT_STATE_FILES = ("MERGE_HEAD", "ORIG_HEAD", "MERGE_MSG", "SQUASH_MSG", "MERGE_MODE")


def snapshot(repo: Path) -> tuple[dict[str, str], str, str, str, dict[str, str | None]]:
    """Hash of every file in the main checkout (outside .git and .fleet-work, ignored files
    included), its status, its HEAD, the entries of its index and the merge-state files of
    its git dir (MERGE_HEAD, ORIG_HEAD, ...), so "unchanged" can be checked byte for byte."""
    files: dict[str, str] = {}
    for path in sorted(repo.rglob("*")):
        rel = path.relative_to(repo)
        if rel.parts[0] in (".git", ".fleet-work") or not path.is_file():
            continue
        files[str(rel)] = hashlib.sha256(path.read_bytes()).hexdigest()
    status = git(repo, "status", "--porcelain", "--untracked-files=all")
    head = git(repo, "rev-parse", "HEAD")
    index = git(repo, "ls-files", "--stage")
    state = {name: ((repo / ".git" / name).read_text() if (repo / ".git" / name).exists()
                    else None) for name in GIT_STATE_FILES}
    return files, status, head, index, state


def commit_all(cwd: Path, message: str) -> str:
    git(cwd, "add", "-A")
    git(cwd, "commit", "-q", "-m", message)
    return git(cwd, "rev-parse", "HEAD").strip()


# --- find_repo --------------------------------------------------------------------------------


def test_find_repo_from_subfolder(git_repo: Path) -> None:
    assert fgit.find_repo(git_repo / "src") == git_repo.resolve()
    assert fgit.find_repo(git_repo / "src" / "app.py") == git_repo.resolve()


def test_find_repo_not_a_repository(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(fgit.GitError, match=r"not inside a git repository.*git init"):
        fgit.find_repo(plain)


def test_find_repo_missing_path(tmp_path: Path) -> None:
    with pytest.raises(fgit.GitError, match="does not exist"):
        fgit.find_repo(tmp_path / "nope")


def test_find_repo_bare(tmp_path: Path) -> None:
    bare = tmp_path / "bare.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    with pytest.raises(fgit.GitError, match=r"bare repository.*git clone"):
        fgit.find_repo(bare)


def test_find_repo_no_commit(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q", "-b", "main")
    with pytest.raises(fgit.GitError, match=r"no commit yet.*git commit"):
        fgit.find_repo(empty)


def test_find_repo_inside_worktree_and_logs(git_repo: Path) -> None:
    info = fgit.create_worktree(git_repo, "abc123")
    (info.path / "sub").mkdir()
    # Inside a task's worktree: that worktree is its own checkout; main_worktree maps back.
    assert fgit.find_repo(info.path / "sub") == info.path.resolve()
    assert fgit.main_worktree(info.path / "sub") == git_repo.resolve()
    # The logs folder under .fleet-work/ is not a worktree: it belongs to the main checkout.
    logs = git_repo / ".fleet-work" / ".logs" / "abc123" / "1"
    logs.mkdir(parents=True)
    assert fgit.find_repo(logs) == git_repo.resolve()
    assert fgit.main_worktree(git_repo / "src") == git_repo.resolve()


# --- worktrees --------------------------------------------------------------------------------


def test_create_worktree_and_exclude(git_repo: Path) -> None:
    head = git(git_repo, "rev-parse", "HEAD").strip()
    info = fgit.create_worktree(git_repo, "t1")
    assert info.path == (git_repo / ".fleet-work" / "t1").resolve()
    assert info.branch == "fleet/t1"
    assert info.base_commit == head
    assert info.base_branch == "main"
    assert (info.path / "src" / "app.py").read_text() == "def main():\n    return 1\n"
    assert git(info.path, "rev-parse", "--abbrev-ref", "HEAD").strip() == "fleet/t1"
    fgit.verify_worktree(info.path, "fleet/t1")
    # .fleet-work/ is invisible to git in the main checkout, and the line is added once.
    assert git(git_repo, "status", "--porcelain", "--untracked-files=all") == ""
    fgit.create_worktree(git_repo, "t2")
    exclude = (git_repo / ".git" / "info" / "exclude").read_text()
    assert exclude.count("/.fleet-work/") == 1


def test_create_worktree_from_branch_and_detached(git_repo: Path) -> None:
    git(git_repo, "branch", "feature")
    info = fgit.create_worktree(git_repo, "b1", "feature")
    assert info.base_branch == "feature"
    tag_commit = git(git_repo, "rev-parse", "HEAD").strip()
    git(git_repo, "tag", "v1")
    info2 = fgit.create_worktree(git_repo, "b2", "v1")
    assert info2.base_branch is None and info2.base_commit == tag_commit
    git(git_repo, "checkout", "-q", "--detach")
    info3 = fgit.create_worktree(git_repo, "b3")
    assert info3.base_branch is None and info3.base_commit == tag_commit


def test_create_worktree_unknown_base(git_repo: Path) -> None:
    with pytest.raises(fgit.GitError, match="unknown ref 'no-such-branch'"):
        fgit.create_worktree(git_repo, "u1", "no-such-branch")
    assert not (git_repo / ".fleet-work" / "u1").exists()
    assert "fleet/u1" not in git(git_repo, "branch", "--list")


def test_create_worktree_bad_id(git_repo: Path) -> None:
    with pytest.raises(fgit.GitError, match="bad task id"):
        fgit.create_worktree(git_repo, "../evil")


def test_retry_never_reuses_stale_worktree(git_repo: Path) -> None:
    info = fgit.create_worktree(git_repo, "r1")
    (info.path / "stale.txt").write_text("left by attempt 1\n")
    with pytest.raises(fgit.GitError, match="exists already"):
        fgit.create_worktree(git_repo, "r1")
    assert (info.path / "stale.txt").exists()  # the refusal changed nothing
    fresh = fgit.create_worktree(git_repo, "r1", reset=True)
    assert fresh.path == info.path
    assert not (fresh.path / "stale.txt").exists()
    fgit.verify_worktree(fresh.path, "fleet/r1")


def test_retry_with_only_branch_left(git_repo: Path) -> None:
    git(git_repo, "branch", "fleet/r2")
    with pytest.raises(fgit.GitError, match="fleet/r2 exists already"):
        fgit.create_worktree(git_repo, "r2")
    info = fgit.create_worktree(git_repo, "r2", reset=True)
    fgit.verify_worktree(info.path, "fleet/r2")


def test_failed_creation_leaves_nothing(git_repo: Path) -> None:
    """Defect 8: when the worktree cannot be made, the caller gets an error, not main."""
    git(git_repo, "branch", "fleet")  # refs/heads/fleet blocks refs/heads/fleet/<id>
    with pytest.raises(fgit.GitError, match="could not create the worktree"):
        fgit.create_worktree(git_repo, "f1")
    assert not (git_repo / ".fleet-work" / "f1").exists()
    assert "fleet/f1" not in git(git_repo, "branch", "--list")
    git(git_repo, "branch", "-D", "fleet")
    shutil.rmtree(git_repo / ".fleet-work")
    (git_repo / ".fleet-work").write_text("a file where the folder should be\n")
    with pytest.raises(fgit.GitError, match="cannot create"):
        fgit.create_worktree(git_repo, "f2")


def test_verify_worktree_rejects_main_checkout_and_missing(git_repo: Path) -> None:
    # Defect 8: a folder that is not its own worktree (here: a plain folder in main) fails.
    plain = git_repo / ".fleet-work" / "x9"
    plain.mkdir(parents=True)
    with pytest.raises(fgit.GitError, match="not a git worktree of its own"):
        fgit.verify_worktree(plain, "fleet/x9")
    with pytest.raises(fgit.GitError, match="does not exist"):
        fgit.verify_worktree(git_repo / ".fleet-work" / "gone", "fleet/gone")
    info = fgit.create_worktree(git_repo, "v1")
    with pytest.raises(fgit.GitError, match="not on branch fleet/other"):
        fgit.verify_worktree(info.path, "fleet/other")


def test_worktree_registered_but_its_folder_deleted_is_stale(git_repo: Path) -> None:
    """Defect 9: a folder deleted by hand (still registered with git) is not reused."""
    info = fgit.create_worktree(git_repo, "g1")
    shutil.rmtree(info.path)
    git(git_repo, "branch", "-m", "fleet/g1", "elsewhere")  # only the registration is left
    with pytest.raises(fgit.GitError, match="exists already"):
        fgit.create_worktree(git_repo, "g1")
    fresh = fgit.create_worktree(git_repo, "g1", reset=True)
    fgit.verify_worktree(fresh.path, "fleet/g1")
    assert (fresh.path / "src" / "app.py").exists()


def test_create_worktree_reads_packed_refs(git_repo: Path) -> None:
    """HEAD, the base branch and the stale-branch check come from git's files, packed too."""
    head = git(git_repo, "rev-parse", "HEAD").strip()
    git(git_repo, "branch", "fleet/p2")
    git(git_repo, "pack-refs", "--all")
    assert not (git_repo / ".git" / "refs" / "heads" / "main").exists()
    info = fgit.create_worktree(git_repo, "p1")
    assert (info.base_commit, info.base_branch) == (head, "main")
    with pytest.raises(fgit.GitError, match="fleet/p2 exists already"):
        fgit.create_worktree(git_repo, "p2")
    by_commit = fgit.create_worktree(git_repo, "p3", head)
    assert by_commit.base_commit == head and by_commit.base_branch is None


def test_create_worktree_unknown_commit(git_repo: Path) -> None:
    with pytest.raises(fgit.GitError, match="unknown ref"):
        fgit.create_worktree(git_repo, "z1", "0" * 40)
    assert not (git_repo / ".fleet-work" / "z1").exists()
    assert "fleet/z1" not in git(git_repo, "branch", "--list")
    fgit.create_worktree(git_repo, "z1")  # nothing was left behind


def test_verify_worktree_detached_or_unregistered(git_repo: Path) -> None:
    """The file check must not pass what git would not: a detached worktree, or one
    whose registration was pruned, goes to git and fails there."""
    info = fgit.create_worktree(git_repo, "w1")
    git(info.path, "checkout", "-q", "--detach")
    with pytest.raises(fgit.GitError, match="not on branch fleet/w1"):
        fgit.verify_worktree(info.path, "fleet/w1")
    other = fgit.create_worktree(git_repo, "w2")
    shutil.rmtree(git_repo / ".git" / "worktrees" / "w2")
    with pytest.raises(fgit.GitError, match="not a git worktree of its own"):
        fgit.verify_worktree(other.path, "fleet/w2")


@pytest.mark.parametrize("change", ["none", "tracked", "committed", "untracked", "staged-rename"])
def test_diff_stat_matches_diff(git_repo: Path, change: str) -> None:
    """diff_stat takes shortcuts (one `git status` for an untouched worktree); its counts
    are always those of the full diff."""
    info = fgit.create_worktree(git_repo, f"s-{change}")
    wt = info.path
    if change == "tracked":
        (wt / "src" / "app.py").write_text("def main():\n    return 3\n# more\n")
    elif change == "committed":
        (wt / "new.py").write_text("x = 1\ny = 2\n")
        commit_all(wt, "worker commit")
    elif change == "untracked":
        (wt / "notes.md").write_text("a\nb\n")
    elif change == "staged-rename":
        git(wt, "mv", "src/app.py", "src/main.py")
    index = git_repo / ".git" / "worktrees" / f"s-{change}" / "index"
    before = index.read_bytes()
    full = fgit.diff(wt, info.base_commit)
    assert fgit.diff_stat(wt, info.base_commit) == (full.added, full.deleted)
    assert index.read_bytes() == before  # the worktree's own index is left alone
    if change != "none":
        assert full.files


# --- diff -------------------------------------------------------------------------------------


def test_diff_committed_uncommitted_untracked_deleted_binary(git_repo: Path) -> None:
    (git_repo / "old_name.txt").write_text("".join(f"line {i}\n" for i in range(20)))
    commit_all(git_repo, "add a file to rename")
    info = fgit.create_worktree(git_repo, "d1")
    wt = info.path
    # committed: a new file and a rename
    (wt / "committed.py").write_text("a = 1\nb = 2\n")
    git(wt, "mv", "old_name.txt", "new_name.txt")
    commit_all(wt, "worker commit")
    # uncommitted: a modification and a deletion
    (wt / "src" / "app.py").write_text("def main():\n    return 2\n\n# done\n")
    (wt / "README.md").unlink()
    # untracked: text and binary
    (wt / "notes.md").write_text("one\ntwo\nthree\n")
    (wt / "blob.bin").write_bytes(b"\x00\x01\x02binary\x00data")
    index_before = (git_repo / ".git" / "worktrees" / "d1" / "index").read_bytes()

    result = fgit.diff(wt, info.base_commit)
    by_path = {f.path: f for f in result.files}
    assert set(by_path) == {"committed.py", "new_name.txt", "src/app.py", "README.md",
                            "notes.md", "blob.bin"}
    assert by_path["committed.py"].status == "added"
    assert (by_path["committed.py"].added, by_path["committed.py"].deleted) == (2, 0)
    assert by_path["new_name.txt"].status == "renamed"
    assert by_path["new_name.txt"].old_path == "old_name.txt"
    assert by_path["src/app.py"].status == "modified"
    assert (by_path["src/app.py"].added, by_path["src/app.py"].deleted) == (3, 1)
    assert "+    return 2" in by_path["src/app.py"].patch
    assert "-    return 1" in by_path["src/app.py"].patch
    assert by_path["README.md"].status == "deleted"
    assert (by_path["README.md"].added, by_path["README.md"].deleted) == (0, 1)
    assert by_path["notes.md"].status == "untracked"
    assert by_path["notes.md"].added == 3
    assert "+two" in by_path["notes.md"].patch
    assert by_path["blob.bin"].status == "untracked"
    assert by_path["blob.bin"].binary and by_path["blob.bin"].patch == ""
    for f in result.files:
        if not f.binary:
            assert f.patch.startswith("diff --git ")
            assert f.patch in result.patch
    assert result.added == sum(f.added for f in result.files)
    # The worktree's index and status were not touched by computing the diff.
    assert (git_repo / ".git" / "worktrees" / "d1" / "index").read_bytes() == index_before
    assert "?? notes.md" in git(wt, "status", "--porcelain")
    assert fgit.diff_stat(wt, info.base_commit) == (result.added, result.deleted)


def test_diff_commits_reads_a_commit_as_diff_reads_a_worktree(git_repo: Path) -> None:
    """A remote task's work fetched as a commit: the same files, counts and patches as the
    worktree's diff, and the key found in a text file and in a binary's blob, hidden."""
    key = "sk-diff-commits-" + "k" * 24
    info = fgit.create_worktree(git_repo, "dc1")
    wt = info.path
    (wt / "committed.py").write_text("a = 1\n")
    commit_all(wt, "worker commit")
    (wt / "src" / "app.py").write_text("def main():\n    return 2\n")
    (wt / "leak.txt").write_text(f"token = {key}\n")
    (wt / "blob.bin").write_bytes(b"\x00\x01" + key.encode() + b"\x00")
    from_worktree = fgit.diff(wt, info.base_commit, secrets=[key])
    commit_all(wt, "everything, as a snapshot commits it")
    tip = git(wt, "rev-parse", "HEAD").strip()
    from_commit = fgit.diff_commits(git_repo, info.base_commit, tip, secrets=[key])
    shape = [(f.path, f.status.replace("untracked", "added"), f.added, f.deleted, f.binary)
             for f in from_worktree.files]
    assert [(f.path, f.status, f.added, f.deleted, f.binary)
            for f in from_commit.files] == shape
    assert sorted(from_commit.secret_paths) == ["blob.bin", "leak.txt"]
    assert key not in from_commit.patch and fgit.REDACTED in from_commit.patch
    assert fgit.fork_point(git_repo, info.base_commit, "main", head=tip) == info.base_commit
    with pytest.raises(fgit.GitError, match="unknown commit"):
        fgit.diff_commits(git_repo, info.base_commit, "0" * 40)


def test_diff_rename_without_git_mv(git_repo: Path) -> None:
    (git_repo / "long.txt").write_text("".join(f"row {i}\n" for i in range(30)))
    commit_all(git_repo, "long file")
    info = fgit.create_worktree(git_repo, "d3")
    (info.path / "long.txt").rename(info.path / "moved.txt")  # plain mv: untracked + deleted
    result = fgit.diff(info.path, info.base_commit)
    assert [(f.status, f.path, f.old_path) for f in result.files] == [
        ("renamed", "moved.txt", "long.txt")]


def test_diff_empty_and_errors(git_repo: Path) -> None:
    info = fgit.create_worktree(git_repo, "d2")
    empty = fgit.diff(info.path, info.base_commit)
    assert empty.files == [] and empty.patch == ""
    assert fgit.diff_stat(info.path, info.base_commit) == (0, 0)
    with pytest.raises(fgit.GitError, match="unknown base commit"):
        fgit.diff(info.path, "0" * 40)
    with pytest.raises(fgit.GitError, match="does not exist"):
        fgit.diff(git_repo / ".fleet-work" / "gone", info.base_commit)


def test_diff_large_counts_every_file_and_line(git_repo: Path) -> None:
    """200 files / 20,000 changed lines: committed, modified and untracked in one diff.
    (Its speed budget is bench/diff.py's diff.git_mixed.)"""
    for i in range(100):
        (git_repo / f"mod{i:03}.txt").write_text("".join(f"orig {i} {j}\n" for j in range(50)))
    commit_all(git_repo, "files to modify")
    info = fgit.create_worktree(git_repo, "big")
    wt = info.path
    for i in range(100):  # 100 modified files, 100 lines changed (+50 -50) each
        (wt / f"mod{i:03}.txt").write_text("".join(f"new {i} {j}\n" for j in range(50)))
    for i in range(50):  # 50 committed new files, 100 lines each
        (wt / f"new{i:03}.py").write_text("".join(f"x_{j} = {j}\n" for j in range(100)))
    commit_all(wt, "worker")
    for i in range(50):  # 50 untracked files, 100 lines each
        (wt / f"untracked{i:03}.md").write_text("".join(f"- item {j}\n" for j in range(100)))
    result = fgit.diff(wt, info.base_commit)
    assert len(result.files) == 200
    assert result.added + result.deleted == 20_000
    assert sum(1 for f in result.files if f.status == "untracked") == 50


# --- conflict preview -------------------------------------------------------------------------


def test_conflict_preview_clean_and_conflicting(git_repo: Path) -> None:
    info = fgit.create_worktree(git_repo, "c1")
    (info.path / "src" / "app.py").write_text("def main():\n    return 'worker'\n")
    (info.path / "extra.txt").write_text("new\n")
    before = snapshot(git_repo)
    wt_status = git(info.path, "status", "--porcelain")

    clean = fgit.conflict_preview(git_repo, info.branch, "main")
    assert clean.clean and clean.conflicts == [] and clean.uncommitted
    assert "merges cleanly" in clean.message and "uncommitted" in clean.message

    # main moves on and touches the same line: uncommitted worktree change now conflicts
    (git_repo / "src" / "app.py").write_text("def main():\n    return 'main'\n")
    commit_all(git_repo, "main changes app")
    before = snapshot(git_repo)
    index_bytes = (git_repo / ".git" / "index").read_bytes()
    conflict = fgit.conflict_preview(git_repo, info.branch, "main")
    assert not conflict.clean
    assert conflict.conflicts == ["src/app.py"]
    assert "src/app.py" in conflict.message
    # the way out it names is the one there is: update from main, the worker resolves
    assert "update ID --resolve worker" in conflict.message and "u in the panel" in \
        conflict.message
    # Nothing changed: not the main checkout, not the worktree, not any branch.
    assert snapshot(git_repo) == before
    assert (git_repo / ".git" / "index").read_bytes() == index_bytes
    assert git(info.path, "status", "--porcelain") == wt_status
    assert git(git_repo, "rev-parse", "fleet/c1").strip() == info.base_commit


def test_conflict_preview_committed_only(git_repo: Path) -> None:
    info = fgit.create_worktree(git_repo, "c2")
    (info.path / "README.md").write_text("# worker\n")
    commit_all(info.path, "worker")
    (git_repo / "README.md").write_text("# main\n")
    commit_all(git_repo, "main")
    preview = fgit.conflict_preview(git_repo, info.branch, "main", worktree=info.path)
    assert not preview.clean and not preview.uncommitted
    assert preview.conflicts == ["README.md"]
    with pytest.raises(fgit.GitError, match="base branch 'nope'"):
        fgit.conflict_preview(git_repo, info.branch, "nope")


# --- merge ------------------------------------------------------------------------------------


def _worker_change(git_repo: Path, task_id: str) -> fgit.WorktreeInfo:
    info = fgit.create_worktree(git_repo, task_id)
    (info.path / "src" / "feature.py").write_text("def feature():\n    return 42\n")
    (info.path / "src" / "app.py").write_text("def main():\n    return 2\n")
    return info


def test_merge_success(git_repo: Path) -> None:
    info = _worker_change(git_repo, "m1")
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="Add feature",
                        trailers={"Fleet-Task": "m1", "Fleet-Session": "sess-123"})
    assert result.merged, result.message
    assert result.commit == git(git_repo, "rev-parse", "HEAD").strip()
    # a real merge commit on main, with our trailers
    parents = git(git_repo, "rev-list", "--parents", "-n", "1", "HEAD").split()
    assert len(parents) == 3
    trailers = git(git_repo, "log", "-1", "--format=%(trailers:only,unfold)", "HEAD^2")
    assert "Fleet-Task: m1" in trailers and "Fleet-Session: sess-123" in trailers
    assert git(git_repo, "log", "-1", "--format=%s", "HEAD^2").strip() == "Add feature"
    assert "Fleet-Task: m1" in git(git_repo, "log", "-1", "--format=%B", "HEAD")
    assert (git_repo / "src" / "feature.py").read_text() == "def feature():\n    return 42\n"
    # worktree and branch are gone (defect 10), main checkout is clean
    assert not info.path.exists()
    assert "fleet/m1" not in git(git_repo, "branch", "--list")
    assert str(info.path) not in git(git_repo, "worktree", "list")
    assert git(git_repo, "status", "--porcelain") == ""
    # idempotent: a second merge and a discard afterwards are no-ops, not errors
    head = git(git_repo, "rev-parse", "HEAD")
    again = fgit.merge(git_repo, info.path, info.branch, "main", message="Add feature")
    assert not again.merged and "no longer exists" in again.message
    fgit.discard(git_repo, info.path, info.branch)
    assert git(git_repo, "rev-parse", "HEAD") == head


def test_merge_squash(git_repo: Path) -> None:
    info = _worker_change(git_repo, "s1")
    base = git(git_repo, "rev-parse", "HEAD").strip()
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="Squashed work",
                        trailers={"Fleet-Task": "s1"}, strategy="squash")
    assert result.merged, result.message
    parents = git(git_repo, "rev-list", "--parents", "-n", "1", "HEAD").split()
    assert parents[1:] == [base]  # one ordinary commit on top of the base
    body = git(git_repo, "log", "-1", "--format=%B", "HEAD")
    assert body.startswith("Squashed work") and "Fleet-Task: s1" in body
    assert (git_repo / "src" / "feature.py").exists()
    assert not info.path.exists() and "fleet/s1" not in git(git_repo, "branch", "--list")


def test_merge_refused_on_dirty_checkout(git_repo: Path) -> None:
    info = _worker_change(git_repo, "m2")
    (git_repo / "README.md").write_text("# local edit\n")
    before = snapshot(git_repo)
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="x")
    assert not result.merged and result.commit is None
    assert "uncommitted changes" in result.message and "README.md" in result.message
    assert snapshot(git_repo) == before
    assert info.path.is_dir()  # the task is kept for a later merge


def test_merge_ignores_untracked_in_main(git_repo: Path) -> None:
    info = _worker_change(git_repo, "m5")
    (git_repo / "scratch.txt").write_text("mine\n")
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="x")
    assert result.merged, result.message
    assert (git_repo / "scratch.txt").read_text() == "mine\n"


def test_merge_blocked_by_untracked_file_in_main(git_repo: Path) -> None:
    """Finding 11: the refusal names the file and leaves no ORIG_HEAD behind."""
    info = _worker_change(git_repo, "m8")
    (git_repo / "src" / "feature.py").write_text("my own untracked work\n")
    before = snapshot(git_repo)
    assert before[4]["ORIG_HEAD"] is None
    preview = fgit.conflict_preview(git_repo, info.branch, "main", worktree=info.path)
    assert not preview.clean and preview.reason == "overwrite"
    assert preview.blocked == ["src/feature.py"]
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="x")
    assert not result.merged
    assert "untracked or ignored" in result.message and "src/feature.py" in result.message
    assert snapshot(git_repo) == before
    assert info.path.is_dir()
    assert git(info.path, "status", "--porcelain")  # the worker's changes stay uncommitted


def test_merge_without_git_identity(git_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = _worker_change(git_repo, "m9")
    for name in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME",
                 "GIT_COMMITTER_EMAIL"):
        monkeypatch.delenv(name, raising=False)
    git(git_repo, "config", "--unset", "user.name")
    git(git_repo, "config", "--unset", "user.email")
    git(git_repo, "config", "user.useConfigOnly", "true")
    before = snapshot(git_repo)
    wt_status = git(info.path, "status", "--porcelain")
    # Finding 8: the preview says so (it said "merges cleanly"), and so does the merge,
    # before anything is committed anywhere.
    preview = fgit.conflict_preview(git_repo, info.branch, "main", worktree=info.path)
    assert not preview.clean and preview.reason == "identity"
    assert "does not know who you are" in preview.message
    assert "git config --global user.name" in preview.message
    assert fgit.check_identity(git_repo) == preview.message
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="x",
                        test_command="echo the tests ran")
    assert not result.merged and result.message == preview.message
    assert result.test_output is None  # refused before the test
    assert snapshot(git_repo) == before
    assert git(info.path, "status", "--porcelain") == wt_status
    assert git(git_repo, "rev-parse", info.branch).strip() == info.base_commit


def test_merge_refused_on_other_branch(git_repo: Path) -> None:
    info = _worker_change(git_repo, "m3")
    git(git_repo, "switch", "-q", "-c", "elsewhere")
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="x")
    assert not result.merged
    assert "on elsewhere, not on main" in result.message and "git switch main" in result.message
    assert git(git_repo, "rev-parse", "main").strip() == info.base_commit


def test_failing_test_command_blocks_merge(git_repo: Path) -> None:
    info = _worker_change(git_repo, "m4")
    before = snapshot(git_repo)
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="x",
                        test_command="echo running checks; ls src; echo broken >&2; exit 3")
    assert not result.merged
    assert "test command failed" in result.message
    assert result.test_output is not None
    assert "running checks" in result.test_output and "feature.py" in result.test_output
    assert "broken" in result.test_output and "status 3" in result.test_output
    assert snapshot(git_repo) == before
    # nothing committed on the task branch either
    assert git(git_repo, "rev-parse", "fleet/m4").strip() == info.base_commit
    passing = fgit.merge(git_repo, info.path, info.branch, "main", message="x",
                         test_command="test -f src/feature.py && echo ok")
    assert passing.merged and passing.test_output is not None and "ok" in passing.test_output


def test_test_command_timeout(git_repo: Path, tmp_path: Path) -> None:
    """The merge stops the test command at its timeout: the shell is gone when merge
    returns and the step after its `sleep` never ran. (The time it takes is bench/
    engine.py's engine.test_gate_timeout.)"""
    info = _worker_change(git_repo, "m6")
    pid_file, after = tmp_path / "shell.pid", tmp_path / "after-the-sleep"
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="x",
                        test_command=f"echo $$ > {pid_file}; sleep 30; touch {after}",
                        test_timeout=0.5)
    assert not result.merged and result.test_output is not None
    assert "timed out" in result.test_output
    shell = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(shell, 0)
    assert not after.exists()


def test_test_command_gets_no_key(git_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = "sk-test-" + os.urandom(8).hex()
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", key)
    info = _worker_change(git_repo, "m7")
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="x",
                        test_command="env; echo token=${ANTHROPIC_AUTH_TOKEN:-unset}")
    assert result.merged
    assert result.test_output is not None and "token=unset" in result.test_output
    assert key not in result.test_output


def test_conflict_leaves_main_byte_identical(git_repo: Path) -> None:
    info = fgit.create_worktree(git_repo, "k1")
    (info.path / "src" / "app.py").write_text("def main():\n    return 'worker'\n")
    commit_all(info.path, "worker")
    (git_repo / "src" / "app.py").write_text("def main():\n    return 'main'\n")
    commit_all(git_repo, "main moved")
    (git_repo / "untracked-note.txt").write_text("keep me\n")
    before = snapshot(git_repo)
    for strategy in ("merge", "squash"):
        result = fgit.merge(git_repo, info.path, info.branch, "main", message="x",
                            strategy=strategy)
        assert not result.merged
        assert result.conflicts == ["src/app.py"]
        assert "conflicts" in result.message
        assert snapshot(git_repo) == before
        assert not (git_repo / ".git" / "MERGE_HEAD").exists()
    assert info.path.is_dir() and "fleet/k1" in git(git_repo, "branch", "--list")


@pytest.mark.parametrize("strategy", ["merge", "squash"])
def test_real_merge_conflict_is_rolled_back(git_repo: Path, monkeypatch: pytest.MonkeyPatch,
                                            strategy: str) -> None:
    """Even if the merge-tree pre-check were wrong, a conflicting `git merge` is undone."""
    info = fgit.create_worktree(git_repo, "k2")
    (info.path / "src" / "app.py").write_text("def main():\n    return 'worker'\n")
    (info.path / "added-by-worker.txt").write_text("new\n")
    commit_all(info.path, "worker")
    (git_repo / "src" / "app.py").write_text("def main():\n    return 'main'\n")
    commit_all(git_repo, "main moved")
    before = snapshot(git_repo)
    real = fmerge._merge_tree
    # skip the pre-check: report merge-tree's (conflicted) tree as clean
    monkeypatch.setattr(fmerge, "_merge_tree", lambda *a: (real(*a)[0], []))
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="x",
                        strategy=strategy)
    assert not result.merged
    assert result.conflicts == ["src/app.py"]
    assert "restored (HEAD, index and files checked)" in result.message
    assert snapshot(git_repo) == before  # ORIG_HEAD, MERGE_MSG, SQUASH_MSG included
    assert not (git_repo / "added-by-worker.txt").exists()


def test_nothing_to_merge(git_repo: Path) -> None:
    info = fgit.create_worktree(git_repo, "n1")
    result = fgit.merge(git_repo, info.path, info.branch, "main", message="x")
    assert not result.merged and "nothing to merge" in result.message
    assert info.path.is_dir()


def test_merge_bad_strategy(git_repo: Path) -> None:
    info = fgit.create_worktree(git_repo, "n2")
    with pytest.raises(fgit.GitError, match="unknown merge strategy 'rebase'"):
        fgit.merge(git_repo, info.path, info.branch, "main", message="x", strategy="rebase")


# --- discard ----------------------------------------------------------------------------------


def test_discard_idempotent(git_repo: Path) -> None:
    info = _worker_change(git_repo, "x1")
    commit_all(info.path, "worker")
    (info.path / "dirty.txt").write_text("uncommitted\n")
    before = snapshot(git_repo)
    fgit.discard(git_repo, info.path, info.branch)
    assert not info.path.exists()
    assert "fleet/x1" not in git(git_repo, "branch", "--list")
    assert str(info.path) not in git(git_repo, "worktree", "list")
    fgit.discard(git_repo, info.path, info.branch)  # second call: no-op, no error
    assert snapshot(git_repo) == before
    # the id can be reused afterwards without reset
    fgit.create_worktree(git_repo, "x1")


def test_discard_worktree_folder_deleted_by_hand(git_repo: Path) -> None:
    info = fgit.create_worktree(git_repo, "x2")
    shutil.rmtree(info.path)
    fgit.discard(git_repo, info.path, info.branch)
    assert "fleet/x2" not in git(git_repo, "branch", "--list")
    assert "x2" not in git(git_repo, "worktree", "list")
