"""The keep-warm rule: a ready container stops once idle for keep_warm_seconds, counted from its own
ready time at the earliest (a restored runner remembers its origin's requests). The clock is
passed in: no sleeping."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from levers9.worker.lifecycle.idle import idle_since, should_stop_idle

times = st.floats(0, 1e9, allow_nan=False)
keep = st.integers(0, 86_400)


def test_examples():
    assert should_stop_idle(100.0, ready_at=0.0, last_request_at=None, inflight=0, keep_warm_seconds=60) \
        == "idle for 60 s (scale to zero)"
    assert should_stop_idle(59.0, ready_at=0.0, last_request_at=None, inflight=0, keep_warm_seconds=60) is None
    assert should_stop_idle(100.0, ready_at=0.0, last_request_at=50.0, inflight=0, keep_warm_seconds=60) is None
    assert should_stop_idle(1000.0, ready_at=0.0, last_request_at=None, inflight=1, keep_warm_seconds=60) is None


def test_a_restored_runner_counts_from_its_own_ready_time():
    # the dumped container served its last request at t=10; this copy became ready at t=1000
    assert should_stop_idle(1030.0, ready_at=1000.0, last_request_at=10.0, inflight=0, keep_warm_seconds=60) is None
    assert should_stop_idle(1060.0, ready_at=1000.0, last_request_at=10.0, inflight=0, keep_warm_seconds=60)


@given(now=times, ready=times, last=st.none() | times, inflight=st.integers(0, 100), keep=keep)
def test_never_stops_a_busy_container(now, ready, last, inflight, keep):
    if inflight > 0:
        assert should_stop_idle(now, ready, last, inflight, keep) is None


@given(now=times, ready=times, last=st.none() | times, keep=keep)
def test_stops_exactly_when_idle_long_enough(now, ready, last, keep):
    since = max(ready, last or 0.0)
    stop = should_stop_idle(now, ready, last, 0, keep)
    assert (stop is not None) == (now - since >= keep)
    assert idle_since(ready, last) >= ready  # never earlier than its own ready time


@given(now=times, later=st.floats(0, 1e6, allow_nan=False), ready=times, last=st.none() | times, keep=keep)
def test_once_idle_it_stays_idle_as_time_passes(now, later, ready, last, keep):
    if should_stop_idle(now, ready, last, 0, keep):
        assert should_stop_idle(now + later, ready, last, 0, keep)


@given(now=times, ready=times, last=times, newer=st.floats(0, 1e6, allow_nan=False), keep=keep)
def test_a_newer_request_never_stops_it_sooner(now, ready, last, newer, keep):
    if should_stop_idle(now, ready, last + newer, 0, keep):
        assert should_stop_idle(now, ready, last, 0, keep)
