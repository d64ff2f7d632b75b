"""A placed container's code: the deployment's archive from the gateway, unpacked once per sha256
under the worker's state dir (a function sandbox without stored code gets an empty dir: each call
brings its function)."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import tarfile
import time
from pathlib import Path

import httpx

from levers9.runtime.config import Settings
from levers9.runtime.off_loop import scratch_dir
from levers9.runtime.safe_tar import extract_data
from levers9.worker.sandboxes.sandboxes import is_function

from .placement import Running

log = logging.getLogger("levers9.worker.lifecycle.code")


_fetching: dict[Path, asyncio.Lock] = {}  # one fetch per code dir at a time in this process (bounded: one per code)


async def fetch_code(settings: Settings, state_dir: Path, c: Running) -> Path:
    """The code archive, unpacked once per sha256. The gateway answers for this placement once
    its own projection has applied the ContainerScheduled (`seq`). Two starts of the same code at
    once (one app's endpoints share it) fetch it once: each unpacked into one shared temporary dir
    that the first to finish renamed away under the other (an e2e run: a container failed with
    FileNotFoundError on `code/SHA.tmpPID`)."""
    assert c.spec is not None
    sha = c.spec.code.sha256
    if is_function(c.spec) and not c.spec.code.key:  # an ad-hoc sandbox: each call brings its function
        empty = state_dir / "code" / "_none"
        empty.mkdir(parents=True, exist_ok=True)
        return empty
    target = state_dir / "code" / sha
    if sha and target.is_dir():
        return target
    async with _fetching.setdefault(target, asyncio.Lock()):
        if sha and target.is_dir():  # fetched by the start this one waited for
            return target
        await _fetch(settings, target, c)
    return target


async def _fetch(settings: Settings, target: Path, c: Running) -> None:
    url = f"{settings.client.gateway_url}/api/v1/internal/deployments/{c.deployment_id}/code"
    began = time.monotonic()
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.get(url, params={"workspace": c.workspace, "container_id": c.container_id,
                                          "seq": str(c.scheduled_seq)},
                             headers={"Authorization": f"Bearer {settings.worker.token}"})
    if r.status_code != 200:
        raise RuntimeError(f"code archive not available ({r.status_code}): {r.text[:300]}")
    target.parent.mkdir(parents=True, exist_ok=True)
    async with scratch_dir(f".{target.name}.", target.parent) as tmp:  # a dir of its own; gone after
        await asyncio.to_thread(_unpack, r.content, tmp)  # an archive of thousands of files: off the loop
        try:
            tmp.rename(target)
        except OSError:  # unpacked meanwhile by another process's start of the same code
            pass
    log.info("code %s of %s: %d bytes fetched and unpacked in %.0f ms", target.name[:12], c.deployment_id,
             len(r.content), (time.monotonic() - began) * 1000)


def _unpack(archive: bytes, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        extract_data(tar, into)  # refuses absolute paths, .. and links out (PEP 706)
    os.chmod(into, 0o755)
