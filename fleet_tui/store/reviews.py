"""Review comments in the store: the table `review_comments`, one row a comment.

Each row keeps its anchor (core.review.Anchor), the comment, when it was sent (and how: a
message to the running worker or a follow-up) and whether its lines were as commented
then, and the state last worked out (kept so a merged task's review still reads, once its
worktree is gone). The rules of the state are core/review.py's; the engine applies them.

The diff's viewed marks are here too (`ViewedFiles`, the table `viewed_files`): a path of a
task's diff and the digest its part of the patch had when it was marked (the rule that
reads them is core/diffwords.py's `view_mark`)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from fleet_tui.core.errors import EXIT_NOT_FOUND
from fleet_tui.core.review import Anchor, CommentState, Side
from fleet_tui.store.db import Store, StoreError


class UnknownComment(StoreError):
    """No comment of this task has this number."""

    exit_code = EXIT_NOT_FOUND


@dataclass(frozen=True)
class ReviewComment:
    """One comment on a task's diff, with its state as last worked out (``where``: the
    line its anchored lines end at now, when the engine found them; None otherwise)."""

    id: int
    task_id: str
    anchor: Anchor
    body: str
    created_at: float
    updated_at: float
    sent_at: float | None = None
    sent_intact: bool | None = None
    sent_how: str | None = None
    state: CommentState = CommentState.OPEN
    where: int | None = None

    @property
    def sent(self) -> bool:
        return self.sent_at is not None

    def with_state(self, state: CommentState, where: int | None) -> ReviewComment:
        return replace(self, state=state, where=where)

    def as_json(self) -> dict[str, Any]:
        a = self.anchor
        return {"id": self.id, "task": self.task_id, "file": a.path, "side": a.side,
                "start": a.start, "end": a.end, "where": a.where, "lines": list(a.lines),
                "quote": list(a.quote), "comment": self.body, "state": str(self.state),
                "sent": self.sent, "sent_at": self.sent_at, "sent_how": self.sent_how,
                "created_at": self.created_at, "line_now": self.where}


def _from_row(row: Any) -> ReviewComment:
    side: Side = "old" if row["side"] == "old" else "new"
    try:
        state = CommentState(row["state"])
    except ValueError:
        state = CommentState.OPEN
    anchor = Anchor(str(row["path"]), side, int(row["start_line"]), int(row["end_line"]),
                    tuple(str(x) for x in json.loads(row["lines"] or "[]")),
                    tuple(str(x) for x in json.loads(row["quote"] or "[]")))
    intact = row["sent_intact"]
    return ReviewComment(int(row["id"]), str(row["task_id"]), anchor, str(row["body"]),
                         float(row["created_at"]), float(row["updated_at"]),
                         row["sent_at"], None if intact is None else bool(intact),
                         row["sent_how"], state)


class Reviews:
    """The review comments of one store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def add(self, task_id: str, anchor: Anchor, body: str,
            now: float | None = None) -> ReviewComment:
        when = time.time() if now is None else now
        with self.store.transaction() as conn:
            cursor = conn.execute(
                "INSERT INTO review_comments (task_id, path, side, start_line, end_line, "
                "lines, quote, body, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, "
                "?, ?, ?)",
                (task_id, anchor.path, anchor.side, anchor.start, anchor.end,
                 json.dumps(list(anchor.lines)), json.dumps(list(anchor.quote)), body, when,
                 when))
            comment_id = int(cursor.lastrowid or 0)
        return self.get(task_id, comment_id)

    def get(self, task_id: str, comment_id: int) -> ReviewComment:
        row = self.store._connect().execute(
            "SELECT * FROM review_comments WHERE id = ? AND task_id = ?",
            (comment_id, task_id)).fetchone()
        if row is None:
            raise UnknownComment(f"task {task_id} has no comment #{comment_id} (`fleet-tui "
                                 f"review {task_id}` lists them)")
        return _from_row(row)

    def list(self, task_id: str) -> list[ReviewComment]:
        """A task's comments, by file and line."""
        rows = self.store._connect().execute(
            "SELECT * FROM review_comments WHERE task_id = ? "
            "ORDER BY path, start_line, id", (task_id,)).fetchall()
        return [_from_row(r) for r in rows]

    def edit(self, task_id: str, comment_id: int, body: str,
             now: float | None = None) -> ReviewComment:
        self.get(task_id, comment_id)
        with self.store.transaction() as conn:
            conn.execute("UPDATE review_comments SET body = ?, updated_at = ? WHERE id = ?",
                         (body, time.time() if now is None else now, comment_id))
        return self.get(task_id, comment_id)

    def delete(self, task_id: str, comment_id: int) -> None:
        self.get(task_id, comment_id)
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM review_comments WHERE id = ?", (comment_id,))

    def mark_sent(self, intact: Mapping[int, bool], how: str, now: float) -> None:
        """These comments (id -> their lines were as commented) were sent, ``how``."""
        with self.store.transaction() as conn:
            for comment_id, whole in intact.items():
                conn.execute(
                    "UPDATE review_comments SET sent_at = ?, sent_intact = ?, sent_how = ?, "
                    "state = ? WHERE id = ? AND sent_at IS NULL",
                    (now, int(whole), how, str(CommentState.OPEN if whole
                                               else CommentState.OUTDATED), comment_id))

    def save_states(self, comments: Iterable[ReviewComment]) -> None:
        """Keep the states worked out (only the changed rows are written)."""
        changed = [(str(c.state), c.id) for c in comments]
        if not changed:
            return
        with self.store.transaction() as conn:
            conn.executemany("UPDATE review_comments SET state = ? WHERE id = ? "
                             "AND state <> ?", [(s, i, s) for s, i in changed])


class ViewedFiles:
    """The viewed marks of one store: task -> path -> the digest the file had when it was
    marked viewed."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def of(self, task_id: str) -> dict[str, str]:
        rows = self.store._connect().execute(
            "SELECT path, digest FROM viewed_files WHERE task_id = ?", (task_id,)).fetchall()
        return {str(r["path"]): str(r["digest"]) for r in rows}

    def set(self, task_id: str, path: str, digest: str | None,
            now: float | None = None) -> None:
        """Mark ``path`` viewed as ``digest``; None takes its mark off."""
        with self.store.transaction() as conn:
            if digest is None:
                conn.execute("DELETE FROM viewed_files WHERE task_id = ? AND path = ?",
                             (task_id, path))
            else:
                conn.execute(
                    "INSERT INTO viewed_files (task_id, path, digest, viewed_at) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (task_id, path) DO UPDATE SET "
                    "digest = excluded.digest, viewed_at = excluded.viewed_at",
                    (task_id, path, digest, time.time() if now is None else now))
