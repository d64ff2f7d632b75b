"""Serving an ASGI app: the bridge between the handler's thread (the socket) and the app's
coroutine on the runtime's loop. The app's send() waits until its chunk is on the socket
(back-pressure); receive() gives the body once, then http.disconnect when the answer is complete
or the client has gone."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
from typing import Any
from urllib.parse import SplitResult, unquote

from levers9.runner.exchange import Exchange
from levers9.runner.runtime import DeadlineExceeded, error_body, print_exception, with_deadline

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


def asgi_scope(h: Exchange, url: SplitResult) -> dict[str, Any]:
    rt = h.server.runtime
    raw_path = h.path.split("?", 1)[0]
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": h.request_version.removeprefix("HTTP/") or "1.1",
        "method": h.command, "scheme": "http", "path": unquote(url.path),
        "raw_path": raw_path.encode("latin-1", "replace"), "query_string": url.query.encode("latin-1", "replace"),
        "root_path": "",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1", "replace")) for k, v in h.headers.items()],
        "client": tuple(h.client_address[:2]), "server": (rt.config.host, h.server.server_port),
        "state": {"on_start_value": rt.on_start_value},
    }


class Channel:
    """receive() and send() for the app (on the loop); the messages it sent, for the handler's thread."""

    def __init__(self, body: bytes):
        self.body = body
        self.body_taken = False
        self.events: queue.Queue = queue.Queue()  # (message, written future); (None, None) when the app ended
        self.finished = asyncio.Event()  # the response is complete or the client left: receive() -> disconnect

    async def receive(self) -> dict[str, Any]:
        if not self.body_taken:
            self.body_taken = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.finished.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        written: concurrent.futures.Future = concurrent.futures.Future()
        self.events.put((message, written))
        await asyncio.wrap_future(written)  # back-pressure: wait until the chunk is on the socket


def serve_asgi(h: Exchange, url: SplitResult, body: bytes) -> None:
    rt = h.server.runtime
    channel = Channel(body)
    scope = asgi_scope(h, url)

    async def run() -> None:
        try:
            await with_deadline(rt.target(scope, channel.receive, channel.send), rt.config.timeout or None)
        finally:
            rt.slots.release()
            channel.events.put((None, None))

    rt.slots.acquire()
    outcome = asyncio.run_coroutine_threadsafe(run(), rt.loop)
    writer = AsgiWriter(h)
    write_messages(channel, writer, rt.loop)
    rt.loop.call_soon_threadsafe(channel.finished.set)
    writer.finish(outcome.exception())


def write_messages(channel: Channel, writer: "AsgiWriter", loop: asyncio.AbstractEventLoop) -> None:
    """Write what the app sends until it ends; each send() learns whether its message went out."""
    while True:
        message, written = channel.events.get()
        if message is None:
            return
        try:
            writer.handle(message)
            written.set_result(None)
        except OSError as exc:
            writer.gone = True
            written.set_exception(exc)
        except Exception as exc:  # noqa: BLE001 - the app sent something ASGI does not allow: its send() raises it
            written.set_exception(exc)
        if writer.complete or writer.gone:
            loop.call_soon_threadsafe(channel.finished.set)


class AsgiWriter:
    """Turns ASGI send() messages into an HTTP/1.1 response on the handler's socket."""

    def __init__(self, handler: Exchange):
        self.h = handler
        self.started = False
        self.complete = False
        self.gone = False
        self.chunked = False
        self.head = handler.command == "HEAD"

    def handle(self, message: dict[str, Any]) -> None:
        if self.gone or self.complete:
            return
        kind = message.get("type")
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.start(int(message["status"]), message.get("headers") or [])
        elif kind == "http.response.body":
            if not self.started:
                raise RuntimeError("http.response.body sent before http.response.start")
            chunk = bytes(message.get("body") or b"")
            if chunk and not self.head:
                self.h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if self.chunked else chunk)
            if not message.get("more_body", False):
                self.end()

    def start(self, status: int, raw_headers: list[Any]) -> None:
        headers = [(bytes(k).decode("latin-1"), bytes(v).decode("latin-1")) for k, v in raw_headers]
        headers = [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP]
        has_length = any(k.lower() == "content-length" for k, _ in headers)
        if not has_length and not self.head:
            if self.h.request_version == "HTTP/1.1":
                self.chunked = True
                headers.append(("Transfer-Encoding", "chunked"))
            else:
                self.h.close_connection = True
                headers.append(("Connection", "close"))
        self.h.start(status, headers)
        self.started = True

    def end(self) -> None:
        if self.chunked and not self.head:
            self.h.wfile.write(b"0\r\n\r\n")
        self.complete = True

    def finish(self, exc: BaseException | None) -> None:
        """After the app returned or raised: answer 500 if nothing was sent, else end what was started."""
        if self.gone:
            self.h.close_connection = True
            return
        if exc is not None:
            print_exception(exc)
        if not self.started:
            if isinstance(exc, DeadlineExceeded):
                return self.h.send_json(504, {"error": f"DeadlineExceeded: {exc}"})
            if exc is not None:
                return self.h.send_json(500, error_body(exc))
            return self.h.send_json(500, {"error": "the ASGI app returned without sending a response"})
        if not self.complete:
            if exc is not None:
                self.h.close_connection = True  # a truncated answer: the client must not take it as whole
            else:
                self.end()
