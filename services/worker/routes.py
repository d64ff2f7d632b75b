"""The worker's HTTP routes beside /healthz and /metrics: its containers and their logs.

Given only what they read: the live containers (a mapping the worker keeps up to date), a way to open
a container's log (the runtime's, chosen when the worker starts), and the worker's id for messages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, BinaryIO

from fastapi import FastAPI, HTTPException
from fastapi.responses import PlainTextResponse, StreamingResponse

from levers9.worker.lifecycle.placement import Running

FOLLOW_POLL_S = 0.3


def add_routes(app: FastAPI, running: Mapping[str, Running], open_log: Callable[[str], BinaryIO],
               worker_id: str) -> None:
    @app.get("/containers")
    async def containers() -> list[dict[str, Any]]:
        return [{"container_id": c.container_id, "workspace": c.workspace, "deployment_id": c.deployment_id,
                 "address": c.address, "ready": c.ready_at is not None} for c in running.values()]

    @app.get("/containers/{container_id}/logs")
    async def logs(container_id: str, follow: bool = False):
        try:
            f = open_log(container_id)
        except OSError:
            raise HTTPException(404, f"no log for container {container_id!r} on worker {worker_id}") from None
        if not follow:
            with f:
                return PlainTextResponse(f.read().decode(errors="replace"))
        return StreamingResponse(follow_log(f, lambda: container_id in running),
                                 media_type="text/plain")


async def follow_log(log: BinaryIO, alive: Callable[[], bool]) -> AsyncIterator[bytes]:
    """The log (open) as it grows, until the container is gone and everything it wrote was sent."""
    with log as f:
        while True:
            chunk = f.read(65536)
            if chunk:
                yield chunk
                continue
            if not alive():
                return
            await asyncio.sleep(FOLLOW_POLL_S)
