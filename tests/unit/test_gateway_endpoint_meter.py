"""The endpoint meter (pure): bucket percentiles against exact ones, bounded buffer, take/restore, the
stats merge of endpoint minutes with function calls, and that a failing meter never fails a call."""

from __future__ import annotations

import datetime as dt
import types

from hypothesis import given
from hypothesis import strategies as st

from levers9.gateway import endpoint_meter as M
from levers9.gateway import routes_invoke
from levers9.gateway.routes_stats import minute_series, percentile

AT = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
latencies = st.floats(min_value=0.0, max_value=M.BOUNDS_MS[-1], allow_nan=False)


@given(st.lists(latencies, min_size=1, max_size=300), st.floats(min_value=0.0, max_value=1.0))
def test_bucket_percentile_is_within_one_bucket_of_the_exact_one(values, q):
    exact = percentile(values, q)
    estimate = M.bucket_percentile(M.histogram(values), q)
    assert exact is not None and estimate is not None
    low, high = M.bucket_range(M.slot(exact))
    assert low <= estimate <= high and abs(estimate - exact) <= high - low


@given(st.lists(st.floats(min_value=M.BOUNDS_MS[-1], max_value=1e9, allow_nan=False), min_size=1, max_size=20))
def test_latencies_above_the_top_bound_read_as_the_top_bound(values):
    assert M.bucket_percentile(M.histogram(values), 0.99) == M.BOUNDS_MS[-1] or max(values) == M.BOUNDS_MS[-1]


def test_bounds_are_increasing_and_fixed():
    assert all(a < b for a, b in zip(M.BOUNDS_MS, M.BOUNDS_MS[1:]))
    assert (M.BOUNDS_MS[0], M.BOUNDS_MS[1], len(M.BOUNDS_MS)) == (0.5, 0.625, 64)  # stored by index: never change
    assert M.bucket_percentile([0] * M.SLOTS, 0.5) is None


def test_add_counts_minutes_errors_and_first_answers():
    m = M.EndpointMeter()
    m.add("ws", "d-v1", 200, 3.0, AT)
    m.add("ws", "d-v1", 503, 7.0, AT + dt.timedelta(seconds=30))
    m.add("ws", "d-v1", 404, 7.0, AT + dt.timedelta(minutes=1))
    m.answered("ws", "c1", AT)
    m.answered("ws", "c1", AT + dt.timedelta(seconds=1))
    minutes, answers = m.take()
    first = minutes[("ws", "d-v1", AT.replace(second=0))]
    assert (first.calls, first.errors, sum(first.counts)) == (2, 1, 2)
    assert minutes[("ws", "d-v1", AT.replace(second=0) + dt.timedelta(minutes=1))].errors == 0
    assert answers == {("ws", "c1"): AT}
    m.answered("ws", "c1", AT + dt.timedelta(seconds=2))  # already taken: not sent again
    assert m.take() == ({}, {})


def test_a_full_buffer_drops_and_counts(monkeypatch):
    monkeypatch.setattr(M, "MAX_PENDING", 2)
    m = M.EndpointMeter()
    for i in range(3):
        m.add("ws", f"d{i}", 200, 1.0, AT)
        m.answered("ws", f"c{i}", AT)
    m.add("ws", "d0", 200, 1.0, AT)  # an existing key still counts
    assert (m.dropped, len(m.minutes), m.minutes[("ws", "d0", AT.replace(second=0))].calls) == (2, 2, 2)


def test_restore_merges_a_failed_flush_with_what_came_since():
    m = M.EndpointMeter()
    m.add("ws", "d", 200, 1.0, AT)
    m.answered("ws", "c", AT + dt.timedelta(seconds=5))
    taken = m.take()
    m.add("ws", "d", 500, 1000.0, AT)
    m.answered("ws", "c", AT)  # taken ones are 'seen': ignored until restored
    m.restore(*taken)
    minute = m.minutes[("ws", "d", AT.replace(second=0))]
    assert (minute.calls, minute.errors, sum(minute.counts)) == (2, 1, 2)
    assert m.answers == {("ws", "c"): AT + dt.timedelta(seconds=5)}


def test_stats_merge_endpoint_minutes_with_function_calls():
    until = AT
    minute = AT.replace(second=0)
    counts = M.histogram([10.0] * 98 + [900.0] * 2)
    series = minute_series(until, 2, [(AT, "ok", 10.0), (AT, "error", 12.0), (AT - dt.timedelta(minutes=1), "ok", 5.0)],
                           [(minute, 100, 2, counts, 3), (minute, 1, 1, M.histogram([10.0]), 5),
                            (minute - dt.timedelta(minutes=5), 7, 0, counts, 9)])  # out of the window
    old, now = series
    assert (old["calls"], old["errors"], old["p50_ms"], old["queued_peak"]) == (1, 0, 5.0, 0)  # exact, none queued
    assert (now["calls"], now["errors"], now["queued_peak"]) == (103, 4, 5)  # two replicas' rows: the greatest
    low, high = M.bucket_range(M.slot(10.0))
    assert low <= now["p50_ms"] <= high
    low, high = M.bucket_range(M.slot(900.0))
    assert low <= now["p99_ms"] <= high


async def test_a_failing_meter_never_fails_the_call():
    broken = types.SimpleNamespace(add=None, answered=None)  # calling None raises TypeError
    gw = types.SimpleNamespace(meter=broken)
    dep = types.SimpleNamespace(workspace="ws", deployment_id="d-v1")
    routes_invoke.meter(gw, dep, 200, 0.0, None)  # type: ignore[arg-type]


def test_the_meter_records_status_and_the_answering_container():
    gw = types.SimpleNamespace(meter=M.EndpointMeter())
    dep = types.SimpleNamespace(workspace="ws", deployment_id="d-v1")
    response = types.SimpleNamespace(headers={"x-levers9-container-id": "c9"})
    routes_invoke.meter(gw, dep, 502, 0.0, response)  # type: ignore[arg-type]
    (key, m), = gw.meter.minutes.items()
    assert (key[:2], m.calls, m.errors, list(gw.meter.answers)) == (("ws", "d-v1"), 1, 1, [("ws", "c9")])


def test_queue_samples_keep_the_minutes_peak_and_survive_a_failed_flush():
    m = M.EndpointMeter()
    m.queued("ws", "d", 0, AT)  # nothing waited: no row
    assert m.minutes == {}
    m.queued("ws", "d", 4, AT)
    m.queued("ws", "d", 2, AT + dt.timedelta(seconds=5))
    taken = m.take()
    m.queued("ws", "d", 3, AT)
    m.restore(*taken)
    assert m.minutes[("ws", "d", AT.replace(second=0))].queued_peak == 4


async def test_the_router_peak_counts_calls_waiting_at_once_and_restarts_from_those_still_waiting():
    import asyncio

    from levers9.gateway.router import DeploymentRouter

    router = DeploymentRouter("d-v1", concurrency=1, max_containers=1)
    requested: list[str] = []

    async def request() -> str:
        requested.append(f"c{len(requested)}")
        return requested[-1]

    waiters = [asyncio.create_task(router.acquire(30, request)) for _ in range(3)]
    while router.waiting < 3:
        await asyncio.sleep(0)
    assert router.take_peak() == 3
    await router.update("c0", "ready", "10.0.0.2:8000")
    first = await asyncio.wait_for(asyncio.shield(asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)), 5)
    assert len(first[0]) == 1 and router.waiting == 2
    assert router.take_peak() == 3  # the peak since the last take started from the three waiting then
    assert router.take_peak() == 2  # ... and this one from the two waiting now
    for w in waiters:
        w.cancel()
