"""The consumers' pure parts: retry delays, what counts as an infrastructure failure, and a delivery
settling itself with the server (or with nobody, when it was not delivered by a subscription)."""

from __future__ import annotations

import asyncio

import asyncpg
import nats.errors
from hypothesis import given
from hypothesis import strategies as st

from levers9.runtime.consumer import Delivery, backoff, is_transient


@given(attempt=st.integers(-3, 200), base=st.floats(0.01, 1), cap=st.floats(1, 60))
def test_backoff_grows_and_stays_under_the_cap(attempt, base, cap):
    delay = backoff(attempt, base, cap)
    assert 0 < delay <= cap
    assert backoff(attempt + 1, base, cap) >= delay
    if attempt <= 1:
        assert delay == min(cap, base)


def test_infrastructure_failures_are_transient_and_the_messages_own_are_not():
    for exc in (ConnectionResetError(), asyncio.TimeoutError(), OSError(), nats.errors.NoRespondersError(),
                nats.errors.ConnectionClosedError(), asyncpg.exceptions.TooManyConnectionsError(),
                asyncpg.exceptions.InvalidCachedStatementError(),
                asyncpg.InternalClientError("cannot switch to state 12; another operation (2) is in progress")):
        assert is_transient(exc), exc
    for exc in (ValueError("bad data"), KeyError("x"), RuntimeError(), asyncpg.exceptions.UniqueViolationError()):
        assert not is_transient(exc), exc


class RecordingMsg:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float | None]] = []

    async def ack(self) -> None:
        self.calls.append(("ack", None))

    async def nak(self, delay: float | None = None) -> None:
        self.calls.append(("nak", delay))

    async def term(self) -> None:
        self.calls.append(("term", None))


def delivery(raw: object | None) -> Delivery:
    return Delivery(seq=1, subject="levers9.acme.container.c1.ContainerRequested", data=b"{}", headers={},
                    num_delivered=1, raw=raw)  # type: ignore[arg-type]


async def test_a_delivery_settles_through_its_message():
    raw = RecordingMsg()
    d = delivery(raw)
    await d.ack()
    await d.nak(delay=1.5)
    await d.term()
    assert raw.calls == [("ack", None), ("nak", 1.5), ("term", None)]


async def test_a_delivery_without_a_message_has_nothing_to_settle():
    d = delivery(None)
    await d.ack()
    await d.nak(delay=1.0)
    await d.term()  # would raise if it reached for a message it does not have


class FakeBusWithoutServer:
    """Just what an ordered consumer's loop touches before it has a subscription (a fake, no NATS)."""
    reconnects = 0

    class js:  # noqa: N801 - stands in for the bus's JetStream context
        @staticmethod
        async def delete_consumer(stream: str, name: str) -> None:
            raise nats.errors.ConnectionClosedError()


async def test_an_ordered_consumer_outlives_postgres_restarting_while_it_subscribes():
    """Its position is read from Postgres when it subscribes: "the database system is shutting down"
    there is a pause and a new try, not the end of the loop (which stopped the whole service)."""
    from levers9.runtime.consumer import OrderedConsumer

    stop = asyncio.Event()
    tries = []

    async def position() -> int:
        tries.append(1)
        if len(tries) == 2:
            stop.set()
        raise asyncpg.exceptions.CannotConnectNowError("the database system is shutting down")

    async def handle(batch) -> None:
        raise AssertionError("nothing is delivered")

    consumer = OrderedConsumer(FakeBusWithoutServer(), "view", ["levers9.>"], position=position,  # type: ignore[arg-type]
                               handle=handle)
    await asyncio.wait_for(consumer.run(stop), timeout=10)
    assert len(tries) == 2
