"""`@app.realtime`: a handler called once per WebSocket message, its return value sent back.

The runner serves it as an ASGI app of its own (realtime_app), so the WebSocket machinery is the
one `@app.asgi` apps use (websocket.py). A text message arrives as str, a binary one as bytes; the
handler may be sync (run in a thread, so the loop keeps serving other connections) or async; it
gets `context` (on_start_value, path, headers) when it has a parameter of that name. What it returns
goes back: str as text, bytes as binary, None as nothing, anything else as JSON text. A handler that
raises closes the connection with 1011 and its exception (the traceback is in the log); one over the
runner's timeout, with 1011 and DeadlineExceeded. A plain HTTP request is answered 426 (server.py).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any

from levers9.runner.runtime import Context, DeadlineExceeded, Runtime, print_exception, with_deadline

INTERNAL = 1011


def outgoing(result: Any) -> dict[str, Any] | None:
    """The websocket.send message for a handler's return value (None: nothing is sent)."""
    if result is None:
        return None
    if isinstance(result, str):
        return {"type": "websocket.send", "text": result}
    if isinstance(result, (bytes, bytearray, memoryview)):
        return {"type": "websocket.send", "bytes": bytes(result)}
    return {"type": "websocket.send", "text": json.dumps(result)}


def incoming(message: dict[str, Any]) -> str | bytes:
    return message["text"] if message.get("text") is not None else bytes(message.get("bytes") or b"")


def arguments(fn: Any, context: Context, event: str | bytes) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) for the handler: `context` when it has a parameter of that name (first: by
    position, as beta9's `handler(context, event)`; elsewhere: by name), the message as the other."""
    names = list(inspect.signature(fn).parameters)
    if "context" not in names:
        return (event,), {}
    if names[0] == "context":
        return (context, event), {}
    return (event,), {"context": context}


async def call(rt: Runtime, context: Context, event: str | bytes) -> Any:
    fn = rt.target
    args, kwargs = arguments(fn, context, event)
    if inspect.iscoroutinefunction(fn):
        return await with_deadline(fn(*args, **kwargs), rt.config.timeout or None)
    result = await with_deadline(asyncio.to_thread(fn, *args, **kwargs), rt.config.timeout or None)
    return await result if inspect.isawaitable(result) else result


def realtime_app(rt: Runtime) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers") or []}
        context = Context(on_start_value=rt.on_start_value, path=scope.get("path", ""), method="WEBSOCKET",
                          headers=headers)
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            try:
                reply = outgoing(await call(rt, context, incoming(message)))
            except (Exception, DeadlineExceeded) as exc:  # noqa: BLE001 - the handler's failure closes this connection
                print_exception(exc)
                await send({"type": "websocket.close", "code": INTERNAL, "reason": f"{type(exc).__name__}: {exc}"[:120]})
                return
            if reply is not None:
                await send(reply)
    return app
