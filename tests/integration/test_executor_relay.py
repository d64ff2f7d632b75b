"""The worker's relay and the gateway's attempt, over real sockets: a fake executor (a unix
socket server speaking the wire protocol, named as a fake) stands in for a sandbox."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from levers9.executor import wire
from levers9.executor.wire import relay_address
from levers9.gateway.executor_client import attempt
from levers9.gateway.function_calls import Calls, Plan
from levers9.gateway.router import DeploymentRouter
from levers9.worker.sandboxes.executor_relay import Relay


class Seen:
    def __init__(self) -> None:
        self.out: list[tuple[int, str]] = []
        self.items: list[bytes] = []

    async def output(self, fd: int, text: str) -> None:
        self.out.append((fd, text))

    async def item(self, value: bytes) -> None:
        self.items.append(value)


async def fake_executor(path: Path, generation: int = wire.GENERATION, hang: bool = False):
    async def serve(reader, writer):
        writer.write(wire.encode({"kind": "hello", "generation": generation, "python": "3.11"}))
        try:
            header, body = await wire.aread_frame(reader)
        except wire.ProtocolError:
            return
        writer.write(wire.encode({"kind": "output", "fd": 1, "text": f"got {len(body)} bytes\n"}))
        writer.write(wire.encode({"kind": "item"}, b"one"))
        if hang:  # answers a cancel only
            cancel, _ = await wire.aread_frame(reader)
            writer.write(wire.encode({"kind": "result", "ok": False, "reason": "cancelled"}))
        else:
            writer.write(wire.encode({"kind": "result", "ok": True}, body[::-1]))
        await writer.drain()
        writer.close()

    return await asyncio.start_unix_server(serve, str(path))


async def relay_server(relay: Relay):
    server = await asyncio.start_server(relay.serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_a_call_goes_through_the_relay_to_the_executor_and_back(tmp_path):
    sock = tmp_path / "executor.sock"
    executor = await fake_executor(sock)
    relay = Relay({"c1": sock}.get)
    server, port = await relay_server(relay)
    seen, sent = Seen(), []
    outcome = await attempt(relay_address("127.0.0.1", port, "c1", relay.key("c1")), {"kind": "call"}, b"abc",
                            seen, 10.0, asyncio.Event(), on_sent=lambda: sent.append(1))
    assert outcome.ok and outcome.value == b"cba" and sent == [1] and not outcome.undelivered
    assert seen.out == [(1, "got 3 bytes\n")] and seen.items == [b"one"]
    server.close()
    executor.close()


async def test_the_relay_refuses_a_wrong_key_or_an_unknown_container(tmp_path):
    relay = Relay({}.get)
    server, port = await relay_server(relay)
    wrong = await attempt(relay_address("127.0.0.1", port, "c1", "0" * 32), {"kind": "call"}, b"", Seen(), 5.0,
                          asyncio.Event())
    assert not wrong.ok and "wrong key" in wrong.reason and wrong.undelivered
    unknown = await attempt(relay_address("127.0.0.1", port, "c1", relay.key("c1")), {"kind": "call"}, b"",
                            Seen(), 5.0, asyncio.Event())
    assert not unknown.ok and "not a ready function sandbox" in unknown.reason and unknown.undelivered
    server.close()
    await server.wait_closed()
    gone = await attempt(relay_address("127.0.0.1", port, "c1", relay.key("c1")), {"kind": "call"}, b"",
                         Seen(), 5.0, asyncio.Event(), on_sent=lambda: pytest.fail("nothing was sent"))
    assert not gone.ok and "could not reach the sandbox" in gone.reason and gone.undelivered


async def test_an_executor_of_another_generation_is_refused_with_what_to_do(tmp_path):
    sock = tmp_path / "executor.sock"
    executor = await fake_executor(sock, generation=99)
    relay = Relay({"c1": sock}.get)
    server, port = await relay_server(relay)
    outcome = await attempt(relay_address("127.0.0.1", port, "c1", relay.key("c1")), {"kind": "call"}, b"",
                            Seen(), 5.0, asyncio.Event())
    assert not outcome.ok and "generation 99" in outcome.reason and "upgrade" in outcome.reason
    assert not outcome.undelivered  # every sandbox of that image would say the same: not tried elsewhere
    server.close()
    executor.close()


async def test_a_cancel_reaches_the_executor_and_its_answer_comes_back(tmp_path):
    sock = tmp_path / "executor.sock"
    executor = await fake_executor(sock, hang=True)
    relay = Relay({"c1": sock}.get)
    server, port = await relay_server(relay)
    cancel = asyncio.Event()
    asyncio.get_running_loop().call_later(0.3, cancel.set)
    outcome = await attempt(relay_address("127.0.0.1", port, "c1", relay.key("c1")), {"kind": "call"}, b"",
                            Seen(), 30.0, cancel)
    assert not outcome.ok and outcome.reason == "cancelled" and outcome.kind == "cancelled"
    server.close()
    executor.close()


async def test_a_call_refused_by_a_sandbox_that_ended_goes_to_another_sandbox_in_the_same_attempt(tmp_path):
    """A sandbox that ended before the gateway heard of it: its worker's relay refuses the call (or
    nothing listens any more). The function never ran there, so the call goes to the next sandbox,
    and the log has one Started, naming the sandbox that ran it."""
    from levers9.contracts import events as E
    from levers9.contracts.spec import decode_spec
    from levers9.gateway.state import Deployment

    sock = tmp_path / "executor.sock"
    executor = await fake_executor(sock)
    relay = Relay({"c-alive": sock}.get)
    server, port = await relay_server(relay)
    router = DeploymentRouter("fn-v1", concurrency=1, max_containers=3)
    await router.update("c-ended", "ready", relay_address("127.0.0.1", port, "c-ended", relay.key("c-ended")))
    await router.update("c-alive", "ready", relay_address("127.0.0.1", port, "c-alive", relay.key("c-alive")))

    async def no_new_sandbox() -> str:
        raise AssertionError("a ready sandbox was there")

    spec = decode_spec(json.dumps({"name": "fn", "code": {"kind": "function", "module": "m", "handler": "f"}}))
    plan = Plan(dep=Deployment("w", "fn-v1", "fn", 1, "active", spec), function="f", router=router,
                request_container=no_new_sandbox, header={"kind": "call"}, function_bytes=b"", retries=0,
                timeout=10.0, workspace="w", token_id="t", correlation_id="k")
    calls = Calls(gw=None)  # type: ignore[arg-type]  # a delivered call needs nothing of the gateway
    outcome = await calls.once(plan, "call-1", 1, b"abc", Seen(), asyncio.Event())
    assert outcome.ok and outcome.value == b"cba"
    assert list(router.containers) == ["c-alive"] and router.containers["c-alive"].inflight == 0
    logged = [calls.log_queue.get_nowait()[0] for _ in range(calls.log_queue.qsize())]
    assert [(type(e), e.container_id) for e in logged] == [(E.FunctionCallStarted, "c-alive")]
    server.close()
    executor.close()


async def test_a_link_the_sandbox_plants_as_its_socket_is_never_followed(tmp_path):
    """The socket's directory is the sandbox's own (/run/levers9 inside): it can replace its socket with
    a link to a socket of the host. The relay (root on the host) must not connect there for it."""
    host_socket = tmp_path / "host-db.sock"  # stands for a control-plane socket (Postgres's)
    reached: list[int] = []

    async def host_server(reader, writer):
        reached.append(1)
        writer.close()
    host = await asyncio.start_unix_server(host_server, str(host_socket))
    sandbox_dir = tmp_path / "sandbox"
    sandbox_dir.mkdir()
    sock = sandbox_dir / "executor.sock"
    sock.symlink_to(host_socket)
    relay = Relay({"c1": sock}.get)
    server, port = await relay_server(relay)
    outcome = await attempt(relay_address("127.0.0.1", port, "c1", relay.key("c1")), {"kind": "call"}, b"x",
                            Seen(), 5.0, asyncio.Event())
    assert not outcome.ok and "not a socket" in outcome.reason, outcome.reason
    await asyncio.sleep(0.2)  # a connection the relay made would have been accepted by now
    assert reached == []
    server.close()
    host.close()
