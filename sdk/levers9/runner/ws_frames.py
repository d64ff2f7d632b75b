"""WebSocket framing (RFC 6455), standard library only: the handshake's accept key, frames encoded
and read, fragmented messages assembled, close frames' code and reason. The runner serves WebSockets
with it inside containers, where only the standard library and this SDK are."""

from __future__ import annotations

import base64
import hashlib
import struct
from typing import BinaryIO, Callable

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
CONT, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
CONTROL = (CLOSE, PING, PONG)
TOO_BIG = 1009
PROTOCOL_ERROR = 1002
NO_STATUS = 1005


class FrameError(Exception):
    """A frame the peer should not have sent; `code` is the close code that says so."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def accept_key(key: str) -> str:
    """Sec-WebSocket-Accept for a client's Sec-WebSocket-Key."""
    return base64.b64encode(hashlib.sha1((key.strip() + GUID).encode()).digest()).decode()


def wants_upgrade(method: str, upgrade: str, connection: str) -> bool:
    """Whether a request asks for a WebSocket (a GET with Upgrade: websocket and Connection: upgrade)."""
    return (method == "GET" and upgrade.strip().lower() == "websocket"
            and "upgrade" in [p.strip().lower() for p in connection.split(",")])


def masked(payload: bytes, mask: bytes) -> bytes:
    """payload XOR the repeated 4-byte mask (as one big integer: fast for large payloads too)."""
    n = len(payload)
    if not n:
        return payload
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")


def encode(opcode: int, payload: bytes, mask: bytes | None = None, fin: bool = True) -> bytes:
    """One frame; `mask` (4 bytes) for a client's frame, None for a server's."""
    head = bytes([(0x80 if fin else 0) | opcode])
    n, bit = len(payload), 0x80 if mask else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 1 << 16:
        head += bytes([bit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", n)
    return head + (mask + masked(payload, mask) if mask else payload)


def close_payload(code: int, reason: str = "") -> bytes:
    return struct.pack("!H", code) + reason.encode()[:123]


def parse_close(payload: bytes) -> tuple[int, str]:
    """(code, reason) of a close frame's payload; 1005 when it has no code."""
    if len(payload) < 2:
        return NO_STATUS, ""
    return struct.unpack("!H", payload[:2])[0], payload[2:].decode(errors="replace")


def read_exact(rfile: BinaryIO, n: int) -> bytes:
    data = rfile.read(n) if n else b""
    if len(data) < n:
        raise EOFError("the connection closed in the middle of a frame")
    return data


def read_frame(rfile: BinaryIO, limit: int) -> tuple[bool, int, bytes]:
    """(fin, opcode, payload unmasked) of the next frame; FrameError(1009) for one over `limit` bytes
    (0: no limit), before its payload is read."""
    b0, b1 = read_exact(rfile, 2)
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack("!H", read_exact(rfile, 2))[0]
    elif n == 127:
        n = struct.unpack("!Q", read_exact(rfile, 8))[0]
    opcode = b0 & 0x0F
    if opcode in CONTROL and n > 125:
        raise FrameError(PROTOCOL_ERROR, "a control frame over 125 bytes")
    if limit and n > limit:
        raise FrameError(TOO_BIG, f"a message over the limit of {limit} bytes")
    mask = read_exact(rfile, 4) if b1 & 0x80 else b""
    payload = read_exact(rfile, n)
    return bool(b0 & 0x80), opcode, masked(payload, mask) if mask else payload


def read_message(rfile: BinaryIO, limit: int, on_control: Callable[[int, bytes], bool]) -> tuple[int, bytes]:
    """The next data message (TEXT or BINARY, its fragments joined, at most `limit` bytes), or
    (CLOSE, payload). Pings and pongs between fragments go to `on_control`."""
    opcode, size = 0, 0
    parts: list[bytes] = []
    while True:
        fin, op, payload = read_frame(rfile, limit)
        if op in CONTROL:
            if op == CLOSE:
                return CLOSE, payload
            on_control(op, payload)
            continue
        if op != CONT:
            if parts or opcode:
                raise FrameError(PROTOCOL_ERROR, "a new message began before the last one ended")
            opcode = op
        elif not opcode:
            raise FrameError(PROTOCOL_ERROR, "a continuation frame with no message to continue")
        size += len(payload)
        if limit and size > limit:
            raise FrameError(TOO_BIG, f"a message over the limit of {limit} bytes")
        parts.append(payload)
        if fin:
            return opcode, b"".join(parts)
