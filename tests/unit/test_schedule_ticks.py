"""When a schedule fires (levers9.contracts.schedule_ticks), with a clock the test controls: the next
ticks, missed ticks folded into one run (or skipped), and a scheduler that looks at random moments
firing each tick at most once and never missing one while it runs; the spec refuses bad cron
expressions and time zones naming the field."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.contracts.schedule_ticks import GRACE, due, next_ticks
from levers9.contracts.spec import InvalidSpec, decode_spec

UTC = dt.timezone.utc
START = dt.datetime(2026, 3, 27, 23, 0, 17, tzinfo=UTC)  # Berlin moves to summer time on the 29th


@given(st.sampled_from(["* * * * *", "*/5 * * * *", "30 2 * * *", "0 8 * * 1-5"]),
       st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"]),
       st.integers(0, 10 * 86_400))
def test_next_ticks_are_after_the_moment_in_order_and_in_utc(cron, tz, offset):
    after = START + dt.timedelta(seconds=offset)
    ticks = next_ticks(cron, tz, after, 3)
    assert len(ticks) == 3 and ticks == sorted(set(ticks))
    assert all(t > after and t.tzinfo == UTC for t in ticks)


def test_a_berlin_schedule_keeps_wall_clock_time_across_daylight_saving():
    ticks = next_ticks("0 8 * * *", "Europe/Berlin", START, 2)
    assert [t.hour for t in ticks] == [7, 6]  # 08:00 CET is 07:00 UTC, 08:00 CEST is 06:00 UTC


@given(st.integers(0, 600), st.integers(1, 59))
def test_missed_minutes_run_once_at_the_latest_tick_with_catch_up(missed, second):
    after = dt.datetime(2026, 1, 1, 12, 0, tzinfo=UTC)  # the last tick handled
    now = after + dt.timedelta(minutes=missed, seconds=second)
    d = due("* * * * *", "UTC", after, now)
    if missed == 0:
        assert d.tick is None and d.passed is None
    else:
        assert d.tick == after + dt.timedelta(minutes=missed) and d.skipped == missed - 1


@given(st.integers(1, 600), st.integers(0, 59))
def test_without_catch_up_a_late_tick_is_skipped_and_an_on_time_one_runs(missed, second):
    after = dt.datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    now = after + dt.timedelta(minutes=missed, seconds=second)
    d = due("* * * * *", "UTC", after, now, catch_up=False)
    latest = after + dt.timedelta(minutes=missed)
    assert d.passed == latest  # handled either way: the next look waits for the next tick
    if now - latest <= GRACE:
        assert d.tick == latest and d.skipped == missed - 1
    else:
        assert d.tick is None and d.skipped == missed


@given(st.lists(st.integers(1, 400), min_size=1, max_size=40), st.booleans(),
       st.sampled_from(["* * * * *", "*/5 * * * *", "*/2 9-17 * * *"]))
def test_a_scheduler_looking_at_random_moments_fires_each_tick_at_most_once(steps, catch_up, cron):
    """The scheduler's loop with a clock the test moves: handled ticks only move forward, none fires
    twice, and with catch_up every gap ends with a run of its latest tick."""
    created = dt.datetime(2026, 1, 1, 8, 59, 30, tzinfo=UTC)
    last, fired, now = created, [], created
    for step in steps:
        now += dt.timedelta(seconds=step)
        d = due(cron, "UTC", last, now, catch_up)
        if d.passed is None:
            continue
        assert d.passed > last and d.passed <= now
        if d.tick is not None:
            fired.append(d.tick)
        elif catch_up:
            raise AssertionError("with catch_up a passed tick always runs")
        last = d.passed
    assert len(fired) == len(set(fired)) and fired == sorted(fired)
    if catch_up and fired:
        assert fired[-1] == last  # the latest tick handled is the one that ran


@pytest.mark.parametrize(("schedule", "field"), [
    ({"cron": "61 * * * *"}, "cron"), ({"cron": "* * *"}, "cron"), ({"cron": "@never"}, "cron"),
    ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "timezone"),
    ({"cron": "* * * * *", "timezone": "../../etc/passwd"}, "timezone"),
])
def test_a_bad_cron_or_time_zone_is_refused_naming_the_field(schedule, field):
    spec = {"name": "s", "code": {"kind": "function", "module": "m", "handler": "f"}, "schedule": schedule}
    with pytest.raises(InvalidSpec) as refused:
        decode_spec(json.dumps(spec))
    assert field in str(refused.value) and "$.schedule" in str(refused.value)


def test_schedules_and_task_queues_are_options_of_deployed_functions_only():
    spec = {"name": "s", "code": {"kind": "endpoint", "module": "m", "handler": "f"}, "task_queue": {}}
    with pytest.raises(InvalidSpec, match="deployed function"):
        decode_spec(json.dumps(spec))
    with pytest.raises(InvalidSpec, match="callback_url"):
        decode_spec(json.dumps({**spec, "code": {"kind": "function", "module": "m", "handler": "f"},
                                "task_queue": {"callback_url": "file:///etc/passwd"}}))
