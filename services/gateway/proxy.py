"""The proxy hop: one call forwarded to its container and the answer streamed back.

Small bodies are read whole (no chunked re-encoding); large or unsized ones stream both ways. The
hop owns the router slot it is given: it is released exactly once, when the answer has been sent
(or when forwarding failed). A container that cannot be connected to raises Unreached, so that the
caller may send the call elsewhere; one that took the call and gave no answer raises NotAnswered.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Awaitable, Callable

import aiohttp
import yarl
from fastapi import HTTPException, Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from .router import DeploymentRouter, Slot, Watch

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade", "host", "authorization", "content-length"}
CONNECT_S = 10.0  # a ready container accepts at once; a host cut off would hold the call for its whole timeout
WHOLE_ANSWER_BYTES = 1 << 20  # answers up to this size are read whole, larger ones streamed
CHUNK = 65536
CONTAINER_HEADER = "x-levers9-container-id"  # on every answer a container gave: which one


class Unreached(Exception):
    """The container could not be connected to (refused, unreachable, connect timeout): the call was
    never delivered, so it may go to another container."""


class NotAnswered(Exception):
    """The call was sent but no answer came (the connection broke, the call's timeout passed): it may
    have run, so it is not sent again; the caller answers 502 with this sentence."""


class Cut(NotAnswered):
    """The call was cut before its answer: its container ended (`ended`: "failed: out of memory"), or
    its connection broke while the container was stopping (`ended` ""). Whether it may go elsewhere
    is the caller's to say (routes_invoke.resend_cut)."""

    def __init__(self, message: str, ended: str) -> None:
        super().__init__(message)
        self.ended = ended


class cut_if_ended:  # noqa: N801 - used as `async with cut_if_ended(slot):`, like asyncio.timeout
    """Run the block, unless it still waits CUT_GRACE_S after `slot`'s container ended (router.Watch
    cancels this task then): Cut. As asyncio.timeout does, a cancellation from elsewhere (the caller
    hung up) still comes out as one. A class, not a generator: it wraps every proxied call."""

    __slots__ = ("slot", "watch")

    def __init__(self, slot: Slot) -> None:
        self.slot = slot

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.watch = Watch(task)
        self.slot.watches.add(self.watch)
        if self.slot.ended:
            self.watch.arm()

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        slot, watch = self.slot, self.watch
        slot.watches.discard(watch)
        watch.disarm()
        if watch.cut and kind is not None and issubclass(kind, asyncio.CancelledError) and watch.task.uncancel() == 0:
            raise Cut(f"the container {slot.container_id} ended before it answered ({slot.ended})",
                      slot.ended) from None


NOT_DELIVERED = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
RESET = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)  # after NOT_DELIVERED: a connector error is one


def forward_headers(headers: Any) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}


def target_url(address: str, subpath: str, query: str) -> yarl.URL:
    return yarl.URL(f"{address}/{subpath}" + (f"?{query}" if query else ""), encoded=True)


async def request_body(request: Request, limit: int) -> bytes | AsyncIterator[bytes] | None:
    """The body to forward: whole when sized (or absent), a stream with a limit when chunked."""
    length = int(request.headers.get("content-length") or 0)
    if length or "transfer-encoding" not in request.headers:
        return await request.body() if length else None

    async def stream() -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in request.stream():
            seen += len(chunk)
            if seen > limit:
                raise HTTPException(413, f"the body is over the limit of {limit} bytes")
            yield chunk
    return stream()


async def send(session: aiohttp.ClientSession, method: str, url: yarl.URL, headers: dict[str, str],
               body: Any, timeout: aiohttp.ClientTimeout) -> tuple[aiohttp.ClientResponse, aiohttp.ClientSession | None]:
    """The answer's head, and the one-off session it came on (None: the shared one). A connection the
    container closed or reset before any byte came back (a kept-alive one it had dropped: a restored
    container's, say) is tried once more on a connection of its own, when the body can be sent again;
    the pool may hold more such connections to it."""
    try:
        return await session.request(method, url, headers=headers, data=body, timeout=timeout), None
    except NOT_DELIVERED:
        raise
    except RESET:
        if not isinstance(body, (bytes, type(None))):
            raise  # a streamed body is spent
    fresh = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
    try:
        return await fresh.request(method, url, headers=headers, data=body, timeout=timeout), fresh
    except BaseException:
        await fresh.close()
        raise


async def forward(session: aiohttp.ClientSession, request: Request, address: str, subpath: str, timeout: float,
                  limit: int, router: DeploymentRouter, slot: Slot,
                  timing: Callable[[float], str] | None = None) -> Response:
    """The container's answer to the request; `timing`, given the time the answer's head came back
    (monotonic), makes the Server-Timing value added to the container's own (server_timing.py)."""
    try:
        body = await request_body(request, limit)
        async with cut_if_ended(slot):
            resp, fresh = await send(session, request.method, target_url(address, subpath, request.url.query),
                                     forward_headers(request.headers), body,
                                     aiohttp.ClientTimeout(total=timeout, sock_connect=CONNECT_S))
    except NOT_DELIVERED as exc:
        await router.release(slot)
        raise Unreached(f"the container did not answer: {type(exc).__name__}: {exc}") from exc
    except RESET as exc:
        await router.release(slot)
        if slot.status != "ready":  # cut by its stop (a notebook's dump), not by what the call did
            raise Cut(f"the container {slot.container_id} was stopping and closed the call's connection "
                      f"before answering: {type(exc).__name__}: {exc}", slot.ended) from exc
        raise NotAnswered(f"the container did not answer: {type(exc).__name__}: {exc}") from exc
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        await router.release(slot)
        raise NotAnswered(f"the container did not answer: {type(exc).__name__}: {exc}") from exc
    except BaseException:
        await router.release(slot)
        raise

    released = False

    async def done() -> None:  # once, by whichever ends first: the answer's stream or its background
        nonlocal released
        if released:
            return
        released = True
        resp.release()
        if fresh is not None:
            await fresh.close()
        await router.release(slot)

    head = time.monotonic()
    out_headers = forward_headers(resp.headers)
    out_headers[CONTAINER_HEADER] = slot.container_id  # which container answered
    if timing is not None:
        own = resp.headers.getall("Server-Timing", [])
        out_headers = {k: v for k, v in out_headers.items() if k.lower() != "server-timing"}
        out_headers["Server-Timing"] = ", ".join([*own, timing(head)])
    if resp.content_length is not None and resp.content_length <= WHOLE_ANSWER_BYTES:
        try:
            async with cut_if_ended(slot):
                data = await resp.read()
        finally:
            await done()
        return Response(data, status_code=resp.status, headers=out_headers)
    return StreamingResponse(chunks(resp, slot, done), status_code=resp.status, headers=out_headers,
                             background=BackgroundTask(done))


async def chunks(resp: aiohttp.ClientResponse, slot: Slot, done: Callable[[], Awaitable[None]]
                 ) -> AsyncIterator[bytes]:
    """The answer's body as it comes, cut (the answer to the caller broken off) when its container
    ends: each read is watched on its own, in the task that streams the answer. `done` runs when the
    stream ends however it ends: Starlette runs a response's background only after a whole answer, so
    a stream that failed (or a caller gone, on ASGI 2.4) would have kept its slot for good."""
    parts = resp.content.iter_chunked(CHUNK)
    try:
        while True:
            async with cut_if_ended(slot):
                try:
                    chunk = await parts.__anext__()
                except StopAsyncIteration:
                    return
            yield chunk
    finally:
        await done()
