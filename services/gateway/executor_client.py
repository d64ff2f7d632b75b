"""One attempt of a function call: to a sandbox's executor through its worker's relay.

The gateway never unpickles what passes here: the function, its arguments, its output and its
result are bytes between the client and the sandbox. `Sink` receives what the executor streams.

Connections to a worker's relay are kept and reused (`Pool`, one per gateway process): a call asks
the relay to keep its connection (`"keep": true` on its first line), and once the call's result is
in and the relay says `relay-next`, the connection goes back to the pool for the next call to any
sandbox of that worker. Why: a new TCP connection per call cost the gateway and the relay a
connect, an accept, two transports and a close on every task. A kept connection may have died
meanwhile (the worker restarted): a call that finds it so before the executor's hello was read
(nothing of the call was sent) is tried once more on a new connection. A connection on which a
cancel was sent is never kept (the cancel's bytes could still be on the way), nor one whose relay
never says `relay-next` (a worker of before: one call per connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from levers9.executor import wire

CONNECT_TIMEOUT_S = 5.0
CANCEL_GRACE_S = 3.0  # after a cancel or a timeout, how long the executor has to answer
DEADLINE_GRACE_S = 5.0  # beyond the function's timeout, before the gateway gives up on the executor
KEPT_IDLE_S = 30.0  # an idle kept connection older than this is closed, not reused (the relay waits 120 s)
KEPT_PER_WORKER = 64  # idle connections kept per relay address
NEXT_WAIT_S = 5.0  # after the result, how long the relay has to say relay-next
Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Sink(Protocol):
    async def output(self, fd: int, text: str) -> None: ...

    async def item(self, value: bytes) -> None: ...


@dataclass
class Outcome:
    ok: bool
    value: bytes = b""
    error_type: str = ""
    error: str = ""
    traceback: str = ""
    reason: str = ""  # a platform failure: timed out, cancelled, the sandbox died
    lost: bool = False  # the connection broke: the sandbox may be dead (its status says why)
    undelivered: bool = False  # the call never reached the executor: it may go to another sandbox
    header: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """The outcome recorded in the log: ok | error | timeout | cancelled | failed."""
        if self.ok:
            return "ok"
        if self.reason == "cancelled":
            return "cancelled"
        if self.reason.startswith("timed out"):
            return "timeout"
        return "failed" if self.reason else "error"


def failed(reason: str, lost: bool = False, undelivered: bool = False) -> Outcome:
    return Outcome(ok=False, reason=reason, lost=lost, undelivered=undelivered)


def relay_target(address: str, keep: bool = False) -> tuple[str, int, bytes]:
    """A sandbox's relay address -> host, port and the relay's first line."""
    try:
        host, port, container_id, key = wire.parse_relay_address(address)
    except ValueError:
        raise ValueError(f"the container's address {address!r} is not a function sandbox's") from None
    ask: dict[str, Any] = {"container_id": container_id, "key": key, **({"keep": True} if keep else {})}
    return host, port, json.dumps(ask).encode() + b"\n"


class Pool:
    """Idle connections to workers' relays, by (host, port), newest last."""

    def __init__(self) -> None:
        self.idle: dict[tuple[str, int], list[tuple[float, Conn]]] = defaultdict(list)
        self.waiting: set[asyncio.Task[None]] = set()  # connections waiting for their relay-next
        self.opened = self.reused = 0
        self.loop: asyncio.AbstractEventLoop | None = None

    async def get(self, host: str, port: int, fresh: bool = False) -> tuple[Conn, bool]:
        """A kept connection (True) or, with none or `fresh`, a new one (False; OSError/TimeoutError
        if none can be opened)."""
        if self.loop is not asyncio.get_running_loop():  # connections belong to the loop that opened them
            self.loop, self.idle = asyncio.get_running_loop(), defaultdict(list)
        kept = self.idle.get((host, port)) if not fresh else None
        while kept:
            at, conn = kept.pop()
            if time.monotonic() - at < KEPT_IDLE_S and not conn[0].at_eof() and not conn[1].is_closing():
                self.reused += 1
                return conn, True
            conn[1].close()
        conn = await asyncio.wait_for(asyncio.open_connection(host, port, limit=1 << 22), CONNECT_TIMEOUT_S)
        self.opened += 1
        return conn, False

    def give_back(self, host: str, port: int, conn: Conn) -> None:
        """The call is over: keep the connection once its relay says relay-next (in the background,
        so the call's answer never waits for it)."""
        task = asyncio.create_task(self._after_next(host, port, conn))
        self.waiting.add(task)
        task.add_done_callback(self.waiting.discard)

    async def _after_next(self, host: str, port: int, conn: Conn) -> None:
        try:
            header, _ = await asyncio.wait_for(wire.aread_frame(conn[0]), NEXT_WAIT_S)
        except (wire.ProtocolError, OSError, asyncio.TimeoutError):
            header = {}
        kept = self.idle[(host, port)]
        if header.get("kind") != "relay-next" or len(kept) >= KEPT_PER_WORKER:
            await close(conn[1])
            return
        kept.append((time.monotonic(), conn))

    async def close(self) -> None:
        for t in list(self.waiting):
            t.cancel()
        for kept in self.idle.values():
            for _, (_, writer) in kept:
                writer.close()
        self.idle.clear()


POOL = Pool()  # this process's; one event loop per gateway process


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()


async def attempt(address: str, header: dict[str, Any], body: bytes, sink: Sink, timeout: float,
                  cancel: asyncio.Event, on_sent: Callable[[], None] = lambda: None,
                  pool: Pool | None = None) -> Outcome:
    """Run the call once in the sandbox at `address`; never raises for the sandbox's failures.
    `on_sent` runs once the executor has said hello, just before the call is sent to it. A failure
    before that (no connection, the relay's refusal, no hello) is `undelivered`: the executor never
    saw the call (a sandbox that ended before the gateway heard of it, say). `pool` (None: this
    process's POOL) gives the connection to the relay and takes it back when it can serve again."""
    pool = pool if pool is not None else POOL
    try:
        host, port, line = relay_target(address, keep=True)
    except ValueError as exc:
        return failed(f"could not reach the sandbox: {exc}", lost=True, undelivered=True)
    for fresh_only in (False, True):
        try:
            (reader, writer), reused = await pool.get(host, port, fresh=fresh_only)
        except (OSError, asyncio.TimeoutError) as exc:
            return failed(f"could not reach the sandbox: {exc}", lost=True, undelivered=True)
        sent = kept = False
        try:
            writer.write(line)
            try:
                hello, _ = await asyncio.wait_for(wire.aread_frame(reader), CONNECT_TIMEOUT_S)
            except (wire.ProtocolError, OSError, asyncio.TimeoutError):
                if reused:  # a kept connection that died while idle (the worker restarted): nothing was sent
                    continue
                raise
            if hello.get("kind") == "relay-next":  # the executor closed at once (its sandbox is dying)
                raise wire.ProtocolError("connection closed")
            if hello.get("kind") == "error":
                return failed(f"the worker refused the call: {hello.get('error')}", lost=True, undelivered=True)
            wire.check_hello(hello)  # an executor of another generation: every sandbox of this image says the same
            on_sent()
            sent = True
            writer.write(wire.encode(header, body))
            await writer.drain()
            outcome, kept = await _answers(reader, writer, sink, timeout, cancel)
            return outcome
        except wire.ProtocolError as exc:
            return failed(f"the sandbox broke the call: {exc}", lost=True)
        except (OSError, asyncio.TimeoutError) as exc:
            return failed(f"the connection to the sandbox broke: {exc!r}", lost=True, undelivered=not sent)
        finally:
            if kept:
                pool.give_back(host, port, (reader, writer))
            else:
                await close(writer)
    raise AssertionError("unreachable: the second try is on a new connection")


async def _answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sink: Sink, timeout: float,
                   cancel: asyncio.Event) -> tuple[Outcome, bool]:
    """Frames until the result. A cancel (or the gateway's own deadline) sends `cancel` and waits a
    little for the executor's answer; past that the call is given up. True with the outcome when the
    connection may serve again (a result came and no cancel was sent)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout + DEADLINE_GRACE_S if timeout else None
    cancelled_at: float | None = None
    frame = asyncio.ensure_future(wire.aread_frame(reader))
    cancelled = asyncio.ensure_future(cancel.wait())
    try:
        while True:
            limits = [t for t in (deadline, cancelled_at and cancelled_at + CANCEL_GRACE_S) if t]
            wait_s = max(0.0, min(limits) - loop.time()) if limits else None
            done, _ = await asyncio.wait({frame, cancelled}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
            if frame in done:
                header, body = frame.result()
                outcome = await _frame(header, body, sink)
                if outcome is not None:
                    return outcome, cancelled_at is None
                frame = asyncio.ensure_future(wire.aread_frame(reader))
                continue
            if cancelled_at is not None:  # the executor did not answer the cancel
                return failed("cancelled" if cancel.is_set() else f"timed out after {timeout:g} s", lost=True), False
            cancelled_at = loop.time()
            writer.write(wire.encode({"kind": "cancel", "reason": "cancelled" if cancel.is_set() else "timeout"}))
            if cancelled in done:
                cancelled = asyncio.ensure_future(asyncio.Event().wait())  # waited on once
    finally:
        frame.cancel()
        cancelled.cancel()


async def _frame(header: dict[str, Any], body: bytes, sink: Sink) -> Outcome | None:
    kind = header["kind"]
    if kind == "output":
        await sink.output(int(header.get("fd", 1)), str(header.get("text", "")))
    elif kind == "item":
        await sink.item(body)
    elif kind == "relay-next":  # the relay's word that the executor's connection ended: with no result
        raise wire.ProtocolError("connection closed before the result (the sandbox ended?)")
    elif kind == "result":
        return Outcome(ok=bool(header.get("ok")), value=body, error_type=str(header.get("error_type", "")),
                       error=str(header.get("error", "")), traceback=str(header.get("traceback", "")),
                       reason=str(header.get("reason", "")), header=header)
    return None
