"""The dashboard's client of the gateway: a GET that meets a kept connection the gateway had just
closed is sent once more on a new one; a change (POST) is never sent twice; a gateway that does not
answer is GatewayDown with its address."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from levers9.dashboard.upstream import GatewayDown, Upstream


def upstream(failures: list[Exception]) -> tuple[Upstream, list[str]]:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.method)
        if failures:
            raise failures.pop(0)
        return httpx.Response(200, json={"ok": True})

    return Upstream("http://gw:1", httpx.AsyncClient(transport=httpx.MockTransport(handler))), seen


def test_a_get_on_a_connection_the_gateway_closed_is_sent_again():
    up, seen = upstream([httpx.ReadError("reset")])
    assert asyncio.run(up.get("t", "/api/v1/tasks")).json() == {"ok": True}
    assert seen == ["GET", "GET"]


def test_a_post_is_never_sent_twice_and_a_dead_gateway_is_named():
    up, seen = upstream([httpx.ReadError("reset")])
    with pytest.raises(GatewayDown, match="http://gw:1"):
        asyncio.run(up.request("POST", "t", "/api/v1/tasks/x/cancel"))
    assert seen == ["POST"]
    up, seen = upstream([httpx.ConnectError("refused")])
    with pytest.raises(GatewayDown, match="ConnectError"):
        asyncio.run(up.get("t", "/api/v1/tasks"))
    assert seen == ["GET"]  # refused: not a stale connection, nothing to try again on
    up, seen = upstream([httpx.ReadError("a"), httpx.ReadError("b")])
    with pytest.raises(GatewayDown):
        asyncio.run(up.get("t", "/api/v1/tasks"))
    assert seen == ["GET", "GET"]


def test_a_streamed_get_is_sent_again_on_a_stale_connection_and_a_streamed_body_never():
    up, seen = upstream([httpx.RemoteProtocolError("closed")])
    answer = asyncio.run(up.open_stream("GET", "t", "/box/lab/nb/lab/static/theme.css"))
    assert answer.status_code == 200 and seen == ["GET", "GET"]

    async def body():
        yield b"x"
    up, seen = upstream([httpx.ReadError("reset")])
    with pytest.raises(GatewayDown):
        asyncio.run(up.open_stream("PUT", "t", "/box/lab/nb/lab/api/contents/a", content=body()))
    assert seen == ["PUT"]
