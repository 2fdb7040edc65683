"""`fleet-tui run` refuses bad input and impossible setups up front:
one clear line, the usage exit code, no traceback, and nothing created: no task in the
store, no worktree, no branch. The real `fleet-tui` entry point runs as a subprocess; none
of these get as far as starting claude."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_tui.commands import tasks
from fleet_tui.engine.fleet import Fleet, FleetError, TaskSpec
from fleet_tui.execution.worker import launch as launcher
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Store
from fleet_tui.system import paths

TUI = Path(sys.executable).parent / "fleet-tui"
BIG = 200 * 1024  # well over the 128 KiB a single argv string may hold on Linux


def fleet_tui(cwd: Path, *args: str, stdin: bytes = b"",
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [str(TUI)] if TUI.exists() else [sys.executable, "-m", "fleet_tui.cli"]
    out = subprocess.run([*cmd, *args], cwd=cwd, input=stdin, capture_output=True,
                         timeout=60, env=env)
    return subprocess.CompletedProcess(out.args, out.returncode,
                                       out.stdout.decode("utf-8", "replace"),
                                       out.stderr.decode("utf-8", "replace"))


def assert_nothing_created(repo: Path) -> None:
    # no task: the store read here, where `fleet-tui ls` reads it (that command as one
    # more subprocess was half of each refusal's time, and tests nothing of the refusal)
    db = paths.db_path()
    assert not db.exists() or Store(db).list_tasks() == []
    worktrees = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=repo,
                               capture_output=True, text=True, check=True).stdout
    assert worktrees.count("worktree ") == 1, worktrees
    branches = subprocess.run(["git", "branch", "--list", "fleet/*"], cwd=repo,
                              capture_output=True, text=True, check=True).stdout
    assert branches.strip() == ""
    assert not (repo / ".fleet-work").exists()


def assert_one_clear_line(out: subprocess.CompletedProcess[str], code: int,
                          *needles: str) -> None:
    assert out.returncode == code, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr and "Error:" not in out.stderr, out.stderr
    for needle in needles:
        assert needle in out.stderr, out.stderr


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e400", "-5", "abc", ""])
def test_timeout_must_be_a_finite_number_of_seconds(git_repo: Path, value: str) -> None:
    out = fleet_tui(git_repo, "run", "hello", f"--timeout={value}")
    assert_one_clear_line(out, 2, "--timeout", "seconds")
    assert_nothing_created(git_repo)


@pytest.mark.parametrize(("flag", "value"), [
    ("--copies", "0"), ("--copies", "-1"), ("--copies", "51"), ("--copies", "two"),
    ("--copies", "1.5"), ("--max-turns", "0"), ("--max-turns", "-3"),
    ("--max-turns", "x"), ("--max-turns", "2.5"),
])
def test_copies_and_max_turns_must_be_whole_numbers_in_range(git_repo: Path, flag: str,
                                                             value: str) -> None:
    out = fleet_tui(git_repo, "run", "hello", flag, value)
    assert_one_clear_line(out, 2, flag, "whole number")
    assert_nothing_created(git_repo)


def test_a_nul_byte_is_refused_from_every_source(git_repo: Path, tmp_path: Path) -> None:
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_bytes(b"write a.txt\x00and more")
    from_file = fleet_tui(git_repo, "run", "--file", str(prompt_file))
    assert_one_clear_line(from_file, 2, "NUL", "prompt")
    # a long prompt is read whole (the NUL is at its very end) and refused the same way
    from_stdin = fleet_tui(git_repo, "run", "-", stdin=b"x" * BIG + b"\x00")
    assert_one_clear_line(from_stdin, 2, "NUL", "prompt")
    assert_nothing_created(git_repo)


def test_invalid_utf8_is_refused_from_every_source(git_repo: Path, tmp_path: Path) -> None:
    prompt_file = tmp_path / "latin1.txt"
    prompt_file.write_bytes("caf\xe9 au lait".encode("latin-1"))
    from_file = fleet_tui(git_repo, "run", "--file", str(prompt_file))
    assert_one_clear_line(from_file, 2, "UTF-8", "0xe9", str(prompt_file))
    from_stdin = fleet_tui(git_repo, "run", "-", stdin=b"hello \xff world")
    assert_one_clear_line(from_stdin, 2, "UTF-8", "0xff", "stdin")
    # bytes on the command line arrive as surrogate escapes (PEP 383)
    bad_arg = os.fsdecode(b"hello \xfe world")
    from_argv = fleet_tui(git_repo, "run", bad_arg)
    assert_one_clear_line(from_argv, 2, "UTF-8", "0xfe", "prompt")
    bad_title = fleet_tui(git_repo, "run", "hello", "--title", os.fsdecode(b"T \xc3("))
    assert_one_clear_line(bad_title, 2, "UTF-8", "title")
    assert_nothing_created(git_repo)


def test_root_without_the_sandbox_opt_in_is_refused_before_anything_exists(
        git_repo: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("FLEET_WORKER_SANDBOX", raising=False)
    monkeypatch.setenv("FLEET_WORKER_CAGE", "off")  # uncaged: a caged worker is sandboxed
    monkeypatch.setenv("FLEET_WORKER_CLAUDE", sys.executable)  # found; never started
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "sk-refusal-test-123456")
    if os.geteuid() == 0:  # what CI sees: the real entry point as the real root
        out = fleet_tui(git_repo, "run", "hello")
        assert_one_clear_line(out, 2, "root", "FLEET_WORKER_SANDBOX=1", "non-root user")
        assert_nothing_created(git_repo)
    # Everywhere: the same command in-process with the effective uid reported as 0.
    monkeypatch.setattr(launcher, "current_euid", lambda: 0)
    monkeypatch.chdir(git_repo)
    assert tasks.main(["run", "hello"]) == 2
    err = capsys.readouterr().err
    assert "FLEET_WORKER_SANDBOX=1" in err and "Traceback" not in err
    # another permission mode does not need the opt-in, so it is not refused for it
    monkeypatch.setattr(launcher, "current_euid", lambda: 0)
    settings = load_settings()
    launcher.check_launch(settings, permission_mode="acceptEdits")
    with pytest.raises(launcher.UsageError):
        launcher.check_launch(settings)
    assert_nothing_created(git_repo)


def test_submit_refuses_what_claude_cannot_take_and_keeps_long_prompts(git_repo: Path) -> None:
    """The engine checks the same (the panel's launch form goes through submit)."""
    fleet = Fleet(load_settings())
    for spec, needle in [
        (TaskSpec(prompt="a\x00b", repo=git_repo), "NUL"),
        (TaskSpec(prompt="ok", title="t\x00", repo=git_repo), "NUL"),
        (TaskSpec(prompt=os.fsdecode(b"x\xff"), repo=git_repo), "UTF-8"),
        (TaskSpec(prompt="ok", title=os.fsdecode(b"\xff"), repo=git_repo), "UTF-8"),
        (TaskSpec(prompt="ok", timeout=float("nan"), repo=git_repo), "timeout"),
        (TaskSpec(prompt="ok", timeout=float("inf"), repo=git_repo), "timeout"),
        (TaskSpec(prompt="ok", max_turns=0, repo=git_repo), "max turns"),
        (TaskSpec(prompt="ok", base_ref="main\x00", repo=git_repo), "NUL"),
        (TaskSpec(prompt="ok", model="m\x00", repo=git_repo), "NUL"),
    ]:
        with pytest.raises(FleetError, match=needle):
            fleet.submit(spec)
    assert fleet.list_tasks() == []
    big = "line of a long prompt\n" * (BIG // 22)
    (task,) = fleet.submit(TaskSpec(prompt=big, repo=git_repo))
    assert len(big.encode()) > 128 * 1024
    assert fleet.get_task(task.id).prompt == big


def test_scrub_tool_env_without_bubblewrap_is_refused_before_anything_exists(
        git_repo: Path, tmp_path: Path) -> None:
    """scrub_tool_env needs bubblewrap and socat on claude's PATH: without them claude
    would refuse to start (bwrap) or fail every Bash call (socat)."""
    bin_dir = tmp_path / "bin"  # a PATH with git but neither bwrap nor socat
    bin_dir.mkdir()
    git_path = subprocess.run(["which", "git"], capture_output=True, text=True,
                              check=True).stdout.strip()
    (bin_dir / "git").symlink_to(git_path)
    env = dict(os.environ, PATH=str(bin_dir), FLEET_WORKER_SCRUB_TOOL_ENV="1",
               FLEET_WORKER_CAGE="off",  # scrub_tool_env is an uncaged worker's
               FLEET_WORKER_CLAUDE=sys.executable, ANTHROPIC_AUTH_TOKEN="sk-refusal-987654")
    out = fleet_tui(git_repo, "run", "hello", env=env)
    assert_one_clear_line(out, 2, "scrub_tool_env", "bwrap and socat", "apt-get install "
                          "bubblewrap socat", "FLEET_WORKER_SCRUB_TOOL_ENV=0")
    assert_nothing_created(git_repo)
    with_bwrap_only = tmp_path / "bwrap-only"
    with_bwrap_only.mkdir()
    (with_bwrap_only / "git").symlink_to(git_path)
    fake_bwrap = with_bwrap_only / "bwrap"  # found on PATH is all the check asks
    fake_bwrap.write_text("#!/bin/sh\nexit 0\n")
    fake_bwrap.chmod(0o755)
    out = fleet_tui(git_repo, "run", "hello", env=dict(env, PATH=str(with_bwrap_only)))
    assert_one_clear_line(out, 2, "socat is not installed")
    assert_nothing_created(git_repo)
    # both there, but bubblewrap cannot make a namespace (a container without user
    # namespaces): claude's tools would all fail, so this is refused up front too
    fake_bwrap.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: "
                          "Operation not permitted' >&2\nexit 1\n")
    (with_bwrap_only / "socat").symlink_to("/bin/true")
    out = fleet_tui(git_repo, "run", "hello", env=dict(env, PATH=str(with_bwrap_only)))
    assert_one_clear_line(out, 2, "cannot make a sandbox", "Operation not permitted")
    assert_nothing_created(git_repo)


def test_scrub_tool_env_off_linux_is_refused_with_the_reason_before_anything_exists(
        git_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """macOS has no Linux namespaces for bubblewrap: scrub_tool_env is refused there, saying
    so and what to do, whatever is on PATH (a stand-in bwrap and socat are)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("bwrap", "socat"):
        (tools / name).write_text("#!/bin/sh\nexit 0\n")
        (tools / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FLEET_WORKER_SCRUB_TOOL_ENV", "1")
    monkeypatch.setenv("FLEET_WORKER_CAGE", "off")  # scrub_tool_env is an uncaged worker's
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "sk-refusal-mac-1234")
    monkeypatch.setattr(launcher, "SYSTEM", "darwin")
    fleet = Fleet(load_settings())
    with pytest.raises(FleetError, match="scrub_tool_env is Linux-only and this is macOS") as err:
        fleet.submit(TaskSpec(prompt="hello", repo=git_repo))
    assert "FLEET_WORKER_SCRUB_TOOL_ENV=0" in str(err.value)
    assert fleet.list_tasks() == []
    assert not (git_repo / ".fleet-work").exists()
    monkeypatch.setattr(launcher, "SYSTEM", "linux")  # the same settings pass on Linux
    settings = load_settings()
    assert launcher.check_setup(settings, dict(os.environ)) == settings.permission_mode


# --- refused before anything is created, and what is read is bounded


def _runnable_env() -> dict[str, str]:
    """claude found and a key set: what a run needs to get as far as creating the task."""
    return dict(os.environ, FLEET_WORKER_CLAUDE=sys.executable,
                ANTHROPIC_AUTH_TOKEN="sk-refusal-late-246810")


def _config(home_config: Path, text: str) -> Path:
    path = home_config / "fleet-tui" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_bad_per_repository_setting_is_refused_before_anything_exists(
        git_repo: Path, isolated_env: Path) -> None:
    """`[repos."<path>"] setup = 7` in config.toml: `ls` and `run` both name the file, line
    and key (exit 2, as any other bad setting); the run stores nothing."""
    path = _config(isolated_env / ".config", f'[repos."{git_repo}"]\nsetup = 7\n')
    for argv in (("run", "hello", "--wait"), ("ls",)):
        out = fleet_tui(git_repo, *argv, env=_runnable_env())
        assert_one_clear_line(out, 2, str(path), "line 2", "setup", "a command (a string)")
    # the same in the repository's own .fleet-tui.toml (config.toml fine): run refuses it
    path.write_text("")
    (git_repo / ".fleet-tui.toml").write_text('include = 3\n')
    out = fleet_tui(git_repo, "run", "hello", "--wait", env=_runnable_env())
    assert_one_clear_line(out, 2, ".fleet-tui.toml", "line 1", "include")
    (git_repo / ".fleet-tui.toml").unlink()
    assert_nothing_created(git_repo)


@pytest.mark.parametrize("where", ["config", "env", "flag", "repos"])
def test_a_setting_too_long_for_a_command_line_is_refused_up_front(
        git_repo: Path, isolated_env: Path, where: str) -> None:
    """A 200 kB model name would pass every check and fail at launch with "Argument list
    too long": settings and task fields that reach claude's argv or environment are
    bounded, and the refusal says by how much."""
    huge = "m" * BIG
    env = _runnable_env()
    argv = ["run", "hello"]
    if where == "config":
        _config(isolated_env / ".config", f'model = "{huge}"\n')
    elif where == "env":  # an exec cannot pass 200 kB in one string itself: 100 kB
        env["FLEET_WORKER_MODEL"] = huge[:100_000]
    elif where == "flag":
        argv += ["--model", huge[:100_000]]
    else:
        _config(isolated_env / ".config", f'[repos."{git_repo}"]\nsetup = "{huge}"\n')
    out = fleet_tui(git_repo, *argv, env=env)
    assert_one_clear_line(out, 2, "too long", "4096")
    assert "m" * 200 not in out.stderr  # the value itself is not echoed back whole
    (isolated_env / ".config" / "fleet-tui" / "config.toml").unlink(missing_ok=True)
    assert_nothing_created(git_repo)


def test_a_prompt_file_is_read_only_up_to_its_limit(git_repo: Path, tmp_path: Path) -> None:
    """`run --file /dev/zero` read for ever: a prompt over 1 MiB is refused with the figure,
    after reading at most the limit and one byte (so an endless source ends at once)."""
    import time

    started = time.monotonic()
    out = fleet_tui(git_repo, "run", "--file", "/dev/zero", env=_runnable_env())
    assert time.monotonic() - started < 30
    assert_one_clear_line(out, 2, "/dev/zero", "over 1 MiB")
    over = tmp_path / "over.txt"
    over.write_bytes(b"x" * ((1 << 20) + 1))
    out = fleet_tui(git_repo, "run", "--file", str(over))
    assert_one_clear_line(out, 2, str(over), "over 1 MiB")
    out = fleet_tui(git_repo, "run", "-", stdin=b"y" * ((1 << 20) + 10))
    assert_one_clear_line(out, 2, "stdin", "over 1 MiB")
    assert_nothing_created(git_repo)


@pytest.mark.caged  # the default cage, refused where the machine cannot cage
def test_a_caged_task_where_the_machine_cannot_cage_is_refused_before_anything_exists(
        git_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cage (the default) needs node, srt, bubblewrap, socat and ripgrep: without them
    `run` refuses in one line saying what to install, or to set cage = "off"."""
    bin_dir = tmp_path / "bin"  # a PATH with git and nothing the cage needs
    bin_dir.mkdir()
    git_path = subprocess.run(["which", "git"], capture_output=True, text=True,
                              check=True).stdout.strip()
    (bin_dir / "git").symlink_to(git_path)
    monkeypatch.delenv("FLEET_WORKER_SANDBOX", raising=False)
    env = dict(os.environ, PATH=str(bin_dir), FLEET_WORKER_SRT=str(tmp_path / "no-srt"),
               FLEET_WORKER_CLAUDE=sys.executable, ANTHROPIC_AUTH_TOKEN="sk-refusal-cage-42")
    out = fleet_tui(git_repo, "run", "hello", env=env)
    assert_one_clear_line(out, 2, "the cage", "node", "srt", "@anthropic-ai/sandbox-runtime",
                          "apt-get install bubblewrap", 'cage = "off"')
    assert_nothing_created(git_repo)
