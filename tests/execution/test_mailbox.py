"""A remote worker's mailbox (execution/mailbox.py): the states of one message in the local
attempt folder, as the Ray host's `say`, the gateway and the node side move it. Real files,
no process: the rules that keep a message from being both withdrawn and delivered."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleet_tui.execution import mailbox
from fleet_tui.execution.worker.attemptlog import AttemptLog


@pytest.fixture
def folder(tmp_path: Path) -> AttemptLog:
    return AttemptLog(tmp_path / "attempt")


def test_a_message_served_then_queued_then_taken(folder: AttemptLog) -> None:
    folder.dir.mkdir()
    mid = mailbox.post(folder, "hello", by="me")
    assert folder.input_waiting(mid) and mailbox.state(folder, mid) == ("waiting", "")
    assert mailbox.pending(folder) == [{"id": mid, "text": "hello", "by": "me"}]
    assert mailbox.pending(folder)[0]["id"] == mid  # served again until a verdict
    assert mailbox.withdraw(folder, mid) is False  # fetched: no longer withdrawn
    mailbox.verdict(folder, mid, "queued")
    assert mailbox.state(folder, mid) == ("queued", "") and folder.input_waiting(mid)
    assert mailbox.pending(folder) == []  # queued there: not served again
    mailbox.verdict(folder, mid, "taken")
    assert mailbox.state(folder, mid) == ("taken", "") and not folder.input_waiting(mid)
    assert list((folder.dir / "input").iterdir()) == []


def test_a_withdrawn_message_is_never_served(folder: AttemptLog) -> None:
    folder.dir.mkdir()
    mid = mailbox.post(folder, "too slow")
    assert mailbox.withdraw(folder, mid) is True
    assert mailbox.pending(folder) == []
    assert not folder.input_waiting(mid)


def test_a_refusal_carries_the_runners_reason(folder: AttemptLog) -> None:
    folder.dir.mkdir()
    mid = mailbox.post(folder, "after the turn")
    mailbox.pending(folder)
    mailbox.verdict(folder, mid, "closed", "its worker is not taking messages")
    assert mailbox.state(folder, mid) == ("closed", "its worker is not taking messages")
    mailbox.drop(folder, mid)
    assert list((folder.dir / "input").iterdir()) == []


def test_a_bad_verdict_is_refused(folder: AttemptLog) -> None:
    folder.dir.mkdir()
    real = mailbox.post(folder, "x")
    with pytest.raises(ValueError):
        mailbox.verdict(folder, "../../etc/passwd", "taken")
    with pytest.raises(ValueError):
        mailbox.verdict(folder, real, "eaten")
    assert mailbox.state(folder, real) == ("waiting", "")


def test_the_node_side_gives_a_message_its_id(folder: AttemptLog) -> None:
    """The runner's own channel takes the mailbox's id (its input.jsonl names it)."""
    folder.dir.mkdir()
    fd = folder.open_input()
    try:
        mid = mailbox.post(folder, "ignored here")  # an id of the mailbox's form
        other = AttemptLog(folder.dir.parent / "node")
        other.dir.mkdir()
        fd2 = other.open_input()
        try:
            assert other.send_input("via the mailbox", message_id=mid) == mid
            with pytest.raises(ValueError):
                other.send_input("x", message_id="not-an-id")
            taken, _closed = other.take_input()
            assert taken == ["via the mailbox"]
            assert [m["id"] for m in other.input_messages()] == [mid]
        finally:
            os.close(fd2)
    finally:
        os.close(fd)
