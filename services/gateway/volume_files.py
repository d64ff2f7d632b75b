"""Files of a volume, as the gateway reads and writes them in its JuiceFS mount (blocking: callers
run these in a thread). Every path is made relative first (levers9.contracts.volumes.relative_path)
and every resolved path is checked to stay inside the volume, so neither `..` nor a symlink that a
container planted there leads anywhere else."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from levers9.contracts.volumes import InvalidPath, inside, relative_path


class NotFound(LookupError):
    pass


def resolve(root: Path, path: str) -> tuple[Path, str]:
    """(the resolved host path, the relative path) of `path` in the volume at `root`."""
    rel = relative_path(path)
    real_root = os.path.realpath(root)
    target = os.path.realpath(os.path.join(real_root, rel))
    if not inside(real_root, target):
        raise InvalidPath(f"path {path!r} leads out of the volume (through a symbolic link)")
    return Path(target), rel


def listing(root: Path, path: str) -> list[dict]:
    target, rel = resolve(root, path)
    if not target.exists():
        raise NotFound(f"no file or directory {rel or '/'!r} in this volume")
    if not target.is_dir():
        return [_entry(target, rel)]
    return sorted((_entry(child, f"{rel}/{child.name}".lstrip("/")) for child in target.iterdir()),
                  key=lambda e: e["path"])


def _entry(path: Path, rel: str) -> dict:
    st = path.lstat()
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "link" if stat.S_ISLNK(st.st_mode) else "file"
    return {"path": rel, "type": kind, "size": st.st_size, "mtime": st.st_mtime}


def open_for_read(root: Path, path: str) -> Path:
    target, rel = resolve(root, path)
    if not target.is_file():
        raise NotFound(f"no file {rel!r} in this volume" + (" (it is a directory)" if target.is_dir() else ""))
    return target


def write(root: Path, path: str, chunks: list[bytes]) -> int:
    """Write a file (its parent directories made); the last component is never followed if it is a link."""
    target, rel = resolve(root, path)
    if not rel:
        raise InvalidPath("put needs a file path inside the volume, not its top")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.levers9-upload")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    size = 0
    with os.fdopen(fd, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
            size += len(chunk)
    os.replace(tmp, target)  # readers see the old file or the whole new one
    return size


def remove(root: Path, path: str, recursive: bool) -> None:
    target, rel = resolve(root, path)
    if not rel:
        raise InvalidPath("rm needs a path inside the volume; delete the volume with `levers9 volumes delete`")
    if not target.exists() and not target.is_symlink():
        raise NotFound(f"no file or directory {rel!r} in this volume")
    if target.is_dir() and not target.is_symlink():
        if not recursive:
            raise InvalidPath(f"{rel!r} is a directory: remove it with --recursive")
        shutil.rmtree(target)
    else:
        target.unlink()
