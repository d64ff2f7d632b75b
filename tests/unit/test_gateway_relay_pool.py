"""Connections from the gateway to a worker's relay are kept and reused (executor_client.Pool), over
real loopback sockets with a fake executor (a unix socket server speaking the wire protocol): calls
in a row share one connection; a kept connection that died while idle does not fail a call (it is
tried once more on a new one, sent once); a relay of before (one call per connection) and a call
that sent a cancel leave nothing kept."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from levers9.executor import wire
from levers9.executor.wire import relay_address
from levers9.gateway.executor_client import Pool, attempt
from levers9.worker.sandboxes.executor_relay import Relay


class Seen:
    async def output(self, fd: int, text: str) -> None:
        return None

    async def item(self, value: bytes) -> None:
        return None


async def fake_executor(path: Path, hang: bool = False, dies: bool = False):
    async def serve(reader, writer):
        writer.write(wire.encode({"kind": "hello", "generation": wire.GENERATION}))
        try:
            _, body = await wire.aread_frame(reader)
            if dies:  # killed mid-call (out of memory, say): its connection ends with no result
                writer.write(wire.encode({"kind": "output", "fd": 1, "text": "allocating\n"}))
            elif hang:
                await wire.aread_frame(reader)  # the cancel
                writer.write(wire.encode({"kind": "result", "ok": False, "reason": "cancelled"}))
            else:
                writer.write(wire.encode({"kind": "result", "ok": True}, body[::-1]))
            await writer.drain()
        except wire.ProtocolError:
            pass
        writer.close()

    return await asyncio.start_unix_server(serve, str(path))


class OldRelay(Relay):
    """A relay of before: one call per connection, whatever the line asks."""

    async def _one(self, line, reader, writer) -> bool:
        await super()._one(line, reader, writer)
        return False


async def setup(tmp_path: Path, relay_class: type[Relay] = Relay, hang: bool = False, dies: bool = False):
    sock = tmp_path / "executor.sock"
    executor = await fake_executor(sock, hang, dies)
    relay = relay_class({"c1": sock, "c2": sock}.get)
    server = await asyncio.start_server(relay.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return executor, relay, server, port


async def call(pool: Pool, relay: Relay, port: int, cid: str = "c1", body: bytes = b"abc", sent: list | None = None,
               cancel: asyncio.Event | None = None):
    return await attempt(relay_address("127.0.0.1", port, cid, relay.key(cid)), {"kind": "call"}, body, Seen(), 10.0,
                         cancel or asyncio.Event(), on_sent=lambda: (sent if sent is not None else []).append(1),
                         pool=pool)


async def settled(pool: Pool) -> None:
    while pool.waiting:
        await asyncio.sleep(0.01)


async def test_calls_in_a_row_share_one_connection_to_the_relay(tmp_path):
    executor, relay, server, port = await setup(tmp_path)
    pool = Pool()
    for n, cid in enumerate(["c1", "c2", "c1"]):
        outcome = await call(pool, relay, port, cid, body=b"x%d" % n)
        assert outcome.ok and outcome.value == (b"x%d" % n)[::-1]
        await settled(pool)
    assert (pool.opened, pool.reused) == (1, 2) and relay.connections == 1
    # calls at once each take a connection: all kept afterwards
    outcomes = await asyncio.gather(*(call(pool, relay, port) for _ in range(5)))
    await settled(pool)
    assert all(o.ok for o in outcomes) and pool.opened == 5 and len(pool.idle[("127.0.0.1", port)]) == 5
    await pool.close()
    server.close()
    executor.close()


async def test_a_kept_connection_that_died_while_idle_is_tried_again_on_a_new_one(tmp_path):
    executor, relay, server, port = await setup(tmp_path)
    pool = Pool()
    assert (await call(pool, relay, port)).ok
    await settled(pool)

    async def dead_peer(reader, writer):  # takes the line and closes, as a worker that went away
        await reader.readline()
        writer.close()
    dead = await asyncio.start_server(dead_peer, "127.0.0.1", 0)
    stale = await asyncio.open_connection("127.0.0.1", dead.sockets[0].getsockname()[1])
    pool.idle[("127.0.0.1", port)].append((time.monotonic(), stale))  # the next call takes it first
    sent: list[int] = []
    outcome = await call(pool, relay, port, sent=sent)
    assert outcome.ok and outcome.value == b"cba" and sent == [1]  # sent once, on the new connection
    assert pool.opened == 2
    await pool.close()
    server.close()
    dead.close()
    executor.close()


async def test_a_relay_of_before_and_a_cancelled_call_leave_nothing_kept(tmp_path):
    executor, relay, server, port = await setup(tmp_path, OldRelay)
    pool = Pool()
    for _ in range(2):
        assert (await call(pool, relay, port)).ok
        await settled(pool)
    assert pool.opened == 2 and pool.reused == 0 and not pool.idle[("127.0.0.1", port)]
    server.close()
    executor.close()

    (tmp_path / "hang").mkdir()
    executor, relay, server, port = await setup(tmp_path / "hang", hang=True)
    cancel = asyncio.Event()
    asyncio.get_running_loop().call_later(0.2, cancel.set)
    outcome = await call(pool, relay, port, cancel=cancel)
    await settled(pool)
    assert outcome.reason == "cancelled" and not pool.idle[("127.0.0.1", port)]
    server.close()
    executor.close()


async def test_an_executor_that_dies_mid_call_breaks_the_call_on_a_kept_connection(tmp_path):
    """The relay keeps the gateway's connection when the executor's ends, and says so: mid-call that
    is the sandbox's death, which the call must see at once (not wait for its timeout)."""
    executor, relay, server, port = await setup(tmp_path, dies=True)
    pool = Pool()
    outcome = await asyncio.wait_for(call(pool, relay, port), 5)
    assert not outcome.ok and outcome.lost and not outcome.undelivered and "connection closed" in outcome.reason
    await settled(pool)
    assert not pool.idle[("127.0.0.1", port)]
    server.close()
    executor.close()
