"""Serving the node content cache (levers9.worker.images.node_cache) from a worker: the first worker of
a node binds its port and serves it for the whole node; a later one finds the port taken and shares
that one (or exits, saying why, when it is another home's)."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket

from levers9.runtime.config import Settings

from .node_cache import NodeCache, cache_app, shared_cache_or_exit

log = logging.getLogger("levers9.worker.images.cache_server")


async def serve_cache(cache: NodeCache, settings: Settings, cache_url: str, stop: asyncio.Event) -> None:
    """The node content cache; the first worker of a node serves it, the others share it."""
    import uvicorn  # the server only where a cache is served

    from levers9.runtime.service import _Server
    sock = bind_unless_taken(settings.process.http_host, settings.images.cache_port)
    if sock is None:  # uvicorn would exit the process on a taken port
        await shared_cache_or_exit(cache_url, settings)  # another home's would fill from its S3
        return
    server = _Server(uvicorn.Config(cache_app(cache), log_config=None, access_log=False, lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]), name="node cache")
    stopped = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    if task in done:  # ended by itself: say why (an exception ends this loop, and the service)
        stopped.cancel()
        await task
        log.warning("node cache: the server at %s stopped by itself", cache_url)
        return
    server.should_exit = True
    await task
    await cache.close()  # its S3 client lives as long as the server


def bind_unless_taken(host: str, port: int) -> socket.socket | None:
    """A socket bound to host:port, or None when another process listens there."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # not past a live listener: TIME_WAIT only
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            return None
        raise
    return sock
