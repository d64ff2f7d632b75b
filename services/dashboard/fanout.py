"""One gateway event stream per workspace, fanned out to that workspace's browsers.

The first browser of a workspace starts its hub: one `GET /api/v1/events/stream` to the gateway,
with that browser's token, from a known sequence (the browser's Last-Event-ID, else the newest
event's seq), so the hub knows exactly which events it holds: every event after `covered_after`
is in its ring (the last RING events) or still to come. Each event is encoded once as an SSE frame
and offered to every client's bounded queue; a client whose queue is full has fallen behind and is
dropped (its queue cleared, its stream ended) without waiting for it, so one slow browser never
slows the others. It reconnects by itself with Last-Event-ID and resumes from the ring.

A client that resumes from before what the ring covers gets a stream of its own from the gateway
(`after=<its id>`): nothing missed, nothing twice. The upstream reconnects after a failure from the
last sequence it saw; a token the gateway refuses ends its clients' streams (their session is over)
and the hub goes on with another client's token. A hub without clients stops after LINGER_S.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from typing import AsyncIterator

import httpx
from prometheus_client import Counter, Gauge

from levers9.runtime.tasks import spawn

from .upstream import GatewayDown, Upstream, sse_messages

log = logging.getLogger("levers9.dashboard.fanout")

STREAM_PATH = "/api/v1/events/stream"
RING = 10_000  # events a hub keeps for clients that resume
CLIENT_QUEUE = 1_000  # frames a client may be behind before it is dropped
LINGER_S = 30.0  # a hub without clients keeps its upstream this long (a page reload reconnects)

SSE_CLIENTS = Gauge("levers9_dashboard_sse_clients", "Browsers and programs connected to /events")
SSE_DROPPED = Counter("levers9_dashboard_sse_dropped_total", "Clients dropped for falling behind")
SSE_EVENTS = Counter("levers9_dashboard_sse_events_total", "Events received from the gateway's streams")
UPSTREAM_FAILURES = Counter("levers9_dashboard_upstream_failures_total", "Gateway event streams that failed")


def frame(seq: int, event_type: str, data: str) -> bytes:
    lines = "\n".join(f"data: {part}" for part in data.split("\n"))
    return f"id: {seq}\nevent: {event_type}\n{lines}\n\n".encode()


class Client:
    """One connected stream: a bounded queue of frames; None in it means "end"."""

    def __init__(self, token: str, maxsize: int = CLIENT_QUEUE) -> None:
        self.token = token
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize)
        self.backlog: list[bytes] = []  # the ring's frames after its Last-Event-ID, sent first
        self.dropped = False
        self.own_after: int | None = None  # set: it needs a stream of its own from this sequence

    def offer(self, data: bytes) -> bool:
        try:
            self.queue.put_nowait(data)
            return True
        except asyncio.QueueFull:
            return False

    def end(self) -> None:
        """Stop its stream now: what it has not read yet is thrown away."""
        while not self.queue.empty():
            self.queue.get_nowait()
        self.queue.put_nowait(None)


class Hub:
    def __init__(self, workspace: str, upstream: Upstream, *, ring: int = RING, client_queue: int = CLIENT_QUEUE,
                 linger_s: float = LINGER_S) -> None:
        self.workspace = workspace
        self.upstream = upstream
        self.ring: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=ring)
        self.client_queue = client_queue
        self.linger_s = linger_s
        self.clients: set[Client] = set()
        self.covered_after: int | None = None  # every event after this seq is in the ring or to come
        self.last_seq = 0
        self.task: asyncio.Task[None] | None = None
        self.refused: set[str] = set()  # tokens the gateway refused
        self._linger: asyncio.TimerHandle | None = None
        self._starting = asyncio.Lock()  # two first browsers at once start one upstream

    # ---- clients ---------------------------------------------------------------------------

    async def subscribe(self, token: str, last_id: int | None) -> Client:
        client = Client(token, self.client_queue)
        async with self._starting:
            if self.task is None or self.task.done():
                start = last_id if last_id is not None else await self._newest_seq(token)
                self.covered_after = self.last_seq = start
                self.ring.clear()
                self.task = spawn(self._run(), name=f"dashboard events {self.workspace}", logger=log)
        if last_id is not None and (self.covered_after is None or last_id < self.covered_after):
            client.own_after = last_id  # older than the ring: a stream of its own
            return client
        # no await from here on: the backlog and the registration see the same ring
        if last_id is not None:
            client.backlog = [f for seq, f in self.ring if seq > last_id]
        self.clients.add(client)
        SSE_CLIENTS.inc()
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        return client

    def unsubscribe(self, client: Client) -> None:
        if client in self.clients:
            self.clients.discard(client)
            SSE_CLIENTS.dec()
        if not self.clients and self.task is not None and self._linger is None:
            self._linger = asyncio.get_running_loop().call_later(self.linger_s, self._stop_if_idle)

    def _stop_if_idle(self) -> None:
        self._linger = None
        if not self.clients and self.task is not None:
            self.task.cancel()
            self.task = None

    def publish(self, seq: int, event_type: str, data: str) -> None:
        """Hand one event to every client; those that cannot take it are dropped."""
        if seq <= self.last_seq:
            return  # a reconnect's overlap: never twice
        f = frame(seq, event_type, data)
        if len(self.ring) == self.ring.maxlen:
            self.covered_after = self.ring[0][0]  # about to be evicted: resuming before it needs a stream
        self.ring.append((seq, f))
        self.last_seq = seq
        SSE_EVENTS.inc()
        for client in list(self.clients):
            if not client.offer(f):
                self.drop(client)

    def drop(self, client: Client) -> None:
        client.dropped = True
        self.clients.discard(client)
        SSE_CLIENTS.dec()
        SSE_DROPPED.inc()
        client.end()
        log.info("dropped an /events client of %s: it fell %d events behind", self.workspace, self.client_queue)

    # ---- the upstream ----------------------------------------------------------------------

    async def _newest_seq(self, token: str) -> int:
        try:
            status, body, _ = await self.upstream.get_json(token, "/api/v1/events", {"limit": 1})
        except GatewayDown:
            return 0
        if status == 200 and isinstance(body, list) and body:
            return int(body[0].get("seq") or 0)
        return 0

    def _token(self) -> str | None:
        return next((c.token for c in self.clients if c.token not in self.refused), None)

    async def _run(self) -> None:
        backoff = 0.2
        while True:
            token = self._token()
            if token is None:  # everyone left before it started, or the gateway refused them all
                self.task = None
                return
            try:
                got = await self._stream_once(token)
                backoff = 0.2 if got else min(backoff * 2, 5.0)
            except (GatewayDown, httpx.HTTPError) as exc:
                UPSTREAM_FAILURES.inc()
                log.warning("the gateway's event stream for %s failed: %s; reconnecting", self.workspace, exc)
                backoff = min(backoff * 2, 5.0)
            await asyncio.sleep(backoff)  # a retry's back-off, not a wait for something to happen

    async def _stream_once(self, token: str) -> bool:
        """Relay one upstream connection until it ends; True when it carried an event."""
        got = False
        resp = await self.upstream.open_stream("GET", token, STREAM_PATH, params={"after": self.last_seq})
        try:
            if resp.status_code in (401, 403):
                self._refuse(token)
                return False
            if resp.status_code != 200:
                raise GatewayDown(f"{STREAM_PATH} answered {resp.status_code}")
            async for msg_id, event_type, data in sse_messages(resp.aiter_lines()):
                with contextlib.suppress(ValueError):
                    self.publish(int(msg_id), event_type, data)
                    got = True
        finally:
            await resp.aclose()
        return got

    def _refuse(self, token: str) -> None:
        """The gateway refused `token`: its clients' sessions are over."""
        self.refused.add(token)
        self.upstream.forget(token)
        for client in [c for c in self.clients if c.token == token]:
            self.clients.discard(client)
            SSE_CLIENTS.dec()
            client.end()


class Hubs:
    def __init__(self, upstream: Upstream, **options: float | int) -> None:
        self.upstream = upstream
        self.options = options
        self.by_workspace: dict[str, Hub] = {}

    def hub(self, workspace: str) -> Hub:
        if workspace not in self.by_workspace:
            self.by_workspace[workspace] = Hub(workspace, self.upstream, **self.options)  # type: ignore[arg-type]
        return self.by_workspace[workspace]

    async def close(self) -> None:
        for hub in self.by_workspace.values():
            for client in list(hub.clients):
                client.end()
            if hub.task is not None:
                hub.task.cancel()


KEEPALIVE_S = 15.0


async def client_frames(hub: Hub, client: Client, keepalive_s: float = KEEPALIVE_S) -> AsyncIterator[bytes]:
    """The bytes of one client's stream: its backlog, then what the hub hands it, batched."""
    try:
        yield b"retry: 2000\n\n"
        if client.backlog:
            yield b"".join(client.backlog)
            client.backlog = []
        while True:
            try:
                first = await asyncio.wait_for(client.queue.get(), keepalive_s)
            except TimeoutError:
                yield b": keepalive\n\n"
                continue
            batch = [first]
            while batch[-1] is not None and not client.queue.empty():
                batch.append(client.queue.get_nowait())
            ended = batch[-1] is None
            data = b"".join(f for f in batch if f is not None)
            if data:
                yield data
            if ended:
                return
    finally:
        hub.unsubscribe(client)


async def own_frames(upstream: Upstream, token: str, after: int, keepalive_s: float = KEEPALIVE_S) -> AsyncIterator[bytes]:
    """A stream of its own for a client that resumes from before its hub's ring."""
    yield b"retry: 2000\n\n"
    resp = await upstream.open_stream("GET", token, STREAM_PATH, params={"after": after})
    try:
        if resp.status_code != 200:
            return
        async for msg_id, event_type, data in sse_messages(resp.aiter_lines()):
            with contextlib.suppress(ValueError):
                yield frame(int(msg_id), event_type, data)
    finally:
        await resp.aclose()
