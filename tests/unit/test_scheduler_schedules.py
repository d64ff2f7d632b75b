"""The scheduler's view of which deployments run on a schedule (levers9.scheduler.schedules.fold): the
latest version of a name is the live one, a version without a schedule or a stop ends it, and ticks
count from the name's first version (a redeploy never restarts the count)."""

from __future__ import annotations

import datetime as dt

from levers9.contracts import decode, encode, envelope
from levers9.contracts import events as E
from levers9.contracts.spec import Code, DeploymentSpec
from levers9.contracts.task_spec import ScheduleOptions
from levers9.scheduler.schedules import fold, tick_task_id


def created(version: int, cron: str | None, ws: str = "acme") -> object:
    spec = DeploymentSpec(name="nightly", code=Code(kind="function", module="m", handler="f"),
                          schedule=ScheduleOptions(cron=cron) if cron else None)
    env = envelope(E.DeploymentCreated(deployment_id=f"nightly-v{version}", name="nightly", version=version,
                                       spec=spec), workspace=ws)
    return decode(encode(env))


def stopped(version: int) -> object:
    return decode(encode(envelope(E.DeploymentStopped(deployment_id=f"nightly-v{version}"), workspace="acme")))


def test_the_latest_version_with_a_schedule_is_live_and_keeps_the_first_creation_time():
    live: dict = {}
    first: dict = {}
    fold(live, created(1, "0 * * * *"), first)
    started = live[("acme", "nightly")].first_created
    fold(live, created(2, "*/5 * * * *"), first)
    s = live[("acme", "nightly")]
    assert s.deployment_id == "nightly-v2" and s.spec.schedule.cron == "*/5 * * * *"
    assert s.first_created == started
    fold(live, created(1, "0 * * * *"), first)  # a replayed older version changes nothing
    assert live[("acme", "nightly")].deployment_id == "nightly-v2"


def test_a_version_without_a_schedule_or_a_stop_ends_it_and_an_old_version_s_stop_does_not():
    live: dict = {}
    first: dict = {}
    fold(live, created(1, "0 * * * *"), first)
    fold(live, created(2, "0 * * * *"), first)
    fold(live, stopped(1), first)
    assert ("acme", "nightly") in live
    fold(live, stopped(2), first)
    assert not live
    fold(live, created(3, "0 * * * *"), first)
    fold(live, created(4, None), first)
    assert not live


def test_a_tick_s_task_id_is_the_same_everywhere_and_differs_per_tick_and_workspace():
    tick = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
    a = tick_task_id("acme", "nightly", tick)
    assert a == tick_task_id("acme", "nightly", tick)
    assert a != tick_task_id("acme", "nightly", tick + dt.timedelta(minutes=1))
    assert a != tick_task_id("other", "nightly", tick)


def test_a_resubscribe_reads_on_from_what_was_folded():
    """From 1 again (every 30 s idle), a stopped deployment's schedule was live until the replay passed its stop."""
    import asyncio

    from levers9.runtime.consumer import Delivery
    from levers9.scheduler.schedules import Schedules

    s = Schedules(bus=None)  # type: ignore[arg-type]
    assert asyncio.run(s.position()) == 0
    msgs = [created(1, "0 * * * *"), stopped(1)]
    asyncio.run(s.apply([Delivery(seq, "x", b"", {}, 1, m) for seq, m in ((7, msgs[0]), (9, msgs[1]))]))
    assert asyncio.run(s.position()) == 9 and s.live == {}
