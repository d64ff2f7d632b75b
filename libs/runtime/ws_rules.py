"""The decisions of a proxied WebSocket, pure: which upgrades may go through, which headers go on to
the container, how large a message may be, when a silent connection is closed, and which close
code each side gets when the other one ends.

The gateway (ws_proxy.py) and the dashboard (routes_websockets.py) relay WebSockets through
ws_relay.py, which asks these functions and does the I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

NORMAL = 1000
GOING_AWAY = 1001  # the idle timeout, and a side that went away without a close frame
TOO_BIG = 1009  # a message over the limit (RFC 6455 7.4.1)
INTERNAL = 1011  # the other side failed (a broken connection, a container that went away)
NO_STATUS = 1005  # a close frame without a code: never sent, it means "none was given"
ABNORMAL = 1006  # the connection dropped without a close frame: never sent
REASON_BYTES = 123  # a close frame's reason is at most 123 bytes of UTF-8

# the upgrade's own headers and the caller's credentials: never passed on to the container
NOT_FORWARDED = frozenset({
    "connection", "upgrade", "host", "authorization", "proxy-authorization", "content-length", "keep-alive",
    "te", "trailers", "transfer-encoding", "sec-websocket-key", "sec-websocket-version",
    "sec-websocket-extensions", "sec-websocket-accept", "sec-websocket-protocol"})
WS_KINDS = frozenset({"asgi", "realtime", "box"})  # code kinds whose containers may take a WebSocket


def sendable(code: int | None) -> int:
    """The close code to send for `code` as one side ended: codes that may not appear in a close frame
    (1005, 1006, 1015, reserved and unassigned ones) become 1000 (none given) or 1011 (a failure)."""
    if code is None or code == NO_STATUS:
        return NORMAL
    if code in (1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014) or 3000 <= code <= 4999:
        return code
    return INTERNAL


def short_reason(text: str) -> str:
    """`text` cut to what a close frame may carry (123 bytes of UTF-8, never half a character)."""
    data = text.encode()
    if len(data) <= REASON_BYTES:
        return text
    return data[:REASON_BYTES].decode(errors="ignore")


def size_of(data: str | bytes) -> int:
    """A message's size in bytes as it travels (UTF-8 for text)."""
    return len(data.encode()) if isinstance(data, str) else len(data)


def over_limit(data: str | bytes, limit: int) -> bool:
    """Whether a message is over the limit (0: no limit)."""
    return limit > 0 and size_of(data) > limit


def idle_left(last_message: float, now: float, timeout: float) -> float | None:
    """Seconds until a connection silent since `last_message` is closed (≤ 0: now); None when idle
    connections are never closed (timeout 0)."""
    if timeout <= 0:
        return None
    return last_message + timeout - now


@dataclass(frozen=True)
class Ending:
    """How a relayed connection ended: `by` "client", "upstream" (the container), "idle" or "too big"
    (`side` names who sent it); `code` and `reason` as that side gave them."""
    by: str
    code: int | None = None
    reason: str = ""
    side: str = ""


@dataclass(frozen=True)
class Closing:
    """The close frames still to send: to the client and to the container (None: that side is gone)."""
    client: tuple[int, str] | None
    upstream: tuple[int, str] | None


def closing(ending: Ending, limit: int = 0, idle_s: float = 0) -> Closing:
    """Closing either side closes the other with its code; a message over the limit closes both
    with 1009, an idle connection both with 1001."""
    if ending.by == "client":
        return Closing(None, (sendable(ending.code), short_reason(ending.reason)))
    if ending.by == "upstream":
        return Closing((sendable(ending.code), short_reason(ending.reason)), None)
    if ending.by == "too big":
        who = "the container" if ending.side == "upstream" else "the client"
        why = short_reason(f"{who} sent a message over the limit of {limit} bytes")
        return Closing((TOO_BIG, why), (TOO_BIG, why))
    why = short_reason(f"no message either way for {idle_s:g} s")
    return Closing((GOING_AWAY, why), (GOING_AWAY, why))


def forwarded_headers(headers: list[tuple[str, str]], drop_cookies: frozenset[str] = frozenset()) -> dict[str, str]:
    """The upgrade's headers that go on to the container: not the upgrade's own, not the caller's
    credentials, and not the cookies named in `drop_cookies` (the dashboard's session)."""
    out: dict[str, str] = {}
    for name, value in headers:
        key = name.lower()
        if key in NOT_FORWARDED:
            continue
        if key == "cookie" and drop_cookies:
            value = without_cookies(value, drop_cookies)
            if not value:
                continue
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def without_cookies(header: str, names: frozenset[str]) -> str:
    """A Cookie header without the cookies `names`."""
    kept = [part.strip() for part in header.split(";")
            if part.strip() and part.strip().partition("=")[0].strip() not in names]
    return "; ".join(kept)


def subprotocols(headers: list[tuple[str, str]]) -> list[str]:
    """The subprotocols the client offers (Sec-WebSocket-Protocol, every header, comma-separated)."""
    return [p.strip() for name, value in headers if name.lower() == "sec-websocket-protocol"
            for p in value.split(",") if p.strip()]


def kind_refusal(kind: str, name: str) -> str:
    """Why a deployment of this code kind takes no WebSocket ("" when it does)."""
    if kind in WS_KINDS:
        return ""
    if kind == "function":
        return f"{name!r} is a function: it takes no WebSocket"
    return (f"endpoint {name!r} is a function endpoint (@app.endpoint), which answers HTTP only: serve "
            "WebSockets with @app.asgi or @app.realtime")


def handshake_refusal(status: int) -> int:
    """The status the client gets when the container refused the upgrade with `status`: the app's
    own 4xx stands; anything else is the container's failure (502)."""
    return status if 400 <= status < 500 else 502


def cross_site_upgrade(origin: str | None, own_origin: str) -> str:
    """Why a browser's upgrade, authenticated by its cookie, comes from another site ("" when it does
    not): a page elsewhere may open a WebSocket to us and the browser would send our cookie along
    (cross-site WebSocket hijacking), so the Origin a browser always sends must be our own."""
    if origin is None:
        return "the upgrade has no Origin: a browser's WebSocket always sends one"
    if origin != own_origin:
        return f"Origin {origin!r} is not this dashboard ({own_origin})"
    return ""
