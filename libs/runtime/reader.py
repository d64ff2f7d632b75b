"""Reading a range of the log fast: an ephemeral pull consumer with no acks, big batches, stopping
when the server says nothing is pending (or at the end sequence)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import AsyncIterator, Sequence

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from levers9.contracts import subjects

from .bus import Bus


async def seq_at_time(bus: Bus, when: dt.datetime, stream: str = subjects.STREAM) -> int:
    """The first sequence at or after a time (FACTS: convert a start time to a sequence once, then
    replay by sequence). Uses the stream's direct-get API; past the end gives last_seq + 1."""
    stamp = when.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    resp = await bus.nc.request(f"$JS.API.DIRECT.GET.{stream}", json.dumps({"start_time": stamp}).encode(),
                                timeout=5)
    headers = resp.headers or {}
    if headers.get("Status") == "404" or "Nats-Sequence" not in headers:
        return (await bus.js.stream_info(stream)).state.last_seq + 1
    return int(headers["Nats-Sequence"])


def _reply_position(reply: str) -> tuple[int, str]:
    """The stream sequence and the pending count after this message, from its ack reply subject."""
    tokens = reply.split(".")
    if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<time>.<pending>
        return int(tokens[5]), tokens[8]
    return int(tokens[Msg.Ack.StreamSeq]), tokens[Msg.Ack.NumPending]  # the v2 form: domain, account hash


class _Batcher:
    """Collects a push consumer's messages (in its callback) into batches up to `end_seq`; a None
    on the queue marks the end."""

    def __init__(self, end_seq: int, batch: int) -> None:
        self.end_seq = end_seq
        self.batch = batch
        self.queue: asyncio.Queue[list[Msg] | None] = asyncio.Queue()
        self.pending: list[Msg] = []
        self.finished = False

    async def on_msg(self, m: Msg) -> None:
        if self.finished:
            return
        seq, left = _reply_position(m.reply)
        if seq <= self.end_seq:
            self.pending.append(m)
        if seq >= self.end_seq or left == "0":
            self.finished = True
        if self.finished or len(self.pending) >= self.batch:
            self.queue.put_nowait(self.pending[:])
            self.pending.clear()
            if self.finished:
                self.queue.put_nowait(None)

    async def batches(self, quiet_s: float = 5.0) -> AsyncIterator[list[Msg]]:
        while True:
            try:
                item = await asyncio.wait_for(self.queue.get(), timeout=quiet_s)
            except asyncio.TimeoutError:  # nothing for a while: the server has nothing more for us
                if self.pending:
                    yield self.pending[:]
                return
            if item is None:
                return
            if item:
                yield item


async def _read_push(bus: Bus, filters: Sequence[str] = (f"{subjects.ROOT}.>",), *, start_seq: int = 1,
                     end_seq: int | None = None, batch: int = 2000,
                     stream: str = subjects.STREAM) -> AsyncIterator[list[Msg]]:
    """One filter: an ordered PUSH consumer whose messages arrive in a callback (nats-py's fetch()
    costs a task and a timer per message; this is ~3x faster). Flow control and gap detection are
    nats-py's ordered consumer's. The end: end_seq, or the reply subject's pending count reaching 0."""
    if end_seq is None:
        end_seq = (await bus.js.stream_info(stream)).state.last_seq
    if start_seq > end_seq:
        return
    batcher = _Batcher(end_seq, batch)
    config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, start_seq),
                            mem_storage=True)
    sub = await bus.js.subscribe(list(filters)[0], ordered_consumer=True, cb=batcher.on_msg, config=config,
                                 pending_msgs_limit=1_000_000, pending_bytes_limit=1 << 30)
    try:
        info = await sub.consumer_info()
        if info.num_pending == 0 and (info.delivered is None or info.delivered.consumer_seq == 0):
            return  # nothing matches
        async for item in batcher.batches():
            yield item
    finally:
        await sub.unsubscribe()


async def read(bus: Bus, filters: Sequence[str] = (f"{subjects.ROOT}.>",), *, start_seq: int = 1,
               end_seq: int | None = None, batch: int = 2000,
               stream: str = subjects.STREAM) -> AsyncIterator[list[Msg]]:
    """Yield batches of messages in stream order from start_seq to end_seq (default: the end now)."""
    if len(list(filters)) == 1:
        async for batch_ in _read_push(bus, list(filters), start_seq=start_seq, end_seq=end_seq, batch=batch,
                                       stream=stream):
            yield batch_
        return
    if end_seq is None:
        end_seq = (await bus.js.stream_info(stream)).state.last_seq
    if start_seq > end_seq:
        return
    filters = list(filters)
    config = ConsumerConfig(
        ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, start_seq),
        inactive_threshold=30, max_ack_pending=-1, mem_storage=True,
        **({"filter_subject": filters[0]} if len(filters) == 1 else {"filter_subjects": filters}))
    info = await bus.js.add_consumer(stream, config)
    sub = await bus.js.pull_subscribe_bind(durable=info.name, stream=stream)
    try:
        if info.num_pending == 0:
            return
        while True:
            try:
                msgs = await sub.fetch(batch, timeout=2.0)
            except asyncio.TimeoutError:  # fetch raises nats' or asyncio's
                return
            out = [m for m in msgs if m.metadata.sequence.stream <= end_seq]
            if out:
                yield out
            last = msgs[-1].metadata
            if last.sequence.stream >= end_seq or last.num_pending == 0 or len(out) < len(msgs):
                return
    finally:
        try:
            await bus.js.delete_consumer(stream, info.name)
        except (nats.js.errors.Error, nats.errors.Error):
            pass
