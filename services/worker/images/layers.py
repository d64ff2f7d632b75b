"""Images on a worker's node: the read-only lower layer of every container that runs an image.

Two ways to have an image here (`LEVERS9_IMAGE_MOUNT`, default lazy):
- lazy: a FUSE mount of the archive (levers9.worker.images.lazyfs, one server process per image per node)
  at `<image_cache>/images/<id>/mnt`; only the chunks containers read are fetched, through the node
  content cache.
- unpack: the whole archive fetched as one blob through the node cache and unpacked once per node to
  `<image_cache>/images/<id>/rootfs` (renamed into place when complete), kept. Also used when this
  machine has no /dev/fuse or no pyfuse3. The benchmark's baseline.

A mount is shared by the containers of every worker of the node: each container holds it by a file
`<id>/holders/<container id>`, and the last one to leave unmounts it (after a short grace, so that a
container restarting at once finds it mounted). An flock on `<id>/lock` orders the workers of a node.

A FUSE server that dies leaves its mount dead (reads fail with ENOTCONN): `lost(container)` says so
for each container on it ("image im-x: its FUSE server exited (signal 9)"); the runtime stops those
containers and reports that reason, the worker itself goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from levers9.contracts.image_index import ImageIndex, InvalidIndex, decode_index
from levers9.contracts.spec import ImageRef
from levers9.runtime.config import Settings
from levers9.runtime.image_archive import UnsafeIndex, unpack
from levers9.worker.mounts.syscalls import detach, is_mount_point
from levers9.worker.runtime.interface import ContainerError, proc_state, start_time

log = logging.getLogger("levers9.worker.images.layers")

MODE_ENV = "LEVERS9_IMAGE_MOUNT"
MODES = ("lazy", "unpack")
READY_TIMEOUT_S = 30.0
# a node keeps an image mounted this long after its last container: the next cold start of that
# image (a scale-from-zero) then finds it mounted and its pages cached (settings.images.mount_grace_seconds,
# LEVERS9_IMAGE_MOUNT_GRACE_S: 300 s by default)
STOP_TIMEOUT_S = 5.0
FETCH_TIMEOUT_S = 600.0  # a whole archive (unpack) may be gigabytes


def fuse_missing() -> str | None:
    """Why a lazy mount cannot work on this machine, or None."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist"
    if importlib.util.find_spec("pyfuse3") is None:
        return "pyfuse3 is not installed"
    return None


def choose_mode(wanted: str, missing: str | None) -> tuple[str, str]:
    """(mode, a sentence for the log) from what was asked (`lazy`, `unpack`, "" = lazy) and what is
    missing for lazy mounts (pure)."""
    wanted = wanted or "lazy"
    if wanted not in MODES:
        raise ValueError(f"{MODE_ENV}={wanted!r}: use lazy or unpack")
    if wanted == "lazy" and missing:
        return "unpack", f"images are unpacked: no lazy mounts here ({missing})"
    return wanted, "images are mounted lazily (FUSE)" if wanted == "lazy" else "images are unpacked (asked for)"


@dataclass
class Held:
    """What a container of this process holds: its image, and the server of the mount it got."""
    image_id: str
    pid: int = 0  # 0: unpacked (nothing can die under it)
    started: int | None = None


@dataclass
class Server:
    """A lazyfs process this process started."""
    image_id: str
    proc: asyncio.subprocess.Process
    stopping: bool = False


def exit_words(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"signal {-returncode} ({signal.Signals(-returncode).name})"
        except ValueError:
            return f"signal {-returncode}"
    return f"status {returncode}"


class ImageMounts:
    def __init__(self, settings: Settings, cache_dir: Path, cache_url: str, mode: str | None = None,
                 grace_s: float | None = None) -> None:
        self.settings = settings
        if grace_s is None:
            grace_s = float(settings.images.mount_grace_seconds)
        self.root = Path(settings.images.image_cache) / "images"
        self.cache_dir = Path(cache_dir)
        self.cache_url = cache_url.rstrip("/")
        wanted = mode if mode is not None else settings.images.mount
        self.mode, self.note = choose_mode(wanted, fuse_missing())
        self.grace_s = grace_s
        self.held: dict[str, Held] = {}
        self.servers: dict[str, Server] = {}  # by image id
        self.exits: dict[int, int] = {}  # pid -> exit status of the servers this process started
        self.locks: dict[str, asyncio.Lock] = {}
        self.timers: set[asyncio.Task] = set()

    def image_dir(self, image_id: str) -> Path:
        return self.root / image_id

    # ---- acquire / release -----------------------------------------------------------------------

    async def acquire(self, ref: ImageRef, container_id: str) -> Path:
        """The image's root for `container_id` (an overlay's lower dir); ContainerError says why not."""
        if ref.archive is None:
            raise ContainerError(f"image {ref.image_id}: it has no archive in S3 (not built yet)")
        idir = self.image_dir(ref.image_id)
        (idir / "holders").mkdir(parents=True, exist_ok=True)
        async with self._locked(ref.image_id):
            holder = idir / "holders" / container_id
            holder.touch()
            try:
                if self.mode == "unpack":
                    lower = await self._unpacked(ref, idir)
                    self.held[container_id] = Held(ref.image_id)
                    return lower
                pid, started = self._server_of(idir)
                if not (pid and is_mount_point(idir / "mnt")):
                    pid, started = await self._mount(ref, idir)
                self.held[container_id] = Held(ref.image_id, pid, started)
                return idir / "mnt"
            except BaseException:
                holder.unlink(missing_ok=True)
                raise

    async def release(self, container_id: str) -> None:
        """`container_id` no longer uses its image; the last one out unmounts it (after the grace).
        Also for a container of a dead run of this worker (its holder file is removed)."""
        held = self.held.pop(container_id, None)
        ids = [held.image_id] if held else [d.name for d in self._image_dirs()
                                            if (d / "holders" / container_id).exists()]
        for image_id in ids:
            (self.image_dir(image_id) / "holders" / container_id).unlink(missing_ok=True)
            if self.mode == "lazy" and not self._holders(image_id):
                timer = asyncio.create_task(self._unmount_later(image_id), name=f"unmount {image_id}")
                self.timers.add(timer)
                timer.add_done_callback(self.timers.discard)

    def lost(self, container_id: str) -> str | None:
        """Why the image under `container_id` is gone (its FUSE server died), or None."""
        held = self.held.get(container_id)
        if held is None or not held.pid:
            return None
        server = self.servers.get(held.image_id)
        proc = server.proc if server is not None and server.proc.pid == held.pid else None
        rc = proc.returncode if proc is not None else None
        rc = self.exits.get(held.pid) if rc is None else rc
        if rc is not None:
            return f"image {held.image_id}: its FUSE server exited ({exit_words(rc)})"
        if proc is not None:  # our own child: asyncio reaps it and then sets its exit status, which says more
            return None
        if start_time(held.pid) != held.started or proc_state(held.pid) in ("Z", "X", None):
            return f"image {held.image_id}: its FUSE server (pid {held.pid}) is gone"
        return None

    async def sweep(self) -> list[str]:
        """Unmount the images of this node that nobody holds (a dead run's leftovers); their ids."""
        gone = []
        for idir in self._image_dirs():
            if (idir / "server.json").exists() or is_mount_point(idir / "mnt"):
                async with self._locked(idir.name):
                    if not self._holders(idir.name):
                        await self._unmount(idir.name)
                        gone.append(idir.name)
        return gone

    async def close(self) -> None:
        """Unmount every image this process mounted that nobody holds (no grace)."""
        for timer in list(self.timers):
            timer.cancel()
        for image_id in list(self.servers):
            async with self._locked(image_id):
                if not self._holders(image_id):
                    await self._unmount(image_id)

    # ---- lazy mounts -----------------------------------------------------------------------------

    async def _mount(self, ref: ImageRef, idir: Path) -> tuple[int, int | None]:
        """Start a lazyfs server on `idir/mnt` (a dead one's mount removed first); (pid, start time)."""
        assert ref.archive is not None
        mnt = idir / "mnt"
        if is_mount_point(mnt):  # its server died: the mount answers ENOTCONN
            detach(str(mnt))
        mnt.mkdir(exist_ok=True)
        index_path = idir / "index"
        await self._index(ref, index_path)
        began = time.monotonic()
        with open(idir / "lazyfs.log", "ab") as errors:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "levers9.worker.images.lazyfs", "--index", str(index_path), "--mount", str(mnt),
                "--cache-url", self.cache_url, "--bucket", ref.archive.bucket, "--key", ref.archive.key,
                "--blob-dir", str(self.cache_dir), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=errors, start_new_session=True)
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT_S)
        except asyncio.TimeoutError:
            line = b""
        if not line.startswith(b"mounted") or not is_mount_point(mnt):
            if proc.returncode is None:
                proc.kill()
            rc = await proc.wait()
            raise ContainerError(f"image {ref.image_id}: its FUSE server did not mount it "
                                 f"({exit_words(rc)}): {_tail(idir / 'lazyfs.log')}")
        self.servers[ref.image_id] = Server(ref.image_id, proc)
        started = start_time(proc.pid)
        (idir / "server.json").write_text(json.dumps({"pid": proc.pid, "started": started}))
        watcher = asyncio.create_task(self._watch(ref.image_id, proc), name=f"lazyfs {ref.image_id}")
        self.timers.add(watcher)
        watcher.add_done_callback(self.timers.discard)
        log.info("image %s mounted lazily at %s in %.0f ms", ref.image_id, mnt, (time.monotonic() - began) * 1000)
        return proc.pid, started

    async def _watch(self, image_id: str, proc: asyncio.subprocess.Process) -> None:
        rc = await proc.wait()
        self.exits[proc.pid] = rc
        server = self.servers.get(image_id)
        if server is not None and server.proc is proc and not server.stopping:
            holders = [cid for cid, h in self.held.items() if h.image_id == image_id and h.pid == proc.pid]
            log.error("image %s: its FUSE server exited (%s); its containers fail: %s; log: %s", image_id,
                      exit_words(rc), holders, _tail(self.image_dir(image_id) / "lazyfs.log"))

    def _server_of(self, idir: Path) -> tuple[int, int | None]:
        """The live lazyfs server of this image on this node (any worker's), or (0, None)."""
        try:
            found = json.loads((idir / "server.json").read_text())
            pid, started = int(found["pid"]), found["started"]
        except (OSError, ValueError, KeyError, TypeError):
            return 0, None
        if start_time(pid) != started or proc_state(pid) in ("Z", "X", None):
            return 0, None
        return pid, started

    async def _unmount_later(self, image_id: str) -> None:
        await asyncio.sleep(self.grace_s)
        async with self._locked(image_id):
            if not self._holders(image_id):
                await self._unmount(image_id)

    async def _unmount(self, image_id: str) -> None:
        """Stop the image's server (it unmounts on SIGTERM); a dead one's mount is detached."""
        idir = self.image_dir(image_id)
        server = self.servers.pop(image_id, None)
        pid, started = self._server_of(idir)
        if server is not None and server.proc.returncode is None:
            server.stopping = True
            server.proc.terminate()
            try:
                await asyncio.wait_for(server.proc.wait(), STOP_TIMEOUT_S)
            except asyncio.TimeoutError:
                server.proc.kill()
                await server.proc.wait()
        elif pid:  # started by another worker of this node
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while start_time(pid) == started and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        if is_mount_point(idir / "mnt"):
            detach(str(idir / "mnt"))
        (idir / "server.json").unlink(missing_ok=True)
        log.info("image %s unmounted", image_id)

    # ---- fetching through the node cache ---------------------------------------------------------

    async def _blob(self, ref: ImageRef, sha: str, key: str, what: str) -> Path:
        """A blob of the image (its index or its whole archive) through the node cache."""
        assert ref.archive is not None
        params = {"bucket": ref.archive.bucket, "key": key, "fill": "true"}
        try:
            async with httpx.AsyncClient(timeout=FETCH_TIMEOUT_S) as client:
                r = await client.get(f"{self.cache_url}/blobs/{sha}", params=params)
        except httpx.HTTPError as exc:
            raise ContainerError(f"image {ref.image_id}: fetching {what}: the node cache at {self.cache_url} "
                                 f"did not answer: {type(exc).__name__}: {exc}") from None
        if r.status_code != 200:
            raise ContainerError(f"image {ref.image_id}: fetching {what} from S3 failed: {_detail(r)}")
        return Path(r.json()["path"])

    async def _index(self, ref: ImageRef, out: Path) -> ImageIndex | None:
        """The image's index, checked against the ref, written to `out` (None: it was there, checked,
        when a mount of it before wrote it: a new mount on a warm node starts ~0.1 s sooner)."""
        assert ref.archive is not None
        if _hashes_to(out, ref.archive.index_sha256):  # checked when it was written here
            return None
        path = await self._blob(ref, ref.archive.index_sha256, ref.archive.index_key, "its index")
        data = path.read_bytes()
        try:
            index = decode_index(data)
        except InvalidIndex as exc:
            raise ContainerError(f"image {ref.image_id}: {exc}") from None
        if index.image_id != ref.image_id or index.archive_sha256 != ref.archive.sha256:
            raise ContainerError(f"image {ref.image_id}: its index is of image {index.image_id}, "
                                 f"archive {index.archive_sha256[:12]}, not archive {ref.archive.sha256[:12]}")
        tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}")
        tmp.write_bytes(data)
        tmp.replace(out)
        return index

    async def _unpacked(self, ref: ImageRef, idir: Path) -> Path:
        """The image unpacked once per node (kept); a half-unpacked one is never used."""
        assert ref.archive is not None
        rootfs = idir / "rootfs"
        if rootfs.is_dir():
            return rootfs
        began = time.monotonic()
        index = await self._index(ref, idir / "index")
        if index is None:
            index = decode_index((idir / "index").read_bytes())
        archive = await self._blob(ref, ref.archive.sha256, ref.archive.key, "its archive")
        staging = idir / f".rootfs-{uuid.uuid4().hex[:8]}"
        try:
            await asyncio.to_thread(unpack, index, archive, staging)
            os.rename(staging, rootfs)
        except (OSError, UnsafeIndex) as exc:
            raise ContainerError(f"image {ref.image_id}: unpacking it failed: {exc}") from None
        finally:
            await asyncio.to_thread(shutil.rmtree, staging, True)
        log.info("image %s unpacked (%d bytes) in %.1f s", ref.image_id, ref.archive.size_bytes,
                 time.monotonic() - began)
        return rootfs

    # ---- helpers ---------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _locked(self, image_id: str) -> AsyncIterator[None]:
        """This image's lock: within this process, then across the workers of the node (flock)."""
        idir = self.image_dir(image_id)
        idir.mkdir(parents=True, exist_ok=True)
        async with self.locks.setdefault(image_id, asyncio.Lock()):
            fd = os.open(idir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # releases the flock

    def _holders(self, image_id: str) -> list[str]:
        try:
            return os.listdir(self.image_dir(image_id) / "holders")
        except FileNotFoundError:
            return []

    def _image_dirs(self) -> list[Path]:
        try:
            return [d for d in self.root.iterdir() if d.is_dir()]
        except FileNotFoundError:
            return []


def _hashes_to(path: Path, sha256: str) -> bool:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest() == sha256
    except OSError:
        return False


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])[-1000:]
    except OSError:
        return "(no log)"


def _detail(r: httpx.Response) -> str:
    try:
        return str(r.json().get("detail", r.text))
    except ValueError:
        return r.text[:500]
