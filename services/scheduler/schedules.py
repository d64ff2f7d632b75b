"""Schedules: fire each scheduled function's cron ticks as tasks, exactly once per tick.

The deployments with a schedule are folded into memory from the deployment events (the whole
history, on every (re)subscription: a fold into a dict is idempotent); the latest version of a name
is the live one. About once a second each schedule is looked at:
1. its last ScheduleFired (the schedule aggregate, `levers9.<ws>.schedule.<name>.*`) says the last
   tick handled; a schedule that never fired counts from its first version's creation;
2. schedule_ticks.due (pure) says which tick to fire now, folding ticks missed while the platform
   was down into one run (or skipping them, catch_up=False);
3. the ScheduleFired is appended with the aggregate's expected last sequence: of two replicas of
   the scheduler only one can append it, the other gets a conflict and moves on;
4. the tick's TaskEnqueued follows, its task id derived from (workspace, name, tick) and appended
   expecting an empty task aggregate: a crash between 3 and 4 is repaired by the next look (the last
   tick's task is enqueued when missing), and never enqueues it twice.
The run is then a task like any other (the gateway's task runner), with its outcome and its output.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Callable

import nats.js.errors

from levers9.contracts import Message, decode, envelope, subjects
from levers9.contracts import events as E
from levers9.contracts.schedule_ticks import due
from levers9.contracts.spec import DeploymentSpec
from levers9.contracts.task_spec import TaskQueueOptions
from levers9.runtime.bus import Bus, ConcurrencyConflict
from levers9.runtime.consumer import Delivery, OrderedConsumer

log = logging.getLogger("levers9.scheduler.schedules")

LOOK_EVERY_S = 1.0
TICK_NAMESPACE = uuid.UUID("5b0e1c8e-2f7a-4d8e-9c1a-6f1d2e3a4b5c")


@dataclass(frozen=True)
class Scheduled:
    workspace: str
    name: str
    deployment_id: str
    version: int
    spec: DeploymentSpec
    first_created: dt.datetime  # the name's first version: ticks count from here


def tick_task_id(workspace: str, name: str, tick: dt.datetime) -> str:
    """The one task id a tick may ever run as: the same in every replica and every retry."""
    return str(uuid.uuid5(TICK_NAMESPACE, f"{workspace}/{name}/{tick.isoformat()}"))


def fold(live: dict[tuple[str, str], Scheduled], msg: Message, created: dict[tuple[str, str], dt.datetime]) -> None:
    """One deployment event onto the live schedules (pure but for the dicts it updates)."""
    ev, ws = msg.event, msg.envelope.workspace
    if isinstance(ev, E.DeploymentCreated):
        key = (ws, ev.name)
        at = dt.datetime.fromisoformat(msg.envelope.occurred_at.replace("Z", "+00:00"))
        first = created.setdefault(key, at)
        current = live.get(key)
        if current is not None and current.version > ev.version:
            return
        if ev.spec.schedule is None:
            live.pop(key, None)
        else:
            live[key] = Scheduled(ws, ev.name, ev.deployment_id, ev.version, ev.spec, first)
    elif isinstance(ev, (E.DeploymentStopped, E.DeploymentDeleted)):
        for key, s in list(live.items()):
            if s.workspace == ws and s.deployment_id == ev.deployment_id:
                del live[key]


class Schedules:
    def __init__(self, bus: Bus, clock: Callable[[], float] = time.time) -> None:
        self.bus = bus
        self.clock = clock
        self.live: dict[tuple[str, str], Scheduled] = {}
        self.created: dict[tuple[str, str], dt.datetime] = {}
        self.enqueued: set[str] = set()  # tick tasks known to be in the log
        self.read_to = 0  # the last sequence folded

    async def position(self) -> int:
        """0 at start; a resubscribe (idle, reconnect) reads on from what was folded: from 1 again,
        a deleted deployment's schedule would be live, and looked at, until the replay passed it."""
        return self.read_to

    async def run(self, stop: asyncio.Event) -> None:
        consumer = OrderedConsumer(self.bus, "scheduler-schedules", [subjects.filter_subject(aggregate="deployment")],
                                   position=self.position, handle=self.apply)
        reader = asyncio.create_task(consumer.run(stop))
        try:
            while not stop.is_set():
                for s in list(self.live.values()):
                    try:
                        await self.look(s)
                    except Exception:  # noqa: BLE001 - one schedule's trouble must not stop the others
                        log.exception("schedule %s/%s", s.workspace, s.name)
                try:
                    await asyncio.wait_for(stop.wait(), LOOK_EVERY_S)
                except asyncio.TimeoutError:
                    pass
        finally:
            await reader

    async def apply(self, batch: list[Delivery]) -> None:
        for d in batch:
            if d.message is not None:
                fold(self.live, d.message, self.created)
        if batch:
            self.read_to = max(self.read_to, batch[-1].seq)

    async def look(self, s: Scheduled) -> None:
        assert s.spec.schedule is not None
        last = await self.last_fired(s)
        seq, fired = last if last is not None else (0, None)
        if fired is not None and fired.task_id and fired.task_id not in self.enqueued:
            await self.enqueue(s, fired.task_id, fired.tick)  # a crash may have left it out
        after = dt.datetime.fromisoformat(fired.tick) if fired is not None else s.first_created
        now = dt.datetime.fromtimestamp(self.clock(), dt.timezone.utc)
        sch = s.spec.schedule
        d = due(sch.cron, sch.timezone, after, now, sch.catch_up)
        if d.passed is None:
            return
        task_id = tick_task_id(s.workspace, s.name, d.passed) if d.tick is not None else ""
        event = E.ScheduleFired(schedule_id=s.name, deployment_id=s.deployment_id, tick=d.passed.isoformat(),
                                task_id=task_id, skipped=d.skipped)
        try:
            await self.bus.append(envelope(event, workspace=s.workspace), seq)
        except ConcurrencyConflict:
            return  # another replica fired it
        log.info("schedule %s/%s fired tick %s (task %s, %d skipped)", s.workspace, s.name, event.tick,
                 task_id or "none", d.skipped)
        if task_id:
            await self.enqueue(s, task_id, event.tick)

    async def last_fired(self, s: Scheduled) -> tuple[int, E.ScheduleFired] | None:
        try:
            raw = await self.bus.js.get_last_msg(subjects.STREAM, subjects.aggregate_subject(s.workspace, "schedule",
                                                                                             s.name))
        except nats.js.errors.NotFoundError:
            return None
        event = decode(raw.data or b"", raw.subject).event
        return (raw.seq or 0, event) if isinstance(event, E.ScheduleFired) else None

    async def enqueue(self, s: Scheduled, task_id: str, tick: str) -> None:
        options = s.spec.task_queue or TaskQueueOptions()
        event = E.TaskEnqueued(
            task_id=task_id, deployment_id=s.deployment_id, queue=s.name, function=f"{s.spec.app_name}.{s.name}",
            enqueued_at=self.clock(), ttl_seconds=options.ttl, retries=options.retries,
            retry_backoff=options.retry_backoff, timeout_seconds=float(s.spec.timeout_seconds),
            callback_url=options.callback_url, schedule_id=s.name, tick=tick)
        try:
            await self.bus.append(envelope(event, workspace=s.workspace, id=task_id), 0)
        except ConcurrencyConflict:
            pass  # enqueued already
        self.enqueued.add(task_id)
