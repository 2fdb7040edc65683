"""RunSpec.afresh: where the runner looks for claude's saved session before `--resume`
(the layout checked with claude 2.1.197 and 2.1.332: CLAUDE_CONFIG_DIR/projects/<the cwd,
mangled>/<id>.jsonl; tests/engine/test_resume_unsaved.py drives the real binary)."""

from __future__ import annotations

from pathlib import Path

from fleet_tui.execution.worker.spec import RunSpec, saved_session

SID = "6e60880f-516c-40b2-8721-e36ea6dfa80f"


def _spec(config: Path, resume: str | None, fresh: str | None = "the task") -> RunSpec:
    return RunSpec(cwd="/w", prompt="continue", config_dir=str(config), resume=resume,
                   fresh_prompt=fresh)


def test_a_saved_session_is_resumed_and_a_missing_one_starts_afresh(tmp_path: Path) -> None:
    project = tmp_path / "projects" / "-w"
    project.mkdir(parents=True)
    (project / f"{SID}.jsonl").write_text("{}\n")
    kept = _spec(tmp_path, SID)
    assert kept.afresh() is None and kept.resume == SID and kept.prompt == "continue"
    other = "0f8c2a52-1111-4222-8333-444455556666"
    gone = _spec(tmp_path, other)
    note = gone.afresh()
    assert note is not None and f"the session {other} could not be resumed" in note
    assert gone.resume is None and gone.prompt == "the task"
    assert not saved_session(str(tmp_path / "nowhere"), SID)  # no config dir yet


def test_an_old_engine_or_a_fresh_run_is_left_as_asked(tmp_path: Path) -> None:
    old = _spec(tmp_path, SID, fresh=None)  # an engine that sends no fresh prompt
    assert old.afresh() is None and old.resume == SID
    fresh = _spec(tmp_path, None)
    assert fresh.afresh() is None and fresh.prompt == "continue"


def test_an_odd_session_id_is_never_a_path_nor_shown(tmp_path: Path) -> None:
    (tmp_path / "projects" / "x").mkdir(parents=True)
    (tmp_path / "escaped.jsonl").write_text("{}\n")
    for odd in ("../../escaped", "*", "a/b", "\x1b[31mred", ""):
        assert not saved_session(str(tmp_path), odd)
    spec = _spec(tmp_path, "../\x1b[31m")
    note = spec.afresh()
    assert note is not None and "\x1b" not in note and "../" not in note
    assert RunSpec.from_json(_spec(tmp_path, SID).to_json()).fresh_prompt == "the task"
