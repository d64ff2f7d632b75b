"""The one place the autoscaling policy is applied: level triggered, every second and whenever a
deployment's scaling changes, for every deployment it governs (endpoints, ASGI apps, task queues,
scheduled and deployed functions: levers9.contracts.autoscaling.governed). A function session's
sandbox (its request names a session_id) carries its deployment's id but is one caller's own: it
is neither counted as the deployment's container nor stopped here (the gateway's session sweep
stops it, the worker's keep-warm as the backstop).

A pass, per deployment:
1. its containers from the scheduler's memory (their status), when each became ready (Fleet), what
   the gateways report of its calls (waiting, in flight per container, last used) and its task
   queue's waiting tasks (folded from the task events);
2. `levers9.contracts.autoscaling.decide` says how many to start and which idle ones to stop (no
   start while the deployment's crash back-off holds: its containers failed before they were ready);
3. each start is a ContainerRequested whose reason starts with "autoscaler: ", appended expecting
   no event yet on a container id derived from the count of the autoscaler's earlier requests of
   that deployment (`autoscaled_id`): two replicas that decide the same start collide on the same
   id and only one append lands; the restore choice is the checkpoint policy's, as the gateway's;
4. each stop is a ContainerStopRequested with the reason, appended expecting the container's last
   sequence (a container that moved on meanwhile is decided on again next pass); the worker obeys it.
Our appends are folded into memory as soon as they are acknowledged (as the placer's), so the next
pass counts them. Nothing is decided before the replay of the log has caught up with where it was at
start: a deployment deleted later in the log must not be scaled up from its creation.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from typing import Any, Callable

from levers9.contracts import Message, envelope, subjects
from levers9.contracts import events as E
from levers9.contracts.autoscaling import Box, decide
from levers9.contracts.checkpoint_policy import idle_checkpoint, restore_choice
from levers9.contracts.container_request import container_request
from levers9.contracts.envelope import subject_of
from levers9.runtime.bus import Bus, ConcurrencyConflict
from levers9.runtime.consumer import Delivery, OrderedConsumer
from levers9.runtime.nats_auth import LOAD_SUBJECT
from levers9.runtime.views import ENDED

from .autoscale_state import REASON_PREFIX, Fleet, Governed, Key, autoscaled_id, scaled_spec
from .memory import Memory
from .state import Container

log = logging.getLogger("levers9.scheduler.autoscaler")

EVERY_S = 1.0
CONTAINER_TYPES = ("ContainerRequested", "ContainerReady", "ContainerStopped", "ContainerFailed")
FILTERS = [subjects.filter_subject(aggregate="deployment"), subjects.filter_subject(aggregate="checkpoint"),
           subjects.filter_subject(aggregate="task"),
           *(subjects.filter_subject(aggregate="container", event_type=t) for t in CONTAINER_TYPES)]


class Autoscaler:
    def __init__(self, bus: Bus, memory: Memory, wake_placer: Callable[[], None],
                 clock: Callable[[], float] = time.time) -> None:
        self.bus = bus
        self.memory = memory
        self.wake_placer = wake_placer
        self.clock = clock
        self.fleet = Fleet()
        self.wake = asyncio.Event()
        self.read_to = 0  # the last sequence the replay delivered
        self.caught_up_at = -1  # the sequence the replay must reach before any decision (-1: not known yet)
        self.started_at = clock()
        self.next_index: dict[Key, int] = {}
        self.desired: dict[Key, int] = {}
        self.holding: set[Key] = set()  # deployments whose starts wait for the crash back-off (logged once)
        self.counters = {"started": 0, "stopped": 0, "conflicts": 0}

    async def position(self) -> int:
        """Where the replay reads on from: 0 at start; a resubscribe (every 30 s idle, or after a
        reconnect) goes on from what was folded. From 1 again, a pass during the second replay would
        see deleted deployments alive again, their requests not yet counted."""
        return self.read_to

    async def run(self, stop: asyncio.Event) -> None:
        consumer = OrderedConsumer(self.bus, "scheduler-autoscaler", FILTERS, position=self.position,
                                   handle=self.apply)
        self.caught_up_at = max([await self.bus.last_seq(f) for f in FILTERS])
        sub = await self.bus.nc.subscribe(f"{LOAD_SUBJECT}.>", cb=self.on_sample)
        reader = asyncio.create_task(consumer.run(stop))
        try:
            while not stop.is_set():
                if self.read_to >= self.caught_up_at:
                    try:
                        await self.run_pass()
                    except Exception:  # noqa: BLE001 - the next pass decides again
                        log.exception("autoscaling pass failed")
                try:
                    await asyncio.wait_for(self.wake.wait(), EVERY_S)
                except asyncio.TimeoutError:
                    pass
                self.wake.clear()
        finally:
            await sub.unsubscribe()
            await reader

    async def apply(self, batch: list[Delivery]) -> None:
        for d in batch:
            if d.message is not None:
                self.fleet.fold(d.message)
                if isinstance(d.message.event, E.DeploymentScaled):
                    self.wake.set()  # applied within the second
        if batch:
            self.read_to = max(self.read_to, batch[-1].seq)

    async def on_sample(self, msg: Any) -> None:
        try:
            sample = json.loads(msg.data)
            self.fleet.sampled(str(sample["gateway"]), sample, self.clock())
        except (ValueError, KeyError, TypeError):
            log.warning("a load sample that does not parse on %s", msg.subject)

    # ---- a pass ------------------------------------------------------------------------------------

    async def run_pass(self) -> None:
        now = self.clock()
        samples = self.fleet.fresh(now)
        lag = max(0.0, now - self.fleet.confirmed_at(now))  # how old the oldest gateway's word is
        by_deployment: dict[Key, list[Container]] = {}
        for c in self.memory.containers.values():
            if c.request is not None and c.request.deployment_id and not c.request.session_id:
                by_deployment.setdefault((c.workspace, c.request.deployment_id), []).append(c)
        live = self.fleet.live_by_deployment()
        for key, dep in list(self.fleet.deployments.items()):
            if not dep.active:  # the gateway stopped what it knew; a start that crossed its stop goes too
                self.desired.pop(key, None)
                for c in by_deployment.get(key, []):
                    if c.status == "ready":
                        await self.stop(c, "its deployment was stopped")
                continue
            if any(c.status in ENDED and c.last_seq > self.read_to for c in by_deployment.get(key, [])):
                continue  # the placer's memory saw a container end that the replay has not folded yet
            if any(k not in self.memory.containers for k in live.get(key, ())):
                # the replay saw a start the placer's memory has not: it would count one container
                # fewer while the next id's index is already past it (CI: a third of a minimum of two)
                continue
            load, per = self.fleet.load_of(samples, dep)
            boxes = [self.box(c, per, lag) for c in by_deployment.get(key, [])]
            d = decide(dep.policy, boxes, load, dt.datetime.fromtimestamp(now, dt.timezone.utc), dep.held_until)
            self.desired[key] = d.desired
            if not d.held_s:
                self.holding.discard(key)
            if d.held_s and key not in self.holding:
                self.holding.add(key)
                log.info("autoscaler: %s/%s holds %d start(s) %.0f s more: %d failed before ready in a row",
                         dep.workspace, dep.name, d.desired - d.live, d.held_s, dep.failures)
            for _ in range(d.start):
                if not await self.start(dep, d.start_reason):
                    break
            for s in d.stop:
                await self.stop(self.memory.containers[(dep.workspace, s.container_id)], s.reason,
                                checkpoint_first=idle_checkpoint(dep.spec))

    def box(self, c: Container, per: dict[str, tuple[int, float]], lag: float = 0.0) -> Box:
        """The policy's view of a container. Its idle time counts only up to the gateways' latest
        word (`lag` seconds ago): with a 2 s window, a sample a second old made a container called
        every half second look idle for 2 s (CI: a manual checkpoint found it stopped)."""
        inflight, used = per.get(c.container_id, (0, 0.0))
        idle_since = None
        if c.status == "ready":  # before the replay saw it ready: since we started (never too early)
            idle_since = max(self.fleet.ready_at.get(c.key, self.started_at), used) + lag
        return Box(c.container_id, c.status, inflight, idle_since)

    async def start(self, dep: Governed, reason: str) -> bool:
        key = (dep.workspace, dep.deployment_id)
        n = max(dep.requested, self.next_index.get(key, 0))
        spec = scaled_spec(dep)
        ev = container_request(spec, dep.deployment_id, dep.version, restore_choice(spec, dep.checkpoints),
                               autoscaled_id(dep.workspace, dep.deployment_id, n), REASON_PREFIX + reason)
        env = envelope(ev, workspace=dep.workspace)
        if not await self._append(env, ev, 0):
            self.next_index[key] = n + 1  # another replica took this one: the next pass reads on
            return False
        self.next_index[key] = n + 1
        self.counters["started"] += 1
        self.wake_placer()
        log.info("autoscaler: %s/%s starts %s: %s", dep.workspace, dep.name, ev.container_id, reason)
        return True

    async def stop(self, c: Container, reason: str, checkpoint_first: bool = False) -> None:
        ev = E.ContainerStopRequested(container_id=c.container_id, reason=REASON_PREFIX + reason,
                                      checkpoint_first=checkpoint_first)
        env = envelope(ev, workspace=c.workspace, correlation_id=c.correlation_id or None)
        if await self._append(env, ev, c.last_seq):
            self.counters["stopped"] += 1
            log.info("autoscaler: stops %s/%s: %s", c.workspace, c.container_id, reason)

    async def _append(self, env: Any, ev: E.Event, expected: int) -> bool:
        self.memory.own.add(env.id)
        try:
            ack = await self.bus.append(env, expected)
        except ConcurrencyConflict:
            self.memory.own.discard(env.id)
            self.counters["conflicts"] += 1
            return False
        except BaseException:
            self.memory.own.discard(env.id)
            raise
        self.memory.apply(Message(env, ev, subject_of(env, ev)), ack.seq)
        return True
