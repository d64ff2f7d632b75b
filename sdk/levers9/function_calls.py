"""Function calls over the gateway's Call stream: `.remote`, `.map`, `.remote_gen`, `.spawn` and
`FunctionCall.get`, each one stream (levers9.functions.v1).

How one stream goes:
1. Everything is pickled before anything is sent: the arguments first (an argument that cannot be
   pickled fails here, naming it), then the function; the first call of a Function describes it
   (the sandbox's Python must be this one's major.minor).
2. Hello, then inputs, at most MAP_WINDOW in flight: the next input is pulled from the caller's
   iterable only when a result makes room, so a map over an endless generator holds a bounded
   number. An input over INLINE_LIMIT goes by UploadRequest -> UploadUrl -> HTTP PUT -> Input(blob_key).
3. Outputs are written to sys.stdout / sys.stderr as they come; results are unpickled (or fetched
   from blob_url); an exception comes back as its own type with the remote traceback attached.
4. A stream left early (Ctrl-C, a failing .map, a generator closed) sends Cancel, closes its side,
   waits a moment for the gateway to stop the calls, then cancels the RPC. Spawned calls run on.

Requests go through a queue that gRPC's own thread drains; responses are read on the caller's
thread, so the caller's iterable is consumed there and Ctrl-C lands where it waits.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import queue
import threading
from typing import Any, Callable, Generator, Iterable, Iterator, Protocol

import grpc

from levers9.contracts.proto import functions_pb2 as pb
from levers9.contracts.proto import functions_pb2_grpc as pb_grpc
from levers9.function_client import PROTOCOL, Target, connect, describe, get_blob, local_python, put_blob, rpc_error
from levers9.function_errors import FunctionError, FunctionTimeoutError, PlatformError, platform_error
from levers9.function_pickling import (
    attach_traceback,
    imported_names,
    load_value,
    pickle_args,
    pickle_function,
    remote_exception,
    third_party,
)
from levers9.function_sessions import session_for

INLINE_LIMIT = 4 << 20  # larger inputs are uploaded; the gateway sends larger results as blob_url
MAP_WINDOW = 100  # inputs in flight on one stream
WAIT_STEP = 0.2  # seconds between checks for Ctrl-C while waiting
_END = object()
CANCEL_GRACE = 1.0  # seconds a cancelled stream waits for the gateway to end it before cancelling the RPC


# ---- what a call needs of a Function -----------------------------------------------------------

class RemoteFunction(Protocol):
    """What a call needs of a levers9.functions.Function: its names, spec and local code, and its
    caches (the first call's DescribeReply, the local code's imports). A narrow view: Function
    imports this module when a call is made; this module never imports that one."""

    local: Callable[..., Any] | None
    app_name: str
    name: str
    spec: dict[str, Any]
    is_generator: bool
    _lock: threading.Lock
    _described: Any
    _imports: list[str] | None

    @property
    def label(self) -> str: ...


# ---- one stream ----------------------------------------------------------------------------------

class Stream:
    """One Call RPC. `with Stream(...)`: leaving the block before the gateway ended the stream
    cancels it (Cancel, then the RPC itself).

    A thread reads the responses into a queue, which the caller's thread waits on in short steps:
    Ctrl-C lands between two, never inside a gRPC operation."""

    def __init__(self, stub: pb_grpc.FunctionsStub, target: Target, hello: pb.Hello, what: str,
                 timeout: float | None = None, cancels_calls: bool = True):
        self.what, self.target, self.cancels_calls = what, target, cancels_calls
        self.ended = False
        self.correlation_id = ""
        self._requests: queue.SimpleQueue[pb.ClientMessage | None] = queue.SimpleQueue()
        self._responses: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False  # our side: nothing more will be sent
        self._handed_over = threading.Event()  # gRPC has taken our last message
        self._read_all = threading.Event()  # the gateway ended the stream
        self._call = stub.Call(self._request_iterator(hello), metadata=target.metadata, timeout=timeout)
        threading.Thread(target=self._read, daemon=True, name="levers9-call").start()

    def _read(self) -> None:
        try:
            for message in self._call:
                self._responses.put(message)
            self._responses.put(_END)
        except grpc.RpcError as exc:
            self._responses.put(exc)
        finally:
            self._read_all.set()

    def _request_iterator(self, hello: pb.Hello) -> Iterator[pb.ClientMessage]:
        try:
            yield pb.ClientMessage(hello=hello)
            while (message := self._requests.get()) is not None:
                yield message
        finally:
            self._handed_over.set()

    def send(self, message: pb.ClientMessage) -> None:
        if not self._closed:
            self._requests.put(message)

    def close_side(self) -> None:
        """Half-close: the gateway sees the end of our messages."""
        if not self._closed:
            self._closed = True
            self._requests.put(None)

    def receive(self) -> pb.ServerMessage | None:
        """The next server message; None when the gateway ended the stream."""
        while True:
            try:
                item = self._responses.get(timeout=WAIT_STEP)
                break
            except queue.Empty:
                continue
        if isinstance(item, pb.ServerMessage):
            return item
        self.ended = True
        self.close_side()
        if isinstance(item, grpc.RpcError):
            raise rpc_error(item, self.what, self.target.address) from None
        return None

    def cancel(self, reason: str) -> None:
        """Stop the stream's calls: Cancel, half-close, a moment for the gateway to end it, then the RPC."""
        if self.ended:
            return
        self.ended = True
        if self.cancels_calls:
            self.send(pb.ClientMessage(cancel=pb.Cancel(reason=reason)))
        self.close_side()
        self._handed_over.wait(CANCEL_GRACE)
        self._read_all.wait(CANCEL_GRACE)
        self._call.cancel()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self.ended:
            why = "interrupted (Ctrl-C)" if exc_type is KeyboardInterrupt else \
                f"the caller stopped ({exc_type.__name__})" if exc_type else "the caller stopped reading"
            self.cancel(why)


class Exchange:
    """Inputs out, at most `window` in flight; server messages in. Accepted, Output and UploadUrl are
    handled here; Item, Result and Spawned are yielded."""

    def __init__(self, stream: Stream, inputs: Iterator[bytes] | None, window: int | None = None):
        self.stream, self.inputs, self.window = stream, inputs, max(1, window or MAP_WINDOW)
        self.sent = 0  # inputs sent (or being uploaded)
        self.inflight = 0
        self.exhausted = inputs is None
        self.done_sent = inputs is None
        self.uploads: dict[int, bytes] = {}  # inputs waiting for their upload URL

    def fill(self) -> None:
        """Send inputs while there is room; InputsDone after the last (its upload included: the
        gateway reads no input after InputsDone)."""
        while not self.exhausted and self.inflight < self.window:
            assert self.inputs is not None
            payload = next(self.inputs, None)
            if payload is None:
                self.exhausted = True
                break
            index, self.sent, self.inflight = self.sent, self.sent + 1, self.inflight + 1
            if len(payload) > INLINE_LIMIT:
                self.uploads[index] = payload
                self.stream.send(pb.ClientMessage(upload=pb.UploadRequest(index=index, size=len(payload))))
            else:
                self.stream.send(pb.ClientMessage(input=pb.Input(index=index, args=payload)))
        if self.exhausted and not self.uploads and not self.done_sent:
            self.done_sent = True
            self.stream.send(pb.ClientMessage(done=pb.InputsDone()))

    def messages(self) -> Iterator[pb.ServerMessage]:
        while True:
            self.fill()
            message = self.stream.receive()
            if message is None:
                return
            kind = message.WhichOneof("kind")
            if kind == "accepted":
                self.stream.correlation_id = message.accepted.correlation_id
            elif kind == "output":
                write_output(message.output)
            elif kind == "upload":
                self.upload(message.upload)
            else:
                if kind in ("result", "spawned"):
                    self.inflight -= 1
                yield message

    def upload(self, where: pb.UploadUrl) -> None:
        payload = self.uploads.pop(where.index, None)
        if payload is None:
            raise FunctionError(f"{self.stream.what}: the gateway sent an upload URL for input {where.index}, which "
                                "asked for none: is the gateway this version of levers9?")
        put_blob(where.url, payload, f"input {where.index} of {self.stream.what}")
        self.stream.send(pb.ClientMessage(input=pb.Input(index=where.index, blob_key=where.blob_key)))


def write_output(output: pb.Output) -> None:
    """The function's print, to this process's stdout (fd 1) or stderr (fd 2), at once."""
    import sys

    target = sys.stderr if output.fd == 2 else sys.stdout
    target.write(output.text)
    target.flush()


def outcome(result: pb.Result, stream: Stream) -> tuple[bool, Any]:
    """(True, the value) or (False, the exception to raise), the remote traceback attached."""
    data = result.value
    if not data and result.blob_url:
        data = get_blob(result.blob_url, f"the result of {stream.what}")
    if result.ok:
        return True, load_value(data, f"the result of {stream.what}") if data else None
    if result.reason:
        error = platform_error(result.reason, result.call_id, stream.correlation_id, stream.what)
        return False, attach_traceback(error, result.traceback)
    return False, remote_exception(data, result.error_type, result.error, result.traceback, stream.correlation_id)


# ---- what a call sends ---------------------------------------------------------------------------

def function_ref(fn: RemoteFunction) -> pb.FunctionRef:
    """A looked-up function by app and name; a local one pickled by value with its spec."""
    if fn.local is None:
        return pb.FunctionRef(app=fn.app_name, name=fn.name, generator=fn.is_generator)
    if fn._imports is None:
        fn._imports = imported_names(fn.local)
    options = fn.spec.get("function", {})
    return pb.FunctionRef(app=fn.app_name, name=fn.name, pickled=pickle_function(fn.local, fn._imports),
                          spec_json=json.dumps(fn.spec), generator=fn.is_generator,
                          retries=int(options.get("retries", 0)), packages=list(options.get("packages", [])),
                          imports=third_party(fn._imports))


def ensure_described(fn: RemoteFunction, ref: pb.FunctionRef) -> pb.DescribeReply:
    """Describe the function once (its sandbox's Python is checked there); cached on it."""
    with fn._lock:
        if fn._described is None:
            fn._described = describe(ref, fn.label)
        return fn._described


def hello(fn: RemoteFunction, ref: pb.FunctionRef, mode: str) -> pb.Hello:
    session = session_for(fn.app_name)
    return pb.Hello(protocol=PROTOCOL, function=ref, mode=mode, python=local_python(),
                    session_id=session.use() if session is not None else "")


def open_stream(fn: RemoteFunction, mode: str) -> Stream:
    ref = function_ref(fn)
    ensure_described(fn, ref)
    stub, target = connect()
    return Stream(stub, target, hello(fn, ref, mode), fn.label)


# ---- the calls -----------------------------------------------------------------------------------

def remote(fn: RemoteFunction, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    payload = pickle_args(args, kwargs, fn.label)
    [(ok, value)] = list(results(fn, iter([payload]), ordered=True))
    if not ok:
        raise value
    return value


def map_calls(fn: RemoteFunction, argument_lists: Iterable[tuple[tuple[Any, ...], dict[str, Any]]],
              return_exceptions: bool, ordered: bool) -> Iterator[Any]:
    """Each input's value (in input order when ordered); the first failure raises (the rest are
    cancelled) unless return_exceptions, which yields it in its place."""
    calls = iter(argument_lists)
    first = next(calls, None)
    if first is None:
        return
    first_payload = pickle_args(*first, fn.label, 0)  # before anything is sent
    rest = (pickle_args(a, kw, fn.label, i) for i, (a, kw) in enumerate(calls, start=1))
    with contextlib.closing(results(fn, itertools.chain([first_payload], rest), ordered)) as outcomes:
        for ok, value in outcomes:
            if not ok and not return_exceptions:
                raise value
            yield value


def results(fn: RemoteFunction, payloads: Iterator[bytes], ordered: bool) -> Generator[tuple[bool, Any], None, None]:
    """(ok, value) per input, over one stream; in input order through a reorder buffer when ordered."""
    with open_stream(fn, "call") as stream:
        exchange = Exchange(stream, payloads)
        waiting: dict[int, tuple[bool, Any]] = {}
        done = 0
        for message in exchange.messages():
            if message.WhichOneof("kind") != "result":
                continue
            if not ordered:
                done += 1
                yield outcome(message.result, stream)
                continue
            waiting[message.result.index] = outcome(message.result, stream)
            while done in waiting:
                yield waiting.pop(done)
                done += 1
        if done < exchange.sent or not exchange.done_sent:
            raise PlatformError(f"{fn.label}: the gateway ended the stream with {exchange.sent - done} of "
                                f"{exchange.sent} inputs unanswered", "stream ended",
                                correlation_id=stream.correlation_id)


def remote_gen(fn: RemoteFunction, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[Any]:
    """The items a generator function yields, as they come."""
    payload = pickle_args(args, kwargs, fn.label)
    with open_stream(fn, "call") as stream:
        for message in Exchange(stream, iter([payload]), 1).messages():
            kind = message.WhichOneof("kind")
            if kind == "item":
                yield load_value(message.item.value, f"an item of {fn.label}")
            elif kind == "result":
                ok, value = outcome(message.result, stream)
                if not ok:
                    raise value


def spawn(fn: RemoteFunction, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """Start the call and return its id at once; it runs on whatever this process does."""
    payload = pickle_args(args, kwargs, fn.label)
    call_id = ""
    with open_stream(fn, "spawn") as stream:
        for message in Exchange(stream, iter([payload]), 1).messages():
            kind = message.WhichOneof("kind")
            if kind == "spawned":
                call_id = message.spawned.call_id
            elif kind == "result":
                ok, value = outcome(message.result, stream)
                if not ok:
                    raise value
    if not call_id:
        raise FunctionError(f"spawning {fn.label}: the gateway ended the stream without a call id: see the "
                            "gateway's log")
    return call_id


def get(call_id: str, timeout: float | None) -> Any:
    """Wait for a spawned call's result (timeout: seconds; None until it is done)."""
    stub, target = connect()
    what = f"call {call_id}"
    message = pb.Hello(protocol=PROTOCOL, mode="get", call_id=call_id, timeout=float(timeout or 0),
                       python=local_python())
    deadline = timeout + 60.0 if timeout else None  # the gateway answers the timeout itself
    try:
        with Stream(stub, target, message, what, deadline, cancels_calls=False) as stream:
            stream.close_side()  # a get sends nothing more; leaving it early never cancels the call
            for reply in Exchange(stream, None).messages():
                if reply.WhichOneof("kind") == "result":
                    ok, value = outcome(reply.result, stream)
                    if not ok:
                        raise value
                    return value
    except FunctionTimeoutError as exc:
        if exc.call_id:  # the call itself timed out
            raise
        raise FunctionTimeoutError(f"{what} did not finish within {timeout or 0:g} s; it runs on: wait again with "
                                   f"FunctionCall.from_id({call_id!r}).get()", "timeout", call_id) from None
    raise FunctionError(f"waiting for {what}: the gateway ended the stream without its result: see the gateway's log")
