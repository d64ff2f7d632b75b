"""Unpacking an archive a tenant made (a deployment's code, a corpus) without letting it write outside
its folder: PEP 706's "data" filter where this Python has it (3.11.4 and later), the same rules here
where it does not (Debian 12's python3 is 3.11.2, which the container image runs).
"""

from __future__ import annotations

import copy
import os
import tarfile
from pathlib import Path
from typing import Iterable


class UnsafeArchive(ValueError):
    """A member would land outside the destination, or is not a plain file, folder or inner link."""


def extract_data(tar: tarfile.TarFile, dest: str | os.PathLike, members: Iterable[tarfile.TarInfo] | None = None) -> None:
    chosen = list(tar.getmembers() if members is None else members)
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, members=chosen, filter="data")
        return
    tar.extractall(dest, members=[_checked(m, Path(dest).resolve()) for m in chosen])


def _checked(member: tarfile.TarInfo, dest: Path) -> tarfile.TarInfo:
    """PEP 706's data filter: no absolute or escaping name, no link out, no device, no special bits."""
    name = member.name
    if name.startswith(("/", os.sep)) or not _inside(dest / name, dest):
        raise UnsafeArchive(f"{name!r} would be written outside the destination")
    if member.isdev() or member.isfifo() or not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        raise UnsafeArchive(f"{name!r} is a special file")
    if member.issym():
        if os.path.isabs(member.linkname) or not _inside(dest / os.path.dirname(name) / member.linkname, dest):
            raise UnsafeArchive(f"{name!r} links outside the destination")
    if member.islnk() and (os.path.isabs(member.linkname) or not _inside(dest / member.linkname, dest)):
        raise UnsafeArchive(f"{name!r} links outside the destination")
    clean = copy.copy(member)  # TarInfo.replace is 3.11.4's too
    clean.uid = clean.gid = 0  # owned by the unpacking user (root), not by ids the archive names
    clean.uname = clean.gname = ""
    if member.isfile() or member.isdir():  # no setuid, setgid or sticky bit; nobody else writes
        clean.mode = (member.mode & 0o755) | (0o600 if member.isfile() else 0o700)
    return clean


def _inside(path: Path, dest: Path) -> bool:
    return os.path.realpath(path) == str(dest) or os.path.realpath(path).startswith(str(dest) + os.sep)
