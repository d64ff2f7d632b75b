"""Schedules against a real NATS JetStream: two replicas of the scheduler's ticker, one clock the test
moves, fire each tick exactly once (the ScheduleFired appended with the schedule's expected sequence,
the tick's task id derived from the tick); a gap while "the platform was down" runs once; a tick whose
TaskEnqueued was lost to a crash is enqueued by the next look, once.

Only a nats-server of its own (started in ~3 ms), no stack."""

from __future__ import annotations

import asyncio
import datetime as dt
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from levers9.contracts import decode, envelope, subjects
from levers9.contracts import events as E
from levers9.contracts.spec import Code, DeploymentSpec
from levers9.contracts.task_spec import ScheduleOptions
from levers9.runtime.bus import Bus
from levers9.runtime.ports import free_port
from levers9.runtime.reader import read
from levers9.scheduler.schedules import Scheduled, Schedules, tick_task_id

CREATED = dt.datetime(2026, 1, 1, 12, 0, 30, tzinfo=dt.timezone.utc)


def _nats_binary() -> str:
    here = Path(sys.executable).parent / "nats-server"
    return str(here) if here.exists() else str(shutil.which("nats-server"))


@pytest.fixture
async def bus(tmp_path):
    port = free_port()
    server = subprocess.Popen([_nats_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(tmp_path / "js")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                b = await Bus.connect(f"nats://127.0.0.1:{port}")
                break
            except Exception:  # noqa: BLE001 - not listening yet
                await asyncio.sleep(0.05)
        await b.ensure_topology()
        yield b
        await b.close()
    finally:
        server.kill()
        server.wait()


class Clock:
    def __init__(self, at: dt.datetime) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at.timestamp()


def scheduled(cron: str = "* * * * *", catch_up: bool = True) -> Scheduled:
    spec = DeploymentSpec(name="nightly", app_name="jobs", code=Code(kind="function", module="jobs", handler="nightly"),
                          schedule=ScheduleOptions(cron=cron, catch_up=catch_up))
    return Scheduled("acme", "nightly", "nightly-v1", 1, spec, CREATED)


async def log_of(bus: Bus, aggregate: str) -> list[E.Event]:
    out = []
    async for msgs in read(bus, [subjects.filter_subject("acme", aggregate)]):
        out.extend(decode(m.data, m.subject).event for m in msgs)
    return out


async def test_two_replicas_fire_each_tick_once_and_a_gap_runs_once(bus):
    clock = Clock(CREATED)
    replicas = [Schedules(bus, clock), Schedules(bus, clock)]
    s = scheduled()
    for minute in [*range(1, 6), 15, 16]:  # minutes 6..14: the platform was down
        clock.at = CREATED.replace(second=0) + dt.timedelta(minutes=minute, seconds=5)
        for _ in range(3):  # each replica looks several times within the minute, at once
            await asyncio.gather(*(r.look(s) for r in replicas))
    fired = [e for e in await log_of(bus, "schedule") if isinstance(e, E.ScheduleFired)]
    ticks = [e.tick for e in fired]
    assert len(ticks) == len(set(ticks)) == 7, ticks
    assert [e.skipped for e in fired] == [0, 0, 0, 0, 0, 9, 0]  # minutes 6..14 folded into the run of 15
    enqueued = [e for e in await log_of(bus, "task") if isinstance(e, E.TaskEnqueued)]
    assert Counter(e.tick for e in enqueued) == Counter(ticks)
    assert {e.task_id for e in enqueued} == {tick_task_id("acme", "nightly", dt.datetime.fromisoformat(t))
                                             for t in ticks}


async def test_without_catch_up_the_missed_ticks_are_skipped(bus):
    clock = Clock(CREATED.replace(second=0) + dt.timedelta(minutes=12, seconds=30))  # 12:05 and 12:10 missed
    await Schedules(bus, clock).look(scheduled("*/5 * * * *", catch_up=False))
    [fired] = [e for e in await log_of(bus, "schedule") if isinstance(e, E.ScheduleFired)]
    assert fired.task_id == "" and fired.skipped == 2 and fired.tick.startswith("2026-01-01T12:10")
    assert not [e for e in await log_of(bus, "task") if isinstance(e, E.TaskEnqueued)]


async def test_a_tick_whose_task_was_lost_to_a_crash_is_enqueued_by_the_next_look(bus):
    """A replica appended the ScheduleFired and died before its TaskEnqueued: the next look repairs it."""
    clock = Clock(CREATED.replace(second=0) + dt.timedelta(minutes=1, seconds=2))
    tick = CREATED.replace(second=0) + dt.timedelta(minutes=1)
    task_id = tick_task_id("acme", "nightly", tick)
    await bus.append(envelope(E.ScheduleFired(schedule_id="nightly", deployment_id="nightly-v1", tick=tick.isoformat(),
                                              task_id=task_id), workspace="acme"), 0)
    await asyncio.gather(Schedules(bus, clock).look(scheduled()), Schedules(bus, clock).look(scheduled()))
    enqueued = [e for e in await log_of(bus, "task") if isinstance(e, E.TaskEnqueued)]
    assert [e.task_id for e in enqueued] == [task_id]
