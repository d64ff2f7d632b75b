"""WebSockets to endpoints and boxes through the dashboard: `/endpoint/...` and `/box/...` upgraded
here are opened to the gateway's same path with the caller's own token, and relayed (ws_relay).

A browser cannot set headers on a WebSocket, so its session cookie is its credential here: the
dashboard opens it and sends the session's token to the gateway, which decides as for any caller
(another workspace's endpoint or box: 404). Because a page of any site can open a WebSocket to us
and the browser would send our cookie with it, a cookie-authenticated upgrade must come with this
dashboard's own Origin (ws_rules.cross_site_upgrade). A program may send `Authorization: Bearer`
instead (checked by the gateway's whoami). Nothing of the session goes on: not the token to the
container (the gateway drops it), not the session's cookies to the gateway. The size and idle
limits are the gateway's. The path goes on as the caller wrote it (no dot segment resolved, no
escape decoded); routes_notebooks relays `/nb/NAME/...` sockets through `proxy` with its own path.
"""

from __future__ import annotations

from urllib.parse import quote

import aiohttp
import yarl
from fastapi import APIRouter, WebSocket
from fastapi.responses import JSONResponse
from starlette.types import Scope

from levers9.runtime.ws_relay import Limits, relay
from levers9.runtime.ws_rules import cross_site_upgrade, forwarded_headers, handshake_refusal, subprotocols

from .auth import NOT_SIGNED_IN
from .sessions import CSRF_COOKIE, SESSION_COOKIE, Sealer
from .upstream import GatewayDown, Upstream

router = APIRouter()

SESSION_COOKIES = frozenset({SESSION_COOKIE, CSRF_COOKIE})
CONTAINER_HEADER = "x-levers9-container-id"
URL_SAFE = "!#$%&'()*+,/:;=?@[]~"  # kept as they are; anything else (a space, a byte over 127) is escaped


def page_origin(ws_scheme: str, host: str) -> str:
    """The Origin of this dashboard's own pages, as seen from a WebSocket upgrade to it."""
    return f"{'https' if ws_scheme == 'wss' else 'http'}://{host}"


def raw_path(scope: Scope) -> str:
    """The request's path as the caller wrote it (percent-encoding kept), without its query."""
    return (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")


def gateway_ws_url(base_url: str, path: str, query: str) -> yarl.URL:
    """The gateway's URL for `path` and `query`, sent as written: no dot segment resolved, no
    percent-escape decoded (a plain string would have yarl turn `/box/x/%2e%2e/` into `/`)."""
    url = base_url.rstrip("/") + path + (f"?{query}" if query else "")
    return yarl.URL(quote(url, safe=URL_SAFE), encoded=True)


async def token_of(websocket: WebSocket) -> tuple[str, int, str]:
    """(the caller's token, 0, "") or ("", status, why it is refused)."""
    upstream: Upstream = websocket.app.state.upstream
    scheme, _, token = websocket.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        try:
            who = await upstream.whoami(token.strip())
        except GatewayDown as exc:
            return "", 502, str(exc)
        if who is None or who.get("scope", "workspace") != "workspace":
            return "", 401, "this token is unknown or revoked"
        return token.strip(), 0, ""
    sealer: Sealer = websocket.app.state.sealer
    session = sealer.open(websocket.cookies.get(SESSION_COOKIE))
    if session is None:
        return "", 401, NOT_SIGNED_IN
    why = cross_site_upgrade(websocket.headers.get("origin"),
                             page_origin(websocket.url.scheme, websocket.headers.get("host", websocket.url.netloc)))
    if why:
        return "", 403, f"refused: a WebSocket with this dashboard's session must come from its own pages ({why})"
    return session.token, 0, ""


async def deny(websocket: WebSocket, status: int, detail: str) -> None:
    await websocket.send_denial_response(JSONResponse({"detail": detail}, status_code=status))


async def proxy(websocket: WebSocket, path: str) -> None:
    """Relay `websocket` to the gateway's `path` (raw, as it goes: the caller's query is added)."""
    token, status, why = await token_of(websocket)
    if status:
        return await deny(websocket, status, why)
    upstream: Upstream = websocket.app.state.upstream
    headers = forwarded_headers(list(websocket.headers.items()), SESSION_COOKIES)
    headers["Authorization"] = f"Bearer {token}"
    protocols = list(websocket.scope.get("subprotocols") or ()) or subprotocols(list(websocket.headers.items()))
    async with aiohttp.ClientSession() as session:
        try:
            gateway = await session.ws_connect(gateway_ws_url(upstream.base_url, path, websocket.url.query),
                                               headers=headers, protocols=protocols, max_msg_size=0,
                                               timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=10.0))
        except aiohttp.WSServerHandshakeError as exc:
            status = exc.status if exc.status in (401, 403, 404, 429, 503) else handshake_refusal(exc.status)
            return await deny(websocket, status, f"the gateway refused the WebSocket: {exc.status} {exc.message}")
        except aiohttp.ClientError as exc:
            return await deny(websocket, 502, f"the gateway at {upstream.base_url} does not answer: {exc}")
        container = gateway._response.headers.get(CONTAINER_HEADER, "")
        await websocket.accept(subprotocol=gateway.protocol,
                               headers=[(CONTAINER_HEADER.encode(), container.encode())] if container else None)
        await relay(websocket, gateway, Limits())


@router.websocket("/endpoint/{rest:path}")
async def endpoint(websocket: WebSocket, rest: str) -> None:
    await proxy(websocket, raw_path(websocket.scope))


@router.websocket("/box/{rest:path}")
async def box(websocket: WebSocket, rest: str) -> None:
    await proxy(websocket, raw_path(websocket.scope))
