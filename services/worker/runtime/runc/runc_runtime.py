"""RuncRuntime: each app in a real container (runc, overlay root, own network namespace, cgroup).

Layout of one container, under `<state_dir>/containers/<id>/`:
    config.json  the OCI bundle spec (levers9.worker.runtime.runc.bundle, pure)
    upper/ work/ the overlay's writable layer over the shared base root (levers9.worker.runtime.runc.rootfs)
    rootfs/      the overlay mount (levers9.worker.mounts.syscalls)
    state.json   what stop() and cleanup_all() need after a restart (levers9.worker.runtime.runc.cli.Record)
    spec.json    the spec fields a checkpoint's manifest carries (env, cpu, memory, command, port)
    criu.conf    CRIU's options for this container, named by the `org.criu.config` annotation
    runc.log     runc's own log of `runc run` (or `runc restore`)
runc's state lives in `<state_dir>/runc` (`runc --root`), so workers of one machine never see each
other's containers. After stop() only the log is left, moved to `<state_dir>/logs/<id>.log`.

Composed of two parts, each its own module: the lifecycle (levers9.worker.runtime.runc.lifecycle: prepare,
start, poll, stop, cleanup) and CRIU's checkpoint/restore of its containers (levers9.worker.runtime.runc.
dump_restore), which is given the lifecycle; this class only hands each call to its part. The bundle, the
cgroups, the mounts and the runc command line are plain functions beside them.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from levers9.runtime.config import Settings
from levers9.worker.checkpoints.archive import CheckpointArtifact
from levers9.worker.checkpoints.criu_install import CriuInfo
from levers9.worker.images.layers import ImageMounts
from levers9.worker.network.bridge import Ipam, Names
from levers9.worker.runtime.interface import Capabilities, ContainerSpec, Exit, Progress, Runtime, Started

from .dump_restore import RuncCheckpoints
from .lifecycle import RuncLifecycle


class RuncRuntime(Runtime):
    name = "runc"
    features = ["runc"]
    capabilities = Capabilities(isolation=True, memory_limit=True, checkpoints=True, warm_checkpoints=True,
                                confined_jobs=True)

    def __init__(self, state_dir: Path, settings: Settings, runc: str | None = None):
        super().__init__(state_dir, settings)
        self.lifecycle = RuncLifecycle(self.state_dir, settings, runc)
        self.checkpoints = RuncCheckpoints(self.lifecycle)

    # -- the lifecycle --

    async def prepare(self, progress: Progress = lambda s: None) -> None:
        await self.lifecycle.prepare(progress)

    async def start(self, spec: ContainerSpec) -> Started:
        return await self.lifecycle.start(spec)

    async def poll(self, container_id: str) -> Exit | None:
        return await self.lifecycle.poll(container_id)

    async def stop(self, container_id: str, timeout: float = 10) -> Exit:
        return await self.lifecycle.stop(container_id, timeout)

    def log_path(self, container_id: str) -> Path:
        return self.lifecycle.log_path(container_id)

    def open_log(self, container_id: str) -> BinaryIO:
        return self.lifecycle.open_log(container_id)

    async def cleanup_all(self) -> list[str]:
        found = await self.lifecycle.cleanup_all()
        self.checkpoints.remove_unfinished_dumps()  # dumps a dead worker did not finish
        return found

    def running(self) -> list[str]:
        return self.lifecycle.running()

    async def close(self) -> None:
        await self.lifecycle.images.close()  # no lazyfs server outlives its worker (mounts held by none)

    def container_dir(self, container_id: str) -> Path:
        return self.lifecycle.container_dir(container_id)

    def names(self, container_id: str) -> Names:
        return self.lifecycle.names(container_id)

    @property
    def runc(self) -> str:
        return self.lifecycle.runc

    @property
    def runc_root(self) -> Path:
        return self.lifecycle.runc_root

    @property
    def ipam(self) -> Ipam:
        return self.lifecycle.ipam

    @property
    def images(self) -> ImageMounts:
        return self.lifecycle.images

    @images.setter
    def images(self, mounts: ImageMounts) -> None:  # tests and benches swap in their own mode
        self.lifecycle.images = mounts

    @property
    def _base(self) -> Path | None:  # the base root's path (bench/bench_image_start.py swaps it)
        return self.lifecycle._base

    @_base.setter
    def _base(self, path: Path | None) -> None:
        self.lifecycle._base = path

    # -- checkpoints --

    @property
    def checkpoint_ready(self) -> bool:
        return self.checkpoints.checkpoint_ready

    def use_criu(self, info: CriuInfo) -> None:
        self.checkpoints.use_criu(info)

    async def enable_checkpoints(self, progress: Progress = lambda s: None) -> CriuInfo:
        return await self.checkpoints.enable_checkpoints(progress)

    @property
    def _criu(self) -> CriuInfo | None:  # the CRIU in use, None while checkpoints are off
        return self.checkpoints._criu

    def memory_usage(self, container_id: str) -> int | None:
        return self.checkpoints.memory_usage(container_id)

    async def checkpoint(self, container_id: str, out_tar: Path, *, cut_connections: bool = False
                         ) -> CheckpointArtifact:
        return await self.checkpoints.checkpoint(container_id, out_tar, cut_connections=cut_connections)

    async def restore(self, spec: ContainerSpec, tar: Path) -> Started:
        return await self.checkpoints.restore(spec, tar)

    async def warm(self, tar: Path) -> None:
        await self.checkpoints.warm(tar)

    @property
    def dump_timeout(self) -> float:
        return self.checkpoints.dump_timeout

    @dump_timeout.setter
    def dump_timeout(self, seconds: float) -> None:
        self.checkpoints.dump_timeout = seconds

    @property
    def restore_timeout(self) -> float:
        return self.checkpoints.restore_timeout

    @restore_timeout.setter
    def restore_timeout(self, seconds: float) -> None:
        self.checkpoints.restore_timeout = seconds

    @property
    def criu_log_limit(self) -> int:
        return self.checkpoints.criu_log_limit

    @criu_log_limit.setter
    def criu_log_limit(self, limit: int) -> None:
        self.checkpoints.criu_log_limit = limit
