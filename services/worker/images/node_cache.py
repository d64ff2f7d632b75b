"""The node content cache: blobs by sha256 for this node's workers and for peer workers.

- GET /blobs/{sha256}: the blob. On a miss it is filled, in this order, from a peer cache given
  as `?peer=URL`, then from S3 given as `?bucket=B&key=K` (with `&offset=O&length=N`: only that byte
  range of the object, an S3 Range request: a chunk of an image archive); a filled blob is stored
  only if its sha256 matches (a tampered or truncated object is refused with 502 and the reason).
  A failed fill says whose fault it is in `X-Levers9-Fault`: `content` (hash or seal wrong, 502),
  `missing` (no source has it, 404), `unreachable` (its source, S3 or the peer, did not answer:
  503, try again later; levers9.contracts.checkpoint_policy.restore_failure_verdict reads it).
  `&sealed=true` (checkpoints): the S3 object is a sealed archive (levers9.runtime.sealing), opened
  here with the secrets keyring as it streams in (a worker without the keyring sends that archive's
  own data key, from the gateway, as `X-Levers9-Data-Key`); the sha256 is the plaintext's. An object without
  the seal's magic (stored before sealing existed) is taken as plaintext, still hash-checked.
- PUT /blobs/{sha256}: store a blob (its hash is checked).
- GET /stats: size, count, hits, misses, evictions, bytes filled from S3 and peers.
Bounded by `LEVERS9_CACHE_MAX_BYTES`; least recently used blobs are evicted first (`evict`, pure).
Blobs live in `<image_cache>/blobs`, shared by the workers of the node; the first worker of a node
serves it on `LEVERS9_CACHE_PORT` (default 2050), the others use that one.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.responses import FileResponse

from levers9.runtime.config import Settings
from levers9.runtime.sealing import ArchiveOpener, SealError, is_sealed_archive
from levers9.runtime.secrets import SecretKeyMissing, checkpoint_context, keyring
from levers9.runtime.storage import S3_UNREACHABLE, s3_client

log = logging.getLogger("levers9.worker.images.node_cache")
SHA_RE = re.compile(r"^[0-9a-f]{64}$")
PEER_CONNECT_S = 2.0
SCAN_EVERY_S = 5.0  # the blob dir is listed at most this often while it is well under its bound


FAULT_HEADER = "X-Levers9-Fault"


class SourceUnreachable(FileNotFoundError):
    """Not here, and its sources (S3, the peer) did not answer: try again later (not the blob's fault)."""


def s3_unreachable(exc: BaseException) -> bool:
    """S3 did not answer, or answered that it cannot serve now (5xx): nothing about the object."""
    if isinstance(exc, S3_UNREACHABLE):
        return True
    status = getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode", 0) \
        if isinstance(getattr(exc, "response", None), dict) else 0
    return int(status or 0) >= 500


@dataclass(frozen=True)
class Entry:
    sha256: str
    size: int
    last_used: float


def evict(entries: list[Entry], max_bytes: int, incoming: int = 0) -> list[str]:
    """Which blobs to drop so that what stays plus `incoming` fits in max_bytes: least recently used
    first. Pure."""
    total = sum(e.size for e in entries) + incoming
    out = []
    for e in sorted(entries, key=lambda e: (e.last_used, e.sha256)):
        if total <= max_bytes:
            break
        out.append(e.sha256)
        total -= e.size
    return out


class HashMismatch(Exception):
    pass


class NodeCache:
    def __init__(self, root: Path, settings: Settings, max_bytes: int) -> None:
        # a worker running as a host has a cache of its own (`cache_dir`), not the machine's shared one
        self.root = Path(settings.images.cache_dir) if settings.images.cache_dir else root
        self.settings = settings
        self.max_bytes = max_bytes
        self.root.mkdir(parents=True, exist_ok=True)
        self.stats = {"hits": 0, "misses": 0, "evictions": 0, "fills_s3": 0, "fills_peer": 0, "refused": 0,
                      "bytes_filled": 0}
        self.locks: dict[str, asyncio.Lock] = {}
        # bytes in the dir at the last listing plus what was stored since: listing it (a stat per
        # blob) before and after every fill cost more than a small fill itself once it held
        # thousands of image chunks
        self.tally: int | None = None
        self.scanned = 0.0
        # one S3 client for the cache's life (making one per fill cost tens of ms, more than a chunk's
        # transfer); per event loop, since a client belongs to the loop it was made in
        self._s3: tuple[asyncio.AbstractEventLoop, asyncio.Task] | None = None
        self._s3_exits: list[contextlib.AsyncExitStack] = []

    async def s3(self) -> Any:
        """This cache's S3 client (made on first use)."""
        loop = asyncio.get_running_loop()
        if self._s3 is None or self._s3[0] is not loop or (self._s3[1].done() and self._s3[1].exception()):
            self._s3 = (loop, loop.create_task(self._open_s3()))
        return await asyncio.shield(self._s3[1])

    async def _open_s3(self) -> Any:
        exits = contextlib.AsyncExitStack()
        client = await exits.enter_async_context(s3_client(self.settings))
        self._s3_exits.append(exits)
        return client

    async def close(self) -> None:
        """Close the S3 client (the cache can still be used: a new one is made)."""
        self._s3 = None
        while self._s3_exits:
            with contextlib.suppress(Exception):
                await self._s3_exits.pop().aclose()

    def path(self, sha: str) -> Path:
        if not SHA_RE.fullmatch(sha):
            raise HTTPException(400, f"{sha!r} is not a sha256 (64 lowercase hex digits)")
        return self.root / sha

    def entries(self) -> list[Entry]:
        out = []
        for p in self.root.iterdir():
            if SHA_RE.fullmatch(p.name):
                st = p.stat()
                out.append(Entry(p.name, st.st_size, st.st_atime if st.st_atime > st.st_mtime else st.st_mtime))
        return out

    def touch(self, path: Path) -> None:
        now = time.time()
        os.utime(path, (now, now))

    def make_room(self, incoming: int) -> None:
        fresh = time.monotonic() - self.scanned < SCAN_EVERY_S
        if self.tally is not None and fresh and self.tally + incoming <= self.max_bytes:
            return
        entries = self.entries()
        self.tally, self.scanned = sum(e.size for e in entries), time.monotonic()
        sizes = {e.sha256: e.size for e in entries}
        for sha in evict(entries, self.max_bytes, incoming):
            (self.root / sha).unlink(missing_ok=True)
            self.stats["evictions"] += 1
            self.tally -= sizes[sha]

    async def store(self, sha: str, chunks: AsyncIterator[bytes], size_hint: int = 0) -> Path:
        """Write chunks to a temp file, check the hash, then move into place."""
        target = self.path(sha)
        self.make_room(size_hint)
        tmp = target.with_name(f".{sha}.{os.getpid()}.{id(chunks)}")
        digest = hashlib.sha256()
        try:
            with tmp.open("wb") as f:
                async for chunk in chunks:
                    digest.update(chunk)
                    f.write(chunk)
            if digest.hexdigest() != sha:
                self.stats["refused"] += 1
                raise HashMismatch(f"content hashes to {digest.hexdigest()}, not {sha}")
            tmp.replace(target)
            if self.tally is not None:
                self.tally += target.stat().st_size
        finally:
            tmp.unlink(missing_ok=True)
        self.make_room(0)
        return target

    async def get(self, sha: str, bucket: str = "", key: str = "", peer: str = "",
                  offset: int = 0, length: int = 0, sealed: bool = False, data_key: bytes | None = None) -> Path:
        """The blob's path, filled on a miss from the peer, then from S3 (`length` > 0: bytes
        [offset, offset+length) of the object only; `data_key`: a sealed object's own key, for a
        worker without the keyring)."""
        target = self.path(sha)
        if target.exists():
            self.stats["hits"] += 1
            self.touch(target)
            return target
        lock = self.locks.setdefault(sha, asyncio.Lock())
        async with lock:  # one fill per blob, however many ask at once
            if target.exists():
                self.stats["hits"] += 1
                return target
            self.stats["misses"] += 1
            errors: list[str] = []
            unreachable = 0  # how many sources did not answer
            if peer:
                try:
                    path = await self.store(sha, self._from_peer(peer, sha))
                    self.stats["fills_peer"] += 1
                    self.stats["bytes_filled"] += path.stat().st_size
                    return path
                except (httpx.HTTPError, HashMismatch, RuntimeError) as exc:
                    errors.append(f"peer {peer}: {exc}")
                    unreachable += isinstance(exc, httpx.TransportError)
            if bucket and key:
                try:
                    chunks = self._from_s3(bucket, key, offset, length)
                    if sealed:
                        chunks = self._unsealed(chunks, bucket, key, data_key)
                    path = await self.store(sha, chunks, length)
                    self.stats["fills_s3"] += 1
                    self.stats["bytes_filled"] += path.stat().st_size
                    return path
                except (HashMismatch, SealError, SecretKeyMissing) as exc:
                    errors.append(f"s3://{bucket}/{key}: {exc}")
                    raise HashMismatch("; ".join(errors)) from None
                except Exception as exc:  # noqa: BLE001 - any S3 failure is reported with its cause
                    errors.append(f"s3://{bucket}/{key}: {type(exc).__name__}: {exc}")
                    unreachable += s3_unreachable(exc)
            if unreachable:  # a source that did not answer may well have it: not the blob's fault
                raise SourceUnreachable("; ".join(errors))
            raise FileNotFoundError("; ".join(errors) or f"blob {sha} is not here and no source was given")

    async def _from_peer(self, peer: str, sha: str) -> AsyncIterator[bytes]:
        # a peer on a host that is cut off must not hold the fill up: S3 is tried next
        async with httpx.AsyncClient(timeout=httpx.Timeout(60, connect=PEER_CONNECT_S)) as client:
            async with client.stream("GET", f"{peer.rstrip('/')}/blobs/{sha}") as r:
                if r.status_code != 200:
                    raise RuntimeError(f"answered {r.status_code}")
                async for chunk in r.aiter_bytes(1 << 20):
                    yield chunk

    async def _unsealed(self, chunks: AsyncIterator[bytes], bucket: str, key: str,
                        data_key: bytes | None = None) -> AsyncIterator[bytes]:
        """Open a sealed archive as it streams in (passing through an object stored before sealing)."""
        opener: ArchiveOpener | None = None
        first = True
        async for chunk in chunks:
            if first:
                first = False
                if is_sealed_archive(chunk):
                    ring = None if data_key is not None else keyring(self.settings)
                    opener = ArchiveOpener(ring, checkpoint_context(bucket, key), data_key)
            yield opener.update(chunk) if opener else chunk
        if opener:
            yield opener.finish()

    async def _from_s3(self, bucket: str, key: str, offset: int = 0, length: int = 0) -> AsyncIterator[bytes]:
        ranged = {"Range": f"bytes={offset}-{offset + length - 1}"} if length > 0 else {}
        c = await self.s3()
        obj = await c.get_object(Bucket=bucket, Key=key, **ranged)
        async with obj["Body"] as body:
            while chunk := await body.read(1 << 20):
                yield chunk


class CacheTaken(RuntimeError):
    """The node cache's port is held by something this worker must not share."""


async def shared_cache_or_exit(cache_url: str, settings: Settings) -> None:
    """Another worker serves this node's cache: share it when it fills from our S3; exit, saying
    why, when it is another home's (a second `levers9 up` on the machine with the same cache_port
    would have fetched code and checkpoints from the first one's S3): CacheTaken ends the worker."""
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            theirs = (await client.get(f"{cache_url}/stats")).json().get("s3_endpoint", "")
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        raise CacheTaken(f"node cache: port {cache_url} is taken by something that is not a levers9 node "
                         f"cache ({exc}); set cache_port (LEVERS9_CACHE_PORT) to a free port") from None
    if theirs and theirs != settings.storage.s3_endpoint:
        raise CacheTaken(f"node cache: {cache_url} belongs to another levers9 home (its S3 is {theirs}, ours "
                         f"{settings.storage.s3_endpoint}); give this home its own cache_port (LEVERS9_CACHE_PORT)")
    log.info("node cache: %s is served by another worker of this node", cache_url)


def cache_app(cache: NodeCache) -> FastAPI:
    app = FastAPI(title="levers9 node cache")

    @app.get("/blobs/{sha}")
    async def get_blob(sha: str, bucket: str = "", key: str = "", peer: str = "", fill: bool = False,
                       offset: int = 0, length: int = 0, sealed: bool = False,
                       x_levers9_data_key: str | None = Header(default=None)):
        """The blob; with fill=true only make sure it is here (a worker of this node then reads the
        file from the shared directory instead of over HTTP). offset/length: the blob is that byte
        range of the S3 object (an image archive's chunk)."""
        if offset < 0 or length < 0:
            raise HTTPException(400, "offset and length must not be negative")
        try:
            data_key = base64.b64decode(x_levers9_data_key, validate=True) if x_levers9_data_key else None
        except ValueError:
            raise HTTPException(400, "X-Levers9-Data-Key is not base64") from None
        try:
            path = await cache.get(sha, bucket, key, peer, offset, length, sealed, data_key)
        except HashMismatch as exc:
            raise HTTPException(502, f"refused: {exc}", headers={FAULT_HEADER: "content"}) from None
        except SourceUnreachable as exc:
            raise HTTPException(503, f"its sources did not answer (try again later): {exc}",
                                headers={FAULT_HEADER: "unreachable"}) from None
        except FileNotFoundError as exc:
            raise HTTPException(404, str(exc), headers={FAULT_HEADER: "missing"}) from None
        if fill:
            return {"sha256": sha, "path": str(path), "size": path.stat().st_size}
        return FileResponse(path, media_type="application/octet-stream")

    @app.head("/blobs/{sha}")
    async def head_blob(sha: str):
        if not cache.path(sha).exists():
            raise HTTPException(404, "not here")
        return {}

    @app.put("/blobs/{sha}", status_code=201)
    async def put_blob(sha: str, request: Request):
        try:
            await cache.store(sha, request.stream(), int(request.headers.get("content-length") or 0))
        except HashMismatch as exc:
            raise HTTPException(422, str(exc)) from None
        return {"sha256": sha}

    @app.get("/stats")
    async def stats():
        entries = cache.entries()
        return {"bytes": sum(e.size for e in entries), "blobs": len(entries), "max_bytes": cache.max_bytes,
                "s3_endpoint": cache.settings.storage.s3_endpoint, **cache.stats}

    @app.get("/healthz")
    async def healthz():
        return {"healthy": True}

    return app
