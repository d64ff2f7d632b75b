"""The scheduler process: consume -> load projection -> decide (placement.place) -> append.

The backlog is the projection itself: containers `requested` or `pending` (deferred). A scheduling
pass runs whenever a batch of container or worker events was applied (capacity may have appeared)
and every few seconds. For each waiting container, oldest first:
1. place it (pure);
2. reserve the slot on the worker's subject, expecting the worker's last sequence we know: a second
   scheduler that decided on the same state gets a conflict instead of overbooking;
3. append ContainerScheduled on the container's subject, expecting its last sequence (so a container
   is scheduled once); if that loses, release the slot;
4. nothing fits: PlacementDeferred once, with the reason (the pool controller reads the backlog).
It also releases the slots of stopped or failed containers and re-requests the containers of lost
workers elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import replace

from levers9.contracts import envelope
from levers9.contracts import events as E
from levers9.runtime.bus import ConcurrencyConflict
from levers9.runtime.consumer import Delivery
from levers9.runtime.projection import Projection
from levers9.runtime.service import Service
from levers9.runtime.views import ContainersView, WorkersView

from .placement import Request, WorkerState, place, reserve

log = logging.getLogger("levers9.scheduler")

PASS_EVERY_S = 2.0
RELEASE_NS = uuid.UUID("5b0c3e52-4f7e-4d7c-9a57-0f3f0c0a9e11")


def worker_state(row) -> WorkerState:
    return WorkerState(worker_id=row["worker_id"], pool=row["pool"], status=row["status"],
                       cpu_millicores=row["cpu_millicores"], memory_mib=row["memory_mib"], gpu_type=row["gpu_type"],
                       gpu_count=row["gpu_count"], cpu_used=row["cpu_used"], memory_used=row["memory_used"],
                       gpu_used=row["gpu_used"], features=frozenset(row["features"]), cordoned=row["cordoned"],
                       last_seq=row["last_seq"])


def request_of(row) -> Request:
    gpu = tuple(row["gpu"])
    return Request(container_id=row["container_id"], cpu_millicores=row["cpu_millicores"],
                   memory_mib=row["memory_mib"], pool=row["pool"] or "default", gpu=gpu,
                   gpu_count=max(1, row["gpu_count"]) if gpu else row["gpu_count"],
                   excluded=frozenset(row["excluded_workers"]))


class SchedulerService(Service):
    name = "scheduler"
    projections = (ContainersView(), WorkersView())

    def __init__(self, settings) -> None:
        super().__init__(settings)
        self.dirty = asyncio.Event()
        # container -> the sequence of our last decision about it: until the projection has caught
        # up to it, the row is stale and deciding again would only produce a conflict
        self.decided: dict[str, int] = {}
        self.placed = 0
        self.deferred = 0
        self.conflicts = 0

    async def apply(self, p: Projection, batch: list[Delivery]) -> None:
        await super().apply(p, batch)
        self.dirty.set()

    def background(self):
        return [self.scheduling_loop]

    async def scheduling_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(self.dirty.wait(), timeout=PASS_EVERY_S)
            except asyncio.TimeoutError:
                pass
            self.dirty.clear()
            try:
                await self.run_pass()
            except Exception:  # noqa: BLE001 - a failed pass is retried by the next one
                log.exception("scheduling pass failed")
                await asyncio.sleep(0.5)

    async def run_pass(self) -> None:
        await self.requeue_lost()
        await self.release_finished()
        await self.schedule_waiting()

    async def schedule_waiting(self) -> None:
        rows = await self.pool.fetch(
            """SELECT * FROM scheduler.containers WHERE status IN ('requested', 'pending')
               ORDER BY requested_at, container_id LIMIT 500""")
        if not rows:
            return
        workers = {w["worker_id"]: worker_state(w) for w in await self.pool.fetch("SELECT * FROM scheduler.workers")}
        for row in rows:
            if row["last_seq"] < self.decided.get(row["container_id"], 0):
                continue
            self.decided.pop(row["container_id"], None)
            req = request_of(row)
            decision, checkpoint, note = self.decide(row, req, list(workers.values()))
            if decision.worker_id is None:
                if row["status"] == "requested" or row["reason"] != decision.reason:
                    await self.defer(row, decision.reason)
                continue
            w = workers[decision.worker_id]
            try:
                appended = await self.bus.append(envelope(E.WorkerSlotReserved(
                    worker_id=w.worker_id, container_id=req.container_id, workspace=row["workspace"],
                    cpu_millicores=req.cpu_millicores, memory_mib=req.memory_mib, gpu_count=req.gpu_count),
                    workspace="_sys", correlation_id=row["correlation_id"]), w.last_seq)
            except ConcurrencyConflict:
                self.conflicts += 1  # someone else took capacity there: decide again on fresh state
                self.dirty.set()
                return
            workers[w.worker_id] = reserve(w, req, appended.seq)
            try:
                scheduled = await self.bus.append(envelope(E.ContainerScheduled(
                    container_id=req.container_id, worker_id=w.worker_id, attempt=row["attempt"],
                    checkpoint_id=checkpoint, note=note),
                    workspace=row["workspace"], correlation_id=row["correlation_id"]), row["last_seq"])
                self.decided[req.container_id] = scheduled.seq
                self.placed += 1
                log.info("placed %s on %s", req.container_id, w.worker_id)
            except ConcurrencyConflict:  # another scheduler decided first: undo our reservation only
                await self.bus.publish(envelope(E.WorkerSlotReleased(
                    worker_id=w.worker_id, container_id=req.container_id, reason="container moved on",
                    reserved_seq=appended.seq), workspace="_sys", correlation_id=row["correlation_id"]))
                self.dirty.set()

    @staticmethod
    def decide(row, req: Request, workers: list[WorkerState]):
        """A request that carries a checkpoint goes to a worker with CRIU and the checkpoint's
        accelerator; when none can take it, it starts cold elsewhere rather than wait."""
        if row["checkpoint_id"]:
            restorable = replace(req, features=req.features | {"criu"}, accelerator=row["accelerator"])
            decision = place(restorable, workers)
            if decision.worker_id is not None:
                return decision, row["checkpoint_id"], f"restore {row['checkpoint_id']}"
            cold = place(req, workers)
            return cold, "", f"cold: no worker can restore its checkpoint ({decision.reason})"
        return place(req, workers), "", ""

    async def defer(self, row, reason: str) -> None:
        try:
            deferred = await self.bus.append(envelope(E.PlacementDeferred(container_id=row["container_id"],
                                                                          reason=reason),
                                                      workspace=row["workspace"], correlation_id=row["correlation_id"]),
                                             row["last_seq"])
            self.decided[row["container_id"]] = deferred.seq
            self.deferred += 1
        except ConcurrencyConflict:
            self.dirty.set()

    async def release_finished(self) -> None:
        """Free the capacity of containers that stopped, failed or were re-requested elsewhere."""
        rows = await self.pool.fetch(
            """SELECT s.worker_id, s.container_id, s.reserved_seq, c.correlation_id, c.status, c.last_seq
               FROM scheduler.worker_slots s
               JOIN scheduler.containers c ON c.workspace = s.workspace AND c.container_id = s.container_id
               WHERE c.status IN ('stopped', 'failed')
                  OR (c.last_seq > s.reserved_seq AND (c.worker_id <> s.worker_id
                      OR c.status IN ('requested', 'pending')))""")
        for r in rows:
            # the same decision on the same state gets the same id: the server drops the repeat
            event_id = str(uuid.uuid5(RELEASE_NS, f"{r['worker_id']}:{r['container_id']}:{r['reserved_seq']}"))
            await self.bus.publish(envelope(
                E.WorkerSlotReleased(worker_id=r["worker_id"], container_id=r["container_id"], reason=r["status"],
                                     reserved_seq=r["reserved_seq"]),
                workspace="_sys", correlation_id=r["correlation_id"], id=event_id))

    async def requeue_lost(self) -> None:
        """Containers on a lost worker are requested again, elsewhere."""
        rows = await self.pool.fetch(
            """SELECT c.* FROM scheduler.containers c JOIN scheduler.workers w ON w.worker_id = c.worker_id
               WHERE w.status = 'lost' AND c.status IN ('scheduled', 'starting', 'ready')""")
        for row in rows:
            excluded = sorted(set(row["excluded_workers"]) | {row["worker_id"]})
            event = E.ContainerRequested(
                container_id=row["container_id"], deployment_id=row["deployment_id"],
                cpu_millicores=row["cpu_millicores"], memory_mib=row["memory_mib"], gpu=list(row["gpu"]),
                gpu_count=row["gpu_count"], pool=row["pool"], checkpoint_id=row["checkpoint_id"],
                reason=f"worker {row['worker_id']} lost", deployment_version=row["deployment_version"],
                attempt=row["attempt"] + 1, excluded_workers=excluded)
            try:
                requeued = await self.bus.append(envelope(event, workspace=row["workspace"],
                                                          correlation_id=row["correlation_id"]), row["last_seq"])
                self.decided[row["container_id"]] = requeued.seq
                log.info("re-requested %s: worker %s lost", row["container_id"], row["worker_id"])
            except ConcurrencyConflict:
                self.dirty.set()

    async def health_detail(self) -> dict:
        return {"placed": self.placed, "deferred": self.deferred, "conflicts": self.conflicts}
