"""The one place where the gateway reads what a client sends: an ASGI middleware that holds every
body to its route's rule (body_rules.py) before any route runs.

- Content-Length over the limit: 413 at once, the body unread (uvicorn discards it as it comes, so
  the client still reads the answer instead of a reset).
- No Content-Length (chunked): the bytes are counted as they come; 413 as soon as they pass it.
- A JSON route's body: held whole (it is under the limit), checked (UTF-8, JSON, depth; in a thread
  when it is large, so the event loop stays free), then handed to the route as if it came from the
  socket. A bad one answers 400 with a sentence; the route never sees it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable

from .body_rules import BodyRule, body_rule, declared_length, json_problem, too_large

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CHECK_IN_THREAD = 256 << 10  # a JSON body this large is parsed off the event loop


class BodyTooLarge(Exception):
    pass


async def answer(send: Send, status: int, detail: str) -> None:
    data = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


async def read_whole(receive: Receive, rule: BodyRule) -> bytes:
    """The body, counted as it comes; BodyTooLarge as soon as it passes the rule's limit."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError("the client left before its body was whole")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > rule.limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A receive() that gives `body` once, then what the socket says (a disconnect)."""
    given = False

    async def again() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


def counted(receive: Receive, rule: BodyRule) -> Receive:
    """receive() that raises BodyTooLarge once more than the rule's limit has come."""
    size = 0

    async def count() -> Message:
        nonlocal size
        message = await receive()
        size += len(message.get("body", b""))
        if size > rule.limit:
            raise BodyTooLarge
        return message

    return count


class BodyLimits:
    def __init__(self, app: ASGIApp, limits: Callable[[], dict[str, int]]):
        self.app = app
        self.limits = limits  # code_limit, file_limit, call_limit: read per request (settings may change in tests)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rule = body_rule(scope["method"], scope["path"], **self.limits()) if scope["type"] == "http" else None
        if rule is None:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        try:
            declared = declared_length(headers[b"content-length"].decode("latin-1")
                                       if b"content-length" in headers else None)
        except ValueError as exc:
            return await answer(send, 400, str(exc))
        if declared is not None and declared > rule.limit:
            return await answer(send, 413, too_large(rule, declared))
        if rule.json:
            return await self.checked(scope, receive, send, rule)
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted(receive, rule), watched)
        except BodyTooLarge:
            if not started:
                await answer(send, 413, too_large(rule))

    async def checked(self, scope: Scope, receive: Receive, send: Send, rule: BodyRule) -> None:
        try:
            body = await read_whole(receive, rule)
        except BodyTooLarge:
            return await answer(send, 413, too_large(rule))
        except ConnectionError:
            return  # nobody to answer
        problem = await asyncio.to_thread(json_problem, body) if len(body) > CHECK_IN_THREAD else json_problem(body)
        if problem:
            return await answer(send, 400, f"{scope['method']} {scope['path']}: {problem}")
        await self.app(scope, replay(body, receive), send)
