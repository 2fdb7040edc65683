"""How text from a worker, a model or a title is shown in a terminal: the one rule.

A worker's tool output, the model's words, a task's title or prompt are untrusted: printed
raw, an escape sequence in them would drive the user's terminal (OSC 0 sets its title,
OSC 52 writes the clipboard, CSI 2J clears the screen), and a bidi override (U+202E) would
show a line in another order than it is. `visible` keeps line breaks and tabs, shows every
other control character as its Unicode control picture (ESC as ␛, BEL as ␇), a C1 control
or a bidi control as `<U+XXXX>`. Every command prints such text through it, and the
panel's toasts too; JSON output needs nothing (JSON escapes control characters, and the
`ensure_ascii` default escapes the bidi controls as well).
"""

from __future__ import annotations

import re

# C0 controls but \t and \n, DEL, the C1 controls (U+0080-U+009F: 0x9B is a one-byte CSI
# for terminals that read 8-bit controls), and the controls of bidirectional text: the
# embeddings and overrides (U+202A-U+202E), the isolates (U+2066-U+2069), the marks (LRM,
# RLM, ALM) that can move a neighbouring run.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f\x80-\x9f\u061c\u200e\u200f"
                     "\u202a-\u202e\u2066-\u2069]")


def _picture(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # ␀ ... ␟: the control's own picture
    if code == 0x7F:
        return "\u2421"  # ␡
    return f"<U+{code:04X}>"


def visible(text: str) -> str:
    """`text` safe to print to a terminal: line breaks and tabs kept, every other control
    character and every bidi control made visible (nothing of it reaches the terminal)."""
    if text.isascii() and text.isprintable():
        return text  # the common case: nothing to look at
    return _UNSAFE.sub(_picture, text)
