"""Review comments on a task's diff: comment, edit, delete, list with their
states, and send them all to the worker as one message; and the diff's viewed marks.

The rules (anchors, open / addressed / outdated, the message) are core/review.py's; the
rows are store/reviews.py's. Here they meet the task: its worktree's files and its diff
say where each comment's lines are now, and the review goes to the worker through the
actions everyone uses: `say` while it runs, a follow-up in the same session once it has
finished."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fleet_tui.core import redaction
from fleet_tui.core.errors import FleetRefused, InvalidSpec
from fleet_tui.core.model import Task
from fleet_tui.core.review import (
    Anchor,
    CommentState,
    DiffLine,
    anchor_of,
    deleted_lines,
    diff_lines,
    intact,
    review_message,
    state_of,
)
from fleet_tui.core.states import CLOSED_STATES, FINISHED_STATES
from fleet_tui.engine.actions import Actions
from fleet_tui.engine.branches import Branches
from fleet_tui.engine.context import Context, Part
from fleet_tui.engine.submit import check_text
from fleet_tui.store.reviews import ReviewComment, Reviews, ViewedFiles
from fleet_tui.vcs import git

__all__ = ["COMMENT_LIMIT", "Review", "ReviewSent"]

COMMENT_LIMIT = 20_000
"""Characters of one comment (a review is one message: keep each to a page or so)."""
_READ_LIMIT = 8 << 20  # bytes of a file read to find a comment's lines again
_MARK_LIMIT = 4096  # characters of a viewed mark's path (a file name git can have)


@dataclass(frozen=True)
class ReviewSent:
    """A review that went to the worker: how many comments, how, and whether the running
    worker has taken the message yet (always True for a follow-up: it is queued)."""

    task_id: str
    count: int
    how: str  # "say" (to the running worker) or "follow-up" (a new turn of its session)
    taken: bool
    message: str


class Review(Part):
    """A task's review comments."""

    def __init__(self, ctx: Context, actions: Actions, branches: Branches) -> None:
        super().__init__(ctx)
        self.actions = actions
        self.branches = branches

    @property
    def rows(self) -> Reviews:
        return Reviews(self.store)

    # --- writing --------------------------------------------------------------------------
    def comment(self, task_id: str, anchor: Anchor, body: str) -> ReviewComment:
        """Store a comment on the lines of ``anchor`` (made from the diff's rows:
        core.review.anchor_of). InvalidSpec for an empty or unusable comment."""
        task = self.get_task(task_id)
        body = self._checked(body)
        return self.rows.add(task.id, _redacted(anchor), body, self.clock())

    def comment_at(self, task_id: str, path: str, start: int, end: int,
                   body: str) -> ReviewComment:
        """A comment on lines ``start``..``end`` of ``path`` as the worktree has them
        (the command line's FILE:LINE[-LINE]); a file the task deleted is numbered as in
        its base. Refused when the task has no worktree, the file is not there, or the
        lines are past its end."""
        task = self.get_task(task_id)
        body = self._checked(body)
        diff = self.branches.diff(task.id)
        changed = {f.path: f for f in diff.files}
        lines = self._lines(task, path)
        if lines is None:
            found = changed.get(path)
            rows = [r for r in diff_lines(found.patch.splitlines(), [path])
                    if r is not None and r.kind == "-"] if found is not None else []
            picked = [r for r in rows if r.old is not None and start <= r.old <= end]
            if not picked:
                raise FleetRefused(f"{path} is not in task {task.id}'s worktree (nor lines "
                                   f"{start}-{end} among the lines it deleted); `fleet-tui "
                                   f"diff {task.id} --stat` lists its files")
            anchor = anchor_of(picked)
        else:
            if end > len(lines):
                raise FleetRefused(f"{path} has {len(lines)} lines in task {task.id}'s "
                                   f"worktree: line {end} is past its end")
            shown = self._rows_of(changed.get(path), path)
            quote = tuple(shown.get(n, " " + lines[n - 1]) for n in range(start, end + 1))
            anchor = Anchor(path, "new", start, end, tuple(lines[start - 1:end]), quote)
        return self.rows.add(task.id, _redacted(anchor), body, self.clock())

    def _lines(self, task: Task, path: str) -> list[str] | None:
        """The file as the task's worktree has it: read here, or (its worktree on another
        host) from its work as last fetched here (the diff fetches it)."""
        remote = self.branches.remote_of(task)
        if remote is None:
            return _file_lines(Path(task.worktree or ""), path)
        data = remote.read_file(task, path)
        if data is None:
            return None
        return redaction.redact(data[:_READ_LIMIT].decode("utf-8", "replace")).splitlines()

    @staticmethod
    def _rows_of(found: git.FileDiff | None, path: str) -> dict[int, str]:
        """New line number -> the row as the diff shows it ("+..." or " ...")."""
        if found is None:
            return {}
        return {r.new: r.shown for r in diff_lines(found.patch.splitlines(), [path])
                if r is not None and r.new is not None}

    def edit_comment(self, task_id: str, comment_id: int, body: str) -> ReviewComment:
        """Change a comment's text (its anchor stays)."""
        task = self.get_task(task_id)
        return self.rows.edit(task.id, comment_id, self._checked(body), self.clock())

    def delete_comment(self, task_id: str, comment_id: int) -> None:
        task = self.get_task(task_id)
        self.rows.delete(task.id, comment_id)

    @staticmethod
    def _checked(body: str) -> str:
        if not isinstance(body, str) or not body.strip():
            raise InvalidSpec("the comment is empty; say what should change")
        if len(body) > COMMENT_LIMIT:
            raise InvalidSpec(f"the comment is over {COMMENT_LIMIT} characters; shorten it")
        check_text("comment", body)
        return redaction.redact(body.strip())

    # --- reading --------------------------------------------------------------------------
    def comments(self, task_id: str, diff: git.Diff | None = None) -> list[ReviewComment]:
        """A task's comments with their states worked out against its worktree now (the
        rules: core/review.py); a task without a worktree (merged, discarded) keeps the
        states last worked out. ``diff``: the task's diff when the caller has it."""
        task = self.get_task(task_id)
        stored = self.rows.list(task.id)
        if not stored or task.state in CLOSED_STATES or task.worktree is None:
            return stored
        remote = self.branches.remote_of(task)
        if remote is None and not Path(task.worktree).is_dir():
            return stored
        files: dict[str, list[str] | None] = {}
        deleted: dict[str, dict[int, str]] = {}
        out: list[ReviewComment] = []
        for comment in stored:
            anchor = comment.anchor
            if anchor.path not in files:
                files[anchor.path] = self._lines(task, anchor.path)
            if anchor.side == "old" and anchor.path not in deleted:
                if diff is None:
                    try:
                        diff = self.branches.diff(task.id)
                    except (git.GitError, FleetRefused):
                        return stored
                deleted[anchor.path] = _deleted_of(diff, anchor.path)
            where = intact(anchor, files[anchor.path], deleted.get(anchor.path, {}))
            state = state_of(sent=comment.sent, intact_now=where is not None,
                             intact_at_send=comment.sent_intact)
            out.append(comment.with_state(state, where))
        self.rows.save_states(c for c, old in zip(out, stored, strict=True)
                              if c.state != old.state)
        return out

    def open_comments(self, task_id: str) -> int:
        """How many of a task's comments are open (not sent, or not dealt with yet)."""
        return sum(1 for c in self.comments(task_id) if c.state == CommentState.OPEN)

    # --- the diff's viewed marks ------------------------------------------------------------
    def viewed_files(self, task_id: str) -> dict[str, str]:
        """The files of a task's diff marked viewed: path -> the digest its part of the
        patch had then (core.diffwords.view_mark reads them against the diff now)."""
        return ViewedFiles(self.store).of(self.get_task(task_id).id)

    def mark_viewed(self, task_id: str, path: str, digest: str | None) -> None:
        """Mark a file of the task's diff viewed as ``digest`` (None: take the mark off).
        InvalidSpec for a path or digest no diff could have."""
        task = self.get_task(task_id)
        for what, text in (("path", path), ("digest", digest or "-")):
            if not isinstance(text, str) or not text or len(text) > _MARK_LIMIT:
                raise InvalidSpec(f"the viewed mark's {what} is empty or over "
                                  f"{_MARK_LIMIT} characters")
            check_text(f"viewed mark's {what}", text)
        ViewedFiles(self.store).set(task.id, path, digest, self.clock())

    # --- sending --------------------------------------------------------------------------
    def send_review(self, task_id: str, *, wait: float = 3.0) -> ReviewSent:
        """Send every comment not sent yet as one message: each with its file, line
        numbers, the lines quoted and the comment. To the running worker (`say`), or as a
        follow-up in the same session once it has finished. FleetRefused when there is
        nothing to send or the task takes neither; WorkerFinished when the worker is
        stopping after its last turn (send again once it is recorded finished)."""
        task = self.get_task(task_id)
        pending = [c for c in self.comments(task.id) if not c.sent]
        if not pending:
            raise FleetRefused(f"task {task.id} has no comments to send (add one: "
                               f"`fleet-tui review {task.id} --comment FILE:LINE TEXT`, or "
                               "C on a line of the panel's diff)")
        message = review_message([(c.anchor, c.body) for c in pending])
        check_text("review", message)
        if task.state in FINISHED_STATES:
            self.actions.follow_up(task.id, message)
            how, taken = "follow-up", True
        else:
            taken = self.actions.say(task.id, message, wait=wait)
            how = "say"
        self.rows.mark_sent({c.id: c.state == CommentState.OPEN for c in pending}, how,
                            self.clock())
        return ReviewSent(task.id, len(pending), how, taken, message)


def _redacted(anchor: Anchor) -> Anchor:
    hide = redaction.redact
    return Anchor(hide(anchor.path), anchor.side, anchor.start, anchor.end,
                  tuple(hide(x) for x in anchor.lines), tuple(hide(x) for x in anchor.quote))


def _file_lines(worktree: Path, path: str) -> list[str] | None:
    """The worktree's file as lines (the key hidden, as in the diff); None when it is not
    a readable file there."""
    target = worktree / path
    try:
        if not target.is_file() or worktree.resolve() not in target.resolve().parents:
            return None
        with target.open("rb") as fh:
            data = fh.read(_READ_LIMIT)
    except OSError:
        return None
    return redaction.redact(data.decode("utf-8", "replace")).splitlines()


def _deleted_of(diff: git.Diff, path: str) -> dict[int, str]:
    for found in diff.files:
        if found.path == path:
            rows: list[DiffLine | None] = diff_lines(found.patch.splitlines(), [path])
            return deleted_lines(rows)
    return {}
