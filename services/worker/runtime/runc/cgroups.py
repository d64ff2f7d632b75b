"""The cgroups of runc containers: where the memory controller keeps one, how many OOM kills it saw,
how much memory it holds, and killing, thawing and removing what a dead worker left.

Works on cgroup v1 (a `memory` and a `freezer` hierarchy) and v2 (the unified one).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path


def memory_cgroup_dir(cgroups_path: str, mountinfo: str | None = None) -> Path | None:
    """Where the memory controller keeps `cgroups_path`: the v1 `memory` hierarchy if mounted,
    else the v2 unified one."""
    if mountinfo is None:
        with open("/proc/self/mountinfo") as f:
            mountinfo = f.read()
    v2 = None
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fstype, _source, options = (right.split() + ["", "", ""])[:3]
        mount_point = left.split()[4]
        if fstype == "cgroup" and "memory" in options.split(","):
            return Path(mount_point) / cgroups_path.lstrip("/")
        if fstype == "cgroup2" and v2 is None:
            v2 = Path(mount_point) / cgroups_path.lstrip("/")
    return v2


def oom_kills(cgroup_dir: Path | None) -> int:
    """How many processes the OOM killer killed in this cgroup (0 when unknown)."""
    if cgroup_dir is None:
        return 0
    for name in ("memory.oom_control", "memory.events"):  # v1, v2
        try:
            text = (cgroup_dir / name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    return 0


def memory_usage(cgroups_path: str) -> int | None:
    """Bytes the memory cgroup holds now, None if unknown."""
    cgroup = memory_cgroup_dir(cgroups_path)
    if cgroup is None:
        return None
    for name in ("memory.usage_in_bytes", "memory.current"):  # v1, v2
        try:
            return int((cgroup / name).read_text())
        except (OSError, ValueError):
            continue
    return None


def cgroup_mounts() -> list[tuple[str, str, str]]:
    """(mount point, fstype, super options) of every cgroup hierarchy."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _source, options = (right.split() + ["", "", ""])[:3]
            if fstype in ("cgroup", "cgroup2"):
                found.append((left.split()[4], fstype, options))
    return found


def thaw(cgroups_path: str) -> None:
    """Thaw the container's cgroup (v1 freezer or v2 cgroup.freeze), if it is frozen."""
    for mount_point, fstype, options in cgroup_mounts():
        base = Path(mount_point) / cgroups_path.lstrip("/")
        try:
            if fstype == "cgroup" and "freezer" in options.split(","):
                (base / "freezer.state").write_text("THAWED")
            elif fstype == "cgroup2" and (base / "cgroup.freeze").exists():
                (base / "cgroup.freeze").write_text("0")
        except OSError:
            pass


async def kill_cgroup(cgroups_path: str, timeout: float = 5) -> None:
    """SIGKILL every process in the container's cgroup until none is left (thawed first: a frozen
    task does not die)."""
    cgroup = memory_cgroup_dir(cgroups_path)
    if cgroup is None or not cgroup.is_dir():
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        thaw(cgroups_path)
        try:
            pids = [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        await asyncio.sleep(0.02)


def remove_cgroups(cgroups_path: str) -> None:
    """Remove the (empty) cgroup directories of `cgroups_path` in every hierarchy, if any are left."""
    for mount_point, _, _ in cgroup_mounts():
        path = Path(mount_point) / cgroups_path.lstrip("/")
        try:
            path.rmdir()
        except OSError:
            pass
