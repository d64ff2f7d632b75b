"""The runner's HTTP/1.1 server: one thread accepts connections, one per connection parses and
answers. `/_levers9/health` and `/_levers9/status` answer here; every other request goes to the
user's code (endpoint.py for a function, asgi.py for an ASGI app)."""

from __future__ import annotations

import http.server
import json
import socket
import socketserver
import sys
import time
import traceback
from typing import Any
from urllib.parse import SplitResult, urlsplit

from levers9.runner.asgi import serve_asgi
from levers9.runner.config import Config
from levers9.runner.endpoint import BadRequest, serve_endpoint
from levers9.runner.runtime import Runtime, log
from levers9.runner.websocket import serve_websocket
from levers9.runner.ws_frames import wants_upgrade

HEALTH_PATH = "/_levers9/health"
STATUS_PATH = "/_levers9/status"
INTERNAL_PREFIX = "/_levers9/"
STOPPING_HEADER = "X-Levers9-Stopping"  # on the 503 of a container that is stopping


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the gateway reuses connections
    server_version = "levers9-runner"
    sys_version = ""
    timeout = 300  # an idle keep-alive connection is closed after this many seconds
    server: "Server"
    status_sent = 0

    def version_string(self) -> str:
        return self.server_version

    def setup(self) -> None:
        super().setup()
        # headers and body go out as separate writes: without TCP_NODELAY the body waits ~40 ms
        # for the client's delayed ACK (Nagle), on every answer
        try:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - we write our own lines
        pass

    def do_GET(self) -> None:
        self.dispatch()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    # -- routing --

    def dispatch(self) -> None:
        rt = self.server.runtime
        url = urlsplit(self.path)
        if url.path.startswith(INTERNAL_PREFIX):
            self.drain_body()
            return self.internal(url.path)
        if rt.state == "stopping":
            self.drain_body()
            # the header tells the gateway it may send the call to another container
            return self.send_json(503, {"error": "the container is stopping: retry on another one"}, close=True,
                                  extra=[(STOPPING_HEADER, "1")])
        started = time.monotonic()
        rt.begin()
        self.status_sent = 0
        try:
            body = self.read_body()
            self.serve(url, body)
        except BadRequest as exc:
            self.send_json(exc.status, {"error": str(exc)})
        except (ConnectionError, TimeoutError, OSError):
            self.close_connection = True
            self.status_sent = self.status_sent or 499  # the client went away
        except Exception as exc:  # noqa: BLE001 - the runner's own failure: an answer, never a dropped connection
            traceback.print_exc(file=sys.stderr)
            if self.status_sent:
                self.close_connection = True  # an answer was under way: the client must not take it as whole
            else:
                self.send_json(500, {"error": f"the runner failed on this request ({type(exc).__name__}); "
                                              "see the container's log"}, close=True)
        finally:
            if rt.state == "stopping":
                self.close_connection = True
            rt.end()
            rid = self.headers.get("X-Request-Id", "")
            log(f"{self.command} {url.path} {self.status_sent} {1000 * (time.monotonic() - started):.1f}ms"
                + (f" request_id={rid}" if rid else ""))

    def internal(self, path: str) -> None:
        rt = self.server.runtime
        if self.command not in ("GET", "HEAD"):
            return self.send_json(405, {"error": f"{path} answers GET only"})
        if path == HEALTH_PATH:
            status = rt.status()
            code = {"ready": 200, "failed": 500}.get(status["state"], 503)
            body = {"state": status["state"]}
            if status["state"] == "failed":
                body["error"] = rt.error
            return self.send_json(code, body)
        if path == STATUS_PATH:
            return self.send_json(200, rt.status())
        return self.send_json(404, {"error": f"no such runner path {path}: use {HEALTH_PATH} or {STATUS_PATH}"})

    def serve(self, url: SplitResult, body: bytes) -> None:
        rt = self.server.runtime
        if not rt.loaded.wait(rt.config.timeout or 600):
            return self.send_json(503, {"error": "the app is still starting: retry shortly"})
        if rt.state == "failed":
            return self.send_json(500, {"error": f"the app failed to start: {rt.error}"})
        if rt.config.kind == "function":
            return self.send_json(404, {"error": "this is a function sandbox: its functions are called through the "
                                                 "executor's socket, not over HTTP"})
        if wants_upgrade(self.command, self.headers.get("Upgrade", ""), self.headers.get("Connection", "")):
            return serve_websocket(self, url)
        if rt.config.kind == "realtime":
            return self.send_json(426, {"error": "this is a realtime endpoint: open a WebSocket to it"},
                                  extra=[("Upgrade", "websocket")])
        if rt.config.kind == "asgi":
            return serve_asgi(self, url, body)
        return serve_endpoint(self, url, body)

    # -- reading --

    def read_body(self) -> bytes:
        limit = self.server.runtime.config.max_body
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self.read_chunked(limit)
        raw = self.headers.get("Content-Length", "0") or "0"
        try:
            length = int(raw)
        except ValueError:
            self.close_connection = True
            raise BadRequest(400, f"Content-Length {raw!r} is not a number") from None
        if length > limit:
            self.close_connection = True  # the body stays unread
            raise BadRequest(413, f"the body is {length} bytes, over the limit of {limit} bytes")
        return self.rfile.read(length) if length > 0 else b""

    def read_chunked(self, limit: int) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                self.close_connection = True
                raise BadRequest(400, "the chunked body is malformed") from None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            total += size
            if total > limit:
                self.close_connection = True
                raise BadRequest(413, f"the body is over the limit of {limit} bytes")
            parts.append(self.rfile.read(size))
            self.rfile.readline(1024)

    def drain_body(self) -> None:
        try:
            self.read_body()
        except BadRequest:
            self.close_connection = True

    # -- writing --

    def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.send_response_only(status)
        names = {name.lower() for name, _ in headers}
        if "server" not in names:
            self.send_header("Server", self.version_string())
        if "date" not in names:
            self.send_header("Date", self.date_time_string())
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.status_sent = status

    def send_json(self, status: int, doc: Any, close: bool = False, encoded: bytes | None = None,
                  extra: list[tuple[str, str]] | None = None) -> None:
        data = encoded if encoded is not None else json.dumps(doc).encode()
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(data))), *(extra or [])]
        if close:
            self.close_connection = True
            headers.append(("Connection", "close"))
        self.start(status, headers)
        if self.command != "HEAD":
            self.wfile.write(data)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    runtime: Runtime

    def __init__(self, config: Config, runtime: Runtime):
        self.runtime = runtime
        if ":" in config.host:
            self.address_family = socket.AF_INET6
        super().__init__((config.host, config.port), Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks the host name up (getfqdn), which can hang without DNS
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            return  # a client that went away
        traceback.print_exc(file=sys.stderr)
