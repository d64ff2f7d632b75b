"""The gateway's side of a sandbox's agent (levers9.executor.sandbox_ops): one request per relay
connection, through the worker's executor relay, as function calls go (executor_client).

The gateway never runs what passes here: a command line, a path and a file's bytes go to the agent
inside the container; its answers come back as frames. Connections are the relay pool's (kept
connections to each worker's relay, given back once the agent closed its side and the relay said
relay-next).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from levers9.executor import wire

from .executor_client import CONNECT_TIMEOUT_S, POOL, Conn, close, relay_target

ANSWER_TIMEOUT_S = 120.0  # a file op's answer (a 32 MiB write on a busy node)


class AgentError(Exception):
    """The agent refused (its `status`), or could not be reached (502)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def _open(address: str) -> tuple[str, int, Conn]:
    """A relay connection whose agent said hello; AgentError(502) when there is none."""
    try:
        host, port, line = relay_target(address, keep=True)
    except ValueError as exc:
        raise AgentError(502, f"the sandbox has no agent address: {exc}") from None
    for fresh in (False, True):
        try:
            conn, reused = await POOL.get(host, port, fresh=fresh)
        except (OSError, asyncio.TimeoutError) as exc:
            raise AgentError(502, f"the sandbox's worker does not answer: {exc!r}") from None
        try:
            conn[1].write(line)
            hello, _ = await asyncio.wait_for(wire.aread_frame(conn[0]), CONNECT_TIMEOUT_S)
        except (wire.ProtocolError, OSError, asyncio.TimeoutError) as exc:
            await close(conn[1])
            if reused:  # a kept connection that died while idle: once more on a new one
                continue
            raise AgentError(502, f"the sandbox's agent does not answer: {exc!r}") from None
        if hello.get("kind") == "hello":
            try:
                wire.check_hello(hello)
            except wire.ProtocolError as exc:
                await close(conn[1])
                raise AgentError(502, str(exc)) from None
            return host, port, conn
        await close(conn[1])
        if hello.get("kind") == "error":
            raise AgentError(502, f"the worker refused: {hello.get('error')}")
        raise AgentError(502, "the sandbox's agent closed the connection (the sandbox is ending?)")
    raise AssertionError("unreachable: the second try is on a new connection")


async def request(address: str, header: dict[str, Any], body: bytes = b"") -> tuple[dict[str, Any], bytes]:
    """One request and its answer (`ok`); AgentError with the agent's status when it refused."""
    host, port, (reader, writer) = await _open(address)
    kept = False
    try:
        writer.write(wire.encode(header, body))
        await writer.drain()
        answer, data = await asyncio.wait_for(wire.aread_frame(reader), ANSWER_TIMEOUT_S)
        kept = True
    except (wire.ProtocolError, OSError, asyncio.TimeoutError) as exc:
        raise AgentError(502, f"the sandbox's agent broke the request: {exc!r}") from None
    finally:
        if kept:
            POOL.give_back(host, port, (reader, writer))
        else:
            await close(writer)
    if answer.get("kind") == "error":
        raise AgentError(int(answer.get("status", 500)), str(answer.get("error", "refused")))
    return answer, data


async def exec_frames(address: str, header: dict[str, Any]) -> AsyncGenerator[tuple[dict[str, Any], bytes], None]:
    """An exec's frames as they come: started, stream..., exit. A caller that stops reading closes
    the connection (the program runs on in the sandbox); AgentError when the agent refused."""
    host, port, (reader, writer) = await _open(address)
    kept = False
    try:
        writer.write(wire.encode(header))
        await writer.drain()
        while True:
            try:
                frame, data = await wire.aread_frame(reader)
            except (wire.ProtocolError, OSError) as exc:
                raise AgentError(502, f"the sandbox's agent ended the exec: {exc!r} (the sandbox ended?)") from None
            kind = frame.get("kind")
            if kind == "error":
                raise AgentError(int(frame.get("status", 500)), str(frame.get("error", "refused")))
            if kind == "relay-next":
                raise AgentError(502, "the exec ended without its exit code (the sandbox ended?)")
            yield frame, data
            if kind == "exit":
                kept = True
                return
    finally:
        if kept:
            POOL.give_back(host, port, (reader, writer))
        else:
            await close(writer)
