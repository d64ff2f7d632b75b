"""The runner: the process inside every container (`python3 -m levers9.runner`).

It listens at once, then imports the user's module and runs on_start in the background, so the
worker can watch `GET /_levers9/health` go from starting (503) to ready (200) or failed (500; the
runner then exits with status 3). Every other request goes to the user's code: an endpoint function
(the JSON body's fields are its keyword arguments, the return value is the JSON answer) or an ASGI
app. At most LEVERS9_RUNNER_CONCURRENCY requests run the code at once. SIGTERM stops accepting,
lets the requests in flight finish (up to STOP_GRACE_SECONDS), and exits 0.

Standard library only: the container is a bare python3 with this package mounted at /opt/levers9.
Threads: one accepts connections, one per connection parses and answers, one runs an asyncio loop
for async handlers, ASGI apps and async on_start, one imports the module; sync handlers run in a
thread of their own so a deadline can answer 504 while they go on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.server
import importlib
import inspect
import json
import os
import queue
import signal
import socket
import socketserver
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import parse_qsl, unquote, urlsplit

HEALTH_PATH = "/_levers9/health"
STATUS_PATH = "/_levers9/status"
INTERNAL_PREFIX = "/_levers9/"
EXIT_FAILED = 3  # import or on_start failed: the worker reports the container as failed
EXIT_USAGE = 2  # the runner's own environment is wrong
FAILED_EXIT_DELAY = 1.0  # seconds the failed health answer stays up before the exit
STOP_GRACE_SECONDS = 10.0
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


# ---- configuration -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Config:
    module: str
    handler: str
    kind: str = "endpoint"  # endpoint | asgi
    on_start: str = ""
    app_dir: str = "/app"
    host: str = "0.0.0.0"
    port: int = 8000
    concurrency: int = 1
    timeout: float = 0.0  # seconds a request may run; 0: no limit
    max_body: int = 16 * 1024 * 1024

    @classmethod
    def from_env(cls, env: dict[str, str]) -> "Config":
        def get(name: str, default: str = "") -> str:
            return env.get(f"LEVERS9_RUNNER_{name}", "").strip() or default

        def number(name: str, default: str, kind: Callable[[str], Any], minimum: float) -> Any:
            raw = get(name, default)
            try:
                value = kind(raw)
            except ValueError:
                value = None
            if value is None or value < minimum:
                raise ValueError(f"LEVERS9_RUNNER_{name}={raw!r} is not valid: use a number of at least {minimum}")
            return value

        module, handler, kind = get("MODULE"), get("HANDLER"), get("KIND", "endpoint")
        if not module or not handler:
            raise ValueError("LEVERS9_RUNNER_MODULE and LEVERS9_RUNNER_HANDLER must name the user's module "
                             "and function")
        if kind not in ("endpoint", "asgi"):
            raise ValueError(f"LEVERS9_RUNNER_KIND={kind!r} is not valid: use endpoint or asgi")
        return cls(module=module, handler=handler, kind=kind, on_start=get("ON_START"),
                   app_dir=get("APP_DIR", "/app"), host=get("HOST", "0.0.0.0"),
                   port=number("PORT", "8000", int, 0), concurrency=number("CONCURRENCY", "1", int, 1),
                   timeout=number("TIMEOUT", "0", float, 0), max_body=number("MAX_BODY", str(16 << 20), int, 0))


@dataclass
class Context:
    """What an endpoint function receives as `context` when it has a parameter of that name."""
    on_start_value: Any = None
    request_id: str = ""
    path: str = ""
    method: str = ""
    headers: dict[str, str] = field(default_factory=dict)


class DeadlineExceeded(Exception):
    pass


class LoadError(Exception):
    pass


def log(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# ---- the runtime: state, loading, calling ---------------------------------------------------------

class Runtime:
    def __init__(self, config: Config):
        self.config = config
        self.state = "starting"  # starting | ready | failed | stopping
        self.error = ""
        self.lock = threading.RLock()  # a signal handler may take it in the main thread
        self.inflight = 0
        self.requests = 0
        self.last_request_at: float | None = None
        self.on_start_seconds: float | None = None
        self.on_start_value: Any = None
        self.target: Any = None  # the endpoint function, or the ASGI app
        self.wants_context = False
        self.loaded = threading.Event()  # set once ready or failed
        self.finished = threading.Event()  # set when the process should end (stop requested, or failed)
        self.slots = threading.BoundedSemaphore(config.concurrency)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="levers9-loop", daemon=True).start()

    # -- loading --

    def load(self) -> None:
        """Import the module, run on_start, find the handler; on any failure: failed, exit 3."""
        cfg = self.config
        try:
            if cfg.app_dir not in sys.path:
                sys.path.insert(0, cfg.app_dir)
            module = importlib.import_module(cfg.module)
            started = time.monotonic()
            if cfg.on_start:
                on_start = getattr(module, cfg.on_start, None)
                if not callable(on_start):
                    raise LoadError(f"module {cfg.module} has no function {cfg.on_start!r} "
                                    "(LEVERS9_RUNNER_ON_START)")
                self.on_start_value = self.run(on_start)
            self.on_start_seconds = round(time.monotonic() - started, 6)
            obj = getattr(module, cfg.handler, None)
            if obj is None:
                raise LoadError(f"module {cfg.module} has no attribute {cfg.handler!r} (LEVERS9_RUNNER_HANDLER)")
            if cfg.kind == "asgi":
                self.target = self.asgi_app(obj)
            else:
                if not callable(obj):
                    raise LoadError(f"{cfg.module}.{cfg.handler} is not a function")
                self.target = obj
                self.wants_context = "context" in inspect.signature(obj).parameters
        except BaseException as exc:  # SystemExit from module code included
            traceback.print_exc(file=sys.stderr)
            sys.stderr.flush()
            with self.lock:
                self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            self.loaded.set()
            self.finished.set()
            return
        trim_heap()
        with self.lock:
            if self.state == "starting":
                self.state = "ready"
        log(f"ready: {cfg.module}.{cfg.handler} ({cfg.kind}); on_start took {self.on_start_seconds:.3f}s")
        self.loaded.set()

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call fn; when it is async (or returns an awaitable) await it on the loop."""
        result = fn(*args)
        if inspect.isawaitable(result):
            return asyncio.run_coroutine_threadsafe(_awaited(result), self.loop).result()
        return result

    def asgi_app(self, obj: Any) -> Any:
        """The ASGI app itself (an async callable), or what a factory function returns."""
        if _is_asgi(obj):
            return obj
        if not (inspect.isfunction(obj) or inspect.ismethod(obj)):
            raise LoadError(f"{self.config.handler} is neither an ASGI app nor a function that returns one")
        params = inspect.signature(obj).parameters
        app = self.run(obj, Context(on_start_value=self.on_start_value)) if "context" in params else self.run(obj)
        if not callable(app):
            raise LoadError(f"{self.config.handler}() returned {app!r}, not an ASGI app")
        return app

    # -- bookkeeping --

    def begin(self) -> None:
        with self.lock:
            self.inflight += 1
            self.requests += 1
            self.last_request_at = time.time()

    def end(self) -> None:
        with self.lock:
            self.inflight -= 1
            self.last_request_at = time.time()

    def status(self) -> dict[str, Any]:
        with self.lock:
            return {"state": self.state, "inflight": self.inflight, "requests": self.requests,
                    "last_request_at": self.last_request_at, "on_start_seconds": self.on_start_seconds}

    def request_stop(self) -> None:
        with self.lock:
            if self.state != "failed":
                self.state = "stopping"
        self.finished.set()

    # -- calling the user's code --

    def call(self, kwargs: dict[str, Any]) -> concurrent.futures.Future:
        """Start the endpoint function with a concurrency slot; the slot is freed when it really ends."""
        fn, timeout = self.target, self.config.timeout or None
        self.slots.acquire()
        if inspect.iscoroutinefunction(fn):
            async def run_async() -> Any:
                try:
                    return await _with_deadline(fn(**kwargs), timeout)
                finally:
                    self.slots.release()
            return asyncio.run_coroutine_threadsafe(run_async(), self.loop)

        future: concurrent.futures.Future = concurrent.futures.Future()

        def run_sync() -> None:
            try:
                result = fn(**kwargs)
                if inspect.isawaitable(result):
                    result = asyncio.run_coroutine_threadsafe(_awaited(result), self.loop).result()
                future.set_result(result)
            except BaseException as exc:
                future.set_exception(exc)
            finally:
                self.slots.release()

        threading.Thread(target=run_sync, name="levers9-call", daemon=True).start()
        return future


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


async def _with_deadline(awaitable: Any, timeout: float | None) -> Any:
    try:
        async with asyncio.timeout(timeout) as deadline:
            return await awaitable
    except TimeoutError:
        if deadline.expired():
            raise DeadlineExceeded(f"the request did not finish within {timeout:g} s") from None
        raise


def _is_asgi(obj: Any) -> bool:
    if inspect.iscoroutinefunction(obj):
        return True
    if inspect.isfunction(obj) or inspect.ismethod(obj) or inspect.isclass(obj):
        return False
    return inspect.iscoroutinefunction(getattr(obj, "__call__", None))


def _error_body(exc: BaseException) -> dict[str, str]:
    return {"error": f"{type(exc).__name__}: {exc}",
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))}


# ---- HTTP ----------------------------------------------------------------------------------------

class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def trim_heap() -> None:
    """Give freed heap pages back to the kernel once on_start is done: a checkpoint of this process
    (taken right after it reports ready) then holds only what the app still uses (~40% smaller for
    a pandas app that built and dropped temporaries)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the gateway reuses connections
    server_version = "levers9-runner"
    sys_version = ""
    timeout = 300  # an idle keep-alive connection is closed after this many seconds
    server: "Server"

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
            return self.send_json(503, {"error": "the container is stopping: retry on another one"}, close=True)
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

    def serve(self, url: Any, body: bytes) -> None:
        rt = self.server.runtime
        if not rt.loaded.wait(rt.config.timeout or 600):
            return self.send_json(503, {"error": "the app is still starting: retry shortly"})
        if rt.state == "failed":
            return self.send_json(500, {"error": f"the app failed to start: {rt.error}"})
        if rt.config.kind == "asgi":
            return self.serve_asgi(url, body)
        return self.serve_endpoint(url, body)

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
        parts, total = [], 0
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

    def send_json(self, status: int, doc: Any, close: bool = False, encoded: bytes | None = None) -> None:
        data = encoded if encoded is not None else json.dumps(doc).encode()
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
        if close:
            self.close_connection = True
            headers.append(("Connection", "close"))
        self.start(status, headers)
        if self.command != "HEAD":
            self.wfile.write(data)

    # -- endpoint functions --

    def serve_endpoint(self, url: Any, body: bytes) -> None:
        rt = self.server.runtime
        kwargs = self.inputs(url.query, body)
        headers = {k.lower(): v for k, v in self.headers.items()}
        if rt.wants_context:
            if "context" in kwargs:
                raise BadRequest(422, "'context' is reserved for the request's context: rename that input")
            kwargs["context"] = Context(on_start_value=rt.on_start_value,
                                        request_id=headers.get("x-request-id") or uuid.uuid4().hex,
                                        path=url.path, method=self.command, headers=headers)
        signature = inspect.signature(rt.target)
        try:
            signature.bind(**kwargs)
        except TypeError as exc:
            shown = signature.replace(parameters=[p for n, p in signature.parameters.items() if n != "context"])
            raise BadRequest(422, f"the inputs do not fit {rt.config.handler}{shown}: {exc}") from None
        future = rt.call(kwargs)
        done, _ = concurrent.futures.wait([future], timeout=rt.config.timeout or None)
        if not done:
            return self.send_json(504, {"error": f"DeadlineExceeded: the request did not finish within "
                                                 f"{rt.config.timeout:g} s"})
        exc = future.exception()
        if isinstance(exc, DeadlineExceeded):
            return self.send_json(504, {"error": f"DeadlineExceeded: {exc}"})
        if exc is not None:
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
            sys.stderr.flush()
            return self.send_json(500, _error_body(exc))
        try:
            data = json.dumps(future.result()).encode()
        except (TypeError, ValueError) as exc:
            return self.send_json(500, {"error": f"{type(exc).__name__}: the return value is not JSON ({exc}): "
                                                 "return dicts, lists, strings, numbers, booleans or None"})
        self.send_json(200, None, encoded=data)

    def inputs(self, query: str, body: bytes) -> dict[str, Any]:
        """Query parameters (strings; a list when repeated), then the JSON object body's fields."""
        kwargs: dict[str, Any] = {}
        for key, value in parse_qsl(query, keep_blank_values=True):
            if key in kwargs:
                kwargs[key] = (kwargs[key] if isinstance(kwargs[key], list) else [kwargs[key]]) + [value]
            else:
                kwargs[key] = value
        if not body.strip():
            return kwargs
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRequest(400, f"the body is not JSON ({exc}): send a JSON object whose fields are the "
                                  "function's arguments, e.g. {\"name\": \"world\"}") from None
        if not isinstance(doc, dict):
            raise BadRequest(400, f"the body is a JSON {type(doc).__name__}, not an object: send a JSON object "
                                  "whose fields are the function's arguments, e.g. {\"name\": \"world\"}")
        kwargs.update(doc)
        return kwargs

    # -- ASGI apps --

    def serve_asgi(self, url: Any, body: bytes) -> None:
        rt = self.server.runtime
        raw_path = self.path.split("?", 1)[0]
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": self.request_version.removeprefix("HTTP/") or "1.1",
            "method": self.command, "scheme": "http", "path": unquote(url.path),
            "raw_path": raw_path.encode("latin-1", "replace"), "query_string": url.query.encode("latin-1", "replace"),
            "root_path": "",
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1", "replace")) for k, v in self.headers.items()],
            "client": tuple(self.client_address[:2]), "server": (rt.config.host, self.server.server_port),
            "state": {"on_start_value": rt.on_start_value},
        }
        events: queue.Queue = queue.Queue()
        finished = asyncio.Event()  # the response is complete or the client left: receive() -> disconnect
        body_taken = False

        async def receive() -> dict[str, Any]:
            nonlocal body_taken
            if not body_taken:
                body_taken = True
                return {"type": "http.request", "body": body, "more_body": False}
            await finished.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            written: concurrent.futures.Future = concurrent.futures.Future()
            events.put((message, written))
            await asyncio.wrap_future(written)  # back-pressure: wait until the chunk is on the socket

        async def run() -> None:
            try:
                await _with_deadline(rt.target(scope, receive, send), rt.config.timeout or None)
            finally:
                rt.slots.release()
                events.put((None, None))

        rt.slots.acquire()
        outcome = asyncio.run_coroutine_threadsafe(run(), rt.loop)
        writer = AsgiWriter(self)
        while True:
            message, written = events.get()
            if message is None:
                break
            try:
                writer.handle(message)
                written.set_result(None)
            except OSError as exc:
                writer.gone = True
                written.set_exception(exc)
            except Exception as exc:  # the app sent something ASGI does not allow
                written.set_exception(exc)
            if writer.complete or writer.gone:
                rt.loop.call_soon_threadsafe(finished.set)
        rt.loop.call_soon_threadsafe(finished.set)
        exc = outcome.exception()
        writer.finish(exc)


class AsgiWriter:
    """Turns ASGI send() messages into an HTTP/1.1 response on the handler's socket."""

    def __init__(self, handler: Handler):
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
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
            sys.stderr.flush()
        if not self.started:
            if isinstance(exc, DeadlineExceeded):
                return self.h.send_json(504, {"error": f"DeadlineExceeded: {exc}"})
            if exc is not None:
                return self.h.send_json(500, _error_body(exc))
            return self.h.send_json(500, {"error": "the ASGI app returned without sending a response"})
        if not self.complete:
            if exc is not None:
                self.h.close_connection = True  # a truncated answer: the client must not take it as whole
            else:
                self.end()


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


# ---- main ----------------------------------------------------------------------------------------

def main() -> int:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)  # the user's print() reaches the log at once
        except (AttributeError, ValueError):
            pass
    try:
        config = Config.from_env(dict(os.environ))
    except ValueError as exc:
        print(f"levers9 runner: {exc}", file=sys.stderr)
        return EXIT_USAGE
    runtime = Runtime(config)
    server = Server(config, runtime)  # listening from here on
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="levers9-accept",
                     daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: runtime.request_stop())
    signal.signal(signal.SIGINT, lambda *_: runtime.request_stop())
    log(f"levers9 runner listening on {config.host}:{server.server_port}; loading {config.module}."
        f"{config.handler} ({config.kind}, concurrency {config.concurrency})")
    threading.Thread(target=runtime.load, name="levers9-load", daemon=True).start()
    while not runtime.finished.wait(0.5):
        pass
    if runtime.state == "failed":
        time.sleep(FAILED_EXIT_DELAY)  # let the worker read the failed health answer
        log(f"exiting with status {EXIT_FAILED}: the app failed to start: {runtime.error}")
        return EXIT_FAILED
    log("stopping: no new requests; finishing the ones in flight")
    server.shutdown()
    server.server_close()
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    idle_checks = 0
    while time.monotonic() < deadline and idle_checks < 2:  # idle twice: none was half accepted
        idle_checks = idle_checks + 1 if runtime.status()["inflight"] == 0 else 0
        time.sleep(0.05)
    left = runtime.status()["inflight"]
    log("stopped" if not left else f"stopped with {left} requests unfinished after {STOP_GRACE_SECONDS:g} s")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # daemon threads may be inside user code; do not wait for them
