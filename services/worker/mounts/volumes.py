"""A worker's volumes and cloud buckets: what a container's `volumes` and `buckets` become on the host.

Volumes: the platform's JuiceFS file system is mounted once per worker (on the first container that
asks for a volume, so workers that never see one pay nothing) at <data root>/<worker id>; a volume is
the bind of <mount>/<workspace>/<name> (levers9.contracts.volumes.volume_binds). The gateway creates
that directory with `levers9 volumes create`; a container whose volume is missing fails and says so.

Buckets: each one is mounted by s3fs-fuse on the host, per container, before the container starts,
with the credentials of a workspace secret ("ACCESS_KEY:SECRET_KEY") handed over in a passwd file
(0600, in the worker's private directory) that is removed once s3fs has read it. They are unmounted
when the container ends, and any left by a crashed worker at its next start.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import shutil
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

from levers9.contracts.spec import DeploymentSpec
from levers9.contracts.volumes import Bind, BucketMount, bucket_binds, passwd_line, s3fs_args, volume_binds
from levers9.runtime import juicefs
from levers9.runtime.config import Settings
from levers9.runtime.off_loop import remove_tree
from levers9.worker.network.egress import address_refusal, denied_networks, host_addresses
from levers9.worker.runtime.interface import Runtime

from .syscalls import mounts_under, unmount

log = logging.getLogger("levers9.worker.mounts.volumes")

SecretsOf = Callable[[str, list[str]], Awaitable[dict[str, str]]]  # (container id, names) -> values
S3FS_READY_S = 20.0


class VolumeError(RuntimeError):
    """A volume or bucket could not be given to a container; the message says what to do."""


class WorkerVolumes:
    def __init__(self, settings: Settings, worker_id: str, state_dir: Path, secrets: SecretsOf) -> None:
        self.settings, self.state_dir, self.secrets = settings, state_dir, secrets
        self.juicefs = juicefs.Mount(settings, worker_id)
        self.users: set[str] = set()  # containers given a volume
        self.stopping = False

    async def binds(self, workspace: str, container_id: str, spec: DeploymentSpec,
                    runtime: Runtime) -> tuple[Bind, ...]:
        """The binds of a container's volumes and buckets (buckets mounted now); () when it has none."""
        if not spec.volumes and not spec.buckets:
            return ()
        if runtime.name != "runc":
            raise VolumeError(f"volumes and cloud buckets need the runc runtime; this worker runs {runtime.name!r}")
        binds: list[Bind] = []
        if spec.volumes:
            self.users.add(container_id)
            data = await self.juicefs.get()
            binds += volume_binds(str(data), workspace, spec.volumes)
            missing = [v.name for v, b in zip(spec.volumes, binds, strict=True) if not os.path.isdir(b.source)]
            if missing:
                raise VolumeError(f"volume(s) {', '.join(missing)} do not exist in workspace {workspace!r}: "
                                  f"create with `levers9 volumes create NAME`")
        if spec.buckets:
            binds += await self._mount_buckets(workspace, container_id, spec.buckets)
        return tuple(binds)

    async def _mount_buckets(self, workspace: str, container_id: str, buckets: list[BucketMount]) -> list[Bind]:
        values = await self.secrets(container_id, sorted({b.secret for b in buckets}))
        binds = bucket_binds(str(self.state_dir), container_id, buckets)
        try:
            for bucket, bind in zip(buckets, binds, strict=True):
                await self._mount_bucket(bucket, Path(bind.source), values[bucket.secret], container_id)
        except BaseException:
            await self.release(container_id)
            raise
        return binds

    async def _mount_bucket(self, bucket: BucketMount, target: Path, secret: str, container_id: str) -> None:
        if not shutil.which("s3fs"):
            raise VolumeError("cloud buckets need s3fs-fuse on the worker (`apt-get install s3fs`; scripts/setup.sh does)")
        try:
            line = passwd_line(secret)
        except ValueError as exc:
            raise VolumeError(f"secret {bucket.secret!r}: {exc}") from None
        refusal = await endpoint_refusal(bucket.endpoint_url, self.settings)
        if refusal:
            raise VolumeError(f"bucket {bucket.bucket!r}: {refusal}")
        target.mkdir(parents=True, exist_ok=True)
        private = self.state_dir / "private"
        private.mkdir(mode=0o700, exist_ok=True)
        passwd = private / f"s3fs-{container_id}-{target.name}"
        fd = os.open(passwd, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, line.encode())
            os.close(fd)
            await self._run_s3fs(s3fs_args(bucket, str(target), str(passwd), self.settings.storage.s3_endpoint), target)
        finally:
            passwd.unlink(missing_ok=True)  # s3fs read it before it mounted

    async def _run_s3fs(self, args: list[str], target: Path) -> None:
        proc = await asyncio.create_subprocess_exec(*args, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), S3FS_READY_S)
        deadline = asyncio.get_running_loop().time() + S3FS_READY_S
        while proc.returncode == 0 and str(target) not in mounts_under(target):
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.05)
        if str(target) not in mounts_under(target):
            raise VolumeError(f"s3fs could not mount bucket {args[1]!r} ({proc.returncode}): "
                              f"{out.decode(errors='replace').strip()[-500:] or 'no output'}")

    async def release(self, container_id: str) -> None:
        """Unmount a container's buckets (after the container stopped) and remove their directories;
        when the worker stops, the last container to go unmounts JuiceFS."""
        self.users.discard(container_id)
        if self.stopping and not self.users:
            await self.juicefs.close()
        top = self.state_dir / "buckets" / container_id
        for point in sorted(mounts_under(top), reverse=True):
            try:
                unmount(Path(point))
            except Exception:  # noqa: BLE001 - the next start's cleanup retries
                log.warning("could not unmount %s", point, exc_info=True)
        await remove_tree(top)

    async def clean_stale(self) -> None:
        """At start: buckets and the JuiceFS mount a crashed predecessor left."""
        top = self.state_dir / "buckets"
        for container in (top.iterdir() if top.is_dir() else ()):
            await self.release(container.name)
        await remove_tree(self.state_dir / "private")
        await self.juicefs.clean_stale()

    async def serve(self, stop: asyncio.Event) -> None:
        """A background loop of the worker: clean up after a crashed predecessor at start; at stop,
        unmount JuiceFS now if no container uses it, else once the last one stopped (release)."""
        await self.clean_stale()
        await stop.wait()
        self.stopping = True
        if not self.users:
            await self.juicefs.close()


async def endpoint_refusal(url: str, settings: Settings) -> str:
    """Why s3fs (a host process) must not connect to a tenant's bucket endpoint ("" when it may): one
    that is, or resolves to, this host, loopback, link-local or the containers' networks would let a
    tenant aim the host's s3fs at the control plane. "" (the platform's own S3) is always fine."""
    if not url:
        return ""
    host = urlsplit(url).hostname or ""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return f"its endpoint host {host!r} does not resolve from the worker"
    denied = denied_networks(host_addresses(), [settings.network.bridge_subnet, settings.network.hosts_subnet])
    for info in infos:
        why = address_refusal(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]), denied)
        if why:
            return f"its endpoint {url} may not be used: {why}; name a public S3 endpoint, or none for the platform's"
    return ""
