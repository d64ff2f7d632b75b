"""The runner's WebSockets, in this process (its Runtime and Server on a free port, the user's module
in a temporary folder), reached with aiohttp: a message over the runner's limit closes with 1009, a
frame that breaks the protocol with 1002, an app's refusal is 403, a function endpoint takes no
WebSocket; an ASGI app gets the `websocket` scope (subprotocols, path, query) and echoes text and
bytes, and sees the client's close code; an `@app.realtime` handler, sync or async, with or without
`context`, answers each message with its return value, closes 1011 when it raises, and a plain HTTP
request to it is 426. And the framing itself (ws_frames)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import socket
import textwrap
import threading
import uuid
from pathlib import Path
from typing import Any, Iterator

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.runner import ws_frames as F
from levers9.runner.config import Config
from levers9.runner.runtime import Runtime
from levers9.runner.server import Server

ASGI = """
closed = []

async def app(scope, receive, send):
    assert scope["type"] == "websocket"
    await receive()
    if scope["path"] == "/refuse":
        await send({"type": "websocket.close"})
        return
    protocols = scope["subprotocols"]
    await send({"type": "websocket.accept", "subprotocol": protocols[-1] if protocols else None})
    await send({"type": "websocket.send", "text": scope["path"] + "?" + scope["query_string"].decode()})
    while True:
        m = await receive()
        if m["type"] == "websocket.disconnect":
            closed.append(m["code"])
            return
        if m.get("text") == "bye":
            await send({"type": "websocket.close", "code": 4000, "reason": "app leaves"})
            continue
        await send({"type": "websocket.send", "text": m.get("text"), "bytes": m.get("bytes")})
"""

REALTIME = """
def load():
    return "loaded"

def handler(context, event):
    if event == "boom":
        raise ValueError("boom")
    if isinstance(event, bytes):
        return event[::-1]
    return {"echo": event, "on_start": context.on_start_value, "path": context.path}

async def ahandler(event):
    return None if event == "quiet" else event.upper()
"""


@contextlib.contextmanager
def runner(tmp_path: Path, source: str, kind: str, handler: str, **config: Any) -> Iterator[tuple[str, Runtime]]:
    name = f"ws_app_{uuid.uuid4().hex}"  # a module of its own: its `closed` list is this test's
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    cfg = Config(module=name, handler=handler, kind=kind, app_dir=str(tmp_path), host="127.0.0.1", port=0,
                 concurrency=4, **config)
    rt = Runtime(cfg)
    rt.load()
    assert rt.state == "ready", rt.error
    server = Server(cfg, rt)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", rt
    finally:
        server.shutdown()
        server.server_close()
        rt.loop.call_soon_threadsafe(rt.loop.stop)


async def ws(url: str, **kw: Any) -> tuple[aiohttp.ClientSession, aiohttp.ClientWebSocketResponse]:
    session = aiohttp.ClientSession()
    return session, await session.ws_connect(url, **kw)


# ---- hostile --------------------------------------------------------------------------------------------

async def test_a_message_over_the_runners_limit_closes_with_1009(tmp_path):
    with runner(tmp_path, ASGI, "asgi", "app", max_body=100) as (base, _):
        session, conn = await ws(base + "/x")
        try:
            await conn.receive_str()
            await conn.send_str("x" * 101)
            msg = await conn.receive()
            assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1009
        finally:
            await session.close()


def test_a_frame_that_breaks_the_protocol_closes_with_1002(tmp_path):
    with runner(tmp_path, ASGI, "asgi", "app") as (base, _):
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
            f = s.makefile("rb")
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                head += f.read(1)
            assert head.startswith(b"HTTP/1.1 101") and b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" in head
            F.read_frame(f, 0)  # the app's first message
            s.sendall(F.encode(F.CONT, b"orphan", mask=os.urandom(4)))
            _, op, payload = F.read_frame(f, 0)
            assert op == F.CLOSE and F.parse_close(payload)[0] == 1002


async def test_an_apps_refusal_is_403_and_a_function_endpoint_takes_no_websocket(tmp_path):
    with runner(tmp_path, ASGI, "asgi", "app") as (base, _):
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
                await s.ws_connect(base + "/refuse")
            assert caught.value.status == 403
    with runner(tmp_path, "def hello():\n    return 1\n", "endpoint", "hello") as (base, _):
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
                await s.ws_connect(base + "/")
            assert caught.value.status == 400


# ---- ASGI -------------------------------------------------------------------------------------------------

async def test_an_asgi_app_gets_the_websocket_scope_and_echoes(tmp_path):
    with runner(tmp_path, ASGI, "asgi", "app") as (base, rt):
        session, conn = await ws(base + "/chat/a%20b?room=1", protocols=("x.v1", "y.v1"))
        try:
            assert conn.protocol == "y.v1"
            assert await conn.receive_str() == "/chat/a b?room=1"
            await conn.send_str("hello")
            assert await conn.receive_str() == "hello"
            await conn.send_bytes(b"\x00" * 70000)  # a 64-bit length
            assert await conn.receive_bytes() == b"\x00" * 70000
            await conn.close(code=4001)
        finally:
            await session.close()
        module = __import__(rt.config.module)
        for _ in range(100):
            if module.closed:
                break
            await asyncio.sleep(0.02)
        assert module.closed == [4001]
        session, conn = await ws(base + "/")
        try:
            await conn.receive_str()
            await conn.send_str("bye")
            msg = await conn.receive()
            assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 4000 and msg.extra == "app leaves"
        finally:
            await session.close()


# ---- realtime ---------------------------------------------------------------------------------------------

async def test_a_realtime_handler_answers_each_message_with_its_return_value(tmp_path):
    with runner(tmp_path, REALTIME, "realtime", "handler", on_start="load") as (base, _):
        session, conn = await ws(base + "/rt")
        try:
            await conn.send_str("hi")
            assert await conn.receive_json() == {"echo": "hi", "on_start": "loaded", "path": "/rt"}
            await conn.send_bytes(b"abc")
            assert await conn.receive_bytes() == b"cba"
            await conn.send_str("boom")
            msg = await conn.receive()
            assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1011 and "ValueError: boom" in msg.extra
        finally:
            await session.close()
        async with aiohttp.ClientSession() as s, s.get(base + "/rt") as r:
            assert r.status == 426 and "open a WebSocket" in (await r.json())["error"]
    with runner(tmp_path, REALTIME, "realtime", "ahandler") as (base, _):
        session, conn = await ws(base + "/")
        try:
            await conn.send_str("quiet")  # None: nothing goes back
            await conn.send_str("loud")
            assert await conn.receive_str() == "LOUD"
        finally:
            await session.close()


# ---- framing ----------------------------------------------------------------------------------------------

@given(st.binary(max_size=70000), st.sampled_from([F.TEXT, F.BINARY]), st.booleans())
def test_a_frame_reads_back_as_written(payload, opcode, mask):
    data = F.encode(opcode, payload, mask=os.urandom(4) if mask else None)
    assert F.read_frame(io.BytesIO(data), 0) == (True, opcode, payload)


def test_fragments_join_and_pings_between_them_are_answered():
    m = os.urandom(4)
    data = (F.encode(F.TEXT, b"he", mask=m, fin=False) + F.encode(F.PING, b"p", mask=m)
            + F.encode(F.CONT, b"llo", mask=m))
    pings: list[bytes] = []
    assert F.read_message(io.BytesIO(data), 0, lambda op, p: bool(pings.append(p)) or True) == (F.TEXT, b"hello")
    assert pings == [b"p"]
    with pytest.raises(F.FrameError) as caught:
        F.read_message(io.BytesIO(F.encode(F.TEXT, b"a", fin=False) + F.encode(F.CONT, b"bcd")), 3, lambda *_: True)
    assert caught.value.code == 1009
    assert F.accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="  # RFC 6455's example


def test_app_realtime_deploys_a_realtime_handler():
    from levers9 import App
    from levers9.contracts.spec import decode_spec

    app = App("rt")

    @app.realtime(cpu=0.25, memory=128, name="echo")
    def handler(context, event):
        return event

    [spec] = app.specs()
    assert spec["code"] == {"kind": "realtime", "module": __name__, "handler": "handler"}
    assert decode_spec(__import__("json").dumps(spec).encode()).code.kind == "realtime"
    assert handler(None, "x") == "x"  # stays callable locally
