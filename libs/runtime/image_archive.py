"""An image's flattened root fs as one archive plus its file index (levers9.contracts.image_index):
written by the image-builder, uploaded to S3 content-addressed, read lazily by workers (chunk by
chunk, levers9.worker.images.lazyfs) or unpacked whole (the fallback and the benchmark's baseline).

The archive is every distinct regular-file content once, in path order (a package's files sit
together, so one chunk often serves a whole import); hard links and files with equal content share
their bytes. Everything else (directories, symlinks, devices, fifos, owners, modes, times) lives in
the index only.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from levers9.contracts.image_index import (
    DEFAULT_CHUNK_SIZE,
    FileEntry,
    ImageIndex,
    Kind,
    chunk_bounds,
    encode_index,
)
from levers9.contracts.spec import ArchiveRef

from .config import Settings
from .storage import ensure_bucket, s3_client

log = logging.getLogger("levers9.image_archive")

COPY = 1 << 20
# S3 multipart part size (the minimum is 5 MiB; 10,000 parts at most: 160 GiB). botocore signs and
# checksums a part, and aiohttp copies it, on the event loop: a 64 MiB part stalled the
# image-builder's loop 2 s at a time under load (loop_stall), 16 MiB a quarter of that
PART_SIZE = 16 << 20
SINGLE_PUT_MAX = 16 << 20  # up to this, one put_object
PARTS_AT_ONCE = 4
ARCHIVES = "images/archives"
INDEXES = "images/indexes"

Progress = Callable[[str], None]


class UnsafeIndex(ValueError):
    """An index entry that would write outside the target or through a link."""


# ---- writing -------------------------------------------------------------------------------------

def _walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of `root` and everything under it, sorted by path (a directory comes
    before what it holds: a path sorts before every path it is a prefix of). Symlinks are not followed."""
    stack = [""]
    while stack:
        rel = stack.pop()
        full = os.path.join(root, rel) if rel else str(root)
        st = os.lstat(full)
        yield rel, st
        if stat.S_ISDIR(st.st_mode):
            names = sorted(os.listdir(full), reverse=True)  # popped in ascending order
            stack.extend(f"{rel}/{n}" if rel else n for n in names)


def _kind(mode: int) -> Kind | None:
    for test, kind in ((stat.S_ISDIR, "d"), (stat.S_ISREG, "f"), (stat.S_ISLNK, "l"), (stat.S_ISCHR, "c"),
                       (stat.S_ISBLK, "b"), (stat.S_ISFIFO, "p"), (stat.S_ISSOCK, "s")):
        if test(mode):
            return kind  # type: ignore[return-value]
    return None


def _check_name(rel: str) -> None:
    try:
        rel.encode()
    except UnicodeEncodeError:
        raise ValueError(f"{rel!r}: file names in an image must be UTF-8") from None


class _Packer:
    """Appends regular files' contents to the archive once per distinct content."""

    def __init__(self, out) -> None:
        self.out = out
        self.size = 0
        self.by_sha: dict[str, int] = {}  # content sha256 -> offset
        self.by_inode: dict[tuple[int, int], tuple[int, str]] = {}  # hard links: (dev, ino) -> (offset, sha)

    def add(self, path: str, st: os.stat_result) -> tuple[int, str]:
        """(offset, sha256) of the file's bytes in the archive; written unless they are there."""
        known = self.by_inode.get((st.st_dev, st.st_ino))
        if known is not None:
            return known
        start = self.size
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(COPY):
                digest.update(block)
                self.out.write(block)
                self.size += len(block)
        sha = digest.hexdigest()
        if sha in self.by_sha:  # same content as an earlier file: take its bytes back out
            self.out.seek(start)
            self.out.truncate()
            self.size = start
        else:
            self.by_sha[sha] = start
        found = (self.by_sha[sha], sha)
        if st.st_nlink > 1:
            self.by_inode[(st.st_dev, st.st_ino)] = found
        return found


def _entry(root: Path, rel: str, st: os.stat_result, packer: _Packer) -> FileEntry | None:
    kind = _kind(st.st_mode)
    if kind is None:
        return None
    _check_name(rel)
    common: dict[str, Any] = dict(path=rel, kind=kind, mode=stat.S_IMODE(st.st_mode), uid=st.st_uid,
                                  gid=st.st_gid, mtime_ns=st.st_mtime_ns)
    full = os.path.join(root, rel) if rel else str(root)
    if kind == "f":
        offset, sha = packer.add(full, st)
        return FileEntry(**common, size=st.st_size, offset=offset, sha256=sha)
    if kind == "l":
        target = os.readlink(full)
        _check_name(target)
        return FileEntry(**common, size=len(target.encode()), target=target)
    if kind in ("c", "b"):
        return FileEntry(**common, rdev=st.st_rdev)
    return FileEntry(**common)


def _hash_chunks(archive: Path, chunk_size: int) -> tuple[str, list[str]]:
    """The archive's sha256 and each chunk's, in one pass."""
    whole = hashlib.sha256()
    chunks = []
    with open(archive, "rb") as f:
        while block := f.read(chunk_size):
            whole.update(block)
            chunks.append(hashlib.sha256(block).hexdigest())
    return whole.hexdigest(), chunks


def write_archive(root: Path, image_id: str, out: Path,
                  chunk_size: int = DEFAULT_CHUNK_SIZE) -> tuple[Path, bytes, ImageIndex]:
    """Pack the root fs at `root` into the archive `out`; (archive path, encoded index, index)."""
    if chunk_size <= 0:
        raise ValueError("chunk_size must be positive")
    root, out = Path(root), Path(out)
    files = []
    with open(out, "wb") as f:
        packer = _Packer(f)
        for rel, st in _walk(root):
            entry = _entry(root, rel, st, packer)
            if entry is not None:
                files.append(entry)
    archive_sha, chunks = _hash_chunks(out, chunk_size)
    index = ImageIndex(image_id=image_id, archive_sha256=archive_sha, archive_size=packer.size,
                       chunk_size=chunk_size, chunks=chunks, files=files)
    return out, encode_index(index), index


# ---- uploading -----------------------------------------------------------------------------------

async def _exists(client: Any, bucket: str, key: str, size: int) -> bool:
    try:
        head = await client.head_object(Bucket=bucket, Key=key)
    except client.exceptions.ClientError:
        return False
    return int(head.get("ContentLength", -1)) == size


async def _put_multipart(client: Any, bucket: str, key: str, path: Path) -> None:
    """aiobotocore has no transfer manager (boto3's upload_file): parts by hand, a few at a time."""
    upload = await client.create_multipart_upload(Bucket=bucket, Key=key)
    upload_id = upload["UploadId"]
    size = path.stat().st_size
    numbers = list(range(1, (size + PART_SIZE - 1) // PART_SIZE + 1))
    gate = asyncio.Semaphore(PARTS_AT_ONCE)

    async def part(number: int) -> dict:
        async with gate:
            body = await asyncio.to_thread(_read_at, path, (number - 1) * PART_SIZE, PART_SIZE)
            r = await client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body)
            return {"PartNumber": number, "ETag": r["ETag"]}

    try:
        parts = await asyncio.gather(*(part(n) for n in numbers))
        await client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id,
                                               MultipartUpload={"Parts": list(parts)})
    except BaseException:
        await client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        raise


def _read_at(path: Path, offset: int, length: int) -> bytes:
    with open(path, "rb") as f:
        return os.pread(f.fileno(), length, offset)


async def put_file(client: Any, bucket: str, key: str, path: Path) -> bool:
    """Upload `path` to `key` unless an object of its size is there (keys are content addressed);
    whether it was uploaded."""
    size = path.stat().st_size
    if await _exists(client, bucket, key, size):
        return False
    if size > SINGLE_PUT_MAX:
        await _put_multipart(client, bucket, key, path)
    else:
        await client.put_object(Bucket=bucket, Key=key, Body=await asyncio.to_thread(path.read_bytes))
    return True


async def upload_image(settings: Settings, root: Path, image_id: str, bucket: str,
                       progress: Progress = lambda s: None,
                       chunk_size: int = DEFAULT_CHUNK_SIZE) -> ArchiveRef:
    """Archive the root fs at `root` and put archive and index in S3 (content addressed: an
    upload of what is there already is skipped); the ArchiveRef that ImageBuilt carries."""
    root = Path(root)
    scratch = root.parent / f".archive-{image_id}-{uuid.uuid4().hex[:8]}"
    scratch.mkdir()
    try:
        progress(f"archiving {root}")
        archive, index_bytes, index = await asyncio.to_thread(write_archive, root, image_id,
                                                              scratch / "archive", chunk_size)
        index_path = scratch / "index"
        index_path.write_bytes(index_bytes)
        index_sha = hashlib.sha256(index_bytes).hexdigest()
        ref = ArchiveRef(bucket=bucket, key=f"{ARCHIVES}/{index.archive_sha256}", sha256=index.archive_sha256,
                         size_bytes=index.archive_size, index_key=f"{INDEXES}/{index_sha}", index_sha256=index_sha,
                         index_size=len(index_bytes), chunk_size=chunk_size, files=len(index.files))
        progress(f"archive: {len(index.files)} entries, {index.archive_size} bytes in {len(index.chunks)} chunks")
        async with s3_client(settings) as client:
            await ensure_bucket(client, bucket)
            sent = await put_file(client, bucket, ref.key, archive)
            progress(f"archive {'uploaded to' if sent else 'already at'} s3://{bucket}/{ref.key}")
            await put_file(client, bucket, ref.index_key, index_path)
        return ref
    finally:
        await asyncio.to_thread(shutil.rmtree, scratch, True)


# ---- unpacking (the fallback and the baseline) ---------------------------------------------------

def _target(dest: Path, entry: FileEntry, dirs: set[str]) -> str:
    """Where `entry` goes under `dest`, refusing names that leave it or pass through a non-directory."""
    if entry.path == "":
        return str(dest)
    path = PurePosixPath(entry.path)
    if path.is_absolute() or ".." in path.parts or "." in path.parts or "\0" in entry.path:
        raise UnsafeIndex(f"unsafe path in the image index: {entry.path!r}")
    parent = str(path.parent) if str(path.parent) != "." else ""
    if parent not in dirs:
        raise UnsafeIndex(f"{entry.path!r}: its parent is not a directory of the image")
    return os.path.join(dest, entry.path)


def _make(entry: FileEntry, target: str, archive_fd: int) -> None:
    if entry.kind == "d":
        os.makedirs(target, mode=0o700, exist_ok=entry.path == "")
    elif entry.kind == "f":
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            offset, left = entry.offset, entry.size
            while left > 0:
                n = os.copy_file_range(archive_fd, fd, min(left, 1 << 30), offset)
                if n <= 0:
                    raise OSError(f"the archive ends before {entry.path!r} does")
                offset, left = offset + n, left - n
        finally:
            os.close(fd)
    elif entry.kind == "l":
        os.symlink(entry.target, target)
    elif entry.kind == "p":
        os.mkfifo(target, 0o600)
    elif entry.kind in ("c", "b"):
        kind = stat.S_IFCHR if entry.kind == "c" else stat.S_IFBLK
        try:
            os.mknod(target, 0o600 | kind, entry.rdev)
        except PermissionError:  # not root (or a user namespace): the device is left out
            log.warning("unpack: cannot make device %s here; left out", entry.path)
            return
    # sockets: nothing a process could use; left out


def _set_attrs(entry: FileEntry, target: str) -> None:
    try:
        os.chown(target, entry.uid, entry.gid, follow_symlinks=False)
    except PermissionError:
        pass  # not root: the files are ours
    if entry.kind != "l":
        os.chmod(target, entry.mode)  # after chown, which clears setuid/setgid bits
    os.utime(target, ns=(entry.mtime_ns, entry.mtime_ns), follow_symlinks=False)


def unpack(index: ImageIndex, archive_path: Path, dest: Path) -> None:
    """Materialize the image's root at `dest` (made; it must not exist, its parent must) from a local
    archive: contents, modes, owners, symlinks, mtimes, devices where allowed."""
    dest = Path(dest)
    if dest.exists():
        raise FileExistsError(f"{dest} exists already")
    dirs: set[str] = set()
    made: list[tuple[FileEntry, str]] = []
    with open(archive_path, "rb") as archive:
        for entry in index.files:
            if entry.kind == "s":
                continue
            target = _target(dest, entry, dirs)
            _make(entry, target, archive.fileno())
            if entry.kind == "d":
                dirs.add(entry.path)
            if os.path.lexists(target):
                made.append((entry, target))
    # deepest first: a directory's mtime and mode are set after everything inside it was made
    for entry, target in reversed(made):
        _set_attrs(entry, target)


def chunk_ranges(index: ImageIndex) -> list[tuple[str, int, int]]:
    """(sha256, offset, length) of every chunk of the archive."""
    return [(sha, *chunk_bounds(n, index.chunk_size, index.archive_size)) for n, sha in enumerate(index.chunks)]
