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
    # the prompt to start afresh with when claude never saved that session (see afresh())
    fresh_prompt: str | None = None
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

    def afresh(self) -> str | None:
        """A resume of a session claude never saved starts afresh: no --resume, and
        fresh_prompt in place of the continuation (changed in place). What to say of it, or
        None when the run goes as asked.

        claude (2.1.197, 2.1.332) writes a session's transcript to CLAUDE_CONFIG_DIR/
        projects/<its cwd, mangled>/<id>.jsonl only once it takes in the first prompt, some
        100 ms after its init line names the session: a worker killed in between leaves an
        id that `--resume` refuses ("No conversation found with session ID"), an error and
        no turn. Looked for here, on the host that runs claude, where the transcript is."""
        if not self.resume or self.fresh_prompt is None \
                or saved_session(self.config_dir, self.resume):
            return None
        named = self.resume if _plain_id(self.resume) else "named"  # never odd text
        note = (f"the session {named} could not be resumed (claude had not saved it): "
                "the attempt started afresh with the task's prompt")
        self.resume, self.prompt = None, self.fresh_prompt
        return note

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("spec.json must hold a JSON object")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def saved_session(config_dir: str, session_id: str) -> bool:
    """claude's transcript of ``session_id`` is in ``config_dir`` (under any project: the
    name claude makes of the cwd is not relied on; a resume runs in the same worktree)."""
    if not _plain_id(session_id):
        return False  # not an id claude makes: nothing to look for (nor a path to build)
    import os

    projects = os.path.join(config_dir, "projects")
    try:
        names = os.listdir(projects)
    except OSError:
        return False
    return any(os.path.isfile(os.path.join(projects, name, session_id + ".jsonl"))
               for name in names)


def _plain_id(session_id: str) -> bool:
    """Letters, digits and dashes, as claude's session ids (UUIDs) are."""
    return 0 < len(session_id) <= 100 and all(
        c == "-" or (c.isascii() and c.isalnum()) for c in session_id)
