"""An ASGI app served on a free loopback port for the length of a block (node caches in these tests)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator

import uvicorn

from levers9.runtime.service import _Server
from levers9.stack import free_port


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """Yield the app's base URL once it listens; stop it on the way out."""
    port = free_port()
    server = _Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="off"))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
