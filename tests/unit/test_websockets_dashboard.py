"""The dashboard's WebSocket proxy (routes_websockets.py), served by uvicorn, to a stand-in gateway
(aiohttp: whoami and an echoing WebSocket that records what it was sent). Hostile first: no session
and no token is 401; a forged cookie is no session; a session's upgrade from another site's page
(or with no Origin) is 403; the session's cookies never reach the gateway; the gateway's refusal
(another workspace's endpoint: 404) reaches the browser. Then a session's WebSocket goes through
with the session's token, and a bearer's with its own."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp
import pytest
import uvicorn
from aiohttp import web

from levers9.dashboard.app import Config, create
from levers9.dashboard.routes_websockets import page_origin

TOKENS = {"tok-a": "ws-a", "tok-b": "ws-b"}


class Gateway:
    def __init__(self) -> None:
        self.seen: list[dict] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def whoami(self, request: web.Request) -> web.Response:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if token not in TOKENS:
            return web.json_response({"detail": "unknown"}, status=401)
        return web.json_response({"workspace": TOKENS[token], "token_id": "t", "scope": "workspace"})

    async def endpoint(self, request: web.Request) -> web.StreamResponse:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if TOKENS.get(token) != "ws-a":  # the endpoint is ws-a's: another workspace's caller gets 404
            return web.json_response({"detail": "no endpoint"}, status=404)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.seen.append({"path": request.raw_path, "auth": request.headers.get("Authorization", ""),
                          "cookie": request.headers.get("Cookie", "")})
        async for msg in ws:
            await ws.send_str(msg.data)
        return ws

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/whoami", self.whoami)
        app.router.add_get("/{tail:(endpoint|box)/.*}", self.endpoint)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"


@contextlib.asynccontextmanager
async def dashboard(tmp_path: Path) -> AsyncIterator[tuple[str, Any, Gateway]]:
    gw = Gateway()
    await gw.start()
    front, app = create(Config(gateway_url=gw.url, home=tmp_path))
    server = uvicorn.Server(uvicorn.Config(front, host="127.0.0.1", port=0, lifespan="off", log_config=None))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    base = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    try:
        yield base, app, gw
    finally:
        server.should_exit = True
        await task
        await app.state.upstream.close()
        assert gw.runner is not None
        await gw.runner.cleanup()


def session_cookie(app: Any, token: str = "tok-a") -> str:
    sealed, _ = app.state.sealer.seal(token, TOKENS[token])
    return sealed


async def refused(url: str, headers: dict[str, str]) -> int:
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
            await s.ws_connect(url, headers=headers)
    return caught.value.status


# ---- hostile --------------------------------------------------------------------------------------------

async def test_no_session_a_forged_one_or_an_unknown_token_is_refused(tmp_path):
    async with dashboard(tmp_path) as (base, _, gw):
        url = base + "/endpoint/web"
        assert await refused(url, {"Origin": base}) == 401
        assert await refused(url, {"Origin": base, "Cookie": "levers9_session=forged"}) == 401
        assert await refused(url, {"Authorization": "Bearer tok-nope"}) == 401
    assert gw.seen == []


async def test_a_sessions_upgrade_from_another_sites_page_is_refused(tmp_path):
    async with dashboard(tmp_path) as (base, app, gw):
        cookie = f"levers9_session={session_cookie(app)}"
        for origin in ("https://evil.example", "null"):
            assert await refused(base + "/endpoint/web", {"Cookie": cookie, "Origin": origin}) == 403
        assert await refused(base + "/box/web/", {"Cookie": cookie}) == 403  # no Origin: not a browser's page
    assert gw.seen == []


async def test_another_workspaces_endpoint_is_the_gateways_404(tmp_path):
    async with dashboard(tmp_path) as (base, app, _):
        cookie = f"levers9_session={session_cookie(app, 'tok-b')}"
        assert await refused(base + "/endpoint/web", {"Cookie": cookie, "Origin": base}) == 404


# ---- through ----------------------------------------------------------------------------------------------

async def test_a_session_goes_through_with_its_token_and_without_its_cookies(tmp_path):
    async with dashboard(tmp_path) as (base, app, gw):
        cookie = f"levers9_session={session_cookie(app)}; levers9_csrf=c; theme=dark"
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(base + "/endpoint/web/chat?x=1", headers={"Cookie": cookie, "Origin": base}) as ws:
                await ws.send_str("hello")
                assert await ws.receive_str() == "hello"
            async with s.ws_connect(base + "/box/files/", headers={"Authorization": "Bearer tok-a"}) as ws:
                await ws.send_str("boxed")
                assert await ws.receive_str() == "boxed"
    assert gw.seen == [{"path": "/endpoint/web/chat?x=1", "auth": "Bearer tok-a", "cookie": "theme=dark"},
                       {"path": "/box/files/", "auth": "Bearer tok-a", "cookie": ""}]


def test_the_pages_origin_as_seen_from_an_upgrade():
    assert page_origin("ws", "dash:8080") == "http://dash:8080"
    assert page_origin("wss", "dash.example") == "https://dash.example"
