"""One attempt of a function call: to a sandbox's executor through its worker's relay.

The gateway never unpickles what passes here: the function, its arguments, its output and its
result are bytes between the client and the sandbox. `Sink` receives what the executor streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from levers9.executor import wire

CONNECT_TIMEOUT_S = 5.0
CANCEL_GRACE_S = 3.0  # after a cancel or a timeout, how long the executor has to answer
DEADLINE_GRACE_S = 5.0  # beyond the function's timeout, before the gateway gives up on the executor


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


def relay_target(address: str) -> tuple[str, int, bytes]:
    """A sandbox's relay address -> host, port and the relay's first line."""
    try:
        host, port, container_id, key = wire.parse_relay_address(address)
    except ValueError:
        raise ValueError(f"the container's address {address!r} is not a function sandbox's") from None
    return host, port, json.dumps({"container_id": container_id, "key": key}).encode() + b"\n"


async def attempt(address: str, header: dict[str, Any], body: bytes, sink: Sink, timeout: float,
                  cancel: asyncio.Event, on_sent: Callable[[], None] = lambda: None) -> Outcome:
    """Run the call once in the sandbox at `address`; never raises for the sandbox's failures.
    `on_sent` runs once the executor has said hello, just before the call is sent to it. A failure
    before that (no connection, the relay's refusal, no hello) is `undelivered`: the executor never
    saw the call (a sandbox that ended before the gateway heard of it, say)."""
    try:
        host, port, line = relay_target(address)
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=1 << 22),
                                                CONNECT_TIMEOUT_S)
    except (OSError, ValueError, asyncio.TimeoutError) as exc:
        return failed(f"could not reach the sandbox: {exc}", lost=True, undelivered=True)
    sent = False
    try:
        writer.write(line)
        hello, _ = await asyncio.wait_for(wire.aread_frame(reader), CONNECT_TIMEOUT_S)
        if hello.get("kind") == "error":
            return failed(f"the worker refused the call: {hello.get('error')}", lost=True, undelivered=True)
        wire.check_hello(hello)  # an executor of another generation: every sandbox of this image says the same
        on_sent()
        sent = True
        writer.write(wire.encode(header, body))
        await writer.drain()
        return await _answers(reader, writer, sink, timeout, cancel)
    except wire.ProtocolError as exc:
        return failed(f"the sandbox broke the call: {exc}", lost=True)
    except (OSError, asyncio.TimeoutError) as exc:
        return failed(f"the connection to the sandbox broke: {exc!r}", lost=True, undelivered=not sent)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sink: Sink, timeout: float,
                   cancel: asyncio.Event) -> Outcome:
    """Frames until the result. A cancel (or the gateway's own deadline) sends `cancel` and waits a
    little for the executor's answer; past that the call is given up."""
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
                    return outcome
                frame = asyncio.ensure_future(wire.aread_frame(reader))
                continue
            if cancelled_at is not None:  # the executor did not answer the cancel
                return failed("cancelled" if cancel.is_set() else f"timed out after {timeout:g} s", lost=True)
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
    elif kind == "result":
        return Outcome(ok=bool(header.get("ok")), value=body, error_type=str(header.get("error_type", "")),
                       error=str(header.get("error", "")), traceback=str(header.get("traceback", "")),
                       reason=str(header.get("reason", "")), header=header)
    return None
