"""Consumer loops: the one place that fetches, decodes, retries, acks and dead-letters.

Two kinds, because order and side effects pull in different directions (FACTS, nats.py pitfalls):

- `OrderedConsumer` feeds projections. It starts from the position the projection stored in Postgres
  (+1) on a fresh consumer, hands batches over in stream order, and retries a failing batch in
  place with backoff instead of nak-ing it, so a later event can never overtake an earlier one.
  A crash loses nothing: the next process starts again from the stored position.
- `WorkConsumer` feeds idempotent reactions (side effects). It is durable, acks explicitly and naks
  with a growing delay; the server redelivers.

Both: a message that does not decode or validate, or whose handler fails `max_deliver` times, goes
to LEVERS9_DLQ with its reason. Infrastructure failures (Postgres or NATS down) are not the
message's fault: they are retried until they pass or the process is asked to stop, never
dead-lettered. After a NATS restart a pull subscription can go silent (nats.py #504), so a
subscription that errors or idles too long is re-created.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Sequence

import asyncpg
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from levers9.contracts import ContractError, Message, decode, subjects

from .bus import Bus
from .bus_signing import Verifier
from .telemetry import BATCH_SECONDS, EVENTS_CONSUMED, consuming_span

log = logging.getLogger("levers9.consumer")


@dataclass
class Delivery:
    """One message as a handler sees it. `error` set: it is dead-lettered; only record its position."""
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]
    num_delivered: int
    message: Message | None = None
    error: str | None = None
    raw: Msg | None = field(default=None, repr=False)  # None: not from a subscription (nothing to ack)

    async def ack(self) -> None:
        if self.raw is not None:
            await self.raw.ack()

    async def nak(self, delay: float) -> None:
        if self.raw is not None:
            await self.raw.nak(delay=delay)

    async def term(self) -> None:
        if self.raw is not None:
            await self.raw.term()

    async def in_progress(self) -> None:
        """Restart the server's ack wait: the message is still being worked on (+WPI)."""
        if self.raw is not None:
            await self.raw.in_progress()


def to_delivery(msg: Msg, verifier: Verifier | None = None) -> Delivery:
    """The message, decoded; `error` says why it must be dead-lettered instead (it does not decode,
    or it is a power event without its owner's valid signature, when this process checks those)."""
    meta = msg.metadata
    headers = dict(msg.headers or {})
    d = Delivery(seq=meta.sequence.stream, subject=msg.subject, data=msg.data, headers=headers,
                 num_delivered=meta.num_delivered, raw=msg)
    try:
        d.message = decode(msg.data, msg.subject)
    except ContractError as exc:
        d.error = f"invalid message: {exc}"
    if d.error is None and verifier is not None:
        d.error = verifier.reject(msg.subject, msg.data, headers)
        if d.error is not None:
            d.message = None  # never applied: a forged grant must not reach a projection or handler
    return d


# Postgres going away or coming back (a restart: "the database system is shutting down", refused
# connections, connections cut by an administrator; a pooled connection the restart left mid-operation:
# "cannot switch to state 12; another operation is in progress", seen in CI killing a gateway's consumer)
_POSTGRES_DOWN = (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, asyncpg.InternalClientError,
                  asyncpg.exceptions.CannotConnectNowError, asyncpg.exceptions.OperatorInterventionError,
                  asyncpg.exceptions.TooManyConnectionsError)


def is_transient(exc: BaseException) -> bool:
    """Failures of the infrastructure rather than of the message: retry, never dead-letter."""
    return isinstance(exc, (OSError, asyncio.TimeoutError, ConnectionError, *_POSTGRES_DOWN,
                            asyncpg.exceptions.InvalidCachedStatementError,  # a rebuild swapped tables
                            nats.errors.ConnectionClosedError, nats.errors.TimeoutError,
                            nats.errors.NoRespondersError))


def backoff(attempt: int, base: float = 0.1, cap: float = 5.0) -> float:
    return min(cap, base * (2 ** max(0, attempt - 1)))


# what makes a consumer loop drop its subscription and make a new one, after a pause; Postgres too:
# an ordered consumer reads its position from there when it subscribes again
_RESUBSCRIBE = (nats.errors.ConnectionClosedError, nats.errors.NoRespondersError, nats.js.errors.APIError,
                nats.errors.Error, OSError, asyncio.TimeoutError, *_POSTGRES_DOWN)


class _Pull(ABC):
    """What both consumers share: one client-side pull subscription, released before re-creating."""
    bus: Bus
    batch: int
    idle_resubscribe_s: float
    _sub: JetStreamContext.PullSubscription | None = None

    @abstractmethod
    async def _subscribe(self) -> JetStreamContext.PullSubscription:
        """Create (or bind to) the server-side consumer and return a subscription to it."""

    async def _drop_sub(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except (nats.errors.Error, OSError, ValueError) as exc:  # connection gone: nothing to release
                log.debug("unsubscribe: %r", exc)

    def _room(self) -> int:
        """How many messages the next batch may hold."""
        return self.batch

    async def _next_batch(self, sub: JetStreamContext.PullSubscription) -> list[Msg]:
        """Wait for one message, then take exactly as many more as the server said were pending
        behind it (its metadata counts them). Both pulls return as soon as their messages are in:
        a pull for more than is there waits for the server's end-of-request status, and when a
        previous pull's status arrived late (its expiry races the client's timeout) that wait lasted
        until an orphaned request expired, up to a second; asking for "the rest" with a 10 ms
        timeout held every lone event 10 ms."""
        msgs = await sub.fetch(1, timeout=1.0)
        pending = msgs[-1].metadata.num_pending if msgs else 0
        room = self._room()  # asked again: handlers may have finished while the first pull waited
        if pending and room > 1:
            try:
                msgs += await sub.fetch(min(pending, room - 1), timeout=1.0)
            except asyncio.TimeoutError:  # taken by nobody else: only a server in trouble gets here
                pass
        return msgs

    async def _loop(self, stop: asyncio.Event, name: str,
                    handle_batch: Callable[[list[Delivery]], Awaitable[None]]) -> None:
        """Fetch and hand over batches until stopped; (re)subscribe when there is no subscription,
        after a reconnect, after an error, or after idling long (nats.py #504)."""
        idle_since = time.monotonic()
        failures = 0
        reconnects = self.bus.reconnects
        while not stop.is_set():
            try:
                sub = self._sub
                if sub is None or reconnects != self.bus.reconnects:
                    reconnects = self.bus.reconnects
                    await self._drop_sub()
                    sub = self._sub = await self._subscribe()
                    idle_since = time.monotonic()
                try:
                    msgs = await self._next_batch(sub)
                except asyncio.TimeoutError:  # nats.errors.TimeoutError is one too; fetch raises either
                    if time.monotonic() - idle_since > self.idle_resubscribe_s:
                        await self._drop_sub()  # silent for long: re-create in case the server lost it
                    continue
                idle_since = time.monotonic()
                await handle_batch([to_delivery(m, self.bus.auth.verifier) for m in msgs])
                failures = 0
            except _RESUBSCRIBE as exc:
                if stop.is_set():
                    break
                failures += 1
                log.warning("consumer %s: %r; re-subscribing", name, exc, exc_info=log.isEnabledFor(logging.DEBUG))
                await self._drop_sub()
                await _sleep(stop, backoff(failures))


class OrderedConsumer(_Pull):
    def __init__(self, bus: Bus, name: str, filter_subjects: Sequence[str], *,
                 position: Callable[[], Awaitable[int]],
                 handle: Callable[[list[Delivery]], Awaitable[None]],
                 batch: int = 256, max_deliver: int = 5, idle_resubscribe_s: float = 30.0) -> None:
        self.bus = bus
        self.name = name
        # one server-side consumer per process: replicas never delete each other's
        self.consumer_name = f"{name}-{os.getpid()}-{int(time.time() * 1000) % 100000}"
        self.filters = list(filter_subjects)
        self.position = position
        self.handle = handle
        self.batch = batch
        self.max_deliver = max_deliver
        self.idle_resubscribe_s = idle_resubscribe_s
        self._sub = None

    async def _subscribe(self) -> JetStreamContext.PullSubscription:
        start = await self.position() + 1
        js = self.bus.js
        try:
            await js.delete_consumer(subjects.STREAM, self.consumer_name)
        except nats.js.errors.NotFoundError:
            pass
        config = ConsumerConfig(
            name=self.consumer_name, durable_name=self.consumer_name, ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start, ack_wait=120,
            max_ack_pending=self.batch * 4, inactive_threshold=300, max_deliver=-1,
            **({"filter_subject": self.filters[0]} if len(self.filters) == 1 else {"filter_subjects": self.filters}))
        await js.add_consumer(subjects.STREAM, config)
        sub = await js.pull_subscribe_bind(durable=self.consumer_name, stream=subjects.STREAM)
        log.info("consumer %s reading from sequence %d", self.name, start)
        return sub

    async def run(self, stop: asyncio.Event) -> None:
        await self._loop(stop, self.name, lambda batch: self._process(batch, stop))
        await self._unsubscribe()

    async def _unsubscribe(self) -> None:
        await self._drop_sub()
        try:
            await self.bus.js.delete_consumer(subjects.STREAM, self.consumer_name)
        except (nats.errors.Error, OSError) as exc:  # server gone or consumer expired: inactive_threshold cleans up
            log.debug("consumer %s: delete: %r", self.name, exc)

    async def _process(self, deliveries: list[Delivery], stop: asyncio.Event) -> None:
        if not deliveries:  # a fetch can come back empty
            return
        started = time.perf_counter()
        for d in deliveries:
            if d.error:
                await self._dead_letter(d, d.error)
        if await self._attempt(deliveries, stop) is not None:
            for d in deliveries:  # isolate the message that keeps failing
                failure = await self._attempt([d], stop)
                if failure is not None:
                    await self._dead_letter(d, failure)
                    if await self._attempt([d], stop) is not None:  # now only records its position
                        raise RuntimeError(f"consumer {self.name} cannot record the position of a dead letter")
        for d in deliveries:
            await d.ack()
        outcome = {True: "dead_lettered", False: "applied"}
        for d in deliveries:
            EVENTS_CONSUMED.labels(self.name, outcome[d.error is not None]).inc()
        BATCH_SECONDS.labels(self.name).observe(time.perf_counter() - started)

    async def _attempt(self, deliveries: list[Delivery], stop: asyncio.Event) -> str | None:
        """Up to max_deliver tries of the handler; None on success, else why it failed.
        Transient failures are retried without counting, until they pass or we are stopped."""
        attempt = 0
        while True:
            try:
                await self.handle(deliveries)
                return None
            except Exception as exc:  # noqa: BLE001 - the handler is user-level code
                if is_transient(exc):
                    log.warning("consumer %s: transient failure, retrying: %s", self.name, exc)
                    if stop.is_set():
                        raise asyncio.CancelledError("stopping with a batch unapplied") from exc
                    await asyncio.sleep(backoff(3))
                    continue
                attempt += 1
                log.warning("consumer %s: attempt %d failed: %s", self.name, attempt, exc)
                if attempt >= self.max_deliver:
                    return f"handler failed {attempt} times: {type(exc).__name__}: {exc}"
                await asyncio.sleep(backoff(attempt))

    async def _dead_letter(self, d: Delivery, reason: str) -> None:
        d.error = reason
        await self.bus.dead_letter(subject=d.subject, payload=d.data, consumer=self.name, reason=reason,
                                   stream_seq=d.seq, headers=d.headers)


class WorkConsumer(_Pull):
    """A durable consumer for idempotent reactions: ack, nak with backoff, dead-letter at max_deliver.

    concurrency 1: a batch is handled one message after the other. concurrency N: up to N messages
    are handled at once, each settled (acked, nak-ed) on its own when its handler ends, and up to
    `batch` more wait in hand for a free handler (kept in progress like the others). The next pull
    is made once that buffer is half empty and asks for what there is room for: one pull request per
    batch, where N loops that each pulled one message paid a round trip to the server per message
    and a wait behind each other (and pulling the moment one handler was free took one message per
    pull at full load: ~90 tasks/s for 32 runners, bench_tasks.py)."""

    def __init__(self, bus: Bus, durable: str, filter_subjects: Sequence[str], *,
                 handle: Callable[[Delivery], Awaitable[None]], max_deliver: int = 5, batch: int = 16,
                 ack_wait: float = 30.0, deliver_new: bool = False, idle_resubscribe_s: float = 30.0,
                 concurrency: int = 1) -> None:
        self.bus = bus
        self.concurrency = max(1, concurrency)
        self._running: set[asyncio.Task[None]] = set()  # handlers at work (concurrency > 1)
        self.durable = durable
        self.filters = list(filter_subjects)
        self.handle = handle
        self.max_deliver = max_deliver
        self.batch = batch
        self.ack_wait = ack_wait
        self.deliver_policy = DeliverPolicy.NEW if deliver_new else DeliverPolicy.ALL
        self.idle_resubscribe_s = idle_resubscribe_s
        self._sub = None

    async def _subscribe(self) -> JetStreamContext.PullSubscription:
        js = self.bus.js
        try:
            info = await js.consumer_info(subjects.STREAM, self.durable)
            if info.config.ack_wait is not None and abs(info.config.ack_wait - self.ack_wait) > 0.001:
                await self._update_ack_wait(info.config)
        except nats.js.errors.NotFoundError:
            config = ConsumerConfig(
                durable_name=self.durable, ack_policy=AckPolicy.EXPLICIT, deliver_policy=self.deliver_policy,
                ack_wait=self.ack_wait, max_deliver=-1, max_ack_pending=max(self.batch * 4, self.concurrency * 4, 64),
                **({"filter_subject": self.filters[0]} if len(self.filters) == 1
                   else {"filter_subjects": self.filters}))
            await js.add_consumer(subjects.STREAM, config)
        return await js.pull_subscribe_bind(durable=self.durable, stream=subjects.STREAM)

    async def _update_ack_wait(self, config: ConsumerConfig) -> None:
        """A durable made by an older release keeps its ack wait unless told (an update, not a new one)."""
        try:
            await self.bus.js.add_consumer(subjects.STREAM, dataclasses.replace(config, ack_wait=self.ack_wait))
            log.info("consumer %s: ack wait %.0f s -> %.0f s", self.durable, config.ack_wait or 0, self.ack_wait)
        except nats.js.errors.APIError as exc:  # keeps working with the old one
            log.warning("consumer %s: could not change its ack wait: %s", self.durable, exc)

    def _room(self) -> int:
        if self.concurrency == 1:
            return self.batch
        return min(self.batch, self.concurrency + self.batch - len(self._running))

    async def run(self, stop: asyncio.Event) -> None:
        if self.concurrency > 1:
            await self._run_concurrently(stop)
            return

        async def one_by_one(batch: list[Delivery]) -> None:
            pending = list(batch)
            keeper = asyncio.create_task(self._keep_in_progress(pending), name=f"in progress {self.durable}")
            try:
                for d in batch:  # one at a time: finish the message in hand before stopping
                    await self._one(d)
                    pending.remove(d)
            finally:
                keeper.cancel()

        await self._loop(stop, self.durable, one_by_one)
        await self._drop_sub()

    async def _run_concurrently(self, stop: asyncio.Event) -> None:
        in_hand: dict[int, Delivery] = {}  # by id(): what the in-progress beats cover
        handlers = asyncio.Semaphore(self.concurrency)  # messages beyond it wait in hand, in arrival order

        async def settle(d: Delivery) -> None:
            try:
                async with handlers:
                    if stop.is_set():  # stopping: one not begun goes back at once, to a replica or the next run
                        await d.nak(delay=0)
                        return
                    await self._one(d)
            except Exception as exc:  # noqa: BLE001 - not settled (the connection went): the server redelivers
                log.warning("consumer %s: seq %d left unsettled: %r", self.durable, d.seq, exc)
            finally:
                in_hand.pop(id(d), None)

        async def spawn(batch: list[Delivery]) -> None:
            for d in batch:
                in_hand[id(d)] = d
                task = asyncio.create_task(settle(d), name=f"{self.durable} seq {d.seq}")
                self._running.add(task)
                task.add_done_callback(self._running.discard)
            # the next pull once the messages waiting in hand are down to half a batch
            while len(self._running) - self.concurrency > self.batch // 2:
                await asyncio.wait(set(self._running), return_when=asyncio.FIRST_COMPLETED)

        keeper = asyncio.create_task(self._keep_in_progress(in_hand, forever=True), name=f"in progress {self.durable}")
        try:
            await self._loop(stop, self.durable, spawn)
            if self._running:  # finish the messages in hand before stopping
                await asyncio.gather(*set(self._running), return_exceptions=True)
        finally:
            keeper.cancel()
            await self._drop_sub()

    async def _keep_in_progress(self, pending: list[Delivery] | dict[int, Delivery], forever: bool = False) -> None:
        """While a batch is worked through, tell the server its unfinished messages are in hand, so the
        ack wait can be short: a process that dies with a message in hand gets it redelivered (to its
        next run) after ack_wait, not after the longest a handler may take."""
        while pending or forever:
            await asyncio.sleep(self.ack_wait / 3)
            for d in list(pending.values() if isinstance(pending, dict) else pending):
                try:
                    await d.in_progress()
                except (nats.errors.Error, OSError) as exc:  # the connection is down: the server redelivers
                    log.debug("consumer %s: in-progress of seq %d: %r", self.durable, d.seq, exc)

    async def _one(self, d: Delivery) -> None:
        if d.error or d.message is None:
            await self._dead_letter(d, d.error or "no message")
            return
        env = d.message.envelope
        try:
            with consuming_span(f"handle {env.type}", d.headers, env.correlation_id):
                await self.handle(d)
        except Exception as exc:  # noqa: BLE001 - the handler is user-level code; the server redelivers
            if not is_transient(exc) and d.num_delivered >= self.max_deliver:
                await self._dead_letter(d, f"handler failed {d.num_delivered} times: {type(exc).__name__}: {exc}")
                return
            log.warning("consumer %s: delivery %d of seq %d failed: %s", self.durable, d.num_delivered, d.seq, exc)
            await d.nak(delay=backoff(d.num_delivered, base=0.2, cap=15))
            EVENTS_CONSUMED.labels(self.durable, "nak").inc()
            return
        await d.ack()
        EVENTS_CONSUMED.labels(self.durable, "handled").inc()

    async def _dead_letter(self, d: Delivery, reason: str) -> None:
        await self.bus.dead_letter(subject=d.subject, payload=d.data, consumer=self.durable, reason=reason,
                                   stream_seq=d.seq, headers=d.headers)
        await d.term()
        EVENTS_CONSUMED.labels(self.durable, "dead_lettered").inc()


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except asyncio.TimeoutError:
        pass
