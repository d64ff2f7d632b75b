"""The autoscaling policy (levers9.contracts.autoscaling): examples for each rule, and properties over
random deployments, containers, loads and times."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from levers9.contracts.autoscaling import LIVE, Box, Load, crash_backoff_s, decide, desired_of, starts_for_waiting
from levers9.contracts.spec import InvalidSpec, Scaling, decode_spec
from levers9.contracts.warm_schedule import scheduled_minimum

NOW = dt.datetime(2026, 12, 7, 12, 0, tzinfo=dt.timezone.utc)  # a Monday
T = NOW.timestamp()


def ready(cid: str, idle_for: float | None = 0.0, inflight: int = 0) -> Box:
    return Box(cid, "ready", inflight, None if idle_for is None else T - idle_for)


def test_min_containers_are_kept_warm_with_no_traffic_and_started_again():
    s = Scaling(min_containers=1, max_containers=3)
    d = decide(s, [], Load(), NOW)
    assert (d.start, d.desired) == (1, 1) and "min_containers=1" in d.start_reason
    assert decide(s, [Box("a", "failed")], Load(), NOW).start == 1  # one died: replaced
    assert decide(s, [ready("a", idle_for=3600)], Load(), NOW).start == 0  # kept, never stopped
    assert decide(s, [ready("a", idle_for=3600)], Load(), NOW).stop == ()


def test_failed_starts_back_off_doubling_to_five_minutes_and_hold_only_starts():
    assert crash_backoff_s(0) == 0 and crash_backoff_s(1) == 5 and crash_backoff_s(2) == 10
    assert crash_backoff_s(7) == 300 and crash_backoff_s(10_000) == 300
    s = Scaling(min_containers=2, max_containers=3, scaledown_window=60)
    held = decide(s, [Box("a", "failed")], Load(), NOW, held_until=T + 4)
    assert (held.start, held.desired, held.held_s) == (0, 2, 4) and held.start_reason == ""
    assert decide(s, [Box("a", "failed")], Load(), NOW, held_until=T).start == 2  # the back-off is over
    over = [ready(c, idle_for=3600) for c in "abcd"]
    assert len(decide(s, over, Load(), NOW, held_until=T + 60).stop) == 2  # stops are not held


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 60), st.integers(0, 60))
def test_the_back_off_never_shrinks_with_more_failures(a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert 0 <= crash_backoff_s(lo) <= crash_backoff_s(hi) <= 300


def test_scale_to_zero_after_the_window_only():
    s = Scaling(scaledown_window=60)
    assert decide(s, [ready("a", idle_for=59)], Load(), NOW).stop == ()
    [stop] = decide(s, [ready("a", idle_for=61)], Load(), NOW).stop
    assert stop.container_id == "a" and "scaledown_window=60" in stop.reason
    assert decide(Scaling(keep_warm_seconds=120), [ready("a", idle_for=61)], Load(), NOW).stop == ()


def test_nothing_stops_while_the_load_is_unknown_or_the_container_is_busy():
    s = Scaling(scaledown_window=0)
    assert decide(s, [ready("a", idle_for=600)], Load(known=False), NOW).stop == ()
    assert decide(s, [ready("a", idle_for=600, inflight=1)], Load(inflight=1), NOW).stop == ()
    assert decide(s, [Box("a", "starting")], Load(), NOW).stop == ()


def test_target_concurrency_drives_the_count_and_buffer_adds_idle_ones():
    s = Scaling(max_containers=10, concurrency=8, target_concurrency=2, buffer_containers=1)
    d = decide(s, [], Load(waiting=1, inflight=4), NOW)
    assert d.desired == 3 + 1 and d.start == 4 and "target_concurrency=2" in d.start_reason
    assert decide(s, [], Load(), NOW).desired == 0  # no load, no minimum: the buffer goes too
    assert decide(Scaling(min_containers=1, max_containers=3, buffer_containers=1), [], Load(), NOW).desired == 2


def test_max_containers_is_never_exceeded_and_a_lowered_max_stops_idle_ones_at_once():
    s = Scaling(max_containers=2)
    assert decide(s, [], Load(waiting=50), NOW).start == 2
    boxes = [ready("a", idle_for=1), ready("b", idle_for=2), ready("c", idle_for=5, inflight=1)]
    d = decide(s, boxes, Load(inflight=1), NOW)
    assert [x.container_id for x in d.stop] == ["b"] and "above max_containers=2" in d.stop[0].reason


def test_tasks_per_container():
    s = Scaling(max_containers=10)
    assert decide(s, [], Load(queued_tasks=7, tasks_per_container=3), NOW).start == 3
    # tasks a runner took wait for a sandbox as calls too: the larger need counts, not the sum
    assert decide(s, [], Load(waiting=3, queued_tasks=3, tasks_per_container=1), NOW).start == 3


def test_the_warm_schedule_latest_tick_wins_in_its_time_zone():
    s = Scaling(max_containers=5, warm_schedule={"0 8 * * 1-5": 2, "0 19 * * 1-5": 0},
                warm_schedule_timezone="Europe/Berlin")
    at = dict(tzinfo=dt.timezone.utc)
    assert desired_of(s, Load(), dt.datetime(2026, 12, 7, 6, 59, **at))[0] == 0  # Monday 07:59 Berlin: Friday's 19:00
    assert desired_of(s, Load(), dt.datetime(2026, 12, 7, 7, 0, **at))[0] == 2  # 08:00 Berlin: at the tick
    assert desired_of(s, Load(), dt.datetime(2026, 12, 7, 17, 59, **at))[0] == 2
    assert desired_of(s, Load(), dt.datetime(2026, 12, 7, 18, 0, **at))[0] == 0
    assert desired_of(s, Load(), dt.datetime(2026, 12, 12, 10, 0, **at))[0] == 0  # Saturday: Friday's 19:00
    assert scheduled_minimum({}, "UTC", NOW) is None


# ---- properties ----------------------------------------------------------------------------------

@st.composite
def scalings(draw: st.DrawFn) -> Scaling:
    high = draw(st.integers(1, 8))
    concurrency = draw(st.integers(1, 8))
    schedule = draw(st.dictionaries(st.sampled_from(["0 8 * * *", "0 19 * * *", "*/5 * * * *", "30 12 * * 1-5"]),
                                    st.integers(0, high), max_size=3))
    return Scaling(min_containers=draw(st.integers(0, high)), max_containers=high, concurrency=concurrency,
                   target_concurrency=draw(st.integers(0, concurrency)),
                   buffer_containers=draw(st.integers(0, high)), scaledown_window=draw(st.integers(0, 300)),
                   warm_schedule=schedule, warm_schedule_timezone=draw(st.sampled_from(["UTC", "Europe/Berlin"])))


boxes_ = st.lists(st.builds(Box, container_id=st.uuids().map(str),
                            status=st.sampled_from(sorted(LIVE | {"stopped", "failed"})),
                            inflight=st.integers(0, 3), idle_since=st.one_of(st.none(), st.floats(T - 600, T)),
                            stopping=st.booleans()), max_size=12, unique_by=lambda b: b.container_id)
loads = st.builds(Load, waiting=st.integers(0, 40), inflight=st.integers(0, 40), queued_tasks=st.integers(0, 20),
                  tasks_per_container=st.integers(0, 4), known=st.booleans())
times = st.datetimes(dt.datetime(2026, 1, 1), dt.datetime(2027, 12, 31), timezones=st.just(dt.timezone.utc))


@settings(max_examples=300, deadline=None)
@given(scalings(), boxes_, loads, times)
def test_properties(s: Scaling, boxes: list[Box], load: Load, now: dt.datetime) -> None:
    d = decide(s, boxes, load, now)
    live = [b for b in boxes if b.status in LIVE and not b.stopping]
    assert d.live == len(live) and 0 <= d.desired <= s.max_containers
    assert not (d.start and d.stop)
    after = len(live) + d.start - len(d.stop)
    assert after <= max(s.max_containers, len(live))  # never starts above max
    assert d.start == max(0, d.desired - len(live))  # level: exactly what is missing
    if d.start:
        assert d.start_reason
    assert after >= min(d.desired, len(live))  # never stops below what is desired
    assert d.desired >= min(s.min_containers, s.max_containers)  # the minimum holds
    by_id = {b.container_id: b for b in live}
    for stop in d.stop:  # only idle ready ones, only with the load known
        b = by_id[stop.container_id]
        assert load.known and b.status == "ready" and b.inflight == 0 and b.idle_since is not None
        assert now.timestamp() - b.idle_since >= s.window or len(live) > s.max_containers
    assert len({x.container_id for x in d.stop}) == len(d.stop)


@settings(max_examples=200, deadline=None)
@given(scalings(), boxes_, loads, times)
def test_applying_a_decision_settles(s: Scaling, boxes: list[Box], load: Load, now: dt.datetime) -> None:
    """Level triggered: once its starts are requested and its stops taken, it asks for nothing more."""
    d = decide(s, boxes, load, now)
    stopped = {x.container_id for x in d.stop}
    after = [b for b in boxes if b.container_id not in stopped] + [Box(f"new-{i}", "requested") for i in range(d.start)]
    again = decide(s, after, load, now)
    assert again.start == 0 and again.stop == ()


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 60), st.integers(0, 5), st.integers(0, 5), st.integers(1, 8), st.integers(1, 12))
def test_the_gateways_fast_path_asks_for_what_the_policy_would(waiting, ready_n, starting, concurrency, high):
    """With every ready container full, the gateway's immediate requests for waiting calls are the
    policy's own starts (no minimum, no buffer), and never pass max_containers."""
    if ready_n + starting > high:
        return
    s = Scaling(max_containers=high, concurrency=concurrency)
    boxes = [ready(f"r{i}", inflight=concurrency) for i in range(ready_n)] + \
        [Box(f"s{i}", "starting") for i in range(starting)]
    fast = starts_for_waiting(waiting, starting, ready_n + starting, concurrency, high)
    assert fast == decide(s, boxes, Load(waiting=waiting, inflight=ready_n * concurrency), NOW).start
    assert ready_n + starting + fast <= high


def test_a_deployed_spec_refuses_bad_scaling_with_the_field_named():
    """What the gateway answers 422 with (decode_spec's InvalidSpec message)."""
    base = {"name": "a", "code": {"module": "m", "handler": "h"}}
    for scaling, field in [({"warm_schedule": {"0 25 * * *": 1}}, "warm_schedule"),
                           ({"warm_schedule_timezone": "Mars/Olympus"}, "warm_schedule_timezone"),
                           ({"min_containers": 2}, "min_containers"),
                           ({"target_concurrency": 2}, "target_concurrency"),
                           ({"buffer_containers": 2}, "buffer_containers"),
                           ({"max_containers": 2, "warm_schedule": {"0 8 * * *": 3}}, "warm_schedule")]:
        with pytest.raises(InvalidSpec, match=field):
            decode_spec(json.dumps({**base, "scaling": scaling}))


def test_governed_deployments_include_deployed_functions_not_ad_hoc_sandboxes():
    from levers9.contracts.autoscaling import governed
    from levers9.contracts.spec import Code, DeploymentSpec
    from levers9.contracts.task_spec import TaskQueueOptions

    def spec(kind: str, module: str = "m", handler: str = "h", **kw) -> DeploymentSpec:
        return DeploymentSpec(name="x", code=Code(kind=kind, module=module, handler=handler), **kw)  # type: ignore[arg-type]

    assert governed(spec("endpoint")) and governed(spec("asgi"))
    assert governed(spec("function"))  # `levers9 deploy`: min_containers, buffer and scale-down apply
    assert not governed(spec("function", module="", handler=""))  # an ad-hoc sandbox: the worker's keep-warm
    assert governed(spec("function", module="", handler="", task_queue=TaskQueueOptions()))
    assert not governed(None)
