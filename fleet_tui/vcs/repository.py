"""The repository: finding it from any folder in it, its lock files, and keeping
``.fleet-work/`` out of git.

Merges, discards and worktree creation of one repository take turns across processes and
threads through ``_repo_lock`` (``repolock``, a flock in the common git dir); the merge
queue's own lock (``queue_lock_file``) and the merge's intent record live next to it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from fleet_tui.system import paths
from fleet_tui.system.gitplumbing import run_git
from fleet_tui.vcs import repolock
from fleet_tui.vcs.gitfiles import _common_dir, _git_dir_of
from fleet_tui.vcs.run import GitError, _git_path, _gitpython, _out

LOCK_FILE = "fleet-tui.lock"  # in the common git dir: see repolock
LOCK_TIMEOUT = 120.0  # seconds a merge, discard or worktree creation waits for another
QUEUE_LOCK_FILE = "fleet-tui-queue.lock"  # held by the process running the merge queue
_EXCLUDE_LINE = f"/{paths.WORK_DIR_NAME}/"


def find_repo(path: Path | str) -> Path:
    """The top folder of the checkout containing ``path`` (any subfolder works).

    A path inside a task's worktree gives that worktree (it is its own checkout);
    ``main_worktree`` maps it back to the user's main checkout.
    """
    start, found = _rev_parse(path)
    return found[0] if found is not None else _found_by_gitpython(start)


def main_worktree(path: Path | str) -> Path:
    """The main checkout of the repository containing ``path``, even from a linked worktree."""
    start, found = _rev_parse(path)
    if found is not None:
        top, common = found
    else:
        top = _found_by_gitpython(start)
        common = Path(_out(top, "rev-parse", "--path-format=absolute",
                           "--git-common-dir").strip())
    if common.name == ".git" and common.parent.is_dir():
        return common.parent.resolve()
    return top


def _rev_parse(path: Path | str) -> tuple[Path, tuple[Path, Path] | None]:
    """The folder to start from, and (the checkout's top folder, its common git dir) when
    one `git rev-parse` finds a checkout with a commit; GitError when ``path`` does not
    exist or git says it is in no repository; None for anything else (a bare repository,
    no commit yet, inside a git dir), which GitPython then looks at and says what is
    wrong. Every CLI command starts here: GitPython's import alone costs a process ~75 ms
    of CPU."""
    start = Path(path).expanduser()
    if not start.exists():
        raise GitError(f"{start} does not exist; give the folder of a git repository")
    if start.is_file():
        start = start.parent
    try:
        status, out, err = run_git(start, "rev-parse", "--path-format=absolute",
                                   "--show-toplevel", "--git-common-dir", "--verify",
                                   "--quiet", "HEAD", check=False)
    except GitError:  # git cannot run: GitPython finds the checkout without it
        return start, None
    lines = out.splitlines()
    if status == 0 and len(lines) == 3:
        return start, (Path(lines[0]).resolve(), Path(lines[1]))
    if err.startswith("fatal: not a git repository"):
        raise GitError(f"{start} is not inside a git repository; cd into one, or create one "
                       "with `git init` and a first commit")
    return start, None


def _found_by_gitpython(start: Path) -> Path:
    """The checkout's top folder as GitPython finds it, or GitError saying why there is
    none to work in."""
    gitpython = _gitpython()
    try:
        repo = gitpython.Repo(start, search_parent_directories=True)
    except gitpython.InvalidGitRepositoryError:
        raise GitError(f"{start} is not inside a git repository; cd into one, or create one "
                       "with `git init` and a first commit") from None
    except gitpython.NoSuchPathError:
        raise GitError(f"{start} does not exist; give the folder of a git repository"
                       ) from None
    try:
        if repo.bare:
            raise GitError(f"{repo.git_dir} is a bare repository (no working tree); run "
                           "fleet-tui in a normal clone (`git clone <url>`)")
        top = repo.working_tree_dir
        if top is None:  # pragma: no cover - bare is handled above
            raise GitError(f"{start} has no working tree; run fleet-tui in a normal clone")
        if not repo.head.is_valid():
            raise GitError(f"the repository {top} has no commit yet; make one first "
                           "(`git add -A && git commit -m initial`)")
        return Path(top).resolve()
    finally:
        repo.close()


def queue_lock_file(repo: Path) -> Path:
    """The merge queue's lock of a repository (next to the repository lock): the process
    that holds it runs the queue; the kernel drops it when that process dies."""
    return _lock_file(Path(repo)).with_name(QUEUE_LOCK_FILE)


def _lock_file(repo: Path) -> Path:
    """The repository's lock file: in its common git dir, shared by every worktree."""
    git_dir = _git_dir_of(repo)
    if git_dir is not None and (git_dir / "HEAD").is_file():
        return _common_dir(git_dir) / LOCK_FILE
    common = _out(repo, "rev-parse", "--path-format=absolute", "--git-common-dir").strip()
    return Path(common) / LOCK_FILE


@contextlib.contextmanager
def _repo_lock(repo: Path, what: str) -> Iterator[None]:
    """Hold the repository's lock (every fleet-tui process and thread honours it) while
    worktrees are added or removed and while a merge changes the main checkout.

    It also keeps the engine's own worktree adds apart: git 2.39 reads every worktree's
    admin folder while adding one, and fails ("failed to read .git/worktrees/X/commondir")
    on a folder another `worktree add` is still writing."""
    try:
        with repolock.hold(_lock_file(repo), what, LOCK_TIMEOUT):
            yield
    except repolock.LockTimeout as exc:
        raise GitError(str(exc)) from None


_EXCLUDED: set[Path] = set()  # repositories whose exclude file this process has checked
_EXCLUDED_LOCK = threading.Lock()


def _exclude_file(repo: Path) -> Path:
    git_dir = _git_dir_of(repo)
    if git_dir is not None and (git_dir / "HEAD").is_file():
        return _common_dir(git_dir) / "info" / "exclude"
    return _git_path(repo, "info/exclude")


def _ensure_excluded_once(repo: Path) -> None:
    """ensure_excluded, once per repository per process (each worktree creation needs it)."""
    if repo in _EXCLUDED:
        return
    with _EXCLUDED_LOCK:
        if repo not in _EXCLUDED:
            ensure_excluded(repo)
            _EXCLUDED.add(repo)


def ensure_excluded(repo: Path) -> None:
    """Keep ``.fleet-work/`` out of git through ``info/exclude`` (appends the line once)."""
    exclude = _exclude_file(repo)
    try:
        text = exclude.read_text(encoding="utf-8") if exclude.exists() else ""
        lines = {line.strip() for line in text.splitlines()}
        if _EXCLUDE_LINE in lines or f"{paths.WORK_DIR_NAME}/" in lines:
            return
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with exclude.open("a", encoding="utf-8") as fh:
            if text and not text.endswith("\n"):
                fh.write("\n")
            fh.write(f"# fleet-tui worktrees and logs\n{_EXCLUDE_LINE}\n")
    except OSError as exc:
        raise GitError(f"cannot update {exclude}: {exc.strerror or exc}") from None

