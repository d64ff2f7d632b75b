"""Checkpoints of GPU containers: whether this worker may dump one (pure), and the CUDA side of a dump.

CRIU alone cannot dump a process that holds GPU state. With an NVIDIA driver >= 570 (the first with
CRIU 4 integration and process-tree support in cuda-checkpoint), `cuda-checkpoint` and CRIU's CUDA
plugin (cuda_plugin.so in CRIU's plugin directory), the dump is: `cuda-checkpoint --toggle --pid P`
for each process of the container that holds CUDA state (its GPU memory moves into host memory and
the GPU is released), CRIU's dump (leave-running), then the same toggle again so the container goes
on using its GPU. The restore leaves the toggle back to CRIU's CUDA plugin (it resumes the restored
tasks' CUDA state). Anything missing: the container runs cold and its ContainerStarted note says why.

Not exercised here: this machine has no GPU. The decision is tested; the toggle is wired into the
dump path (levers9.worker.checkpoints.orchestration.dump) for a GPU container only when the decision allows it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

from .criu_install import run_bounded

log = logging.getLogger("levers9.worker.checkpoints.gpu")

MIN_DRIVER = 570
CUDA_PLUGIN = "cuda_plugin.so"
# where CRIU looks for plugins (its default libdir), and where our private CRIU root keeps them
PLUGIN_DIRS = ("/usr/lib/criu", "/usr/local/lib/criu", "/usr/lib64/criu")
TOGGLE_TIMEOUT_S = 120.0
NO_DRIVER = "no NVIDIA driver detected (configured inventory)"


def driver_major(version: str) -> int | None:
    """580 for "580.65.06"; None when it is not a version."""
    m = re.match(r"^\s*(\d+)", version or "")
    return int(m.group(1)) if m else None


def gpu_checkpoint(driver_version: str, has_cuda_checkpoint: bool, has_criu_cuda_plugin: bool) -> tuple[bool, str]:
    """(allowed, reason): a GPU container may be dumped only with a driver >= 570, cuda-checkpoint and
    CRIU's CUDA plugin; else the reason names the first that is missing."""
    major = driver_major(driver_version)
    if not driver_version:
        return False, NO_DRIVER
    if major is None:
        return False, f"the NVIDIA driver version {driver_version!r} is not understood"
    if major < MIN_DRIVER:
        return False, f"NVIDIA driver {driver_version} is older than {MIN_DRIVER} (CUDA checkpoints need {MIN_DRIVER}+)"
    if not has_cuda_checkpoint:
        return False, f"driver {driver_version} but no cuda-checkpoint on PATH"
    if not has_criu_cuda_plugin:
        return False, f"driver {driver_version} but CRIU has no CUDA plugin ({CUDA_PLUGIN})"
    return True, f"driver {driver_version}, cuda-checkpoint and CRIU's CUDA plugin present"


def cuda_checkpoint_binary() -> str | None:
    return shutil.which("cuda-checkpoint")


def criu_cuda_plugin(cache_dir: Path | None = None) -> Path | None:
    """CRIU's CUDA plugin on this host, or in the private CRIU root levers9.worker.checkpoints.criu_install makes."""
    dirs = [Path(d) for d in PLUGIN_DIRS]
    if cache_dir is not None:
        dirs += [root / "usr/lib/criu" for root in sorted((cache_dir / "criu").glob("*")) if root.is_dir()]
    for d in dirs:
        if (d / CUDA_PLUGIN).is_file():
            return d / CUDA_PLUGIN
    return None


# ---- the shell: the toggle around a dump -----------------------------------------------------------

def container_pids(container_id: str) -> list[int]:
    from levers9.worker.runtime.runc.bundle import cgroups_path
    from levers9.worker.runtime.runc.cgroups import memory_cgroup_dir
    cgroup = memory_cgroup_dir(cgroups_path(container_id))
    try:
        return [int(p) for p in (cgroup / "cgroup.procs").read_text().split()] if cgroup else []
    except (OSError, ValueError):
        return []


async def _cuda(*args: str) -> tuple[int, str]:
    rc, out = await run_bounded("cuda-checkpoint", *args, timeout=TOGGLE_TIMEOUT_S)
    return rc, out.strip()


async def cuda_pids(pids: list[int]) -> list[int]:
    """The pids that hold CUDA state that runs now (cuda-checkpoint --get-state says "running")."""
    held = []
    for pid in pids:
        rc, out = await _cuda("--get-state", "--pid", str(pid))
        if rc == 0 and out.splitlines()[-1:] == ["running"]:
            held.append(pid)
    return held


@contextlib.asynccontextmanager
async def cuda_suspended(container_id: str, enabled: bool) -> AsyncIterator[list[int]]:
    """Around a dump of a GPU container: its CUDA processes toggled to checkpointed, then back."""
    if not enabled:
        yield []
        return
    toggled: list[int] = []
    try:
        for pid in await cuda_pids(container_pids(container_id)):
            rc, out = await _cuda("--toggle", "--pid", str(pid))
            if rc != 0:
                raise RuntimeError(f"cuda-checkpoint --toggle --pid {pid} failed: {out[-300:]}")
            toggled.append(pid)
        yield toggled
    finally:
        for pid in toggled:  # leave-running: the container goes on with its GPU
            rc, out = await _cuda("--toggle", "--pid", str(pid))
            if rc != 0:
                log.error("cuda-checkpoint could not resume pid %d of %s: %s", pid, container_id, out[-300:])
