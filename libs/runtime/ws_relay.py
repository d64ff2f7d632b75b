"""Relaying one WebSocket: a client's (a Starlette WebSocket, accepted) to an upstream's (an aiohttp
client WebSocket, connected), both directions at once, until one side ends, a message is over the
limit or the connection is silent for the idle timeout; then the other side is closed with the code
ws_rules.closing chooses. The gateway relays to containers, the dashboard to the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable

import aiohttp
from starlette.websockets import WebSocket, WebSocketState

from .ws_rules import TOO_BIG, Ending, closing, idle_left, over_limit, short_reason

GONE = (aiohttp.ClientError, ConnectionError, RuntimeError, OSError)  # a side that can no longer be written


@dataclass
class Limits:
    max_message_bytes: int = 0  # 0: no limit
    idle_timeout_s: float = 0  # 0: never closed for silence


@dataclass
class Activity:
    clock: Callable[[], float] = time.monotonic
    last: float = field(default=0.0)
    messages: int = 0

    def touch(self) -> None:
        self.last = self.clock()
        self.messages += 1


async def client_to_upstream(client: WebSocket, upstream: aiohttp.ClientWebSocketResponse, limits: Limits,
                             seen: Activity) -> Ending:
    while True:
        message = await client.receive()
        if message["type"] == "websocket.disconnect":
            return Ending("client", message.get("code"), message.get("reason") or "")
        data = message.get("bytes") if message.get("bytes") is not None else message.get("text")
        if data is None:
            continue
        if over_limit(data, limits.max_message_bytes):
            return Ending("too big", TOO_BIG, side="client")
        seen.touch()
        try:
            await (upstream.send_str(data) if isinstance(data, str) else upstream.send_bytes(data))
        except GONE as exc:
            return Ending("upstream", None, f"{type(exc).__name__}: {exc}")


async def upstream_to_client(client: WebSocket, upstream: aiohttp.ClientWebSocketResponse, limits: Limits,
                             seen: Activity) -> Ending:
    while True:
        message = await upstream.receive()
        if message.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
            if over_limit(message.data, limits.max_message_bytes):
                return Ending("too big", TOO_BIG, side="upstream")
            seen.touch()
            try:
                if message.type == aiohttp.WSMsgType.TEXT:
                    await client.send_text(message.data)
                else:
                    await client.send_bytes(message.data)
            except GONE:
                return Ending("client", None)
        elif message.type == aiohttp.WSMsgType.CLOSE:
            return Ending("upstream", message.data, message.extra or "")
        elif message.type == aiohttp.WSMsgType.ERROR:
            code = getattr(message.data, "code", None)
            if code == TOO_BIG:  # aiohttp's own limit (max_msg_size) saw it first
                return Ending("too big", TOO_BIG, side="upstream")
            return Ending("upstream", None, f"the connection failed: {message.data}")
        elif message.type in (aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
            return Ending("upstream", upstream.close_code)


async def relay(client: WebSocket, upstream: aiohttp.ClientWebSocketResponse, limits: Limits,
                clock: Callable[[], float] = time.monotonic) -> Ending:
    """Pump both ways until the connection ends; close whatever side is still open; how it ended."""
    seen = Activity(clock, clock())
    tasks = {asyncio.ensure_future(client_to_upstream(client, upstream, limits, seen)),
             asyncio.ensure_future(upstream_to_client(client, upstream, limits, seen))}
    try:
        ending = await first_ending(tasks, seen, limits)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    await close_sides(client, upstream, ending, limits)
    return ending


async def first_ending(tasks: set[asyncio.Task[Ending]], seen: Activity, limits: Limits) -> Ending:
    while True:
        left = idle_left(seen.last, seen.clock(), limits.idle_timeout_s)
        if left is not None and left <= 0:
            return Ending("idle")
        done, _ = await asyncio.wait(tasks, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            exc = task.exception()
            if exc is not None:  # a pump's own failure: the connection ends, as the container's failure
                return Ending("upstream", None, short_reason(f"{type(exc).__name__}: {exc}"))
            return task.result()


async def close_sides(client: WebSocket, upstream: aiohttp.ClientWebSocketResponse, ending: Ending,
                      limits: Limits) -> None:
    plan = closing(ending, limits.max_message_bytes, limits.idle_timeout_s)
    if plan.client is not None and client.application_state == WebSocketState.CONNECTED:
        with contextlib.suppress(*GONE):
            await client.close(*plan.client)
    if plan.upstream is not None and not upstream.closed:
        with contextlib.suppress(*GONE, asyncio.TimeoutError):
            await upstream.close(code=plan.upstream[0], message=plan.upstream[1].encode())
    if not upstream.closed:
        with contextlib.suppress(*GONE, asyncio.TimeoutError):
            await upstream.close()
