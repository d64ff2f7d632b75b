"""How the worker makes itself known: registered with its capacity and features once its runtime is
ready (WorkerRegistered, then WorkerReady), a heartbeat in the bus's key-value bucket while it runs
(removed when it stops; its TTL removes it otherwise), and whether the operator drains it.

The scheduler places containers only on a registered worker with a live heartbeat.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import psutil

from levers9.contracts import SYSTEM_WORKSPACE, Envelope, envelope
from levers9.contracts import events as E
from levers9.runtime.config import Settings
from levers9.worker.gpus.node import NodeGpus
from levers9.worker.runtime.interface import Runtime

from .containers import sleep_unless_stopped

log = logging.getLogger("levers9.worker")

HEARTBEAT_EVERY_S = 2.0


async def register(settings: Settings, worker_id: str, runtime: Runtime, gpus: NodeGpus,
                   publish: Callable[[Envelope], Awaitable[Any]]) -> list[str]:
    """Say this worker's capacity, features and address (WorkerRegistered), then that it is ready
    for work (WorkerReady); the features it registered with."""
    s = settings
    registered = E.WorkerRegistered(
        worker_id=worker_id, pool=s.worker.pool,
        cpu_millicores=s.worker.cpu_millicores or (os.cpu_count() or 1) * 1000,
        memory_mib=s.worker.memory_mib or psutil.virtual_memory().total // (1 << 20),
        features=list(runtime.features) + (["criu"] if runtime.checkpoint_ready else []),
        address=f"http://{s.process.http_host}:{s.process.http_port}", **(await gpus.register()))
    env = envelope(registered, workspace=SYSTEM_WORKSPACE)
    await publish(env)
    await publish(envelope(E.WorkerReady(worker_id=worker_id), workspace=SYSTEM_WORKSPACE,
                           correlation_id=env.correlation_id, causation_id=env.id))
    return registered.features


async def heartbeat(kv: Any, worker_id: str, containers: Callable[[], int], stop: asyncio.Event) -> None:
    """Put this worker's heartbeat (time, this run's pid and start time, how many containers it runs)
    every HEARTBEAT_EVERY_S. The pid and start time are those its run lock records: a reaper told
    which run was lost kills that run only, never a newer run that holds the lock by then."""
    started = psutil.Process().create_time()
    while not stop.is_set():
        try:
            await kv.put(worker_id, json.dumps({"at": time.time(), "pid": os.getpid(), "started": started,
                                                "containers": containers()}).encode())
        except Exception as exc:  # noqa: BLE001 - NATS reconnecting; next beat retries
            log.warning("heartbeat failed: %s", exc)
        await sleep_unless_stopped(stop, HEARTBEAT_EVERY_S)


async def forget_heartbeat(kv_of: Callable[[], Awaitable[Any]], worker_id: str) -> None:
    """Remove the heartbeat of a worker that stops (best effort: the TTL removes it anyway)."""
    try:
        kv = await kv_of()
        await kv.delete(worker_id)
    except Exception:  # noqa: BLE001 - the TTL removes it anyway
        log.warning("could not delete the heartbeat of %s (its TTL removes it)", worker_id, exc_info=True)


async def draining(pool: asyncpg.Pool, worker_id: str) -> bool:
    """Whether the operator drains this worker (its containers are then stopped)."""
    try:
        return bool(await pool.fetchval("SELECT draining FROM worker.workers WHERE worker_id=$1", worker_id))
    except Exception:  # noqa: BLE001 - Postgres away: keep the containers, ask again next round
        log.warning("cannot read whether worker %s drains", worker_id, exc_info=True)
        return False
