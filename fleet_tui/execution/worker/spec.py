"""What the engine asks a host to run: the attempt's spec, the same on every host.

A host writes it as the attempt folder's `spec.json` and its runner reads it back there;
it never holds a credential. Kept apart from the runner so that the engine and every host
know it without loading a host's code (and the runner, started once per attempt, loads
only this and json).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

TYPE_CHECKING = False
if TYPE_CHECKING:  # loaded by every runner: typing would cost each one ~5 ms
    from typing import Any

TOKEN_ENV = "FLEET_ATTEMPT_TOKEN"  # inherited by everything claude starts

# How long leftover descendants get between SIGTERM and SIGKILL once claude has exited.
LEFTOVER_GRACE = 1.0


@dataclass
class RunSpec:
    """What the engine asks one runner to do. Never holds a credential."""

    cwd: str
    prompt: str
    config_dir: str
    args: list[str] = field(default_factory=list)  # extra claude arguments
    model: str | None = None  # overrides the OPUS/SONNET mapping (small-model fallback)
    permission_mode: str | None = None
    max_turns: int | None = None
    resume: str | None = None  # session id for --resume
    settings: dict[str, Any] = field(default_factory=dict)  # load_settings overrides
    task_id: str = ""
    attempt: int = 0
    token: str = ""  # FLEET_ATTEMPT_TOKEN for claude and all it starts ("" = none)
    timeout: float | None = None  # wall-clock seconds (None or 0: none)
    kill_grace: float = 5.0  # SIGTERM, then SIGKILL this much later
    # a ready worktree (see prepare.py); run once per new worktree
    repo: str = ""  # the main checkout, where included files come from
    include: list[str] = field(default_factory=list)  # gitignore patterns of files to copy
    setup: str | None = None  # run in the worktree before claude starts (/bin/sh -c)
    env: dict[str, str] = field(default_factory=dict)  # FLEET_TASK_ID, FLEET_PORT

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("spec.json must hold a JSON object")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
