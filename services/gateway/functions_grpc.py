"""The gateway's gRPC service for Python function calls (levers9.functions.v1, libs/contracts/proto).

One bidirectional stream per `.remote`/`.map`/`.remote_gen`/`.spawn`/`FunctionCall.get`: a Hello
names the function, inputs stream in, outputs and results stream out. The token is the
`authorization: Bearer …` metadata. Inputs are read only while the function has room
(max_containers × concurrency calls in flight), so a client mapping over a million inputs is held
back by HTTP/2 flow control instead of filling the gateway's memory. A client that goes away
cancels its calls; spawned calls run on.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any, AsyncIterator

import grpc

from levers9.contracts import uuid7
from levers9.contracts.proto import functions_pb2 as pb
from levers9.contracts.proto import functions_pb2_grpc as pb_grpc

from .auth import Caller, bearer_secret, lookup, user_refusal
from .executor_client import Outcome
from .function_calls import Calls, Plan
from .function_plans import plan_for
from .function_targets import Sessions, TargetError, adhoc, adhoc_spec, deployed
from .host_paths import hostless
from .state import Gateway as GatewayState

log = logging.getLogger("levers9.gateway.grpc")

PROTOCOL = 1
MAX_MESSAGE = 64 << 20
INLINE_LIMIT = 4 << 20  # larger values travel through S3 by reference


class Streamed:
    """A Sink that turns the executor's output into ServerMessages on one stream's queue."""

    def __init__(self, queue: asyncio.Queue[pb.ServerMessage | None], index: int) -> None:
        self.queue, self.index = queue, index

    async def output(self, fd: int, text: str) -> None:
        await self.queue.put(pb.ServerMessage(output=pb.Output(index=self.index, fd=fd, text=text)))

    async def item(self, value: bytes) -> None:
        await self.queue.put(pb.ServerMessage(item=pb.Item(index=self.index, value=value)))


def result_message(index: int, call_id: str, outcome: Outcome, attempts: int, blob_url: str = "") -> pb.ServerMessage:
    return pb.ServerMessage(result=pb.Result(
        index=index, call_id=call_id, ok=outcome.ok, value=b"" if blob_url else outcome.value, blob_url=blob_url,
        error_type=outcome.error_type, error=outcome.error, traceback=outcome.traceback, attempts=attempts,
        duration=float(outcome.header.get("duration", 0.0)), reason=outcome.reason))


class Functions(pb_grpc.FunctionsServicer):
    def __init__(self, gw: GatewayState) -> None:
        self.gw = gw
        self.calls = Calls(gw)
        self.sessions = Sessions(gw)
        from .function_blobs import Blobs

        self.blobs = Blobs(gw)

    async def caller(self, context: grpc.aio.ServicerContext) -> Caller:
        metadata = dict(context.invocation_metadata() or ())
        secret = bearer_secret(str(metadata.get("authorization", "")))
        if not secret:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing token: send metadata "
                                "'authorization: Bearer <token>' (levers9 up writes one to ~/.levers9/config.toml)")
        found = await lookup(self.gw, secret)
        if found is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "this token is unknown or revoked: create one with "
                                                                 "`levers9 token create`")
        assert found is not None
        refusal = user_refusal(found)
        if refusal:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)
        return found

    async def Echo(self, request: pb.EchoRequest, context: grpc.aio.ServicerContext) -> pb.EchoReply:
        await self.caller(context)
        return pb.EchoReply(payload=request.payload)

    async def Describe(self, request: pb.DescribeRequest, context: grpc.aio.ServicerContext) -> pb.DescribeReply:
        who = await self.caller(context)
        ref = request.function
        try:
            if ref.pickled or not ref.app and not ref.name:
                spec = adhoc_spec(ref.spec_json, ref.name)
                return pb.DescribeReply(exists=True, python=self.python_of(spec.image is not None and
                                                                           bool(spec.image.base_image)),
                                        generator=ref.generator)
            dep = await deployed(self.gw, who.workspace, ref.app, ref.name)
        except TargetError as exc:
            await context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
            raise
        generator = bool(dep.spec.function and dep.spec.function.generator)
        own_base = dep.spec.image is not None and bool(dep.spec.image.base_image)
        return pb.DescribeReply(exists=True, python=self.python_of(own_base), function_id=dep.deployment_id,
                                generator=generator)

    def python_of(self, own_base: bool) -> str:
        """The sandbox's major.minor: the platform base's; "" (unknown) for an image on a base of its own."""
        return "" if own_base else self.gw.settings.functions.sandbox_python

    async def EndSession(self, request: pb.EndSessionRequest, context: grpc.aio.ServicerContext) -> pb.EndSessionReply:
        who = await self.caller(context)
        ended = await self.sessions.end(request.session_id, who.workspace, "session ended by the client")
        return pb.EndSessionReply(ended=ended)

    async def Call(self, requests: AsyncIterator[pb.ClientMessage],
                   context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ServerMessage]:
        who = await self.caller(context)
        first = await anext(aiter(requests), None)
        if first is None or first.WhichOneof("kind") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message of a call must be a Hello")
        assert first is not None
        hello = first.hello
        if hello.protocol != PROTOCOL:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"this gateway speaks function protocol {PROTOCOL}, the client {hello.protocol}: "
                                "use a levers9 SDK of this platform's version")
        if hello.mode == "get":
            async for message in self.get(who, hello, context):
                yield message
            return
        queue: asyncio.Queue[pb.ServerMessage | None] = asyncio.Queue()
        plan = await self.plan(who, hello, context, queue)
        yield pb.ServerMessage(accepted=pb.Accepted(function_id=plan.dep.deployment_id,
                                                    correlation_id=plan.correlation_id,
                                                    python=self.gw.settings.functions.sandbox_python))
        async for message in self.serve(plan, requests, queue, hello.mode == "spawn"):
            yield message

    async def plan(self, who: Caller, hello: pb.Hello, context: grpc.aio.ServicerContext,
                   queue: asyncio.Queue[pb.ServerMessage | None]) -> Plan:
        async def progress(text: str) -> None:
            await queue.put(pb.ServerMessage(output=pb.Output(index=0, fd=2, text=text)))

        ref = hello.function
        try:
            if ref.pickled:
                dep = await adhoc(self.gw, who.workspace, adhoc_spec(ref.spec_json, ref.name or "function"), progress)
            else:
                dep = await deployed(self.gw, who.workspace, ref.app, ref.name)
        except TargetError as exc:
            await context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
            raise
        try:
            return await plan_for(self.gw, self.sessions, who, dep, ref, hello.session_id, hello.mode or "call",
                                  uuid7())
        except TargetError as exc:
            await context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
            raise

    async def serve(self, plan: Plan, requests: AsyncIterator[pb.ClientMessage],
                    queue: asyncio.Queue[pb.ServerMessage | None], spawn: bool) -> AsyncIterator[pb.ServerMessage]:
        """Read inputs while there is room, run each, and stream what they produce until all are done."""
        cancel = asyncio.Event()
        reader = asyncio.create_task(self.read_inputs(plan, requests, queue, cancel, spawn))
        try:
            while True:
                message = await queue.get()
                if message is None:
                    break
                yield message
            await reader
        finally:
            # a client that went away cancels its calls (spawned ones run on); the reader is left to
            # finish them, so each cancel reaches its executor, frees its slot and is recorded
            cancel.set()
            if not reader.done():
                self.gw.background_tasks.add(reader)
                reader.add_done_callback(self.gw.background_tasks.discard)

    async def read_inputs(self, plan: Plan, requests: AsyncIterator[pb.ClientMessage],
                          queue: asyncio.Queue[pb.ServerMessage | None], cancel: asyncio.Event, spawn: bool) -> None:
        room = asyncio.Semaphore(max(1, plan.dep.spec.scaling.max_containers * plan.dep.spec.scaling.concurrency))
        running: set[asyncio.Task] = set()
        watch: asyncio.Task | None = None
        try:
            async for message in requests:
                kind = message.WhichOneof("kind")
                if kind == "cancel":
                    cancel.set()
                elif kind == "upload":
                    await queue.put(await self.blobs.upload_url(plan, message.upload))
                elif kind == "input" and spawn:
                    args = await self.blobs.input_bytes(plan, message.input)
                    spawned = self.calls.spawn(plan, uuid7(), args)
                    await queue.put(pb.ServerMessage(spawned=pb.Spawned(index=message.input.index,
                                                                        call_id=spawned.call_id)))
                elif kind == "input":
                    await room.acquire()  # back-pressure: the next input is read when a call ends
                    task = asyncio.create_task(self.one(plan, message.input, queue, cancel, room))
                    running.add(task)
                    task.add_done_callback(running.discard)
                elif kind == "done":  # a Cancel may still come (Ctrl-C while the results stream)
                    watch = asyncio.create_task(watch_cancel(requests, cancel))
                    break
            await asyncio.gather(*running)
        except Exception as exc:  # noqa: BLE001 - the stream ends with why; the calls are cancelled
            log.exception("function stream %s failed", plan.correlation_id)
            await queue.put(pb.ServerMessage(output=pb.Output(index=0, fd=2, text=f"levers9: {hostless(str(exc))}\n")))
            cancel.set()
            await asyncio.gather(*running, return_exceptions=True)
        finally:
            if watch is not None:
                watch.cancel()
            await queue.put(None)

    async def one(self, plan: Plan, given: pb.Input, queue: asyncio.Queue[pb.ServerMessage | None],
                  cancel: asyncio.Event, room: asyncio.Semaphore) -> None:
        call_id = uuid7()
        try:
            args = await self.blobs.input_bytes(plan, given)
            outcome, attempts = await self.calls.run(plan, call_id, args, Streamed(queue, given.index), cancel)
            url = await self.blobs.result_url(plan, call_id, outcome) if len(outcome.value) > INLINE_LIMIT else ""
            await queue.put(result_message(given.index, call_id, outcome, attempts, url))
        finally:
            room.release()

    async def get(self, who: Caller, hello: pb.Hello, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        spawned = self.calls.spawned.get(hello.call_id)
        if spawned is None or spawned.workspace != who.workspace:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no call {hello.call_id!r} in this workspace (spawned "
                                                           "calls are kept an hour after they end)")
        assert spawned is not None
        try:
            await asyncio.wait_for(spawned.done.wait(), hello.timeout or None)
        except asyncio.TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"call {hello.call_id} is still running after {hello.timeout:g} s")
        assert spawned.outcome is not None
        yield result_message(0, spawned.call_id, spawned.outcome, spawned.attempts)


async def watch_cancel(requests: AsyncIterator[pb.ClientMessage], cancel: asyncio.Event) -> None:
    """After the inputs: the rest of what the client sends, for a Cancel."""
    try:
        async for message in requests:
            if message.WhichOneof("kind") == "cancel":
                cancel.set()
    except Exception:  # noqa: BLE001 - the client went away: serve() cancels its calls
        pass


async def serve(gw: GatewayState, stop: asyncio.Event) -> None:
    """The gRPC server, beside the REST API, until the gateway stops."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_MESSAGE),
                                      ("grpc.max_send_message_length", MAX_MESSAGE)])
    servicer = Functions(gw)
    gw.functions = servicer
    pb_grpc.add_FunctionsServicer_to_server(servicer, server)
    address = f"{gw.settings.process.http_host}:{gw.settings.functions.grpc_port}"
    if gw.settings.functions.grpc_tls_cert and gw.settings.functions.grpc_tls_key:
        with open(gw.settings.functions.grpc_tls_key, "rb") as k, open(gw.settings.functions.grpc_tls_cert, "rb") as c:
            credentials = grpc.ssl_server_credentials([(k.read(), c.read())])
        gw.grpc_port = server.add_secure_port(address, credentials)
    else:
        gw.grpc_port = server.add_insecure_port(address)
    await server.start()
    log.info("function calls: gRPC on %s:%d (protocol %d, Python %s)", gw.settings.process.http_host, gw.grpc_port,
             PROTOCOL, sys.version.split()[0])
    sessions = asyncio.create_task(servicer.sessions.sweep(stop))
    calls_log = asyncio.create_task(servicer.calls.publish_log(stop))
    try:
        await stop.wait()
    finally:
        await server.stop(grace=5)
        await asyncio.gather(sessions, calls_log, return_exceptions=True)
