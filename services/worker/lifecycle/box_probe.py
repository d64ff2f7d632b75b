"""The readiness probe of a box: from the worker to the container's address, a TCP connect (closed at
once) or a GET of its ready_path, and nothing more. What it saw is a `boxes.Probe`; whether that is
ready is levers9.worker.lifecycle.boxes.ready (pure)."""

from __future__ import annotations

import asyncio
import contextlib

import httpx

from levers9.contracts.spec import BoxOptions

from .boxes import Probe, target

CONNECT_S = 1.0  # a port on the bridge answers in microseconds; a longer wait is a dropped SYN


async def probe(client: httpx.AsyncClient, address: str, box: BoxOptions) -> Probe:
    """One look at the box's port: connect (and close), or GET `ready_path` when it has one."""
    if box.ready_path is not None:
        try:
            r = await client.get(f"{address}{box.ready_path}", headers={"Connection": "close"})
        except httpx.HTTPError as exc:
            return Probe(False, error=f"{type(exc).__name__}: {exc}"[:200])
        return Probe(True, status=r.status_code)
    host, port = target(address)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_S)
    except (OSError, asyncio.TimeoutError) as exc:
        return Probe(False, error=f"{type(exc).__name__}: {exc}"[:200])
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return Probe(True)
