"""The replay reader's pure parts: where a pushed message is in the stream (from its reply subject),
and how pushed messages become batches that end at the end sequence."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from levers9.runtime.reader import _Batcher, _reply_position


@dataclass
class FakeMsg:
    reply: str


def reply(seq: int, pending: int, v2: bool = False) -> str:
    if v2:  # $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<time>.<pending>.<token>
        return f"$JS.ACK.dom.acchash.LEVERS9.cons.1.{seq}.{seq}.1700000000.{pending}.tok"
    return f"$JS.ACK.LEVERS9.cons.1.{seq}.{seq}.1700000000.{pending}"


@given(seq=st.integers(1, 2**62), pending=st.integers(0, 2**40), v2=st.booleans())
def test_the_reply_subject_gives_the_sequence_and_what_is_pending(seq, pending, v2):
    assert _reply_position(reply(seq, pending, v2)) == (seq, str(pending))


async def collect(batcher: _Batcher) -> list[list[int]]:
    return [[_reply_position(m.reply)[0] for m in batch] async for batch in batcher.batches(quiet_s=0.05)]


@given(end=st.integers(1, 60), extra=st.integers(0, 10), size=st.integers(1, 16))
async def test_batches_hold_every_message_up_to_the_end_in_order_and_stop_there(end, extra, size):
    batcher = _Batcher(end_seq=end, batch=size)
    total = end + extra
    for seq in range(1, total + 1):  # the server may push past the end: those are not read
        await batcher.on_msg(FakeMsg(reply(seq, total - seq)))
    batches = await collect(batcher)
    assert [s for b in batches for s in b] == list(range(1, end + 1))
    assert all(len(b) <= size for b in batches)
    assert batcher.finished


async def test_a_pending_count_of_zero_ends_the_read_before_the_end_sequence():
    batcher = _Batcher(end_seq=100, batch=10)
    for seq, pending in ((3, 2), (7, 1), (9, 0), (11, 0)):  # a filter: sparse sequences
        await batcher.on_msg(FakeMsg(reply(seq, pending)))
    assert await collect(batcher) == [[3, 7, 9]]


async def test_a_quiet_server_ends_the_read_with_what_came():
    batcher = _Batcher(end_seq=100, batch=10)
    for seq in (1, 2):
        await batcher.on_msg(FakeMsg(reply(seq, 50)))
    assert await asyncio.wait_for(collect(batcher), 5) == [[1, 2]]
