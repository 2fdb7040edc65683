"""A merge killed midway: the intent record and its recovery.

Before `git merge` changes the main checkout, the merge writes an intent record beside the
repository lock (``.git/fleet-tui-merge.json``): the branch, the commit being merged (the
tested one), main's commit and `git status` before, the tree the merge makes. It is removed
once the merge is done or rolled back. A record found by the next merge (under the same
lock, so its writer is gone) means a merge that was killed midway: recover_merge puts main
back as it was before it, or, when the merge commit was made, finishes what was left (merge
state files, the worktree and the branch). git itself runs in a process group of its own
that dies with the merging process (PR_SET_PDEATHSIG, ``_run_merging``), and the recovery
stops what is left of that group (a commit hook), so nothing changes the checkout behind
the recovery's back."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from fleet_tui.system import procs
from fleet_tui.system.gitplumbing import shown as _shown
from fleet_tui.vcs.gitfiles import _common_dir, _main_git_dir
from fleet_tui.vcs.repository import _lock_file
from fleet_tui.vcs.run import GitError, _is_ancestor, _out, _rev, _run, _status_all
from fleet_tui.vcs.worktrees import _delete_branch, _remove_worktree

MERGE_INTENT_FILE = "fleet-tui-merge.json"
_OURS_STATE = ("MERGE_HEAD", "MERGE_MSG", "MERGE_MODE", "SQUASH_MSG", "AUTO_MERGE")


def merge_intent_file(repo: Path) -> Path:
    """Where a merge into `repo`'s main checkout keeps its intent while it runs."""
    return _lock_file(Path(repo)).with_name(MERGE_INTENT_FILE)


def _write_intent(repo: Path, data: dict[str, object]) -> None:
    target = merge_intent_file(repo)
    tmp = target.with_name(target.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)


def _read_intent(repo: Path) -> dict[str, object] | None:
    try:
        data = json.loads(merge_intent_file(repo).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: a record nonetheless (see recover_merge)
    return data if isinstance(data, dict) else {}


def _drop_intent(repo: Path) -> None:
    with contextlib.suppress(OSError):
        merge_intent_file(repo).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        _saved_index(repo).unlink(missing_ok=True)


MERGE_TOKEN_ENV = "FLEET_MERGE_TOKEN"  # carried by the merge's git and its hooks


def _die_with(parent: int) -> Callable[[], None]:
    def die() -> None:  # pragma: no cover - runs in the forked child
        procs.set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the line above
            os.kill(os.getpid(), signal.SIGKILL)
    return die


def _run_merging(repo: Path, intent: Mapping[str, object], *args: str
                 ) -> tuple[int, str, str]:
    """`git args` in the main checkout, killed by the kernel when this process dies, and
    marked with the intent's token (its hooks inherit it) so that a recovery can stop
    whatever of it is left."""
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0")
    env[MERGE_TOKEN_ENV] = str(intent["token"])
    try:
        proc = subprocess.Popen(["git", *args], cwd=repo, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, preexec_fn=_die_with(os.getpid()))
    except OSError as exc:
        raise GitError(f"cannot run git in {repo}: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate()
    except BaseException:
        procs.signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return (proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


def _stop_leftovers(token: object) -> None:
    """What is left of a killed merge's git (a commit hook still waiting, or a git that
    outlived its parent): stopped, and waited for, before anything is looked at."""
    if not isinstance(token, str) or not token:
        return
    for _ in range(3):
        left = procs.with_env(MERGE_TOKEN_ENV, token)
        if not left:
            return
        for pid in left:
            procs.signal_pid(pid, signal.SIGKILL)
        procs.wait_gone(left, 10.0)


def _git_running_in(repo: Path) -> bool:
    """Does a git process (not this one's) work in `repo` now?"""
    for st in procs.all_stats():
        if st.state in ("Z", "X", "x") or st.pid == os.getpid():
            continue
        argv = procs.cmdline(st.pid)
        if not argv or Path(argv[0]).name != "git":
            continue
        if procs.cwd(st.pid) == repo:
            return True
    return False


def _stale_locks(repo: Path, git_dir: Path, intent: Mapping[str, object]) -> list[str]:
    """git's lock files in the main checkout's git dir that the killed merge's git left
    (made since its intent record, with no git running there now) are removed; the
    names of lock files that may be another program's are returned."""
    base_branch = str(intent.get("base_branch") or "")
    candidates = [git_dir / "index.lock", git_dir / "HEAD.lock", git_dir / "ORIG_HEAD.lock",
                  git_dir / "AUTO_MERGE.lock"]
    if base_branch:
        candidates.append(_common_dir(git_dir) / "refs" / "heads" / f"{base_branch}.lock")
    present = [c for c in candidates if c.exists()]
    if not present:
        return []
    since = intent.get("at")
    ours = isinstance(since, (int, float)) and not _git_running_in(repo) and all(
        c.stat().st_mtime >= float(since) - 1.0 for c in present)
    if not ours:
        return [c.name for c in present]
    for lock in present:
        with contextlib.suppress(OSError):
            lock.unlink()
    return []


def _blob(repo: Path, tree: str, path: str) -> str | None:
    status, out, _ = _run(repo, "rev-parse", "-q", "--verify", f"{tree}:{path}", check=False)
    return out.strip() if status == 0 else None


def _work_blob(repo: Path, path: str) -> str | None:
    full = repo / path
    if not full.exists() and not full.is_symlink():
        return None
    if full.is_dir() and not full.is_symlink():
        return "dir"
    return _out(repo, "hash-object", "--no-filters", "--", path).strip()


def _index_blobs(repo: Path, names: Sequence[str]) -> dict[str, str]:
    out = _out(repo, "ls-files", "-s", "-z", "--", *names) if names else ""
    blobs: dict[str, str] = {}
    for entry in out.split("\0"):
        if "\t" in entry:
            meta, name = entry.split("\t", 1)
            parts = meta.split()
            blobs[name] = parts[1] if parts[2] == "0" else "unmerged"
    return blobs


def _not_ours(repo: Path, intent: Mapping[str, object], changed: Sequence[str]) -> list[str]:
    """Paths of the main checkout that differ from main's commit in a way the killed merge
    did not make (the user's own changes since): empty when everything is the merge's."""
    base, tree = str(intent["base_tip"]), str(intent["tree"])
    before = set(str(intent.get("status", "")).split("\0"))
    changed_set = set(changed)
    foreign = []
    for entry in _status_all(repo).split("\0"):
        if len(entry) > 3 and entry not in before and entry[3:] not in changed_set:
            foreign.append(entry[3:])
    index = _index_blobs(repo, list(changed))
    for path in changed:
        was, merged = _blob(repo, base, path), _blob(repo, tree, path)
        work_ok = _work_blob(repo, path) in (was, merged) \
            or _half_written(repo, path, merged)
        if index.get(path) not in (was, merged) or not work_ok:
            foreign.append(path)
    return sorted(set(foreign))


def _half_written(repo: Path, path: str, merged: str | None) -> bool:
    """A file git was writing when it was killed: gone (git removes a file before it
    writes the new one), or a start of what the merge writes there."""
    full = repo / path
    if not full.exists() and not full.is_symlink():
        return True
    if merged is None or full.is_symlink() or not full.is_file():
        return False
    try:
        have = full.read_bytes()
    except OSError:
        return False
    proc = subprocess.run(["git", "cat-file", "blob", merged], cwd=repo,
                          capture_output=True, check=False)
    return proc.returncode == 0 and proc.stdout.startswith(have)


def _saved_index(repo: Path) -> Path:
    return merge_intent_file(repo).with_suffix(".index")


def _undo_merge(repo: Path, git_dir: Path, intent: Mapping[str, object],
                changed: Sequence[str]) -> None:
    """Put each path the killed merge changed back as main's commit has it, and the index
    as it was (byte for byte, from the copy taken before the merge); nothing else."""
    base = str(intent["base_tip"])
    in_base = [p for p in changed if _blob(repo, base, p) is not None]
    added = [p for p in changed if p not in in_base]
    saved = _saved_index(repo)
    if saved.is_file():
        tmp = git_dir / "index.fleet-tui.tmp"
        shutil.copyfile(saved, tmp)
        os.replace(tmp, git_dir / "index")
        if in_base:
            _run(repo, "checkout-index", "-f", "-q", "--", *in_base,
                 what="putting main back")
    else:
        if in_base:
            _run(repo, "checkout", "-q", base, "--", *in_base, what="putting main back")
        if added:
            _run(repo, "rm", "-q", "--cached", "--ignore-unmatch", "--", *added,
                 what="putting main back")
    if added:
        for path in added:
            with contextlib.suppress(OSError):
                (repo / path).unlink()
            parent = (repo / path).parent
            while parent != repo and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent


def recover_merge(repo: Path) -> str | None:
    """Finish with a merge into `repo` that was killed midway (its intent record is there):
    main goes back exactly as it was before it, or, when its commit was made, the merge's
    leftovers go (state files, the task's worktree and branch). Call it under the
    repository lock. None when there was nothing to recover; else what was done. Raises
    MergeLeftHalfDone when main holds changes that are not the merge's (the user's): then
    nothing is touched."""
    repo = Path(repo).resolve()
    intent = _read_intent(repo)
    if intent is None:
        return None
    _stop_leftovers(intent.get("token"))
    try:
        branch, side = str(intent["branch"]), str(intent["side"])
        base_tip, tree = str(intent["base_tip"]), str(intent["tree"])
    except KeyError:
        _drop_intent(repo)  # written by nothing fleet-tui knows: the usual checks decide
        return None
    git_dir = _main_git_dir(repo)
    locks = _stale_locks(repo, git_dir, intent)
    if locks:
        raise MergeLeftHalfDone(
            f"a merge of {branch} by fleet-tui was stopped midway and git's lock files "
            f"are still there ({_shown(locks)}, in {git_dir}); if no git command runs in "
            f"{repo}, remove them and merge again")
    merge_head = (git_dir / "MERGE_HEAD").read_text().strip() \
        if (git_dir / "MERGE_HEAD").exists() else None
    head = _rev(repo, "HEAD")
    files_before = intent.get("files")
    files_before = files_before if isinstance(files_before, dict) else {}

    def clear_state() -> None:
        if merge_head is None or merge_head == side:
            for name in _OURS_STATE:
                if files_before.get(name) is None:
                    with contextlib.suppress(OSError):
                        (git_dir / name).unlink(missing_ok=True)

    if head == base_tip:
        if merge_head not in (None, side):
            _drop_intent(repo)  # another merge than ours was started since: not ours
            return None
        changed = _out(repo, "diff-tree", "-r", "-z", "--name-only", "--no-renames",
                       base_tip, tree).split("\0")
        changed = [c for c in changed if c]
        foreign = _not_ours(repo, intent, changed)
        if foreign:
            raise MergeLeftHalfDone(
                f"a merge of {branch} by fleet-tui was stopped midway, and the main "
                f"checkout {repo} has changes that are not that merge's "
                f"({_shown(foreign)}); fleet-tui left it as it is: abort it (`git merge "
                "--abort`, or `git reset --merge`) or finish it (`git commit`), then "
                "merge again")
        _undo_merge(repo, git_dir, intent, changed)
        clear_state()
        orig = files_before.get("ORIG_HEAD")
        if isinstance(orig, str):
            (git_dir / "ORIG_HEAD").write_text(orig)
        elif "ORIG_HEAD" in files_before:
            with contextlib.suppress(OSError):
                (git_dir / "ORIG_HEAD").unlink(missing_ok=True)
        _drop_intent(repo)
        return (f"a merge of {branch} that was stopped midway was undone; the main "
                f"checkout is as it was before it ({base_tip[:10]})")
    if head is not None and _is_ancestor(repo, base_tip, head) and (
            _is_ancestor(repo, side, head)
            or _rev(repo, f"{head}^{{tree}}") == tree):
        clear_state()
        wt = intent.get("worktree")
        with contextlib.suppress(GitError):
            _remove_worktree(repo, Path(wt) if isinstance(wt, str) else None, branch)
            _delete_branch(repo, branch)
        _drop_intent(repo)
        return f"a merge of {branch} that was stopped midway had landed as {head[:10]}"
    _drop_intent(repo)  # main moved on by other hands: the usual checks decide
    return None


class MergeLeftHalfDone(GitError):
    """A merge of fleet-tui's was killed midway and main holds changes that are not its own."""

