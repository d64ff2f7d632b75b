"""A FAKE of the gateway's function service (levers9.functions.v1) for the SDK's tests.

It does what the real gateway does on the wire, in one process: checks the token, describes
functions, answers each Call stream with Accepted, runs each input's function (unpickled) in a
thread of its own, streams its prints as Output, a generator's items as Item and the outcome as
Result (large values through an HTTP blob endpoint it serves), spawns and gets calls, hands out
upload URLs, honours Cancel, and records everything it received.
"""

from __future__ import annotations

import io
import json
import queue
import sys
import threading
import time
import traceback
import uuid
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import cloudpickle
import grpc

from levers9.contracts.proto import functions_pb2 as pb
from levers9.contracts.proto import functions_pb2_grpc as pb_grpc

TOKEN = "tok-fake"
INLINE_LIMIT = 4 << 20
END = object()


class _Router(io.TextIOBase):
    """sys.stdout/sys.stderr while the fake runs: a worker thread's prints become its Output messages;
    every other thread's writes go where they went before."""

    def __init__(self, fallback: Any, fd: int, sinks: dict[int, Callable[[int, str], None]]):
        self.fallback, self.fd, self.sinks = fallback, fd, sinks

    def write(self, text: str) -> int:
        sink = self.sinks.get(threading.get_ident())
        if sink is None:
            return self.fallback.write(text)
        sink(self.fd, text)
        return len(text)

    def flush(self) -> None:
        if threading.get_ident() not in self.sinks:
            self.fallback.flush()


class _Blobs(BaseHTTPRequestHandler):
    fake: "FakeFunctions"

    def log_message(self, *args: Any) -> None:
        pass

    def do_PUT(self) -> None:
        data = self.rfile.read(int(self.headers["Content-Length"]))
        self.fake.blobs[self.path.rsplit("/", 1)[-1]] = data
        self.fake.record("http-put", self.path)
        self.send_response(200)
        self.end_headers()

    def do_GET(self) -> None:
        if self.path == "/api/v1/functions/info":
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self.send_response(401)
                self.end_headers()
                return
            body = json.dumps({"grpc_address": self.fake.address, "tls": False, "python": self.fake.python}).encode()
        else:
            body = self.fake.blobs[self.path.rsplit("/", 1)[-1]]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Spawned:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: pb.Result | None = None


class FakeFunctions(pb_grpc.FunctionsServicer):
    """The fake service. `received`: (kind, message) of every request, in arrival order."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.received: list[tuple[str, Any]] = []
        self.deployed: dict[tuple[str, str], Callable[..., Any]] = {}
        self.blobs: dict[str, bytes] = {}
        self.spawned: dict[str, _Spawned] = {}
        self.results_sent: list[int] = []
        self.max_results: int | None = None  # results after this many are held back (never sent)
        self.sinks: dict[int, Callable[[int, str], None]] = {}
        self._lock = threading.Lock()
        self.address = ""
        self.http_base = ""

    # -- lifecycle --

    def start(self) -> "FakeFunctions":
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
        pb_grpc.add_FunctionsServicer_to_server(self, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.address = f"127.0.0.1:{port}"
        handler = type("Blobs", (_Blobs,), {"fake": self})
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.http.serve_forever, args=(0.05,), daemon=True).start()
        self.http_base = f"http://127.0.0.1:{self.http.server_address[1]}"
        return self

    def route_prints(self) -> None:
        """Put the routers in front of sys.stdout/sys.stderr (again: pytest's capture swaps its own in
        at the start of each test phase)."""
        with self._lock:
            if not isinstance(sys.stdout, _Router):
                sys.stdout = _Router(sys.stdout, 1, self.sinks)
            if not isinstance(sys.stderr, _Router):
                sys.stderr = _Router(sys.stderr, 2, self.sinks)

    def stop(self) -> None:
        with self._lock:
            if isinstance(sys.stdout, _Router):
                sys.stdout = sys.stdout.fallback
            if isinstance(sys.stderr, _Router):
                sys.stderr = sys.stderr.fallback
        self.server.stop(0)
        self.http.shutdown()

    def record(self, kind: str, message: Any) -> None:
        with self._lock:
            self.received.append((kind, message))

    def kinds(self, kind: str) -> list[Any]:
        with self._lock:
            return [m for k, m in self.received if k == kind]

    def authorised(self, context: grpc.ServicerContext) -> None:
        if dict(context.invocation_metadata()).get("authorization") != f"Bearer {TOKEN}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "this token is unknown or revoked")

    # -- unary --

    def Describe(self, request: pb.DescribeRequest, context: grpc.ServicerContext) -> pb.DescribeReply:
        self.authorised(context)
        self.record("describe", request)
        ref = request.function
        if not ref.pickled and (ref.app, ref.name) not in self.deployed:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no deployment {ref.name} in app {ref.app}")
        generator = ref.generator if ref.pickled else getattr(self.deployed[(ref.app, ref.name)], "is_generator",
                                                                 False)
        return pb.DescribeReply(exists=True, python=self.python, function_id="fn-1", generator=generator)

    def EndSession(self, request: pb.EndSessionRequest, context: grpc.ServicerContext) -> pb.EndSessionReply:
        self.authorised(context)
        self.record("end-session", request.session_id)
        return pb.EndSessionReply(ended=True)

    # -- the stream --

    def Call(self, requests: Any, context: grpc.ServicerContext) -> Any:
        self.authorised(context)
        hello = next(requests).hello
        self.record("hello", hello)
        if hello.mode == "get":
            yield from self.get(hello, context)
            return
        out: queue.Queue[Any] = queue.Queue()
        out.put(pb.ServerMessage(accepted=pb.Accepted(function_id="fn-1", correlation_id="corr-1",
                                                      python=self.python)))
        func = self.function_of(hello.function)
        threading.Thread(target=self.read, args=(requests, func, hello, out), daemon=True).start()
        while context.is_active():
            try:
                message = out.get(timeout=0.1)
            except queue.Empty:
                continue
            if message is END:
                return
            yield message

    def function_of(self, ref: pb.FunctionRef) -> Callable[..., Any]:
        if ref.pickled:
            return cloudpickle.loads(ref.pickled)
        return self.deployed[(ref.app, ref.name)]

    def read(self, requests: Any, func: Callable[..., Any], hello: pb.Hello, out: queue.Queue[Any]) -> None:
        """Like the gateway: after InputsDone the stream ends when every call has; a Cancel (or the
        client going away) ends it at once. Unlike it, this fake reads on after InputsDone, to see a
        Cancel sent then."""
        workers: list[threading.Thread] = []

        def finish() -> None:
            for w in workers:
                w.join()
            out.put(END)

        try:
            for message in requests:
                kind = message.WhichOneof("kind")
                self.record(kind, getattr(message, kind))
                if kind == "cancel":
                    break
                elif kind == "done":
                    threading.Thread(target=finish, daemon=True).start()
                elif kind == "upload":
                    key = uuid.uuid4().hex
                    out.put(pb.ServerMessage(upload=pb.UploadUrl(index=message.upload.index, blob_key=key,
                                                                 url=f"{self.http_base}/blobs/{key}")))
                elif kind == "input":
                    worker = self.start_input(message.input, func, hello, out)
                    if hello.mode != "spawn":  # a spawned call runs on after its stream
                        workers.append(worker)
        except grpc.RpcError:
            pass
        out.put(END)  # cancelled, or the client closed its side

    def start_input(self, given: pb.Input, func: Callable[..., Any], hello: pb.Hello,
                    out: queue.Queue[Any]) -> threading.Thread:
        args, kwargs = cloudpickle.loads(self.blobs[given.blob_key] if given.blob_key else given.args)
        call_id = uuid.uuid4().hex
        if hello.mode == "spawn":
            spawned = self.spawned[call_id] = _Spawned()
            sink: queue.Queue[Any] = queue.Queue()  # nobody reads a spawned call's prints

            def run_spawned() -> None:
                spawned.result = self.run(func, args, kwargs, given.index, call_id, hello, sink)
                spawned.done.set()

            worker = threading.Thread(target=run_spawned, daemon=True)
            out.put(pb.ServerMessage(spawned=pb.Spawned(index=given.index, call_id=call_id)))
        else:
            def run_call() -> None:
                result = self.run(func, args, kwargs, given.index, call_id, hello, out)
                with self._lock:
                    if self.max_results is not None and len(self.results_sent) >= self.max_results:
                        return  # this fake stops answering
                    self.results_sent.append(given.index)
                    out.put(pb.ServerMessage(result=result))

            worker = threading.Thread(target=run_call, daemon=True)
        worker.start()
        return worker

    def run(self, func: Callable[..., Any], args: Any, kwargs: Any, index: int, call_id: str, hello: pb.Hello,
            out: queue.Queue[Any]) -> pb.Result:
        """Run one input as the executor would: prints as Output, items as Item, then the Result."""
        self.route_prints()
        self.sinks[threading.get_ident()] = lambda fd, text: out.put(
            pb.ServerMessage(output=pb.Output(index=index, fd=fd, text=text)))
        started = time.monotonic()
        try:
            value = func(*args, **kwargs)
            if hello.function.generator:
                for item in value:
                    out.put(pb.ServerMessage(item=pb.Item(index=index, value=cloudpickle.dumps(item))))
                value = None
            return self.value_result(index, call_id, cloudpickle.dumps(value), time.monotonic() - started)
        except Exception as exc:
            try:
                pickled = cloudpickle.dumps(exc)
            except Exception:
                pickled = b""  # as the executor: an exception that does not pickle travels as text
            return pb.Result(index=index, call_id=call_id, ok=False, value=pickled,
                             error_type=f"{type(exc).__module__}.{type(exc).__qualname__}", error=str(exc),
                             traceback="".join(traceback.format_exception(exc)), attempts=1)
        finally:
            self.sinks.pop(threading.get_ident(), None)

    def value_result(self, index: int, call_id: str, pickled: bytes, duration: float) -> pb.Result:
        if len(pickled) <= INLINE_LIMIT:
            return pb.Result(index=index, call_id=call_id, ok=True, value=pickled, attempts=1, duration=duration)
        key = uuid.uuid4().hex
        self.blobs[key] = pickled
        return pb.Result(index=index, call_id=call_id, ok=True, blob_url=f"{self.http_base}/blobs/{key}", attempts=1,
                         duration=duration)

    def get(self, hello: pb.Hello, context: grpc.ServicerContext) -> Any:
        spawned = self.spawned.get(hello.call_id)
        if spawned is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no call {hello.call_id!r} in this workspace")
        assert spawned is not None
        if not spawned.done.wait(hello.timeout or None):
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                          f"call {hello.call_id} is still running after {hello.timeout:g} s")
        assert spawned.result is not None
        yield pb.ServerMessage(result=spawned.result)
