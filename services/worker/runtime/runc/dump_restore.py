"""Checkpoint and restore of runc containers with CRIU: one of the two parts RuncRuntime
(levers9.worker.runtime.runc.runc_runtime) is composed of, working over the containers of the other,
the lifecycle (levers9.worker.runtime.runc.lifecycle), which it is given.

checkpoint() pauses the container, dumps it leave-running with `runc checkpoint`, copies its upper
layer, thaws it, and writes one tar (levers9.worker.checkpoints.archive); restore() unpacks such a tar once
per worker (kept, read in place by later restores), makes a new container dir with a new network
namespace and address, and runs `runc restore`. Dumps are staged in `<state_dir>/checkpoints/`.
CRIU itself is found or made by levers9.worker.checkpoints.criu_install.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from levers9.executor import wire
from levers9.runtime.off_loop import remove_tree
from levers9.worker.checkpoints import archive as ckpt
from levers9.worker.checkpoints.criu_install import CriuInfo, ensure_criu
from levers9.worker.network import bridge as network
from levers9.worker.runtime.interface import ContainerSpec, Progress, Started, start_time

from . import cgroups
from .bundle import HARDENING, bundle_spec, cgroups_path, hosts_file, spec_record, write_upper
from .cli import Record, criu_reason, nothing
from .lifecycle import CRIU_CONF, SPEC_FILE, RuncLifecycle

KEEP_UNPACKED = 3  # checkpoints kept unpacked per worker for fast restores
CRIU_LOG_LIMIT = 256 << 20  # a CRIU log past this means CRIU loops (see RuncCli.watched)


class RuncCheckpoints:
    """checkpoint() and restore() of the lifecycle's containers, once use_criu() armed them."""

    def __init__(self, lifecycle: RuncLifecycle):
        self.lc = lifecycle
        self.state_dir, self.settings = lifecycle.state_dir, lifecycle.settings
        self._criu: CriuInfo | None = None  # set by use_criu(): checkpoints on
        self.dump_timeout = 300.0  # seconds runc checkpoint may take (the container is paused)
        self.restore_timeout = 60.0  # seconds runc restore may take before it counts as failed
        self.criu_log_limit = CRIU_LOG_LIMIT
        self._base_id: str | None = None
        self._reading: Counter[str] = Counter()  # unpacked checkpoints restores read now (never evicted)

    # -- CRIU on or off --

    def use_criu(self, info: CriuInfo) -> None:
        """Arm checkpoint() and restore() with a working CRIU (levers9.worker.checkpoints.criu_install.ensure_criu)."""
        self._criu = info

    async def enable_checkpoints(self, progress: Progress = lambda s: None) -> CriuInfo:
        """Find or make CRIU (a minute the first time on a machine) and use it; CriuUnavailable
        says why not."""
        info = await ensure_criu(Path(self.settings.images.image_cache), progress)
        self.use_criu(info)
        return info

    @property
    def checkpoint_ready(self) -> bool:
        return self._criu is not None

    def memory_usage(self, container_id: str) -> int | None:
        """Bytes the container's memory cgroup holds now (what a dump roughly writes), None if unknown."""
        return cgroups.memory_usage(cgroups_path(container_id))

    # -- checkpoint --

    async def checkpoint(self, container_id: str, out_tar: Path, *, cut_connections: bool = False
                         ) -> ckpt.CheckpointArtifact:
        """Dump the running container into `out_tar`; it keeps running (and serving).

        The container is frozen (runc pause) for the dump AND the copy of its writable layer, so
        the files match the memory image (CRIU checks the size of every open file on restore:
        the log grows while a leave-running container serves). Then it is thawed and the tar is
        written outside the pause. `cut_connections`: its TCP connections to anything outside it are
        ended while it is frozen (cut_outside_connections)."""
        criu = self._criu
        if criu is None:
            raise ckpt.CheckpointError("checkpoints are off here: no working CRIU (use_criu was not called)")
        cid = container_id
        async with self.lc._locks.setdefault(cid, asyncio.Lock()):
            rec = self.lc._record(cid)
            if rec is None or cid in self.lc._ended or not await self.lc._is_running(rec):
                raise ckpt.CheckpointError(f"container {cid} is not running")
            cdir = self.lc.container_dir(cid)
            try:
                spec = json.loads((cdir / SPEC_FILE).read_text())
                hostname = json.loads((cdir / "config.json").read_text()).get("hostname", cid)
            except (OSError, ValueError) as exc:
                raise ckpt.CheckpointError(f"container {cid} has no readable spec: {exc}") from exc
            scratch = self.state_dir / "checkpoints" / f"{cid}.{uuid.uuid4().hex[:8]}"
            began = time.monotonic()
            try:
                dump_s, paused_s = await self._dump_paused(cid, cdir, scratch, criu, cut_connections)
                image = self.lc.image_of(cid)
                manifest = ckpt.make_manifest(
                    container_id=cid, hostname=hostname, ip=rec.ip, env=spec["env"],
                    cpu_millicores=spec["cpu_millicores"], memory_mib=spec["memory_mib"],
                    command=spec["command"], port=spec["port"],
                    base=image.image_id if image else await self._base_identity(),
                    image_id=image.image_id if image else "", criu_version=criu.version, created_at=time.time())
                manifest["hardening"] = spec.get("hardening", 0)  # what the dumped processes ran under
                size, sha = await asyncio.to_thread(ckpt.write_tar, Path(out_tar), manifest,
                                                    scratch / ckpt.IMAGES, scratch / ckpt.UPPER)
            finally:
                await remove_tree(scratch)
            return ckpt.CheckpointArtifact(size_bytes=size, sha256=sha, seconds=time.monotonic() - began,
                                           dump_seconds=dump_s, paused_seconds=paused_s, manifest=manifest)

    async def _dump_paused(self, cid: str, cdir: Path, scratch: Path,
                           criu: CriuInfo, cut_connections: bool = False) -> tuple[float, float]:
        """Pause, dump leave-running into `scratch/images`, copy the upper layer into
        `scratch/upper`, thaw; (seconds of the dump, seconds paused)."""
        images, work = scratch / ckpt.IMAGES, scratch / "work"
        work.mkdir(parents=True)
        rc, _, err = await self.lc.cli.cmd("pause", cid)
        if rc != 0:
            raise ckpt.CheckpointError(f"runc pause {cid}: {err.strip()}")
        paused = time.monotonic()
        try:
            if cut_connections:
                await cut_outside_connections(network.netns_path(self.lc.names(cid)))
            runc_log = scratch / "runc.log"
            failed = await self.lc.cli.watched(
                ["--log", str(runc_log), "--log-format", "json", "--criu", str(criu.binary),
                 "checkpoint", "--leave-running", "--image-path", str(images), "--work-path", str(work), cid],
                work / "dump.log", self.dump_timeout, self.criu_log_limit, nothing)
            dumped = time.monotonic()
            if failed is not None:
                raise ckpt.CheckpointError(
                    f"CRIU could not dump {cid}: {failed or criu_reason(work / 'dump.log', runc_log)}")
            await _copy_tree(cdir / "upper", scratch / ckpt.UPPER)
        finally:
            rc, _, err = await self.lc.cli.cmd("resume", cid)
            thawed = time.monotonic()
            if rc != 0:
                raise ckpt.CheckpointError(f"runc resume {cid} after the dump: {err.strip()}")
        return dumped - paused, thawed - paused

    def remove_unfinished_dumps(self) -> None:
        """Dumps a dead worker did not finish."""
        scratch = self.state_dir / "checkpoints"
        if scratch.is_dir():
            for left in scratch.iterdir():
                if left.name.split(".", 1)[0] not in self.lc._live:
                    shutil.rmtree(left, ignore_errors=True)

    # -- restore --

    async def restore(self, spec: ContainerSpec, tar: Path) -> Started:
        """Restore the checkpoint `tar` as the new container `spec.container_id`: its own network
        namespace and address, a fresh overlay whose upper layer comes from the tar; code and SDK
        from `spec` (host paths), limits from `spec`; env, command and port are the dumped ones
        (they live in the restored memory). On failure nothing of it is left (RestoreError)."""
        criu = self._criu
        if criu is None:
            raise ckpt.RestoreError("checkpoints are off here: no working CRIU (use_criu was not called)")
        cid = spec.container_id
        cdir = await self.lc._new_container_dir(cid, ckpt.RestoreError)
        rec = Record(cid, ip="", port=spec.port, memory_mib=spec.memory_mib)
        try:
            await self._restore_into(rec, cdir, spec, Path(tar), criu)
        except BaseException as exc:
            try:
                await self._undo_restore(cid)
            except Exception as undo:  # noqa: BLE001 - both go into the one error
                raise ckpt.RestoreError(f"restoring {cid} failed ({exc}), and removing what it "
                                        f"made failed too: {undo}") from exc
            if isinstance(exc, (ckpt.RestoreError, asyncio.CancelledError, KeyboardInterrupt)):
                raise
            raise ckpt.RestoreError(f"restoring {cid}: {exc}") from exc
        self.lc._live[cid] = rec
        return Started(address=self.lc.address_of(rec), pid=rec.pid, log_path=self.lc.log_path(cid),
                       root_mounted_at=rec.root_mounted_at)

    async def _restore_into(self, rec: Record, cdir: Path, spec: ContainerSpec, tar: Path,
                            criu: CriuInfo) -> None:
        name = unpacked_name(tar)
        self._reading[name] += 1  # its upper layer is copied and CRIU reads its images in place
        try:
            await self._restore_from(rec, cdir, spec, await self._unpacked(tar), criu)
        finally:
            self._reading -= Counter({name: 1})

    async def _restore_from(self, rec: Record, cdir: Path, spec: ContainerSpec, unpacked: tuple[Path, dict],
                            criu: CriuInfo) -> None:
        cid = rec.container_id
        template, manifest = unpacked
        await self._check_root(manifest, spec)
        if manifest.get("hardening", 0) < HARDENING:  # its processes would come back without seccomp
            raise ckpt.RestoreError("the checkpoint was dumped from a container without this worker's seccomp "
                                    "filter (an older levers9); it is not restored (start cold, dump again)")
        generation = manifest.get("executor_generation", 0)
        if generation and generation not in wire.SUPPORTED_GENERATIONS:
            raise RuntimeError(f"the checkpoint's executor speaks protocol generation {generation}; this worker "
                               f"implements {sorted(wire.SUPPORTED_GENERATIONS)}")
        rec.port = manifest["port"]
        names = self.lc.names(cid)
        rec.ip = self.lc.ipam.claim(cid, self.state_dir, names.netns, group=self.lc.peer_group(spec), port=rec.port)
        self.lc._save(rec)
        # the writable layer is this container's own copy; the images are read in place
        await _run_checked(["cp", "-a", str(template / ckpt.UPPER), str(cdir / "upper")])
        # /etc/hosts names the new address; the host name stays (the UTS namespace is restored)
        write_upper(cdir / "upper", {"/etc/hosts": hosts_file(rec.ip, manifest["hostname"])})
        await self.lc._overlay_and_network(rec, cdir, spec.image)
        restored = ContainerSpec(container_id=cid, code_dir=spec.code_dir, sdk_dir=spec.sdk_dir,
                                 env=manifest["env"], cpu_millicores=spec.cpu_millicores,
                                 memory_mib=spec.memory_mib, command=tuple(manifest["command"]),
                                 port=manifest["port"], image=spec.image, executor_dir=spec.executor_dir,
                                 vendor_dir=spec.vendor_dir, packages_dir=spec.packages_dir)
        (cdir / SPEC_FILE).write_text(json.dumps(spec_record(restored)))
        # mntns-compat-mode for this restore only: CRIU refuses it on a later dump of this one
        (cdir / CRIU_CONF).write_text(ckpt.restore_config())
        config = restore_bundle(restored, cdir, network.netns_path(names), manifest)
        (cdir / "config.json").write_text(json.dumps(config, indent=1))
        await self._runc_restore(cid, cdir, template / ckpt.IMAGES, criu)
        (cdir / CRIU_CONF).write_text(ckpt.dump_config())
        rec.pid = int((cdir / "init.pid").read_text())
        rec.started = start_time(rec.pid)
        self.lc._save(rec)

    async def _check_root(self, manifest: dict, spec: ContainerSpec) -> None:
        """The dumped memory maps the files of the root it ran on: a restore needs that very root
        (the same image, or the same platform base)."""
        dumped_on = manifest.get("image_id") or ""
        runs_on = spec.image.image_id if spec.image else ""
        if dumped_on != runs_on:
            raise ckpt.RestoreError(
                f"the checkpoint was made on {_root_words(dumped_on)}; this container runs {_root_words(runs_on)} "
                "(its python and libraries would not match the dumped memory)")
        if manifest["base"] != (runs_on or await self._base_identity()):
            raise ckpt.RestoreError(
                "the checkpoint was made on a different base root file system (its python and "
                "libraries would not match the dumped memory)")

    async def warm(self, tar: Path) -> None:
        """Unpack a checkpoint ahead of its first restore (a shared one this worker announced)."""
        await self._unpacked(tar)

    async def _unpacked(self, tar: Path) -> tuple[Path, dict]:
        """The checkpoint unpacked once per worker and kept (`<state>/unpacked/<tar name>`): the
        images are read in place by every restore of it, so a restore no longer unpacks hundreds of
        MB first. The newest KEEP_UNPACKED stay; a half-unpacked one is never used (rename)."""
        root = self.state_dir / "unpacked"
        final = root / unpacked_name(tar)
        if not (final / "manifest.json").exists():
            root.mkdir(parents=True, exist_ok=True)
            staging = root / f".{final.name}.{uuid.uuid4().hex[:8]}"
            try:
                manifest = await asyncio.to_thread(ckpt.unpack, tar, staging)
                ckpt.make_traversable(staging / ckpt.IMAGES)
                (staging / "manifest.json").write_text(json.dumps(manifest))
                try:
                    os.rename(staging, final)
                except OSError:  # unpacked meanwhile by a concurrent restore of the same tar
                    pass
            finally:
                await remove_tree(staging)
        os.utime(final)
        manifest = json.loads((final / "manifest.json").read_text())
        for old in evictable(_ages(root), KEEP_UNPACKED, {final.name, *self._reading}):
            await remove_tree(root / old)  # on a thread: another restore may list the folder meanwhile
        return final, manifest

    async def _runc_restore(self, cid: str, cdir: Path, images: Path, criu: CriuInfo) -> None:
        work = cdir / "restore-work"
        work.mkdir()
        log = cdir / "runc.log"

        async def kill_tasks() -> None:  # the half-restored tasks in the container's cgroup
            await cgroups.kill_cgroup(cgroups_path(cid))

        # runc joins the netns named in config.json and hands it to CRIU (--inherit-fd
        # fd[N]:extRootNetNS), matching the `net[inode]:extRootNetNS` external of the dump
        failed = await self.lc.cli.watched(
            ["--log", str(log), "--log-format", "json", "--criu", str(criu.binary), "restore",
             "--detach", "--image-path", str(images), "--work-path", str(work), "--bundle", str(cdir),
             "--pid-file", str(cdir / "init.pid"), cid],
            work / "restore.log", self.restore_timeout, self.criu_log_limit, kill_tasks)
        if failed is not None:
            raise ckpt.RestoreError(
                f"CRIU could not restore {cid}: {failed or criu_reason(work / 'restore.log', log)}")

    async def _undo_restore(self, cid: str) -> None:
        """Remove every trace of a failed restore: processes, mounts runc and CRIU left (runc's
        criu-root bind mount, CRIU's cgroup yard in its work dir: both stay when CRIU is killed),
        runc state, network, address, files, cgroups."""
        await cgroups.kill_cgroup(cgroups_path(cid))
        await self.lc.cli.cmd("delete", "-f", cid)
        self.lc._unmount_leftovers(cid)
        await remove_tree(self.lc.runc_root / cid)
        await self.lc._teardown(cid, keep_log=False)
        cgroups.remove_cgroups(cgroups_path(cid))

    async def _base_identity(self) -> str:
        """What tells base root file systems apart: the sha256 of their package list."""
        if self._base_id is None:
            await self.lc.prepare()
            assert self.lc._base is not None
            self._base_id = await asyncio.to_thread(ckpt.file_sha256, self.lc._base / "var/lib/dpkg/status")
        return self._base_id


def _root_words(image_id: str) -> str:
    return f"image {image_id}" if image_id else "the platform base"


def restore_bundle(restored: ContainerSpec, cdir: Path, netns: Path, manifest: dict) -> dict[str, Any]:
    """The config.json of a restored container: its own rootfs and netns, the dumped host name."""
    config = bundle_spec(restored, cdir / "rootfs", netns, criu_config=cdir / CRIU_CONF)
    config["hostname"] = manifest["hostname"]
    return config


def evictable(ages: dict[str, float], keep: int, busy: set[str]) -> list[str]:
    """The unpacked checkpoints to remove: all but the `keep` newest (by mtime), never a busy one (a
    restore reads it now, or it is the one just asked for)."""
    newest_first = sorted(ages, key=lambda name: ages[name], reverse=True)
    return [name for name in newest_first[keep:] if name not in busy]


def _ages(root: Path) -> dict[str, float]:
    """mtime of each unpacked checkpoint in `root` (a half-made one, dot-named, is not one; one that
    another eviction removes while this reads is left out)."""
    ages: dict[str, float] = {}
    for entry in os.scandir(root):
        if not entry.name.startswith("."):
            try:
                ages[entry.name] = entry.stat().st_mtime
            except FileNotFoundError:
                pass
    return ages


def unpacked_name(tar: Path) -> str:
    """A node-cache blob is named by its sha256 (its mtime moves on use); any other tar by its
    name, size and mtime (tells versions apart)."""
    if len(tar.name) == 64 and all(ch in "0123456789abcdef" for ch in tar.name):
        return tar.name
    st = tar.stat()
    return f"{tar.name}-{st.st_size}-{st.st_mtime_ns}"


async def _copy_tree(src: Path, dst: Path) -> None:
    """A copy keeping owners, modes, times, xattrs (overlay opaque dirs), hard links and
    whiteouts (char devices 0:0): `cp -a`, which Python's copytree is not."""
    proc = await asyncio.create_subprocess_exec(
        "cp", "-a", "--reflink=auto", str(src), str(dst), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise ckpt.CheckpointError(f"copying the writable layer {src}: {err.decode().strip()}")


async def _run_checked(cmd: list[str]) -> None:
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise ckpt.RestoreError(f"{' '.join(cmd[:2])} failed: {err.decode(errors='replace').strip()}")


# TCP connections whose peer is not the container itself: loopback ones (a notebook's server and its
# kernels) are dumped and restored with it
OUTSIDE = ["state", "connected", "!", "(", "dst", "127.0.0.0/8", "or", "dst", "[::1]", ")"]


async def cut_outside_connections(netns: Path) -> None:
    """End (SOCK_DESTROY, `ss -K`) the TCP connections of a frozen container to anything outside it:
    CRIU refuses to dump an established connection (runc checkpoint has no --tcp-established here),
    and none could survive a restore at a new address anyway. What is left are a caller's idle
    keep-alives; the caller sees them reset, as after any stop."""
    proc = await asyncio.create_subprocess_exec("nsenter", f"--net={netns}", "ss", "-K", "-tn", *OUTSIDE,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise ckpt.CheckpointError(f"could not end the container's outside connections before its dump: "
                                   f"{err.decode(errors='replace').strip()[:300]}")
