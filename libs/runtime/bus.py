"""The only code that talks to NATS: connection, topology, publish, append, dead letters, KV.

Publishing sets `Nats-Msg-Id` to the envelope id and retries with the same id, so the server's
duplicate window drops a retry whose first try did land. Appending with an expected last subject
sequence is how two replicas of a service are kept from both taking the last slot of a worker.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import Header, KeyValueConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.kv import KeyValue
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from levers9.contracts import Envelope, encode, subjects

from .bus_auth import BusAuth
from .telemetry import CONFLICTS, DEAD_LETTERS, EVENTS_PUBLISHED, inject

log = logging.getLogger("levers9.bus")

DUPLICATE_WINDOW_S = 120.0
HEARTBEAT_BUCKET = "levers9_heartbeats"
HEARTBEAT_TTL_S = 6.0  # a worker beats every 2 s; three missed beats and its key is gone
ERR_WRONG_LAST_SEQUENCE = 10071

# Connection-level failures worth retrying with the same msg id; API errors (a conflict) are not.
_RETRYABLE = (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.errors.ConnectionClosedError,
              nats.js.errors.NoStreamResponseError, asyncio.TimeoutError, OSError)


class ConcurrencyConflict(Exception):
    """Someone appended to the aggregate since we read it; reload and decide again."""

    def __init__(self, subject: str, expected: int, detail: str = "") -> None:
        super().__init__(f"conflict on {subject}: expected last sequence {expected}, the log has moved on"
                         + (f" ({detail})" if detail else ""))
        self.subject = subject
        self.expected = expected


@dataclass(frozen=True)
class Appended:
    seq: int
    duplicate: bool


class Bus:
    def __init__(self, nc: Client, js: JetStreamContext, auth: BusAuth | None = None) -> None:
        self.nc = nc
        self.js = js
        self.auth = auth or BusAuth()
        self.reconnects = 0  # consumers re-create their subscriptions when this moves (nats.py #504)
        self.closing = False

    @classmethod
    async def connect(cls, url: str, name: str = "levers9", auth: BusAuth | None = None) -> "Bus":
        """auth: this process's credentials and event keys (BusAuth.from_settings); none: anonymous."""
        bus: Bus | None = None

        async def on_error(exc: Exception) -> None:
            log.warning("nats error: %s", exc)

        async def on_disconnect() -> None:
            if bus is None or not bus.closing:  # our own close is not news
                log.warning("nats disconnected; reconnecting")

        async def on_reconnect() -> None:
            log.info("nats reconnected")
            if bus is not None:
                bus.reconnects += 1

        nc = await nats.connect(servers=[url], name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
                                connect_timeout=3, allow_reconnect=True, error_cb=on_error,
                                disconnected_cb=on_disconnect, reconnected_cb=on_reconnect, drain_timeout=5,
                                **(auth.connect_options() if auth else {}))
        bus = cls(nc, nc.jetstream(timeout=5), auth)
        return bus

    async def close(self) -> None:
        self.closing = True
        if not self.nc.is_closed:
            try:
                await self.nc.drain()
            except (nats.errors.Error, asyncio.TimeoutError, OSError) as exc:  # closing already, or gone
                log.debug("nats drain: %r; closing", exc)
                await self.nc.close()

    # ---- topology ------------------------------------------------------------------------------

    async def ensure_topology(self) -> None:
        """Create the streams and KV buckets if missing; leave existing ones (and their data) alone."""
        await self._ensure_stream(subjects.STREAM, f"{subjects.ROOT}.>")
        await self._ensure_stream(subjects.DLQ_STREAM, f"{subjects.DLQ_ROOT}.>")
        await self.heartbeats()

    async def _ensure_stream(self, name: str, subject_filter: str) -> None:
        try:
            await self.js.stream_info(name)
        except nats.js.errors.NotFoundError:
            try:
                await self.js.add_stream(StreamConfig(
                    name=name, subjects=[subject_filter], retention=RetentionPolicy.LIMITS,
                    storage=StorageType.FILE, duplicate_window=DUPLICATE_WINDOW_S, allow_direct=True))
            except nats.js.errors.BadRequestError:
                await self.js.stream_info(name)  # created concurrently by another process

    async def heartbeats(self) -> KeyValue:
        try:
            return await self.js.key_value(HEARTBEAT_BUCKET)
        except nats.js.errors.BucketNotFoundError:
            return await self.js.create_key_value(KeyValueConfig(bucket=HEARTBEAT_BUCKET, ttl=HEARTBEAT_TTL_S,
                                                                 history=1))

    # ---- writing -------------------------------------------------------------------------------

    async def publish(self, env: Envelope) -> Appended:
        """Append an event unconditionally (idempotent by envelope id)."""
        return await self._publish(env, {})

    async def append(self, env: Envelope, expected_last_seq: int, *, aggregate_wide: bool = True) -> Appended:
        """Append only if the aggregate's last event is still `expected_last_seq` (0: no event yet).

        aggregate_wide: compare against the last event on any subject of the aggregate
        (`levers9.ws.agg.id.*`), not just this event type's subject (NATS >= 2.11).
        """
        headers: dict[str, str] = {Header.EXPECTED_LAST_SUBJECT_SEQUENCE: str(expected_last_seq)}
        if aggregate_wide:
            headers["Nats-Expected-Last-Subject-Sequence-Subject"] = self.aggregate_filter(env)
        return await self._publish(env, headers)

    @staticmethod
    def aggregate_filter(env: Envelope) -> str:
        sub = env.subject
        return sub[: sub.rfind(".")] + ".*"

    async def _publish(self, env: Envelope, extra: dict[str, str]) -> Appended:
        subject = env.subject
        headers = inject({Header.MSG_ID: env.id, **extra})
        payload = encode(env)
        if self.auth.signer is not None:  # a power event this process owns carries its signature
            headers.update(self.auth.signer.headers(subject, payload))
        if self.auth.reporter is not None:  # a worker's container report names it as the sender
            headers.update(self.auth.reporter.headers(subject, payload))
        try:
            try:  # the first try outside the retry loop: building one costs more than the publish itself
                ack = await self.js.publish(subject, payload, headers=headers, stream=subjects.STREAM)
            except _RETRYABLE:
                async for attempt in AsyncRetrying(retry=retry_if_exception_type(_RETRYABLE), reraise=True,
                                                   stop=stop_after_delay(15), wait=wait_exponential(0.05, max=2)):
                    with attempt:
                        ack = await self.js.publish(subject, payload, headers=headers, stream=subjects.STREAM)
        except nats.js.errors.APIError as exc:
            if exc.err_code == ERR_WRONG_LAST_SEQUENCE:
                CONFLICTS.labels(env.type).inc()
                raise ConcurrencyConflict(subject, int(extra.get(Header.EXPECTED_LAST_SUBJECT_SEQUENCE, -1)),
                                          exc.description or "") from None
            raise
        EVENTS_PUBLISHED.labels(env.type).inc()
        return Appended(seq=ack.seq, duplicate=bool(ack.duplicate))

    async def last_seq(self, filter_subject: str) -> int:
        """Sequence of the last message matching a subject (wildcards allowed); 0 when none."""
        try:
            msg = await self.js.get_last_msg(subjects.STREAM, filter_subject)
        except nats.js.errors.NotFoundError:
            return 0
        return msg.seq or 0

    async def stream_last_seq(self) -> int:
        info = await self.js.stream_info(subjects.STREAM)
        return info.state.last_seq

    # ---- dead letters --------------------------------------------------------------------------

    async def dead_letter(self, *, subject: str, payload: bytes, consumer: str, reason: str,
                          stream_seq: int, headers: dict[str, str] | None = None) -> None:
        """Keep a message that cannot be handled, with why and who gave up on it.

        The original payload is kept byte for byte; the reason travels in headers. The msg id is
        derived from (consumer, sequence) so a consumer that dead-letters the same message again
        after a crash does not record it twice.
        """
        hdrs: dict[str, str] = {
            Header.MSG_ID: f"dlq:{consumer}:{stream_seq}",
            "Levers9-Reason": reason.replace("\r", " ").replace("\n", " ")[:4000],
            "Levers9-Consumer": consumer,
            "Levers9-Original-Subject": subject,
            "Levers9-Stream-Seq": str(stream_seq),
        }
        if headers and headers.get(Header.MSG_ID):
            hdrs["Levers9-Original-Msg-Id"] = headers[Header.MSG_ID]
        async for attempt in AsyncRetrying(retry=retry_if_exception_type(_RETRYABLE), reraise=True,
                                           stop=stop_after_delay(30), wait=wait_exponential(0.05, max=2)):
            with attempt:
                await self.js.publish(subjects.dlq_subject(subject), payload, headers=hdrs,
                                      stream=subjects.DLQ_STREAM)
        DEAD_LETTERS.labels(consumer).inc()
        log.warning("dead-lettered %s (seq %d) from %s: %s", subject, stream_seq, consumer, reason)
