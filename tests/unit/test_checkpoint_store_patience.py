"""How long a dump waits for its node cache: counted from the dump's envelope (waited_s), so a node
that never comes back ends its checkpoint (CheckpointFailed) instead of being retried for ever."""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st

from levers9.checkpoint_store.service import NODE_CACHE_PATIENCE_S, waited_s
from levers9.contracts.envelope import now_iso


@given(st.floats(min_value=0, max_value=10 * 86400))
def test_waited_is_the_time_since_the_envelope(ago):
    stamp = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.timezone.utc)
    occurred = stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert abs(waited_s(occurred, now=stamp.timestamp() + ago) - ago) < 1e-3


def test_a_fresh_dump_waits_and_an_unreadable_time_never_gives_up_early():
    assert waited_s(now_iso()) < NODE_CACHE_PATIENCE_S
    assert waited_s("not a time") == 0.0
    assert waited_s("2026-12-05T12:00:00.000000Z", now=dt.datetime(2026, 12, 5, 11, tzinfo=dt.timezone.utc)
                    .timestamp()) == 0.0  # a clock behind the dump's
