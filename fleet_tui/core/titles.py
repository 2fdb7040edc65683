"""A task's title: the one rule for turning a prompt into one.

The engine stores it when a task is queued without a title, the task list and notifications
show it, a merge uses it as the commit message, and the launch form shows it as the title
field's placeholder: all through `title_from_prompt`, so they cut the prompt the same way.
No imports: the store and the panel both use it.
"""

from __future__ import annotations

__all__ = ["TITLE_MAX", "UNTITLED", "commit_title", "copy_title", "task_title",
           "title_from_prompt"]

TITLE_MAX = 72  # characters, the ellipsis included: a commit subject's conventional length
UNTITLED = "untitled"


def title_from_prompt(prompt: str, limit: int = TITLE_MAX) -> str:
    """The prompt's first line that is not blank, stripped, cut to `limit` characters with
    an ellipsis as the last one when it is longer; UNTITLED when there is no such line."""
    for line in prompt.splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[: max(0, limit - 1)].rstrip() + "…"
    return UNTITLED


def task_title(title: str, prompt: str) -> str:
    """A task's title as shown: its own (stripped), else the one its prompt gives."""
    return title.strip() or title_from_prompt(prompt)


def copy_title(title: str, index: int, copies: int) -> str:
    """The title of copy `index` (1-based) of `copies` submitted together: "T (1/3)"."""
    return title if copies == 1 else f"{title} ({index}/{copies})"


def commit_title(title: str) -> str:
    """A task's title as a commit message's subject: a copy's " (1/3)" suffix dropped (the
    commit lands one copy's work; which copy it was is no one's business in the history)."""
    text = title.rstrip()
    if text.endswith(")"):
        head, sep, tail = text.rpartition(" (")
        count, slash, total = tail[:-1].partition("/")
        if sep and slash and count.isdigit() and total.isdigit() and head.strip():
            return head.rstrip()
    return text
