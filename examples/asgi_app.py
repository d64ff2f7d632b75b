"""An ASGI app with no framework (the container has no third-party packages).

    levers9 deploy examples/asgi_app.py
    curl "$GATEWAY/endpoint/asgi-demo/"              # {"hello": "asgi"}
    curl "$GATEWAY/endpoint/asgi-demo/stream?n=3"    # three lines, one every 0.2 s
    curl "$GATEWAY/endpoint/asgi-demo/echo" -d hi    # hi
"""

import asyncio
import json
from urllib.parse import parse_qs

from levers9 import App

app = App("asgi-demo")


async def read_body(receive):
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def respond(send, status, body, content_type=b"application/json"):
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def stream(send, n):
    # no content-length: the runner sends the lines chunked, each as soon as it is produced
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    for i in range(n):
        await send({"type": "http.response.body", "body": f"line {i}\n".encode(), "more_body": True})
        await asyncio.sleep(0.2)
    await send({"type": "http.response.body", "body": b""})


@app.asgi(name="asgi-demo", cpu=0.25, memory="128Mi", concurrency=8)
async def web(scope, receive, send):
    if scope["type"] != "http":
        return  # no lifespan events to handle
    path = scope["path"].rstrip("/") or "/"
    if path == "/":
        await respond(send, 200, json.dumps({"hello": "asgi"}).encode())
    elif path == "/stream":
        n = int(parse_qs(scope["query_string"].decode()).get("n", ["3"])[0])
        await stream(send, min(n, 100))
    elif path == "/echo" and scope["method"] == "POST":
        await respond(send, 200, await read_body(receive), b"application/octet-stream")
    else:
        await respond(send, 404, json.dumps({"error": f"no route {scope['method']} {path}"}).encode())
