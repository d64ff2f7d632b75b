"""The worker's side of checkpoint/restore, over the runtime's dump and restore: CRIU enabled (or
why not), dumps into the node cache, restores from it (filled from S3 on a miss, hash verified)."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

import httpx

from levers9.runtime.config import Settings

from .node_cache import NodeCache

log = logging.getLogger("levers9.worker.checkpoint")


class CheckpointSkipped(Exception):
    pass


async def enable_criu(runtime, settings: Settings) -> str:
    """Check CRIU (>= 4) at worker start and arm the runtime with it; returns a note for the log,
    /healthz and the registration (the feature `criu` is advertised only when it works)."""
    if settings.worker_criu == "off":
        return "off: this worker's pool has criu = false"
    if runtime.name != "runc":
        return f"off: the {runtime.name} runtime cannot checkpoint"
    from .criu import CriuUnavailable, ensure_criu
    try:
        info = await ensure_criu(Path(settings.image_cache), lambda msg: log.info("criu: %s", msg))
    except CriuUnavailable as exc:
        return f"off: {exc}"
    runtime.use_criu(info)
    return f"on: CRIU {info.version} ({info.binary})"


def ready(runtime) -> bool:
    return bool(getattr(runtime, "checkpoint_ready", False))


async def dump(runtime, container_id: str, cache: NodeCache, settings: Settings, memory_mib: int):
    """Dump leave-running into a tar, then move it into the node cache under its sha256."""
    usage = runtime.memory_usage(container_id) if hasattr(runtime, "memory_usage") else None
    if usage is not None and usage > memory_mib * 1024 * 1024:
        raise CheckpointSkipped(f"the container uses {usage >> 20} MiB, more than its limit of {memory_mib} MiB")
    if usage is not None and usage > cache.max_bytes:
        raise CheckpointSkipped(f"a dump of {usage >> 20} MiB would not fit the node cache "
                                f"({cache.max_bytes >> 20} MiB)")
    tmp = cache.root / f".dump-{container_id}.tar"
    try:
        artifact = await runtime.checkpoint(container_id, tmp)
        cache.make_room(artifact.size_bytes)
        await asyncio.to_thread(shutil.move, tmp, cache.root / artifact.sha256)
    finally:
        tmp.unlink(missing_ok=True)
    return artifact


async def restore(runtime, cspec, checkpoint, cache_url: str, cache: NodeCache):
    from .checkpoint import RestoreError

    if checkpoint["status"] != "available":
        raise RestoreError(f"checkpoint {checkpoint['checkpoint_id']} is {checkpoint['status']}")
    sha = checkpoint["sha256"]
    async with httpx.AsyncClient(timeout=300) as client:
        r = await client.get(f"{cache_url}/blobs/{sha}", params={"bucket": checkpoint["bucket"],
                                                                 "key": checkpoint["key"], "fill": "true"})
    if r.status_code != 200:
        raise RestoreError(f"the node cache could not get the checkpoint: {r.json().get('detail', r.text)}")
    path = Path(r.json()["path"])
    # the cache checked the sha256 when the blob entered it (a dump, a peer, S3); checking the whole
    # tar again here would cost ~0.3 s per 400 MB on every restore. The manifest and layout are
    # still checked by the runtime's unpack.
    return await runtime.restore(cspec, path)
