"""The worker's relay and the gateway's attempt, over real sockets: a fake executor (a unix
socket server speaking the wire protocol, named as a fake) stands in for a sandbox."""

from __future__ import annotations

import asyncio
from pathlib import Path

from levers9.executor import wire
from levers9.executor.wire import relay_address
from levers9.gateway.executor_client import attempt
from levers9.worker.executor_relay import Relay


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
    seen = Seen()
    outcome = await attempt(relay_address("127.0.0.1", port, "c1", relay.key("c1")), {"kind": "call"}, b"abc",
                            seen, 10.0, asyncio.Event())
    assert outcome.ok and outcome.value == b"cba"
    assert seen.out == [(1, "got 3 bytes\n")] and seen.items == [b"one"]
    server.close()
    executor.close()


async def test_the_relay_refuses_a_wrong_key_or_an_unknown_container(tmp_path):
    relay = Relay({}.get)
    server, port = await relay_server(relay)
    wrong = await attempt(relay_address("127.0.0.1", port, "c1", "0" * 32), {"kind": "call"}, b"", Seen(), 5.0,
                          asyncio.Event())
    assert not wrong.ok and "wrong key" in wrong.reason
    unknown = await attempt(relay_address("127.0.0.1", port, "c1", relay.key("c1")), {"kind": "call"}, b"",
                            Seen(), 5.0, asyncio.Event())
    assert not unknown.ok and "not a ready function sandbox" in unknown.reason
    server.close()


async def test_an_executor_of_another_generation_is_refused_with_what_to_do(tmp_path):
    sock = tmp_path / "executor.sock"
    executor = await fake_executor(sock, generation=99)
    relay = Relay({"c1": sock}.get)
    server, port = await relay_server(relay)
    outcome = await attempt(relay_address("127.0.0.1", port, "c1", relay.key("c1")), {"kind": "call"}, b"",
                            Seen(), 5.0, asyncio.Event())
    assert not outcome.ok and "generation 99" in outcome.reason and "upgrade" in outcome.reason
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
