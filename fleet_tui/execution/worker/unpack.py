"""A tar from the engine unpacked on a host, safely, on any python3 a host may have.

The archives a host unpacks (the included files of a new worktree, a session's
transcripts) come from our own engine, but they are unpacked into the user's worktree and
config dir, so a member that names a path outside the destination, a link out of it, a
device or a set-id bit is refused rather than trusted. Python's "data" filter (PEP 706) does
exactly that, and is used wherever `tarfile` has it. A distribution's python3 may predate
it: Debian 12's 3.11.2 has no `filter` argument (the backport came with 3.11.4), and an SSH
host or a Ray node running it failed with "TarFile.extractall() got an unexpected keyword
argument 'filter'". There the same rules are applied here before extracting.
"""

from __future__ import annotations

import copy
import os
import stat
import tarfile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

# what the data filter clears from a member's mode
_DROPPED_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWGRP | stat.S_IWOTH


class UnsafeMember(tarfile.TarError):
    """A member the data rules refuse (the same family as PEP 706's FilterError)."""


def extract(archive: tarfile.TarFile, dest: str | os.PathLike[str]) -> None:
    """Every member of archive under dest, refusing one that would land outside it."""
    if hasattr(tarfile, "data_filter"):
        archive.extractall(dest, filter="data")
        return
    archive.extractall(dest, members=list(_checked(archive, os.path.realpath(dest))))


def _inside(root: str, path: str) -> bool:
    return os.path.commonpath([root, path]) == root


def _checked(archive: tarfile.TarFile, root: str) -> Iterator[tarfile.TarInfo]:
    for member in archive.getmembers():
        name = member.name.lstrip("/" + os.sep)  # as the data filter: "/a" is "a"
        target = os.path.realpath(os.path.join(root, name))
        if not name or not _inside(root, target):
            raise UnsafeMember(f"{member.name!r} would be extracted outside the destination")
        if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
            raise UnsafeMember(f"{member.name!r} is a special file")
        if member.issym():
            link = os.path.realpath(os.path.join(os.path.dirname(target), member.linkname))
            if os.path.isabs(member.linkname) or not _inside(root, link):
                raise UnsafeMember(f"{member.name!r} links outside the destination")
        elif member.islnk():
            link = os.path.realpath(os.path.join(root, member.linkname))
            if not _inside(root, link):
                raise UnsafeMember(f"{member.name!r} links outside the destination")
        safe = copy.copy(member)
        safe.name = name
        # the unpacking user owns what it unpacks (extractall as root would chown)
        safe.uid, safe.gid, safe.uname, safe.gname = os.getuid(), os.getgid(), "", ""
        if not member.issym():  # a hard link's mode is its file's
            safe.mode = (member.mode & ~_DROPPED_BITS) | stat.S_IRUSR | stat.S_IWUSR
            if not member.isdir() and not member.mode & stat.S_IXUSR:
                safe.mode &= ~(stat.S_IXGRP | stat.S_IXOTH)
        yield safe
