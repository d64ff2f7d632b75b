"""Mounts of runc containers: the overlay root over the shared base, and unmounting (lazily when
busy, stacked ones one by one)."""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

from levers9.worker.runtime.interface import ContainerError

_libc = ctypes.CDLL(None, use_errno=True)
MNT_DETACH = 2


def mount_overlay(lower: Path, upper: Path, work: Path, target: Path) -> None:
    for path in (lower, upper, work):
        if any(c in str(path) for c in ",:\\"):
            raise ContainerError(f"overlay paths must not contain ',', ':' or '\\': {path}")
    options = f"lowerdir={lower},upperdir={upper},workdir={work}".encode()
    if _libc.mount(b"overlay", str(target).encode(), b"overlay", 0, options) != 0:
        err = ctypes.get_errno()
        raise ContainerError(f"mounting the overlay at {target}: {os.strerror(err)}")


def unmount(target: Path) -> None:
    """Unmount `target` if it is a mount point (lazily if busy)."""
    for _ in range(8):  # overlays stacked on the same point come off one by one
        if not is_mount_point(target):
            return
        if _libc.umount2(str(target).encode(), 0) != 0:
            err = ctypes.get_errno()
            if err == errno.EBUSY:
                _libc.umount2(str(target).encode(), MNT_DETACH)
            elif err in (errno.EINVAL, errno.ENOENT):
                return
            else:
                raise ContainerError(f"unmounting {target}: {os.strerror(err)}")
    if is_mount_point(target):
        raise ContainerError(f"{target} is still mounted")


def detach(mount_point: str) -> None:
    """A lazy unmount; failing only when it is gone already."""
    _libc.umount2(mount_point.encode(), MNT_DETACH)


def is_mount_point(path: Path) -> bool:
    return str(Path(path)) in mount_points()


def mount_points() -> set[str]:
    with open("/proc/self/mountinfo") as f:
        return {line.split()[4].replace("\\040", " ") for line in f}


def mounts_under(top: Path) -> list[str]:
    """`top` and every mount point below it."""
    prefix = str(top)
    return [m for m in mount_points() if m == prefix or m.startswith(prefix + "/")]
