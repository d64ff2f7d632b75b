"""The pool-controller process: keeps each pool's workers, scales on backlog, declares lost ones.

Every pass (after relevant events, or every 2 s), per pool: read the workers and the backlog
(containers deferred in that pool) from its own projections, decide with `pool_delta` (pure), and
act through the pool's backend. Which workers are lost is decided by `rules.lost_workers` (pure) from
the projection, the backend's exited processes and the heartbeat table (one long-lived watcher on the
heartbeat bucket, see heartbeats.py). A lost worker gets WorkerLost, appended with optimistic
concurrency on the worker's subject, so two controllers append it once; the scheduler then requests
its containers again elsewhere: at once, or for a worker whose node this controller can reach (its
state dir is on this machine), once its reaper stopped what it left and WorkerFenced says so
(fencing.py): a container id never runs twice. Each worker started here gets a token valid for that
worker alone (TokenCreated, scope worker:<id>).

Its pools are the pools file's and always a pool `build` (pools.with_build_pool: one warm worker, one
at most, no CRIU) whose workers, started with LEVERS9_WORKER_POOL=build, run image builds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable

from levers9.contracts import SYSTEM_WORKSPACE, envelope, uuid7
from levers9.contracts import events as E
from levers9.runtime.bus import HEARTBEAT_TTL_S, ConcurrencyConflict
from levers9.runtime.config import Settings
from levers9.runtime.consumer import Delivery
from levers9.runtime.projection import Projection
from levers9.runtime.service import Service
from levers9.runtime.tokens import mint
from levers9.runtime.views import ContainersView, WorkersView
from levers9.runtime.views_clusters import ClustersView

from .backend_choice import make_backend
from .backends import Backend
from .fencing import Fencer, LostRun
from .heartbeats import HeartbeatTable, still_beating
from .pools import PoolConfig, PoolWorker, load_pools, pool_delta, with_unprojected
from .rules import HEARTBEAT_EXPIRED, WorkerLoad, WorkerState, idle_for, idle_since, lost_workers

log = logging.getLogger("levers9.pool_controller")

PASS_EVERY_S = 2.0
PROVISION_TIMEOUT_S = 120.0
FIRST_PASS_AFTER_S = 5.0  # let workers started with the stack register before counting them
REGISTER_GRACE_S = HEARTBEAT_TTL_S  # a worker that just registered gets one TTL to show its first heartbeat
TERMINAL = ("lost", "drained")
FORGET_HEARTBEATS_AFTER_S = 600.0  # far past the TTL: only the table's size depends on it
# A pool's backlog: its deferred containers; for a pool on an attached cluster, only those of the
# workspaces that cluster admits (its owner, those it was shared with): another workspace's work waiting
# in that pool must not make the owner's cluster start workers it can never use.
BACKLOG = """SELECT count(*) FROM pool_controller.containers c WHERE c.status = 'pending' AND c.pool = $1
    AND ($2 = '' OR EXISTS (SELECT 1 FROM pool_controller.clusters k WHERE k.name = $2 AND NOT k.detached
                             AND (k.workspace = c.workspace OR EXISTS (SELECT 1 FROM pool_controller.cluster_shares s
                                  WHERE s.name = $2 AND s.workspace = c.workspace))))"""


class PoolControllerService(Service):
    name = "pool-controller"
    projections = (WorkersView(), ContainersView(), ClustersView())  # clusters: whose backlog a cluster pool serves

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.pools = load_pools(settings.pools.file)
        self.backends: dict[str, Backend] = {}
        self.heartbeats = HeartbeatTable(lambda: self.bus)
        self.idle: dict[str, dict[str, float]] = {}  # pool -> worker -> idle since
        self.provisioned_at: dict[str, float] = {}  # worker -> when it was provisioned (or first seen so)
        self.started_here: set[str] = set()  # workers this controller's backends started
        self.in_flight: dict[str, str] = {}  # worker -> pool: provisioned here, not projected yet
        self.exited: set[str] = set()  # workers whose process exited, not yet declared lost
        self.dirty = asyncio.Event()
        self.decisions: dict[str, str] = {}
        self.fencer = Fencer(settings.home_path, self.reaper_where)
        self.fences_recovered = False

    async def on_start(self) -> None:
        for pool in self.pools.values():
            if pool.backend not in self.backends:
                self.backends[pool.backend] = make_backend(pool.backend, self.settings.home_path,
                                                           self.settings.bus.issuer, lambda: self.bus)

    async def apply(self, p: Projection, batch: list[Delivery]) -> None:
        await super().apply(p, batch)
        self.dirty.set()

    def background(self) -> list[Callable[[asyncio.Event], Awaitable[None]]]:
        return [self.heartbeats.run, self.loop]

    async def loop(self, stop: asyncio.Event) -> None:
        await _wait(stop, FIRST_PASS_AFTER_S)
        while not stop.is_set():
            try:
                await self.recover_fences()
                await self.declare_lost()
                await self.fencer.fence_pending(self.bus)
                for pool in self.pools.values():
                    await self.reconcile(pool)
            except Exception:  # noqa: BLE001 - the next pass tries again
                log.exception("pool pass failed")
            try:
                await asyncio.wait_for(self.dirty.wait(), timeout=PASS_EVERY_S)
            except asyncio.TimeoutError:
                pass
            self.dirty.clear()

    # ---- lost workers ----------------------------------------------------------------------------

    async def declare_lost(self) -> None:
        self.exited.update(wid for b in self.backends.values() for wid in b.exited())
        rows = await self.pool.fetch(
            "SELECT worker_id, status, last_seq, extract(epoch from updated_at)::float8 AS at "
            "FROM pool_controller.workers WHERE status IN ('registered', 'ready', 'provisioning')")
        now = time.time()
        workers = []
        for r in rows:
            if r["status"] == "provisioning":
                self.provisioned_at.setdefault(r["worker_id"], now)
            workers.append(WorkerState(r["worker_id"], r["status"], float(r["at"]),
                                       self.provisioned_at.get(r["worker_id"])))
        # an exited worker stays noted until it is declared lost (or its WorkerProvisioned is projected)
        self.exited &= {r["worker_id"] for r in rows} | set(self.provisioned_at)
        last_seq = {r["worker_id"]: r["last_seq"] for r in rows}
        self.heartbeats.prune(now - FORGET_HEARTBEATS_AFTER_S)
        snapshot = self.heartbeats.snapshot()
        lost = lost_workers(workers, snapshot, now, HEARTBEAT_TTL_S, REGISTER_GRACE_S,
                            exited=frozenset(self.exited), provision_timeout=PROVISION_TIMEOUT_S)
        # which run was lost is read now, with the decision: a beat that comes during the awaits below
        # is the next run's (`levers9 up` restarted the worker), and the reaper must spare that one
        runs = {wid: LostRun(snapshot.seen.get(wid), self.heartbeats.last_run(wid)) for wid, _ in lost}
        for wid, why in lost:
            if why == HEARTBEAT_EXPIRED and not await self.confirm_expired(wid):
                continue
            await self.append_lost(wid, why, last_seq[wid], runs[wid])

    async def confirm_expired(self, worker_id: str) -> bool:
        """Read the worker's key directly before declaring it lost: a table that missed its beats
        must not make a live worker lost."""
        beating = await still_beating(self.bus, worker_id)
        if beating:
            self.heartbeats.restart(f"worker {worker_id} beats but the table missed it")
        return beating is False

    def reaper_where(self, worker_id: str) -> tuple[list[str], dict[str, str]]:
        for backend in self.backends.values():
            prefix, settings = backend.reaper_where(worker_id)
            if prefix or settings:
                return prefix, settings
        return [], {}

    async def recover_fences(self) -> None:
        """Once, at the first pass: lost workers of this machine whose fence a previous run left undone."""
        if self.fences_recovered:
            return
        rows = await self.pool.fetch("SELECT worker_id FROM pool_controller.workers WHERE status = 'lost'")
        await self.fencer.recover(self.bus, [r["worker_id"] for r in rows if self.fencer.can_fence(r["worker_id"])])
        self.fences_recovered = True

    async def append_lost(self, worker_id: str, why: str, last_seq: int, run: LostRun) -> None:
        fence = self.fencer.can_fence(worker_id)  # its node is this machine: its containers wait for the fence
        try:
            await self.bus.append(envelope(E.WorkerLost(worker_id=worker_id, reason=why, awaits_fence=fence),
                                           workspace=SYSTEM_WORKSPACE), last_seq)
            log.warning("worker %s lost: %s", worker_id, why)
            if fence:  # the reaper spares any run but the lost one (`levers9 up` may have started the next)
                self.fencer.pending[worker_id] = run
            self.exited.discard(worker_id)
            if worker_id in self.started_here:  # still running (a cut link): its containers run elsewhere now
                for backend in self.backends.values():
                    backend.stop_worker(worker_id)
        except ConcurrencyConflict:
            self.dirty.set()

    # ---- scaling ---------------------------------------------------------------------------------

    async def reconcile(self, pool: PoolConfig) -> None:
        rows = await self.pool.fetch(
            "SELECT worker_id, status, backend, cpu_used, memory_used FROM pool_controller.workers WHERE pool=$1",
            pool.name)
        backlog = await self.pool.fetchval(BACKLOG, pool.name, pool.cluster)
        now = time.time()
        loads = [WorkerLoad(r["worker_id"], r["status"], r["cpu_used"] > 0 or r["memory_used"] > 0) for r in rows]
        since = self.idle[pool.name] = idle_since(self.idle.get(pool.name, {}), loads, now)
        workers = [PoolWorker(w.worker_id, w.status, r["backend"] == pool.backend and w.worker_id in self.started_here,
                              w.busy, idle_for(since, w.worker_id, now)) for w, r in zip(loads, rows, strict=True)]
        self.forget({w.worker_id for w in loads if w.status in TERMINAL})
        self.in_flight = {wid: p for wid, p in self.in_flight.items() if wid not in {w.worker_id for w in loads}}
        delta = pool_delta(pool, with_unprojected(workers, self.in_flight, pool.name), backlog)
        self.decisions[pool.name] = delta.reason + self.backends[pool.backend].note(pool)
        for _ in range(delta.start):
            await self.provision(pool)
        for wid in delta.stop:
            log.info("pool %s: stopping idle worker %s", pool.name, wid)
            self.backends[pool.backend].stop_worker(wid)
            since.pop(wid, None)

    def forget(self, gone: set[str]) -> None:
        """Workers that are lost or drained for good need no bookkeeping here any more."""
        for wid in gone & (self.started_here | set(self.provisioned_at)):
            self.started_here.discard(wid)
            self.provisioned_at.pop(wid, None)

    async def provision(self, pool: PoolConfig) -> None:
        worker_id = f"{pool.name}-{uuid7()[-12:]}"
        token = mint(name=f"worker {worker_id}", scope=f"worker:{worker_id}")
        await self.bus.publish(envelope(token.event, workspace="default"))
        await self.bus.publish(envelope(E.WorkerProvisioned(worker_id=worker_id, pool=pool.name, backend=pool.backend,
                                                            cluster=pool.cluster), workspace=SYSTEM_WORKSPACE))
        self.provisioned_at[worker_id] = time.time()
        self.in_flight[worker_id] = pool.name  # until the projection shows it
        self.started_here.add(worker_id)
        self.backends[pool.backend].start_worker(pool, worker_id, token.secret)
        log.info("pool %s: started worker %s (%s)", pool.name, worker_id, self.decisions.get(pool.name, ""))

    async def health_detail(self) -> dict[str, Any]:
        return {"pools": {name: {"backend": p.backend, "min_warm": p.min_warm, "max_workers": p.max_workers,
                                 "last_decision": self.decisions.get(name, "")} for name, p in self.pools.items()},
                "heartbeats": {"current": self.heartbeats.current, "workers": len(self.heartbeats.seen),
                               "watchers_created": self.heartbeats.watches}}


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except asyncio.TimeoutError:
        pass
