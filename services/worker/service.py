"""The worker process (one per node): runs the containers placed on it. This module is its wiring:
it builds the parts, gives each the narrow collaborators it uses, and dispatches events to them.

- At start it prepares its runtime (runc: the base root file system, the bridge; or plain
  processes), removes what a crashed predecessor left and says those containers failed
  (levers9.worker.lifecycle.restart), then registers with its capacity and features and heartbeats
  (levers9.worker.lifecycle.registration).
- It consumes ContainerScheduled / ContainerStopRequested / ContainerCheckpointRequested and acts only on its
  own containers; a stale placement is skipped here (levers9.worker.lifecycle.placement). A placement
  carries everything the start needs (spec, resources, checkpoint, and its GPUs' cards are chosen
  here: levers9.worker.gpus.node): no projection is read to start it.
- A container's life (code fetched, started or restored, polled until ready, stopped, watched for
  exits, stopped when idle or drained): levers9.worker.lifecycle.containers; its code:
  levers9.worker.lifecycle.code; its secrets: levers9.worker.lifecycle.secret_source.
- Checkpoints: levers9.worker.checkpoints.orchestration; HTTP routes: levers9.worker.routes; the node
  cache it serves: levers9.worker.images.cache_server.
- A build-pool worker also runs the builds given to it (ImageBuildStarted), one at a time (levers9.worker.builds.builder).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
from pathlib import Path

from fastapi import FastAPI

from levers9.contracts import events as E
from levers9.contracts import subjects
from levers9.contracts.images import BUILD_POOL
from levers9.runtime.consumer import Delivery, WorkConsumer
from levers9.runtime.service import Service
from levers9.runtime.views import CheckpointsView, ContainersView, DeploymentsView, SecretsView, WorkersView
from levers9.worker.builds.builder import Builds
from levers9.worker.checkpoints.orchestration import Checkpoints, enable_criu
from levers9.worker.gpus.node import NodeGpus
from levers9.worker.images.cache_server import serve_cache
from levers9.worker.images.node_cache import NodeCache
from levers9.worker.lifecycle import registration, restart
from levers9.worker.lifecycle.code import fetch_code
from levers9.worker.lifecycle.containers import ContainerParts, Containers
from levers9.worker.lifecycle.placement import Overtaken, Running
from levers9.worker.lifecycle.sdk_mount import sdk_mount
from levers9.worker.lifecycle.secret_source import SecretSource
from levers9.worker.mounts import volumes
from levers9.worker.runtime.choice import choose_runtime
from levers9.worker.runtime.interface import Runtime
from levers9.worker.sandboxes.catalogue_check import CatalogueCheck
from levers9.worker.sandboxes.sandboxes import Sandboxes

from .routes import add_routes

log = logging.getLogger("levers9.worker")


class WorkerService(Service):
    name = "worker"
    # ContainersView is not read to start anything (a placement carries what the start needs); it
    # stays because tests/test_e2e_stack.py proves exactly-once projection under SIGKILL with it
    projections = (ContainersView(), DeploymentsView(), SecretsView(), WorkersView(), CheckpointsView())
    runtime: Runtime
    containers: Containers  # the live ones, and their lifecycle (levers9.worker.lifecycle.containers)

    def __init__(self, settings) -> None:
        super().__init__(settings)
        self.state_dir = self.settings.home_path / "workers" / self.worker_id
        self.runtime_note = ""
        self.run_lock: int | None = None
        self.ready = asyncio.Event()
        self.overtaken = Overtaken()
        self.prepare_error, self.criu_note = "", "not checked"
        self.gpus = NodeGpus(self.settings, self.state_dir)  # its cards (levers9.worker.gpus.node)
        self.cache = NodeCache(Path(self.settings.images.image_cache) / "blobs", self.settings, self.settings.images.cache_max_bytes)
        self.cache_url = f"http://{self.settings.process.http_host}:{self.settings.images.cache_port}"
        self.checkpoints = Checkpoints(self)
        self.sandboxes = Sandboxes(self.settings, self.state_dir)
        secret_source = SecretSource(self.settings, lambda ws, names: self.pool.fetch(
            "SELECT name, ciphertext FROM worker.secrets WHERE workspace=$1 AND name = ANY($2)", ws, names))
        self.volumes = volumes.WorkerVolumes(self.settings, self.worker_id, self.state_dir,
                                             lambda cid, names: self.containers.secret_env(cid, names))
        # the runtime, the bus and the pool are read at each use: they exist once the worker started
        self.containers = Containers(ContainerParts(
            worker_id=self.worker_id, settings=self.settings, runtime=lambda: self.runtime,
            publish=lambda env: self.bus.publish(env), draining=lambda: registration.draining(self.pool, self.worker_id),
            fetch_code=functools.partial(fetch_code, self.settings, self.state_dir), secrets=secret_source,
            checkpoints=self.checkpoints, sandboxes=self.sandboxes, volumes=self.volumes, gpus=self.gpus,
            sdk_dir=sdk_mount(self.settings.home_path)))  # containers' /opt/levers9: the SDK alone
        self.catalogue_check = CatalogueCheck(self.worker_id, self.settings, lambda env: self.bus.publish(env),
                                              lambda: (self.runtime.name, self.runtime.checkpoint_ready), self.ready,
                                              self.checkpoints.warm)
        self.builds = Builds(self.worker_id, self.settings.registry.address, Path(self.settings.images.image_cache),
                             publish=lambda env: self.bus.publish(env), lanes=self.sandboxes.egress) \
            if self.settings.worker.pool == BUILD_POOL else None

    @property
    def worker_id(self) -> str:
        return self.settings.worker.id or socket.gethostname().split(".")[0]

    # ---- lifecycle -----------------------------------------------------------------------------

    async def on_start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.chmod(0o700)  # containers' config.json hold their secrets in clear: root only
        # held for this run's whole life: a reaper (levers9.worker.lifecycle.restart) then knows it is alive
        self.run_lock = await asyncio.to_thread(restart.take_run_lock, self.state_dir)
        self.runtime, self.runtime_note = choose_runtime(self.settings, self.state_dir)
        log.info("worker %s: %s", self.worker_id, self.runtime_note)

    def background(self):
        return [self.prepare_and_register, self.heartbeat, self.containers.monitor, self.serve_cache,
                self.sandboxes.serve, self.volumes.serve, self.sandboxes.egress.serve]

    async def serve_cache(self, stop: asyncio.Event) -> None:
        await serve_cache(self.cache, self.settings, self.cache_url, stop)

    async def prepare_and_register(self, stop: asyncio.Event) -> None:
        """Preparing runc's base root fs can take minutes the first time on a machine: health stays
        green meanwhile, and the worker registers (so it gets work) only when it is ready."""
        try:
            await self.runtime.prepare(progress=lambda msg: log.info("prepare: %s", msg))
            removed = await self.runtime.cleanup_all()
            await restart.report_gone(self, removed, self.overtaken)  # before placements run
            self.criu_note = await enable_criu(self.runtime, self.settings)
            log.info("checkpoint/restore: %s", self.criu_note)
        except Exception as exc:  # noqa: BLE001 - reported on /healthz and in the log
            self.prepare_error = f"{type(exc).__name__}: {exc}"
            log.exception("runtime %s could not be prepared", self.runtime.name)
            return
        features = await registration.register(self.settings, self.worker_id, self.runtime, self.gpus,
                                               self.bus.publish)
        self.ready.set()
        log.info("worker %s registered with %s", self.worker_id, features)

    async def heartbeat(self, stop: asyncio.Event) -> None:
        await registration.heartbeat(await self.bus.heartbeats(), self.worker_id, lambda: len(self.containers), stop)

    def reactions(self):
        wanted = ("ContainerScheduled", "ContainerStopRequested", "ContainerCheckpointRequested")
        consumers = [WorkConsumer(self.bus, restart.PLACEMENTS.format(self.worker_id),
                                  [subjects.filter_subject(aggregate="container", event_type=t) for t in wanted],
                                  handle=self.on_container_event, max_deliver=50, ack_wait=10)]
        if self.builds is not None:  # a build-pool worker: the builds given to it
            consumers.append(self.builds.consumer(self.bus))
        else:  # which shared pre-import checkpoints it can restore
            consumers.append(self.catalogue_check.consumer(self.bus))
        return consumers

    async def on_stop(self) -> None:
        if self.builds is not None:
            await self.builds.stop()
        await self.containers.stop_all("worker stopping")
        await self.runtime.close()  # what outlives containers: the runc runtime's image mounts
        await registration.forget_heartbeat(self.bus.heartbeats, self.worker_id)
        if self.run_lock is not None:  # its containers are stopped: a reaper finds nothing
            os.close(self.run_lock)
            self.run_lock = None

    # ---- placements ----------------------------------------------------------------------------

    async def on_container_event(self, d: Delivery) -> None:
        """Dispatch this worker's share of the container events to its containers (and their checkpoints)."""
        assert d.message is not None  # undecodable deliveries are dead-lettered before the handler
        ev = d.message.event
        if isinstance(ev, E.ContainerStopRequested):
            self.overtaken.saw(ev.container_id, d.seq, "its stop was requested")
            c = self.containers.get(ev.container_id)
            if c is not None:
                self.containers.stop_soon(c, ev.reason or "stop requested", checkpoint_first=ev.checkpoint_first)
        elif isinstance(ev, E.ContainerCheckpointRequested):
            c = self.containers.get(ev.container_id)
            if c is not None and c.ready_at is not None and not c.stopping:  # a stop may be under way (stop_soon)
                self.checkpoints.requested(c)
        elif isinstance(ev, E.ContainerScheduled):
            if ev.worker_id != self.worker_id:
                self.overtaken.saw(ev.container_id, d.seq, f"it was placed on worker {ev.worker_id}")
            elif ev.container_id not in self.containers:
                await self.ready.wait()
                await self.on_placed(ev, d)

    async def on_placed(self, ev: E.ContainerScheduled, d: Delivery) -> None:
        """A placement on this worker: skipped when stale, else started in the background."""
        stale = self.overtaken.stale(ev.container_id, d.seq)
        if stale:
            log.info("placement of %s (stream sequence %d) is stale: %s; skipping", ev.container_id, d.seq, stale)
            return
        self.overtaken.saw(ev.container_id, d.seq, "it was started here already")
        assert d.message is not None
        await self.containers.place(ev, d.seq, d.message.envelope)

    async def emit(self, c: Running, event: E.Event) -> None:
        """An event about container `c` (the checkpoints part says what its dumps and restores did with it)."""
        await self.containers.emit(c, event)

    # ---- HTTP ----------------------------------------------------------------------------------

    def routes(self, app: FastAPI) -> None:
        add_routes(app, self.containers, lambda cid: self.runtime.open_log(cid), self.worker_id)

    async def health_detail(self) -> dict:
        # served once on_start chose the runtime (the HTTP server starts after it)
        return {"worker_id": self.worker_id, "runtime": self.runtime.name,
                "runtime_note": self.runtime_note, "registered": self.ready.is_set(), "criu": self.criu_note,
                "prepare_error": self.prepare_error, "containers": len(self.containers), "gpus": self.gpus.health(),
                **({"builds": {"current": self.builds.current, "finished": self.builds.finished}}
                   if self.builds is not None else {})}
