"""What the panel and the CLI say reads as English: the help does not repeat a key in its
own description, counts take their noun in the right number, the attempts list is a
sentence. (The CLI's update and merge messages are checked where they are said:
tests/cli/test_landing_cli.py.)"""

from __future__ import annotations

import re

from fleet_tui.core import stream
from fleet_tui.ui.actions import ACTIONS
from fleet_tui.ui.formatting import StreamFormatter, attempt_label, count


def test_no_help_line_repeats_its_own_key() -> None:
    for action in ACTIONS:
        shown = action.key_display or action.keys.split(",")[0]
        assert f"({shown} )" not in action.help, (action.id, action.help)
        assert not re.search(r"\(\S \)", action.help), (action.id, action.help)
    by_id = {a.id: a for a in ACTIONS}
    assert by_id["diff.next_file"].help == "diff: the next file of the list, its patch shown"


def test_counts_and_the_attempts_list() -> None:
    assert count(1, "turn") == "1 turn" and count(2, "turn") == "2 turns"
    assert count(0, "turn") == "0 turns"
    assert attempt_label(2, "fresh", "killed", 1, "glm-4.6") == \
        "2. fresh attempt: killed after 1 turn (glm-4.6)"
    assert attempt_label(3, "followup", None, 4, None) == \
        "3. follow-up: running, 4 turns so far"
    assert attempt_label(1, "resume", "ok", 3, "m") == "1. resume attempt: ok after 3 turns (m)"


def test_the_stream_says_one_turn() -> None:
    formatter = StreamFormatter()
    rows = formatter.rows([stream.Result(line_no=1, subtype="success", is_error=False,
                                         num_turns=1, result="fine")])
    text = "".join(chunk for row in rows for _, chunk in row.row)
    assert "■ done in 1 turn" in text and "1 turns" not in text
