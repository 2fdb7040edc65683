"""One rule for a time limit wherever it is typed or stored: the launch form, `fleet-tui
run --timeout`, a TaskSpec given to the engine and config.toml / the environment take the
same text (`90`, `15m`, `1h30m`), read it as the same seconds, take 0 as "no limit" and
refuse the same things (more than 7 days among them) with durations.py's words."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fleet_tui.commands import tasks
from fleet_tui.core import durations
from fleet_tui.engine.fleet import Fleet, InvalidSpec, TaskSpec
from fleet_tui.settings.config import ConfigError, load_settings
from fleet_tui.ui.screens.launch import parse_duration as form_duration

ACCEPTED = [("90", 90.0), ("15m", 900.0), ("1h30m", 5400.0), ("0", 0.0), ("168h", 604800.0),
            ("604800", 604800.0)]
REFUSED = [("8d", "a number of seconds"), ("169h", "at most 7 days"),
           ("604801", "at most 7 days"), ("1e9", "at most 7 days"), ("-1", "0 or more"),
           ("nan", "finite"), ("soon", "a number of seconds")]


def cli_duration(text: str) -> float:
    try:
        return tasks._duration(text)
    except argparse.ArgumentTypeError as exc:
        raise ValueError(str(exc)) from None


def config_timeout(text: str, home: Path, *, toml: bool) -> float:
    if toml:
        cfg = home / "config.toml"
        cfg.write_text(f'timeout = "{text}"\n', encoding="utf-8")
        settings = load_settings(env={"HOME": str(home)}, config_file=cfg)
    else:
        settings = load_settings(env={"HOME": str(home), "FLEET_WORKER_TIMEOUT": text})
    return settings.timeout


@pytest.mark.parametrize(("text", "seconds"), ACCEPTED)
def test_every_surface_reads_a_duration_the_same(text: str, seconds: float,
                                                 tmp_path: Path) -> None:
    assert durations.parse_duration(text) == seconds
    assert form_duration(text) == seconds  # 0 too: no limit, as everywhere
    assert cli_duration(text) == seconds
    assert config_timeout(text, tmp_path, toml=True) == seconds
    assert config_timeout(text, tmp_path, toml=False) == seconds


@pytest.mark.parametrize(("text", "said"), REFUSED)
def test_every_surface_refuses_the_same_with_the_same_words(text: str, said: str,
                                                            tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=said):
        durations.parse_duration(text)
    with pytest.raises(ValueError, match=said):
        form_duration(text)
    with pytest.raises(ValueError, match=said):
        cli_duration(text)
    for toml in (True, False):
        with pytest.raises(ConfigError, match=said):
            config_timeout(text, tmp_path, toml=toml)


@pytest.mark.parametrize("field", ["stall_seconds", "kill_grace"])
def test_config_seconds_settings_take_durations_and_refuse_zero(field: str,
                                                                tmp_path: Path) -> None:
    """The watchdog's settings are durations too; 0 means nothing there, so it is refused."""
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'{field} = "15m"\n', encoding="utf-8")
    assert getattr(load_settings(env={"HOME": str(tmp_path)}, config_file=cfg), field) == 900
    cfg.write_text(f"{field} = 120\n", encoding="utf-8")  # seconds as a number, as before
    assert getattr(load_settings(env={"HOME": str(tmp_path)}, config_file=cfg), field) == 120
    cfg.write_text(f'{field} = "0s"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="more than 0"):
        load_settings(env={"HOME": str(tmp_path)}, config_file=cfg)


def test_the_cli_refuses_an_absurd_timeout_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert tasks.main(["run", "--timeout", "1000h", "a prompt"]) == 2
    err = capsys.readouterr().err
    assert "at most 7 days" in err and "Traceback" not in err


def test_the_engine_takes_the_same_limits(git_repo: Path) -> None:
    """A TaskSpec's timeout (the form's way in): 0 is no limit, more than 7 days refused."""
    fleet = Fleet(load_settings())
    (task,) = fleet.submit(TaskSpec(prompt="no limit", repo=git_repo, timeout=0))
    assert task.timeout == 0
    for bad in (durations.MAX_SECONDS + 1, 1e12, -1.0, float("nan")):
        with pytest.raises(InvalidSpec, match="timeout"):
            fleet.submit(TaskSpec(prompt="x", repo=git_repo, timeout=bad))
    with pytest.raises(InvalidSpec, match="at most 7 days"):
        fleet.submit(TaskSpec(prompt="x", repo=git_repo, timeout=30 * 86400))
