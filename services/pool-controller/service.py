"""The pool-controller process: keeps each pool's workers, scales on backlog, declares lost ones.

Every pass (after relevant events, or every 2 s), per pool: read the workers and the backlog
(containers deferred in that pool) from its own projections, decide with `pool_delta` (pure), and
act through the pool's backend. A worker whose heartbeat key expired (or whose local process
exited) is declared lost (WorkerLost, with optimistic concurrency on the worker's subject, so two
controllers append it once); the scheduler then requests its containers again elsewhere.
Each worker started here gets a token valid for that worker alone (TokenCreated, scope worker:<id>).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time

from levers9.contracts import envelope, uuid7
from levers9.contracts import events as E
from levers9.runtime.bus import HEARTBEAT_TTL_S, ConcurrencyConflict
from levers9.runtime.consumer import Delivery
from levers9.runtime.projection import Projection
from levers9.runtime.service import Service
from levers9.runtime.views import ContainersView, WorkersView

from .backends import Backend, make_backend
from .pools import PoolWorker, load_pools, pool_delta

log = logging.getLogger("levers9.pool_controller")

PASS_EVERY_S = 2.0
PROVISION_TIMEOUT_S = 120.0


class PoolControllerService(Service):
    name = "pool-controller"
    projections = (WorkersView(), ContainersView())

    def __init__(self, settings) -> None:
        super().__init__(settings)
        self.pools = load_pools(settings.pools_file)
        self.backends: dict[str, Backend] = {}
        self.idle_since: dict[str, float] = {}
        self.provisioned_at: dict[str, float] = {}
        self.dirty = asyncio.Event()
        self.decisions: dict[str, str] = {}

    async def on_start(self) -> None:
        for pool in self.pools.values():
            if pool.backend not in self.backends:
                self.backends[pool.backend] = make_backend(pool.backend, self.settings.home_path)

    async def apply(self, p: Projection, batch: list[Delivery]) -> None:
        await super().apply(p, batch)
        self.dirty.set()

    def background(self):
        return [self.loop]

    async def loop(self, stop: asyncio.Event) -> None:
        await asyncio.sleep(5.0)  # let workers started with the stack register before counting them
        while not stop.is_set():
            try:
                await self.declare_lost()
                for pool in self.pools.values():
                    await self.reconcile(pool)
            except Exception:  # noqa: BLE001 - the next pass tries again
                log.exception("pool pass failed")
            try:
                await asyncio.wait_for(self.dirty.wait(), timeout=PASS_EVERY_S)
            except asyncio.TimeoutError:
                pass
            self.dirty.clear()

    async def declare_lost(self) -> None:
        kv = await self.bus.heartbeats()
        try:
            alive = set(await kv.keys())
        except Exception:  # noqa: BLE001 - nats.js.errors.NoKeysError when the bucket is empty
            alive = set()
        exited = {wid for b in self.backends.values() for wid in b.exited()}
        rows = await self.pool.fetch("SELECT worker_id, status, last_seq, extract(epoch from updated_at) AS at "
                                     "FROM pool_controller.workers WHERE status IN ('registered', 'ready', 'provisioning')")
        now = time.time()
        for r in rows:
            wid = r["worker_id"]
            if r["status"] == "provisioning":
                started = self.provisioned_at.setdefault(wid, now)
                dead = wid in exited or now - started > PROVISION_TIMEOUT_S
                why = "its process exited before registering" if wid in exited else "never registered"
            else:  # a worker that just registered gets one TTL to show its first heartbeat
                dead = wid in exited or (wid not in alive and now - float(r["at"]) > HEARTBEAT_TTL_S)
                why = "its process exited" if wid in exited else "heartbeat expired"
            if not dead:
                continue
            try:
                await self.bus.append(envelope(E.WorkerLost(worker_id=wid, reason=why), workspace="_sys"),
                                      r["last_seq"])
                log.warning("worker %s lost: %s", wid, why)
            except ConcurrencyConflict:
                self.dirty.set()

    async def reconcile(self, pool) -> None:
        rows = await self.pool.fetch(
            "SELECT worker_id, status, backend, cpu_used, memory_used FROM pool_controller.workers WHERE pool=$1",
            pool.name)
        backlog = await self.pool.fetchval(
            "SELECT count(*) FROM pool_controller.containers WHERE status = 'pending' AND pool = $1", pool.name)
        now = time.time()
        workers = []
        for r in rows:
            busy = r["cpu_used"] > 0 or r["memory_used"] > 0
            if busy or r["status"] != "ready":
                self.idle_since.pop(r["worker_id"], None)
            since = self.idle_since.setdefault(r["worker_id"], now) if not busy else now
            workers.append(PoolWorker(r["worker_id"], r["status"], r["backend"] == pool.backend and
                                      r["worker_id"] in self.provisioned_at, busy, now - since))
        delta = pool_delta(pool, workers, backlog)
        self.decisions[pool.name] = delta.reason
        for _ in range(delta.start):
            await self.provision(pool)
        for wid in delta.stop:
            log.info("pool %s: stopping idle worker %s", pool.name, wid)
            self.backends[pool.backend].stop_worker(wid)
            self.idle_since.pop(wid, None)

    async def provision(self, pool) -> None:
        worker_id = f"{pool.name}-{uuid7()[-12:]}"
        token = "l9w_" + secrets.token_urlsafe(32)
        await self.bus.publish(envelope(E.TokenCreated(
            token_id=uuid7(), token_sha256=hashlib.sha256(token.encode()).hexdigest(), name=f"worker {worker_id}",
            scope=f"worker:{worker_id}"), workspace="default"))
        await self.bus.publish(envelope(E.WorkerProvisioned(worker_id=worker_id, pool=pool.name,
                                                            backend=pool.backend), workspace="_sys"))
        self.provisioned_at[worker_id] = time.time()
        self.backends[pool.backend].start_worker(pool, worker_id, token)
        log.info("pool %s: started worker %s (%s)", pool.name, worker_id, self.decisions.get(pool.name, ""))

    async def health_detail(self) -> dict:
        return {"pools": {name: {"backend": p.backend, "min_warm": p.min_warm, "max_workers": p.max_workers,
                                 "last_decision": self.decisions.get(name, "")} for name, p in self.pools.items()}}
