"""The lifecycle of runc containers: prepare, start, poll, stop, cleanup. One of the two parts
RuncRuntime (levers9.worker.runtime.runc.runc_runtime) is composed of; the other, checkpoint and
restore with CRIU (levers9.worker.runtime.runc.dump_restore), works over this one's containers.

Out of memory: the cgroup v1 memory controller's `oom_kill` counter (or v2 `memory.events`) is read
before the cgroup is deleted; memory+swap are limited alike so the limit is real.

The overlay's lower layer is the platform base, or the container's image (levers9.worker.images.layers: a
lazy FUSE mount or an unpacked copy, held while the container lives). An image whose FUSE server
died ends its containers: poll() kills them and says so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import BinaryIO

import msgspec

from levers9.contracts.spec import ImageRef
from levers9.runtime.config import Settings
from levers9.runtime.off_loop import remove_tree
from levers9.worker.checkpoints import archive as ckpt
from levers9.worker.images.layers import ImageMounts
from levers9.worker.mounts.syscalls import detach, mount_overlay, mount_points, mounts_under, unmount
from levers9.worker.network import bridge as network
from levers9.worker.network import firewall, hosts
from levers9.worker.runtime.interface import (
    ContainerError,
    ContainerSpec,
    Exit,
    Progress,
    Started,
    exit_of,
    proc_state,
    start_time,
)

from . import cgroups, rootfs
from .bundle import (
    EXIT_FILE,
    LOG_FILE,
    bundle_spec,
    cgroups_path,
    egress_proxy_of,
    open_plain,
    plain_file,
    spec_record,
    upper_files,
    write_upper,
)
from .cli import Record, RuncCli

log = logging.getLogger("levers9.worker.runtime.runc.lifecycle")
CRIU_CONF = "criu.conf"  # in the container dir: CRIU's options for this container (runc reads it)
SPEC_FILE = "spec.json"  # in the container dir: the spec fields a checkpoint's manifest keeps
IMAGE_FILE = "image.json"  # in the container dir: the ImageRef of its root (absent: the platform base)
# where bundle_spec binds the app, the SDK and the log: an image from another base may lack them
MOUNT_POINTS = ("app", "opt/levers9", "var/log/levers9")


class RuncLifecycle:
    """The containers of one worker (one state dir): their bundles, overlays, network, cgroups."""

    def __init__(self, state_dir: Path, settings: Settings, runc: str | None = None):
        self.state_dir = Path(state_dir).resolve()
        self.settings = settings
        self.runc = runc or shutil.which("runc", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") \
            or "runc"
        self.runc_root = self.state_dir / "runc"
        self.cli = RuncCli(self.runc, self.runc_root)
        self.ipam = network.Ipam(settings.network.bridge_name, settings.network.bridge_subnet)
        self._base: Path | None = None
        self._bridge_ready = False
        self._live: dict[str, Record] = {}
        self._ended: dict[str, Exit] = {}  # stopped (torn down)
        self._exited: dict[str, Exit] = {}  # seen ended by poll(), not stopped yet
        self._locks: dict[str, asyncio.Lock] = {}
        self.images = ImageMounts(settings, Path(settings.images.cache_dir or Path(settings.images.image_cache) / "blobs"),
                                  f"http://{settings.process.http_host}:{settings.images.cache_port}")

    @property
    def containers_dir(self) -> Path:
        return self.state_dir / "containers"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    # -- setup --

    async def prepare(self, progress: Progress = lambda s: None) -> None:
        """The base root (built once per machine, minutes) and the bridge."""
        for d in (self.containers_dir, self.logs_dir, self.runc_root):
            d.mkdir(parents=True, exist_ok=True)
        if self._base is None:
            loop = asyncio.get_running_loop()

            def threadsafe(line: str) -> None:
                loop.call_soon_threadsafe(progress, line)

            self._base = await asyncio.to_thread(rootfs.ensure_base_rootfs,
                                                 Path(self.settings.images.image_cache), threadsafe)
        if not self._bridge_ready:
            addr = await network.ensure_bridge(self.settings.network.bridge_name, self.settings.network.bridge_subnet)
            await self.guard()
            progress(f"bridge {self.settings.network.bridge_name} up at {addr}, containers firewalled")
            self._bridge_ready = True

    async def guard(self) -> None:
        """The bridge's firewall rules for the containers claimed on it now (levers9.worker.network.firewall)."""
        # a host (levers9.worker.network.hosts): its containers are published on its address, and its whole
        # underlay (the machine, the other hosts) is never their egress
        await firewall.guard(self.settings, self.ipam.members,
                             lambda: self.ipam.forwards(self.settings.network.publish_port_base))

    def address_of(self, rec: Record) -> str:
        """Where the gateway reaches the container: its bridge address, or its host's published port."""
        s = self.settings
        return hosts.container_address(s.network.host_address, s.network.bridge_subnet, rec.ip, rec.port, s.network.publish_port_base)

    def peer_group(self, spec: ContainerSpec) -> str:
        return firewall.peer_group(self.settings.network.container_peers, spec.workspace, spec.deployment_id)

    def container_dir(self, container_id: str) -> Path:
        return self.containers_dir / container_id

    def names(self, container_id: str) -> network.Names:
        return network.Names.of(self.state_dir, container_id)

    def log_path(self, container_id: str) -> Path:
        live = self.container_dir(container_id) / "upper" / LOG_FILE.lstrip("/")
        # a log the container made a symlink (to a host file) is never read (open_log reads it)
        return live if plain_file(self.container_dir(container_id) / "upper", LOG_FILE) \
            else self.logs_dir / f"{container_id}.log"

    def open_log(self, container_id: str) -> BinaryIO:
        """The live log through the container's own directories, never a link it planted (OSError:
        ELOOP, ENOTDIR), else the one kept after it stopped."""
        try:
            return open_plain(self.container_dir(container_id) / "upper", LOG_FILE)
        except FileNotFoundError:
            return open(self.logs_dir / f"{container_id}.log", "rb")

    # -- start --

    async def _new_container_dir(self, cid: str, error: type[Exception]) -> Path:
        """The directory of a new container (start or restore); `error` if the id is taken."""
        await self.prepare()
        assert self._base is not None
        cdir = self.container_dir(cid)
        try:
            cdir.mkdir()
        except FileExistsError:
            raise error(f"container {cid} exists already (stop it first)") from None
        self._ended.pop(cid, None)
        self._exited.pop(cid, None)
        return cdir

    async def _lower(self, cid: str, cdir: Path, image: ImageRef | None) -> Path:
        """The overlay's read-only layer: the container's image (held until its teardown), or the base."""
        assert self._base is not None
        if image is None:
            return self._base
        (cdir / IMAGE_FILE).write_bytes(msgspec.json.encode(image))
        lower = await self.images.acquire(image, cid)
        for sub in MOUNT_POINTS:
            (cdir / "upper" / sub).mkdir(parents=True, exist_ok=True)
        return lower

    def image_of(self, cid: str) -> ImageRef | None:
        """The image a container's root is (None: the platform base)."""
        try:
            return msgspec.json.decode((self.container_dir(cid) / IMAGE_FILE).read_bytes(), type=ImageRef)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            return None

    async def _overlay_and_network(self, rec: Record, cdir: Path, image: ImageRef | None = None) -> None:
        """The overlay root over the base or the image (its upper layer written already) and the
        container's network namespace on the bridge at `rec.ip`."""
        for sub in ("work", "rootfs"):
            (cdir / sub).mkdir()
        lower = await self._lower(rec.container_id, cdir, image)
        mount_overlay(lower, cdir / "upper", cdir / "work", cdir / "rootfs")
        rec.root_mounted_at = time.time()  # a phase of the cold-start waterfall (ContainerStarted says it)
        await network.attach(self.names(rec.container_id), self.settings.network.bridge_name,
                             self.settings.network.bridge_subnet, rec.ip)
        await self.guard()  # before its process runs: its port joins the rules
        await self._forget_neighbor(rec.ip)

    async def start(self, spec: ContainerSpec) -> Started:
        cid = spec.container_id
        cdir = await self._new_container_dir(cid, ContainerError)
        rec = Record(cid, ip="", port=spec.port, memory_mib=spec.memory_mib)
        try:
            names = self.names(cid)
            rec.ip = self.ipam.claim(cid, self.state_dir, names.netns, group=self.peer_group(spec), port=spec.port,
                                     proxy=egress_proxy_of(spec))  # a package install's only way out
            self._save(rec)
            write_upper(cdir / "upper", upper_files(spec, rec.ip))
            await self._overlay_and_network(rec, cdir, spec.image)
            # CRIU's options for a later dump of this container (not the machine-wide runc.conf),
            # and what a checkpoint's manifest needs of the spec
            (cdir / CRIU_CONF).write_text(ckpt.dump_config())
            (cdir / SPEC_FILE).write_text(json.dumps(spec_record(spec)))
            config = bundle_spec(spec, cdir / "rootfs", network.netns_path(names),
                                 criu_config=cdir / CRIU_CONF)
            (cdir / "config.json").write_text(json.dumps(config, indent=1))
            await self.cli.run_detached(cid, cdir)
            rec.pid = int((cdir / "init.pid").read_text())
            rec.started = start_time(rec.pid)
            self._save(rec)
        except BaseException:
            await self._teardown(cid, keep_log=True)
            raise
        self._live[cid] = rec
        return Started(address=self.address_of(rec), pid=rec.pid, log_path=self.log_path(cid),
                       root_mounted_at=rec.root_mounted_at)

    # -- state --

    async def poll(self, container_id: str) -> Exit | None:
        if container_id in self._ended:
            return self._ended[container_id]
        rec = self._record(container_id)
        if rec is None:
            raise KeyError(container_id)
        if container_id in self._exited:  # ended, not stopped yet: no more runc calls
            return self._exited[container_id]
        lost = self.images.lost(container_id)
        if lost is not None:  # its root is gone: whatever it does now fails; end it, say why
            await self.cli.cmd("kill", "--all", container_id, "KILL")
            self._exited[container_id] = Exit(None, lost)
            return self._exited[container_id]
        if await self._is_running(rec):
            return None
        self._exited[container_id] = self._exit(rec)
        return self._exited[container_id]

    async def _is_running(self, rec: Record) -> bool:
        # fast path: the init process is alive and no zombie (no exec of runc)
        if rec.pid and rec.started is not None and start_time(rec.pid) == rec.started \
                and proc_state(rec.pid) not in ("Z", "X", None):
            return True
        state = await self.cli.state(rec.container_id)
        return state is not None and state.get("status") in ("running", "created", "paused")

    def _exit(self, rec: Record) -> Exit:
        """What ended the container; read before its cgroup is deleted."""
        status_file = self.container_dir(rec.container_id) / "upper" / EXIT_FILE.lstrip("/")
        try:
            code: int | None = int(status_file.read_text().strip())
        except (OSError, ValueError):
            code = None
        oom = cgroups.oom_kills(cgroups.memory_cgroup_dir(cgroups_path(rec.container_id))) > 0
        return exit_of(code, oom=oom, memory_mib=rec.memory_mib, stop_requested=rec.stop_requested)

    def running(self) -> list[str]:
        return [cid for cid in self._live if cid not in self._ended]

    # -- stop --

    async def stop(self, container_id: str, timeout: float = 10) -> Exit:
        lock = self._locks.setdefault(container_id, asyncio.Lock())
        async with lock:
            if container_id in self._ended and container_id not in self._live:
                return self._ended[container_id]
            rec = self._record(container_id)
            if rec is None:
                await self._teardown(container_id)  # a half-made one, if anything
                return Exit(None, "stopped")
            ended = await self._stop_process(rec, timeout)
            await self._teardown(container_id)
            self._live.pop(container_id, None)
            self._exited.pop(container_id, None)
            self._ended[container_id] = ended
            return ended

    async def _stop_process(self, rec: Record, timeout: float) -> Exit:
        if await self._is_running(rec):
            rec.stop_requested = True
            await self.cli.cmd("kill", rec.container_id, "TERM")
            if not await self._wait_stopped(rec, timeout):
                await self.cli.cmd("kill", "--all", rec.container_id, "KILL")
                await self._wait_stopped(rec, 5)
        return self._exit(rec)

    async def _wait_stopped(self, rec: Record, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if not await self._is_running(rec):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)

    async def _teardown(self, cid: str, keep_log: bool = True) -> None:
        """Remove everything of a container but its log; every step tolerates a missing piece."""
        cdir = self.container_dir(cid)
        rc, _, err = await self.cli.cmd("delete", "-f", cid)
        if rc != 0 and "does not exist" not in err and "not exist" not in err:
            raise ContainerError(f"runc delete {cid}: {err.strip()}")
        unmount(cdir / "rootfs")
        await self.images.release(cid)
        await network.detach(self.names(cid))
        if self.ipam.release_owned(cid, self.state_dir):
            await self.guard()
        if keep_log:
            live_log = cdir / "upper" / LOG_FILE.lstrip("/")
            if plain_file(cdir / "upper", LOG_FILE):  # never a link the container planted
                self.logs_dir.mkdir(parents=True, exist_ok=True)
                os.replace(live_log, self.logs_dir / f"{cid}.log")
        if cdir.exists():
            if any(m == str(cdir) or m.startswith(f"{cdir}/") for m in mount_points()):
                raise ContainerError(f"{cdir} still has mounts; not removing it")
            await remove_tree(cdir)

    async def cleanup_all(self) -> list[str]:
        found: set[str] = set()
        if self.containers_dir.is_dir():
            found |= {d.name for d in self.containers_dir.iterdir() if d.is_dir()}
        rc, out, _ = await self.cli.cmd("list", "--format", "json")
        if rc == 0 and out.strip() not in ("", "null"):
            found |= {c["id"] for c in json.loads(out)}
        # address claims of this state dir whose container dir is gone (a crash mid-teardown)
        found |= {c.container_id for c in self.ipam.claims() if c.state_dir == str(self.state_dir)}
        found -= set(self._live)
        for cid in sorted(found):
            await self._remove_leftover(cid)
        unmounted = await self.images.sweep()
        if unmounted:
            log.info("unmounted images nobody holds: %s", unmounted)
        return sorted(found)

    async def _remove_leftover(self, cid: str) -> None:
        """Everything of a container a dead run of this worker left, whatever state it died in."""
        cgroup = cgroups_path(cid)
        cgroups.thaw(cgroup)  # a worker that died mid-checkpoint left it paused
        await cgroups.kill_cgroup(cgroup)  # ... or mid-restore: CRIU and its tasks
        self._unmount_leftovers(cid)
        await self._teardown(cid)
        if not (self.runc_root / cid / "state.json").exists():  # runc's half-made restore
            await remove_tree(self.runc_root / cid)
        cgroups.remove_cgroups(cgroup)
        self._ended.pop(cid, None)

    def _unmount_leftovers(self, cid: str) -> None:
        """Mounts a killed runc/CRIU leaves: runc's `<runc root>/<id>/criu-root` bind of the root,
        CRIU's cgroup yard `.criu.cgyard.*` in its work dir (deepest first)."""
        for top in (self.container_dir(cid) / "restore-work", self.runc_root / cid):
            for mount_point in sorted(mounts_under(top), key=len, reverse=True):
                detach(mount_point)

    # -- helpers --

    async def _forget_neighbor(self, ip: str) -> None:
        """Drop the host's ARP entry of a reused address: it may still hold the MAC of the
        previous container's veth as REACHABLE (up to ~45 s), and every packet would go to that
        dead MAC until it expires (seen: ~10 s before a new container answered)."""
        await network.ip("neigh", "flush", "to", ip, "dev", self.settings.network.bridge_name, check=False)

    def _save(self, rec: Record) -> None:
        path = self.container_dir(rec.container_id) / "state.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(rec)))
        tmp.replace(path)

    def _record(self, cid: str) -> Record | None:
        """The live record, or the one saved by an earlier run of this worker."""
        if cid in self._live:
            return self._live[cid]
        try:
            return Record(**json.loads((self.container_dir(cid) / "state.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None
