"""The Ray job's git steps on a node and the controller's NodeBook, without a cluster (real
git, real files): a bundle cut against commits the node's mirror lacks is refused with
`Lacks` before anything is fetched; the released tasks' worktrees are removed through
their mirror (ids that are not task ids are left alone); the abort of an update stopped
on conflicts goes back to the task's tip, and one concluded with the markers still in is
refused; the controller cuts its bundles against what the node holds (none when it
holds the base). tests/execution/ray/test_ray_host.py runs all of it on the real cluster."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest

from fleet_tui.execution.ray.host import NodeBook, RayHost
from fleet_tui.execution.worker import job
from fleet_tui.execution.worker import update as remote_update


def git(where: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def commit(repo: Path, name: str, text: str) -> str:
    (repo / name).write_text(text)
    git(repo, "add", name)
    git(repo, "commit", "-q", "-m", f"{name}: {text.strip()}")
    return git(repo, "rev-parse", "HEAD")


def frames() -> tuple[job.Frames, io.StringIO]:
    out = io.StringIO()
    return job.Frames(out), out


def heads(out: io.StringIO) -> list[dict[str, object]]:
    found = []
    for line in out.getvalue().splitlines():
        frame = job.decode_frame(line)
        assert frame is not None, line
        found.append(frame[0])
    return found


def node_with(git_repo: Path, tmp_path: Path, task_id: str) -> dict[str, str]:
    """A node's data dir whose mirror holds main, and the task's worktree made from it."""
    host = RayHost(name="c", address="http://127.0.0.1:1", env={},
                   data_dir=str(tmp_path / "node"))
    here = tmp_path / "job"
    here.mkdir()
    base = git(git_repo, "rev-parse", "main")
    host._bundle(git_repo, base, task_id, here / job.BUNDLE_FILE, [])
    order = {"task_id": task_id, "mirror": host.mirror_path(git_repo),
             "worktree": host.worktree_path(task_id), "branch": f"fleet/{task_id}",
             "base": base, "mode": "new", "data_dir": host.data_dir}
    job.prepare_repo(order, here)
    return order


def test_a_bundle_cut_against_what_the_mirror_lacks_is_refused(git_repo: Path,
                                                                tmp_path: Path) -> None:
    order = node_with(git_repo, tmp_path, "t1")
    host = RayHost(name="c", address="http://127.0.0.1:1", env={})
    unknown = commit(git_repo, "a.txt", "elsewhere\n")  # never sent to the node
    tip = commit(git_repo, "b.txt", "new\n")
    here = tmp_path / "job2"
    here.mkdir()
    sent = host._bundle(git_repo, tip, "t2", here / job.BUNDLE_FILE, [unknown])
    assert sent["prerequisites"] == [unknown]
    with pytest.raises(job.Lacks, match="lacks 1 of the commits"):
        job.fetch_base(order, here, "refs/fleet/base/t2", tip)
    # no bundle: the mirror must hold the commit itself
    with pytest.raises(job.Lacks, match="it was said to hold"):
        job.fetch_base(order, tmp_path / "nothing", "refs/fleet/base/t2", tip)
    # cut against what it holds: taken; the node holding the commit: no bundle at all
    base = order["base"]
    (here / job.BUNDLE_FILE).unlink()
    sent = host._bundle(git_repo, tip, "t2", here / job.BUNDLE_FILE, [base, "f" * 40])
    assert sent["prerequisites"] == [base]
    job.fetch_base(order, here, "refs/fleet/base/t2", tip)
    assert git(Path(order["mirror"]), "rev-parse", "refs/fleet/base/t2") == tip
    assert host._bundle(git_repo, base, "t3", tmp_path / "x.bundle", [tip]) == \
        {"bytes": 0, "held": True}
    assert not (tmp_path / "x.bundle").exists()


def test_release_removes_the_worktrees_it_finds(git_repo: Path, tmp_path: Path) -> None:
    gone = node_with(git_repo, tmp_path, "gone1")
    config = Path(gone["data_dir"]) / "config" / "gone1"
    config.mkdir(parents=True)
    (config / "settings.json").write_text("{}")
    (Path(gone["data_dir"]) / "outside").mkdir()
    order = dict(gone, task_id="other", released=["gone1", "never1", "../outside"])
    out_frames, out = frames()
    job.release(out_frames, order)
    assert heads(out) == [{"released": {"removed": ["gone1"], "absent": ["never1"]}}]
    assert not Path(gone["worktree"]).exists() and not config.exists()
    assert (Path(gone["data_dir"]) / "outside").is_dir()
    assert "gone1" not in git(Path(gone["mirror"]), "worktree", "list")
    assert git(Path(gone["mirror"]), "for-each-ref", "refs/fleet/base") == ""


def test_abort_goes_back_to_the_tip_and_refuses_a_concluded_update(
        git_repo: Path, tmp_path: Path) -> None:
    order = node_with(git_repo, tmp_path, "ab1")
    worktree = Path(order["worktree"])
    tip = commit(worktree, "f.txt", "the task's\n")
    (worktree / "wip.txt").write_text("not committed yet\n")
    other = commit(git_repo, "f.txt", "main's\n")
    here = tmp_path / "up"
    here.mkdir()
    RayHost(name="c", address="http://127.0.0.1:1", env={})._bundle(
        git_repo, other, "update/ab1", here / job.BUNDLE_FILE, [order["base"]])
    job.fetch_base(order, here, "refs/fleet/base/update/ab1", other)
    # the update job's own step: the worker's work committed first, then stopped mid-merge
    said = remote_update.update(str(worktree), other, "merge", "update", [])
    assert said["status"] == "conflicts" and said["committed"]
    assert remote_update.abort_update(str(worktree), ["f.txt"]) == {
        "aborted": "merge", "restored": True, "head": tip}
    assert git(worktree, "status", "--porcelain") == "?? wip.txt"  # as it was
    (worktree / "wip.txt").unlink()
    # concluded by hand with the markers in: a commit, nothing to abort
    subprocess.run(["git", "-C", str(worktree), "merge", "--no-edit", other],
                   capture_output=True, check=False)
    git(worktree, "commit", "-q", "-am", "concluded")
    said = remote_update.abort_update(str(worktree), ["f.txt"])
    assert "concluded with conflict markers still in f.txt" in str(said["error"])


def test_the_book_forgets_a_release_once_its_node_said_so(tmp_path: Path) -> None:
    book = NodeBook(tmp_path / "ray" / "c.json")
    book.set_node("t1", "node-a")
    book.set_node("t2", "node-a")
    book.release("t1")
    book.release("t2")
    book.release("t3")  # its node never known
    assert book.released() == ["t1", "t2", "t3"]
    book.cleaned("node-b", [], ["t1", "t3"])  # not on node b: t1 was on a
    assert book.released() == ["t1", "t2"]
    book.cleaned("node-a", ["t2"], ["t1"])
    assert book.released() == []
    book.set_tips("node-a", "/m.git", ["1" * 40])
    assert book.tips("node-a", "/m.git") == ["1" * 40]
    assert book.tips("node-b", "/m.git") == []
    assert (tmp_path / "ray" / "c.json").stat().st_mode & 0o777 == 0o600
    assert json.loads((tmp_path / "ray" / "c.json").read_text())["tasks"] == {}
