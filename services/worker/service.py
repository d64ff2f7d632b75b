"""The worker process (one per node). Registers itself with its capacity and runtime features,
heartbeats into the KV bucket, and keeps a view of containers."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import socket
import time

import psutil

from levers9.contracts import envelope
from levers9.contracts import events as E
from levers9.runtime.service import Service
from levers9.runtime.views import ContainersView

log = logging.getLogger("levers9.worker")

HEARTBEAT_EVERY_S = 3.0


def runtime_features() -> list[str]:
    """What this node can run: always plain processes; runc where it is installed and we are root."""
    features = ["process"]
    if shutil.which("runc") and os.geteuid() == 0:
        features.append("runc")
    return features


class WorkerService(Service):
    name = "worker"
    projections = (ContainersView(),)

    @property
    def worker_id(self) -> str:
        return self.settings.worker_id or socket.gethostname().split(".")[0]

    async def on_start(self) -> None:
        s = self.settings
        registered = E.WorkerRegistered(
            worker_id=self.worker_id, pool=s.worker_pool, cpu_millicores=(os.cpu_count() or 1) * 1000,
            memory_mib=psutil.virtual_memory().total // (1 << 20), features=runtime_features(),
            address=f"http://{s.http_host}:{s.http_port}")
        env = envelope(registered, workspace="_sys")
        await self.bus.publish(env)
        await self.bus.publish(envelope(E.WorkerReady(worker_id=self.worker_id), workspace="_sys",
                                        correlation_id=env.correlation_id, causation_id=env.id))
        log.info("worker %s registered with %s", self.worker_id, registered.features)

    def background(self):
        return [self.heartbeat]

    async def heartbeat(self, stop: asyncio.Event) -> None:
        kv = await self.bus.heartbeats()
        while not stop.is_set():
            try:
                await kv.put(self.worker_id, json.dumps({"at": time.time(), "pid": os.getpid()}).encode())
            except Exception as exc:  # noqa: BLE001 - NATS reconnecting; next beat retries
                log.warning("heartbeat failed: %s", exc)
            try:
                await asyncio.wait_for(stop.wait(), timeout=HEARTBEAT_EVERY_S)
            except asyncio.TimeoutError:
                pass

    async def on_stop(self) -> None:
        try:
            kv = await self.bus.heartbeats()
            await kv.delete(self.worker_id)
        except Exception:  # noqa: BLE001 - the TTL removes it anyway
            pass

    async def health_detail(self) -> dict:
        return {"worker_id": self.worker_id}
