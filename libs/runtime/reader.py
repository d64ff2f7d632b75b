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


async def read(bus: Bus, filters: Sequence[str] = (f"{subjects.ROOT}.>",), *, start_seq: int = 1,
               end_seq: int | None = None, batch: int = 2000,
               stream: str = subjects.STREAM) -> AsyncIterator[list[Msg]]:
    """Yield batches of messages in stream order from start_seq to end_seq (default: the end now)."""
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
