"""The gateway's WebSocket proxy on a fake state (tests/unit/test_gateway_routes.py), served by a real
uvicorn, to a real aiohttp WebSocket server standing in for the container. Hostile first: no token,
an unknown one or a worker's is refused before the upgrade; another workspace's endpoint or box is
404; the container never sees the caller's token; a message over the limit closes both sides with
1009. Then: an echo through /endpoint/ and /box/ (path and query as sent, the subprotocol the
container chose), closing either side closes the other, the idle timeout, the container's refusal
of the upgrade, and a connection that waits for a container to start."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, AsyncIterator

import aiohttp
import pytest
import uvicorn
from aiohttp import web
from test_gateway_routes import OTHER, USER, WORKER, gw, spec_json  # noqa: F401

from levers9.contracts import events as E
from levers9.gateway import router as gateway_router

ROWS = "AND status='active' ORDER BY version DESC"
CONTAINERS = "AND deployment_id=$2 AND status NOT IN"


def row(kind: str = "asgi", workspace: str = "default", **spec: Any) -> dict:
    code = {"kind": kind, "module": "" if kind == "box" else "app", "handler": "" if kind == "box" else "h"}
    over = {"name": "web", "code": code, **spec}
    if kind == "box":
        over["box"] = {"command": ["srv"], "port": 8000}
    return {"workspace": workspace, "deployment_id": "web-v1", "name": "web", "version": 1, "status": "active",
            "spec": json.dumps(json.loads(spec_json(**over)))}


class Container:
    """An aiohttp WebSocket server: echoes, and records what it saw and how each connection ended."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        self.closed: asyncio.Queue = asyncio.Queue()
        self.refuse = 0
        self.close_with: int | None = None
        self.runner: web.AppRunner | None = None
        self.address = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.refuse:
            return web.Response(status=self.refuse, text="no")
        ws = web.WebSocketResponse(protocols=("b.v1",), max_msg_size=0)
        await ws.prepare(request)
        self.seen.append({"path": request.raw_path, "auth": request.headers.get("Authorization", ""),
                          "protocol": ws.ws_protocol})
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT and msg.data.startswith("big:"):
                await ws.send_str("y" * int(msg.data[4:]))
            elif self.close_with is not None:
                await ws.close(code=self.close_with, message=b"app says bye")
            elif msg.type == aiohttp.WSMsgType.TEXT:
                await ws.send_str(msg.data)
            else:
                await ws.send_bytes(msg.data)
        await self.closed.put(ws.close_code)
        return ws

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.address = f"http://127.0.0.1:{self.runner.addresses[0][1]}"


@contextlib.asynccontextmanager
async def served(gw, container: Container | None = None, **settings: Any) -> AsyncIterator[str]:  # noqa: F811
    """The gateway on a real port (its URL); `container` ready as c1 of web-v1 unless None."""
    if settings:
        gw.settings = gw.settings.with_(**settings)
    if container is not None:
        await container.start()
        gw.pool.answer(CONTAINERS, [{"container_id": "c1", "status": "ready", "address": container.address}])
    gw.session = aiohttp.ClientSession()
    server = uvicorn.Server(uvicorn.Config(gw.app(), host="127.0.0.1", port=0, lifespan="off", log_config=None))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        await gw.session.close()
        if container is not None and container.runner is not None:
            await container.runner.cleanup()


async def refused(url: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
            await s.ws_connect(url, headers=headers)
    return caught.value.status


@contextlib.asynccontextmanager
async def connected(url: str, token: str = USER, **kw: Any) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    async with aiohttp.ClientSession() as s, s.ws_connect(url, headers={"Authorization": f"Bearer {token}"},
                                                          **kw) as ws:
        yield ws


# ---- hostile --------------------------------------------------------------------------------------------

async def test_no_token_an_unknown_one_or_a_workers_is_refused_before_the_upgrade(gw):  # noqa: F811
    gw.pool.answer(ROWS, [row()])
    container = Container()
    async with served(gw, container) as base:
        for path in ("/endpoint/web", "/endpoint/web/ws", "/box/web/", "/box/web"):
            assert await refused(base + path, None) == 401
            assert await refused(base + path, "l9_unknown") == 401
            assert await refused(base + path, WORKER) == 403
    assert container.seen == []


async def test_another_workspaces_endpoint_or_box_is_not_found(gw):  # noqa: F811
    for kind, path in (("asgi", "/endpoint/web/ws"), ("box", "/box/web/ws")):
        gw.deployments.clear()
        gw.pool.answer(ROWS, [])  # the query is the caller's workspace's (`other`): no such deployment there
        async with served(gw, Container()) as base:
            assert await refused(base + path, OTHER) == 404, path
            assert await refused(base + "/endpoint/nope", USER) == 404


async def test_a_function_endpoint_or_an_endpoint_called_as_a_box_takes_no_websocket(gw):  # noqa: F811
    gw.pool.answer(ROWS, [row("endpoint")])
    async with served(gw, Container()) as base:
        assert await refused(base + "/endpoint/web", USER) == 400
        assert await refused(base + "/box/web/", USER) == 404


async def test_a_message_over_the_limit_closes_both_sides_with_1009(gw):  # noqa: F811
    gw.pool.answer(ROWS, [row()])
    container = Container()
    async with served(gw, container, websocket_max_message_bytes=100) as base:
        async with connected(base + "/endpoint/web") as ws:
            await ws.send_str("x" * 101)
            msg = await ws.receive()
            assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1009, msg
        assert await asyncio.wait_for(container.closed.get(), 5) == 1009
        async with connected(base + "/endpoint/web") as ws:
            await ws.send_str("big:101")  # the container's answer is over the limit
            msg = await ws.receive()
            assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1009, msg
        assert await asyncio.wait_for(container.closed.get(), 5) == 1009


# ---- the relay --------------------------------------------------------------------------------------------

async def test_an_echo_through_the_endpoint_and_the_box_without_the_callers_token(gw):  # noqa: F811
    container = Container()
    gw.pool.answer(ROWS, [row()])
    async with served(gw, container) as base:
        async with connected(base + "/endpoint/web/latest/chat?room=a%20b", protocols=("a.v1", "b.v1")) as ws:
            assert ws.protocol == "b.v1"
            await ws.send_str("hello")
            assert await ws.receive_str() == "hello"
            await ws.send_bytes(b"\x00\x01")
            assert await ws.receive_bytes() == b"\x00\x01"
        gw.deployments.clear()
        gw.pool.answer(ROWS, [row("box")])
        async with connected(base + "/box/web/a%2Fb/c?x=1") as ws:
            await ws.send_str("boxed")
            assert await ws.receive_str() == "boxed"
    assert [s["path"] for s in container.seen] == ["/chat?room=a%20b", "/a%2Fb/c?x=1"]
    assert all(s["auth"] == "" for s in container.seen)


async def test_closing_either_side_closes_the_other_and_frees_the_slot(gw):  # noqa: F811
    container = Container()
    gw.pool.answer(ROWS, [row()])
    async with served(gw, container) as base:
        async with connected(base + "/endpoint/web") as ws:
            await ws.send_str("hi")
            await ws.receive_str()
            await ws.close(code=4002, message=b"client leaves")
        assert await asyncio.wait_for(container.closed.get(), 5) == 4002
        container.close_with = 4001
        async with connected(base + "/endpoint/web") as ws:
            await ws.send_str("hi")
            msg = await ws.receive()
            assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 4001 and msg.extra == "app says bye"
        router = gw.routers["default/web-v1"]
        for _ in range(100):
            if router.containers["c1"].inflight == 0:
                break
            await asyncio.sleep(0.02)
        assert router.containers["c1"].inflight == 0


async def test_an_idle_connection_is_closed_with_1001(gw):  # noqa: F811
    container = Container()
    gw.pool.answer(ROWS, [row()])
    async with served(gw, container, websocket_idle_timeout_s=1) as base:
        async with connected(base + "/endpoint/web") as ws:
            msg = await asyncio.wait_for(ws.receive(), 5)
            assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1001 and "no message" in msg.extra
        assert await asyncio.wait_for(container.closed.get(), 5) == 1001


async def test_a_connection_to_a_container_that_ended_is_closed_with_1011_and_its_reason(gw, monkeypatch):  # noqa: F811
    """A container killed with its connection left open (out of memory, its network torn down) would
    hold the client's WebSocket until the idle timeout: its end cuts it, with the container's reason."""
    monkeypatch.setattr(gateway_router, "CUT_GRACE_S", 0.2)
    container = Container()
    gw.pool.answer(ROWS, [row()])
    async with served(gw, container) as base:
        async with connected(base + "/endpoint/web") as ws:
            await ws.send_str("hi")
            assert await ws.receive_str() == "hi"
            router = gw.routers["default/web-v1"]
            slot = router.containers["c1"]
            await router.update("c1", "failed", reason="out of memory")  # the container never closes its side
            msg = await asyncio.wait_for(ws.receive(), 30)
            assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1011 and "out of memory" in msg.extra
        for _ in range(100):
            if slot.inflight == 0:
                break
            await asyncio.sleep(0.02)
        assert slot.inflight == 0 and not slot.watches


async def test_the_apps_refusal_of_the_upgrade_reaches_the_client(gw):  # noqa: F811
    container = Container()
    container.refuse = 403
    gw.pool.answer(ROWS, [row()])
    async with served(gw, container) as base:
        assert await refused(base + "/endpoint/web", USER) == 403
        container.refuse = 500
        assert await refused(base + "/endpoint/web", USER) == 502
        assert gw.routers["default/web-v1"].containers["c1"].inflight == 0


async def test_a_connection_waits_while_a_container_is_requested_and_started(gw):  # noqa: F811
    container = Container()
    await container.start()
    gw.pool.answer(ROWS, [row()])
    async with served(gw) as base:
        async def start_one() -> None:
            while not [e for e in gw.bus.events() if isinstance(e, E.ContainerRequested)]:
                await asyncio.sleep(0.02)
            [requested] = [e for e in gw.bus.events() if isinstance(e, E.ContainerRequested)]
            await gw.routers["default/web-v1"].update(requested.container_id, "ready", container.address)
        starter = asyncio.create_task(start_one())
        async with connected(base + "/endpoint/web") as ws:
            await ws.send_str("cold")
            assert await ws.receive_str() == "cold"
        await starter
    await container.runner.cleanup()
