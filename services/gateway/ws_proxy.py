"""WebSockets to endpoints and boxes: `/endpoint/NAME[/vN|/latest][/...]` and `/box/NAME/...` upgraded.

An upgrade is authenticated like an HTTP call (the `User` dependency: a bearer token; refused with
401 before it is accepted) and resolved like one (another workspace's endpoint or box is 404). It
then takes a slot on a ready container the way an HTTP call does (router.acquire: a connection that
arrives while none is ready waits while one is requested, placed, started or restored; 429, 503 or
502 as for HTTP), opens the same upgrade to the container, and only then accepts the client, with
the subprotocol the container chose. From there ws_relay pumps both ways; the slot is the
connection's until it ends, so a container's concurrency counts its open WebSockets.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
from fastapi import HTTPException
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocket

from levers9.contracts import uuid7
from levers9.runtime import telemetry
from levers9.runtime.ws_relay import Limits, relay
from levers9.runtime.ws_rules import forwarded_headers, handshake_refusal, kind_refusal, short_reason, subprotocols

from . import proxy
from .callers import Caller
from .router import DeploymentRouter, Slot
from .routes_invoke import NOT_ACQUIRED, STOPPING_HEADER, STOPPING_RETRIES, meter, not_acquired, requester
from .state import Deployment
from .state import Gateway as GatewayState

log = logging.getLogger(__name__)


class Refused(Exception):
    """The container refused the upgrade (its status), or could not be reached: the client is denied."""

    def __init__(self, status: int, detail: str, stopping: bool = False) -> None:
        super().__init__(detail)
        self.status, self.detail, self.stopping = status, detail, stopping


def limits(gw: GatewayState) -> Limits:
    g = gw.settings.gateway
    return Limits(max_message_bytes=g.websocket_max_message_bytes, idle_timeout_s=g.websocket_idle_timeout_s)


def offered(websocket: WebSocket) -> list[str]:
    """The subprotocols the client offers: the server puts them in the scope (wsproto takes the header
    out of the scope's headers), or they are still in the headers."""
    return list(websocket.scope.get("subprotocols") or ()) or subprotocols(list(websocket.headers.items()))


async def open_upstream(gw: GatewayState, websocket: WebSocket, slot: Slot, subpath: str,
                        timeout: float) -> aiohttp.ClientWebSocketResponse:
    """The same upgrade, opened to the container: Unreached when it cannot be connected to (the
    connection may go to another container), Refused when it answered anything but 101."""
    headers = list(websocket.headers.items())
    url = proxy.target_url(slot.address, subpath, websocket.url.query)
    try:
        async with asyncio.timeout(timeout):
            return await gw.session.ws_connect(
                url, headers=forwarded_headers(headers), protocols=offered(websocket),
                max_msg_size=gw.settings.gateway.websocket_max_message_bytes, autoping=True,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=10.0))
    except proxy.NOT_DELIVERED as exc:
        raise proxy.Unreached(f"the container did not answer: {type(exc).__name__}: {exc}") from exc
    except aiohttp.WSServerHandshakeError as exc:
        stopping = exc.status == 503 and STOPPING_HEADER in (exc.headers or {})
        raise Refused(handshake_refusal(exc.status), f"the app refused the WebSocket: {exc.status} {exc.message}",
                      stopping) from exc
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise Refused(502, f"the container did not take the WebSocket: {type(exc).__name__}: {exc}") from exc


async def connect(gw: GatewayState, websocket: WebSocket, router_: DeploymentRouter, dep: Deployment,
                  caller: Caller, subpath: str, name: str, correlation: str
                  ) -> tuple[Slot, aiohttp.ClientWebSocketResponse] | JSONResponse:
    """A slot and the container's side of the connection, or the answer that denies the upgrade. A
    container that is stopping or cannot be reached is dropped and another one tried, as for HTTP."""
    timeout = float(dep.spec.timeout_seconds)
    request_container = requester(gw, dep, caller, correlation)
    failure = JSONResponse({"detail": "no container took the WebSocket", "correlation_id": correlation},
                           status_code=502)
    for attempt in range(1 + STOPPING_RETRIES):
        try:
            slot = await router_.acquire(timeout, request_container)
        except NOT_ACQUIRED as exc:
            return not_acquired(exc, name, correlation)
        try:
            return slot, await open_upstream(gw, websocket, slot, subpath, timeout)
        except proxy.Unreached as exc:
            await router_.release(slot)
            await router_.update(slot.container_id, "unreachable")
            failure = JSONResponse({"detail": str(exc), "correlation_id": correlation}, status_code=502)
        except Refused as exc:
            await router_.release(slot)
            failure = JSONResponse({"detail": exc.detail, "correlation_id": correlation}, status_code=exc.status)
            if not exc.stopping:
                return failure
            await router_.update(slot.container_id, "stopping")
        except BaseException:
            await router_.release(slot)
            raise
        log.warning("container %s at %s did not take the WebSocket (try %d); it goes elsewhere",
                    slot.container_id, slot.address, attempt + 1)
    return failure


async def close_cut(websocket: WebSocket, cut: proxy.Cut) -> None:
    """Tell the client its connection's container ended (1011, with why); it may have gone already."""
    try:
        await websocket.close(code=1011, reason=short_reason(str(cut)))
    except Exception:  # noqa: BLE001 - a client already gone needs no close
        log.debug("the client of a cut WebSocket was gone", exc_info=True)


async def serve(gw: GatewayState, websocket: WebSocket, caller: Caller, dep: Deployment, subpath: str,
                name: str) -> None:
    """Connect the client's WebSocket to a container of `dep` and relay it until either side ends."""
    began = time.monotonic()
    refusal = kind_refusal(dep.spec.code.kind, name)
    if refusal:
        raise HTTPException(400, refusal)
    correlation = uuid7()
    telemetry.correlation_id.set(correlation)
    router_ = await gw.router_for(dep)
    got = await connect(gw, websocket, router_, dep, caller, subpath, name, correlation)
    if isinstance(got, JSONResponse):
        meter(gw, dep, got.status_code, began, None)
        await websocket.send_denial_response(got)
        return
    slot, upstream = got
    try:
        await websocket.accept(subprotocol=upstream.protocol,
                               headers=[(proxy.CONTAINER_HEADER.encode(), slot.container_id.encode())])
        meter(gw, dep, 101, began, None)
        try:
            async with proxy.cut_if_ended(slot):  # a container gone with its connection left open
                ending = await relay(websocket, upstream, limits(gw))
        except proxy.Cut as exc:
            log.warning("WebSocket to %s: %s", name, exc)
            await close_cut(websocket, exc)
            return
        log.info("WebSocket to %s (container %s) ended: %s %s", name, slot.container_id, ending.by, ending.code)
    finally:
        if not upstream.closed:
            await upstream.close()
        await router_.release(slot)
