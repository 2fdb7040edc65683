"""Git work for fleet-tui, the area's front: ``from fleet_tui.vcs import git``, then
``git.create_worktree(...)``, ``git.merge(...)``, ``git.GitError``.

Every git command runs through GitPython (``git.Git(cwd).execute``; finding the repository
asks `git rev-parse` first, see repository.py); its exceptions become ``GitError`` with a
message that says what to do, never a traceback. Nothing here writes to
a checkout the user did not ask to change: diffs and the conflict preview work on a temporary
index file and unreferenced objects, and a failed merge is rolled back (and said to be
restored only when HEAD, index and files were checked).

Merges, discards and worktree creation of one repository take turns across processes and
threads (``repolock``, a flock in the repository's common git dir): two merges at once once
left the main checkout mid-merge. A merge checks everything that could refuse it before it
runs the test command, and the test command last; the commands that change the main
checkout run under the lock.

The work lives in the modules below, each importing only those above it in this list (run
at the bottom, merge, update and push at the top); this module only re-exports their
public names, so callers need not know the cut:

    run          running git (GitPython, GitError, the helpers every module uses)
    gitfiles     reading git's own files (git dir, refs, HEAD) instead of running git
    repository   finding the repository, its lock files, `.fleet-work/` in info/exclude
    worktrees    a task's worktree and branch: create, re-attach, verify, remove, discard
    keyscan      looking for the API key in files and git objects, hiding it in text
    diffs        a task's changes against its base (the key marked and hidden), fork_point
    commits      the worker's uncommitted work: snapshot commits, commits, git's identity
    merging      what merge and update share: merge-tree, paths in the way, state files
    testcommand  the user's test command through testgate (the merge, the merge queue)
    recovery     the intent record (.git/fleet-tui-merge.json) and recover_merge
    merge        the conflict preview and merge, landed / landed_task
    update       bringing a branch up to date with its base, abort and conclusion
    push         pushing a task's branch

Names with a leading underscore are private to ``fleet_tui.vcs`` and shared between its
modules; a test that replaces one patches the module that calls it (``merge._merge_tree``).
"""

from __future__ import annotations

from fleet_tui.vcs.commits import check_identity
from fleet_tui.vcs.diffs import (
    Diff,
    FileDiff,
    FileStatus,
    diff,
    diff_commits,
    diff_stat,
    fork_point,
    mark_secrets,
)
from fleet_tui.vcs.keyscan import REDACTED, SECRET_MIN_LENGTH
from fleet_tui.vcs.merge import (
    ConflictPreview,
    MergeResult,
    Strategy,
    conflict_preview,
    landed,
    landed_task,
    merge,
)
from fleet_tui.vcs.push import PushResult, push_branch, push_remote
from fleet_tui.vcs.recovery import (
    MERGE_INTENT_FILE,
    MERGE_TOKEN_ENV,
    MergeLeftHalfDone,
    merge_intent_file,
    recover_merge,
)
from fleet_tui.vcs.repository import (
    LOCK_FILE,
    LOCK_TIMEOUT,
    QUEUE_LOCK_FILE,
    ensure_excluded,
    find_repo,
    main_worktree,
    queue_lock_file,
)
from fleet_tui.vcs.run import GitError, current_branch
from fleet_tui.vcs.testcommand import run_test_command
from fleet_tui.vcs.update import (
    UPDATE_INDEX,
    UPDATE_RECORD,
    UpdateResult,
    UpdateStatus,
    abort_update,
    conclude_update,
    unmerged_paths,
    update_from_base,
    update_record_exists,
)
from fleet_tui.vcs.worktrees import (
    Base,
    BranchGone,
    WorktreeInfo,
    branch_exists,
    branch_tip,
    create_worktree,
    discard,
    head_commit,
    on_branch,
    operation_in_progress,
    reattach_worktree,
    resolve_base,
    verify_worktree,
)

__all__ = [
    "LOCK_FILE",
    "LOCK_TIMEOUT",
    "MERGE_INTENT_FILE",
    "MERGE_TOKEN_ENV",
    "QUEUE_LOCK_FILE",
    "REDACTED",
    "SECRET_MIN_LENGTH",
    "UPDATE_INDEX",
    "UPDATE_RECORD",
    "Base",
    "BranchGone",
    "ConflictPreview",
    "Diff",
    "FileDiff",
    "FileStatus",
    "GitError",
    "MergeLeftHalfDone",
    "MergeResult",
    "PushResult",
    "Strategy",
    "UpdateResult",
    "UpdateStatus",
    "WorktreeInfo",
    "abort_update",
    "branch_exists",
    "branch_tip",
    "check_identity",
    "conclude_update",
    "conflict_preview",
    "create_worktree",
    "current_branch",
    "diff",
    "diff_commits",
    "diff_stat",
    "discard",
    "ensure_excluded",
    "find_repo",
    "fork_point",
    "head_commit",
    "landed",
    "landed_task",
    "main_worktree",
    "mark_secrets",
    "merge",
    "merge_intent_file",
    "on_branch",
    "operation_in_progress",
    "push_branch",
    "push_remote",
    "queue_lock_file",
    "reattach_worktree",
    "recover_merge",
    "resolve_base",
    "run_test_command",
    "unmerged_paths",
    "update_from_base",
    "update_record_exists",
    "verify_worktree",
]
