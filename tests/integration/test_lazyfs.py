"""Images on a worker: an archive uploaded to real S3, mounted lazily through FUSE with its chunks
coming through a real node cache (only those read), unpacked whole as the fallback; a killed FUSE
server and an unreachable S3 are reported with their reasons."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import signal
import stat
import time
import uuid
from pathlib import Path

import pytest
import uvicorn

from levers9.contracts.image_index import chunk_span, decode_index
from levers9.contracts.spec import ArchiveRef, ImageRef
from levers9.runtime.config import Settings
from levers9.runtime.image_archive import upload_image
from levers9.runtime.service import _Server
from levers9.stack import free_port
from levers9.worker.checkpoints.archive import RestoreError
from levers9.worker.images import lazyfs
from levers9.worker.images.layers import ImageMounts
from levers9.worker.images.node_cache import NodeCache, cache_app
from levers9.worker.mounts.syscalls import is_mount_point
from levers9.worker.runtime.choice import runc_missing
from levers9.worker.runtime.interface import ContainerError, ContainerSpec
from levers9.worker.runtime.runc import rootfs
from levers9.worker.runtime.runc.runc_runtime import RuncRuntime

pytestmark = [
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse on this machine: no FUSE mounts"),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting with allow_other and overlays needs root"),
]

CHUNK = 64 << 10
BUCKET = "images-test"


def s3_settings(servers, image_cache: Path) -> Settings:
    return Settings().with_(s3_endpoint=servers["s3_endpoint"], s3_access_key=servers["s3_access_key"],
                    s3_secret_key=servers["s3_secret_key"], image_cache=str(image_cache))


def make_tree(root: Path) -> dict[str, bytes]:
    files = {"etc/motd": b"hello from the image\n", "usr/lib/python3/mod.py": b"X = 42\n" * 100,
             "usr/lib/big.so": os.urandom(5 * CHUNK + 123),  # spans 6 chunks
             "var/unread.bin": os.urandom(128 * CHUNK), "empty": b""}  # past any readahead
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    os.chmod(root / "etc/motd", 0o640)
    os.chown(root / "etc/motd", 1234, 4321)
    os.symlink("python3/mod.py", root / "usr/lib/mod-link")
    return files


class CacheServer:
    """A node cache over HTTP in this event loop (what lazyfs and ImageMounts talk to)."""

    def __init__(self, blobs: Path, settings: Settings) -> None:
        self.cache = NodeCache(blobs, settings, max_bytes=1 << 30)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = _Server(uvicorn.Config(cache_app(self.cache), host="127.0.0.1", port=self.port,
                                             log_config=None, lifespan="off"))

    async def __aenter__(self) -> CacheServer:
        self.task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            await asyncio.sleep(0.02)
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.should_exit = True
        await self.task


async def read(path: Path, offset: int = 0, length: int = -1) -> bytes:
    """Read in a thread: the FUSE server asks the node cache, which runs in this event loop."""
    def go() -> bytes:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(length)
    return await asyncio.to_thread(go)


def blob_names(blobs: Path) -> set[str]:
    """The blobs in the node cache (not the temporary files of fills under way)."""
    return {p.name for p in blobs.iterdir() if not p.name.startswith(".")}


async def wait_for(check, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


async def uploaded(servers, tmp_path: Path, image_id: str) -> tuple[dict[str, bytes], ImageRef, Settings]:
    settings = s3_settings(servers, tmp_path / "cache")
    (tmp_path / "src").mkdir()
    files = make_tree(tmp_path / "src")
    archive = await upload_image(settings, tmp_path / "src", image_id, BUCKET, chunk_size=CHUNK)
    return files, ImageRef(image_id=image_id, archive=archive), settings


async def test_a_lazy_mount_serves_the_image_and_fetches_only_the_chunks_read(servers, tmp_path):
    image_id = "im-" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:24]
    files, ref, settings = await uploaded(servers, tmp_path, image_id)
    assert ref.archive is not None
    blobs = tmp_path / "cache" / "blobs"
    async with CacheServer(blobs, settings) as cache:
        mounts = ImageMounts(settings, blobs, cache.url, mode="lazy", grace_s=0)
        began = time.monotonic()
        lower = await mounts.acquire(ref, "c1")
        mounted_ms = (time.monotonic() - began) * 1000
        assert is_mount_point(lower) and cache.cache.stats["fills_s3"] == 1  # the index only
        index = decode_index((blobs / ref.archive.index_sha256).read_bytes())
        by_path = {f.path: f for f in index.files}

        # names, modes, owners and links come from the index: no chunk is fetched for them
        assert sorted(await asyncio.to_thread(os.listdir, lower)) == ["empty", "etc", "usr", "var"]
        st = await asyncio.to_thread(os.lstat, lower / "etc/motd")
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_size) == (0o640, 1234, 4321, 21)
        assert await asyncio.to_thread(os.readlink, lower / "usr/lib/mod-link") == "python3/mod.py"
        assert await read(lower / "empty") == b""
        assert cache.cache.stats["fills_s3"] == 1

        assert await read(lower / "etc/motd") == files["etc/motd"]
        assert await read(lower / "usr/lib/mod-link") == files["usr/lib/python3/mod.py"]
        big = files["usr/lib/big.so"]
        assert await read(lower / "usr/lib/big.so", 3 * CHUNK + 7, 1000) == big[3 * CHUNK + 7:3 * CHUNK + 1007]
        # the rest of the file comes in the background (its open and the read started it)
        entry = by_path["usr/lib/big.so"]
        big_chunks = {index.chunks[n] for n in chunk_span(entry.offset, entry.size, CHUNK)}
        await wait_for(lambda: big_chunks <= blob_names(blobs))
        assert await read(lower / "usr/lib/big.so") == big

        # fetched: the chunks read, and the few after a chunk a read waited for (readahead), no more
        read_numbers = set()
        for path in ("etc/motd", "usr/lib/python3/mod.py", "usr/lib/big.so"):
            read_numbers |= set(chunk_span(by_path[path].offset, by_path[path].size, CHUNK))
        window = set(range(max(read_numbers) + 1 + lazyfs.NEIGHBOR_BYTES // CHUNK))
        await asyncio.sleep(0.5)  # background fills settle
        fetched = blob_names(blobs) - {ref.archive.index_sha256}
        assert {index.chunks[n] for n in read_numbers} <= fetched <= {index.chunks[n] for n in window}
        unread = by_path["var/unread.bin"]
        never = {index.chunks[n] for n in chunk_span(unread.offset, unread.size, CHUNK) if n not in window}
        assert len(never) >= 16 and not fetched & never
        assert cache.cache.stats["fills_s3"] == 1 + len(fetched)
        print(f"\nlazy mount in {mounted_ms:.0f} ms; fetched {cache.cache.stats['bytes_filled']} of "
              f"{ref.archive.size_bytes} archive bytes ({len(fetched)} of {len(index.chunks)} chunks)")

        # a second container shares the mount; a killed server fails both, with the signal
        assert await mounts.acquire(ref, "c2") == lower
        server = mounts.servers[image_id].proc
        os.kill(server.pid, signal.SIGKILL)
        reason = await wait_for(lambda: mounts.lost("c1"))
        assert reason == f"image {image_id}: its FUSE server exited (signal 9 (SIGKILL))"
        assert mounts.lost("c2") == reason
        await mounts.release("c1")
        await mounts.release("c2")
        await wait_for(lambda: not is_mount_point(lower))

        # mounted again for the next container, by a new server
        assert await mounts.acquire(ref, "c3") == lower and mounts.lost("c3") is None
        assert await read(lower / "etc/motd") == files["etc/motd"]
        await mounts.release("c3")
        await wait_for(lambda: not is_mount_point(lower))
        assert not mounts.servers


async def test_unpack_mode_materialises_the_image_once(servers, tmp_path):
    image_id = "im-" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:24]
    files, ref, settings = await uploaded(servers, tmp_path, image_id)
    blobs = tmp_path / "cache" / "blobs"
    async with CacheServer(blobs, settings) as cache:
        mounts = ImageMounts(settings, blobs, cache.url, mode="unpack")
        lower = await mounts.acquire(ref, "c1")
        assert lower == tmp_path / "cache" / "images" / image_id / "rootfs"
        for rel, data in files.items():
            assert (lower / rel).read_bytes() == data
        assert os.readlink(lower / "usr/lib/mod-link") == "python3/mod.py"
        assert stat.S_IMODE((lower / "etc/motd").stat().st_mode) == 0o640
        fills = cache.cache.stats["fills_s3"]
        assert await mounts.acquire(ref, "c2") == lower and cache.cache.stats["fills_s3"] == fills
        assert mounts.lost("c1") is None


async def test_s3_out_at_acquire_fails_the_container_with_the_cause(servers, tmp_path):
    settings = s3_settings(servers, tmp_path / "cache").with_(s3_endpoint=f"http://127.0.0.1:{free_port()}")
    blobs = tmp_path / "cache" / "blobs"
    archive = ArchiveRef(bucket=BUCKET, key="images/archives/" + "a" * 64, sha256="a" * 64, size_bytes=10,
                         index_key="images/indexes/" + "b" * 64, index_sha256="b" * 64)
    ref = ImageRef(image_id="im-" + "0" * 24, archive=archive)
    async with CacheServer(blobs, settings) as cache:
        mounts = ImageMounts(settings, blobs, cache.url, mode="lazy")
        with pytest.raises(ContainerError) as err:
            await mounts.acquire(ref, "c1")
    message = str(err.value)
    assert message.startswith(f"image {ref.image_id}: fetching its index from S3 failed: ")
    assert "Could not connect" in message, message
    assert not os.listdir(tmp_path / "cache" / "images" / ref.image_id / "holders")


@pytest.fixture(scope="module")
def base() -> Path:
    """The machine's base root fs (built once per machine, as a worker would: minutes the first time)."""
    return rootfs.ensure_base_rootfs(Path(Settings().images.image_cache))


def copy_from(base: Path, rel: str, dest: Path) -> None:
    """Copy `rel` of `base` into `dest`, with every symlink on the way (resolved inside `base`)."""
    parts = rel.split("/")
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i])
        if (base / prefix).is_symlink():
            target = os.readlink(base / prefix)
            (dest / prefix).parent.mkdir(parents=True, exist_ok=True)
            if not os.path.lexists(dest / prefix):
                os.symlink(target, dest / prefix)
            inside = target.lstrip("/") if target.startswith("/") else \
                os.path.normpath(os.path.join(os.path.dirname(prefix), target))
            copy_from(base, "/".join([inside, *parts[i:]]), dest)
            return
    (dest / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(base / rel, dest / rel)


@pytest.mark.skipif(bool(runc_missing()), reason=f"real containers: {runc_missing()}")
async def test_a_runc_container_runs_on_a_lazy_image_and_fails_when_its_server_dies(servers, tmp_path, base):
    # a tiny image from another "base": a shell, cat and sleep; no /app, /opt/levers9 or /var/log
    image = tmp_path / "src"
    for rel in ("bin/sh", "bin/cat", "bin/sleep", "lib64/ld-linux-x86-64.so.2", "lib/x86_64-linux-gnu/libc.so.6"):
        copy_from(base, rel, image)
    (image / "etc").mkdir()
    (image / "etc/image-note").write_text("read through FUSE\n")
    image_id = "im-" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:24]
    settings = s3_settings(servers, tmp_path / "cache")
    ref = ImageRef(image_id=image_id, archive=await upload_image(settings, image, image_id, BUCKET, chunk_size=CHUNK))
    (tmp_path / "code").mkdir()
    (tmp_path / "sdk").mkdir()
    rt = RuncRuntime(tmp_path / "worker", Settings().with_(runtime="runc"))
    await rt.prepare()
    blobs = tmp_path / "cache" / "blobs"
    async with CacheServer(blobs, settings) as cache:
        rt.images = ImageMounts(settings, blobs, cache.url, mode="lazy", grace_s=0)
        spec = ContainerSpec(container_id=f"t-{uuid.uuid4().hex[:12]}", code_dir=tmp_path / "code",
                             sdk_dir=tmp_path / "sdk", env={}, cpu_millicores=500, memory_mib=64,
                             command=("/bin/sh", "-c", "cat /etc/image-note; exec sleep 60"), image=ref)
        started = await rt.start(spec)
        mnt = tmp_path / "cache" / "images" / image_id / "mnt"
        try:
            await wait_for(lambda: "read through FUSE" in started.log_path.read_text())
            assert is_mount_point(mnt) and await rt.poll(spec.container_id) is None
            os.kill(rt.images.servers[image_id].proc.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while (ended := await rt.poll(spec.container_id)) is None:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            assert ended.reason == f"image {image_id}: its FUSE server exited (signal 9 (SIGKILL))"
        finally:
            await rt.stop(spec.container_id, timeout=2)
        await wait_for(lambda: not is_mount_point(mnt))
        assert not rt.container_dir(spec.container_id).exists()


def asleep(init_pid: int) -> bool:
    """Whether the app (the init's child) sleeps in nanosleep, its binary paged in."""
    children = Path(f"/proc/{init_pid}/task/{init_pid}/children").read_text().split()
    return any("nanosleep" in Path(f"/proc/{c}/wchan").read_text() for c in children)


@pytest.mark.skipif(bool(runc_missing()), reason=f"real containers: {runc_missing()}")
async def test_a_checkpoint_records_its_image_and_restores_only_onto_it(servers, tmp_path, base):
    image = tmp_path / "src"
    for rel in ("bin/sh", "bin/sleep", "lib64/ld-linux-x86-64.so.2", "lib/x86_64-linux-gnu/libc.so.6"):
        copy_from(base, rel, image)
    image_id = "im-" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:24]
    settings = s3_settings(servers, tmp_path / "cache")
    ref = ImageRef(image_id=image_id, archive=await upload_image(settings, image, image_id, BUCKET, chunk_size=CHUNK))
    (tmp_path / "code").mkdir()
    (tmp_path / "sdk").mkdir()
    rt = RuncRuntime(tmp_path / "worker", Settings().with_(runtime="runc"))
    await rt.prepare()
    await rt.enable_checkpoints()

    def spec(image: ImageRef | None) -> ContainerSpec:
        return ContainerSpec(container_id=f"t-{uuid.uuid4().hex[:12]}", code_dir=tmp_path / "code",
                             sdk_dir=tmp_path / "sdk", env={}, cpu_millicores=500, memory_mib=64,
                             command=("/bin/sleep", "60"), image=image)

    blobs = tmp_path / "cache" / "blobs"
    async with CacheServer(blobs, settings) as cache:
        rt.images = ImageMounts(settings, blobs, cache.url, mode="lazy", grace_s=0)
        first = spec(ref)
        started = await rt.start(first)
        try:
            # dumped once it sleeps: a task waiting on a FUSE read (paging in) cannot be frozen
            await wait_for(lambda: asleep(started.pid))
            artifact = await rt.checkpoint(first.container_id, tmp_path / "ck.tar")
            assert artifact.manifest["image_id"] == artifact.manifest["base"] == image_id
            restored = spec(ref)
            await rt.restore(restored, tmp_path / "ck.tar")
            assert await rt.poll(restored.container_id) is None
            await rt.stop(restored.container_id, timeout=1)
            with pytest.raises(RestoreError) as err:
                await rt.restore(spec(None), tmp_path / "ck.tar")
            assert f"made on image {image_id}; this container runs the platform base" in str(err.value)
        finally:
            for cid in rt.running():
                await rt.stop(cid, timeout=1)
