"""The lazy image file system: a read-only FUSE server of one image archive, one process per mounted
image per node (started and watched by levers9.worker.images.layers).

    python -m levers9.worker.images.lazyfs --index FILE --mount DIR --cache-url URL --bucket B --key K \
        --blob-dir DIR

Every name, mode, owner, link and size comes from the index (levers9.contracts.image_index), held
in memory; a file's bytes come from the archive in S3 one chunk at a time, through the node content
cache: a read makes sure each chunk it touches is in the cache (`GET /blobs/<chunk sha256>?bucket&
key&offset&length&fill=true`: the cache fills it with a range request and checks its hash) and then
reads the chunk's file from the blob directory the workers of the node share. So only the chunks a
container reads are fetched, each once per node. A chunk that cannot be had is EIO for the read
(the reason goes to the log, this process's stderr). Opening a file starts filling its first chunks
and a read starts filling the file's next ones, several at once in the background (never past the
file's end), so a read rarely waits for a round trip to S3 of its own. The kernel keeps names,
attributes, missing names and file pages for as long as the mount lives (an image never changes).

It prints `mounted <dir>` on stdout once the mount exists, and unmounts on SIGTERM (or when
unmounted from outside). Inode N is entry N-1 of the index (the root, entry 0, is FUSE's inode 1).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import stat
import sys
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

import pyfuse3
import trio

from levers9.contracts.image_index import FileEntry, ImageIndex, chunk_bounds, chunk_span, decode_index

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("levers9.worker.images.lazyfs")

OPEN_CHUNKS = 256  # chunk files kept open (the least recently used is closed first)
READAHEAD_BYTES = 4 << 20  # past a read, up to the file's end, filled in the background
# past a chunk a read had to wait for, whatever file they hold: the archive is in path order, so they
# hold the package's next files (an import of scikit-learn from an empty node cache, 4 MiB chunks:
# 7.1-8.4 s without, 5.9-6.0 s with one chunk)
NEIGHBOR_BYTES = 4 << 20
OPEN_PREFETCH_BYTES = 4 << 20  # of a file opened, its first bytes' chunks are filled at once
FILLS_AT_ONCE = 8  # background fills in flight
MIN_TASKS = 8  # pyfuse3 request tasks kept waiting (fewer: one started and ended per burst)
TIMEOUT = 3600.0  # seconds the kernel may cache names and attributes: an image never changes
FILL_TIMEOUT_S = 120.0
TYPES = {"d": stat.S_IFDIR, "f": stat.S_IFREG, "l": stat.S_IFLNK, "c": stat.S_IFCHR, "b": stat.S_IFBLK,
         "p": stat.S_IFIFO, "s": stat.S_IFSOCK}


class ChunkError(Exception):
    """A chunk could not be had (the message says why)."""


class Chunks:
    """The archive's chunks, each filled into the node cache once, read from the shared blob dir.

    A read waits only for the chunks it needs; the next chunks of the same file (up to `ahead`, never
    past the file's end) are filled meanwhile in the background, at most FILLS_AT_ONCE at a time: a
    process reads one file at a time and FUSE's reads of it come one after another, so without this
    every chunk would cost a whole round trip to S3 in turn."""

    def __init__(self, index: ImageIndex, cache_url: str, bucket: str, key: str, blob_dir: Path,
                 open_max: int = OPEN_CHUNKS, ahead_bytes: int = READAHEAD_BYTES,
                 neighbor_bytes: int = NEIGHBOR_BYTES) -> None:
        self.index = index
        self.cache_url = cache_url.rstrip("/")
        self.bucket, self.key = bucket, key
        self.blob_dir = Path(blob_dir)
        self.open_max = open_max
        self.ahead = max(0, ahead_bytes // index.chunk_size)
        self.neighbors = max(0, neighbor_bytes // index.chunk_size)
        self.fds: OrderedDict[int, int] = OrderedDict()
        self.paths: dict[int, str] = {}  # chunks known to be in the node cache: their files
        self.locks: dict[int, trio.Lock] = {}
        self.pending: set[int] = set()  # background fills on their way
        self.gate = trio.Semaphore(FILLS_AT_ONCE)  # background fills only: a read never waits on it
        self.nursery: trio.Nursery | None = None  # where background fills run (serve() sets it)
        self._client: httpx.AsyncClient | None = None
        self.filled = 0  # chunks this process asked the cache to fill
        self.prefetched = 0  # of which in the background

    @property
    def client(self) -> httpx.AsyncClient:
        """One client for the server's life; httpx is imported at the first fill (a tenth of a
        second a mount on a warm node cache need not wait for)."""
        if self._client is None:
            import httpx
            self._client = httpx.AsyncClient(timeout=FILL_TIMEOUT_S, limits=httpx.Limits(max_keepalive_connections=32))
        return self._client

    def last_chunk(self, end: int) -> int:
        """The chunk that holds the byte before archive offset `end`."""
        return max(0, end - 1) // self.index.chunk_size

    async def read(self, offset: int, length: int, end: int | None = None) -> bytes:
        """Bytes [offset, offset+length) of the archive; `end`: where the file read ends in the
        archive (the readahead stops there)."""
        size = self.index.chunk_size
        span = chunk_span(offset, length, size)
        if end is not None and self.ahead and len(span):
            self.prefetch(range(span.stop, min(span.stop + self.ahead, self.last_chunk(end) + 1)))
        parts = []
        for n in span:
            if self.neighbors and n not in self.fds and n not in self.paths:  # a miss: its neighbors too
                self.prefetch(range(n + 1, min(n + 1 + self.neighbors, len(self.index.chunks))))
            start = max(offset, n * size)
            stop = min(offset + length, (n + 1) * size)
            fd = await self.fd(n)
            # no await between getting the fd and reading it: no other read can close it meanwhile
            data = os.pread(fd, stop - start, start - n * size)
            if len(data) != stop - start:
                raise ChunkError(f"chunk {n} is short: {len(data)} of {stop - start} bytes at {start - n * size}")
            parts.append(data)
        return b"".join(parts)

    def prefetch(self, numbers: range) -> None:
        """Fill these chunks in the background (those not here or on their way)."""
        if self.nursery is None:
            return
        for n in numbers:
            if n in self.fds or n in self.paths or n in self.pending:
                continue
            self.pending.add(n)
            self.nursery.start_soon(self._prefetch, n)

    async def _prefetch(self, n: int) -> None:
        try:
            async with self.gate:
                await self.ensure(n, background=True)
        except ChunkError as exc:  # the read that needs it fills it again and says why
            log.warning("background fill: %s", exc)
        finally:
            self.pending.discard(n)

    async def fd(self, n: int) -> int:
        if n in self.fds:
            self.fds.move_to_end(n)
            return self.fds[n]
        for attempt in (1, 2):
            path = await self.ensure(n)
            if n in self.fds:  # opened by another read meanwhile
                break
            try:
                self._keep(n, os.open(path, os.O_RDONLY | os.O_CLOEXEC))
                break
            except FileNotFoundError:  # evicted from the node cache since: filled again
                self.paths.pop(n, None)
                if attempt == 2:
                    raise ChunkError(f"chunk {n}: filled, but its file {path} is gone") from None
            except OSError as exc:
                raise ChunkError(f"chunk {n}: filled, but its file cannot be opened: {exc}") from None
        self.fds.move_to_end(n)
        return self.fds[n]

    def _keep(self, n: int, fd: int) -> None:
        self.fds[n] = fd
        while len(self.fds) > self.open_max:
            _, old = self.fds.popitem(last=False)
            os.close(old)

    async def ensure(self, n: int, background: bool = False) -> str:
        """The file of chunk `n`, filled into the node cache first if it is not there."""
        if n in self.paths:
            return self.paths[n]
        async with self.locks.setdefault(n, trio.Lock()):  # one fill per chunk at a time
            if n not in self.paths:
                self.paths[n] = await self._fill(n, background)
        return self.paths[n]

    async def _fill(self, n: int, background: bool) -> str:
        sha = self.index.chunks[n]
        local = self.blob_dir / sha
        if local.exists():
            return str(local)
        offset, length = chunk_bounds(n, self.index.chunk_size, self.index.archive_size)
        params = {"bucket": self.bucket, "key": self.key, "offset": str(offset), "length": str(length),
                  "fill": "true"}
        client = self.client
        try:
            r = await client.get(f"{self.cache_url}/blobs/{sha}", params=params)
        except Exception as exc:  # noqa: BLE001 - httpx's errors (imported lazily): said with their cause
            raise ChunkError(f"chunk {n}: the node cache at {self.cache_url} did not answer: "
                             f"{type(exc).__name__}: {exc}") from None
        if r.status_code != 200:
            raise ChunkError(f"chunk {n}: the node cache answered {r.status_code}: {r.text[:300]}")
        self.filled += 1
        self.prefetched += background
        try:
            return str(r.json()["path"])
        except (ValueError, KeyError) as exc:
            raise ChunkError(f"chunk {n}: the node cache's answer has no path: {exc}") from None

    async def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        if self._client is not None:
            await self._client.aclose()


class ImageFs(pyfuse3.Operations):
    """The index as a read-only tree; file bytes from `chunks`."""

    def __init__(self, index: ImageIndex, chunks: Chunks) -> None:
        super().__init__()
        if not index.files or index.files[0].path != "" or index.files[0].kind != "d":
            raise ValueError("the image index does not start with its root directory")
        self.files = index.files
        self.chunks = chunks
        self.children: dict[int, dict[bytes, int]] = {}
        self.parent: dict[int, int] = {pyfuse3.ROOT_INODE: pyfuse3.ROOT_INODE}
        by_path = {"": pyfuse3.ROOT_INODE}
        for ino, entry in enumerate(self.files[1:], start=2):
            parent_path, _, name = entry.path.rpartition("/")
            parent = by_path.get(parent_path)
            if parent is None or self.files[parent - 1].kind != "d":
                raise ValueError(f"{entry.path!r}: its parent is not a directory of the image")
            self.children.setdefault(parent, {})[os.fsencode(name)] = ino
            self.parent[ino] = parent
            if entry.kind == "d":
                by_path[entry.path] = ino
        self.subdirs = {ino: sum(1 for c in kids.values() if self.files[c - 1].kind == "d")
                        for ino, kids in self.children.items()}

    def entry(self, ino: int) -> FileEntry:
        if not 1 <= ino <= len(self.files):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self.files[ino - 1]

    def attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        f = self.entry(ino)
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.st_mode = TYPES[f.kind] | f.mode
        a.st_nlink = 2 + self.subdirs.get(ino, 0) if f.kind == "d" else 1
        a.st_uid, a.st_gid, a.st_rdev = f.uid, f.gid, f.rdev
        a.st_size = f.size if f.kind in ("f", "l") else (4096 if f.kind == "d" else 0)
        a.st_blocks = (a.st_size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = f.mtime_ns
        a.entry_timeout = a.attr_timeout = TIMEOUT
        return a

    async def lookup(self, parent_inode, name, ctx=None):
        if name == b".":
            return self.attrs(parent_inode)
        if name == b"..":
            return self.attrs(self.parent.get(parent_inode, pyfuse3.ROOT_INODE))
        ino = self.children.get(parent_inode, {}).get(name)
        if ino is None:  # inode 0: the kernel keeps the negative answer as long as a positive one
            missing = pyfuse3.EntryAttributes()
            missing.st_ino = 0
            missing.entry_timeout = TIMEOUT
            return missing
        return self.attrs(ino)

    async def getattr(self, inode, ctx=None):
        return self.attrs(inode)

    async def readlink(self, inode, ctx):
        f = self.entry(inode)
        if f.kind != "l":
            raise pyfuse3.FUSEError(errno.EINVAL)
        return os.fsencode(f.target)

    async def opendir(self, inode, ctx):
        if self.entry(inode).kind != "d":
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh, start_id, token):
        names = sorted(self.children.get(fh, {}).items())
        for i in range(start_id, len(names)):
            name, ino = names[i]
            if not pyfuse3.readdir_reply(token, name, self.attrs(ino), i + 1):
                break

    async def open(self, inode, flags, ctx):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise pyfuse3.FUSEError(errno.EROFS)
        f = self.entry(inode)
        if f.kind != "f":
            raise pyfuse3.FUSEError(errno.EINVAL)
        if f.size:  # a read of it follows: its chunks start coming now, several at once
            first = f.offset // self.chunks.index.chunk_size
            last = self.chunks.last_chunk(f.offset + min(f.size, OPEN_PREFETCH_BYTES))
            self.chunks.prefetch(range(first, last + 1))
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)  # immutable: the page cache stays valid

    async def read(self, fh, off, size):
        f = self.entry(fh)
        if off >= f.size or size <= 0:
            return b""
        try:
            return await self.chunks.read(f.offset + off, min(size, f.size - off), f.offset + f.size)
        except (ChunkError, OSError) as exc:
            log.error("read of %s (%d bytes at %d) failed: %s", f.path, size, off, exc)
            raise pyfuse3.FUSEError(errno.EIO) from None

    async def statfs(self, ctx):
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = (self.chunks.index.archive_size + 4095) // 4096
        s.f_bfree = s.f_bavail = s.f_ffree = s.f_favail = 0
        s.f_files = len(self.files)
        s.f_namemax = 255
        return s


def mount_options(image_id: str) -> set[str]:
    """allow_other: containers (and the overlay over it) read it; default_permissions: the kernel
    checks modes and owners, we never do."""
    return {"allow_other", "default_permissions", "ro", f"fsname=levers9-{image_id}", "subtype=levers9"}


async def _terminate_on_signal() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            pyfuse3.terminate()
            return


async def serve(fs: ImageFs, mount: str) -> None:
    """Under trio, pyfuse3's own event loop (its asyncio emulation made every request cost more:
    an import of scikit-learn through the mount took 2.6 s with it, 2.0 s without)."""
    try:
        async with trio.open_nursery() as nursery:
            fs.chunks.nursery = nursery
            nursery.start_soon(_terminate_on_signal)
            print(f"mounted {mount}", flush=True)
            await pyfuse3.main(min_tasks=MIN_TASKS)
            nursery.cancel_scope.cancel()  # the background fills and the signal watch
    finally:
        log.info("serving ended: %d chunks filled (%d in the background)", fs.chunks.filled, fs.chunks.prefetched)
        await fs.chunks.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m levers9.worker.images.lazyfs", description=__doc__.split("\n")[0])
    for name in ("index", "mount", "cache-url", "bucket", "key", "blob-dir"):
        p.add_argument(f"--{name}", required=True)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s lazyfs %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per chunk
    try:
        index = decode_index(Path(args.index).read_bytes())
        fs = ImageFs(index, Chunks(index, args.cache_url, args.bucket, args.key, Path(args.blob_dir)))
    except (OSError, ValueError) as exc:
        print(f"lazyfs: the image index {args.index} cannot be served: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        pyfuse3.init(fs, args.mount, mount_options(index.image_id))
    except RuntimeError as exc:
        print(f"lazyfs: mounting {args.mount} failed: {exc}", file=sys.stderr, flush=True)
        return 3
    try:
        trio.run(serve, fs, args.mount)
    finally:
        pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
