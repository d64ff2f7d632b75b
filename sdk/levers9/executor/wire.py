"""The executor's wire protocol: frames over one unix-socket connection per call.

Standard library only: the executor imports it inside sandboxes, the worker and the gateway import
it on the host. A frame is `>II` (header length, body length), a JSON header (`kind` and fields),
then the body bytes (pickles). On connect the executor sends `hello` with its GENERATION; the other
side refuses a generation it does not implement (`check_hello`). Then:

    caller  -> call     {call_id, function: {module, qualname} | {pickled: N}, session, generator,
                         packages, timeout}; body = pickled function (N bytes, if any) + pickled args
    executor-> output   {fd: 1|2, text}            the function's prints, as they happen
    executor-> item     {}; body = one pickled item a generator yielded
    executor-> result   {ok: true}; body = the pickled return value
              result    {ok: false, error_type, error, traceback, reason}; body = the pickled exception
                        (empty when it cannot be pickled; reason names a platform failure)
    caller  -> cancel   {reason}                   the call stops with reason "cancelled"
    caller  -> ping     {} ; executor -> pong {state, inflight}
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

GENERATION = 1  # bump on any incompatible change; record it wherever a sandbox is described
SUPPORTED_GENERATIONS = frozenset({1})
SOCKET_DIR = "/run/levers9"  # inside the sandbox; the worker binds a host directory here
SOCKET_NAME = "executor.sock"
MAX_HEADER = 1 << 20
MAX_BODY = 1 << 31
_PREFIX = struct.Struct(">II")


class ProtocolError(Exception):
    """The peer broke the protocol (a bad frame, an unknown generation, a closed connection)."""


def encode(header: dict[str, Any], body: bytes = b"") -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode()
    return _PREFIX.pack(len(raw), len(body)) + raw + body


def decode_prefix(prefix: bytes) -> tuple[int, int]:
    header_len, body_len = _PREFIX.unpack(prefix)
    if header_len > MAX_HEADER or body_len > MAX_BODY:
        raise ProtocolError(f"frame too large: header {header_len} bytes, body {body_len} bytes")
    return header_len, body_len


def decode_header(raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise ProtocolError(f"frame header is not JSON: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("kind"), str):
        raise ProtocolError("frame header has no kind")
    return header


def check_hello(header: dict[str, Any]) -> None:
    """Refuse an executor whose generation this side does not implement, saying what to do."""
    if header.get("kind") != "hello":
        raise ProtocolError(f"expected the executor's hello, got {header.get('kind')!r}")
    generation = header.get("generation")
    if generation not in SUPPORTED_GENERATIONS:
        raise ProtocolError(f"the sandbox's executor speaks protocol generation {generation}; this side implements "
                            f"{sorted(SUPPORTED_GENERATIONS)}: upgrade levers9 on the worker and gateway, or redeploy "
                            "so the sandbox gets this platform's executor")


# ---- where the gateway reaches an executor: its worker's relay ---------------------------------

RELAY_SCHEME = "exec"


def relay_address(host: str, port: int, container_id: str, key: str) -> str:
    """What a worker publishes in ContainerReady for a function sandbox."""
    return f"{RELAY_SCHEME}://{host}:{port}/{container_id}/{key}"


def parse_relay_address(address: str) -> tuple[str, int, str, str]:
    """`exec://host:port/<container>/<key>` -> (host, port, container, key); ValueError otherwise."""
    from urllib.parse import urlsplit

    parts = urlsplit(address)
    container_id, _, key = parts.path.strip("/").partition("/")
    if parts.scheme != RELAY_SCHEME or not parts.hostname or not parts.port or not container_id or not key:
        raise ValueError(f"not an executor relay address: {address!r}")
    return parts.hostname, parts.port, container_id, key


# ---- blocking sockets (the executor, tests) ------------------------------------------------------

def recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ProtocolError("connection closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    header_len, body_len = decode_prefix(recv_exact(sock, _PREFIX.size))
    header = decode_header(recv_exact(sock, header_len))
    return header, recv_exact(sock, body_len) if body_len else b""


def send_frame(sock: socket.socket, header: dict[str, Any], body: bytes = b"") -> None:
    sock.sendall(encode(header, body))


# ---- asyncio streams (the gateway, the worker's relay) -----------------------------------------

async def aread_frame(reader: Any) -> tuple[dict[str, Any], bytes]:
    """Read one frame from an asyncio.StreamReader; ProtocolError when the connection ends."""
    import asyncio

    try:
        header_len, body_len = decode_prefix(await reader.readexactly(_PREFIX.size))
        header = decode_header(await reader.readexactly(header_len))
        body = await reader.readexactly(body_len) if body_len else b""
    except asyncio.IncompleteReadError:
        raise ProtocolError("connection closed") from None
    return header, body
