"""The scheduler process: consume -> fold into memory -> decide (plan) -> append; project beside it.

It decides from memory (state.py): workers' capacity and the containers waiting to be placed,
loaded from its projection at start (recovery.py) and kept current from every batch its consumers
deliver, before the projection commits that batch. The projection stays the durable state it
recovers from; it no longer sits between an event and the decision.
1. a batch arrives: fold it into memory and wake the placer, then let the projection commit it
   (the placer's appends go out while the projection writes);
2. the placer decides the backlog oldest first (plan.py) and appends: reservations expect the
   worker's last sequence, ContainerScheduled the container's (placer.py), so two schedulers never
   overbook a worker nor schedule a container twice;
3. nothing fits: PlacementDeferred once, with the reason (the pool controller reads the backlog);
4. slots of containers that stopped, failed or moved on are released; containers of lost workers
   are requested again elsewhere, from the request they were last asked with.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Iterable

from levers9.runtime.config import Settings
from levers9.runtime.consumer import Delivery, WorkConsumer
from levers9.runtime.projection import Projection
from levers9.runtime.service import Service
from levers9.runtime.views import ContainersView, WorkersView
from levers9.runtime.views_clusters import ClustersView

from . import catalogues
from .autoscaler import Autoscaler
from .memory import Memory, Touched
from .placer import Placer
from .recovery import awaiting_fence, load
from .schedules import Schedules
from .state import (
    Container,
    Release,
    abandoned,
    asked_again,
    forget_finished,
    holding_a_slot,
    lost_containers,
    re_request,
    releases,
)

log = logging.getLogger("levers9.scheduler")

FETCH_BATCH = 1024  # at least this many events per batch (LEVERS9_FETCH_BATCH may ask for more)
SWEEP_EVERY_S = 2.0  # the safety net: every release and re-request is also decided on events
ABANDONED_S = 10.0  # a waiting container that holds a slot this long lost its placement midway


class SchedulerService(Service):
    name = "scheduler"
    projections = (ContainersView(), WorkersView(), ClustersView())  # clusters: who may use their workers

    def __init__(self, settings: Settings) -> None:
        # a backlog arrives in bursts: bigger batches are fewer pulls and projection transactions
        super().__init__(settings.with_(fetch_batch=max(settings.consumers.fetch_batch, FETCH_BATCH)))
        self.memory = Memory()
        self._placer: Placer | None = None
        self.autoscaler: Autoscaler | None = None

    @property
    def placer(self) -> Placer:
        if self._placer is None:
            raise RuntimeError("the scheduler has not started")
        return self._placer

    async def on_start(self) -> None:
        state, positions = await load(self.pool, self.schema)
        state = await awaiting_fence(self.bus, state)  # lost workers whose containers wait for their fence
        self.memory = Memory(state, {p.name: positions.get(p.name, 0) for p in self.projections})
        self._placer = Placer(self.memory, self.bus.append, self.bus.publish)
        self.placer.catalogues.update(await catalogues.newest(self.settings))
        self.placer.wake.set()
        self.autoscaler = Autoscaler(self.bus, self.memory, self.placer.wake.set)
        log.info("scheduler memory: %d workers, %d containers, %d waiting", len(self.memory.workers),
                 len(self.memory.containers), len(self.memory.waiting))

    async def apply(self, p: Projection, batch: list[Delivery]) -> None:
        self.take(p.name, batch)  # decide now; the projection commits meanwhile
        await super().apply(p, batch)

    def take(self, consumer: str, batch: list[Delivery]) -> None:
        """Fold a delivered batch into memory and start what it calls for."""
        self.react(self.memory.observe(consumer, batch))

    def react(self, touched: Touched) -> None:
        if touched.waiting or touched.room or self.placer.stale_workers.known or self.placer.stale_containers.known:
            self.placer.wake.set()
        if touched.containers:
            self._release(releases(self.memory.workers, self.memory.containers, touched.containers,
                                   self.memory.holders))
            self._requeue([self.memory.containers[k] for k in touched.containers if k in self.memory.containers])
        if any(self.memory.workers[w].state.status == "lost" for w in touched.workers if w in self.memory.workers):
            self._requeue(list(self.memory.containers.values()))

    def _release(self, todo: list[Release]) -> None:
        for r in todo:
            self.placer.spawn(self.placer.release(r.worker_id, r.slot, r.reason, r.correlation_id),
                              f"release {r.slot.container_id}")

    def _requeue(self, candidates: Iterable[Container]) -> None:
        for c in lost_containers(self.memory.workers, candidates):
            self.placer.request_again(c, re_request(c))

    def background(self) -> list[Callable[[asyncio.Event], Awaitable[None]]]:
        return [self.placing, self.sweeping, lambda stop: Schedules(self.bus).run(stop), self.autoscaling]

    async def autoscaling(self, stop: asyncio.Event) -> None:
        """The autoscaling policy, applied here alone (autoscaler.py)."""
        assert self.autoscaler is not None
        await self.autoscaler.run(stop)

    def reactions(self) -> list[WorkConsumer]:
        return [catalogues.consumer(self.bus, self.settings, self.placer.catalogues)]

    async def placing(self, stop: asyncio.Event) -> None:
        """One pass whenever memory moved in a way that matters (or the sweep asks)."""
        while not stop.is_set():
            await self.placer.wake.wait()
            self.placer.wake.clear()
            if stop.is_set():
                break
            try:
                self.placer.run_pass()
            except Exception:  # noqa: BLE001 - a failed pass is retried by the next one
                log.exception("scheduling pass failed")
                await asyncio.sleep(0.5)
            await asyncio.sleep(0)  # let the appends of this pass go before the next pass
        await self.placer.drain(timeout=5.0)

    async def sweeping(self, stop: asyncio.Event) -> None:
        """Every few seconds: what the events may not have said (a release whose publish failed,
        a container placed on a worker that was lost meanwhile), and forget what is finished."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=SWEEP_EVERY_S)
            except asyncio.TimeoutError:
                pass
            if stop.is_set():
                break
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - the next sweep tries again; the loop must survive
                log.exception("sweep failed")
        self.placer.wake.set()  # the placing loop sees the stop

    def sweep(self, now: float | None = None) -> None:
        m = self.memory
        self._release(releases(m.workers, m.containers))
        self._requeue(list(m.containers.values()))
        self._ask_again_abandoned(time.monotonic() if now is None else now)
        m.forget(forget_finished(m.containers, m.workers.values()))
        self.placer.forget_released()
        self.placer.forget_settled()
        self.placer.wake.set()

    def _ask_again_abandoned(self, now: float) -> None:
        held = [c for c in holding_a_slot(self.memory.backlog(), self.memory.workers, self.memory.holders)
                if c.key not in self.placer.busy]
        since = self.placer.held_since
        keys = {c.key for c in held}
        for key in [k for k in since if k not in keys]:
            del since[key]
        for c in held:
            since.setdefault(c.key, now)
        for c in abandoned(held, since, now, ABANDONED_S):
            del since[c.key]
            self.placer.request_again(c, asked_again(c, "its placement was abandoned"))

    async def health_detail(self) -> dict[str, Any]:
        c = self.placer.counters if self._placer else None
        return {"placed": c.placed if c else 0, "deferred": c.deferred if c else 0,
                "conflicts": c.conflicts if c else 0, "waiting": len(self.memory.waiting),
                "workers": len(self.memory.workers),
                "autoscaler": dict(self.autoscaler.counters) if self.autoscaler else {}}
