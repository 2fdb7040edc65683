"""A host unpacks the engine's tars (included files, a session's transcripts) with the
data rules on any python3: Python's own filter where `tarfile` has it, the worker's checks
where it does not (Debian 12's python3 3.11.2, on which the agent and the Ray job failed
with "unexpected keyword argument 'filter'"). Each archive is unpacked three ways: here
with the filter, here with the filter taken away, and by the distribution's python3 as a
host runs it (`-I -S`, the package copy alone on the path)."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from test_host_stdlib import (  # noqa: F401  (package: a fixture)
    HOST_PYTHON,
    a_spec,
    agent,
    host_env,
    no_traceback,
    package,
)

from fleet_tui.execution.worker import unpack

Member = tuple[str, bytes | None, int, bytes, str]  # name, type, mode, data, link


def make_tar(*members: Member) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, mode, data, link in members:
            info = tarfile.TarInfo(name)
            info.type = kind if kind is not None else tarfile.REGTYPE
            info.mode, info.linkname, info.uid, info.gid = mode, link, 4242, 4242
            info.size = len(data) if info.type == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buf.getvalue()


GOOD = make_tar(("notes", tarfile.DIRTYPE, 0o777, b"", ""),
                ("notes/local.txt", None, 0o4777, b"kept\n", ""),
                ("notes/private.txt", None, 0o400, b"mine\n", ""),
                ("notes/group-x.txt", None, 0o654, b"x\n", ""),
                ("/notes/abs.txt", None, 0o644, b"abs\n", ""),
                ("notes/link", tarfile.SYMTYPE, 0o777, b"", "local.txt"),
                ("notes/hard", tarfile.LNKTYPE, 0o4777, b"", "notes/local.txt"))
BAD = {
    "dot-dot": make_tar(("../outside.txt", None, 0o644, b"no\n", "")),
    "deep dot-dot": make_tar(("notes/../../outside.txt", None, 0o644, b"no\n", "")),
    "absolute link": make_tar(("passwd", tarfile.SYMTYPE, 0o777, b"", "/etc/passwd")),
    "link out": make_tar(("up", tarfile.SYMTYPE, 0o777, b"", "../outside.txt")),
    "hard link out": make_tar(("h", tarfile.LNKTYPE, 0o644, b"", "../outside.txt")),
    "through a link": make_tar(("d", tarfile.SYMTYPE, 0o777, b"", ".."),
                               ("d/outside.txt", None, 0o644, b"no\n", "")),
    "device": make_tar(("null", tarfile.CHRTYPE, 0o666, b"", "")),
    "fifo": make_tar(("pipe", tarfile.FIFOTYPE, 0o666, b"", "")),
}


def in_process(data: bytes, dest: Path) -> str:
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            unpack.extract(archive, dest)
    except tarfile.TarError as exc:
        return f"refused: {exc}"
    return "ok"


def by_the_hosts_python(pkg: Path) -> Callable[[bytes, Path], str]:
    script = ("import io, sys, tarfile; sys.path.insert(0, sys.argv[1]);"
              "from fleet_tui.execution.worker import unpack\n"
              "try:\n"
              "    with tarfile.open(fileobj=io.BytesIO(sys.stdin.buffer.read())) as a:\n"
              "        unpack.extract(a, sys.argv[2])\n"
              "except tarfile.TarError as exc:\n"
              "    print('refused: %s' % exc)\n"
              "else:\n"
              "    print('ok')\n")

    def run(data: bytes, dest: Path) -> str:
        done = subprocess.run([HOST_PYTHON, "-I", "-S", "-c", script, str(pkg), str(dest)],
                              input=data, capture_output=True, timeout=60, env={})
        assert done.returncode == 0 and not done.stderr, done.stderr.decode()[-2000:]
        return done.stdout.decode().strip()
    return run


@pytest.fixture(params=["filter", "no filter", "host python3"])
def extract(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
            ) -> Callable[[bytes, Path], str]:
    if request.param == "filter":
        if not hasattr(tarfile, "data_filter"):
            pytest.skip(f"this python ({sys.version.split()[0]}) has no tarfile filter")
        return in_process
    if request.param == "no filter":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
        return in_process
    return by_the_hosts_python(request.getfixturevalue("package"))


def test_a_good_archive_unpacks_with_the_data_rules(extract: Callable[[bytes, Path], str],
                                                    tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    assert extract(GOOD, dest) == "ok"
    notes = dest / "notes"
    assert (notes / "local.txt").read_text() == "kept\n"
    assert (notes / "link").read_text() == "kept\n" and (notes / "link").is_symlink()
    assert (notes / "hard").read_text() == "kept\n"
    assert (notes / "abs.txt").read_text() == "abs\n"  # "/notes/abs.txt" lands inside
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in notes.iterdir()
             if not p.is_symlink()}
    # set-id bits and group/other write cleared; the owner can read and write; x only
    # where the owner has it
    assert modes["local.txt"] == 0o755 and modes["private.txt"] == 0o600
    assert modes["group-x.txt"] == 0o644
    assert stat.S_IMODE(notes.stat().st_mode) & (stat.S_IWGRP | stat.S_IWOTH) == 0
    # the unpacking user owns it all (as root, extractall would give it to uid 4242)
    assert {p.lstat().st_uid for p in [notes, *notes.iterdir()]} == {os.getuid()}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_member_that_would_leave_the_destination_is_refused(
        case: str, extract: Callable[[bytes, Path], str], tmp_path: Path) -> None:
    dest = tmp_path / "box" / "dest"
    dest.mkdir(parents=True)
    said = extract(BAD[case], dest)
    assert said.startswith("refused: "), said
    assert not (tmp_path / "box" / "outside.txt").exists()
    assert not any(p.is_char_device() or p.is_fifo() for p in dest.rglob("*"))


def test_the_agent_stages_included_files_on_the_hosts_python(
        package: Path, tmp_path: Path) -> None:  # noqa: F811
    """The agent's `stage` unpacks the included files into the new worktree (it failed
    there on Debian 12's python3), and refuses a bad archive in one line."""
    spec = a_spec(tmp_path, "http://127.0.0.1:9", "claude", "off")
    order = json.dumps({"spec": json.loads(spec.to_json()), "config_dir": spec.config_dir,
                        "set_up_after": True}).encode()
    env = host_env(tmp_path, "/usr/bin:/bin")
    code, answer, err = agent(package, env, "stage", str(tmp_path / "a1"),
                              stdin=order + b"\n" + GOOD)
    no_traceback(err)
    assert code == 0 and "staged" in answer, (answer, err)
    assert (Path(spec.cwd) / "notes" / "local.txt").read_text() == "kept\n"
    (tmp_path / "second").mkdir()
    fresh = a_spec(tmp_path / "second", "http://127.0.0.1:9", "claude", "off")
    order = json.dumps({"spec": json.loads(fresh.to_json()), "config_dir": fresh.config_dir,
                        "set_up_after": True}).encode()
    code, answer, err = agent(package, env, "stage", str(tmp_path / "a2"),
                              stdin=order + b"\n" + BAD["dot-dot"])
    no_traceback(err)
    assert code == 1 and "could not unpack the included files" in str(answer["error"]), answer
    assert not (tmp_path / "second" / "outside.txt").exists()
