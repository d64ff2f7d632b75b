"""Serving a WebSocket upgrade: an ASGI app gets a `websocket` scope (connect, receive, send, close,
as uvicorn gives them), an `@app.realtime` handler its messages (realtime.py wraps it as such an app).

The handler's thread reads frames from the socket and hands each message to the app's coroutine on
the runtime's loop; what the app sends is written from a worker thread of that loop under one lock
(the reader writes pongs and close replies under it too). When the app has ended and the peer does
not answer our close, the socket is shut down after CLOSE_WAIT_S, which ends the reader.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any
from urllib.parse import SplitResult, unquote

from levers9.runner import ws_frames as F
from levers9.runner.exchange import Exchange
from levers9.runner.realtime import realtime_app
from levers9.runner.runtime import print_exception

CLOSE_WAIT_S = 2.0
NORMAL, ABNORMAL, INTERNAL = 1000, 1006, 1011


def websocket_scope(h: Exchange, url: SplitResult) -> dict[str, Any]:
    rt = h.server.runtime
    protocols = [p.strip() for p in h.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
    return {
        "type": "websocket", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": h.request_version.removeprefix("HTTP/") or "1.1", "scheme": "ws",
        "path": unquote(url.path), "raw_path": h.path.split("?", 1)[0].encode("latin-1", "replace"),
        "query_string": url.query.encode("latin-1", "replace"), "root_path": "",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1", "replace")) for k, v in h.headers.items()],
        "client": tuple(h.client_address[:2]), "server": (rt.config.host, h.server.server_port),
        "subprotocols": protocols, "state": {"on_start_value": rt.on_start_value},
        "extensions": {"websocket.http.response": {}},
    }


class Connection:
    """The socket side: the handshake answered, frames written under a lock, and the state both
    threads look at (accepted, closed by us, ended)."""

    def __init__(self, h: Exchange) -> None:
        self.h = h
        self.lock = threading.Lock()
        self.accepted = False
        self.answered = threading.Event()  # accepted, denied, or the app ended: the handler's thread goes on
        self.responded = False  # the handshake was answered (101, or a refusal)
        self.close_sent = False
        self.failed = False  # the app raised: the connection is closed with 1011

    def write(self, data: bytes) -> None:
        with self.lock:
            self.h.wfile.write(data)
            self.h.wfile.flush()

    def accept(self, subprotocol: str | None, headers: list[Any]) -> None:
        key = self.h.headers.get("Sec-WebSocket-Key", "")
        extra = [(bytes(k).decode("latin-1"), bytes(v).decode("latin-1")) for k, v in headers]
        extra = [(k, v) for k, v in extra if k.lower() not in ("upgrade", "connection", "sec-websocket-accept")]
        lines = [("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Accept", F.accept_key(key))]
        if subprotocol:
            lines.append(("Sec-WebSocket-Protocol", subprotocol))
        with self.lock:
            self.h.start(101, lines + extra)
            self.h.wfile.flush()
        self.accepted = self.responded = True
        self.answered.set()

    def deny(self, status: int = 403, headers: list[tuple[str, str]] | None = None, body: bytes = b"") -> None:
        self.h.close_connection = True
        with self.lock:
            self.h.start(status, [*(headers or []), ("Content-Length", str(len(body))), ("Connection", "close")])
            self.h.wfile.write(body)
            self.h.wfile.flush()
        self.responded = True
        self.answered.set()

    def close(self, code: int, reason: str = "") -> None:
        if self.close_sent:
            return
        self.close_sent = True
        self.write(F.encode(F.CLOSE, F.close_payload(code, reason)))

    def shutdown(self) -> None:
        try:
            self.h.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class Channel:
    """receive() and send() for the app, on the loop."""

    def __init__(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        self.conn = conn
        self.loop = loop
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.connected = False
        self.ended = False  # the client is gone: send() raises
        self.denial: dict[str, Any] = {}

    def put(self, message: dict[str, Any]) -> None:  # from the reader's thread
        self.loop.call_soon_threadsafe(self.inbox.put_nowait, message)

    async def receive(self) -> dict[str, Any]:
        if not self.connected:
            self.connected = True
            return {"type": "websocket.connect"}
        message = await self.inbox.get()
        if message["type"] == "websocket.disconnect":
            self.ended = True
            self.inbox.put_nowait(message)  # asked again, the answer stays the same
        return message

    async def send(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "websocket.close" and self.conn.close_sent:
            return
        if self.ended or self.conn.close_sent:
            raise OSError("the WebSocket is closed")
        if kind == "websocket.accept":
            if self.conn.responded:
                raise RuntimeError("websocket.accept after the handshake was answered")
            await self.in_thread(self.conn.accept, message.get("subprotocol"), message.get("headers") or [])
        elif kind == "websocket.send":
            if not self.conn.accepted:
                raise RuntimeError("websocket.send before websocket.accept")
            text, data = message.get("text"), message.get("bytes")
            frame = F.encode(F.TEXT, text.encode()) if text is not None else F.encode(F.BINARY, bytes(data or b""))
            await self.in_thread(self.conn.write, frame)
        elif kind == "websocket.close":
            if self.conn.accepted:
                await self.in_thread(self.conn.close, int(message.get("code") or NORMAL), message.get("reason") or "")
            elif not self.conn.responded:
                await self.in_thread(self.conn.deny, 403)
        elif kind == "websocket.http.response.start":
            self.denial = {"status": int(message["status"]), "headers": [
                (bytes(k).decode("latin-1"), bytes(v).decode("latin-1")) for k, v in message.get("headers") or []
                if bytes(k).lower() not in (b"content-length", b"connection")], "body": b""}
        elif kind == "websocket.http.response.body":
            self.denial["body"] += bytes(message.get("body") or b"")
            if not message.get("more_body"):
                await self.in_thread(self.conn.deny, self.denial["status"], self.denial["headers"],
                                     self.denial["body"])
        else:
            raise RuntimeError(f"a WebSocket app cannot send {kind!r}")

    async def in_thread(self, fn: Any, *args: Any) -> None:
        await self.loop.run_in_executor(None, fn, *args)


def serve_websocket(h: Exchange, url: SplitResult) -> None:
    """Run the app on this upgrade until the connection ends (in the handler's thread)."""
    rt = h.server.runtime
    if rt.config.kind not in ("asgi", "realtime"):
        return h.send_json(400, {"error": "this endpoint answers HTTP only: serve WebSockets with @app.asgi or "
                                          "@app.realtime"}, close=True)
    h.close_connection = True  # whatever happens, this connection is not reused for HTTP
    app = realtime_app(rt) if rt.config.kind == "realtime" else rt.target
    conn = Connection(h)
    channel = Channel(conn, rt.loop)
    ended = threading.Event()

    async def run() -> None:
        try:
            await app(websocket_scope(h, url), channel.receive, channel.send)
        except BaseException:
            conn.failed = True
            raise
        finally:
            ended.set()
            rt.slots.release()

    rt.slots.acquire()
    outcome = asyncio.run_coroutine_threadsafe(run(), rt.loop)
    outcome.add_done_callback(lambda _: conn.answered.set())
    conn.answered.wait()
    if conn.accepted:
        read_messages(conn, channel, rt.config.max_body, ended)
    finish(conn, outcome)


def read_messages(conn: Connection, channel: Channel, limit: int, ended: threading.Event) -> None:
    """Hand the client's messages to the app until the connection ends; then one disconnect."""
    def control(op: int, payload: bytes) -> bool:
        if op == F.PING:
            conn.write(F.encode(F.PONG, payload))
        return True

    def shut_when_app_ends() -> None:
        ended.wait()
        if conn.accepted and not conn.close_sent:
            try:  # the app returned without closing (1000), or raised (1011): as uvicorn does
                conn.close(INTERNAL if conn.failed else NORMAL)
            except OSError:
                pass
        if not stop.wait(CLOSE_WAIT_S):
            conn.shutdown()

    stop = threading.Event()
    threading.Thread(target=shut_when_app_ends, name="levers9-ws-close", daemon=True).start()
    code, reason = ABNORMAL, ""
    try:
        while True:
            op, payload = F.read_message(conn.h.rfile, limit, control)  # type: ignore[arg-type]
            if op == F.CLOSE:
                code, reason = F.parse_close(payload)
                conn.close(code if code != F.NO_STATUS else NORMAL)  # the reply (nothing if ours went first)
                break
            channel.put({"type": "websocket.receive", "text": payload.decode(errors="replace")} if op == F.TEXT
                        else {"type": "websocket.receive", "bytes": payload})
    except F.FrameError as exc:
        code, reason = exc.code, str(exc)
        try:
            conn.close(exc.code, reason)
        except OSError:
            pass
    except (EOFError, OSError, ValueError):
        pass
    finally:
        stop.set()
        channel.put({"type": "websocket.disconnect", "code": code, "reason": reason})


def finish(conn: Connection, outcome: Any) -> None:
    """After the connection: wait for the app, answer the handshake if it never did, report its failure."""
    try:
        outcome.result(timeout=CLOSE_WAIT_S * 5)
    except TimeoutError:
        return  # the app goes on after its client left: its slot is freed when it ends
    except Exception as exc:  # noqa: BLE001 - the app's failure: printed, and a 500 if nothing was answered
        print_exception(exc)
        status = 500
    else:
        status = 403  # returned without accepting: refused, as uvicorn does
    if not conn.responded:
        try:
            conn.deny(status)
        except OSError:
            pass
