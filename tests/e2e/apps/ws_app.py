"""WebSockets for tests/e2e/test_e2e_websockets.py: a raw ASGI echo app (no framework: the container
has python3 and the SDK only), an @app.realtime handler, and a box running a WebSocket echo server
of its own (ws_box_server.py)."""
from levers9 import App

app = App("sockets")


async def echo(scope, receive, send):
    if scope["type"] != "websocket":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"a WebSocket echo"})
        return
    await receive()
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.send", "text": scope["path"] + "?" + scope["query_string"].decode()})
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            print(f"echo: the client closed with {message['code']}", flush=True)
            return
        await send({"type": "websocket.send", "text": message.get("text"), "bytes": message.get("bytes")})


app.asgi(echo, name="wsecho", cpu=0.25, memory="128Mi", timeout=60)


@app.realtime(name="shout", cpu=0.25, memory="128Mi", timeout=60)
def shout(context, event):
    if isinstance(event, bytes):
        return event[::-1]
    return {"upper": event.upper(), "path": context.path}


app.box("wsbox", command=["python3", "ws_box_server.py", "8124"], port=8124, cpu=0.25, memory="128Mi", timeout=60)
